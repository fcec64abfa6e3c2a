"""The CPU receivers in a real pipeline: what a tick's Batch says when RAPL is there, and when it is not."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

from tests.receivers.test_procfs import write_process
from tests.receivers.test_rapl import two_socket_tree
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import PipelineRunner
from wattpipe.pipeline.telemetry import Telemetry

CONFIG = textwrap.dedent(
    """
    receivers:
      rapl: {root: "SYS"}
      procfs: {root: "PROC", cpu_time: false}
    exporters:
      console: {format: json, output: stderr}
    service:
      telemetry: {listen: ""}
      pipelines:
        metrics: {interval: 5s, receivers: [rapl, procfs], exporters: [console]}
    """
)


def ticks(sys: Path, proc: Path, count: int) -> list[Batch]:
    clock = SteppedClock()
    registry = Registry.from_entry_points()
    text = CONFIG.replace("SYS", str(sys)).replace("PROC", str(proc))
    graph = build(load_config_text(text, "cpu.yaml", registry, {}), registry, clock, Telemetry(clock))
    runner = PipelineRunner(graph, graph.pipelines[0])

    async def run() -> list[Batch]:
        out = []
        for _ in range(count):
            clock.advance(5.0)
            out.append(await runner.tick())
        return out

    return asyncio.run(run())


def a_proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    write_process(proc, 10, "init")
    (proc / "stat").write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 100 0 50 800 50 0 0 0 0 0\n")
    return proc


def test_a_node_with_rapl_fills_cpu_zones_and_node_cpu(tmp_path: Path) -> None:
    two_socket_tree(tmp_path / "sys")
    _, second = ticks(tmp_path / "sys", a_proc(tmp_path), 2)
    assert {"cpu_zones", "node_cpu", "host_processes"} <= second.present
    assert len(second.cpu_zones) == 7
    assert second.node_cpu[0].total_s == 10.0
    assert second.node_cpu[0].active_s == 1.5
    assert [p.pid for p in second.host_processes] == [10]


def test_a_node_without_rapl_leaves_cpu_zones_absent_not_empty(tmp_path: Path) -> None:
    (batch,) = ticks(tmp_path / "no-sys", a_proc(tmp_path), 1)
    assert "cpu_zones" not in batch.present  # nothing is known about the CPU's energy
    assert batch.cpu_zones == ()
    assert {"node_cpu", "host_processes"} <= batch.present  # the rest of the tick goes on
