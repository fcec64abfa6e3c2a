"""Benchmark: the instructions one wattpipe tick executes, counted by valgrind (free of the machine's noise).

    .venv/bin/python benchmarks/tick_instructions.py [--parts] [--cpu [--busy-services 5] [--unseen]]

Timings on a shared or virtual machine swing by half from one minute to the next (docs/benchmarks.md);
an instruction count does not, so two versions of the code can be compared with one run each. The tick
is issue 4's benchmark tick (``tick_cost.py``: nvml → idle → attribution → energy → prometheus, 8 GPUs ×
64 time-sliced processes on the simulator), with every GPU read and the render run inline on one thread,
so that ``valgrind --tool=callgrind`` sees it all. The count per tick is (instructions of 25 ticks −
instructions of 5 ticks) / 20, which leaves out the start-up (imports, building the simulated node). The
simulated driver's instructions are in it: compare two versions of wattpipe, not wattpipe with a real
driver. ``--parts`` also counts the tick without the render and without the processors, to split it.

``--cpu`` counts ``cpu_tick.py``'s node instead (8 GPUs × 64 processes + 2,000 host processes, its /proc and
/sys written in a temporary directory) and both its pipelines, "off" (the GPU path) and "on" (+ rapl, procfs
``cpu_time: true``, ``cpu_attribution``), each alone, with procfs's scan inline too; the simulator's writing of
the files between ticks is counted alone and taken out of both. The window is FULL_READ_EVERY ticks, so it holds
one of procfs's full reads. ``--unseen`` also counts "unseen" ("on" with ``cpu_attribution: {unseen: containers}``,
cpu_tick.py's ``--unseen``). Instructions leave out the kernel's work (each ``pread`` of a stat file): they
compare two versions of the Python, which is what the CPU side's cost mostly is, not the ticks' CPU time.

Needs ``valgrind`` (Debian package ``valgrind``); each count takes a minute or two.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import shutil
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FEW, MANY = 5, 25


class _Inline:
    """An executor that runs what it is given at once, on the calling thread (no worker threads to follow)."""

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, **_: Any) -> None:
        pass


def run_ticks(ticks: int, without: frozenset[str]) -> None:
    """The child: ``ticks`` ticks of the benchmark pipeline, all on this thread."""
    import tick_cost

    clock, graph, runner = tick_cost.make(64)
    exporter: Any = graph.exporters["prometheus"]
    receiver: Any = graph.receivers["nvml"]
    if "processors" in without:
        runner.pipeline = dataclasses.replace(runner.pipeline, processors=())

    async def export(batch: Any) -> None:
        if "render" not in without:
            exporter.render(batch)

    exporter.export = export

    async def body() -> None:
        for slot in receiver.slots:
            slot.executor = _Inline()
        for i in range(ticks):
            clock.advance(700.0 if i == 0 else 5.0)
            await runner.tick()

    asyncio.run(tick_cost.lifecycle(graph, body))


def run_cpu_ticks(ticks: int, mode: str, busy_services: int) -> None:
    """The child of ``--cpu``: ``ticks`` ticks of cpu_tick.py's ``mode`` pipeline ("off", "on"), or of none
    ("none": the simulator's writing alone), all on this thread."""
    import tempfile

    import cpu_tick
    import tick_cost

    from wattpipe.pipeline.clock import SteppedClock
    from wattpipe.pipeline.components import Registry
    from wattpipe.pipeline.runtime import PipelineRunner

    with tempfile.TemporaryDirectory(prefix="cpu-instructions-") as workdir:
        clock = SteppedClock()
        writer = cpu_tick.install_node(clock, Path(workdir), busy_services=busy_services)
        registry = Registry.from_entry_points()
        graph = cpu_tick.make_graph(Path(workdir), "off" if mode == "none" else mode, clock, registry)
        runner = PipelineRunner(graph, graph.pipelines[0])
        exporter: Any = graph.exporters["prometheus"]

        async def export(batch: Any) -> None:
            exporter.render(batch)

        exporter.export = export

        async def body() -> None:
            for slot in graph.receivers["nvml"].slots:  # type: ignore[attr-defined]
                slot.executor = _Inline()
            graph.receivers["procfs"]._executor = _Inline()  # type: ignore[attr-defined]
            for i in range(ticks):
                clock.advance(700.0 if i == 0 else 5.0)
                writer.refresh()
                if mode != "none":
                    await runner.tick()

        asyncio.run(tick_cost.lifecycle(graph, body))


def count(ticks: int, without: frozenset[str], cpu: str = "", busy_services: int = 50) -> int:
    """Instructions of a whole child run under callgrind (``cpu``: of run_cpu_ticks's ``mode``)."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        str(ticks),
        "--without",
        ",".join(sorted(without)),
        "--child-cpu",
        cpu,
        "--busy-services",
        str(busy_services),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_tick(without: frozenset[str] = frozenset()) -> float:
    return (count(MANY, without) - count(FEW, without)) / (MANY - FEW)


def cpu_per_tick(mode: str, busy_services: int) -> float:
    """cpu_tick.py's ``mode`` pipeline: instructions per tick over FULL_READ_EVERY ticks, after the first four."""
    from wattpipe.receivers.procfs._proc import FULL_READ_EVERY

    few, many = 4, 4 + FULL_READ_EVERY
    return (count(many, frozenset(), mode, busy_services) - count(few, frozenset(), mode, busy_services)) / (many - few)


def main_cpu(busy_services: int, unseen: bool = False) -> None:
    writing = cpu_per_tick("none", busy_services)
    off = cpu_per_tick("off", busy_services) - writing
    on = cpu_per_tick("on", busy_services) - writing
    print(
        f"instructions per tick, cpu_tick.py's node ({busy_services} of 50 services busy; the simulator's "
        f"writing, {writing / 1e6:.1f} M, left out): off {off / 1e6:.1f} M, on {on / 1e6:.1f} M, on/off {on / off:.3f}×"
    )
    if unseen:
        with_unseen = cpu_per_tick("unseen", busy_services) - writing
        print(f"  on with unseen: containers {with_unseen / 1e6:.1f} M, its /on {with_unseen / on:.3f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", action="store_true", help="also count without the render and the processors")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--without", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-cpu", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", action="store_true", help="count cpu_tick.py's off and on pipelines instead")
    parser.add_argument("--busy-services", type=int, default=50, help="with --cpu: as cpu_tick.py's (default 50)")
    parser.add_argument("--unseen", action="store_true", help="with --cpu: also count on with unseen: containers")
    args = parser.parse_args()
    if args.child is not None and args.child_cpu:
        run_cpu_ticks(args.child, args.child_cpu, args.busy_services)
        return
    if args.child is not None:
        run_ticks(args.child, frozenset(filter(None, args.without.split(","))))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind); nothing was counted")
    if args.cpu:
        main_cpu(args.busy_services, args.unseen)
        return
    whole = per_tick()
    print(f"instructions per tick, 8 GPUs × 64 processes (simulated driver included): {whole / 1e6:.1f} M")
    if args.parts:
        no_render = per_tick(frozenset({"render"}))
        receivers = per_tick(frozenset({"render", "processors"}))
        print(f"  receivers, the simulated driver and the runtime: {receivers / 1e6:.1f} M")
        print(f"  processors (idle, attribution, energy): {(no_render - receivers) / 1e6:.1f} M")
        print(f"  Prometheus render: {(whole - no_render) / 1e6:.1f} M")


if __name__ == "__main__":
    main()
