"""Ended series aged on the monotonic clock (two reviews, session 9).

An ended (terminated) series was dropped once the wall time since it ended passed ``terminated_retention``
(``late_energy_wait`` on a GPU holding energy), and a gone device's totals once the wall time since it was found
gone did. A forward wall-clock step (NTP, a VM resumed) past the retention dropped every ended series at once,
and MIG energy released for them later went unattributed; a backward step kept them an hour longer than
configured. Within a run they age on the monotonic clock now. The state file keeps when each ended as a wall
time, so that a restart counts wattpipe's downtime: restored, it is placed on this run's monotonic clock by its
wall age (never below 0), and saved by the wall clock of the last tick (a step during the run does not age it).

Also: a pid reused on one GPU while an earlier series of it is kept gets ``series_start`` even after
``max_terminated`` dropped the pid's latest series first (it has the fewest joules).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.processors.test_cpu_attribution import Node, processor, step, totals
from tests.processors.test_idle_energy import energy
from tests.processors.test_late_shares import host, late, member, pod_listed, rows, running
from tests.processors.test_late_shares import step as gpu_step
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.state import StateStore
from wattpipe.processors._energy_series import SERIES_START
from wattpipe.processors.cpu_attribution import CpuAttributionProcessor
from wattpipe.processors.energy import EnergyProcessor

HOUR_S = 3600.0
PROCESSORS = Path(__file__).resolve().parents[1] / "processors"


def _ended_gpu_series(clock: SteppedClock, proc: EnergyProcessor, held_mj: int = 0) -> float:
    """Pid 1 runs a tick on GPU G (100 mJ) and exits: its series ends in the second tick; returns that tick's
    monotonic time."""
    gpu_step(proc, clock, [running(clock, 1, 100)], [(1, "G")], held_mj=held_mj)
    ended_s = clock.monotonic()
    assert rows(gpu_step(proc, clock, [], [], held_mj=held_mj)) == [("1", "G", 100, "terminated", 0.0)]
    return ended_s


def _last_kept_s(tick: Callable[[], object], clock: SteppedClock, ended_s: float) -> float:
    """5 s ticks until ``tick`` gives nothing (the series was dropped): how long after ``ended_s`` (monotonic)
    the last tick that still gave it was; -1 when the first did not."""
    last_s = -1.0
    for _ in range(1000):
        at_s = clock.monotonic()
        if not tick():
            return last_s
        last_s = at_s - ended_s
    raise AssertionError("never dropped")


# --- the GPU energy processor ----------------------------------------------------------------------------------


def test_a_forward_wall_step_drops_no_ended_gpu_series_and_its_late_energy_is_still_billed_to_it() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0, late_energy_wait=120.0)
    ended_s = _ended_gpu_series(clock, proc, held_mj=500)
    clock._offset_s += HOUR_S  # the wall clock steps forward an hour
    assert rows(gpu_step(proc, clock, [], [], held_mj=500)) == [("1", "G", 100, "terminated", 0.0)]  # was []
    b = gpu_step(proc, clock, [late(clock, 1, 40)], [])  # 10 s after it ended: the last of its held energy
    assert rows(b) == [("1", "G", 140, "terminated", 0.0)]  # was []: the 40 mJ unattributed
    (dt,) = b.device_totals
    assert (dt.active_energy_mj, dt.attributed_energy_mj, dt.unattributed_energy_mj) == (140, 140, 0)
    assert proc.late_unattributed_mj == 0
    # and it goes terminated_retention after it ended on the monotonic clock (nothing held now)
    assert _last_kept_s(lambda: rows(gpu_step(proc, clock, [], [])), clock, ended_s) == 60.0


def test_a_backward_wall_step_keeps_no_ended_gpu_series_past_its_retention() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0)
    ended_s = _ended_gpu_series(clock, proc)
    clock._offset_s -= HOUR_S  # the wall clock steps back an hour
    assert _last_kept_s(lambda: rows(gpu_step(proc, clock, [], [])), clock, ended_s) == 60.0  # was 3660


def test_a_gpu_series_on_a_device_holding_energy_waits_late_energy_wait_through_a_backward_step() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=10.0, late_energy_wait=40.0)
    ended_s = _ended_gpu_series(clock, proc, held_mj=500)
    clock._offset_s -= HOUR_S
    assert _last_kept_s(lambda: rows(gpu_step(proc, clock, [], [], held_mj=500)), clock, ended_s) == 40.0


def _silent(proc: EnergyProcessor, clock: SteppedClock) -> Batch:
    """A tick in which no device answered."""
    out = proc.process(Batch(time=clock.now(), interval_s=5.0, node="n"))
    clock.advance(5.0)
    return out


def _gone_device(clock: SteppedClock, proc: EnergyProcessor) -> float:
    """GPU G answers once (pid 1 on it), then no more: gone (``device_gone_after`` 10 s) in the third silent
    tick, whose monotonic time this returns (its series ended then)."""
    gpu_step(proc, clock, [running(clock, 1, 100)], [(1, "G")])
    for _ in range(3):
        gone_s = clock.monotonic()
        b = _silent(proc, clock)
    assert [d.device_id for d in b.device_totals] == ["G"]
    assert rows(b) == [("1", "G", 100, "terminated", None)]
    return gone_s


def test_a_gone_device_and_its_series_stay_exported_their_retention_through_a_forward_wall_step() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0, device_gone_after=10.0)
    gone_s = _gone_device(clock, proc)
    clock._offset_s += HOUR_S
    b = _silent(proc, clock)
    assert [d.device_id for d in b.device_totals] == ["G"]  # was []: past the retention by the wall clock
    assert rows(b) == [("1", "G", 100, "terminated", None)]
    assert _last_kept_s(lambda: _silent(proc, clock).device_totals, clock, gone_s) == 60.0


def test_a_gone_device_is_not_exported_past_its_retention_after_a_backward_wall_step() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0, device_gone_after=10.0)
    gone_s = _gone_device(clock, proc)
    clock._offset_s -= HOUR_S
    assert _last_kept_s(lambda: _silent(proc, clock).device_totals, clock, gone_s) == 60.0  # was 3660


def test_a_pod_series_ages_on_the_monotonic_clock() -> None:
    # Containers and pods (processors/_energy_groups.py) are pruned by the same rule.
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0)
    gpu_step(proc, clock, [running(clock, 1, 100)], [(1, "G")], workloads=[member(clock, 1), *pod_listed(clock)])
    ended_s = clock.monotonic()
    b = gpu_step(proc, clock, [], [], workloads=pod_listed(clock)[:1])  # the list lacks the pod: it is gone
    assert rows(b, "pod") == [("uid-a", "G", 100, "terminated", 0.0)]
    clock._offset_s += HOUR_S

    def pods() -> object:
        return rows(gpu_step(proc, clock, [], [], workloads=pod_listed(clock)[:1]), "pod")

    assert _last_kept_s(pods, clock, ended_s) == 60.0  # was -1: dropped at the step


@settings(max_examples=60, deadline=None)
@given(
    retention_s=st.sampled_from([10.0, 60.0, 95.0]),
    steps_s=st.lists(st.floats(-2 * HOUR_S, 2 * HOUR_S, allow_nan=False), min_size=1, max_size=30),
)
def test_whatever_the_wall_clock_does_an_ended_series_is_exported_until_its_retention(
    retention_s: float, steps_s: list[float]
) -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=retention_s)
    ended_s = _ended_gpu_series(clock, proc)
    for step_s in steps_s:  # the wall clock steps before each tick, by any amount either way
        clock._offset_s += step_s
        age_s = clock.monotonic() - ended_s
        assert bool(rows(gpu_step(proc, clock, [], []))) == (age_s <= retention_s), age_s


def test_every_end_goes_through_end_which_sets_both_clocks() -> None:
    # A series' end on the wall clock (saved) and on the monotonic one (aged) are set together by
    # _energy_series.end: a bare ``ended_wall_s = <a time>`` elsewhere would age it by an earlier end's time.
    bare = re.compile(r"ended_wall_s\s*=(?!=)(?!\s*None\b)")
    found = [
        f"{path.name}:{n}"
        for path in sorted(PROCESSORS.glob("*.py"))
        if path.name != "_energy_series.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert found == []


# --- across a restart (the state file keeps wall times) --------------------------------------------------------


def _restarted(proc: EnergyProcessor, down_s: float, **options: object) -> tuple[EnergyProcessor, SteppedClock]:
    """``proc``'s state saved, wattpipe down ``down_s`` and started again: a new monotonic clock (its origin far
    below the last run's, as after a reboot), the wall clock gone on by ``down_s``."""
    store = StateStore(None, proc.ctx.clock, "n")
    store.put("metrics/energy", proc.snapshot())
    clock = SteppedClock(start_wall_s=proc.ctx.clock.wall() + down_s, start_monotonic_s=7.0)
    return energy(clock, store, **options), clock


def test_a_restart_drops_an_ended_series_whose_retention_passed_while_wattpipe_was_down() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0)
    _ended_gpu_series(clock, proc)
    again, clock2 = _restarted(proc, down_s=100.0, terminated_retention=60.0)
    assert rows(gpu_step(again, clock2, [], [])) == []


def test_a_restart_keeps_an_ended_series_the_rest_of_its_retention() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0)
    _ended_gpu_series(clock, proc)
    again, clock2 = _restarted(proc, down_s=20.0, terminated_retention=60.0)  # it ended 25 s before this start
    ended_s = clock2.monotonic() - 25.0
    assert _last_kept_s(lambda: rows(gpu_step(again, clock2, [], [])), clock2, ended_s) == 60.0


def test_a_state_file_saved_before_the_monotonic_ages_still_loads() -> None:
    clock = SteppedClock()
    store = StateStore(None, clock, "n")
    now_s = clock.wall()
    row = {"pid": 7, "device_id": "G", "start_ticks": 70, "energy_mj": 5_000, "start_wall_s": now_s - 100.0}
    store.put(
        "metrics/energy",
        {
            "processes": [
                {**row, "ended_wall_s": now_s - 30.0, "attrs": {"comm": "job"}},
                {**row, "pid": 8, "ended_wall_s": now_s - 90.0, "attrs": {}},  # past the retention already
            ],
            "groups": [],
            "instances": [],
            "devices": {},
        },
    )
    proc = energy(clock, store, terminated_retention=60.0)
    ended_s = clock.monotonic() - 30.0
    assert rows(gpu_step(proc, clock, [], [])) == [("7", "G", 5_000, "terminated", 0.0)]
    assert _last_kept_s(lambda: rows(gpu_step(proc, clock, [], [])), clock, ended_s) == 60.0


# --- a reused pid's series_start ------------------------------------------------------------------------------


def test_a_reused_pid_is_labelled_while_an_earlier_series_of_it_is_kept_after_max_terminated_dropped_one() -> None:
    clock = SteppedClock()
    proc = energy(clock, max_terminated=2, terminated_retention=HOUR_S)
    gpu_step(proc, clock, [running(clock, 8, 500)], [(8, "G")], hosts=[host(clock, 8, 80, "other")])
    gpu_step(proc, clock, [running(clock, 7, 1000)], [(7, "G")], hosts=[host(clock, 7, 100, "job")])  # A
    gpu_step(proc, clock, [running(clock, 7, 10)], [(7, "G")], hosts=[host(clock, 7, 200, "job")])  # B (pid reused)
    b = gpu_step(proc, clock, [], [], hosts=[])  # B ends: 3 ended, B (least energy) dropped, A kept
    assert rows(b) == [("7", "G", 1000, "terminated", 0.0), ("8", "G", 500, "terminated", 0.0)]
    gpu_step(proc, clock, [running(clock, 7, 2000)], [(7, "G")], hosts=[host(clock, 7, 300, "job")])  # C
    b = gpu_step(proc, clock, [], [], hosts=[])  # C ends; 8's series dropped
    sevens = [t for t in b.totals if t.scope == "process" and t.key == "7"]
    assert sorted((t.energy_mj, t.state, SERIES_START in dict(t.extra)) for t in sevens) == [
        (1000, "terminated", False),
        (2000, "terminated", True),  # was False: two terminated series of pid 7 with one label set
    ]
    assert len({(t.device_id, t.extra) for t in sevens}) == 2


# --- cpu_attribution ------------------------------------------------------------------------------------------


def _ended_cpu_process(
    retention_s: float, store: StateStore | None = None
) -> tuple[Node, CpuAttributionProcessor, float]:
    """Pid 21 (in container c21) uses CPU for a tick and exits: its series end in the third tick, whose
    monotonic time this returns."""
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(20)
    node.spawn(21, container_id="c21")
    proc = processor(store, terminated_retention=retention_s)
    step(proc, node)
    node.half_busy("intel-rapl:0", 40_000)
    node.run(20, 2.0)
    node.run(21, 3.0)
    step(proc, node)
    del node.procs[21]
    ended_s = node.clock.monotonic()
    out = step(proc, node)
    assert totals(out, "process")[("21", "cpu:package")].state == "terminated"
    assert totals(out, "container")[("c21", "cpu:package")].state == "terminated"
    return node, proc, ended_s


def _cpu_kept(node: Node, proc: CpuAttributionProcessor) -> tuple[bool, bool]:
    """A tick: whether pid 21's series and its container's are exported."""
    out = step(proc, node)
    return ("21", "cpu:package") in totals(out, "process"), ("c21", "cpu:package") in totals(out, "container")


def test_a_forward_wall_step_drops_no_ended_cpu_series_before_its_retention() -> None:
    node, proc, ended_s = _ended_cpu_process(60.0)
    node.clock._offset_s += HOUR_S
    assert _cpu_kept(node, proc) == (True, True)  # was (False, False)
    assert _last_kept_s(lambda: all(_cpu_kept(node, proc)), node.clock, ended_s) == 60.0


def test_a_backward_wall_step_keeps_no_ended_cpu_series_past_its_retention() -> None:
    node, proc, ended_s = _ended_cpu_process(60.0)
    node.clock._offset_s -= HOUR_S
    assert _last_kept_s(lambda: any(_cpu_kept(node, proc)), node.clock, ended_s) == 60.0  # was 3660


def _cpu_restarted(down_s: float) -> tuple[Node, CpuAttributionProcessor]:
    """cpu_attribution's state saved 5 s after pid 21 ended, wattpipe down ``down_s`` and started again on a
    new monotonic clock (its origin far below the last run's)."""
    store = StateStore(None, SteppedClock(), "n")
    node, proc, _ = _ended_cpu_process(60.0, store)
    store.put("metrics/cpu_attribution", proc.snapshot())
    old = node.clock
    node.clock = SteppedClock(start_wall_s=old.wall() + down_s, start_monotonic_s=7.0)
    node.procs = {pid: replace(p, time=node.clock.now()) for pid, p in node.procs.items()}
    return node, processor(store, terminated_retention=60.0)


def test_a_cpu_restart_drops_an_ended_series_whose_retention_passed_while_wattpipe_was_down() -> None:
    node, proc = _cpu_restarted(down_s=100.0)
    assert _cpu_kept(node, proc) == (False, False)


def test_a_cpu_restart_keeps_an_ended_series_the_rest_of_its_retention() -> None:
    node, proc = _cpu_restarted(down_s=20.0)  # pid 21 ended 25 s before this start
    ended_s = node.clock.monotonic() - 25.0
    assert _last_kept_s(lambda: all(_cpu_kept(node, proc)), node.clock, ended_s) == 60.0


def test_a_restart_after_a_wall_step_keeps_an_ended_series_the_rest_of_its_retention() -> None:
    # The state file's end is the wall time it was by the wall clock of the last tick before the save: stepped
    # an hour forward since the series ended, a restart still counts it 20 s old, not an hour.
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0)
    _ended_gpu_series(clock, proc)
    clock._offset_s += HOUR_S
    assert rows(gpu_step(proc, clock, [], [])) == [("1", "G", 100, "terminated", 0.0)]  # 5 s after it ended
    again, clock2 = _restarted(proc, down_s=10.0, terminated_retention=60.0)
    ended_s = clock2.monotonic() - 20.0
    assert _last_kept_s(lambda: rows(gpu_step(again, clock2, [], [])), clock2, ended_s) == 60.0  # was -1


def test_a_cpu_restart_after_a_wall_step_keeps_an_ended_series_the_rest_of_its_retention() -> None:
    store = StateStore(None, SteppedClock(), "n")
    node, proc, _ = _ended_cpu_process(60.0, store)
    node.clock._offset_s += HOUR_S
    assert _cpu_kept(node, proc) == (True, True)  # 5 s after pid 21 ended
    store.put("metrics/cpu_attribution", proc.snapshot())
    node.clock = SteppedClock(start_wall_s=node.clock.wall() + 10.0, start_monotonic_s=7.0)
    node.procs = {pid: replace(p, time=node.clock.now()) for pid, p in node.procs.items()}
    again = processor(store, terminated_retention=60.0)
    ended_s = node.clock.monotonic() - 20.0
    assert _last_kept_s(lambda: all(_cpu_kept(node, again)), node.clock, ended_s) == 60.0  # was -1
