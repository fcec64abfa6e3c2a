"""Held GPU energy released to the process that used it, not to its pid's next owner.

Attribution's idle hold (processors/_idle_hold.py) held a GPU's ticks keyed by pid alone. When a held process
ended and the kernel gave its pid to a new process on the same GPU before idle became known, the release added
the old process's held energy to the new process's share of the release tick (and the energy processor to the
new process's series): the new one was billed for energy used before it existed, the old one's series stayed
short. The same after a restart (the state file's held ticks had pids alone).

Now a held tick keeps each process's start time (procfs's ``start_time_ticks``, where the batch has it); what
is released for a process that is not the one holding its pid now is a late share carrying that start time,
which the energy processor adds to that process's own series (ended: ``terminated``), never to another one's.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.processors.test_attribution_state import attribution, restarted
from tests.processors.test_idle_energy import energy
from tests.processors.test_idle_hold import IDLE_W, at, batch, power
from tests.processors.test_late_shares import late, member, power_of, running
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import GpuProcessSample, GpuShare, HostProcess
from wattpipe.pipeline.state import StateStore
from wattpipe.processors._idle_hold import HeldTick, release
from wattpipe.processors.attribution import AttributionProcessor
from wattpipe.processors.energy import EnergyProcessor

A_START, B_START = 1_000, 5_000  # clock ticks since boot: A ran first, B got its pid later
ACTIVE_MJ = 500_000 - 350_000  # a 100 W tick of 5 s at 70 W idle


def _tick(n: int, start: int | None, idle_w: float | None) -> Batch:
    """Tick ``n``: pid 100 alone on GPU G (the process that started at ``start``; None: nobody), 100 W."""
    listed = {} if start is None else {100: 0.5}
    b = batch(n, power(n, 500_000, idle_w), listed)
    hosts = () if start is None else (HostProcess(time=at(n), pid=100, comm=f"p{start}", start_time_ticks=start),)
    return b.replace(host_processes=hosts)


def _series(out: Batch) -> dict[tuple[str | None, str], int]:
    """Each process series' energy by (its comm, its state)."""
    return {(dict(t.extra).get("comm"), t.state): t.energy_mj for t in out.totals if t.scope == "process"}


def _run(procs: tuple[AttributionProcessor, EnergyProcessor], n: int, start: int | None, idle_w: float | None) -> Batch:
    attr, totals = procs
    return totals.process(attr.process(_tick(n, start, idle_w)))


@pytest.mark.parametrize("b_held", [0, 2], ids=["released-as-B-starts", "B-held-too"])
@pytest.mark.parametrize("gap", [False, True], ids=["at-once", "after-a-free-tick"])
def test_a_held_process_energy_goes_to_it_not_to_the_next_process_with_its_pid(b_held: int, gap: bool) -> None:
    clock = SteppedClock()
    procs = (attribution(clock), energy(clock))
    for n in range(3):  # A (pid 100) held 3 ticks: idle not known yet
        out = _run(procs, n, A_START, None)
        assert out.device_power[0].held_energy_mj == 500_000 * (n + 1)
    n = 3
    if gap:  # nobody on the GPU for a tick: not held (no process), A's series ends
        _run(procs, n, None, None)
        n += 1
    for _ in range(b_held):  # B (the same pid) held as well
        _run(procs, n, B_START, None)
        n += 1
    out = _run(procs, n, B_START, IDLE_W)  # idle known: everything held is released
    assert out.device_power[0].held_energy_mj == 0
    free_active = 500_000 if gap else 0  # the free tick: all active (idle not known), the device's unattributed
    assert _series(out) == {("p1000", "terminated"): 3 * ACTIVE_MJ, ("p5000", "running"): (b_held + 1) * ACTIVE_MJ}
    (device,) = out.device_totals
    assert device.unattributed_energy_mj == free_active
    assert device.attributed_energy_mj == device.active_energy_mj - free_active == (3 + b_held + 1) * ACTIVE_MJ


def test_the_same_across_a_restart() -> None:
    clock = SteppedClock()
    attr, totals = attribution(clock), energy(clock, StateStore(None, clock, "n"))
    for n in range(3):
        totals.process(attr.process(_tick(n, A_START, None)))
    clock.set(at(2).monotonic_s)
    state = StateStore(None, clock, "n")
    state.put("metrics/energy", json.loads(json.dumps(totals.snapshot())))
    procs = (restarted(attr, clock), energy(clock, state))
    clock.set(at(3).monotonic_s)
    out = _run(procs, 3, B_START, IDLE_W)
    assert _series(out) == {("p1000", "terminated"): 3 * ACTIVE_MJ, ("p5000", "running"): ACTIVE_MJ}


def test_without_start_times_the_pid_is_all_there_is_to_go_by() -> None:
    """No procfs (no start times): a reused pid on the same GPU is the same series, as before (documented)."""
    clock = SteppedClock()
    procs = (attribution(clock), energy(clock))
    for n in range(3):
        procs[1].process(procs[0].process(batch(n, power(n, 500_000, None), {100: 0.5})))
    out = procs[1].process(procs[0].process(batch(3, power(3, 500_000, IDLE_W), {100: 0.5})))
    assert {(t.key, t.state): t.energy_mj for t in out.totals if t.scope == "process"} == {
        ("100", "running"): 4 * ACTIVE_MJ
    }


def test_nor_to_the_container_and_pod_of_the_next_process_with_its_pid() -> None:
    """Its container and pod: the k8s processor remembers an exited process's workload only once the driver stops
    listing its (pid, device), never while another process has both: none is known, and the energy goes to the
    process's series alone, not to the container and pod of the process that has the pid now."""
    clock = SteppedClock()
    totals = energy(clock)

    def tick(start: int, pod_uid: str, shares: list[GpuShare]) -> Batch:
        now = clock.now()
        out = totals.process(
            Batch(time=now, interval_s=5.0, node="n").replace(
                device_power=(power_of(clock, "G", sum(s.energy_mj for s in shares)),),
                gpu_processes=(GpuProcessSample(time=now, device_id="G", pid=7),),
                host_processes=(HostProcess(time=now, pid=7, comm=f"p{start}", start_time_ticks=start),),
                workloads=(dataclasses.replace(member(clock, 7, pod_uid), container_id=pod_uid * 8),),
                shares=tuple(shares),
                present=frozenset({"gpu_processes"}),
            )
        )
        clock.advance(5.0)
        return out

    tick(100, "uid-old", [running(clock, 7, 100)])
    released = dataclasses.replace(late(clock, 7, 40), mode="time_slicing", start_time_ticks=100)
    out = tick(900, "uid-new", [running(clock, 7, 30), released])
    assert _series(out) == {("p100", "terminated"): 140, ("p900", "running"): 30}
    assert sorted((t.key, t.energy_mj) for t in out.totals if t.scope == "pod") == [("uid-new", 30), ("uid-old", 100)]


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=10**7),
            st.lists(st.tuples(st.integers(1, 3), st.integers(0, 2), st.floats(0.0, 1.0)), min_size=1, max_size=4),
        ),
        max_size=12,
    ),
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=200.0)),
)
@example([(10, [(1, 0, 0.5), (1, 1, 0.5)])], 0.0)  # a pid held twice in a tick, as two processes
def test_start_times_only_tell_processes_apart_each_pid_gets_what_it_got_before(
    ticks: list[tuple[int, list[tuple[int, int, float]]]], idle_w: float | None
) -> None:
    """Per pid, a release with start times gives what the pid alone gave (Σ over its processes), and the
    processes' energy + unattributed == active: exact conservation either way."""
    with_starts, pid_only = [], []
    for i, (mj, procs) in enumerate(ticks):
        weights = [w for _, _, w in procs]
        shares = tuple(w / sum(weights) if sum(weights) else 1 / len(weights) for w in weights)
        pids = tuple(pid for pid, _, _ in procs)
        starts = tuple(None if start == 0 else 1000 * start for _, start, _ in procs)
        with_starts.append(HeldTick(float(i), 5.0, mj, pids, shares, "time_slicing", starts))
        pid_only.append(HeldTick(float(i), 5.0, mj, pids, shares))
    got, before = release(with_starts, idle_w), release(pid_only, idle_w)
    per_pid: dict[int, int] = {}
    for (pid, _), mj in (got.by_process or {}).items():
        per_pid[pid] = per_pid.get(pid, 0) + mj
    assert per_pid == {pid: mj for (pid, _), mj in (before.by_process or {}).items()}
    assert (got.idle_mj, got.active_mj, got.unattributed_mj) == (
        before.idle_mj,
        before.active_mj,
        before.unattributed_mj,
    )
    assert got.idle_mj + got.active_mj == sum(t.energy_mj for t in with_starts)


def _saved_by_an_older_wattpipe(attr: AttributionProcessor) -> dict[str, object]:
    """``attr``'s snapshot as a wattpipe from before start times were kept wrote it (no ``starts``)."""
    saved = json.loads(json.dumps(attr.snapshot()))
    for ticks in saved["idle_hold"].values():
        for row in ticks:
            assert row.pop("starts") == [A_START]
    return saved


def test_a_state_file_without_start_times_still_loads_and_goes_by_the_pid() -> None:
    """Held ticks saved before start times were kept: released to whichever process has the pid (documented)."""
    clock = SteppedClock()
    first = attribution(clock)
    for n in range(3):
        first.process(_tick(n, A_START, None))
    clock.set(at(2).monotonic_s)
    state = StateStore(None, clock, "n")
    state.put("metrics/attribution", _saved_by_an_older_wattpipe(first))
    procs = (attribution(clock, state), energy(clock))
    clock.set(at(3).monotonic_s)
    out = _run(procs, 3, B_START, IDLE_W)
    assert _series(out) == {("p5000", "running"): 4 * ACTIVE_MJ}


@pytest.mark.parametrize(
    ("starts", "error"),
    [
        ([1, 2], "1 pids and 2 start times (one per pid, or none)"),
        (["1000"], "start time '1000' is not a whole number of clock ticks"),
        ([True], "start time True is not a whole number of clock ticks"),
    ],
)
def test_a_held_tick_whose_start_times_do_not_fit_is_refused_naming_it(starts: list[object], error: str) -> None:
    clock = SteppedClock()
    first = attribution(clock)
    first.process(_tick(0, A_START, None))
    saved = json.loads(json.dumps(first.snapshot()))
    saved["idle_hold"]["G"][0]["starts"] = starts
    state = StateStore(None, clock, "n")
    state.put("metrics/attribution", saved)
    with pytest.raises(ValueError, match=f"idle_hold of device G, tick 0: .*{re.escape(error)}"):
        attribution(clock, state)
