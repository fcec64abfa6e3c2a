"""Ground truth for the saturation signals: thermal throttling and XIDs from the scenario, and every signal's
true value over a window, to set beside what the ``saturation`` processor measured (``simulate --report``).

The simulated dcgm-exporter (``_dcgm_text``) derives its fields from the same functions: DRAM activity is
0.3 × the GPU's (or instance's) activity, SM active 0.9 ×, SM occupancy 0.4 ×, PCIe 2e8 / 5e8 B/s × activity,
NVLink 0; power throttling is the time the power cap held the GPU back (``truth.device_capped_s``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from wattpipe.pipeline.records import Saturation
from wattpipe.simulator.hardware import mig_profile_memory_mib
from wattpipe.simulator.node import SimulatedNode

__all__ = ["saturation_rows", "thermal_s", "true_signal", "xid_count", "xid_last"]

_STEP_S = 1.0  # how finely the window's instant values (memory) are sampled

# signal → (factor, which activity): gauges the simulated exporter prints as factor × activity.
_ACTIVITY_SCALED: dict[str, float] = {
    "dram_active": 0.3,
    "sm_active": 0.9,
    "sm_occupancy": 0.4,
    "pcie_tx_bytes_per_s": 2e8,
    "pcie_rx_bytes_per_s": 5e8,
    "nvlink_tx_bytes_per_s": 0.0,
    "nvlink_rx_bytes_per_s": 0.0,
}


def thermal_s(node: SimulatedNode, gpu: int, t_s: float) -> float:
    """Seconds of thermal throttling from 0 to ``t_s``."""
    return sum(max(0.0, min(end, t_s) - start) for start, end in node.scenario.gpus[gpu].thermal_throttle)


def xid_last(node: SimulatedNode, gpu: int, t_s: float) -> int:
    """The code of the last XID raised at or before ``t_s`` (0: none yet), as DCGM's field holds it."""
    raised = [(at, code) for at, code in node.scenario.gpus[gpu].xid if at <= t_s]
    return max(raised)[1] if raised else 0


def xid_count(node: SimulatedNode, gpu: int, t0_s: float, t1_s: float) -> int:
    return sum(1 for at, _ in node.scenario.gpus[gpu].xid if t0_s < at <= t1_s)


def _memory_ratio(node: SimulatedNode, gpu: int, gi: int | None, t_s: float) -> float:
    if gi is not None:
        mig = node.truth.gpu_state(gpu, t_s).mig
        profile = next((i.profile for i in mig.instances if i.gi == gi), None) if mig is not None else None
        total = mig_profile_memory_mib(profile) if profile else 0
    else:
        total = node.scenario.gpus[gpu].memory_mib or 0
    if total <= 0:
        return 0.0
    return min(1.0, round(node.truth.memory_used_mib(gpu, t_s, gi)) / total)


def _samples(t0_s: float, t1_s: float) -> list[float]:
    count = max(1, round((t1_s - t0_s) / _STEP_S))
    return [t0_s + (i + 1) * (t1_s - t0_s) / count for i in range(count)]


def _memory(node: SimulatedNode, gpu: int, gi: int | None, t0_s: float, t1_s: float, stat: str) -> float:
    ratios = [_memory_ratio(node, gpu, gi, t) for t in _samples(t0_s, t1_s)]
    if stat == "avg":
        return sum(ratios) / len(ratios)
    if stat == "max":
        return max(ratios)
    return sum(1 for r in ratios if r >= 0.9) / len(ratios)


def true_signal(node: SimulatedNode, gpu: int, gi: int | None, signal: str, t0_s: float, t1_s: float) -> float | None:
    """The true value of ``signal`` over (t0_s, t1_s] (None: the simulator has no truth for it, or the window
    is empty: a run of one tick)."""
    span_s = t1_s - t0_s
    if span_s <= 0:
        return None
    truth = node.truth
    capped = (truth.device_capped_s(gpu, t1_s) - truth.device_capped_s(gpu, t0_s)) / span_s
    thermal = (thermal_s(node, gpu, t1_s) - thermal_s(node, gpu, t0_s)) / span_s
    fixed: dict[str, float] = {
        "throttle_power": capped,
        "throttle_thermal": thermal,
        "throttle_sync_boost": 0.0,
        "throttle_board_limit": 0.0,
        "clock_event_sw_power_cap": capped,
        "clock_event_sw_thermal": thermal,
        "clock_event_hw_slowdown": 0.0,
        "clock_event_sync_boost": 0.0,
        "clock_event_hw_thermal": 0.0,
        "clock_event_hw_power_brake": 0.0,
        "xid_count": float(xid_count(node, gpu, t0_s, t1_s)),
    }
    if signal in fixed:
        return fixed[signal]
    if signal.startswith("memory_"):
        stat = signal.removeprefix("memory_used_") if signal.startswith("memory_used_") else "pressure"
        return _memory(node, gpu, gi, t0_s, t1_s, stat)
    stem = signal.removesuffix("_avg").removesuffix("_max")
    factor = _ACTIVITY_SCALED.get(stem)
    if factor is None:
        return None
    if signal.endswith("_max"):
        return max(factor * truth.activity(gpu, gi, t - _STEP_S, t) for t in _samples(t0_s, t1_s))
    return factor * truth.activity(gpu, gi, t0_s, t1_s)


def saturation_rows(records: Iterable[Saturation], node: SimulatedNode) -> list[dict[str, Any]]:
    """The report's ``saturation`` section: each device or instance signal measured in the last window,
    beside its true value over the same window (``gi`` None for a whole GPU; ``window_s`` the seconds the
    value covers, the configured window once the run is longer than it)."""
    uuids = [g.uuid for g in node.scenario.gpus]
    rows = []
    for r in records:
        if r.pod_name is not None or r.device_id not in uuids:
            continue
        t1_s = (r.time.monotonic_s if r.window_end_s is None else r.window_end_s) - node.start_monotonic_s
        truth = true_signal(node, uuids.index(r.device_id), r.gpu_instance_id, r.signal, t1_s - r.window_s, t1_s)
        rows.append(
            {
                "uuid": r.device_id,
                "gi": r.gpu_instance_id,
                "signal": r.signal,
                "value": r.value,
                "true_value": truth,
                "window_s": r.window_s,  # < the configured window: a run shorter than it (a partial window)
                "window_end_s": round(t1_s, 6),  # scenario s: the data window is (end - window_s, end]
            }
        )
    return rows
