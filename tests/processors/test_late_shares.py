"""Late shares: energy a MIG device held for dcgm-exporter's 30 s sample, released after its process exited.

The attribution processor hands such energy out as a GpuShare of a pid the driver no longer lists, with
``power_w`` 0 (processors/_mig_attribution.py). The k8s processor must still say whose it is (it remembers
an exited pid's workload for ``keep_exited``), and the energy processor must add it to the pid's last
series, and to its container and pod, without reviving any of them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.helpers.context import make_context
from tests.processors.test_idle_energy import energy
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import DevicePower, GpuProcessSample, GpuShare, HostProcess, Totals, Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.energy import EnergyProcessor
from wattpipe.processors.k8s import K8sConfig, K8sProcessor

CID = "c" * 64


def running(clock: SteppedClock, pid: int, mj: int, device: str = "G") -> GpuShare:
    """The share of a process the driver lists this tick."""
    return GpuShare(time=clock.now(), device_id=device, pid=pid, share=0.5, energy_mj=mj, power_w=mj / 5000)


def late(clock: SteppedClock, pid: int, mj: int, device: str = "G") -> GpuShare:
    """Held energy released to a process that has exited: no watts, no share of this tick (``_exited``)."""
    return GpuShare(time=clock.now(), device_id=device, pid=pid, share=0.0, energy_mj=mj, power_w=0.0, mode="mig")


def host(clock: SteppedClock, pid: int, start: int, comm: str) -> HostProcess:
    return HostProcess(time=clock.now(), pid=pid, comm=comm, start_time_ticks=start, container_id=CID, pod_uid="uid-a")


def member(clock: SteppedClock, pid: int, pod_uid: str = "uid-a") -> Workload:
    return Workload(
        time=clock.now(), pid=pid, container_id=CID, container_name="main", pod_uid=pod_uid, pod_name="job-1",
        pod_namespace="batch",
    )  # fmt: skip


def pod_listed(clock: SteppedClock) -> list[Workload]:
    """The k8s processor's list of the node's pods: job-1 exists (and the list is complete)."""
    return [
        Workload(time=clock.now(), pid=None, listed="api"),
        Workload(time=clock.now(), pid=None, pod_uid="uid-a", pod_name="job-1", pod_namespace="batch", listed="api"),
        dataclasses.replace(member(clock, 0), pid=None, listed="api"),
    ]


def power_of(clock: SteppedClock, device: str, active_mj: int, held_mj: int = 0) -> DevicePower:
    """Device power with no idle part, and ``held_mj`` held at the end of the tick."""
    return DevicePower(
        time=clock.now(), device_id=device, interval_s=5.0, power_w=0.0, idle_w=None, active_w=0.0,
        energy_mj=active_mj, idle_energy_mj=0, active_energy_mj=active_mj, held_energy_mj=held_mj,
    )  # fmt: skip


def step(
    proc: EnergyProcessor,
    clock: SteppedClock,
    shares: list[GpuShare],
    listed: list[tuple[int, str]],
    *,
    hosts: list[HostProcess] | None = None,
    workloads: list[Workload] | None = None,
    held_mj: int = 0,
) -> Batch:
    """One 5 s tick of device G (and H when a share names it): ``listed`` (pid, device) is the driver's list."""
    devices = sorted({"G", *(s.device_id for s in shares)})
    powers = tuple(power_of(clock, d, sum(s.energy_mj for s in shares if s.device_id == d), held_mj) for d in devices)
    procs = tuple(GpuProcessSample(time=clock.now(), device_id=d, pid=p) for p, d in listed)
    batch = Batch(time=clock.now(), interval_s=5.0, node="n").replace(
        device_power=powers, shares=tuple(shares), gpu_processes=procs
    )
    if hosts is not None:
        batch = batch.replace(host_processes=tuple(hosts))
    if workloads is not None:
        batch = batch.replace(workloads=tuple(workloads))
    out = proc.process(batch)
    clock.advance(5.0)
    return out


def rows(b: Batch, scope: str = "process") -> list[tuple[str, str, int, str, float | None]]:
    """(key, device, energy, state, watts) of each series of ``scope``."""
    return sorted((t.key, t.device_id, t.energy_mj, t.state, t.power_w) for t in b.totals if t.scope == scope)


def one(b: Batch, scope: str) -> Totals:
    (t,) = [t for t in b.totals if t.scope == scope]
    return t


# --- energy: the process series ------------------------------------------------------------------


def test_a_late_share_adds_to_the_ended_series_without_reviving_it() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, [running(clock, 1, 100)], [(1, "G")])
    assert rows(step(proc, clock, [], [])) == [("1", "G", 100, "terminated", 0.0)]
    b = step(proc, clock, [late(clock, 1, 40)], [])
    assert rows(b) == [("1", "G", 140, "terminated", 0.0)]
    b = step(proc, clock, [], [])  # and nothing flaps back
    assert rows(b) == [("1", "G", 140, "terminated", 0.0)]


def test_with_procfs_a_late_share_goes_to_the_series_of_the_process_that_ran_not_a_new_one() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, [running(clock, 7, 100)], [(7, "G")], hosts=[host(clock, 7, 1000, "job")])
    start = one(step(proc, clock, [], [], hosts=[]), "process").start
    b = step(proc, clock, [late(clock, 7, 40)], [], hosts=[])  # gone from /proc too: its start time unknown
    t = one(b, "process")
    assert (t.key, t.energy_mj, t.state, t.power_w, t.start) == ("7", 140, "terminated", 0.0, start)
    assert dict(t.extra)["comm"] == "job"


def test_a_late_share_of_a_pid_reused_on_another_gpu_stays_with_the_process_that_exited() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, [running(clock, 7, 100)], [(7, "G")], hosts=[host(clock, 7, 1000, "old")])
    step(proc, clock, [], [], hosts=[])
    # The kernel gave pid 7 to a new process, which runs on GPU H; GPU G releases the old one's held energy.
    new = [host(clock, 7, 5555, "new")]
    b = step(proc, clock, [late(clock, 7, 40), running(clock, 7, 30, "H")], [(7, "H")], hosts=new)
    assert rows(b) == [("7", "G", 140, "terminated", 0.0), ("7", "H", 30, "running", 0.006)]
    comm = {t.device_id: dict(t.extra)["comm"] for t in b.totals if t.scope == "process"}
    assert comm == {"G": "old", "H": "new"}


def test_a_share_of_a_listed_process_still_revives_its_series() -> None:
    # A process that left the driver's list and came back (a pause) is running again: only an unlisted pid's
    # share is late.
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, [running(clock, 1, 100)], [(1, "G")])
    step(proc, clock, [], [])
    b = step(proc, clock, [late(clock, 1, 0)], [(1, "G")])  # listed, idle: share and watts 0
    assert rows(b) == [("1", "G", 100, "running", 0.0)]


def test_ended_series_on_a_gpu_holding_energy_stay_until_no_late_energy_can_come() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=10.0, late_energy_wait=40.0)
    step(proc, clock, [running(clock, 1, 100)], [(1, "G")], held_mj=500)
    for _ in range(6):  # it ended in the first of these; 25 s later: past the retention, within the wait
        b = step(proc, clock, [], [], held_mj=500)
    assert rows(b) == [("1", "G", 100, "terminated", 0.0)]
    b = step(proc, clock, [late(clock, 1, 40)], [], held_mj=500)
    assert rows(b) == [("1", "G", 140, "terminated", 0.0)]
    for _ in range(3):  # 45 s after it ended
        b = step(proc, clock, [], [], held_mj=500)
    assert rows(b) == []
    # On a GPU that holds nothing no energy can come for it: terminated_retention as before.
    step(proc, clock, [running(clock, 2, 100)], [(2, "G")])
    for _ in range(4):  # 15 s after it ended
        b = step(proc, clock, [], [])
    assert rows(b) == []


def test_a_late_share_for_a_series_already_dropped_counts_as_unattributed(caplog: pytest.LogCaptureFixture) -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=5.0, late_energy_wait=0.0)
    step(proc, clock, [running(clock, 1, 100)], [(1, "G")], held_mj=500)
    for _ in range(3):
        step(proc, clock, [], [], held_mj=500)
    with caplog.at_level(logging.WARNING):
        b = step(proc, clock, [late(clock, 1, 40)], [], held_mj=500)
    assert rows(b) == []  # no series made again for it
    (dt,) = b.device_totals
    assert (dt.active_energy_mj, dt.attributed_energy_mj, dt.unattributed_energy_mj) == (140, 100, 40)
    assert "late_energy_wait" in caplog.text


def test_a_late_share_after_a_restart_finds_the_ended_series_in_the_state_file(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    proc = energy(clock, store)
    step(proc, clock, [running(clock, 7, 100)], [(7, "G")], hosts=[host(clock, 7, 1000, "job")])
    step(proc, clock, [], [], hosts=[])
    store.put("metrics/energy", proc.snapshot())
    store.save()
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = energy(clock, reloaded)
    b = step(again, clock, [late(clock, 7, 40)], [], hosts=[])
    assert rows(b) == [("7", "G", 140, "terminated", 0.0)]


# --- energy: container and pod series --------------------------------------------------------------


def test_a_late_share_reaches_its_container_and_pod_which_keep_running_at_0_w() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, [running(clock, 1, 100)], [(1, "G")], workloads=[member(clock, 1), *pod_listed(clock)])
    step(proc, clock, [], [], workloads=pod_listed(clock))
    b = step(proc, clock, [late(clock, 1, 40)], [], workloads=[member(clock, 1), *pod_listed(clock)])
    assert rows(b, "pod") == [("uid-a", "G", 140, "running", 0.0)]
    assert rows(b, "container") == [(CID, "G", 140, "running", 0.0)]


def test_a_late_share_of_a_gone_pod_adds_to_its_ended_series_without_reviving_it() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, [running(clock, 1, 100)], [(1, "G")], workloads=[member(clock, 1), *pod_listed(clock)])
    complete = [Workload(time=clock.now(), pid=None, listed="api")]  # the pod is gone
    assert rows(step(proc, clock, [], [], workloads=complete), "pod") == [("uid-a", "G", 100, "terminated", 0.0)]
    b = step(proc, clock, [late(clock, 1, 40)], [], workloads=[member(clock, 1), *complete])
    assert rows(b, "pod") == [("uid-a", "G", 140, "terminated", 0.0)]
    assert rows(b, "container") == [(CID, "G", 140, "terminated", 0.0)]


# --- k8s: who an exited pid was ----------------------------------------------------------------------


def k8s(clock: SteppedClock, **options: object) -> K8sProcessor:
    proc = K8sProcessor(K8sConfig(api="off", **options), make_context("k8s", clock=clock), env={})
    proc.start()
    return proc


def k8s_tick(
    proc: K8sProcessor,
    clock: SteppedClock,
    listed: list[int],
    hosts: list[int],
    shares: Sequence[int] = (),
) -> dict[int, Workload]:
    """One 5 s tick: ``listed`` pids on GPU G, ``hosts`` in /proc (in job-1's container), late ``shares``."""
    now = clock.now()
    batch = Batch(time=now, interval_s=5.0, node="n").replace(
        gpu_processes=tuple(GpuProcessSample(time=now, device_id="G", pid=p) for p in listed),
        host_processes=tuple(host(clock, p, 1000 + p, "job") for p in hosts),
        shares=tuple(late(clock, p, 10) for p in shares),
    )
    out = proc.process(batch)
    clock.advance(5.0)
    return {w.pid: w for w in out.workloads if w.pid is not None}


def test_an_exited_process_keeps_its_workload_for_its_late_shares() -> None:
    clock = SteppedClock()
    proc = k8s(clock, keep_exited=30.0)
    k8s_tick(proc, clock, [1], [1])
    assert k8s_tick(proc, clock, [], []) == {}  # no share for it: nothing to say
    for _ in range(5):  # until 30 s after the driver stopped listing it
        now = clock.now()
        got = k8s_tick(proc, clock, [], [], shares=[1])
        assert (got[1].time, got[1].container_id, got[1].pod_uid) == (now, CID, "uid-a")
    assert k8s_tick(proc, clock, [], [], shares=[1]) == {}  # keep_exited is over: forgotten


def test_a_share_of_a_pid_never_listed_gets_no_workload() -> None:
    clock = SteppedClock()
    proc = k8s(clock)
    assert k8s_tick(proc, clock, [], [5], shares=[5]) == {}  # /proc has it, the driver never listed it


def test_the_memory_of_exited_processes_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    clock = SteppedClock()
    proc = k8s(clock, max_exited=2)
    k8s_tick(proc, clock, [1, 2, 3], [1, 2, 3])
    with caplog.at_level(logging.WARNING):
        k8s_tick(proc, clock, [], [])
    assert set(k8s_tick(proc, clock, [], [], shares=[1, 2, 3])) == {2, 3}
    assert "max_exited" in caplog.text


def test_k8s_options_for_exited_processes() -> None:
    config = K8sConfig()
    assert (config.keep_exited, config.max_exited) == (120.0, 4096)
    with pytest.raises(ValueError, match="max_exited"):
        K8sConfig(max_exited=-1)


# --- both: an exited job's held energy reaches its pod -----------------------------------------------


def test_the_held_energy_of_an_exited_job_reaches_its_pod_through_k8s_and_energy() -> None:
    clock = SteppedClock()
    names = k8s(clock)
    totals = energy(clock)

    def tick(listed: list[int], shares: list[GpuShare]) -> Batch:
        now = clock.now()
        batch = Batch(time=now, interval_s=5.0, node="n").replace(
            device_power=(power_of(clock, "G", sum(s.energy_mj for s in shares)),),
            gpu_processes=tuple(GpuProcessSample(time=now, device_id="G", pid=p) for p in listed),
            host_processes=tuple(host(clock, p, 1000 + p, "job") for p in listed),
            shares=tuple(shares),
        )
        out = totals.process(names.process(batch))
        clock.advance(5.0)
        return out

    tick([1], [running(clock, 1, 0)])  # held: no energy yet
    tick([], [])
    b = tick([], [late(clock, 1, 250)])
    assert rows(b, "process") == [("1", "G", 250, "terminated", 0.0)]
    assert rows(b, "container") == [(CID, "G", 250, "running", 0.0)]
    assert rows(b, "pod") == [("uid-a", "G", 250, "running", 0.0)]
