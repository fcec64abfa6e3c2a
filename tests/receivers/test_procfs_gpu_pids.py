"""procfs with ``cpu_time`` off, after a receiver of ``gpu_processes``: only the GPU processes are read, /proc is
not listed; a GPU pid is read in the tick it first appears, again when it comes back; unknown is not empty."""

from __future__ import annotations

import asyncio
import logging
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.receivers.test_procfs import make_receiver, stat_line, write_process
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.records import GpuProcessSample, HostProcess, Record
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.receivers.procfs import ProcfsReceiver

GPU = frozenset({"gpu_processes"})


def listing(*pids: int) -> list[Record]:
    clock = SteppedClock()
    return [GpuProcessSample(time=clock.now(), device_id=f"GPU-{n % 2}", pid=pid) for n, pid in enumerate(pids)]


def after(
    receiver: ProcfsReceiver, records: Sequence[Record], unknown: frozenset[str] = frozenset()
) -> dict[int, HostProcess]:
    got = asyncio.run(receiver.collect_after(records, unknown))
    return {r.pid: r for r in got if isinstance(r, HostProcess)}


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    write_process(root, 300, "trainer", start=5_000, cgroup="0::/gpu.slice/a\n", exe="/usr/bin/python3")
    write_process(root, 812, "sshd", start=10)
    (root / "uptime").write_text("1000.00 0.00\n")
    return root


def test_it_reads_after_gpu_processes_only_with_cpu_time_off(proc: Path) -> None:
    assert make_receiver(proc, cpu_time=False).after_records == GPU
    assert make_receiver(proc, cpu_time=True).after_records == frozenset()
    auto = make_receiver(proc)
    auto.asked(frozenset())
    assert auto.after_records == GPU
    auto.asked(frozenset({"process_cpu_time"}))
    assert auto.after_records == frozenset()


def test_a_new_gpu_process_is_read_and_a_non_gpu_one_never(proc: Path, caplog: pytest.LogCaptureFixture) -> None:
    (proc / "812" / "stat").write_text("not a stat line\n")  # read, it would be a warning
    receiver = make_receiver(proc, cpu_time=False)
    first = after(receiver, listing(300, 300))  # on two GPUs: one record
    assert list(first) == [300]
    assert (first[300].comm, first[300].exe, first[300].start_time_ticks) == ("trainer", "/usr/bin/python3", 5_000)
    assert first[300].cpu_time_s is None
    assert receiver.describe()["processes"] == 1
    assert "812" not in caplog.text
    assert receiver.provides == {"host_processes"}  # no /proc/stat nor cpuinfo in this tree: absent


def test_a_kept_gpu_pid_is_not_read_again(proc: Path) -> None:
    receiver = make_receiver(proc, cpu_time=False)
    first = after(receiver, listing(300))[300]
    (proc / "300" / "cgroup").write_text("0::/elsewhere\n")
    os.chmod(proc / "300" / "stat", 0)  # read, it would fail
    try:
        assert after(receiver, listing(300))[300] is first  # the record as first read, handed on
    finally:
        os.chmod(proc / "300" / "stat", 0o644)


def test_a_pid_that_leaves_the_gpu_listing_and_comes_back_is_read_again(proc: Path) -> None:
    receiver = make_receiver(proc, cpu_time=False)
    assert after(receiver, listing(300))[300].start_time_ticks == 5_000
    assert after(receiver, listing()) == {}
    # The pid went to another process meanwhile: read afresh, identity and all.
    (proc / "300" / "exe").unlink()
    (proc / "300" / "cgroup").write_text("0::/system.slice/cron.service\n")
    (proc / "300" / "stat").write_text(stat_line(300, "other", start=9_000))
    again = after(receiver, listing(300))[300]
    assert (again.comm, again.exe, again.start_time_ticks) == ("other", None, 9_000)


def test_an_unknown_gpu_listing_hands_on_the_last_records_not_none(proc: Path) -> None:
    receiver = make_receiver(proc, cpu_time=False)
    nothing = asyncio.run(receiver.collect_after([], GPU))  # no listing seen yet: absent, not empty
    assert not [r for r in nothing if isinstance(r, HostProcess)]
    assert "host_processes" not in receiver.provides
    first = after(receiver, listing(300))[300]
    assert "host_processes" in receiver.provides
    assert after(receiver, [], GPU) == {300: first}
    assert "host_processes" in receiver.provides
    assert after(receiver, listing()) == {}  # a listing with no process: an observation, empty


def test_a_gpu_process_not_readable_yet_is_tried_again(proc: Path) -> None:
    receiver = make_receiver(proc, cpu_time=False)
    assert after(receiver, listing(400)) == {}  # not in /proc (yet): left out, silently
    write_process(proc, 400, "late", start=7_000)
    assert after(receiver, listing(400))[400].comm == "late"


def test_a_missing_root_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    receiver = make_receiver(tmp_path / "nowhere", cpu_time=False)
    assert after(receiver, listing(300)) == {}
    assert "is the host's /proc mounted there?" in caplog.text


PIPELINE = """
receivers:
  custom/gpu: {class: "tests.pipeline.test_after_records:Listing", pids: PIDS}
  procfs: {root: "PROC"}
exporters:
  custom/rec: {class: "tests.helpers.components:Recorder"}
service:
  pipelines:
    metrics: {interval: 5s, receivers: [RECEIVERS], exporters: [custom/rec]}
    OTHER
"""


def run(proc: Path, receivers: str, other: str = "") -> list[list[int]]:
    text = PIPELINE.replace("PROC", str(proc)).replace("RECEIVERS", receivers).replace("PIDS", "[300]")
    text = text.replace("OTHER", other)
    registry = Registry.from_entry_points()
    clock = SteppedClock()
    graph = build(load_config_text(textwrap.dedent(text), "t.yaml", registry, {}), registry, clock, Telemetry(clock))
    asyncio.run(Service(graph).run(max_ticks=2))
    batches = graph.exporters["custom/rec"].batches  # type: ignore[attr-defined]
    return [[h.pid for h in b.host_processes] for b in batches]


def test_in_a_pipeline_the_first_tick_of_a_gpu_process_has_its_host_process(proc: Path) -> None:
    assert run(proc, "procfs, custom/gpu") == [[300], [300]]


def test_with_no_gpu_receiver_in_the_group_every_process_is_listed(proc: Path) -> None:
    # custom/gpu in another pipeline (another tick group): procfs lists /proc as without it.
    other = "metrics/other: {interval: 5s, receivers: [custom/gpu], exporters: [custom/rec]}"
    assert [pids for pids in run(proc, "procfs", other) if pids] == [[300, 812], [300, 812]]
