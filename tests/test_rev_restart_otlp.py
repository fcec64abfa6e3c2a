"""A review of the ``otlp`` exporter across a wattpipe restart on its state file: the simulated CPU scenario's node
(tests/test_rev_restart_cpu.py's harness: real nvml, procfs and rapl receivers, the GPU chain and cpu_attribution)
sending to a real OTLP receiver on loopback (tests/helpers/otlp_receiver.py), stopped cleanly and started again.

A backend that adds up deltas must end with each series' total, counted once; a cumulative series restored
from the state file keeps its start time."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.otlp_receiver import DELTA, OtlpReceiver, ReceivedPoint, flatten
from tests.test_rev_restart_cpu import CONFIG, Node
from wattpipe import simulator
from wattpipe.exporters._otlp_delta import DeltaState
from wattpipe.exporters._otlp_snapshot import Point, SnapshotTaker
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import HostProcess

_DESCRIBING = {"wattpipe.state", "process.command", "process.executable.path", "k8s.pod.name", "k8s.namespace.name"}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def otlp_node(tmp_path: Path, receiver: OtlpReceiver, temporality: str) -> Node:
    exporter = (
        f'  otlp: {{endpoint: "{receiver.grpc_endpoint}", insecure: true, temporality: {temporality}, timeout: 2,'
        " shutdown_timeout: 5}\n"
    )
    config = CONFIG.replace("exporters:\n", "exporters:\n" + exporter, 1).replace(
        "exporters: [custom/rec]", "exporters: [custom/rec, otlp]"
    )
    return Node(tmp_path, config=config)


@pytest.fixture
def delta_node(tmp_path: Path, receiver: OtlpReceiver) -> Iterator[Node]:
    try:
        yield otlp_node(tmp_path, receiver, "delta")
    finally:
        simulator.uninstall()


@pytest.fixture
def cumulative_node(tmp_path: Path, receiver: OtlpReceiver) -> Iterator[Node]:
    try:
        yield otlp_node(tmp_path, receiver, "cumulative")
    finally:
        simulator.uninstall()


def series(p: ReceivedPoint) -> tuple[str, frozenset[tuple[str, object]]]:
    return p.name, frozenset((k, v) for k, v in p.attributes.items() if k not in _DESCRIBING)


def last_totals(runs: list[list[Batch]]) -> dict[str, float]:
    """Per OTLP energy metric, Σ over its series of the last total each had (J), from the pipeline's records."""
    last: dict[tuple[object, ...], int] = {}
    for run in runs:
        for b in run:
            for d in b.device_totals:
                last[("wattpipe.cpu.energy" if d.device_type == "cpu" else "hw.energy", d.device_id)] = d.energy_mj
            for r in b.totals:
                if r.scope == "process":
                    metric = (
                        "wattpipe.process.cpu.energy"
                        if r.device_id.startswith("cpu:")
                        else "wattpipe.process.gpu.energy"
                    )
                    last[(metric, r.key, r.device_id)] = r.energy_mj
            for h in b.host_processes:
                if h.cpu_time_s is not None:
                    last[("process.cpu.time", h.pid, h.start_time_ticks)] = round(h.cpu_time_s * 1000)
    out: dict[str, float] = collections.defaultdict(float)
    for key, mj in last.items():
        out[str(key[0])] += mj / 1000
    return dict(out)


def test_deltas_after_a_clean_restart_add_up_to_the_totals_once(delta_node: Node, receiver: OtlpReceiver) -> None:
    runs = [delta_node.run(8), delta_node.run(8)]
    points = [p for p in flatten(receiver.requests()) if p.kind == "sum"]
    assert points
    assert all(p.temporality == DELTA for p in points)
    added: dict[str, float] = collections.defaultdict(float)
    for p in points:
        added[p.name] += p.value
    expected = last_totals(runs)
    assert "process.cpu.time" in expected  # (CPU seconds, summed as J are: its mJ column holds ms)
    for metric, joules in expected.items():
        assert added[metric] == pytest.approx(joules, abs=1e-6), metric


def test_delta_points_tile_time_across_a_clean_restart(delta_node: Node, receiver: OtlpReceiver) -> None:
    """Each series' points follow one another: a point's start is the previous one's time (a point that starts
    before the last one sent ended overlaps it: a backend counts that interval twice)."""
    delta_node.run(6)
    delta_node.run(6)
    last: dict[object, ReceivedPoint] = {}
    overlaps = []
    for p in flatten(receiver.requests()):
        if p.kind != "sum":
            continue
        key = series(p)
        before = last.get(key)
        if before is not None and p.start_ns < before.time_ns:
            overlaps.append(f"{key}: starts at {p.start_ns}, the last point ended at {before.time_ns}")
        last[key] = p
    assert not overlaps, "\n".join(overlaps[:5])


def test_cumulative_series_keep_their_start_across_a_restart(cumulative_node: Node, receiver: OtlpReceiver) -> None:
    cumulative_node.run(6)
    cumulative_node.run(6)
    starts: dict[object, set[int]] = collections.defaultdict(set)
    for p in flatten(receiver.requests()):
        if p.kind == "sum":
            starts[series(p)].add(p.start_ns)
    moved = {key: s for key, s in starts.items() if len(s) > 1}
    assert not moved, sorted(moved.items(), key=str)[:5]


def test_a_process_cpu_time_series_keeps_one_start_while_its_start_reads_a_little_differently() -> None:
    """/proc/uptime moves the start procfs reads for a process by some 10 ms from tick to tick: the series'
    start stays the one it was first sent with (a new one is a reset to a backend)."""
    taker = SnapshotTaker(created_ns=1_767_225_000_000_000_000)
    starts = set()
    for i, jitter in enumerate((0.004, -0.006, 0.009, -0.001)):
        t = Timestamp(monotonic_s=1000.0 + 5 * i, wall_s=1_767_225_600.0 + 5 * i)
        host = HostProcess(
            time=t, pid=42, comm="x", cpu_time_s=1.0 + i, start_time_ticks=7, start_wall_s=1_767_225_590.0 + jitter
        )
        snapshot = taker.take(Batch(time=t, interval_s=5.0, node="n").with_records([host]))
        ((_, (point,)),) = [(f, p) for f, p in snapshot.metrics if f.otel == "process.cpu.time"]
        starts.add(point.start_ns)
    assert starts == {1_767_225_590_000_000_000}  # its first reading's (…590.004), whole seconds; not the exporter's


def test_what_was_sent_goes_through_the_state_file_and_a_bad_row_is_skipped() -> None:
    state = DeltaState()
    pending = state.begin()
    point = Point({"process.pid": 42, "hw.id": "GPU-a", "wattpipe.state": "running"}, 5000.0, 100, 200)
    assert pending.of("wattpipe.process.gpu.energy", point, "process.pid") == (5000.0, 100)
    pending.commit()
    rows = json.loads(json.dumps(state.dump(), allow_nan=False))
    again = DeltaState()
    assert again.load([*rows, ["too", "short"], None, ["m", "x", [], 1.0, 2]]) == 1
    later = Point({**point.attributes, "wattpipe.state": "terminated"}, 7500.0, 100, 300)
    assert again.begin().of("wattpipe.process.gpu.energy", later, "process.pid") == (2500.0, 200)
