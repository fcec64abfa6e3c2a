"""Stat files kept open between scans (cpu_time on): read afresh each time, never through a predecessor's file."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.receivers.test_procfs import Sim, make_receiver, poll, scenario_data, stat_line, write_process
from wattpipe.receivers.procfs import parse_stat
from wattpipe.receivers.procfs._proc import cpu_and_start
from wattpipe.receivers.procfs._statfiles import Gone, StatFiles, default_budget


def test_a_kept_file_reads_the_line_as_it_is_now(tmp_path: Path) -> None:
    directory = write_process(tmp_path, 10, "a", utime=100)
    receiver = make_receiver(tmp_path)
    assert poll(receiver)[10].cpu_time_s == 1.0
    assert len(receiver.table.stat_files) == 1
    (directory / "stat").write_text(stat_line(10, "a", utime=350))
    assert poll(receiver)[10].cpu_time_s == 3.5


def test_a_pid_handed_to_a_new_process_is_not_read_through_the_old_file(tmp_path: Path) -> None:
    write_process(tmp_path, 10, "old", start=100, utime=100)
    receiver = make_receiver(tmp_path)
    assert poll(receiver)[10].comm == "old"
    shutil.rmtree(tmp_path / "10")  # the process ended; its pid goes to another (as the simulator writes it)
    write_process(tmp_path, 10, "new", start=900, utime=5)
    again = poll(receiver)[10]
    assert (again.comm, again.start_time_ticks, again.cpu_time_s) == ("new", 900, 0.05)


def test_files_of_ended_processes_are_closed_and_the_budget_holds(tmp_path: Path) -> None:
    for pid in (10, 11, 12):
        write_process(tmp_path, pid, f"p{pid}", utime=pid)
    receiver = make_receiver(tmp_path)
    receiver.table.stat_files.budget = 2  # the third is read by path, every scan
    assert sorted(poll(receiver)) == [10, 11, 12]
    assert len(receiver.table.stat_files) == 2
    shutil.rmtree(tmp_path / "10")
    assert sorted(poll(receiver)) == [11, 12]
    assert len(receiver.table.stat_files) == 1  # 10's closed at the end of the scan that found it gone
    assert poll(receiver)[12].cpu_time_s == 0.12
    assert len(receiver.table.stat_files) == 2  # and 12's kept from the next one


def test_cpu_time_off_keeps_no_file_open(tmp_path: Path) -> None:
    write_process(tmp_path, 10, "a")
    receiver = make_receiver(tmp_path, cpu_time=False)
    poll(receiver)
    assert len(receiver.table.stat_files) == 0


def test_the_budget_leaves_most_open_files_to_the_rest() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = default_budget(1_000_000)
    assert budget <= max(0, (soft - 256) // 2) or soft == resource.RLIM_INFINITY
    assert default_budget(5) <= 5


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs a Linux /proc")
def test_on_the_real_proc_an_ended_process_is_gone_through_its_kept_file() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    files = StatFiles("/proc", budget=4)
    try:
        line = files.read(child.pid)
        assert line.startswith(f"{child.pid} (".encode())
        assert files.checks_links() is False  # a real procfs: an ended process answers ESRCH
        assert files.read(child.pid).split(b")")[0] == line.split(b")")[0]  # the same file, read again
    finally:
        child.kill()
        child.wait()
    with pytest.raises(Gone):
        files.read(child.pid)
    assert len(files) == 0


@settings(max_examples=200, deadline=None)
@given(
    comm=st.text(alphabet=st.sampled_from("ab )(x 1"), max_size=15),
    utime=st.integers(min_value=0, max_value=10**12),
    stime=st.integers(min_value=0, max_value=10**12),
    start=st.integers(min_value=0, max_value=10**12),
)
def test_the_per_tick_parse_agrees_with_parse_stat(comm: str, utime: int, stime: int, start: int) -> None:
    fields = ["7", f"({comm})", "S", *["0"] * 10, str(utime), str(stime), *["0"] * 6, str(start), "0", "0"]
    text = " ".join(fields) + "\n"
    full = parse_stat(text)
    assert cpu_and_start(text.encode()) == (full.utime_ticks + full.stime_ticks, full.start_time_ticks)


def test_the_per_tick_parse_refuses_what_parse_stat_refuses() -> None:
    for bad in (b"garbage", b"1 (x) S 1 2", b"1 x S " + b"0 " * 30):
        with pytest.raises(ValueError):  # noqa: PT011 - the message is parse_stat's, tested in test_procfs.py
            cpu_and_start(bad)


def test_a_stat_that_cannot_be_read_is_a_problem_named_by_path_and_errno(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_process(tmp_path, 10, "fine")
    broken = tmp_path / "11"
    broken.mkdir()
    (broken / "stat").mkdir()  # reading it fails with EISDIR: not "gone", a problem to report
    receiver = make_receiver(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert sorted(poll(receiver)) == [10]
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{tmp_path}/11 cannot be read (Is a directory); skipping it" in m for m in messages)


def test_shutdown_closes_the_kept_files_on_the_scanning_thread(tmp_path: Path) -> None:
    for pid in (10, 11):
        write_process(tmp_path, pid, f"p{pid}")
    receiver = make_receiver(tmp_path)
    poll(receiver)
    assert len(receiver.table.stat_files) == 2
    asyncio.run(receiver.shutdown())
    receiver._executor.shutdown(wait=True)  # the close was queued behind any scan still running
    assert len(receiver.table.stat_files) == 0


def test_the_simulators_proc_answers_a_kept_file_of_an_ended_process_as_the_kernel_does(tmp_path: Path) -> None:
    # As a procfs, it has a self link (so the receiver checks no link per read), and a process that ends
    # leaves its kept stat file empty: the receiver's ``Gone``, as the kernel's ESRCH or empty read.
    sim = Sim(tmp_path, scenario_data())
    assert sorted(sim.poll(advance_s=10.0)) == [812, 4242, 5100, 6000]
    files = sim.receiver.table.stat_files
    assert files.checks_links() is False
    kept = os.open(tmp_path / "proc" / "6000" / "stat", os.O_RDONLY)
    try:
        assert os.pread(kept, 4096, 0).startswith(b"6000 (worker)")
        assert sorted(sim.poll(advance_s=15.0)) == [812, 4242, 5100]  # worker ended at 20 s
        assert os.pread(kept, 4096, 0) == b""
    finally:
        os.close(kept)
    assert 6000 not in files.fds


def test_a_plain_tree_without_a_self_link_checks_links(tmp_path: Path) -> None:
    write_process(tmp_path, 10, "a")
    assert StatFiles(str(tmp_path), budget=4).checks_links() is True
