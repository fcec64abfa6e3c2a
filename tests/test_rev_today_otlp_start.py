"""process.cpu.time's start across a restart, with delta temporality: procfs reads a process's start as
``now − /proc/uptime + its start ticks``, which moves from read to read (10 ms) and, over days, by whatever NTP
corrected the wall clock since boot (the boot time so derived drifts; CLOCK_BOOTTIME is not corrected). The
exporter takes it down to the whole second once and keeps it while the process is listed, but not across a
restart: a process whose start reads 590.995 before the stop and 591.004 after it got another start, so another
series key, and its first delta after the restart was its whole CPU time again (a backend adding deltas counted
it twice)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.context import make_context
from wattpipe.exporters.otlp import OtlpConfig, OtlpExporter
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import HostProcess
from wattpipe.pipeline.state import StateStore

KEY = "otlp"


def _exporter(tmp_path: Path, saved: dict[str, object] | None = None, temporality: str = "delta") -> OtlpExporter:
    clock = SteppedClock()
    state = StateStore(tmp_path / "state.json", clock, "n")
    if saved is not None:
        state.put(KEY, saved)
    config = OtlpConfig.model_validate({"endpoint": "http://127.0.0.1:9", "insecure": True, "temporality": temporality})
    exporter = OtlpExporter(config, make_context("otlp", "exporter", clock, state=state))
    exporter._restore()  # (start() without its sender)
    return exporter


def _cpu_time_delta(exporter: OtlpExporter, i: int, cpu_s: float, start_wall_s: float) -> tuple[float, int]:
    """The process.cpu.time point of a tick as its request's delta, committed as sent."""
    t = Timestamp(monotonic_s=1000.0 + 5 * i, wall_s=1_767_225_600.0 + 5 * i)
    host = HostProcess(time=t, pid=42, comm="x", cpu_time_s=cpu_s, start_time_ticks=7, start_wall_s=start_wall_s)
    snapshot = exporter.capture(Batch(time=t, interval_s=5.0, node="n").with_records([host]))
    ((point,),) = [points for family, points in snapshot.metrics if family.otel == "process.cpu.time"]
    assert exporter._delta is not None
    pending = exporter._delta.begin()
    delta = pending.of("process.cpu.time", point, "process.pid")
    pending.commit()
    return delta


def test_a_process_cpu_time_delta_after_a_restart_is_what_it_used_since_even_if_its_start_reads_a_second_on(
    tmp_path: Path,
) -> None:
    first = _exporter(tmp_path)
    assert _cpu_time_delta(first, 0, 100.0, 1_767_225_590.995)[0] == 100.0
    saved = json.loads(json.dumps(first.snapshot()))
    second = _exporter(tmp_path, saved)
    value, _ = _cpu_time_delta(second, 1, 103.0, 1_767_225_591.004)  # the same process, its start read again
    assert value == 3.0


def test_a_process_of_a_later_boot_with_the_same_pid_and_start_ticks_gets_its_own_start(tmp_path: Path) -> None:
    first = _exporter(tmp_path)
    _cpu_time_delta(first, 0, 100.0, 1_767_225_590.995)
    second = _exporter(tmp_path, json.loads(json.dumps(first.snapshot())))
    value, start_ns = _cpu_time_delta(second, 1000, 2.0, 1_767_225_590.995 + 3600.0)  # a boot an hour later
    assert (value, start_ns) == (2.0, 1_767_229_190 * 1_000_000_000)


def test_a_section_written_before_the_starts_were_kept_still_restores_the_deltas(tmp_path: Path) -> None:
    first = _exporter(tmp_path)
    _cpu_time_delta(first, 0, 100.0, 1_767_225_590.2)
    saved = json.loads(json.dumps(first.snapshot()))
    del saved["process_starts"]
    assert _cpu_time_delta(_exporter(tmp_path, saved), 1, 103.0, 1_767_225_590.21)[0] == 3.0


def test_a_tick_without_the_process_listing_does_not_move_a_process_cpu_time_start(tmp_path: Path) -> None:
    """A tick whose /proc listing failed (no host processes) forgot every start kept: read again a second on
    the tick after, the process's series had another start and its delta was its whole CPU time again."""
    exporter = _exporter(tmp_path)
    assert _cpu_time_delta(exporter, 0, 100.0, 1_767_225_590.995)[0] == 100.0
    t = Timestamp(monotonic_s=1005.0, wall_s=1_767_225_605.0)
    exporter.capture(Batch(time=t, interval_s=5.0, node="n"))  # procfs failed this tick
    assert _cpu_time_delta(exporter, 2, 103.0, 1_767_225_591.004)[0] == 3.0


def test_a_cumulative_process_cpu_time_series_keeps_its_start_across_a_restart(tmp_path: Path) -> None:
    """Cumulative too: under another start, a backend reads the series as a new one (a reset)."""
    starts = []
    saved: dict[str, object] | None = None
    for i, start_wall_s in enumerate((1_767_225_590.995, 1_767_225_591.004)):
        exporter = _exporter(tmp_path, saved, temporality="cumulative")
        t = Timestamp(monotonic_s=1000.0 + 5 * i, wall_s=1_767_225_600.0 + 5 * i)
        host = HostProcess(time=t, pid=42, comm="x", cpu_time_s=9.0, start_time_ticks=7, start_wall_s=start_wall_s)
        snapshot = exporter.capture(Batch(time=t, interval_s=5.0, node="n").with_records([host]))
        ((point,),) = [points for family, points in snapshot.metrics if family.otel == "process.cpu.time"]
        starts.append(point.start_ns)
        saved = json.loads(json.dumps(exporter.snapshot()))
    assert starts[0] == starts[1]
