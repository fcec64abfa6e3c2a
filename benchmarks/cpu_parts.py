"""Benchmark: where the CPU-attribution tick's own work goes, step by step (what ``cpu_tick.py`` sums).

    .venv/bin/python benchmarks/cpu_parts.py [--ticks 30] [--busy-services 5]

``cpu_tick.py``'s node and its "on" pipeline alone (nvml + procfs ``cpu_time: true`` + rapl → idle →
attribution → energy → cpu_attribution → prometheus). Per tick, the thread CPU of ``cpu_attribution``'s steps
(``_weights``: the listing's CPU-time deltas; ``_split``: the zones' idle/active and the shares;
``series.update``: the series' energy; ``series.totals``: their Totals records) and of the render, with the
render's label columns (``labelled_columns``) per family: the medians, and the families' means, of the ticks
after the first two (which read every process for the first time). The render runs inline on the event loop's
thread here, so that it can be metered per family. A step's figure is a share of the tick to aim at, not a
tick's cost: this machine's timings swing (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from cpu_tick import install_node, make_graph
from tick_cost import Meter, lifecycle

from wattpipe.exporters import prometheus
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.labels import labelled_columns
from wattpipe.pipeline.runtime import PipelineRunner

STEPS = ("cpu_attribution", "_weights", "_split", "series.update", "series.totals", "render")


async def measure(ticks: int, busy_services: int, workdir: Path) -> tuple[dict[str, list[float]], dict[str, float]]:
    clock = SteppedClock()
    writer = install_node(clock, workdir, busy_services=busy_services)
    graph = make_graph(workdir, "on", clock, Registry.from_entry_points())
    runner = PipelineRunner(graph, graph.pipelines[0])
    meters = {name: Meter() for name in STEPS}
    processor: Any = dict(graph.pipelines[0].processors)["cpu_attribution"]
    for name in ("_weights", "_split"):
        setattr(processor, name, meters[name].wrap(getattr(processor, name)))
    series: Any = processor.series
    series.update = meters["series.update"].wrap(series.update)
    series.totals = meters["series.totals"].wrap(series.totals)
    processor.process = meters["cpu_attribution"].wrap(processor.process)
    exporter: Any = graph.exporters["prometheus"]
    exporter.render = meters["render"].wrap(exporter.render)

    async def inline(batch: Batch) -> None:
        exporter.render(batch)

    exporter.export = inline
    families: dict[str, float] = defaultdict(float)
    counting = False

    def metered_columns(family: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        out = labelled_columns(family, *args, **kwargs)
        if counting:
            families[family.kepler] += time.thread_time() - started
        return out

    vars(prometheus)["labelled_columns"] = metered_columns  # the name the exporter calls it by
    spent: dict[str, list[float]] = {name: [] for name in STEPS}

    async def body() -> None:
        nonlocal counting
        for i in range(ticks + 2):
            clock.advance(700.0 if i == 0 else 5.0)
            writer.refresh()
            counting = i >= 2
            before = {name: m.cpu_s for name, m in meters.items()}
            await runner.tick()
            if counting:
                for name, m in meters.items():
                    spent[name].append(m.cpu_s - before[name])

    try:
        await lifecycle(graph, body)
    finally:
        vars(prometheus)["labelled_columns"] = labelled_columns
    return spent, {name: total / ticks for name, total in families.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--busy-services", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpu-parts-") as workdir:
        spent, families = asyncio.run(measure(args.ticks, args.busy_services, Path(workdir)))
    print(f"the 'on' pipeline alone, {args.ticks} ticks, {args.busy_services} of 50 services busy: medians per tick")
    for name in STEPS:
        print(f"  {name:<20} {statistics.median(spent[name]) * 1000:6.3f} ms")
    print(f"  label columns, all families {sum(families.values()) * 1000:6.3f} ms (means); the largest:")
    for name, cpu_s in sorted(families.items(), key=lambda item: -item[1])[:10]:
        print(f"    {name:<44} {cpu_s * 1000:6.3f} ms")


if __name__ == "__main__":
    main()
