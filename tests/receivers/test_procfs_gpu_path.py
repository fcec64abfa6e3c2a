"""procfs ``cpu_time: false`` leaves the GPU path's numbers exactly as ``cpu_time: true`` makes them (it reads
only the GPU processes then: their records are the same)."""

from __future__ import annotations

import asyncio
import logging
import textwrap
from pathlib import Path

import pytest

from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry, call_optional
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.runtime import PipelineRunner
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.scale import scale_scenario
from wattpipe.simulator.scenario import parse_scenario

PIPELINE = textwrap.dedent(
    """
    receivers:
      nvml: {required: true}
      procfs: {root: "PROC", cpu_time: CPU_TIME}
    processors:
      idle:
      attribution:
      energy:
    exporters:
      console: {kinds: [totals], output: stderr}
    service:
      telemetry: {listen: ""}
      pipelines:
        metrics: {interval: 5s, receivers: [nvml, procfs], processors: [idle, attribution, energy],
                  exporters: [console]}
    """
)


def graph(proc: Path, cpu_time: bool, clock: SteppedClock, registry: Registry) -> Graph:
    text = PIPELINE.replace("PROC", str(proc)).replace("CPU_TIME", "true" if cpu_time else "false")
    return build(load_config_text(text, "gpu.yaml", registry, {}), registry, clock, Telemetry(clock))


def gpu_view(batch: Batch) -> tuple[object, ...]:
    shares = sorted((s.device_id, s.pid or 0, s.energy_mj, s.mode) for s in batch.shares)
    totals = sorted((t.scope, t.key, t.device_id, t.energy_mj, t.state) for t in batch.totals)
    return shares, totals


def gpu_hosts(batch: Batch) -> set[tuple[object, ...]]:
    """The host records of the batch's GPU processes."""
    gpu = {p.pid for p in batch.gpu_processes}
    return {
        (h.pid, h.start_time_ticks, h.container_id, h.pod_uid, h.start_wall_s)
        for h in batch.host_processes
        if h.pid in gpu
    }


def test_the_gpu_path_is_the_same_with_cpu_time_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="wattpipe")  # the idle processor's notices; restored after the test
    data = scale_scenario(mig_gpus=0, timesliced_gpus=2, processes_per_gpu=6, host_processes=30).model_dump(mode="json")
    # Processes that come and go mid-run, GPU ones among them (in a pod, so their containers' totals count).
    for n in range(6):
        data["processes"].append(
            {"pid": 50_000 + n, "comm": "short", "container": data["processes"][0]["container"], "gpu": n % 2,
             "util": [[0, 0.3]], "start_s": 40.0 + 7 * n, "end_s": 70.0 + 9 * n, "cpu_cores": 0.2}
        )  # fmt: skip
    clock = SteppedClock()
    node = simulator.install(parse_scenario(data), clock)
    writer = ProcfsWriter(node, tmp_path)
    registry = Registry.from_entry_points()
    graphs = {mode: graph(writer.proc, mode, clock, registry) for mode in (True, False)}
    runners = {mode: PipelineRunner(g, g.pipelines[0]) for mode, g in graphs.items()}

    async def run() -> int:
        compared = 0
        for g in graphs.values():
            for r in g.receivers.values():
                await call_optional(r, "start")
        try:
            for i in range(30):
                clock.advance(5.0)
                writer.refresh()
                on, off = await runners[True].tick(), await runners[False].tick()
                assert gpu_view(on) == gpu_view(off), f"tick {i}"
                assert all(h.cpu_time_s is None for h in off.host_processes)
                # Off: the GPU processes only, each from the tick nvml first lists it; one that ended keeps its
                # record while nvml still lists it (the simulated driver does for the tick it ends in: /proc not).
                assert {h.pid for h in off.host_processes} == {p.pid for p in off.gpu_processes}, f"tick {i}"
                extra = {h[0] for h in gpu_hosts(off) - gpu_hosts(on)}
                assert gpu_hosts(on) <= gpu_hosts(off), f"tick {i}"
                assert all(not (writer.proc / str(pid)).exists() for pid in extra), f"tick {i}"
                assert len(on.host_processes) > len(off.host_processes)
                compared += len(on.shares)
        finally:
            for g in graphs.values():
                for r in g.receivers.values():
                    await call_optional(r, "shutdown")
            simulator.uninstall()
        return compared

    assert asyncio.run(run()) > 100  # shares were there to compare
