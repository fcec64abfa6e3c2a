"""Benchmark: a benchmark-sized simulated node, and one whole wattpipe tick against it.

    .venv/bin/python benchmarks/simulator_scale.py [--repeat 5]

Node: 8 GPUs × 7 MIG instances, 8 GPUs × 64 time-sliced processes, 2,000 host processes.
Reports medians of --repeat runs. Targets (issue 3): the node builds in under a second; a tick's worth of
calls on each face leaves a 1-second tick most of its budget. Results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

import pynvml

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import PipelineRunner
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.dcgm_server import DcgmExporterOptions, start_dcgm_exporter
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.scale import scale_scenario

PIPELINE = textwrap.dedent(
    """
    receivers:
      nvml: {required: true}
    processors:
      filter: {exclude: {kinds: [instance]}}
    exporters:
      console: {format: json, kinds: [devices], output: stderr}
    service:
      telemetry: {listen: ""}
      pipelines:
        metrics: {interval: 1s, receivers: [nvml], processors: [filter], exporters: [console]}
    """
)


def nvml_calls(count: int, last_seen_us: int) -> None:
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetPowerUsage(handle)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        if pynvml.nvmlDeviceGetMaxMigDeviceCount(handle):
            for slot in range(7):
                pynvml.nvmlDeviceGetGpuInstanceId(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            continue
        with contextlib.suppress(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us)


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def once(tmp: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    started = time.perf_counter()
    scenario = scale_scenario(mig_gpus=8, timesliced_gpus=8, processes_per_gpu=64, host_processes=2000)
    clock = SteppedClock()
    with simulator.install(scenario, clock) as node:
        out["build node"] = time.perf_counter() - started
        pynvml.nvmlInit()
        exporter = start_dcgm_exporter(node, DcgmExporterOptions(collect_interval_s=1))
        writer = ProcfsWriter(node, tmp)
        clock.advance(700)
        out["/proc first write, 2,568 processes"] = timed(writer.refresh)
        last_seen_us = round(clock.wall() * 1e6)
        clock.advance(1.0)
        out["NVML calls for one tick, 16 GPUs"] = timed(lambda: nvml_calls(16, last_seen_us))
        out["dcgm-exporter render"] = timed(exporter.metrics_text)
        out["/proc refresh"] = timed(writer.refresh)
        pynvml.nvmlShutdown()

        registry = Registry.from_entry_points()
        config = load_config_text(PIPELINE, "bench.yaml", registry, {"NODE_NAME": "bench"})
        graph = build(config, registry, clock, Telemetry(clock))
        runner = PipelineRunner(graph, graph.pipelines[0])
        receiver = graph.receivers["nvml"]

        async def ticks() -> float:
            await receiver.start()  # type: ignore[attr-defined]
            try:
                await runner.tick()
                clock.advance(1.0)
                started = time.perf_counter()
                await runner.tick()
                return time.perf_counter() - started
            finally:
                await receiver.shutdown()  # type: ignore[attr-defined]

        out["wattpipe tick: nvml → filter → console"] = asyncio.run(ticks())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(once(Path(tmp)))
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}")
    print(f"median of {args.repeat} runs")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"  {key:<46} {statistics.median(values) * 1000:9.1f} ms   (min {min(values) * 1000:.1f})")


if __name__ == "__main__":
    main()
