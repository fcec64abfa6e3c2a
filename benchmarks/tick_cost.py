"""Benchmark: what a wattpipe tick costs, on the simulator (issue 4's targets).

    .venv/bin/python benchmarks/tick_cost.py [--ticks 1000]

1. CPU time per tick, nvml → idle → attribution → energy → prometheus render, 8 GPUs × 64 time-sliced
   processes (target ≤ 10 ms). The simulated NVML library runs in this process, so the total includes
   its CPU; the CPU spent inside its calls is measured too (thread CPU time around every call into
   ``pynvml.nvmlLib``, summed over the device worker threads) and subtracted, which leaves wattpipe's own
   CPU per tick: the receivers' Python (pynvml's wrappers included) + processors + render. A real driver's
   work is in C, outside the Python process's interpreter. The render's share is measured on its own.
2. `/metrics` response time with ~5,000 series, served from memory (target ≤ 5 ms).
3. Resident memory after --ticks ticks, and its growth over the second half (target ≤ 80 MB, no growth).
4. With 20 ms injected into every NVML call, the tick's wall time against the slowest single device's
   calls (target ≤ 1.2×): devices are read in parallel, one worker thread each.

Last, the steal time over the run (Linux ``/proc/stat``): on a shared VM, a run with more than a few %
measures its neighbours as much as wattpipe.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import textwrap
import threading
import time
import timeit
from collections.abc import Callable
from typing import Any

import httpx
import pynvml

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry, call_optional
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.runtime import PipelineRunner, settle_heap
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.scale import scale_scenario

PIPELINE = textwrap.dedent(
    """
    receivers:
      nvml: {required: true, device_timeout: 30s}
    processors:
      idle:
      attribution:
      energy:
    exporters:
      prometheus: {listen: "127.0.0.1:0"}
    service:
      telemetry: {listen: ""}
      pipelines:
        metrics: {interval: 5s, receiver_timeout: 60s, receivers: [nvml], processors: [idle, attribution, energy],
                  exporters: [prometheus]}
    """
)


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def make(processes_per_gpu: int) -> tuple[SteppedClock, Graph, PipelineRunner]:
    clock = SteppedClock()
    simulator.install(
        scale_scenario(mig_gpus=0, timesliced_gpus=8, processes_per_gpu=processes_per_gpu, host_processes=0), clock
    )
    registry = Registry.from_entry_points()
    graph = build(
        load_config_text(PIPELINE, "bench.yaml", registry, {"NODE_NAME": "bench"}), registry, clock, Telemetry(clock)
    )
    return clock, graph, PipelineRunner(graph, graph.pipelines[0])


async def lifecycle(graph: Graph, body: Callable[[], Any]) -> Any:
    for component in (*graph.exporters.values(), *graph.receivers.values()):
        await call_optional(component, "start")
    settle_heap()  # as Service.start does
    try:
        return await body()
    finally:
        for component in (*graph.receivers.values(), *graph.exporters.values()):
            await call_optional(component, "shutdown")
        simulator.uninstall()


class Meter:
    """Thread CPU time spent inside the calls it wraps, summed over the threads that make them.

    ``time.thread_time()`` is the calling thread's CPU only, so calls running at once on the device
    worker threads are each counted once. The metering's own cost stays outside what it measures.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cpu_s = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def metered(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                with self._lock:
                    self.cpu_s += spent

        return metered


class MeteredLibrary:
    """pynvml's library with every call metered: the simulated driver's own CPU."""

    def __init__(self, inner: Any, meter: Meter) -> None:
        self._inner, self._meter = inner, meter

    def __getattr__(self, name: str) -> Any:
        return self._meter.wrap(getattr(self._inner, name))


def _p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


def cpu_and_memory(ticks: int) -> dict[str, float]:
    clock, graph, runner = make(64)
    driver, processors, render = Meter(), Meter(), Meter()
    pynvml.nvmlLib = MeteredLibrary(pynvml.nvmlLib, driver)
    pynvml._nvmlGetFunctionPointer_cache = {}  # re-resolve every symbol through the metered library
    for _, processor in runner.pipeline.processors:
        metered: Any = processor  # its method replaced by a metered one
        metered.process = processors.wrap(processor.process)
    exporter: Any = graph.exporters["prometheus"]
    exporter.render = render.wrap(exporter.render)  # on a worker thread (asyncio.to_thread): metered there

    async def body() -> dict[str, float]:
        meters = {"driver": driver, "processors": processors, "render": render}
        cpu: list[float] = []
        spent: dict[str, list[float]] = {name: [] for name in meters}
        half_rss = 0.0
        for i in range(ticks):
            clock.advance(700.0 if i == 0 else 5.0)  # first: every process has started
            before = {name: meter.cpu_s for name, meter in meters.items()}
            started = time.process_time()
            await runner.tick()
            cpu.append(time.process_time() - started)
            for name, meter in meters.items():
                spent[name].append(meter.cpu_s - before[name])
            if i == ticks // 2:
                half_rss = rss_mb()
        own = [total - driver_s for total, driver_s in zip(cpu, spent["driver"], strict=True)]
        rest = [o - p - r for o, p, r in zip(own, spent["processors"], spent["render"], strict=True)]
        out = {
            "rss_mb_half": half_rss,
            "rss_mb_end": rss_mb(),
            "series": float(sum(1 for line in exporter.body.splitlines() if not line.startswith(b"#"))),
        }
        for name, values in {"cpu": cpu, "own": own, **spent, "rest": rest}.items():
            out[f"{name}_ms_median"] = statistics.median(values[1:]) * 1000  # the first tick starts everything
            out[f"{name}_ms_p95"] = _p95(values[1:]) * 1000
            out[f"{name}_ms_p10"] = sorted(values[1:])[len(values[1:]) // 10] * 1000  # the machine's quiet ticks
        return out

    return asyncio.run(lifecycle(graph, body))


def scrape(processes_per_gpu: int, requests: int = 200) -> dict[str, float]:
    clock, graph, runner = make(processes_per_gpu)
    exporter: Any = graph.exporters["prometheus"]

    async def body() -> dict[str, float]:
        for i in range(2):
            clock.advance(700.0 if i == 0 else 5.0)
            await runner.tick()
        url = f"{exporter.url}/metrics"

        def scrapes() -> tuple[str, list[float]]:  # a plain blocking client, off the event loop
            times = []
            with httpx.Client() as client:
                text = client.get(url).text
                for _ in range(requests):
                    started = time.perf_counter()
                    client.get(url).raise_for_status()
                    times.append(time.perf_counter() - started)
            return text, times

        text, times = await asyncio.to_thread(scrapes)
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        return {"series": float(series), "scrape_ms_median": statistics.median(times) * 1000}

    return asyncio.run(lifecycle(graph, body))


class _Slow:
    """pynvml's library with every C call delayed: a driver that takes ``delay_s`` per call."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self._inner, self._delay_s = inner, delay_s
        self.calls = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)

        def slow(*args: Any) -> Any:
            with self._lock:
                self.calls += 1
            time.sleep(self._delay_s)
            return fn(*args)

        return slow


def latency(delay_s: float = 0.020) -> dict[str, float]:
    clock, graph, runner = make(8)
    slow = _Slow(pynvml.nvmlLib, delay_s)
    pynvml.nvmlLib = slow
    pynvml._nvmlGetFunctionPointer_cache = {}  # re-resolve every symbol through the slow library

    async def body() -> dict[str, float]:
        walls = []
        for i in range(11):  # the median of ten: one tick late on a busy machine moves it little
            clock.advance(700.0 if i == 0 else 5.0)
            calls_before = slow.calls
            started = time.perf_counter()
            await runner.tick()
            walls.append(time.perf_counter() - started)
            calls = (slow.calls - calls_before) / len(graph.receivers["nvml"].slots)  # type: ignore[attr-defined]
        # One device's reads per tick, counted (every device makes the same calls): power, energy, compute
        # mode, MIG mode, the process list and the utilisation samples, one call each once the buffers fit.
        return {
            "tick_wall_ms": statistics.median(walls[1:]) * 1000,
            "calls_per_device": calls,
            "devices": float(len(graph.receivers["nvml"].slots)),  # type: ignore[attr-defined]
        }

    out = asyncio.run(lifecycle(graph, body))
    out["one_device_ms"] = out["calls_per_device"] * delay_s * 1000
    return out  # type: ignore[no-any-return]


def _yardstick_ms() -> float:
    """The best of five ``sum(range(10**6))``: how fast this machine runs plain Python, so that tick costs
    measured on two machines can be compared (docs/benchmarks.md quotes it)."""
    return min(timeit.repeat("sum(range(10**6))", number=1, repeat=5)) * 1000


def _cpu_times() -> list[int] | None:
    """The machine's CPU time counters (``/proc/stat``: user, nice, system, idle, iowait, irq, softirq,
    steal), or ``None`` where there is no such file."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    return [int(v) for v in fields[1:9]] if fields[:1] == ["cpu"] and len(fields) >= 9 else None


def _steal(before: list[int] | None) -> str:
    """The share of the run the hypervisor gave this VM's CPUs to others (steal time): above a few % the
    timings measure the neighbours as much as wattpipe (docs/benchmarks.md)."""
    after = _cpu_times()
    if before is None or after is None or sum(after) == sum(before):
        return "not known here"
    return f"{(after[7] - before[7]) / (sum(after) - sum(before)) * 100:.1f} % of the machine's CPU time"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=1000)
    args = parser.parse_args()
    times = _cpu_times()
    print(
        f"machine: {platform.machine()}, python {platform.python_version()}, {os.cpu_count()} CPUs; "
        f"a yardstick for comparing machines: sum(range(10**6)) takes {_yardstick_ms():.1f} ms here"
    )
    a = cpu_and_memory(args.ticks)
    print(
        f"1. CPU per tick, 8 GPUs × 64 processes ({a['series']:.0f} series), everything in this process: "
        f"median {a['cpu_ms_median']:.1f} ms, p95 {a['cpu_ms_p95']:.1f} ms"
    )
    print(
        "   wattpipe's own CPU per tick: receivers' Python + processors + render; the simulated driver's CPU "
        f"excluded (a real driver's work is in C): median {a['own_ms_median']:.1f} ms, p10 {a['own_ms_p10']:.1f} ms, "
        f"p95 {a['own_ms_p95']:.1f} ms"
    )
    print(
        f"   of which: render {a['render_ms_median']:.1f} ms (p95 {a['render_ms_p95']:.1f}), processors "
        f"{a['processors_ms_median']:.1f} ms (p95 {a['processors_ms_p95']:.1f}), receivers' Python and the runtime "
        f"{a['rest_ms_median']:.1f} ms (p95 {a['rest_ms_p95']:.1f}); the simulated driver, excluded: "
        f"{a['driver_ms_median']:.1f} ms (p95 {a['driver_ms_p95']:.1f})"
    )
    b = scrape(200)
    print(f"2. /metrics with {b['series']:.0f} series: median {b['scrape_ms_median']:.2f} ms")
    print(f"3. RSS after {args.ticks} ticks: {a['rss_mb_end']:.1f} MB (at half: {a['rss_mb_half']:.1f} MB)")
    c = latency()
    print(
        f"4. 20 ms per NVML call: tick {c['tick_wall_ms']:.0f} ms vs one device's {c['calls_per_device']:.0f} calls "
        f"{c['one_device_ms']:.0f} ms "
        f"({c['tick_wall_ms'] / c['one_device_ms']:.2f}×)"
    )
    print(f"steal time during the run (a VM's CPUs given to its neighbours): {_steal(times)}")


if __name__ == "__main__":
    main()
