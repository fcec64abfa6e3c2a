"""Failure drill 4: the OTLP collector down for 5 minutes of node time, then back; and a slow collector.

One pipeline on a simulated node (nvml, podresources, procfs → idle → attribution → k8s → energy) exports
to ``prometheus`` and, at the test OTLP receiver, to ``otlp/grpc`` and ``otlp/http`` (cumulative) and
``otlp/delta`` (gRPC, delta temporality). The node runs on a stepped clock, one tick every 5 s; each run
is compared with a reference run of the same scenario on the same tick schedule with a healthy collector.

Every drill asserts that
- the pipeline keeps running: every tick happens, none waits on the collector, and the Prometheus text of
  every tick, outage included, is byte for byte the reference run's;
- the failure is counted (``wattpipe_exporter_failed_total`` per failed attempt, in records;
  ``wattpipe_exporter_dropped_total`` for every dropped batch's records, exactly) and logged once, not
  per attempt or per tick (the SDK's own per-attempt lines included);
- memory stays bounded: the queue never holds more than ``queue_size`` batches, every batch is accounted
  for (delivered + dropped + queued + in flight = exported), and traced memory does not grow with the ticks;
- no energy already measured is lost: the last cumulative totals equal the reference run's, every request
  delivered is the reference's request of the same tick, and the delta exporter's deltas add up to the
  reference's totals, dropped batches or not.

The exporter's retry timing is real time (network timing), the pipeline's is the stepped clock: small
retry intervals keep the drill to seconds, and the test waits on conditions (the receiver saw an attempt,
the backlog was delivered), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import inspect
import logging
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedPoint, flatten
from wattpipe import simulator
from wattpipe.exporters.otlp import _Snapshot
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.scenario import parse_scenario

NODE = "drill-node"
INTERVAL_S = 5.0
FAULT_AT = 12  # the first tick the collector is down (or slow): 60 s of node time in
FAULT_TICKS = 60  # 5 minutes of node time
TICKS = FAULT_AT + FAULT_TICKS + 12  # and a minute after it is back
SENDERS = {"grpc": "otlp/grpc", "http": "otlp/http", "delta": "otlp/delta"}
CUMULATIVE_SENDERS = ("grpc", "http")
SMALL_QUEUE = 5

SCENARIO: dict[str, Any] = {
    "node": {"name": NODE},
    "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700},
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 68, "max_w": 700},
    ],
    "pods": [
        {"name": "trainer-0", "namespace": "ml", "containers": [{"name": "main", "devices": [{"gpu": 0}]}]},
        {
            "name": "infer-0",
            "namespace": "serving",
            "containers": [{"name": "server", "devices": [{"resource": "nvidia.com/gpu.shared", "gpu": 1, "replica": 0}]}],
        },
    ],
    "processes": [
        # Load changes and a process exit fall inside the outage (60 s … 360 s), on purpose.
        {"pid": 4242, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "dynamic_w": 400,
         "util": [[0, 0.8], [100, 0.2], [250, 0.9]], "start_s": 8},
        {"pid": 4243, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "dynamic_w": 250,
         "util": [[0, 0.5], [150, 0.6]], "start_s": 10, "end_s": 200},
        {"pid": 5100, "comm": "tritonserver", "container": "serving/infer-0/server", "gpu": 1, "dynamic_w": 300,
         "util": [[0, 0.3], [120, 0.7]], "start_s": 8},
        {"pid": 7001, "comm": "nvidia-smi", "gpu": 1, "dynamic_w": 20, "util": [[0, 0.05]], "start_s": 30},
        {"pid": 812, "comm": "sshd", "cpu_cores": 0.05},
    ],
}  # fmt: skip

# api: off: pod names come from the kubelet's allocations in the tick itself, so two runs of the scenario
# are identical (the API watch runs on a thread of its own and could name a pod a tick earlier or later).
PIPELINE = """
receivers:
  nvml: {required: true}
  podresources: {endpoint: "@KUBELET@", extra_resources: [nvidia.com/gpu.shared]}
  procfs: {root: "@PROC@"}
processors:
  idle:
  attribution:
  k8s: {api: "off"}
  energy: {terminated_retention: 1h}
exporters:
  prometheus: {listen: "127.0.0.1:0"}
  otlp/grpc: {endpoint: "@GRPC@", insecure: true, headers: {x-otlp-sender: grpc}, @OPTIONS@}
  otlp/http: {endpoint: "@HTTP@", protocol: http/protobuf, headers: {x-otlp-sender: http}, @OPTIONS@}
  otlp/delta: {endpoint: "@GRPC@", insecure: true, temporality: delta, headers: {x-otlp-sender: delta}, @OPTIONS@}
service:
  node_name: "@NODE@"
  telemetry: {listen: ""}
  pipelines:
    metrics:
      interval: 5s
      receivers: [nvml, podresources, procfs]
      processors: [idle, attribution, k8s, energy]
      exporters: [prometheus, otlp/grpc, otlp/http, otlp/delta]
"""

# Real-time retry settings that keep a drill to seconds; a batch is never given up within one (120 s).
# `timeout` is per attempt: under the SDK's own first backoff (0.8 s or more), so that the SDK never retries
# inside an attempt (one attempt, one request: the exact counts below rely on it), yet far above a loopback
# request. A slow collector gets a long one instead, so that a held request is slow, not failed.
RETRY = "retry_initial_interval: 0.02, retry_max_interval: 0.1, retry_max_elapsed_time: 120, shutdown_timeout: 5"
OPTIONS = {"none": f"timeout: 0.75, {RETRY}", "down": f"timeout: 0.75, {RETRY}", "slow": f"timeout: 60, {RETRY}"}

Fault = Literal["none", "down", "slow"]


@dataclass
class Run:
    fault: Fault
    queue_size: int
    records: list[int] = field(default_factory=list)
    """Records in each tick's batch (what each exporter counts per batch)."""
    wall_ns: list[int] = field(default_factory=list)
    prometheus: list[bytes] = field(default_factory=list)
    """The digest of the prometheus exporter's text after each tick (digests: the texts themselves would be
    memory that grows with the ticks, which the drill measures)."""
    last_prometheus: bytes = b""
    tick_s: list[float] = field(default_factory=list)
    """Real seconds each tick took."""
    max_queued: dict[str, int] = field(default_factory=dict)
    """The longest queue seen after any tick, per sender."""
    at_fault_end: dict[str, Any] = field(default_factory=dict)
    """Counts taken after the last faulty tick, before the collector recovers."""
    delivered: dict[str, list[list[ReceivedPoint]]] = field(default_factory=dict)
    """Each request each sender delivered, as points, in the order they arrived."""
    dropped: dict[str, float] = field(default_factory=dict)
    failed: dict[str, float] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    logs: list[logging.LogRecord] = field(default_factory=list)
    ticks_run: int = 0
    ready: tuple[bool, str] = (False, "")
    batch_bytes: int = 0
    """Traced bytes of one batch's snapshot in an exporter's queue."""


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def counter(telemetry: Telemetry, name: str, component: str) -> float:
    value = telemetry.registry.get_sample_value(name, {"pipeline": "metrics", "component": component})
    return value or 0.0


def delivered_after(tick: int, fault: Fault, queue_size: int) -> int:
    """Batches each sender has delivered once ``tick``'s batch is through, outside the fault."""
    if fault == "none" or tick < FAULT_AT:
        return tick + 1
    # The batch in flight when the fault began, what the queue kept of the rest, then one per tick.
    backlog = 1 + min(FAULT_TICKS - 1, queue_size)
    return FAULT_AT + backlog + (tick - (FAULT_AT + FAULT_TICKS) + 1)


def simulate(fault: Fault, queue_size: int, tmp: Path) -> Run:
    """The scenario on a stepped clock, tick by tick, with ``fault`` from tick FAULT_AT for FAULT_TICKS ticks."""
    run = Run(fault, queue_size)
    clock = SteppedClock()
    keep = _Keep()
    root = logging.getLogger()
    level = root.level
    root.addHandler(keep)
    root.setLevel(logging.INFO)
    try:
        with OtlpReceiver() as receiver, simulator.install(parse_scenario(SCENARIO), clock) as node:
            kubelet = simulator.start_kubelet(node, socket_dir=tmp / "pod-resources")
            procfs = simulator.ProcfsWriter(node, tmp)
            procfs.refresh()  # /proc exists before the procfs receiver starts
            text = textwrap.dedent(PIPELINE)
            for key, value in {
                "@KUBELET@": kubelet.endpoint,
                "@PROC@": str(tmp / "proc"),
                "@GRPC@": receiver.grpc_endpoint,
                "@HTTP@": receiver.http_endpoint,
                "@NODE@": NODE,
                "@OPTIONS@": f"queue_size: {queue_size}, {OPTIONS[fault]}",
            }.items():
                text = text.replace(key, value)
            registry = Registry.from_entry_points()
            telemetry = Telemetry(clock)
            graph = build(load_config_text(text, f"drill-{fault}.yaml", registry, {}), registry, clock, telemetry)
            asyncio.run(_drive(run, graph, Service(graph, before_tick=procfs.refresh), clock, receiver))
            for sender, cid in SENDERS.items():
                run.delivered[sender] = [flatten([r]) for r in receiver.requests(sender=sender)]
                run.refused[sender] = receiver.refused(sender=sender)
                run.dropped[sender] = counter(telemetry, "wattpipe_exporter_dropped_total", cid)
                run.failed[sender] = counter(telemetry, "wattpipe_exporter_failed_total", cid)
    finally:
        root.removeHandler(keep)
        root.setLevel(level)
    run.logs = keep.records
    return run


async def _drive(run: Run, graph: Any, service: Service, clock: SteppedClock, receiver: OtlpReceiver) -> None:
    (runner,) = service.runners
    exporters = {sender: graph.exporters[cid] for sender, cid in SENDERS.items()}
    prometheus = graph.exporters["prometheus"]
    fault, queue_size = run.fault, run.queue_size
    fault_end = FAULT_AT + FAULT_TICKS
    # Traced from early in the fault; measured from once the queue has turned over (what it holds then was
    # allocated while tracing, like what it holds at the end) to the fault's last ticks. Each measure is the
    # least of three ticks': a retry in progress (down) holds one more request for a moment.
    trace_from = FAULT_AT + 1 if fault != "none" and queue_size == SMALL_QUEUE else None
    base_ticks = range(FAULT_AT + 1 + SMALL_QUEUE + 3, FAULT_AT + 1 + SMALL_QUEUE + 6)
    end_ticks = range(fault_end - 3, fault_end)
    traced: dict[int, int] = {}

    def wait_delivered(count: int) -> None:
        for sender in SENDERS:
            receiver.wait_for_requests(count, None, sender, 30.0)

    await service.start()
    try:
        for i in range(TICKS):
            if fault != "none" and i == FAULT_AT:
                if fault == "down":
                    receiver.down = True
                else:
                    receiver.delay_s = 600.0  # held until released: slower than the whole fault
            if fault != "none" and i == fault_end:
                run.at_fault_end = {
                    "exported": i,
                    "queued": {s: e.queued for s, e in exporters.items()},
                    "delivered": {s: receiver.count(sender=s) for s in SENDERS},
                    "dropped": {
                        s: counter(graph.telemetry, "wattpipe_exporter_dropped_total", c) for s, c in SENDERS.items()
                    },
                    "in_flight": receiver.in_flight,
                }
                gc.collect()
                run.at_fault_end["snapshots"] = sum(type(o) is _Snapshot for o in gc.get_objects())
                if trace_from is not None:
                    tracemalloc.stop()
                    run.at_fault_end["traced_end"] = min(traced[t] for t in end_ticks)
                    run.at_fault_end["traced_growth"] = run.at_fault_end["traced_end"] - min(
                        traced[t] for t in base_ticks
                    )
                receiver.down, receiver.delay_s = False, 0.0  # the collector is back
                await asyncio.to_thread(wait_delivered, delivered_after(i - 1, fault, queue_size))
            if i:
                clock.advance(INTERVAL_S)
            began = time.monotonic()
            batch = await runner.tick()
            run.tick_s.append(time.monotonic() - began)
            run.records.append(batch.count())
            run.wall_ns.append(batch.time.wall_ns)
            run.prometheus.append(hashlib.sha256(prometheus.body).digest())
            for sender, exporter in exporters.items():
                run.max_queued[sender] = max(run.max_queued.get(sender, 0), exporter.queued)
            if fault == "none" or not FAULT_AT <= i < fault_end:
                await asyncio.to_thread(wait_delivered, delivered_after(i, fault, queue_size))
            elif i == FAULT_AT:
                # Each sender has taken the fault's first batch and tried it: from here the queue fills
                # tick by tick, so which batches are dropped does not depend on thread timing.
                for sender in SENDERS:
                    await asyncio.to_thread(receiver.wait_for_attempts, FAULT_AT + 1, None, sender, 30.0)
            if i == trace_from:
                tracemalloc.start(TRACE_FRAMES)
            if trace_from is not None and (i in base_ticks or i in end_ticks):
                traced[i] = _exporter_bytes()
        run.ticks_run = runner.ticks
        run.last_prometheus = prometheus.body
        run.ready = graph.telemetry.ready()
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        await service.shutdown()
    # With the senders stopped, nothing else allocates under exporters/otlp.py: what one batch costs queued.
    tracemalloc.start(TRACE_FRAMES)
    try:
        before = _exporter_bytes()
        snapshot = exporters["grpc"].capture(runner.last_batch)
        run.batch_bytes = _exporter_bytes() - before
        del snapshot
    finally:
        tracemalloc.stop()


TRACE_FRAMES = 1  # an allocation belongs to the file of its innermost frame (deeper tracing is too slow here)


def _exporter_bytes() -> int:
    """Traced bytes allocated by the exporters/ modules and still alive: what the queues hold, the delta
    state, the request of an attempt in progress (since the OTLP exporter was split into parts, they live
    in several files of that folder). (The process as a whole also grows and shrinks for its own reasons,
    such as the table of interned strings doubling: not what is measured here.)"""
    gc.collect()
    mine = tracemalloc.Filter(True, str(Path(inspect.getfile(_Snapshot)).parent / "*"))
    return sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces([mine]).statistics("filename"))


# --- the runs -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Fault, int], Run]:
    """Each run of the module, made once, when a test first asks for it."""
    made: dict[tuple[Fault, int], Run] = {}

    def get(fault: Fault, queue_size: int) -> Run:
        if (fault, queue_size) not in made:
            made[fault, queue_size] = simulate(fault, queue_size, tmp_path_factory.mktemp(f"{fault}-{queue_size}"))
        return made[fault, queue_size]

    return get


@pytest.fixture
def reference(runs: Callable[[Fault, int], Run]) -> Run:
    """The same scenario and tick schedule with a healthy collector."""
    return runs("none", 100)


DRILLS: list[tuple[Fault, int]] = [("down", 100), ("down", SMALL_QUEUE), ("slow", SMALL_QUEUE)]


@pytest.fixture(params=DRILLS, ids=[f"{fault}-queue-{size}" for fault, size in DRILLS])
def drill(request: pytest.FixtureRequest, runs: Callable[[Fault, int], Run]) -> Run:
    """down-queue-100: the whole outage fits in the queue; down-queue-5 and slow-queue-5: the queue overflows."""
    fault, queue_size = request.param
    return runs(fault, queue_size)


def test_the_reference_run_delivers_every_tick(reference: Run) -> None:
    assert reference.ticks_run == TICKS
    for sender in SENDERS:
        assert [points[0].time_ns for points in reference.delivered[sender]] == reference.wall_ns
        assert (reference.dropped[sender], reference.failed[sender], reference.refused[sender]) == (0, 0, 0)
    assert [r for r in reference.logs if r.levelno >= logging.WARNING] == []


# --- the pipeline keeps running -------------------------------------------------------------------


def test_the_pipeline_keeps_running_and_prometheus_keeps_flowing(drill: Run, reference: Run) -> None:
    assert drill.ticks_run == TICKS
    assert drill.ready == (True, "ok")
    assert drill.wall_ns == reference.wall_ns  # the same schedule
    # The other exporter of the pipeline is unaffected: every tick's text, fault included, is the reference's.
    for i, (text, expected) in enumerate(zip(drill.prometheus, reference.prometheus, strict=True)):
        assert text == expected, f"tick {i}"
    during = drill.prometheus[FAULT_AT : FAULT_AT + FAULT_TICKS]
    assert len(set(during)) == FAULT_TICKS  # a new text every tick of the fault
    assert b"kepler_node_gpu_joules_total{" in drill.last_prometheus
    # export() never waits on the collector: a held request would hold a tick for up to `timeout` (60 s).
    assert max(drill.tick_s) < 5.0


# --- the failure is counted, exactly ------------------------------------------------------------


def dropped_ticks(run: Run) -> range:
    """The batches the queue dropped: all but the one in flight and the newest ``queue_size`` of the fault."""
    kept = min(FAULT_TICKS - 1, run.queue_size)
    return range(FAULT_AT + 1, FAULT_AT + FAULT_TICKS - kept)


def test_every_failed_attempt_and_every_dropped_record_is_counted(drill: Run) -> None:
    end = drill.at_fault_end
    expected_drops = sum(drill.records[i] for i in dropped_ticks(drill))
    assert (expected_drops > 0) == (drill.queue_size == SMALL_QUEUE)
    for sender in SENDERS:
        assert drill.dropped[sender] == expected_drops, sender
        assert end["dropped"][sender] == expected_drops, sender
        if drill.fault == "down":
            # Every failed attempt counts the records of the batch it carried: the fault's first, retried.
            assert drill.refused[sender] >= 1
            assert drill.failed[sender] == drill.refused[sender] * drill.records[FAULT_AT], sender
        else:
            assert (drill.failed[sender], drill.refused[sender]) == (0, 0)  # slow is not failing
        # Every batch exported so far is somewhere: delivered, dropped, queued, or the one in flight.
        dropped_batches = len(dropped_ticks(drill))
        assert end["delivered"][sender] + dropped_batches + end["queued"][sender] + 1 == end["exported"], sender
    if drill.fault == "slow":  # the fault's first batch of each sender is still being answered
        assert end["in_flight"] == len(SENDERS)


# --- ... and logged once --------------------------------------------------------------------------


def messages(run: Run, logger: str, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in run.logs if r.name == logger and r.levelno == level and text in r.getMessage()]


def test_the_failure_is_logged_once_not_per_attempt_or_tick(drill: Run) -> None:
    small = drill.queue_size == SMALL_QUEUE
    dropped_batches = len(dropped_ticks(drill))
    for sender, cid in SENDERS.items():
        logger = f"wattpipe.exporter.{cid}"
        failing = messages(drill, logger, logging.WARNING, "cannot send")
        recovered = messages(drill, logger, logging.INFO, "again, after")
        assert len(failing) == len(recovered) == (1 if drill.fault == "down" else 0), sender
        if drill.fault == "down":
            # Why, in the SDK's words (each gRPC exporter's own: the SDK's duplicate filter does not eat the second).
            assert ("Failed to export metrics" if sender == "http" else "StatusCode.UNAVAILABLE") in failing[0], sender
            assert f"after {drill.refused[sender]} failed attempts" in recovered[0]
        full = messages(drill, logger, logging.WARNING, "queue full")
        drained = messages(drill, logger, logging.INFO, "the queue has drained")
        assert len(full) == len(drained) == (1 if small else 0), sender
        if small:
            records = sum(drill.records[i] for i in dropped_ticks(drill))
            assert f"{dropped_batches} batches ({records} records) were dropped" in drained[0]
    # Nothing else above INFO: not the SDK's per-attempt lines, not one line per tick or per attempt.
    loud = [(r.name, r.getMessage()) for r in drill.logs if r.levelno >= logging.WARNING]
    expected = len(SENDERS) * ((drill.fault == "down") + small)
    assert len(loud) == expected, loud
    assert all(r.levelno < logging.ERROR for r in drill.logs)


# --- memory stays bounded ---------------------------------------------------------------------------


def test_the_queue_fills_up_to_its_size_and_no_further(drill: Run) -> None:
    held = min(drill.queue_size, FAULT_TICKS - 1)
    for sender in SENDERS:
        assert drill.max_queued[sender] == held, sender
        assert drill.at_fault_end["queued"][sender] == held
    # What the exporters hold at the fault's end is exactly that: the queued batches and the one in flight each.
    assert drill.at_fault_end["snapshots"] == len(SENDERS) * (held + 1)


@pytest.mark.parametrize("fault", ["down", "slow"])
def test_traced_memory_is_what_the_bounded_queues_hold(runs: Callable[[Fault, int], Run], fault: Fault) -> None:
    drill = runs(fault, SMALL_QUEUE)
    end = drill.at_fault_end
    assert drill.batch_bytes > 5_000  # one batch's snapshot
    # What the exporters allocated while traced and still hold at the fault's end: their full queues
    # (the batch in flight was taken before tracing began), give or take batches growing by a few series.
    assert end["traced_end"] < 1.5 * len(SENDERS) * SMALL_QUEUE * drill.batch_bytes, (end, drill.batch_bytes)
    # ... and it did not grow over the last 50 ticks of the fault, when unbounded queues would have kept
    # another 50 batches each (~2.5 MB).
    ticks = FAULT_TICKS - (1 + SMALL_QUEUE + 3) - 3  # from the first base tick to the first end tick
    assert end["traced_growth"] < ticks * len(SENDERS) * drill.batch_bytes / 10, (end, drill.batch_bytes)


# --- no energy already measured is lost ---------------------------------------------------------


def by_tick(run: Run, sender: str) -> dict[int, list[ReceivedPoint]]:
    """The requests delivered, by the tick whose batch each carried (in the order they arrived)."""
    index = {ns: i for i, ns in enumerate(run.wall_ns)}
    out: dict[int, list[ReceivedPoint]] = {}
    for points in run.delivered[sender]:
        (time_ns,) = {p.time_ns for p in points}  # one tick per request
        assert index[time_ns] not in out, f"tick {index[time_ns]} delivered twice"
        out[index[time_ns]] = [dataclasses.replace(p, request_index=0) for p in points]
    return out


def test_every_request_delivered_is_the_reference_request_of_its_tick(drill: Run, reference: Run) -> None:
    expected_ticks = sorted(set(range(TICKS)) - set(dropped_ticks(drill)))
    for sender in CUMULATIVE_SENDERS:
        got, want = by_tick(drill, sender), by_tick(reference, sender)
        assert list(got) == expected_ticks, sender  # in the order they were measured
        for i, points in got.items():
            assert points == want[i], (sender, i)


def totals_mj(points: list[ReceivedPoint], identity: bool = False) -> dict[Any, int]:
    """Each counter series' value in integer mJ; ``identity``: keyed without ``wattpipe.state``, the last
    value of a series that changed state (a process that exited) winning."""
    out = {}
    for p in points:
        if p.kind == "sum":
            key = p.series()
            if identity:
                key = (key[0], frozenset((k, v) for k, v in key[1] if k != "wattpipe.state"))
            out[key] = round(p.value * 1000)
    return out


def test_the_last_totals_equal_the_no_outage_run(drill: Run, reference: Run) -> None:
    for sender in CUMULATIVE_SENDERS:
        last, expected = drill.delivered[sender][-1], reference.delivered[sender][-1]
        assert totals_mj(last) == totals_mj(expected)
        assert sum(totals_mj(last).values()) > 0


def test_delta_points_tile_time_and_add_up_to_the_no_outage_totals(drill: Run, reference: Run) -> None:
    # Every series the reference run ever exported, at the last total it reached (a process's series goes on
    # under wattpipe.state=terminated when it exits: the same series for deltas).
    expected: dict[Any, int] = {}
    for points in reference.delivered["grpc"]:
        expected.update(totals_mj(points, identity=True))
    summed: dict[Any, int] = {}
    last_time: dict[Any, int] = {}
    for points in drill.delivered["delta"]:
        for series, value in totals_mj(points, identity=True).items():
            summed[series] = summed.get(series, 0) + value
        for p in points:
            if p.kind == "sum":
                series = p.series()
                key = (series[0], frozenset((k, v) for k, v in series[1] if k != "wattpipe.state"))
                if key in last_time:  # after the first, each delta starts where the last one sent ended
                    assert p.start_ns == last_time[key], series
                last_time[key] = p.time_ns
    # Dropped batches or not, the deltas add up to the reference run's cumulative totals, to the millijoule.
    assert summed == expected
    assert any(dict(k[1]).get("process.pid") == 4243 for k in summed)  # exited during the fault
