"""Attribution's state section: the energy it holds (idle not known yet, processors/_idle_hold.py; a MIG tick
waiting for dcgm-exporter, processors/_mig_window.py) survives a restart, its waits going on from the held
ticks' own times. Without it a clean stop dropped up to ``idle_wait`` (or ``mig_max_wait``) of measured energy,
and a node restarted more often than that never counted the GPU's energy (tests/test_rev_restart_cpu.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.context import make_context
from tests.processors.test_idle_energy import energy
from tests.processors.test_idle_hold import IDLE_W, at, batch, power
from tests.processors.test_mig_window import Collected, Node
from tests.test_rev_gpu_hold_lost import _down
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DeviceSample
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor

KEY = "metrics/attribution"


def attribution(clock: SteppedClock, state: StateStore | None = None, **config: object) -> AttributionProcessor:
    ctx = make_context("attribution", "processor", clock, pipeline="metrics", state=state)
    proc = AttributionProcessor(AttributionConfig.model_validate(config), ctx)
    proc.start()
    return proc


def restarted(proc: AttributionProcessor, clock: SteppedClock, **config: object) -> AttributionProcessor:
    """A new processor started on ``proc``'s snapshot, through JSON as the state file keeps it."""
    state = StateStore(None, clock, "n")
    state.put(KEY, json.loads(json.dumps(proc.snapshot())))
    return attribution(clock, state, **config)


def test_ticks_held_for_idle_are_released_after_a_restart_as_without_it() -> None:
    clock = SteppedClock()
    kept, first = attribution(clock), attribution(clock)
    for n in (0, 1):
        for proc in (kept, first):
            out = proc.process(batch(n, power(n, 500_000 + n, None), {10: 0.7, 11: 0.3}))
        assert out.device_power[0].held_energy_mj == 1_000_001 if n else 500_000
    clock.set(at(1).monotonic_s)
    second = restarted(first, clock)
    again = batch(2, power(2, 400_000, IDLE_W), {10: 0.5})  # idle known: everything held is released
    assert second.process(again) == kept.process(again)
    assert second.snapshot() == {"idle_hold": {}, "mig_hold": {}}


def test_a_restored_hold_of_a_device_that_does_not_answer_again_is_released_once_idle_wait_is_over() -> None:
    """The device is down (lost) after the restart: the idle_wait rule, counted from the first held tick (before
    the restart), releases it all active by the held shares; the energy processor's restored totals get it."""
    clock = SteppedClock()
    first, totals = attribution(clock, idle_wait=30.0), energy(clock, StateStore(None, clock, "n"))
    for n in (0, 1):
        totals.process(first.process(batch(n, power(n, 300_000, None), {10: 0.5, 11: 0.5})))
    clock.set(at(1).monotonic_s)
    state = StateStore(None, clock, "n")
    state.put("metrics/energy", json.loads(json.dumps(totals.snapshot())))
    second, totals = restarted(first, clock, idle_wait=30.0), energy(clock, state)
    released = []
    for n in range(3, 12):  # wattpipe down for a tick, then the GPU never answers
        clock.set(at(n).monotonic_s)
        out = totals.process(second.process(_down(n)))
        released += [(n, s.pid, s.energy_mj) for s in out.shares]
    assert released == [(6, 10, 300_000), (6, 11, 300_000)]  # 30 s after the first held tick ended (0)
    (device,) = out.device_totals
    assert (device.energy_mj, device.active_energy_mj, device.attributed_energy_mj) == (600_000,) * 3
    assert {t.key: t.energy_mj for t in out.totals if t.scope == "process"} == {"10": 300_000, "11": 300_000}


def test_a_mig_hold_survives_a_restart_and_is_settled_by_the_next_collection() -> None:
    kept, first = Node(), Node()
    for node in (kept, first):
        for _ in range(3):
            node.tick([(10, 1), (20, 2)])
    assert first.held == 30_000
    first.proc = restarted(first.proc, SteppedClock())
    assert first.proc.snapshot() == json.loads(json.dumps(kept.proc.snapshot()))
    collected = Collected({1: 0.25, 2: 1.0}, after_s=15.0)  # placed midway in (15 s, 25 s]
    outs = []
    for node in (kept, first):
        node.tick([(10, 1), (20, 2)])
        outs.append(node.tick([(10, 1), (20, 2)], collected=collected))
    assert outs[0] == outs[1]
    assert sum(s.energy_mj for s in outs[1].shares if s.pid) == 40_000  # the 4 ticks up to 20 s settled by it
    assert first.held == kept.held == 10_000


def _saved_hold() -> dict[str, Any]:
    clock = SteppedClock()
    proc = attribution(clock)
    proc.process(batch(0, power(0, 500_000, None), {10: 0.7, 11: 0.3}))
    node = Node()
    node.tick([(10, 1), (20, 2)])
    return {"idle_hold": proc.snapshot()["idle_hold"], "mig_hold": node.proc.snapshot()["mig_hold"]}


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s: {"processes": [], "devices": {}}, "no idle_hold and no mig_hold"),  # another component's
        (lambda s: {**s, "idle_hold": []}, "idle_hold is list"),
        (lambda s: s["idle_hold"]["G"][0].update(shares=[1.0]) or s, "2 pids and 1 shares"),
        (lambda s: s["idle_hold"]["G"][0].update(energy_mj=2.5) or s, "energy_mj 2.5"),
        (lambda s: s["idle_hold"]["G"][0].update(mode="mig") or s, "mode 'mig'"),
        (lambda s: s["idle_hold"]["G"][0].pop("end_wall_s") and s, "KeyError"),
        (lambda s: s["mig_hold"]["G"]["ticks"][0].update(open_mj=1) or s, "open_mj 1"),
        (lambda s: s["mig_hold"]["G"].pop("recent") and s, "mig_hold of device G: KeyError"),
    ],
)
def test_a_section_it_cannot_use_raises_naming_what_and_restores_nothing(edit: Any, named: str) -> None:
    clock = SteppedClock()
    state = StateStore(None, clock, "n")
    state.put(KEY, edit(_saved_hold()))
    proc = AttributionProcessor(
        AttributionConfig(), make_context("attribution", "processor", clock, pipeline="metrics", state=state)
    )
    with pytest.raises(ValueError, match=named):
        proc.start()
    assert proc.snapshot() == {"idle_hold": {}, "mig_hold": {}}  # all or nothing: the runtime starts it afresh


def test_a_series_that_ended_before_the_stop_still_gets_its_late_energy_after_the_restart() -> None:
    """Pid 11 exits while its GPU's energy is held, wattpipe stops, and starts again 75 s later (past
    ``terminated_retention``, within ``late_energy_wait``): the energy processor must keep 11's ended series for
    the late energy the restored hold releases for it, from the first tick (no DevicePower yet: a baseline)."""
    clock = SteppedClock()
    first, totals = attribution(clock), energy(clock, StateStore(None, clock, "n"))
    totals.process(first.process(batch(0, power(0, 500_000, None), {10: 0.5, 11: 0.5})))
    totals.process(first.process(batch(1, power(1, 500_000, None), {10: 1.0})))  # 11 has exited
    clock.set(at(1).monotonic_s)
    state = StateStore(None, clock, "n")
    state.put("metrics/energy", json.loads(json.dumps(totals.snapshot())))
    second, totals = restarted(first, clock), energy(clock, state)
    for n in (16, 17):  # 80 s later: a baseline tick, then the GPU's idle is known: everything held is released
        clock.set(at(n).monotonic_s)
        step = _down(n) if n == 16 else batch(n, power(n, 500_000, IDLE_W), {10: 1.0})
        out = totals.process(second.process(step))
    processes = {t.key: (t.energy_mj, t.state) for t in out.totals if t.scope == "process"}
    assert processes["11"] == (75_000, "terminated")  # half of tick 0's 150 kJ above idle
    (device,) = out.device_totals
    assert device.unattributed_energy_mj == 0


def test_a_restored_mig_hold_of_a_gpu_that_does_not_answer_again_is_released_after_mig_max_wait() -> None:
    node = Node()
    for _ in range(3):
        node.tick([(10, 1), (20, 2)])
    proc = restarted(node.proc, SteppedClock())
    released: list[tuple[float, int]] = []
    modes = set()
    for k in range(1, 30):  # down from here on: a down sample, no DevicePower
        t = node.t_s + 5.0 * k
        time = Timestamp(monotonic_s=t, wall_s=1_767_225_600.0 + t)
        down = DeviceSample(time=time, device_id="G", up=False)
        out = proc.process(Batch(time=time, interval_s=5.0, node="n").replace(devices=(down,)))
        released += [(t, s.energy_mj) for s in out.shares]
        modes |= {s.mode for s in out.shares}
    assert sum(mj for _, mj in released) == 30_000
    assert min(t for t, _ in released) == 5.0 + 90.0  # the first held tick (it ended at 5 s), mig_max_wait later
    assert modes == {"mig"}  # a MIG release: the energy processor does not count it as active again
