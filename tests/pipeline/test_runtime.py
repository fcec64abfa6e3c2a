"""The tick: concurrent receivers with timeouts, processors in order, every exporter, failures degrade."""

from __future__ import annotations

import asyncio
import gc
import logging
import textwrap
import time

import pytest

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import ConfigError, load_config_text
from wattpipe.pipeline.graph import Graph, build, check_order
from wattpipe.pipeline.runtime import YOUNG_GC_THRESHOLD, PipelineRunner, Service, settle_heap
from wattpipe.pipeline.telemetry import Telemetry

H = "tests.helpers.components"


def make_graph(text: str, clock: SteppedClock | None = None) -> Graph:
    clock = clock or SteppedClock()
    registry = Registry.from_entry_points()
    config = load_config_text(textwrap.dedent(text), "test.yaml", registry, {"NODE_NAME": "node-a"})
    return build(config, registry, clock, Telemetry(clock))


def counter(graph: Graph, name: str, **labels: str) -> float:
    value = graph.telemetry.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


BASIC = f"""
receivers:
  custom/gpu: {{class: "{H}:CountingGpu", watts: 200}}
  custom/procs: {{class: "{H}:ProcessLister", pids: [1, 2, 3, 4]}}
processors:
  custom/split: {{class: "{H}:EvenSplit"}}
exporters:
  custom/a: {{class: "{H}:Recorder"}}
  custom/b: {{class: "{H}:Recorder"}}
service:
  pipelines:
    metrics:
      interval: 5s
      receivers: [custom/gpu, custom/procs]
      processors: [custom/split]
      exporters: [custom/a, custom/b]
"""


def test_tick_merges_receivers_runs_processors_and_feeds_every_exporter() -> None:
    clock = SteppedClock()
    graph = make_graph(BASIC, clock)
    runner = PipelineRunner(graph, graph.pipelines[0])

    async def go() -> None:
        await runner.tick()
        clock.advance(5.0)
        await runner.tick()

    asyncio.run(go())
    a, b = graph.exporters["custom/a"], graph.exporters["custom/b"]
    assert a.batches == b.batches  # type: ignore[attr-defined]
    batch = a.batches[-1]  # type: ignore[attr-defined]
    assert batch.node == "node-a"
    assert batch.interval_s == 5.0
    assert len(batch.devices) == 1
    assert len(batch.gpu_processes) == 4
    assert batch.devices[0].energy_mj == pytest.approx(200 * 5.0 * 1000)
    assert [s.energy_j for s in batch.shares] == [pytest.approx(250.0)] * 4
    assert {"devices", "gpu_processes", "device_power", "shares"} <= batch.present
    assert counter(graph, "wattpipe_receiver_records_total", pipeline="metrics", component="custom/procs") == 8
    assert (
        counter(graph, "wattpipe_exporter_sent_total", pipeline="metrics", component="custom/a") == 2 * 10
    )  # 1 + 4 + 1 + 4 records a tick


def test_failing_receiver_degrades_the_tick_and_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    text = BASIC.replace(f'"{H}:ProcessLister", pids: [1, 2, 3, 4]', f'"{H}:Flaky", good_polls: 1')
    clock = SteppedClock()
    graph = make_graph(text, clock)
    runner = PipelineRunner(graph, graph.pipelines[0])

    async def go() -> None:
        for _ in range(4):
            await runner.tick()
            clock.advance(5.0)

    with caplog.at_level(logging.WARNING, logger="wattpipe.runtime"):
        asyncio.run(go())
    batches = graph.exporters["custom/a"].batches  # type: ignore[attr-defined]
    assert [len(b.devices) for b in batches] == [1, 1, 1, 1]  # the GPU kept flowing
    assert [len(b.gpu_processes) for b in batches] == [1, 0, 0, 0]
    assert counter(graph, "wattpipe_receiver_errors_total", pipeline="metrics", component="custom/procs") == 3
    failures = [r for r in caplog.records if "custom/procs failed: ConnectionError: device went away" in r.message]
    assert len(failures) == 1  # logged once, not every tick


def test_hanging_receiver_times_out_at_half_the_interval() -> None:
    text = BASIC.replace(f'"{H}:ProcessLister", pids: [1, 2, 3, 4]', f'"{H}:Flaky", good_polls: 0, hang: true')
    text = text.replace("interval: 5s", "interval: 200ms")
    graph = make_graph(text, SteppedClock())
    runner = PipelineRunner(graph, graph.pipelines[0])
    started = time.monotonic()
    batch = asyncio.run(runner.tick())
    elapsed = time.monotonic() - started
    assert 0.09 <= elapsed < 1.0  # waited ~100 ms (half of 200 ms), not an hour
    assert len(batch.devices) == 1
    assert counter(graph, "wattpipe_receiver_errors_total", pipeline="metrics", component="custom/procs") == 1


def test_failing_processor_is_skipped_and_failing_exporter_does_not_stop_the_other() -> None:
    text = f"""
    receivers:
      custom/gpu: {{class: "{H}:CountingGpu"}}
    processors:
      custom/boom: {{class: "{H}:Boom"}}
    exporters:
      custom/bad: {{class: "{H}:Recorder", fail: true}}
      custom/good: {{class: "{H}:Recorder"}}
    service:
      pipelines:
        metrics: {{receivers: [custom/gpu], processors: [custom/boom], exporters: [custom/bad, custom/good]}}
    """
    graph = make_graph(text)
    asyncio.run(PipelineRunner(graph, graph.pipelines[0]).tick())
    assert len(graph.exporters["custom/good"].batches) == 1  # type: ignore[attr-defined]
    assert counter(graph, "wattpipe_processor_errors_total", pipeline="metrics", component="custom/boom") == 1
    assert counter(graph, "wattpipe_exporter_failed_total", pipeline="metrics", component="custom/bad") == 1
    assert counter(graph, "wattpipe_exporter_sent_total", pipeline="metrics", component="custom/good") == 1


def test_stepped_clock_runs_ticks_back_to_back_without_sleeping() -> None:
    clock = SteppedClock()
    graph = make_graph(BASIC.replace("interval: 5s", "interval: 1m"), clock)
    service = Service(graph)
    t0, wall0 = clock.monotonic(), time.monotonic()
    asyncio.run(service.run(max_ticks=30))
    assert time.monotonic() - wall0 < 5.0  # 30 simulated minutes
    assert clock.monotonic() - t0 == pytest.approx(29 * 60)
    batches = graph.exporters["custom/a"].batches  # type: ignore[attr-defined]
    assert len(batches) == 30
    assert [b.interval_s for b in batches[1:]] == [60.0] * 29
    assert [b.time.monotonic_s - t0 for b in batches[:3]] == [0.0, 60.0, 120.0]


def test_start_order_exporters_first_and_stop_order_receivers_first() -> None:
    graph = make_graph(BASIC)
    service = Service(graph)
    events: list[str] = []
    for cid, comp in [*graph.receivers.items(), *graph.exporters.items()]:
        for method in ("start", "shutdown"):
            setattr(comp, method, (lambda c=cid, m=method: events.append(f"{m} {c}")))
    asyncio.run(service.run(max_ticks=1))
    starts = [e.split()[1] for e in events if e.startswith("start")]
    stops = [e.split()[1] for e in events if e.startswith("shutdown")]
    assert starts == ["custom/a", "custom/b", "custom/gpu", "custom/procs"]
    assert stops == ["custom/procs", "custom/gpu", "custom/b", "custom/a"]


def test_stop_finishes_the_tick_in_flight_then_flushes() -> None:
    text = BASIC.replace(f'custom/a: {{class: "{H}:Recorder"}}', f'custom/a: {{class: "{H}:Recorder", slow_s: 0.2}}')
    graph = make_graph(text, SteppedClock())
    service = Service(graph)

    async def go() -> None:
        task = asyncio.create_task(service.run())
        await asyncio.sleep(0.05)  # the first tick is inside the slow export now
        service.stop()
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(go())
    recorder = graph.exporters["custom/a"]
    assert len(recorder.batches) == 1  # type: ignore[attr-defined]  # the tick in flight completed
    assert recorder.flushed  # type: ignore[attr-defined]


def test_readiness_follows_finished_ticks() -> None:
    clock = SteppedClock()
    graph = make_graph(BASIC, clock)
    assert graph.telemetry.ready() == (False, "pipeline metrics: no tick has finished yet")
    asyncio.run(PipelineRunner(graph, graph.pipelines[0]).tick())
    assert graph.telemetry.ready() == (True, "ok")
    clock.advance(16.0)  # beyond three 5 s intervals
    ok, why = graph.telemetry.ready()
    assert not ok
    assert "16.0s ago" in why


# --- order check ----------------------------------------------------------------------------


ORDER = f"""
receivers:
  custom/gpu: {{class: "{H}:CountingGpu"}}
  custom/procs: {{class: "{H}:ProcessLister"}}
processors:
  custom/split: {{class: "{H}:EvenSplit"}}
  custom/needs: {{class: "{H}:NeedsShares"}}
exporters:
  custom/a: {{class: "{H}:Recorder"}}
service:
  pipelines:
    metrics: {{receivers: [custom/gpu, custom/procs], processors: [PROCS], exporters: [custom/a]}}
"""


def test_processor_before_its_provider_is_told_to_move() -> None:
    with pytest.raises(ConfigError) as info:
        make_graph(ORDER.replace("PROCS", "custom/needs, custom/split"))
    assert info.value.messages == [
        "test.yaml:12 service.pipelines.metrics.processors[0]: processor 'custom/needs' needs 'shares', "
        "which 'custom/split' provides later: move 'custom/split' before 'custom/needs'"
    ]


def test_processor_without_any_provider_is_told_what_to_add() -> None:
    text = ORDER.replace("PROCS", "custom/split").replace("custom/gpu, custom/procs", "custom/gpu")
    text = text.replace(f'  custom/procs: {{class: "{H}:ProcessLister"}}\n', "").replace(
        f'  custom/needs: {{class: "{H}:NeedsShares"}}\n', ""
    )
    with pytest.raises(ConfigError) as info:
        make_graph(text)
    (msg,) = info.value.messages
    assert msg.startswith(
        "test.yaml:10 service.pipelines.metrics.processors[0]: processor 'custom/split' needs 'gpu_processes'"
    )
    assert msg.endswith("which nothing before it provides: add a receiver 'nvml' before it")


def test_order_check_suggests_a_registered_provider() -> None:
    from wattpipe.pipeline.components import ComponentConfig, Factory

    registry = Registry(
        [
            Factory(
                type="attribution",
                kind="processor",
                config_model=ComponentConfig,
                create=lambda c, f: None,
                description="",
                provides=frozenset({"shares"}),
            )
        ]
    )

    class Needs:
        needs = frozenset({"shares"})
        provides: frozenset[str] = frozenset()

    (msg,) = check_order("metrics", [], [("export-prep", Needs())], registry)
    assert msg.endswith("which nothing before it provides: add a processor 'attribution' before it")


def test_a_failed_receiver_leaves_its_fields_absent_not_empty() -> None:
    text = BASIC.replace(f'"{H}:ProcessLister", pids: [1, 2, 3, 4]', f'"{H}:Flaky", good_polls: 1')
    clock = SteppedClock()
    graph = make_graph(text, clock)
    runner = PipelineRunner(graph, graph.pipelines[0])

    async def go() -> tuple[Batch, Batch]:
        first = await runner.tick()
        clock.advance(5.0)
        return first, await runner.tick()

    first, second = asyncio.run(go())
    assert "gpu_processes" in first.present  # it answered: an observation
    assert "gpu_processes" not in second.present  # it failed: unknown, not "no processes"
    assert "devices" in second.present


def test_settling_the_heap_collects_the_young_generation_less_often_and_keeps_a_higher_setting() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # Python's default
        settle_heap()
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
        assert YOUNG_GC_THRESHOLD > 700
        gc.set_threshold(50_000, 5, 20)  # an operator's own setting, made before
        settle_heap()
        assert gc.get_threshold() == (50_000, 5, 20)
    finally:
        gc.set_threshold(*saved)
