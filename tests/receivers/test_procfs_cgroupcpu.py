"""procfs with ``cgroup_root``: a process whose cgroup ran nothing since the last tick is not read again."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from tests.receivers.test_procfs import make_receiver, poll, stat_line, write_process
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.receivers.procfs._cgroupcpu import CgroupUsage, unified_path


def usage(cgroups: Path, path: str, usec: int) -> None:
    directory = cgroups / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n")


def test_the_unified_path_of_a_processs_cgroup() -> None:
    assert unified_path("0::/system.slice/cron.service\n") == "/system.slice/cron.service"
    assert unified_path("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n") is None  # cgroup v1 only
    assert unified_path("0::/../../kubepods.slice\n") is None  # a namespace's view, not the host's path


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
    usage(cgroups, "/a", 1_000_000)
    usage(cgroups, "/b", 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    poll(receiver)  # the processes' cgroups become known
    first = poll(receiver)  # and their usage: the baseline the next tick compares with
    read: list[int] = []
    real = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:  # every stat read, named by the pid it starts with
        data = real(fd, size, offset)
        read.append(int(data.split(b" ", 1)[0]))
        return data

    monkeypatch.setattr(os, "pread", counting)
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
    # 10's record is the last one's, stamped with this tick: its CPU time is known unchanged *now* (an OTLP
    # point keeps its record's time; an old one every tick would leave the series stale in the backend).
    assert second[10].time == receiver.clock.now() != first[10].time
    assert dataclasses.replace(second[10], time=first[10].time) == first[10]
    assert second[12].cpu_time_s == 3.0
    write_process(proc, 11, "new", utime=5, cgroup="0::/a\n")  # new in an idle cgroup: read, as any new one
    read.clear()
    clock.advance(5.0)
    third = poll(receiver)
    assert third[11].cpu_time_s == 0.05
    assert read == [11]  # /b has not moved since the last tick either: 12 keeps its record
    assert dataclasses.replace(third[12], time=second[12].time) == second[12]


def test_without_cpu_stat_every_process_is_read(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    directory = write_process(proc, 10, "p", utime=100, cgroup="0::/a\n")
    receiver = make_receiver(proc, cgroup_root=str(tmp_path / "no-cgroupfs"))
    assert poll(receiver)[10].cpu_time_s == 1.0
    (directory / "stat").write_text(stat_line(10, "p", utime=200))
    assert poll(receiver)[10].cpu_time_s == 2.0
