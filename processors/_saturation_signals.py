"""The saturation signals: their catalog names, what each is made from, and what one observation holds.

A receiver's fields (SI names from ``receivers/dcgm/_fields.py``, or the nvml receiver's saturation fields
under the same names) become one :class:`Observation` per device or MIG instance per tick. Counters are
turned into increments here, against the previous observation of the same key, so that a window is a plain
sum over the observations it holds. The window arithmetic is ``_saturation_window``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "AVERAGED",
    "BOARD_SIGNALS",
    "CLOCK_EVENT_BITS",
    "MEMORY",
    "RATES",
    "RATIO_SIGNALS",
    "SIGNALS",
    "THROTTLES",
    "Observation",
    "observe",
]

THROTTLES: dict[str, str] = {
    "throttle_power": "power_violation_s",
    "throttle_thermal": "thermal_violation_s",
    "throttle_sync_boost": "sync_boost_violation_s",
    "throttle_board_limit": "board_limit_violation_s",
}
"""Signal → the cumulative violation counter (seconds, from DCGM's or NVML's nanoseconds)."""

CLOCK_EVENT_BITS: dict[str, int] = {
    "clock_event_sw_power_cap": 0x4,
    "clock_event_hw_slowdown": 0x8,
    "clock_event_sync_boost": 0x10,
    "clock_event_sw_thermal": 0x20,
    "clock_event_hw_thermal": 0x40,
    "clock_event_hw_power_brake": 0x80,
}
"""The saturating bits of the clock-event-reason bitmask (gpu_idle 0x1, the application and display clock
settings 0x2 and 0x100 are not saturation and are left out)."""

AVERAGED: dict[str, str] = {
    "dram_active": "dram_active",
    "sm_active": "sm_active",
    "sm_occupancy": "sm_occupancy",
}
"""Signal stem → field; each gives ``<stem>_avg`` and ``<stem>_max`` over the window."""

RATES: tuple[str, ...] = (
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
)
"""Throughput fields, bytes per second: each signal is the mean over the window."""

MEMORY = ("memory_used_avg", "memory_used_max", "memory_pressure")

SIGNALS: tuple[str, ...] = (
    *THROTTLES,
    *CLOCK_EVENT_BITS,
    *MEMORY,
    "xid_count",
    *(f"{stem}_{stat}" for stem in AVERAGED for stat in ("avg", "max")),
    *RATES,
)
"""Every signal, in catalog order."""

RATIO_SIGNALS = frozenset(SIGNALS) - {"xid_count", *RATES}
"""Signals whose value is a 0–1 ratio."""

BOARD_SIGNALS = frozenset({*THROTTLES, *CLOCK_EVENT_BITS, "xid_count"})
"""Signals of the physical board: under MIG they are the GPU's, never an instance's."""


@dataclass(frozen=True, slots=True)
class Observation:
    """One tick's values for a device or instance, counters already differenced.

    ``dt_s``: seconds since the previous observation of the same key (None for the first): the denominator
    of the throttle ratios. ``violation_s``: each throttle signal's counter increase over that ``dt_s``
    (absent when either end is). ``xid``: errors seen since the previous observation (None: no XID source).
    """

    t_s: float
    dt_s: float | None
    violation_s: Mapping[str, float]
    clock_reasons: int | None
    memory_used: float | None
    xid: int | None
    gauges: Mapping[str, float]


def _memory_used(fields: Mapping[str, float]) -> float | None:
    used = fields.get("fb_used_bytes")
    if used is None:
        return None
    total = fields.get("fb_total_bytes")
    if total is None:
        free = fields.get("fb_free_bytes")
        if free is None:
            return None
        total = used + free + fields.get("fb_reserved_bytes", 0.0)
    if total <= 0:
        return None
    return min(1.0, max(0.0, used / total))


def _xid(fields: Mapping[str, float], previous: Mapping[str, float] | None) -> int | None:
    """Errors since the previous observation: exact from an NVML event count, else DCGM's last code changing.

    DCGM's field holds the last XID's code, so two errors with the same code in a row, or several between two
    scrapes, count once: an undercount the docs state. A first observation counts nothing (when its code
    was raised is not known)."""
    if "xid_count" in fields:
        if previous is None or "xid_count" not in previous:
            return 0
        return max(0, round(fields["xid_count"] - previous["xid_count"]))
    if "xid_last" in fields:
        if previous is None or "xid_last" not in previous:
            return 0
        code = fields["xid_last"]
        return 1 if code != previous["xid_last"] and code != 0 else 0
    return None


def observe(t_s: float, fields: Mapping[str, float], previous: tuple[float, Mapping[str, float]] | None) -> Observation:
    """One observation of ``fields`` at ``t_s``, differenced against ``previous`` (its time and fields)."""
    before = previous[1] if previous is not None else None
    dt_s = t_s - previous[0] if previous is not None and t_s > previous[0] else None
    violation: dict[str, float] = {}
    if before is not None and dt_s is not None:
        for signal, name in THROTTLES.items():
            if name in fields and name in before:
                # A counter that went back (driver reload) restarted from 0: what it holds now is the increase.
                increase = fields[name] - before[name]
                violation[signal] = increase if increase >= 0 else fields[name]
    reasons = fields.get("clocks_event_reasons")
    gauges = {name: fields[name] for name in (*AVERAGED.values(), *RATES) if name in fields}
    return Observation(
        t_s=t_s,
        dt_s=dt_s,
        violation_s=violation,
        clock_reasons=None if reasons is None else int(reasons),
        memory_used=_memory_used(fields),
        xid=_xid(fields, before),
        gauges=gauges,
    )
