"""A pipeline run tick by tick on a stepped clock, then scraped once through its real Prometheus exporter."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry, call_optional
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import PipelineRunner
from wattpipe.pipeline.telemetry import Telemetry

Samples = dict[str, list[tuple[dict[str, str], float]]]


def run_and_scrape(
    text: str, clock: SteppedClock, ticks: int, before_tick: Callable[[], object]
) -> tuple[list[Batch], Samples]:
    """``text``'s first pipeline (node ``cpu-node``) started, ticked ``ticks`` times 5 s apart (``before_tick``
    first each time), its ``prometheus`` exporter's ``/metrics`` read, and every component shut down."""
    registry = Registry.from_entry_points()
    graph = build(
        load_config_text(text, "cpu.yaml", registry, {"NODE_NAME": "cpu-node"}), registry, clock, Telemetry(clock)
    )
    runner = PipelineRunner(graph, graph.pipelines[0])
    exporter = graph.exporters["prometheus"]
    batches: list[Batch] = []

    async def go() -> str:
        components = [*graph.exporters.values(), *graph.receivers.values()]
        for component in components:
            await call_optional(component, "start")
        try:
            for _ in range(ticks):
                before_tick()
                batches.append(await runner.tick())
                clock.advance(5.0)
            url = f"{exporter.url}/metrics"  # type: ignore[attr-defined]
            return await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
        finally:
            for component in reversed(components):
                await call_optional(component, "shutdown")

    out: Samples = {}
    for family in text_string_to_metric_families(asyncio.run(go())):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return batches, out
