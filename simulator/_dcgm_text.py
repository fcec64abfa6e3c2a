"""dcgm-exporter's /metrics text, rendered from the ground truth at one collection instant.

Format facts copied from real captures (shared/reference/dcgm-exporter): families with ``# HELP`` and
``# TYPE``; labels in the exporter's template order (``gpu, UUID, [pci_bus_id], device, modelName,
[GPU_I_PROFILE, GPU_I_ID], Hostname|hostname, DCGM_FI_DRIVER_VERSION, container, namespace, pod,
[pod_uid]``); doubles with six decimals, integers plain. A MIG GPU has one row per GPU instance and no
whole-GPU row; board fields (power, energy, clocks, temperature) repeat the board value on every row;
``GPU_UTIL`` and ``MEM_COPY_UTIL`` are absent on MIG GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from wattpipe.simulator.hardware import mig_profile_memory_mib
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.saturation_truth import thermal_s, xid_last

__all__ = ["DEFAULT_FIELDS", "FIELDS", "OPTIONAL_FIELDS", "Row", "render"]


@dataclass(frozen=True, slots=True)
class Row:
    """One exporter row: a GPU, or one GPU instance of a MIG GPU, over one collection interval."""

    gpu: int
    gi: int | None
    profile: str | None
    t0_s: float  # the interval the ratios are means over
    t1_s: float  # the collection instant the gauges are read at


Value = Callable[[SimulatedNode, Row], "float | int | None"]


def _activity(node: SimulatedNode, row: Row) -> float:
    return node.truth.activity(row.gpu, row.gi, row.t0_s, row.t1_s)


def _whole_gpu_only(value: Value) -> Value:
    return lambda node, row: None if row.gi is not None or _is_mig(node, row) else value(node, row)


def _is_mig(node: SimulatedNode, row: Row) -> bool:
    return node.truth.gpu_state(row.gpu, row.t1_s).mig is not None


def _fb_total_mib(node: SimulatedNode, row: Row) -> int:
    if row.profile is not None:
        return mig_profile_memory_mib(row.profile)
    return node.scenario.gpus[row.gpu].memory_mib or 0


def _fb_used_mib(node: SimulatedNode, row: Row) -> int:
    return min(_fb_total_mib(node, row), round(node.truth.memory_used_mib(row.gpu, row.t1_s, row.gi)))


def _energy_mj(node: SimulatedNode, row: Row) -> int | None:
    if not node.scenario.gpus[row.gpu].energy_counter:
        return None  # DCGM has a blank value; the exporter skips the row
    return node.energy_counter_mj(row.gpu, row.t1_s)


def _clock_event_reasons(node: SimulatedNode, row: Row) -> int:
    truth = node.truth
    capped = truth.device_capped_s(row.gpu, row.t1_s) > truth.device_capped_s(row.gpu, row.t0_s)
    idle = truth.activity(row.gpu, None, row.t0_s, row.t1_s) == 0.0
    thermal = thermal_s(node, row.gpu, row.t1_s) > thermal_s(node, row.gpu, row.t0_s)
    return (0x4 if capped else 0) | (0x1 if idle else 0) | (0x20 if thermal else 0)  # sw_power_cap, idle, sw_thermal


_Kind = Literal["gauge", "counter"]

# name → (TYPE, HELP, value). A value of None means "no row for this field".
FIELDS: dict[str, tuple[_Kind, str, Value]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz).",
                             lambda n, r: 1980 if n.truth.activity(r.gpu, None, r.t0_s, r.t1_s) > 0 else 345),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz).", lambda n, r: 2619),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C).", lambda n, r: n.temperature_c(r.gpu, r.t1_s)),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W).",
                                lambda n, r: round(n.truth.device_average_power_w(r.gpu, r.t1_s), 3)),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ).", _energy_mj),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries.", lambda n, r: 0),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %).",
                             _whole_gpu_only(lambda n, r: round(100 * _activity(n, r)))),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %).",
                                  _whole_gpu_only(lambda n, r: round(50 * _activity(n, r)))),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered.",
                               lambda n, r: xid_last(n, r.gpu, r.t1_s)),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB).",
                            lambda n, r: _fb_total_mib(n, r) - _fb_used_mib(n, r)),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB).", _fb_used_mib),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active.",
                                      lambda n, r: _activity(n, r)),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
                                        lambda n, r: 0.5 * _activity(n, r)),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge",
                                 "Ratio of cycles the device memory interface is active sending or receiving data.",
                                 lambda n, r: 0.3 * _activity(n, r)),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", "The rate of data transmitted over the PCIe bus - including both "
                                   "protocol headers and data payloads - in bytes per second.",
                                   lambda n, r: round(2e8 * _activity(n, r))),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", "The rate of data received over the PCIe bus - including both "
                                   "protocol headers and data payloads - in bytes per second.",
                                   lambda n, r: round(5e8 * _activity(n, r))),
    # Off by default in dcgm-exporter's default-counters.csv.
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
                               lambda n, r: 0.9 * _activity(n, r)),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gauge", "The ratio of number of warps resident on an SM.",
                                  lambda n, r: 0.4 * _activity(n, r)),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gauge", "The rate of data transmitted over NVLink, not including protocol "
                                     "headers, in bytes per second.", lambda n, r: 0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gauge", "The rate of data received over NVLink, not including protocol "
                                     "headers, in bytes per second.", lambda n, r: 0),
    "DCGM_FI_DEV_POWER_VIOLATION": ("counter", "Throttling duration due to power constraints (in ns).",
                                    lambda n, r: round(n.truth.device_capped_s(r.gpu, r.t1_s) * 1e9)),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("counter", "Throttling duration due to thermal constraints (in ns).",
                                      lambda n, r: round(thermal_s(n, r.gpu, r.t1_s) * 1e9)),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": ("counter", "Throttling duration due to sync-boost constraints (in ns).",
                                         lambda n, r: 0),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": ("counter", "Throttling duration due to board limit constraints (in ns).",
                                          lambda n, r: 0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
                                         _clock_event_reasons),
}  # fmt: skip

DEFAULT_FIELDS: tuple[str, ...] = tuple(list(FIELDS)[:16])
OPTIONAL_FIELDS: tuple[str, ...] = tuple(list(FIELDS)[16:])


def _format(value: float | int) -> str:
    # dcgm-exporter prints doubles with %f and integers with %d.
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(
    node: SimulatedNode,
    rows: list[Row],
    fields: tuple[str, ...],
    labels: Callable[[Row], list[tuple[str, str]]],
) -> str:
    """The exposition text for ``rows``; ``labels`` gives each row's label pairs in template order."""
    label_text = {id(row): ",".join(f'{k}="{_escape(v)}"' for k, v in labels(row)) for row in rows}
    lines: list[str] = []
    for name in fields:
        kind, help_text, value = FIELDS[name]
        samples = []
        for row in rows:
            result = value(node, row)
            if result is not None:
                samples.append(f"{name}{{{label_text[id(row)]}}} {_format(result)}")
        if samples:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
    return "\n".join(lines) + "\n"
