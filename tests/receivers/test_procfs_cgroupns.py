"""procfs ``cgroup_root`` inside a container's cgroup namespace: ``/proc/<pid>/cgroup`` shows paths relative
to the namespace's root (``/../../kubepods.slice/…`` for a host process, ``/`` for one beside us), placed
under the host's mount at the cgroup that holds us."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest

from tests.receivers.test_procfs import make_receiver, poll, stat_line, write_process
from tests.receivers.test_procfs_cgroupcpu import mount, stat_reads, usage
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.receivers.procfs import _cgroupcpu
from wattpipe.receivers.procfs._cgroupcpu import CgroupUsage, namespace_root

OURS = "/kubepods.slice/pod1/ours"  # where our own namespace's root sits on the host


def holds(cgroups: Path, path: str, *pids: int) -> None:
    directory = cgroups / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))


def node(tmp_path: Path, *, found: bool = True) -> tuple[Path, Path]:
    """A container's view: the host's /proc and /sys at tmp_path (a procfs root ``proc``, ``auto`` finds
    ``sys/fs/cgroup``), we at our namespace's root; 10 a host process, 11 one beside us in our container."""
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "sys" / "fs" / "cgroup")
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/\n")
    holds(cgroups, "/", 1, 2)  # the host's root cgroup: kernel threads
    holds(cgroups, "/system.slice/cron.service", 300)
    holds(cgroups, OURS, *([os.getpid()] if found else []), 7)
    write_process(proc, 10, "host", utime=100, cgroup="0::/../../../system.slice/cron.service\n")
    write_process(proc, 11, "beside", utime=100, cgroup="0::/\n")
    usage(cgroups, "/system.slice/cron.service", 1_000_000)
    usage(cgroups, OURS, 5_000_000)
    return proc, cgroups


def test_the_namespaces_root_is_the_cgroup_that_holds_us(tmp_path: Path) -> None:
    pid = os.getpid()
    holds(tmp_path, "/", 1)
    holds(tmp_path, "/a/b", 9)
    holds(tmp_path, "/a/c/sub", pid)
    assert namespace_root(str(tmp_path), "/", pid) == "/a/c/sub"  # we sit at our namespace's root
    assert namespace_root(str(tmp_path), "/sub", pid) == "/a/c"  # one cgroup below it
    assert namespace_root(str(tmp_path), "/a/c/sub", pid) == "/"  # the host's namespace: our path is the host's
    assert namespace_root(str(tmp_path), "/other", pid) is None  # our path does not end where we are found
    assert namespace_root(str(tmp_path), "/../x", pid) is None  # we sit outside our own namespace
    assert namespace_root(str(tmp_path), "/", pid + 1) is None  # nowhere


def test_the_walk_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holds(tmp_path, "/a/b/c/d", os.getpid())
    assert namespace_root(str(tmp_path), "/", os.getpid()) == "/a/b/c/d"
    monkeypatch.setattr(_cgroupcpu, "MAX_DEPTH", 3)
    assert namespace_root(str(tmp_path), "/", os.getpid()) is None
    monkeypatch.setattr(_cgroupcpu, "MAX_DEPTH", 12)
    monkeypatch.setattr(_cgroupcpu, "MAX_DIRS", 4)
    assert namespace_root(str(tmp_path), "/", os.getpid()) is None


def test_paths_are_placed_under_the_namespaces_root(tmp_path: Path) -> None:
    proc, cgroups = node(tmp_path)
    tracker = CgroupUsage(str(cgroups), proc_root=str(proc))
    assert tracker.ready()
    relative = "/../../../system.slice/cron.service"
    assert tracker.moved([relative, "/", "/gone"]) == {relative, "/", "/gone"}  # first seen, or unreadable
    usage(cgroups, OURS, 6_000_000)  # our own container ran ("/" in our namespace: OURS on the host)
    assert tracker.moved([relative, "/", "/gone"]) == {"/", "/gone"}


def test_in_a_cgroup_namespace_idle_processes_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, cgroups = node(tmp_path)
    receiver = make_receiver(proc)  # cgroup_root auto: tmp_path/sys/fs/cgroup
    poll(receiver)  # the processes' cgroups become known
    first = poll(receiver)  # and their usage: the baseline
    read = stat_reads(monkeypatch)
    # Our container ran (11 with it); cron did not. 10's stat is changed too, which a kernel never does
    # without cron's usage moving: it shows that 10 is not read at all.
    (proc / "10" / "stat").write_text(stat_line(10, "host", utime=999))
    (proc / "11" / "stat").write_text(stat_line(11, "beside", utime=300))
    usage(cgroups, OURS, 7_000_000)
    clock = receiver.clock
    assert isinstance(clock, SteppedClock)
    clock.advance(5.0)
    second = poll(receiver)
    assert read == [11]
    assert dataclasses.replace(second[10], time=first[10].time) == first[10]
    assert second[11].cpu_time_s == 3.0


def test_where_no_cgroup_holds_us_every_process_is_read_with_one_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc, cgroups = node(tmp_path, found=False)
    receiver = make_receiver(proc)
    with caplog.at_level(logging.INFO, logger="wattpipe"):
        for utime in (200, 300, 400):
            # Nothing moves in the cgroup tree; but its paths cannot be placed: 10 and 11 are read every tick.
            records = poll(receiver)
            assert records[10].cpu_time_s == records[11].cpu_time_s == (utime - 100) / 100
            (proc / "10" / "stat").write_text(stat_line(10, "host", utime=utime))
            (proc / "11" / "stat").write_text(stat_line(11, "beside", utime=utime))
            assert "container_cpu" not in receiver.provides  # no path placed: no container's usage known (absent)
    lines = [r for r in caplog.records if "cgroup_root" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert str(cgroups) in lines[0].getMessage()
    assert "no cgroup there holds this process" in lines[0].getMessage()


def test_in_the_hosts_namespace_paths_are_the_hosts(tmp_path: Path) -> None:
    proc, cgroups = node(tmp_path)
    (proc / "self" / "cgroup").write_text(f"0::{OURS}\n")  # our path is the host's: no namespace
    tracker = CgroupUsage(str(cgroups), proc_root=str(proc))
    assert tracker.ready()
    paths = ["/system.slice/cron.service", "/../x"]  # a path above the mount's root cannot be placed
    assert tracker.moved(paths) == set(paths)
    assert tracker.moved(paths) == {"/../x"}
