"""DCGM field names → wattpipe signal names in SI units, and which fields a MIG instance owns.

Both spellings are accepted: the names dcgm-exporter has always printed (``DCGM_FI_DEV_POWER_USAGE``, W)
and DCGM 4.6's canonical ones (``DCGM_FI_DEV_BOARD_POWER_WATTS``). The canonical spelling wins when an
exporter prints both for one device. The conversion is the whole point of the table: DCGM's units are
whatever each field was born with (mJ, MiB, MHz, %, ns), ours are SI (J, bytes, Hz, 0–1, s).

A field not in the table is kept under its lowercased DCGM name with its value as printed, unconverted
(``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` → ``dcgm_fi_dev_nvlink_bandwidth_total``): the ``dcgm_fi_``
prefix marks a value whose unit is DCGM's, not ours.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FIELDS", "Signal", "instance_scoped", "signal_for"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Signal:
    """Where one DCGM field lands: the SI name, the factor to SI, and its spelling's precedence."""

    name: str
    scale: float = 1.0
    canonical: bool = False  # DCGM 4.6's spelling: preferred when both are printed


def _both(old: str, new: str, name: str, old_scale: float = 1.0, new_scale: float = 1.0) -> dict[str, Signal]:
    return {old: Signal(name, old_scale), new: Signal(name, new_scale, canonical=True)}


FIELDS: dict[str, Signal] = {
    # Power and energy. The energy counter counts mJ since the driver loaded (TYPE counter, no _total);
    # its 4.6 twin counts J.
    **_both("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", "power_w"),
    **_both("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "energy_j", 1e-3),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": Signal("power_limit_w"),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": Signal("enforced_power_limit_w"),
    # Utilisation: the old fields are integer percent, the 4.6 *_RATIO fields 0–1.
    **_both("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", "gpu_util", 0.01),
    **_both("DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_MEMORY_UTIL_RATIO", "mem_copy_util", 0.01),
    **_both("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_ENC_UTIL_RATIO", "enc_util", 0.01),
    **_both("DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_DEC_UTIL_RATIO", "dec_util", 0.01),
    # Framebuffer: MiB, or bytes in the 4.6 *_BYTES fields.
    **_both("DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_CAPACITY_BYTES", "fb_total_bytes", _MIB),
    **_both("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE_BYTES", "fb_free_bytes", _MIB),
    **_both("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES", "fb_used_bytes", _MIB),
    **_both("DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_RESERVED_BYTES", "fb_reserved_bytes", _MIB),
    # Temperatures stay in °C (an SI derived unit; kelvin would only invite mistakes).
    **_both("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "gpu_temp_c"),
    **_both("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "memory_temp_c"),
    # Clocks: MHz, or Hz in 4.6.
    **_both("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ", "sm_clock_hz", 1e6),
    **_both("DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "mem_clock_hz", 1e6),
    # Time the clocks were held back, cumulative NANOseconds (not microseconds, whatever older notes say).
    "DCGM_FI_DEV_POWER_VIOLATION": Signal("power_violation_s", 1e-9),
    "DCGM_FI_DEV_THERMAL_VIOLATION": Signal("thermal_violation_s", 1e-9),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": Signal("sync_boost_violation_s", 1e-9),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": Signal("board_limit_violation_s", 1e-9),
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": Signal("low_util_violation_s", 1e-9),
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": Signal("reliability_violation_s", 1e-9),
    # A bitmask (0x1 idle, 0x4 sw power cap, 0x8 hw slowdown, 0x20 sw thermal, 0x40 hw thermal, 0x80 brake);
    # the two names are one field, renamed.
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": Signal("clocks_event_reasons"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": Signal("clocks_event_reasons", canonical=True),
    # The code of the last XID error, not a count of them.
    **_both("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", "xid_last"),
    **_both("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "pcie_replays"),
    # Profiling (DCP) fields: ratios 0–1 over DCGM's sampling window, per GPU instance under MIG.
    **_both("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "gr_engine_active"),
    **_both("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO", "sm_active"),
    **_both("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "sm_occupancy"),
    **_both("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO", "tensor_active"),
    **_both("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO", "dram_active"),
    **_both("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_FP64_UTIL_RATIO", "fp64_active"),
    **_both("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_FP32_UTIL_RATIO", "fp32_active"),
    **_both("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_FP16_UTIL_RATIO", "fp16_active"),
    # Throughput, bytes per second (already SI).
    "DCGM_FI_PROF_PCIE_TX_BYTES": Signal("pcie_tx_bytes_per_s"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": Signal("pcie_rx_bytes_per_s"),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": Signal("nvlink_tx_bytes_per_s"),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": Signal("nvlink_rx_bytes_per_s"),
}


def signal_for(field: str) -> Signal:
    """The table's entry, or the unknown-field rule: the lowercased DCGM name, value unconverted."""
    return FIELDS.get(field) or Signal(field.lower())


def instance_scoped(field: str) -> bool:
    """Whether a MIG GPU reports this field per GPU instance rather than for the board.

    Profiling fields count the instance's own engines, and framebuffer fields its own memory slice; every
    other field (power, energy, temperature, clocks, violations, errors) is the board's, printed again on
    each instance's row.
    """
    return field.startswith(("DCGM_FI_PROF_", "DCGM_FI_DEV_FB_"))
