"""A property over the idle hold, GPU outages and restarts together (each alone has its tests): wattpipe restarted
on its state file (attribution's held ticks, the energy processor's totals and held level) at any tick, while the
GPU's idle is not known yet, known, or the GPU does not answer. Every mJ measured reaches the device's totals
once, and its active part the process totals (or the unattributed one) once."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from tests.processors.test_idle_energy import energy
from tests.processors.test_idle_hold import IDLE_W, at, batch, power
from tests.test_rev_gpu_hold_lost import _down
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.energy import EnergyProcessor

TICK = st.fixed_dictionaries(
    {
        "gpu": st.sampled_from(["pending", "pending", "known", "down", "down"]),
        "mj": st.integers(350_000, 900_000),  # ≥ idle 70 W × 5 s
        "pids": st.sets(st.sampled_from([10, 11, 12]), min_size=1),
        "restart": st.booleans(),
    }
)


def _started(clock: SteppedClock, state: StateStore) -> tuple[AttributionProcessor, EnergyProcessor]:
    ctx = make_context("attribution", "processor", clock, pipeline="metrics", state=state)
    attribution = AttributionProcessor(AttributionConfig.model_validate({"idle_wait": 30.0}), ctx)
    attribution.start()
    return attribution, energy(clock, state)


def _restarted(
    clock: SteppedClock, attribution: AttributionProcessor, totals: EnergyProcessor
) -> tuple[AttributionProcessor, EnergyProcessor]:
    state = StateStore(None, clock, "n")
    state.put("metrics/attribution", json.loads(json.dumps(attribution.snapshot())))
    state.put("metrics/energy", json.loads(json.dumps(totals.snapshot())))
    return _started(clock, state)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TICK, min_size=1, max_size=40))
def test_energy_reaches_every_total_once_through_holds_outages_and_restarts(plan: list[dict[str, Any]]) -> None:
    clock = SteppedClock()
    attribution, totals = _started(clock, StateStore(None, clock, "n"))
    measured = 0
    last: dict[tuple[str, str], int] = {}  # each process series' last total (an ended one is dropped in time)
    # The plan, then the GPU answering with its idle known until every hold is released.
    tail = [{"gpu": "known", "mj": 400_000, "pids": {10}, "restart": False}] * 10
    for n, t in enumerate([*plan, *tail]):
        clock.set(at(n).monotonic_s)
        if t["restart"]:
            attribution, totals = _restarted(clock, attribution, totals)
        if t["gpu"] == "down":
            b = _down(n)
        else:
            measured += t["mj"]
            idle_w = IDLE_W if t["gpu"] == "known" else None
            b = batch(n, power(n, t["mj"], idle_w), {pid: 1.0 / len(t["pids"]) for pid in sorted(t["pids"])})
        out = totals.process(attribution.process(b))
        last.update(((r.key, r.device_id), r.energy_mj) for r in out.totals if r.scope == "process")
    (device,) = out.device_totals
    processes = sum(last.values())
    last_power = totals.devices["G"].last
    assert last_power is not None
    assert last_power.held_energy_mj == 0
    assert device.energy_mj == measured
    assert device.energy_mj == device.idle_energy_mj + device.active_energy_mj
    assert processes + device.unattributed_energy_mj == device.active_energy_mj
