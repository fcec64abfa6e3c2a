"""Held energy saved with wall times, restored after the wall clock stepped back (an NTP step, a node that
booted with its clock behind and synced after wattpipe started): the saved ticks then end *after* now. They are
times in the past (measured before the stop), so they must not wait out the step: a GPU lost for good after the
restart would otherwise keep its held energy (and its ended processes' late energy) for as long as the step."""

from __future__ import annotations

import json

from tests.helpers.context import make_context
from tests.processors.test_idle_hold import at, batch, power
from tests.processors.test_mig_window import Node
from tests.test_rev_gpu_hold_lost import _down
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DeviceSample
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor

KEY = "metrics/attribution"


def _attribution(clock: SteppedClock, state: StateStore | None = None) -> AttributionProcessor:
    ctx = make_context("attribution", "processor", clock, pipeline="metrics", state=state)
    proc = AttributionProcessor(AttributionConfig.model_validate({"idle_wait": 30.0}), ctx)
    proc.start()
    return proc


def test_a_hold_restored_after_the_wall_clock_stepped_back_is_released_within_idle_wait() -> None:
    clock = SteppedClock()
    first = _attribution(clock)
    for n in (0, 1):
        first.process(batch(n, power(n, 300_000, None), {10: 0.5, 11: 0.5}))
    saved = json.loads(json.dumps(first.snapshot()))
    # Restarted at the monotonic time of tick 1, the wall clock an hour behind what it read at the stop.
    behind = SteppedClock(start_wall_s=at(1).wall_s - 3600.0, start_monotonic_s=at(1).monotonic_s)
    state = StateStore(None, behind, "n")
    state.put(KEY, saved)
    second = _attribution(behind, state)
    released = 0
    for n in range(3, 12):  # the GPU never answers again: 40 s, past idle_wait from the restart too
        released += sum(s.energy_mj for s in second.process(_down(n)).shares)
    assert released == 600_000


def test_a_mig_hold_restored_after_the_wall_clock_stepped_back_is_released_within_mig_max_wait() -> None:
    node = Node()
    for _ in range(3):
        node.tick([(10, 1), (20, 2)])
    assert node.held == 30_000
    behind = SteppedClock(start_wall_s=1_767_225_600.0 + node.t_s - 3600.0, start_monotonic_s=node.t_s)
    state = StateStore(None, behind, "n")
    state.put(KEY, json.loads(json.dumps(node.proc.snapshot())))
    second = _attribution(behind, state)
    released = 0
    for k in range(1, 40):  # the GPU is down from the restart on (200 s, past mig_max_wait 90 s)
        t = node.t_s + 5.0 * k
        time = Timestamp(monotonic_s=t, wall_s=1_767_225_600.0 + t - 3600.0)
        down = DeviceSample(time=time, device_id="G", up=False)
        released += sum(
            s.energy_mj
            for s in second.process(Batch(time=time, interval_s=5.0, node="n").replace(devices=(down,))).shares
        )
    assert released == 30_000
