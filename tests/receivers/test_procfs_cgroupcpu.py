"""procfs with ``cgroup_root``: a process whose cgroup ran nothing since the last tick is not read again.

Its cgroup namespace side (paths relative to a container's namespace) is in test_procfs_cgroupns.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
from pathlib import Path

import pytest

from tests.receivers.test_procfs import cpu_s, make_receiver, poll, stat_line, write_process
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import HostProcess
from wattpipe.receivers.procfs._cgroupcpu import CgroupUsage, mount_for, unified_path
from wattpipe.receivers.procfs._proc import FULL_READ_EVERY
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.scale import scale_scenario


def mount(cgroups: Path) -> Path:
    """Mark ``cgroups`` a cgroup v2 mount, as the kernel's root has ``cgroup.controllers``."""
    cgroups.mkdir(parents=True, exist_ok=True)
    (cgroups / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return cgroups


def stat_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every /proc/<pid>/stat read from now on, by the pid it starts with (a cgroup's cpu.stat, kept open and
    read the same way, is not one)."""
    read: list[int] = []
    real = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        data = real(fd, size, offset)
        if not data.startswith(b"usage_usec"):
            read.append(int(data.split(b" ", 1)[0]))
        return data

    monkeypatch.setattr(os, "pread", counting)
    return read


def usage(cgroups: Path, path: str, usec: int) -> None:
    directory = cgroups / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n")


def test_the_unified_path_of_a_processs_cgroup() -> None:
    assert unified_path("0::/system.slice/cron.service\n") == "/system.slice/cron.service"
    assert unified_path("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n") is None  # cgroup v1 only
    # A cgroup namespace's view: kept as it is, placed under the mount by CgroupUsage (test_procfs_cgroupns.py).
    assert unified_path("0::/../../kubepods.slice\n") == "/../../kubepods.slice"


def test_auto_is_the_cgroup_mount_beside_the_procfs_root() -> None:
    assert mount_for("auto", "/proc") == "/sys/fs/cgroup"
    assert mount_for("auto", "/host/proc/") == "/host/sys/fs/cgroup"
    assert mount_for("auto", "/tmp/x/proc") == "/tmp/x/sys/fs/cgroup"
    assert mount_for("/somewhere/else", "/host/proc") == "/somewhere/else"  # said outright: as it is


def test_usage_that_moved_new_or_unreadable_counts_as_moved(tmp_path: Path) -> None:
    usage(tmp_path, "/a", 100)
    usage(tmp_path, "/b", 200)
    tracker = CgroupUsage(str(tmp_path))
    assert tracker.moved(["/a", "/b", "/gone"]) == {"/a", "/b", "/gone"}  # first seen, or unreadable
    usage(tmp_path, "/b", 250)
    assert tracker.moved(["/a", "/b", "/gone"]) == {"/b", "/gone"}


def test_a_process_in_an_idle_cgroup_keeps_its_record_and_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    write_process(proc, 10, "idle", utime=100, cgroup="0::/a\n")
    write_process(proc, 12, "busy", utime=100, cgroup="0::/b\n")
    usage(mount(cgroups), "/a", 1_000_000)
    usage(cgroups, "/b", 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    poll(receiver)  # the processes' cgroups become known
    first = poll(receiver)  # and their usage: the baseline the next tick compares with
    read = stat_reads(monkeypatch)
    # /b ran (its usage moved) and so did 12; /a did not. 10's stat is changed too, which a kernel never
    # does without /a's usage moving: it shows that 10 is not read at all.
    (proc / "12" / "stat").write_text(stat_line(12, "busy", utime=300))
    (proc / "10" / "stat").write_text(stat_line(10, "idle", utime=999))
    usage(cgroups, "/b", 3_000_000)
    clock = receiver.clock
    assert isinstance(clock, SteppedClock)
    clock.advance(5.0)
    second = poll(receiver)
    assert read == [12]
    # 10's record is the very one read before, its time that read's: its CPU time is known unchanged now, and
    # an exporter that stamps points sends it at the tick's time (test_otlp_cpu_node.py: a kept record).
    assert second[10] is first[10]
    assert second[12].cpu_time_s == 3.0
    write_process(proc, 11, "new", utime=5, cgroup="0::/a\n")  # new in an idle cgroup: read, as any new one
    read.clear()
    clock.advance(5.0)
    third = poll(receiver)
    assert third[11].cpu_time_s == 0.05
    assert read == [11]  # /b has not moved since the last tick either: 12 keeps its record
    assert third[12] is second[12]


def test_the_same_processes_as_the_last_scan_are_handed_on_in_pid_order_and_one_that_ended_is_left_out(
    tmp_path: Path,
) -> None:
    # The common tick (procfs lists the very pids of the last scan): the records are the last scan's, copied,
    # with those of cgroups that ran read again in place; one that ended since is taken out, its file let go.
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    for pid, cgroup in ((10, "/a"), (12, "/b"), (14, "/b"), (16, "/a")):
        write_process(proc, pid, f"p{pid}", utime=100, cgroup=f"0::{cgroup}\n")
    usage(mount(cgroups), "/a", 1_000_000)
    usage(cgroups, "/b", 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    poll(receiver)
    first = poll(receiver)
    (proc / "12" / "stat").write_text("")  # ended: how the kernel answers an ended task's stat
    (proc / "14" / "stat").write_text(stat_line(14, "p14", utime=400))
    usage(cgroups, "/b", 5_000_000)
    records = asyncio.run(receiver.collect())
    processes = [r for r in records if isinstance(r, HostProcess)]
    assert [r.pid for r in processes] == [10, 14, 16]
    assert processes[0] is first[10]
    assert processes[2] is first[16]
    assert processes[1].cpu_time_s == 4.0
    assert 12 not in receiver.table.stat_files.fds
    assert poll(receiver).keys() == {10, 14, 16}  # and so on (its directory still listed: read, found ended)


def test_a_process_that_started_as_another_ended_is_read_in_the_scan_it_is_first_listed(tmp_path: Path) -> None:
    # The shortcut above hands on the last scan's records when the listing is the last one's. It took "as many
    # pids as last time" for that: one process ended and another started between two scans (a shell's commands,
    # a build's compilers) and the new one was left out of the scan that first listed it, its first tick's CPU
    # time lost (listed the scan after, it started before the last listing: none of its time counts).
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "make", utime=100, cgroup="0::/a\n")
    write_process(proc, 11, "cc1", utime=100, cgroup="0::/a\n")
    usage(cgroups, "/a", 2_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    poll(receiver)
    assert poll(receiver).keys() == {10, 11}
    (proc / "11" / "stat").write_text("")  # cc1 ended
    for name in os.listdir(proc / "11"):
        os.remove(proc / "11" / name)
    os.rmdir(proc / "11")
    write_process(proc, 12, "as", utime=50, cgroup="0::/a\n")  # and as started
    usage(cgroups, "/a", 2_500_000)
    listed = poll(receiver)
    assert listed.keys() == {10, 12}
    assert cpu_s(listed[12]) == 0.5


def test_without_cpu_stat_every_process_is_read(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    directory = write_process(proc, 10, "p", utime=100, cgroup="0::/a\n")
    receiver = make_receiver(proc, cgroup_root=str(mount(tmp_path / "cgroup")))  # a mount with no /a
    assert poll(receiver)[10].cpu_time_s == 1.0
    (directory / "stat").write_text(stat_line(10, "p", utime=200))
    assert poll(receiver)[10].cpu_time_s == 2.0


def test_a_path_said_outright_that_is_no_cgroup_v2_mount_is_a_warning_then_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc, cgroups = tmp_path / "proc", tmp_path / "v1"
    directory = write_process(proc, 10, "p", utime=100, cgroup="0::/a\n")
    usage(cgroups, "/a", 1_000_000)  # a cpu.stat that never moves, but no cgroup.controllers: not cgroup v2
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    with caplog.at_level(logging.DEBUG, logger="wattpipe"):
        for utime in (200, 300, 400):
            assert poll(receiver)[10].cpu_time_s == (utime - 100) / 100
            (directory / "stat").write_text(stat_line(10, "p", utime=utime))
    lines = [r for r in caplog.records if "cgroup_root" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert str(cgroups) in lines[0].getMessage()
    assert "not a cgroup v2 mount" in lines[0].getMessage()


def _scan_simulated(
    tmp_path: Path, cgroups: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, list[dict[int, HostProcess]]], dict[str, int]]:
    """Ten ticks of a node of mostly idle services, read by procfs with cgroup_root auto (the default) and
    with "" (every process read), interleaved on one tree: the records of each, and how many stat reads each made."""
    scenario = scale_scenario(mig_gpus=0, timesliced_gpus=1, processes_per_gpu=4, host_processes=60, busy_services=5)
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(scenario, clock), tmp_path, cgroups=cgroups)
    receivers = {"auto": make_receiver(writer.proc, clock), "off": make_receiver(writer.proc, clock, cgroup_root="")}
    reads = dict.fromkeys(receivers, 0)
    real, mode = os.pread, ["auto"]

    def counting(fd: int, size: int, offset: int) -> bytes:
        data = real(fd, size, offset)
        reads[mode[0]] += not data.startswith(b"usage_usec")  # stat reads, not the cgroups' cpu.stat
        return data

    monkeypatch.setattr(os, "pread", counting)
    out: dict[str, list[dict[int, HostProcess]]] = {name: [] for name in receivers}
    for tick in range(10):
        clock.advance(700.0 if tick == 0 else 5.0)
        writer.refresh()
        for name, receiver in receivers.items():
            mode[0] = name
            out[name].append(poll(receiver))
    return out, reads


def _timeless(scans: list[dict[int, HostProcess]]) -> list[dict[int, HostProcess]]:
    epoch = Timestamp(monotonic_s=0.0, wall_s=0.0)
    return [{pid: dataclasses.replace(r, time=epoch) for pid, r in scan.items()} for scan in scans]


def test_auto_finds_the_simulated_cgroup_mount_and_keeps_the_idle_ones_numbers_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="wattpipe"):
        records, reads = _scan_simulated(tmp_path, True, monkeypatch)
    # Every record alike but for the time of a kept one, which is its earlier read's (its values hold now).
    assert _timeless(records["auto"]) == _timeless(records["off"])
    kept = [
        (r.time.wall_s, records["off"][tick][pid].time.wall_s)
        for tick, scan in enumerate(records["auto"])
        for pid, r in scan.items()
    ]
    assert all(time <= now for time, now in kept)
    assert reads["auto"] < reads["off"] / 2  # 45 of 64 processes in services that sleep throughout
    assert [r for r in caplog.records if "cgroup_root" in r.getMessage()] == []


def test_auto_on_a_simulated_tree_whose_processes_include_our_own_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The simulator's ``self`` names the reader's own pid, which may be one of its simulated processes' (the
    scale scenario's pids are 10,000 to 12,511: this VM hands out pids around 12,000, cpu_tick.py's among
    them). Its ``self/cgroup`` is then that process's, which no cgroup of the tree lists: the tree must still
    be taken as the host's, not as a cgroup namespace whose root cannot be found (every process read every
    tick, and an info line in a normal run)."""
    monkeypatch.setattr(os, "getpid", lambda: 10_005)  # a simulated process's pid (svc in scale_scenario)
    with caplog.at_level(logging.INFO, logger="wattpipe"):
        records, reads = _scan_simulated(tmp_path, True, monkeypatch)
    assert _timeless(records["auto"]) == _timeless(records["off"])
    assert reads["auto"] < reads["off"] / 2
    assert [r.getMessage() for r in caplog.records if "cgroup_root" in r.getMessage()] == []


def test_auto_without_a_cgroup_v2_mount_is_off_with_one_info_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="wattpipe"):
        records, reads = _scan_simulated(tmp_path, False, monkeypatch)  # the simulator writes no cgroup tree
    assert records["auto"] == records["off"]
    assert reads["auto"] == reads["off"]  # every process read every tick, as without it
    lines = [r for r in caplog.records if "cgroup_root" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    message = lines[0].getMessage()
    assert str(tmp_path / "sys" / "fs" / "cgroup") in message
    assert "cgroup v1 or not mounted" in message


def test_a_pipeline_that_wants_no_cpu_time_never_looks_for_the_mount(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = tmp_path / "proc"
    write_process(proc, 10, "p", utime=100)
    (proc / "self").symlink_to("10")  # a procfs: auto would say why it found no mount
    receiver = make_receiver(proc)  # cpu_time auto: on until the graph says what its pipelines want
    receiver.asked(frozenset())  # a GPU-only pipeline
    with caplog.at_level(logging.DEBUG, logger="wattpipe"):
        poll(receiver)
        poll(receiver)
    assert [r for r in caplog.records if "cgroup_root" in r.getMessage()] == []
    receiver.asked(frozenset({"process_cpu_time"}))
    with caplog.at_level(logging.DEBUG, logger="wattpipe"):
        poll(receiver)
        poll(receiver)
    assert len([r for r in caplog.records if "cgroup_root" in r.getMessage()]) == 1


def test_auto_takes_the_unified_hierarchy_of_a_hybrid_layout(tmp_path: Path) -> None:
    """systemd's hybrid layout (cgroup v1 controllers under /sys/fs/cgroup, the v2 hierarchy at
    /sys/fs/cgroup/unified): ``0::`` paths are the unified hierarchy's, and its cgroups have cpu.stat."""
    (tmp_path / "sys" / "fs" / "cgroup" / "cpu").mkdir(parents=True)  # a v1 controller's mount point
    unified = mount(tmp_path / "sys" / "fs" / "cgroup" / "unified")
    tracker = CgroupUsage.of("auto", str(tmp_path / "proc"))
    assert tracker is not None
    assert tracker.ready()
    assert tracker.root == str(unified)
    usage(unified, "/a", 1_000)
    assert tracker.moved({"/a"}) == {"/a"}  # the baseline
    assert tracker.moved({"/a"}) == set()


def test_this_machines_own_proc_and_cgroups(caplog: pytest.LogCaptureFixture) -> None:
    """procfs with CPU time on this machine's /proc and cgroup_root auto: where a cgroup v2 hierarchy is
    mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified in the hybrid layout) it is used, silently, and every
    process keeps a CPU time across scans; where none is, the one info line says which path and why."""
    receiver = make_receiver(Path("/proc"), SteppedClock())
    receiver.table.clock_ticks_per_s = os.sysconf("SC_CLK_TCK")
    with caplog.at_level(logging.INFO, logger="wattpipe"):
        scans = [poll(receiver) for _ in range(3)]
    receiver.table.close()
    assert all(p.cpu_time_s is not None for p in scans[-1].values())
    assert os.getpid() in scans[-1]
    lines = [r.getMessage() for r in caplog.records if "cgroup_root" in r.getMessage()]
    v2 = [p for p in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified") if os.path.isfile(f"{p}/cgroup.controllers")]
    if v2:
        assert lines == []
        assert receiver.table._usage is not None
        assert receiver.table._usage.root == v2[0]
    else:
        assert len(lines) == 1
        assert "/sys/fs/cgroup is not a cgroup v2 mount" in lines[0]


def test_cpu_stat_files_are_kept_open_and_let_go(tmp_path: Path) -> None:
    """Each cgroup's cpu.stat is opened once and read again in place; one removed counts as moved (its
    processes are read) and is let go, as is one no longer asked about; close() closes them all."""
    cgroups = mount(tmp_path / "cgroup")
    usage(cgroups, "/a", 1_000)
    usage(cgroups, "/b", 2_000)
    tracker = CgroupUsage(str(cgroups), proc_root=str(tmp_path / "proc"))  # a tree with no self: host paths
    assert tracker.ready()
    assert tracker.moved({"/a", "/b"}) == {"/a", "/b"}  # the baseline
    kept = dict(tracker._files.fds)
    assert sorted(kept) == [f"{cgroups}/a/cpu.stat", f"{cgroups}/b/cpu.stat"]
    usage(cgroups, "/a", 1_500)  # rewritten in place, as the kernel's file reads anew
    assert tracker.moved({"/a", "/b"}) == {"/a"}
    assert tracker._files.fds == kept
    (cgroups / "b" / "cpu.stat").unlink()  # the cgroup is gone
    assert tracker.moved({"/a", "/b"}) == {"/b"}
    assert sorted(tracker._files.fds) == [f"{cgroups}/a/cpu.stat"]
    assert tracker.moved({"/a"}) == set()
    tracker.close()
    assert tracker._files.fds == {}
    with pytest.raises(OSError, match="Bad file descriptor"):  # closed (nothing opened since to take its number)
        os.fstat(kept[f"{cgroups}/a/cpu.stat"])


def test_kept_cpu_stat_files_stay_within_the_open_file_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The cpu.stat files kept open count against the same budget as the stat files (never more than half of
    RLIMIT_NOFILE's soft limit in all: 1024 is a container's default under Docker and containerd 2): 700
    processes each in its own cgroup are all read, every tick, with no file left unopened for want of one."""
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    for pid in range(100, 800):
        write_process(proc, pid, "p", utime=pid, cgroup=f"0::/c{pid}\n")
        usage(cgroups, f"/c{pid}", pid)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"a hard open-file limit of {hard}: no soft limit of 1024 to set")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        receiver = make_receiver(proc, cgroup_root=str(cgroups))
        with caplog.at_level(logging.WARNING, logger="wattpipe"):
            scans = [poll(receiver) for _ in range(3)]
        table = receiver.table
        assert table._usage is not None
        kept = len(table.stat_files.fds) + len(table._usage._files.fds)
        table.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [len(scan) for scan in scans] == [700, 700, 700]
    assert [r.getMessage() for r in caplog.records] == []
    assert kept <= (1024 - 256) // 2


def test_a_process_in_a_threaded_cgroup_is_watched_through_its_threaded_domain(tmp_path: Path) -> None:
    """cgroup v2's threaded mode: a process's threads may sit in different cgroups of one threaded subtree
    (KubeVirt moves a VM's emulator threads, its main thread among them, to a threaded ``housekeeping`` child
    and leaves its vCPU threads in the container's cgroup). ``/proc/<pid>/cgroup`` names its main thread's
    cgroup, which does not move while the vCPUs run: the process is watched through the subtree's root (the
    nearest ancestor that is not ``threaded``), whose usage counts every thread in it. (On this VM's kernel:
    main thread in a threaded /d/t1, a busy thread in /d/t2: over 1 s /d/t1 moved 0 µs, /d 999,857 µs, the
    process's stat 100 ticks.)"""
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    directory = write_process(proc, 10, "vm-main", utime=100, cgroup="0::/vm/housekeeping\n")
    usage(cgroups, "/vm", 5_000_000)
    usage(cgroups, "/vm/housekeeping", 1_000_000)
    (cgroups / "vm" / "cgroup.type").write_text("domain threaded\n")
    (cgroups / "vm" / "housekeeping" / "cgroup.type").write_text("threaded\n")
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    poll(receiver)
    poll(receiver)  # the baseline
    for utime, usec in ((300, 7_000_000), (500, 9_000_000)):  # the vCPU threads run; housekeeping does not
        (directory / "stat").write_text(stat_line(10, "vm-main", utime=utime, start=100))
        usage(cgroups, "/vm", usec)
        assert poll(receiver)[10].cpu_time_s == utime / 100
    assert poll(receiver)[10].cpu_time_s == 5.0  # nothing ran anywhere in the subtree: kept


def test_a_cpu_stat_file_two_threaded_cgroups_share_is_let_go_with_the_others(tmp_path: Path) -> None:
    """Two threaded cgroups read through their subtree's one cpu.stat: a file no longer asked about is still
    closed (the files kept are fewer than the paths asked about)."""
    cgroups = mount(tmp_path / "cgroup")
    for path in ("/vm", "/vm/a", "/vm/b", "/x"):
        usage(cgroups, path, 1_000)
    (cgroups / "vm" / "cgroup.type").write_text("domain threaded\n")
    for name in ("a", "b"):
        (cgroups / "vm" / name / "cgroup.type").write_text("threaded\n")
    tracker = CgroupUsage(str(cgroups), proc_root=str(tmp_path / "proc"))
    assert tracker.ready()
    tracker.moved({"/vm/a", "/vm/b", "/x"})
    assert sorted(tracker._files.fds) == [f"{cgroups}/vm/cpu.stat", f"{cgroups}/x/cpu.stat"]
    tracker.moved({"/vm/a", "/vm/b"})  # /x's processes are gone
    assert sorted(tracker._files.fds) == [f"{cgroups}/vm/cpu.stat"]
    tracker.close()


def test_a_process_that_moved_cgroups_is_caught_up_by_the_periodic_full_read(tmp_path: Path) -> None:
    """A process is watched through the cgroup it was in when first read. One moved since (a container's init
    process read before the runtime placed it) while its first cgroup idles would keep its first CPU time for
    good; every FULL_READ_EVERY-th scan reads every process, so its CPU time stands still for fewer ticks than
    that, and nothing of it is lost: the delta arrives whole."""
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "moved", utime=100, cgroup="0::/a\n")
    usage(cgroups, "/a", 1_000_000)
    usage(cgroups, "/b", 0)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    assert poll(receiver)[10].cpu_time_s == 1.0
    (proc / "10" / "cgroup").write_text("0::/b\n")  # moved: /a idles from now on, /b runs
    seen = []
    for tick in range(1, FULL_READ_EVERY + 1):
        (proc / "10" / "stat").write_text(stat_line(10, "moved", utime=100 + 100 * tick, start=100))
        usage(cgroups, "/b", 1_000_000 * tick)
        seen.append(poll(receiver)[10].cpu_time_s)
    assert seen[0] == 2.0  # the tick /a's baseline is taken: read
    assert set(seen[1 : FULL_READ_EVERY - 1]) == {2.0}  # kept: /a did not move
    assert seen[-1] == 1.0 + FULL_READ_EVERY  # the full read: all of it, at once


def test_probe_says_whether_the_cgroup_shortcut_is_on_and_why_not(tmp_path: Path) -> None:
    """``wattpipe probe procfs`` shows, beside the records, where procfs reads and whether cgroup_root works:
    the mount it took, where our cgroup namespace sits in it, how many cgroups it watches; or the line that
    said why it is off."""
    scenario = scale_scenario(mig_gpus=0, timesliced_gpus=1, processes_per_gpu=4, host_processes=60, busy_services=5)
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(scenario, clock), tmp_path / "on", cgroups=True)
    receiver = make_receiver(writer.proc, clock)
    clock.advance(700.0)  # every process started
    for _ in range(2):
        clock.advance(5.0)
        writer.refresh()
        poll(receiver)
    assert receiver.describe() == {
        "root": str(writer.proc),
        "cpu_time": True,
        "processes": 64,
        "cgroup_root": {"mount": str(tmp_path / "on" / "sys" / "fs" / "cgroup"), "namespace_root": "/", "cgroups": 51},
    }
    bare = ProcfsWriter(simulator.build(scenario, clock), tmp_path / "off")  # no cgroup tree
    bare.refresh()
    receiver = make_receiver(bare.proc, clock)
    poll(receiver)
    off = receiver.describe()["cgroup_root"]
    assert set(off) == {"off"}
    assert "is not a cgroup v2 mount" in off["off"]
    assert make_receiver(bare.proc, clock, cgroup_root="").describe()["cgroup_root"] == {"off": 'cgroup_root: ""'}


def test_a_process_that_moved_cgroups_is_described_by_its_new_one_after_the_full_read(tmp_path: Path) -> None:
    """The full read finds a process whose CPU time grew while the cgroup it was first read in did not move:
    it is elsewhere now (a runtime that placed it late, a move by hand). Its identity is read again, so its
    container is the one it runs in, and from then on it is watched through that cgroup (read when it moves)."""
    first, second = "a" * 64, "b" * 64
    path_a, path_b = f"/system.slice/cri-containerd-{first}.scope", f"/system.slice/cri-containerd-{second}.scope"
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "moved", utime=100, cgroup=f"0::{path_a}\n")
    usage(cgroups, path_a, 1_000_000)
    usage(cgroups, path_b, 0)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    assert poll(receiver)[10].container_id == first
    (proc / "10" / "cgroup").write_text(f"0::{path_b}\n")
    got = []
    for tick in range(1, FULL_READ_EVERY + 3):
        (proc / "10" / "stat").write_text(stat_line(10, "moved", utime=100 + 100 * tick, start=100))
        usage(cgroups, path_b, 1_000_000 * tick)
        record = poll(receiver)[10]
        got.append((record.container_id, record.cpu_time_s))
    assert got[FULL_READ_EVERY - 2] == (first, 2.0)  # (kept: its first cgroup idles)
    assert got[FULL_READ_EVERY - 1] == (second, 1.0 + FULL_READ_EVERY)  # the full read: moved, read again
    assert got[FULL_READ_EVERY:] == [(second, 2.0 + FULL_READ_EVERY), (second, 3.0 + FULL_READ_EVERY)]
