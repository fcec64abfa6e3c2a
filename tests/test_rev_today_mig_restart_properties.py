"""tests/test_rev_gpu_mig_hold_lost.py's property with restarts on the state file added (attribution's MIG hold
and the energy processor's totals through JSON, at any tick) and dcgm-exporter serving its last collection again
after one (a restart well within its 30 s): per tick the MIG accounting holds, nothing is counted twice."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from tests.processors.test_idle_energy import energy
from tests.processors.test_mig_window import TICK_MJ, Collected, Node
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DeviceSample
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.energy import EnergyProcessor

WALL0 = 1_767_225_600.0


def _restarted(node: Node, totals: EnergyProcessor) -> EnergyProcessor:
    clock = SteppedClock(start_wall_s=WALL0 + node.t_s, start_monotonic_s=node.t_s)
    state = StateStore(None, clock, "n")
    state.put("metrics/attribution", json.loads(json.dumps(node.proc.snapshot())))
    state.put("metrics/energy", json.loads(json.dumps(totals.snapshot())))
    ctx = make_context("attribution", "processor", clock, pipeline="metrics", state=state)
    node.proc = AttributionProcessor(AttributionConfig.model_validate(node.options), ctx)
    node.proc.start()
    return energy(clock, state)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["up", "up", "collected", "again", "down", "restart"]), max_size=40))
def test_every_tick_conserves_through_outages_restarts_and_a_collection_served_again(plan: list[str]) -> None:
    node, totals = Node(), energy(SteppedClock())
    measured = 0
    collected: Collected | None = None
    for step in plan:
        if step == "restart":
            totals = _restarted(node, totals)
            continue
        if step == "down":
            node.t_s += 5.0
            time = Timestamp(monotonic_s=node.t_s, wall_s=WALL0 + node.t_s)
            down = Batch(time=time, interval_s=5.0, node="n").replace(
                devices=(DeviceSample(time=time, device_id="G", up=False),)
            )
            out = totals.process(node.proc.process(down))
            d = totals.devices.get("G")
            last = d.last if d is not None else None
            held_now = last.held_energy_mj if last is not None else d.held_mj if d is not None else 0
            assert sum(s.energy_mj for s in out.shares) == node.held - held_now
            node.held = held_now
        else:
            if step == "collected":
                collected = Collected({1: 0.5, 2: 1.0}, after_s=node.t_s)
            again = collected if step == "again" else None
            out = totals.process(
                node.tick([(10, 1), (20, 2)], collected=again or (collected if step == "collected" else None))
            )
            measured += TICK_MJ
        for device in out.device_totals:
            processes = sum(t.energy_mj for t in out.totals if t.scope == "process")
            assert device.energy_mj == device.active_energy_mj == measured
            assert processes + device.unattributed_energy_mj + node.held == device.active_energy_mj
