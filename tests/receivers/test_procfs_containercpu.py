"""procfs with ``cpu_time`` and ``cgroup_root``: a ``ContainerCpuTime`` per container, from the ``cpu.stat`` reads
it already makes to skip idle cgroups (receivers/procfs/_containercpu.py), for ``cpu_attribution``'s
``unseen: containers``."""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tests.receivers.test_procfs import make_receiver, write_process
from tests.receivers.test_procfs_cgroupcpu import mount, usage
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import HostProcess
from wattpipe.pipeline.records_cpu import ContainerCpuTime
from wattpipe.receivers.procfs import ProcfsReceiver
from wattpipe.receivers.procfs._cgroup import CgroupIdentity
from wattpipe.receivers.procfs._containercpu import container_usage

ID_A = "a" * 64
ID_B = "b" * 64
UID = "a1b2c3d4-e5f6-4789-abcd-ef0123456789"
POD = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
A = f"{POD}/cri-containerd-{ID_A}.scope"
B = f"{POD}/cri-containerd-{ID_B}.scope"


def containers(receiver: ProcfsReceiver) -> dict[str, ContainerCpuTime] | None:
    """One tick's container records by id; None where the receiver says the field is absent this tick."""
    records = asyncio.run(receiver.collect())
    if "container_cpu" not in receiver.provides:
        assert not any(isinstance(r, ContainerCpuTime) for r in records)
        return None
    return {r.container_id: r for r in records if isinstance(r, ContainerCpuTime)}


def advance(receiver: ProcfsReceiver, seconds: float = 5.0) -> None:
    clock = receiver.clock
    assert isinstance(clock, SteppedClock)
    clock.advance(seconds)


def test_each_containers_cumulative_cgroup_usage_in_seconds_with_its_pod(tmp_path: Path) -> None:
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "make", utime=100, cgroup=f"0::{A}\n")
    write_process(proc, 11, "cc1", utime=100, cgroup=f"0::{A}\n")
    write_process(proc, 12, "nginx", utime=100, cgroup=f"0::{B}\n")
    write_process(proc, 13, "sshd", utime=100, cgroup="0::/system.slice/ssh.service\n")  # in no container
    usage(cgroups, A, 7_250_000)
    usage(cgroups, B, 1_000_000)
    usage(cgroups, "/system.slice/ssh.service", 3_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    # the first scan reads each container's cgroup after its processes' stat (its first reading, a baseline)
    first = containers(receiver)
    assert first is not None
    assert sorted(first) == [ID_A, ID_B]
    advance(receiver)
    second = containers(receiver)
    assert second is not None
    assert sorted(second) == [ID_A, ID_B]  # one per container, however many processes; none for sshd's cgroup
    a = second[ID_A]
    assert (a.usage_s, a.pod_uid, a.container_runtime) == (7.25, UID, "containerd")
    usage(cgroups, A, 9_000_000)
    advance(receiver)
    third = containers(receiver)
    assert third is not None
    assert third[ID_A].usage_s == 9.0
    assert third[ID_A].time.monotonic_s - a.time.monotonic_s == 5.0


def test_a_container_whose_last_process_ended_is_read_while_its_cgroup_is(tmp_path: Path) -> None:
    # Read once more, then not, its series ended though its cgroup ran on (a process started and ended between two
    # scans: never listed) and a listing cut at max_processes cost its container a tick (tests/e2e/
    # test_cpu_unseen_faults.py). Now a container with a record is read at the next scan, while it can be.
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "job", utime=100, cgroup=f"0::{A}\n")
    write_process(proc, 1, "init", utime=100)  # (a /proc with no process at all is a failed listing)
    usage(cgroups, A, 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    containers(receiver)
    advance(receiver)
    baseline = containers(receiver)
    assert baseline is not None
    assert baseline[ID_A].usage_s == 1.0
    # the job runs 2 s more and exits before the next scan: its cgroup still counts them
    for name in os.listdir(proc / "10"):
        os.remove(proc / "10" / name)
    os.rmdir(proc / "10")
    usage(cgroups, A, 3_000_000)
    advance(receiver)
    last = containers(receiver)
    assert last is not None
    assert last[ID_A].usage_s == 3.0
    usage(cgroups, A, 3_500_000)  # a process that lived between two scans
    advance(receiver)
    again = containers(receiver)
    assert again is not None
    assert again[ID_A].usage_s == 3.5
    shutil.rmtree(cgroups / A.lstrip("/"))  # the runtime removed it
    advance(receiver)
    assert containers(receiver) == {}
    usage(cgroups, A, 4_000_000)
    advance(receiver)
    assert containers(receiver) == {}  # not read again (nor made again under its id: a record would start over)


def test_a_removed_cgroup_gives_no_record_not_zero(tmp_path: Path) -> None:
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "job", utime=100, cgroup=f"0::{A}\n")
    usage(cgroups, A, 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    containers(receiver)
    advance(receiver)
    os.remove(cgroups / A.lstrip("/") / "cpu.stat")
    assert containers(receiver) == {}


def test_no_cgroup_v2_mount_no_records_absent_not_empty(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_process(proc, 10, "job", utime=100, cgroup=f"0::{A}\n")
    plain = tmp_path / "cgroup"
    plain.mkdir()  # no cgroup.controllers: not a cgroup v2 mount
    receiver = make_receiver(proc, cgroup_root=str(plain))
    assert containers(receiver) is None
    advance(receiver)
    assert containers(receiver) is None
    off = make_receiver(proc, cgroup_root="")
    assert containers(off) is None
    gpu_path = make_receiver(proc, cgroup_root=str(mount(tmp_path / "v2")), cpu_time=False)
    assert containers(gpu_path) is None


def test_a_nested_cgroup_is_counted_in_its_containers_once() -> None:
    t = Timestamp(wall_s=1.0, monotonic_s=1.0)
    a = CgroupIdentity(container_id=ID_A, pod_uid=UID, runtime="containerd")
    b = CgroupIdentity(container_id=ID_B)
    values = {A: 5_000_000, f"{A}/init.scope": 4_000_000, B: 2_000_000, f"{B}/x": 1_000_000, f"{B}/y": 500_000}
    usec = {path: (f"{path}/cpu.stat", value) for path, value in values.items()}  # (the file read, its usage)
    found = container_usage(t, [(f"{A}/init.scope", a), (A, a), (f"{B}/x", b), (f"{B}/y", b)], usec)[0]
    # A: its own cgroup holds init.scope's usage; B's processes sit in two sibling cgroups: their sum
    assert [(r.container_id, r.usage_s) for r in found] == [(ID_A, 5.0), (ID_B, 1.5)]
    # one of a container's cgroups unreadable: the container unknown, not less
    assert container_usage(t, [(f"{B}/x", b), (f"{B}/y", b)], {f"{B}/x": ("x", 1)})[0] == []


def test_made_only_where_a_processor_asks_for_them(tmp_path: Path) -> None:
    # The graph hands procfs its pipelines' wants: cpu_attribution asks for container_cpu_time with unseen:
    # containers only, so a pipeline without it neither pays for the records nor carries them.
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "job", utime=100, cgroup=f"0::{A}\n")
    usage(cgroups, A, 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    receiver.asked(frozenset({"process_cpu_time"}))
    containers(receiver)
    advance(receiver)
    assert containers(receiver) is None
    receiver.asked(frozenset({"process_cpu_time", "container_cpu_time"}))
    advance(receiver)
    found = containers(receiver)
    assert found is not None
    assert found[ID_A].usage_s == 1.0


def test_the_usage_on_a_full_read_scan_is_that_scans_not_the_last_ones(tmp_path: Path) -> None:
    # Every FULL_READ_EVERY-th scan reads every process's stat and skips the idle-cgroup check; its container
    # usage must still be read then: a stale one makes the next tick's delta span two ticks while the
    # processes' deltas span one, billing the container a whole tick of its processes' time a second time.
    from wattpipe.receivers.procfs._proc import FULL_READ_EVERY

    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "nginx", utime=100, cgroup=f"0::{A}\n")
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    seen: list[float] = []
    for scan in range(2 * FULL_READ_EVERY + 2):
        usage(cgroups, A, 1_000_000 * (scan + 1))
        write_process(proc, 10, "nginx", utime=100 * (scan + 1), cgroup=f"0::{A}\n")
        got = containers(receiver)
        if got:
            seen.append(got[ID_A].usage_s)
        advance(receiver)
    assert seen == [float(scan + 1) for scan in range(2 * FULL_READ_EVERY + 2)]


def test_two_threaded_cgroups_of_one_container_read_through_one_file_count_it_once(tmp_path: Path) -> None:
    # cgroup v2's thread mode (KubeVirt's housekeeping cgroup): two processes whose main threads sit in two
    # threaded children of the container's cgroup are both watched through the container's own cpu.stat (their
    # threaded domain). The container's usage is that file's, once: not once per child read through it.
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "virt-launcher", utime=100, cgroup=f"0::{A}/t1\n")
    write_process(proc, 11, "worker", utime=100, cgroup=f"0::{A}/t2\n")
    usage(cgroups, A, 4_000_000)
    for child in ("t1", "t2"):
        usage(cgroups, f"{A}/{child}", 1_000_000)
        (cgroups / A.lstrip("/") / child / "cgroup.type").write_text("threaded\n")
    (cgroups / A.lstrip("/") / "cgroup.type").write_text("domain threaded\n")
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    containers(receiver)
    advance(receiver)
    got = containers(receiver)
    assert got is not None
    assert got[ID_A].usage_s == 4.0


def test_a_container_whose_cgroup_holds_another_containers_has_no_record(tmp_path: Path) -> None:
    # Docker-in-Docker without a delegated leaf: the outer container's dockerd sits in its own cgroup, and the
    # inner container's cgroup is below it (its id is the deepest in the path: the processes are the inner's).
    # The outer cgroup's usage_usec counts the inner's processes, which are billed on their own: the outer's
    # unseen time would be the inner's time a second time. Unknown (no record), not twice.
    outer = f"/system.slice/docker-{ID_A}.scope"
    inner = f"{outer}/docker/{ID_B}"
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "dockerd", utime=100, cgroup=f"0::{outer}\n")
    usage(cgroups, outer, 2_000_000)
    usage(cgroups, inner, 0)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    containers(receiver)
    advance(receiver)
    alone = containers(receiver)
    assert alone is not None
    assert alone[ID_A].usage_s == 2.0  # nothing inside it yet
    # the inner container starts (its process listed this scan, its time in the outer's cgroup already)
    write_process(proc, 11, "app", utime=300, cgroup=f"0::{inner}\n")
    usage(cgroups, inner, 3_000_000)
    usage(cgroups, outer, 5_500_000)
    advance(receiver)
    first = containers(receiver)
    assert first is not None
    assert ID_A not in first
    usage(cgroups, inner, 4_000_000)
    usage(cgroups, outer, 6_600_000)
    advance(receiver)
    nested = containers(receiver)
    assert nested is not None
    assert ID_A not in nested
    assert nested[ID_B].usage_s == 4.0
    # the inner container ends (its cgroup removed, its time left in the outer's usage: billed on its own)
    shutil.rmtree(proc / "11")
    shutil.rmtree(cgroups / inner.lstrip("/"))
    usage(cgroups, outer, 7_000_000)
    for _ in range(2):  # (the inner's cgroup, read for its process at the last scan, is gone: then the outer alone)
        advance(receiver)
        alone = containers(receiver)
        assert alone is not None
    assert alone[ID_A].usage_s == 7.0
    assert alone[ID_A].since_s == alone[ID_A].time.monotonic_s  # a baseline: 4.4 s of it since were the inner's


def test_a_container_whose_cgroups_read_changed_has_no_record_that_scan(tmp_path: Path) -> None:
    # A container whose processes sit in several cgroups (systemd inside it, a kind node): its usage is the sum of
    # the cgroups its last scan's processes were in. Where that set changes, the sum is of other cgroups: a cgroup
    # back in it would add its whole past (time billed long ago) to one tick's delta. That scan: no record, so the
    # next is a baseline.
    x, y = f"{A}/x.service", f"{A}/y.service"
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "x", utime=100, cgroup=f"0::{x}\n")
    write_process(proc, 1, "init", utime=100)
    usage(cgroups, x, 1_000_000)
    usage(cgroups, y, 50_000_000)  # y.service ran for long, its processes gone before wattpipe started
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    containers(receiver)
    advance(receiver)
    before = containers(receiver)
    assert before is not None
    assert before[ID_A].usage_s == 1.0
    write_process(proc, 11, "y", utime=10, cgroup=f"0::{y}\n")  # y.service starts again: 0.1 s
    usage(cgroups, y, 50_100_000)
    advance(receiver)
    same = containers(receiver)  # (the last scan's cgroups read: x alone)
    assert same is not None
    assert same[ID_A].usage_s == 1.0
    assert same[ID_A].since_s == before[ID_A].since_s  # goes on
    advance(receiver)
    changed = containers(receiver)  # x and y now: 51.1 s, of which 50 s were never this tick's
    assert changed is not None
    assert ID_A not in changed
    usage(cgroups, y, 50_200_000)
    advance(receiver)
    after = containers(receiver)
    assert after is not None
    assert after[ID_A].usage_s == 51.2  # the same cgroups as the last scan's: a record again
    assert after[ID_A].since_s == after[ID_A].time.monotonic_s  # a baseline: it does not go on from 1.0 s
    advance(receiver)
    assert containers(receiver) == {ID_A: replace(after[ID_A], time=receiver.clock.now())}  # goes on from it


def test_a_process_moved_without_an_exec_out_of_a_busy_container_is_listed_in_its_new_one(tmp_path: Path) -> None:
    # procfs reads a process's cgroup once per (pid, start time), again on an exec or (where the cgroup it was read
    # in idled) at a full read: one moved without an exec out of a busy container stayed listed in it for good, and
    # unseen: containers weighed its time twice (its own delta, and its new container's cgroup growth). Its old
    # cgroup's usage now grows less than its listed processes ran: their identities are read again
    # (receivers/procfs/_cgroupmoves.py).
    from tests.receivers.test_procfs import poll
    from wattpipe.receivers.procfs._proc import FULL_READ_EVERY

    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "app", utime=100, cgroup=f"0::{A}\n")
    write_process(proc, 11, "worker", utime=100, cgroup=f"0::{A}\n")
    write_process(proc, 12, "nginx", utime=100, cgroup=f"0::{B}\n")
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    ticks = 100
    for scan in range(2 * FULL_READ_EVERY + 2):
        ticks += 100
        usage(cgroups, A, 10_000 * ticks)  # app keeps A busy
        usage(cgroups, B, 20_000 * ticks)
        write_process(proc, 10, "app", utime=ticks, cgroup=f"0::{A}\n")
        write_process(proc, 11, "worker", utime=ticks, cgroup=f"0::{A if scan < 2 else B}\n")  # moved: no exec
        write_process(proc, 12, "nginx", utime=ticks, cgroup=f"0::{B}\n")
        listed = poll(receiver)
        advance(receiver)
    assert listed[11].container_id == ID_B


def test_processes_running_ahead_of_their_cgroup_by_truncation_and_skew_are_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /proc's whole 10 ms ticks and a stat read after its cgroup's usage make a cgroup's processes run a little
    # ahead of its usage, given back at the next scan: that is no move, and costs no identity read.
    from wattpipe.receivers.procfs._cgroupmoves import ran_elsewhere

    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    for pid in (10, 11, 12):
        write_process(proc, pid, "worker", utime=100, cgroup=f"0::{A}\n")
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    reads: list[set[int]] = []
    real = ran_elsewhere

    def counted(*args: object, **kwargs: object) -> set[int]:
        again = real(*args, **kwargs)  # type: ignore[arg-type]
        reads.append(again)
        return again

    monkeypatch.setattr("wattpipe.receivers.procfs._containercpu.ran_elsewhere", counted)
    for scan in range(30):
        ran_s = 1.0 + 1.235 * scan  # each of three busy processes, as the kernel counts it
        usage(cgroups, A, round(3 * ran_s * 1e6) - (60_000 if scan % 2 else 0))  # read 60 ms early every other scan
        for pid in (10, 11, 12):
            write_process(proc, pid, "worker", utime=int(ran_s * 100), cgroup=f"0::{A}\n")  # whole 10 ms ticks
        containers(receiver)
        advance(receiver)
    # ahead by up to 90 ms a scan (60 ms of skew, 10 ms a process), given back the next: never read again
    assert len(reads) >= 25
    assert not any(reads)


def test_a_container_whose_processes_are_read_again_keeps_its_record(tmp_path: Path) -> None:
    # A cgroup whose processes ran ahead of it has their identities read again (_cgroupmoves.py): they left the
    # cache, whose paths are the cgroups the next scan reads. The one that stayed in A (app) was read again too,
    # and A's cgroup with it, or A had no record that scan and unseen: containers took its next one as a baseline
    # (its unseen time of two scans lost).
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    for pid, path in ((10, A), (11, A), (12, B)):
        write_process(proc, pid, "worker", utime=100, cgroup=f"0::{path}\n")
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    ticks, seen = 100, []
    for scan in range(8):
        ticks += 100
        usage(cgroups, A, 10_000 * ticks)  # app's time: worker's, once it moved, is B's
        usage(cgroups, B, 20_000 * ticks)
        write_process(proc, 10, "app", utime=ticks, cgroup=f"0::{A}\n")
        write_process(proc, 11, "worker", utime=ticks, cgroup=f"0::{A if scan < 2 else B}\n")  # moved: no exec
        write_process(proc, 12, "nginx", utime=ticks, cgroup=f"0::{B}\n")
        got = containers(receiver)
        assert got is not None
        seen.append(ID_A in got)
        advance(receiver)
    assert seen == [True] * 8  # A's usage every scan (app is in it, and listed; the first read after its stat)


def test_a_reused_pid_is_no_process_running_ahead_of_its_cgroup() -> None:
    # Between two scans a pid may name another process (its old one ended): the two records' CPU times are of two
    # processes, and their difference is no time run in the old one's cgroup.
    from wattpipe.receivers.procfs._cgroupmoves import ran_elsewhere

    now = SteppedClock().now()
    was = HostProcess(time=now, pid=10, start_time_ticks=100, cpu_time_s=0.5)
    reused = HostProcess(time=now, pid=10, start_time_ticks=9_000, cpu_time_s=3.0)  # a new process, 3 s of CPU
    file = f"/cg{A}/cpu.stat"
    excess: dict[str, float] = {}
    again = ran_elsewhere([(10, A)], {10: reused}, {10: was}, {A: (file, 7_000_000)}, {file: 7_000_000}, excess)
    assert (again, excess) == (set(), {file: 0.0})  # A idle, and no process of it ran: nothing to read again


def test_a_cgroup_made_again_under_its_path_is_no_process_running_ahead_of_it(tmp_path: Path) -> None:
    # A service restarted (systemd removes its cgroup and makes it again): its usage starts over, lower than the
    # last scan's reading. That is no time its processes ran elsewhere: a baseline, nothing read again (and the
    # scan goes on: with no process of it that ran, it raised KeyError).
    import shutil

    from tests.receivers.test_procfs import poll

    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    service = "/system.slice/app.service"
    write_process(proc, 10, "app", utime=100, cgroup=f"0::{service}\n")
    write_process(proc, 12, "nginx", utime=100, cgroup=f"0::{B}\n")
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    for scan in range(3):
        usage(cgroups, service, 50_000_000 + 1_000_000 * scan)
        usage(cgroups, B, 1_000_000 * (scan + 1))
        write_process(proc, 10, "app", utime=100 + 100 * scan, cgroup=f"0::{service}\n")
        write_process(proc, 12, "nginx", utime=100 + 100 * scan, cgroup=f"0::{B}\n")
        containers(receiver)
        advance(receiver)
    shutil.rmtree(proc / "10")  # restarted: app's old process ended, its cgroup made again
    usage(cgroups, service, 300_000)
    usage(cgroups, B, 4_000_000)
    write_process(proc, 12, "nginx", utime=400, cgroup=f"0::{B}\n")
    got = containers(receiver)
    assert got is not None
    assert got[ID_B].usage_s == 4.0
    advance(receiver)
    write_process(proc, 11, "app", utime=50, start=900, cgroup=f"0::{service}\n")
    assert poll(receiver)[11].cpu_time_s == 0.5


def test_a_cgroup_whose_processes_ran_ahead_then_rested_raises_nothing() -> None:
    # Five processes ran 0.27 s ahead of their cgroup (under the bound: 0.25 s and 20 ms each); at the next scan none
    # ran and the cgroup stood still: 0.27 s is past that scan's bound (0.25 s, no process ran). It raised KeyError.
    from wattpipe.receivers.procfs._cgroupmoves import ran_elsewhere

    now = SteppedClock().now()
    first = {pid: HostProcess(time=now, pid=pid, start_time_ticks=1, cpu_time_s=1.0) for pid in range(10, 15)}
    ran = {pid: replace(record, cpu_time_s=2.054) for pid, record in first.items()}  # 5 × 1.054 s = 5.27 s
    file, listed = f"/cg{A}/cpu.stat", [(pid, A) for pid in first]
    excess: dict[str, float] = {}
    assert ran_elsewhere(listed, ran, first, {A: (file, 15_000_000)}, {file: 10_000_000}, excess) == set()
    assert excess[file] == pytest.approx(0.27)
    assert ran_elsewhere(listed, ran, ran, {A: (file, 15_000_000)}, {file: 15_000_000}, excess) == set()
    assert excess == {file: 0.0}  # past the bound: its processes that ran (none) read again, and it starts over


def test_a_cgroup_made_again_under_its_path_goes_on_from_its_last_reading(tmp_path: Path) -> None:
    # `docker restart` keeps the container's id and path; its cgroup is removed and made again, its usage starting
    # over. Read lower than at the last scan, it is a new cgroup, all of its usage since that scan: the container's
    # usage goes on from its last reading (cpu_attribution took a lower one for a baseline: that tick's time lost).
    # In the scan where another container is first listed too (read then, after its processes' stat).
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "app", utime=100, cgroup=f"0::{A}\n")
    usage(cgroups, A, 7_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    containers(receiver)
    advance(receiver)
    shutil.rmtree(proc / "10")
    shutil.rmtree(cgroups / A.lstrip("/"))
    write_process(proc, 11, "app", utime=50, start=900, cgroup=f"0::{A}\n")
    usage(cgroups, A, 1_500_000)
    write_process(proc, 12, "nginx", utime=10, start=900, cgroup=f"0::{B}\n")  # B first listed now
    usage(cgroups, B, 200_000)
    got = containers(receiver)
    assert got is not None
    assert (got[ID_A].usage_s, got[ID_B].usage_s) == (8.5, 0.2)
    since_s = got[ID_A].since_s
    assert since_s is not None
    assert got[ID_A].time.monotonic_s - since_s == 5.0  # goes on from its first reading
    usage(cgroups, A, 2_000_000)
    advance(receiver)
    got = containers(receiver)
    assert got is not None
    assert (got[ID_A].usage_s, got[ID_A].since_s) == (9.0, since_s)


def test_a_container_whose_process_moved_to_another_of_its_cgroups_has_one_scan_without_a_record(
    tmp_path: Path,
) -> None:
    # A container's cgroups read are its listed processes' (the cgroups of one none of whose processes is listed:
    # those of its last record). Its old cgroup, still there, read beside its new one made the sum change twice
    # (old → old and new → new): two scans without a record, where the move is one.
    x, y = f"{A}/x.service", f"{A}/y.service"
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "x", utime=100, cgroup=f"0::{x}\n")
    usage(cgroups, x, 1_000_000)
    usage(cgroups, y, 0)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    had = []
    for scan in range(6):
        if scan == 2:
            shutil.rmtree(proc / "10")  # x's process ended (x.service's cgroup stays), y's started
            write_process(proc, 11, "y", utime=10, start=900, cgroup=f"0::{y}\n")
            usage(cgroups, y, 100_000)
        got = containers(receiver)
        assert got is not None
        had.append(ID_A in got)
        advance(receiver)
    assert had == [True, True, True, False, True, True]


def test_a_container_whose_cpu_stat_is_unreadable_for_a_scan_goes_on_from_its_last_record(tmp_path: Path) -> None:
    # cpu.stat reads nothing for a scan: no record (unknown, not 0 s), and its next record says it goes on from the
    # last one (its since_s kept), so a consumer's delta spans the scan without one; a receiver started afresh knows
    # no reading before its own: its records are baselines.
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "make", utime=100, cgroup=f"0::{A}\n")
    usage(cgroups, A, 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    first = containers(receiver)
    assert first is not None
    assert first[ID_A].since_s == first[ID_A].time.monotonic_s  # its first reading: a baseline
    advance(receiver)
    (cgroups / A.lstrip("/") / "cpu.stat").write_text("")
    assert containers(receiver) == {}
    usage(cgroups, A, 4_000_000)
    advance(receiver)
    again = containers(receiver)
    assert again is not None
    assert (again[ID_A].usage_s, again[ID_A].since_s) == (4.0, first[ID_A].since_s)
    fresh = make_receiver(proc, receiver.clock, cgroup_root=str(cgroups))
    advance(fresh)
    restarted = containers(fresh)
    assert restarted is not None
    assert restarted[ID_A].since_s == restarted[ID_A].time.monotonic_s


def test_a_cgroup_made_again_while_its_cpu_stat_was_unreadable_goes_on_from_its_last_reading(tmp_path: Path) -> None:
    # Found by tests/e2e/test_cpu_unseen_faults.py's fault property: a scan without a reading forgot the file's
    # last one, and the cgroup made again meanwhile read lower in a record that said it went on (since_s kept).
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "app", utime=100, cgroup=f"0::{A}\n")
    usage(cgroups, A, 7_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    first = containers(receiver)
    assert first is not None
    for _ in range(2):  # unreadable for two scans, then made again (usage from 0)
        advance(receiver)
        (cgroups / A.lstrip("/") / "cpu.stat").write_text("")
        assert containers(receiver) == {}
    shutil.rmtree(cgroups / A.lstrip("/"))
    usage(cgroups, A, 500_000)
    advance(receiver)
    got = containers(receiver)
    assert got is not None
    assert (got[ID_A].usage_s, got[ID_A].since_s) == (7.5, first[ID_A].since_s)
