"""``wattpipe probe``'s saturation summary: which saturation sources a receiver gave, per GPU, and how to
enable the missing ones (on stderr, so the JSON on stdout stays machine-readable)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TextIO

from wattpipe.pipeline.records import DeviceSample, DeviceSignals, MigActivity, Record

__all__ = ["GROUPS", "print_saturation_sources", "saturation_sources"]

# group → (fields any of which gives it, how to enable it)
GROUPS: dict[str, tuple[tuple[str, ...], str]] = {
    "throttle": (
        ("power_violation_s", "thermal_violation_s", "sync_boost_violation_s", "board_limit_violation_s"),
        "add DCGM_FI_DEV_POWER_VIOLATION, _THERMAL_VIOLATION, _SYNC_BOOST_VIOLATION, _BOARD_LIMIT_VIOLATION to "
        "dcgm-exporter's counters CSV (off by default), or set the nvml receiver's saturation: true",
    ),
    "clock_events": (
        ("clocks_event_reasons",),
        "add DCGM_FI_DEV_CLOCKS_EVENT_REASONS (older exporters: DCGM_FI_DEV_CLOCK_THROTTLE_REASONS) to the "
        "counters CSV, or set the nvml receiver's saturation: true",
    ),
    "memory": (("fb_used_bytes",), "DCGM_FI_DEV_FB_USED and _FB_FREE (on by default), or nvml saturation: true"),
    "xid": (("xid_last", "xid_count"), "DCGM_FI_DEV_XID_ERRORS (on by default)"),
    "dram": (("dram_active",), "DCGM_FI_PROF_DRAM_ACTIVE (on by default; needs a GPU with DCP profiling)"),
    "sm": (
        ("sm_active", "sm_occupancy"),
        "add DCGM_FI_PROF_SM_ACTIVE and DCGM_FI_PROF_SM_OCCUPANCY to the counters CSV (off by default; DCP)",
    ),
    "pcie": (("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"), "DCGM_FI_PROF_PCIE_TX_BYTES/_RX_BYTES (on by default)"),
    "nvlink": (
        ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
        "add DCGM_FI_PROF_NVLINK_TX_BYTES/_RX_BYTES to the counters CSV (off by default)",
    ),
}


def saturation_sources(records: Iterable[Record]) -> dict[str, tuple[list[str], list[str]]]:
    """Per GPU UUID: the saturation groups found (with their source), and the groups missing."""
    fields: dict[str, dict[str, str]] = {}
    for record in records:
        if isinstance(record, DeviceSignals):
            for name, _ in record.fields:
                fields.setdefault(record.device_id, {}).setdefault(name, record.source)
        elif isinstance(record, MigActivity):
            for name, _ in record.fields:
                fields.setdefault(record.device_id, {}).setdefault(name, f"dcgm, MIG instance {record.gpu_instance_id}")
    out: dict[str, tuple[list[str], list[str]]] = {}
    for uuid, seen in fields.items():
        found, missing = [], []
        for group, (names, _) in GROUPS.items():
            sources = sorted({seen[n] for n in names if n in seen})
            if sources:
                found.append(f"{group} ({', '.join(sources)})")
            else:
                missing.append(group)
        out[uuid] = (found, missing)
    return out


def print_saturation_sources(records: Sequence[Record], provides: Iterable[str], err: TextIO) -> None:
    provided = set(provides)
    if "device_signals" not in provided:
        if any(isinstance(r, DeviceSample) for r in records) and "devices" in provided:
            print(
                "saturation: this receiver reads no saturation fields; set nvml's saturation: true, or probe dcgm",
                file=err,
            )
        return
    sources = saturation_sources(records)
    if not sources:
        print("saturation: no GPU answered with saturation fields", file=err)
        return
    for uuid, (found, missing) in sources.items():
        print(f"saturation {uuid}: found {', '.join(found) or 'nothing'}", file=err)
        for group in missing:
            print(f"  missing {group}: {GROUPS[group][1]}", file=err)
