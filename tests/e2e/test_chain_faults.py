"""The whole GPU chain (nvml receiver → idle → attribution → energy) through random faults (issue 14).

hypothesis draws a node: GPUs, processes that come and go and pause, and faults on the simulated driver
(process listings that fail, GPUs that stop answering, driver reloads that restart the energy counter).
Each run goes tick by tick on a stepped clock, and every tick must keep the promises wattpipe makes
whatever the node does:

- energy is conserved exactly per device and tick (idle + Σ shares == the tick's energy);
- every total (process, instance, device) only grows;
- idle is never below 0, nor above the power of an interval its source learns from (issue 15): a free
  one (no process) for ``free``, a quiet one (processes at 0 %) for ``quiet``, one with processes of
  known utilisation for ``regression``;
- a series whose device did not answer this tick reports no watts (absent, not repeated, not 0).
"""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.records import DeviceSample
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.scenario import parse_scenario

H = "tests.helpers.components"
TICK_S = 5.0
TICKS = 36  # three minutes of node time

PIPELINE = f"""
receivers:
  nvml: {{required: true, reinit_backoff: 5s}}
processors:
  idle:
  attribution:
  energy: {{terminated_retention: 1h}}
exporters:
  custom/rec: {{class: "{H}:Recorder"}}
service:
  telemetry: {{listen: ""}}
  pipelines:
    metrics: {{interval: {TICK_S:g}s, receivers: [nvml], processors: [idle, attribution, energy], exporters: [custom/rec]}}
"""

_MODELS = [("NVIDIA H100 80GB HBM3", 700.0), ("NVIDIA A100-SXM4-80GB", 400.0)]


@st.composite
def util_schedule(draw: st.DrawFn) -> list[list[float]]:
    """Breakpoints of a process's utilisation: steady stretches, pauses (0) and bursts."""
    times = sorted(set(draw(st.lists(st.integers(min_value=1, max_value=170), max_size=5))))
    values = draw(
        st.lists(st.sampled_from([0.0, 0.1, 0.3, 0.6, 0.9, 1.0]), min_size=len(times) + 1, max_size=len(times) + 1)
    )
    return [[0.0, values[0]], *([float(t), v] for t, v in zip(times, values[1:], strict=True))]


@st.composite
def node(draw: st.DrawFn) -> dict[str, Any]:
    gpus = []
    for _ in range(draw(st.integers(min_value=1, max_value=2))):
        model, max_w = draw(st.sampled_from(_MODELS))
        gpus.append({"model": model, "idle_w": draw(st.sampled_from([45.0, 60.0, 72.0])), "max_w": max_w})
    processes = []
    for n in range(draw(st.integers(min_value=0, max_value=4))):
        start_s = float(draw(st.integers(min_value=0, max_value=120)))
        process: dict[str, Any] = {
            "pid": 1000 + n,
            "comm": f"job{n}",
            "gpu": draw(st.integers(min_value=0, max_value=len(gpus) - 1)),
            "dynamic_w": draw(st.sampled_from([150.0, 300.0, 450.0])),
            "util": draw(util_schedule()),
            "start_s": start_s,
        }
        if draw(st.booleans()):
            process["end_s"] = start_s + draw(st.integers(min_value=3, max_value=90))
        processes.append(process)
    faults = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        gpu = draw(st.integers(min_value=0, max_value=len(gpus) - 1))
        at_s = float(draw(st.integers(min_value=1, max_value=160)))
        for_s = float(draw(st.integers(min_value=1, max_value=60)))
        kind = draw(st.sampled_from(["listing", "lost", "reload"]))
        if kind == "reload":  # the driver reloads: the GPU answers nothing for a while, then counts from 0
            faults.append({"target": "nvml", "kind": "reload", "gpu": gpu, "at_s": at_s, "for_s": min(for_s, 10.0)})
            continue
        call, error = {
            "listing": ("nvmlDeviceGetComputeRunningProcesses", "NO_PERMISSION"),
            "lost": ("nvmlDeviceGetPowerUsage", "GPU_IS_LOST"),
        }[kind]
        faults.append({"target": "nvml", "gpu": gpu, "call": call, "error": error, "at_s": at_s, "for_s": for_s})
    return {"node": {"name": "chain"}, "gpus": gpus, "processes": processes, "faults": faults}


def run(data: dict[str, Any]) -> list[Batch]:
    clock = SteppedClock()
    scenario = parse_scenario(data)
    with simulator.install(scenario, clock):
        registry = Registry.from_entry_points()
        text = textwrap.dedent(PIPELINE)
        graph = build(load_config_text(text, "chain.yaml", registry, {}), registry, clock, Telemetry(clock))
        asyncio.run(Service(graph).run(max_ticks=TICKS))
        batches: list[Batch] = graph.exporters["custom/rec"].batches  # type: ignore[attr-defined]
        return batches


def check_conservation(batch: Batch, held: dict[str, int]) -> None:
    """Per tick: Σ shares + idle + (held now − held before) == the counter's delta (the held level: energy held
    while idle is being learned, processors/_idle_hold.py, or a MIG GPU's waiting for dcgm-exporter). A device
    that did not answer has no DevicePower: what its holds released meanwhile (past idle_wait) lowers its level."""
    answered = {p.device_id for p in batch.device_power}
    for share in batch.shares:
        if share.device_id not in answered and share.device_id in held:
            held[share.device_id] -= share.energy_mj
    for power in batch.device_power:
        shares = sum(s.energy_mj for s in batch.shares if s.device_id == power.device_id)
        before = held.get(power.device_id, 0)
        assert shares + power.idle_energy_mj + power.held_energy_mj - before == power.energy_mj, power
        assert power.idle_energy_mj >= 0
        assert power.active_energy_mj >= 0
        assert power.held_energy_mj >= 0
        held[power.device_id] = power.held_energy_mj


def check_monotonic(batch: Batch, last: dict[tuple[str, str, str], int]) -> None:
    for t in batch.totals:
        key: tuple[str, str, str] = (t.scope, t.key, t.device_id)
        assert t.energy_mj >= last.get(key, 0), (key, last.get(key), t.energy_mj)
        last[key] = t.energy_mj
    for d in batch.device_totals:
        device_key = ("device", "", d.device_id)
        assert d.energy_mj >= last.get(device_key, 0)
        assert d.energy_mj == d.idle_energy_mj + d.attributed_energy_mj + d.unattributed_energy_mj
        last[device_key] = d.energy_mj


def interval_power(batch: Batch) -> dict[str, dict[str, float]]:
    """Average power of this tick's intervals that each idle source may learn from (if long and consistent
    enough), by source and device: a device that answered with its process list read, and no process at all
    (``free``); processes, all at 0 % (``quiet``); processes, all of known utilisation (``regression``)."""
    out: dict[str, dict[str, float]] = {"free": {}, "quiet": {}, "regression": {}}
    listed = {d.device_id for d in batch.devices if isinstance(d, DeviceSample) and d.up and d.processes_known}
    utils: dict[str, list[float | None]] = {}
    for p in batch.gpu_processes:
        utils.setdefault(p.device_id, []).append(p.sm_util)
    for power in batch.device_power:
        if power.device_id not in listed or power.source != "counter":
            continue
        held = utils.get(power.device_id, [])
        if not held:
            out["free"][power.device_id] = power.power_w
        elif None not in held:
            if sum(u for u in held if u is not None) <= 0.005:
                out["quiet"][power.device_id] = power.power_w
            if power.unattributable is None:
                out["regression"][power.device_id] = power.power_w
    return out


def check_idle(batch: Batch, seen: dict[tuple[str, str], list[float]]) -> None:
    for source, powers in interval_power(batch).items():
        for device_id, watts in powers.items():
            seen.setdefault((source, device_id), []).append(watts)
    for power in batch.device_power:
        if power.idle_w is None:
            continue
        assert power.idle_w >= 0.0
        assert power.idle_source is not None
        learned_from = seen.get((power.idle_source, power.device_id), [])
        # The whole run is inside the idle window (an hour by default): no interval learned from is older.
        assert learned_from, f"idle {power.idle_w} W on {power.device_id} without any {power.idle_source} interval"
        assert power.idle_w <= min(learned_from) + 1e-6, (power.idle_source, power.idle_w, min(learned_from))


def check_no_stale_watts(batch: Batch) -> None:
    answered = {p.device_id for p in batch.device_power}
    for t in batch.totals:
        if t.device_id not in answered:
            assert t.power_w is None, (
                f"{t.scope} {t.key} on {t.device_id}: {t.power_w} W while its device did not answer"
            )


def _job(n: int, util: float) -> dict[str, Any]:
    return {"pid": 1000 + n, "comm": f"job{n}", "gpu": 0, "dynamic_w": 150.0, "util": [[0.0, util]], "start_s": 0.0}


# Found in CI: a GPU never free (idle unknown) down for 61-81 s, past idle_wait: its held energy released while it
# did not answer (processors/attribution.py _unanswered), which check_conservation's held level did not follow.
LOST_WHILE_HELD = {
    "node": {"name": "chain"},
    "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 45.0, "max_w": 700.0}],
    "processes": [_job(0, 0.0), _job(1, 0.0), _job(2, 0.0), _job(3, 0.1)],
    "faults": [
        {
            "target": "nvml",
            "gpu": 0,
            "call": "nvmlDeviceGetPowerUsage",
            "error": "GPU_IS_LOST",
            "at_s": 61.0,
            "for_s": 20.0,
        }
    ],
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(node())
@example(LOST_WHILE_HELD)
def test_the_chain_keeps_its_promises_through_random_faults(data: dict[str, Any]) -> None:
    batches = run(data)
    assert len(batches) == TICKS
    last: dict[tuple[str, str, str], int] = {}
    seen: dict[tuple[str, str], list[float]] = {}
    held: dict[str, int] = {}
    for batch in batches:
        check_conservation(batch, held)
        check_monotonic(batch, last)
        check_idle(batch, seen)
        check_no_stale_watts(batch)
