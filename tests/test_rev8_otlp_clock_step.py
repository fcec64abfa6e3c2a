"""rev8 review: OTLP points of the CPU series after the wall clock stepped back (an NTP step on a node that booted
with its clock ahead, the RTC kept in local time east of UTC; a VM's clock corrected after a resume).

A series' start is a wall time kept since it began (``Totals.start`` / ``DeviceTotals.start``); a point's time is
the tick's wall time. Stepped back, the ticks' times fell below the starts of the series begun within the step,
and the exporter took each such start down to the point's time: a start that moved every tick. Under ``delta`` a
series is named by its start, so every tick's point was a new series whose delta was its whole total (a zone at
100 J a tick sent 400, 500, 600, 700 J for four ticks after a 60 s step: 2,200 J for 400 J, and so on until the
clock passed the start again); under ``cumulative`` a backend saw the series start over every tick. And points
went back in time, which backends refuse as out of order.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.processors.test_cpu_attribution import Node, processor
from tests.test_rev_today_otlp_start import _exporter
from wattpipe.exporters.otlp import OtlpExporter
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import HostProcess
from wattpipe.processors.cpu_attribution import CpuAttributionProcessor

Sent = tuple[str, float, float, float]
SERIES = ("wattpipe.cpu.energy", "wattpipe.process.cpu.energy")


def _node() -> tuple[Node, CpuAttributionProcessor]:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(100, comm="worker")
    proc = processor()
    proc.process(node.batch())
    node.clock.advance(5.0)
    return node, proc


def _tick(node: Node, proc: CpuAttributionProcessor, exporter: OtlpExporter, step_back_s: float = 0.0) -> list[Sent]:
    """One tick of 100 J (50 J to the process) through the processor and the exporter, sent: each CPU energy
    point's (metric, value sent, start_s, time_s)."""
    node.half_busy("intel-rapl:0", 100_000)
    node.run(100, 5.0)
    node.clock._offset_s -= step_back_s  # the wall clock steps back; the monotonic one runs on
    for pid, host in node.procs.items():  # procfs reads a start as now − /proc/uptime + its start ticks: stepped too
        node.procs[pid] = replace(host, start_wall_s=(host.start_wall_s or 0.0) - step_back_s)
    snapshot = exporter.capture(proc.process(node.batch()))
    node.clock.advance(5.0)
    pending = exporter._delta.begin() if exporter._delta is not None else None
    sent = []
    for family, points in snapshot.metrics:
        if family.otel in SERIES:
            for p in points:
                value, start_ns = pending.of(family.otel, p, "process.pid") if pending else (p.raw, p.start_ns)
                sent.append((family.otel, value / 1000.0, start_ns / 1e9, p.time_ns / 1e9))
    if pending is not None:
        pending.commit()
    return sent


def test_delta_points_after_a_step_back_are_each_ticks_energy_and_their_times_do_not_go_back(tmp_path: Path) -> None:
    exporter = _exporter(tmp_path, temporality="delta")
    node, proc = _node()
    before = [_tick(node, proc, exporter) for _ in range(3)]
    after = [_tick(node, proc, exporter, 60.0)] + [_tick(node, proc, exporter) for _ in range(3)]
    for sent in before + after:
        assert sorted(v for _, v, _, _ in sent) == [50.0, 100.0]  # was 200/400 J, 250/500 J, ... after the step
        assert all(start <= time for _, _, start, time in sent)
    times = [sent[0][3] for sent in before + after]
    assert times == sorted(times)
    assert len(set(times)) == len(times)


def test_cumulative_series_keep_their_starts_through_a_step_back(tmp_path: Path) -> None:
    exporter = _exporter(tmp_path, temporality="cumulative")
    node, proc = _node()
    first = _tick(node, proc, exporter)
    starts = {metric: start for metric, _, start, _ in first}
    for _ in range(2):
        _tick(node, proc, exporter)
    for i in range(4):
        sent = _tick(node, proc, exporter, 60.0 if i == 0 else 0.0)
        assert {metric: start for metric, _, start, _ in sent} == starts  # was the point's time, a new one a tick
        assert all(start <= time for _, _, start, time in sent)


def test_after_a_restart_on_a_clock_stepped_back_the_restored_series_keep_their_starts(tmp_path: Path) -> None:
    exporter = _exporter(tmp_path, temporality="cumulative")
    node, proc = _node()
    starts = {metric: start for metric, _, start, _ in _tick(node, proc, exporter)}
    last_s = _tick(node, proc, exporter)[0][3]
    saved = json.loads(json.dumps(exporter.snapshot()))
    again = _exporter(tmp_path, saved, temporality="cumulative")  # the processor's totals and starts go on
    sent = _tick(node, proc, again, 120.0)  # stopped, and the clock stepped back meanwhile
    assert {metric: start for metric, _, start, _ in sent} == starts
    assert all(start <= time and time > last_s for _, _, start, time in sent)


@settings(max_examples=25, deadline=None)
@example(plan=[(0.0, False), (300.0, True), (0.0, False), (-30.0, True)])  # back across a restart, then forward
@given(
    st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.0, 30.0, 300.0, -30.0]), st.booleans()), min_size=1, max_size=12)
)
def test_deltas_sum_to_the_totals_through_any_steps_and_restarts(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[float, bool]]
) -> None:
    """Steps back (> 0) or forward (< 0) of the wall clock, and restarts of the exporter on its state file, in any
    order: the deltas a backend adds up are the totals, and each series' points go forward in time."""
    tmp_path = tmp_path_factory.mktemp("otlp")
    exporter = _exporter(tmp_path, temporality="delta")
    node, proc = _node()
    summed: dict[str, float] = {}
    last_time: dict[str, float] = {}
    for step_back_s, restart in plan:
        if restart:
            exporter = _exporter(tmp_path, json.loads(json.dumps(exporter.snapshot())), temporality="delta")
        for metric, value, start, time in _tick(node, proc, exporter, step_back_s):
            summed[metric] = summed.get(metric, 0.0) + value
            assert start <= time
            assert time > last_time.get(metric, 0.0)
            last_time[metric] = time
    ticks = len(plan)
    assert summed == {"wattpipe.cpu.energy": 100.0 * ticks, "wattpipe.process.cpu.energy": 50.0 * ticks}


def test_a_record_read_after_its_tick_began_does_not_take_the_next_ticks_points_back(tmp_path: Path) -> None:
    """procfs stamps its records with its own read, a little after the tick began: the tick after a step back
    goes on from the newest point sent, not from the tick's own time."""
    exporter = _exporter(tmp_path, temporality="cumulative")
    times = []
    for i in range(4):
        wall_s = 1_767_225_600.0 + 5 * i - (60.0 if i >= 2 else 0.0)  # stepped back 60 s before the third tick
        t = Timestamp(monotonic_s=1000.0 + 5 * i, wall_s=wall_s)
        read = Timestamp(monotonic_s=t.monotonic_s + 0.3, wall_s=t.wall_s + 0.3)  # the scan's own time
        host = HostProcess(time=read, pid=42, comm="x", cpu_time_s=10.0 + i, start_time_ticks=7, start_wall_s=wall_s)
        snapshot = exporter.capture(Batch(time=t, interval_s=5.0, node="n").with_records([host]))
        ((point,),) = [points for family, points in snapshot.metrics if family.otel == "process.cpu.time"]
        times.append(point.time_ns)
    assert times == sorted(times)
    assert len(set(times)) == len(times)
