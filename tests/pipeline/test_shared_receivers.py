"""A receiver listed by several pipelines is read once per tick and every one of them gets its records."""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time
from collections.abc import Sequence

import pytest

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import CreateContext, Registry
from wattpipe.pipeline.config import ConfigError, load_config_text
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.records import GpuProcessSample, Record
from wattpipe.pipeline.runtime import PipelineRunner, Service
from wattpipe.pipeline.telemetry import Telemetry

H = "tests.helpers.components"
HERE = "tests.pipeline.test_shared_receivers"


class UtilSinceLastRead:
    """A receiver that reports what happened since its own previous read, as NVML's per-process
    utilisation does: each pid's samples cover the window since the last read, and a second read at the
    same instant has nothing new to say. Two readers of one instance therefore split its data."""

    provides = frozenset({"gpu_processes"})

    def __init__(self, *, pids: Sequence[int] = (1, 2), context: CreateContext) -> None:
        self.pids = list(pids)
        self.clock = context.clock
        self.reads = 0
        self._last_s = context.clock.monotonic()

    async def collect(self) -> Sequence[Record]:
        self.reads += 1
        now = self.clock.now()
        window_s, self._last_s = now.monotonic_s - self._last_s, now.monotonic_s
        if window_s <= 0:
            return []
        return [
            GpuProcessSample(time=now, device_id="GPU-test-0", pid=pid, sm_util=0.5, util_window_s=window_s)
            for pid in self.pids
        ]


def make_graph(text: str, clock: SteppedClock) -> Graph:
    registry = Registry.from_entry_points()
    config = load_config_text(textwrap.dedent(text), "test.yaml", registry, {"NODE_NAME": "node-a"})
    return build(config, registry, clock, Telemetry(clock))


def counter(graph: Graph, name: str, **labels: str) -> float:
    value = graph.telemetry.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def batches(graph: Graph, exporter: str) -> list[Batch]:
    recorded: list[Batch] = graph.exporters[exporter].batches  # type: ignore[attr-defined]
    return recorded


SHARED = f"""
receivers:
  custom/gpu: {{class: "{H}:CountingGpu", watts: 200}}
  custom/util: {{class: "{HERE}:UtilSinceLastRead", pids: [1, 2]}}
processors:
  custom/split: {{class: "{H}:EvenSplit"}}
exporters:
  custom/a: {{class: "{H}:Recorder"}}
  custom/b: {{class: "{H}:Recorder"}}
service:
  pipelines:
    metrics:
      interval: 5s
      receivers: [custom/gpu, custom/util]
      processors: [custom/split]
      exporters: [custom/a]
    metrics/b:
      interval: INTERVAL_B
      receivers: [custom/util, custom/gpu]
      processors: [custom/split]
      exporters: [custom/b]
"""


def test_two_pipelines_sharing_a_stateful_receiver_both_get_every_read() -> None:
    clock = SteppedClock()
    graph = make_graph(SHARED.replace("INTERVAL_B", "5s"), clock)
    asyncio.run(Service(graph).run(max_ticks=4))
    a, b = batches(graph, "custom/a"), batches(graph, "custom/b")
    assert len(a) == len(b) == 4
    for batch in (*a[1:], *b[1:]):
        assert [(p.pid, p.util_window_s) for p in batch.gpu_processes] == [(1, 5.0), (2, 5.0)]
        assert [s.energy_j for s in batch.shares] == [pytest.approx(500.0)] * 2  # 200 W × 5 s, halved
    assert [bb.gpu_processes for bb in b] == [ba.gpu_processes for ba in a]  # the same records, not a split
    assert [bb.time for bb in b] == [ba.time for ba in a]  # one tick for both
    util, gpu = graph.receivers["custom/util"], graph.receivers["custom/gpu"]
    assert util.reads == 4  # type: ignore[attr-defined]  # one read per tick serves both pipelines
    assert gpu.polls == 4  # type: ignore[attr-defined]


def test_each_pipeline_counts_the_records_it_got_from_a_shared_receiver() -> None:
    graph = make_graph(SHARED.replace("INTERVAL_B", "5s"), SteppedClock())
    asyncio.run(Service(graph).run(max_ticks=3))
    for pipeline in ("metrics", "metrics/b"):
        # The first read's window is 0 s (no samples), then two processes a tick.
        assert counter(graph, "wattpipe_receiver_records_total", pipeline=pipeline, component="custom/util") == 4
        assert counter(graph, "wattpipe_receiver_records_total", pipeline=pipeline, component="custom/gpu") == 3


def test_pipelines_sharing_a_receiver_with_different_intervals_are_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        make_graph(SHARED.replace("INTERVAL_B", "10s"), SteppedClock())
    assert info.value.messages == [
        "test.yaml:18 service.pipelines.metrics/b.interval: pipelines 'metrics' (interval 5s) and 'metrics/b' "
        "(interval 10s) share receivers 'custom/gpu', 'custom/util': a shared receiver is read once per tick "
        "for every pipeline that lists it, so give them the same interval (or give one of them another "
        "receiver of the same type)"
    ]


def test_a_defaulted_interval_is_compared_too_and_named_at_its_pipeline() -> None:
    text = SHARED.replace("      interval: INTERVAL_B\n", "").replace("interval: 5s", "interval: 1s")
    with pytest.raises(ConfigError) as info:
        make_graph(text, SteppedClock())
    (msg,) = info.value.messages
    assert msg.startswith(
        "test.yaml:17 service.pipelines.metrics/b.interval: pipelines 'metrics' (interval 1s) and 'metrics/b' "
        "(interval 5s) share receivers"
    )


PRIVATE = f"""
receivers:
  custom/gpu: {{class: "{H}:CountingGpu", watts: 200}}
  custom/util: {{class: "{HERE}:UtilSinceLastRead", pids: [1, 2]}}
  custom/util-b: {{class: "{HERE}:UtilSinceLastRead", pids: [7]}}
processors:
  custom/split: {{class: "{H}:EvenSplit"}}
exporters:
  custom/a: {{class: "{H}:Recorder"}}
  custom/b: {{class: "{H}:Recorder"}}
service:
  pipelines:
    metrics:
      interval: 5s
      receivers: [custom/gpu, custom/util]
      processors: [custom/split]
      exporters: [custom/a]
    metrics/b:
      interval: 10s
      receivers: [custom/util-b]
      exporters: [custom/b]
"""


def test_pipelines_without_a_shared_receiver_keep_their_own_interval_and_reads() -> None:
    clock = SteppedClock()
    graph = make_graph(PRIVATE, clock)
    service = Service(graph)
    assert [[r.pipeline.name for r in g.runners] for g in service.groups] == [["metrics"], ["metrics/b"]]
    assert [g.interval_s for g in service.groups] == [5.0, 10.0]
    solo_a, solo_b = service.groups

    async def go() -> None:
        # Driven by hand: one stepped clock under two free-running loops jumps to whichever deadline is
        # awaited first, so the loops' own timing is not what this test is about.
        for step in range(5):
            await solo_a.tick()
            if step % 2 == 0:
                await solo_b.tick()
            clock.advance(5.0)

    asyncio.run(go())
    a, b = batches(graph, "custom/a"), batches(graph, "custom/b")
    assert [[p.util_window_s for p in x.gpu_processes] for x in a] == [[]] + [[5.0, 5.0]] * 4
    assert [[(p.pid, p.util_window_s) for p in x.gpu_processes] for x in b] == [[], [(7, 10.0)], [(7, 10.0)]]
    assert [x.interval_s for x in b] == [10.0] * 3
    assert graph.receivers["custom/util"].reads == 5  # type: ignore[attr-defined]
    assert graph.receivers["custom/util-b"].reads == 3  # type: ignore[attr-defined]
    assert counter(graph, "wattpipe_receiver_records_total", pipeline="metrics/b", component="custom/util") == 0
    assert counter(graph, "wattpipe_receiver_records_total", pipeline="metrics/b", component="custom/util-b") == 2


def test_a_runner_ticked_alone_reads_its_own_receivers_as_before() -> None:
    clock = SteppedClock()
    graph = make_graph(PRIVATE, clock)
    runner = PipelineRunner(graph, graph.pipelines[0])

    async def go() -> list[Batch]:
        out = [await runner.tick()]
        clock.advance(5.0)
        out.append(await runner.tick())
        return out

    first, second = asyncio.run(go())
    assert first.gpu_processes == ()
    assert [(p.pid, p.util_window_s) for p in second.gpu_processes] == [(1, 5.0), (2, 5.0)]
    assert second.interval_s == 5.0
    assert graph.receivers["custom/util-b"].reads == 0  # type: ignore[attr-defined]
    assert runner.ticks == 2
    assert runner.last_batch is second


MIXED = f"""
receivers:
  custom/gpu: {{class: "{H}:CountingGpu", watts: 200}}
  custom/flaky: {{class: "{H}:Flaky", good_polls: 1}}
  custom/util-b: {{class: "{HERE}:UtilSinceLastRead", pids: [9]}}
exporters:
  custom/a: {{class: "{H}:Recorder"}}
  custom/b: {{class: "{H}:Recorder"}}
service:
  pipelines:
    metrics: {{receivers: [custom/gpu, custom/flaky], exporters: [custom/a]}}
    metrics/b: {{receivers: [custom/flaky, custom/util-b], exporters: [custom/b]}}
"""


def test_a_receiver_private_to_one_pipeline_of_a_group_feeds_only_that_pipeline() -> None:
    graph = make_graph(MIXED, SteppedClock())
    asyncio.run(Service(graph).run(max_ticks=3))
    a, b = batches(graph, "custom/a"), batches(graph, "custom/b")
    assert [len(x.devices) for x in a] == [1, 1, 1]
    assert [len(x.devices) for x in b] == [0, 0, 0]
    assert "devices" not in b[0].present  # no receiver of metrics/b fills it: unknown there, not empty
    assert [[p.pid for p in x.gpu_processes if p.pid == 9] for x in b] == [[], [9], [9]]
    assert all(p.pid != 9 for x in a for p in x.gpu_processes)
    assert graph.receivers["custom/gpu"].polls == 3  # type: ignore[attr-defined]
    assert graph.receivers["custom/util-b"].reads == 3  # type: ignore[attr-defined]
    assert counter(graph, "wattpipe_receiver_records_total", pipeline="metrics/b", component="custom/gpu") == 0
    assert counter(graph, "wattpipe_receiver_records_total", pipeline="metrics", component="custom/util-b") == 0


def test_a_shared_receiver_that_fails_is_counted_for_each_pipeline_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    graph = make_graph(MIXED, SteppedClock())
    with caplog.at_level(logging.WARNING, logger="wattpipe.runtime"):
        asyncio.run(Service(graph).run(max_ticks=3))
    assert graph.receivers["custom/flaky"].polls == 3  # type: ignore[attr-defined]
    for pipeline, exporter in (("metrics", "custom/a"), ("metrics/b", "custom/b")):
        assert counter(graph, "wattpipe_receiver_records_total", pipeline=pipeline, component="custom/flaky") == 1
        assert counter(graph, "wattpipe_receiver_errors_total", pipeline=pipeline, component="custom/flaky") == 2
        flaky = [[p.pid for p in x.gpu_processes if p.device_id == "GPU-flaky"] for x in batches(graph, exporter)]
        assert flaky == [[7], [], []]
    assert ["gpu_processes" in x.present for x in batches(graph, "custom/a")] == [True, False, False]
    failures = [r.message for r in caplog.records if "custom/flaky" in r.message]
    assert failures == [
        "pipelines metrics, metrics/b: receiver custom/flaky failed: ConnectionError: device went away; "
        "this tick goes on without it"
    ]


def test_pipelines_joined_through_a_third_tick_as_one_group_in_config_order() -> None:
    text = f"""
    receivers:
      custom/r1: {{class: "{H}:CountingGpu"}}
      custom/r2: {{class: "{H}:CountingGpu"}}
      custom/r3: {{class: "{H}:CountingGpu"}}
    exporters:
      custom/a: {{class: "{H}:Recorder"}}
    service:
      pipelines:
        metrics/w: {{receivers: [custom/r1], exporters: [custom/a]}}
        metrics/x: {{receivers: [custom/r3], exporters: [custom/a]}}
        metrics/y: {{receivers: [custom/r2], exporters: [custom/a]}}
        metrics/z: {{receivers: [custom/r2, custom/r1], exporters: [custom/a]}}
    """
    graph = make_graph(text, SteppedClock())
    assert [[p.name for p in g] for g in graph.tick_groups()] == [
        ["metrics/w", "metrics/y", "metrics/z"],
        ["metrics/x"],
    ]


def test_a_shared_receiver_waits_as_long_as_the_most_patient_pipeline_allows() -> None:
    text = MIXED.replace("good_polls: 1", "good_polls: 0, hang: true")
    text = text.replace("metrics: {receivers", "metrics: {interval: 400ms, receiver_timeout: 300ms, receivers")
    text = text.replace("metrics/b: {receivers", "metrics/b: {interval: 400ms, receivers")  # default: 200ms
    graph = make_graph(text, SteppedClock())
    (group,) = Service(graph).groups
    started = time.monotonic()
    asyncio.run(group.tick())
    assert 0.29 <= time.monotonic() - started < 2.0  # metrics' 300 ms, not metrics/b's 200 ms
    for pipeline in ("metrics", "metrics/b"):
        assert counter(graph, "wattpipe_receiver_errors_total", pipeline=pipeline, component="custom/flaky") == 1
