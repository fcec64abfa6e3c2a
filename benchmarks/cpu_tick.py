"""Benchmark: what CPU attribution adds to a tick (issue 17's target: a tick with it on ≤ 2× the tick without).

    .venv/bin/python benchmarks/cpu_tick.py [--ticks 60] [--host-processes 2000] [--busy-services 50]
                                            [--kernel-threads 0] [--unseen]

A simulated node, 8 GPUs × 64 time-sliced processes plus ``--host-processes`` CPU-only ones (2 sockets),
its /proc and /sys written as files by the simulator in a temporary directory. Three pipelines run against the
same node and clock, their ticks interleaved (the order reverses every tick), so all see the same machine:

- ``off`` — the GPU path: nvml + procfs (``cpu_time: false``) → idle → attribution → energy → prometheus;
- ``on``  — the same plus rapl, procfs with ``cpu_time: true`` and its defaults otherwise, and
  ``cpu_attribution`` after energy: what a user's configuration gets. procfs's ``cgroup_root`` (``auto``) finds
  the simulator's cgroup v2 tree (``ProcfsWriter(cgroups=True)`` writes each cgroup's ``cpu.stat``), so a
  process whose cgroup's usage did not move is not read again;
- ``every`` — ``on`` with ``cgroup_root: ""``: every process's stat read every tick;
- ``unseen`` (only with ``--unseen``) — ``on`` with ``cpu_attribution: {unseen: containers}``: procfs also gives
  each container's cgroup CPU time (``ContainerCpuTime``), and each container is billed the time no listed process
  carried. On this node the containers are the 8 GPU pods' (64 processes each, kubepods cgroups); the host
  services are systemd services (``/system.slice``, no container id), so they cost it nothing. The simulated
  cgroups' usage is their processes' sum, so no container has unseen time: this measures the reading and the
  weighing, which a real node pays whatever the unseen time (billing it adds a weight per container with some to
  the apportioning, and its container's and pod's series). The run prints, per tick, how many containers' usage
  ``cpu_attribution`` was given and how many it billed unseen time.

Per tick: the process's CPU time over the tick, less the simulated NVML library's own CPU (metered around
each of its calls: a real driver's work is in C), is wattpipe's own CPU; ``cpu_attribution``'s own CPU and
the Prometheus render are metered too. The figures are ratios within one run: this machine is noisy.
Writing the /proc and /sys files between ticks (a kernel's work on a real node) is outside every measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pynvml
from tick_cost import Meter, MeteredLibrary  # the same metering as the tick benchmark

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry, call_optional
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.runtime import PipelineRunner, settle_heap
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.scale import scale_scenario

GPU = """
receivers:
  nvml: {required: true, device_timeout: 30s}
  procfs: {root: "ROOT/proc", cpu_time: false}
processors:
  idle:
  attribution:
  energy:
exporters:
  prometheus: {listen: "127.0.0.1:0"}
service:
  telemetry: {listen: ""}
  pipelines:
    metrics: {interval: 5s, receiver_timeout: 60s, receivers: [nvml, procfs],
              processors: [idle, attribution, energy], exporters: [prometheus]}
"""
CPU = """
receivers:
  nvml: {required: true, device_timeout: 30s}
  procfs: {root: "ROOT/proc", cpu_time: true CGROUP_ROOT}
  rapl: {root: "ROOT/sys"}
processors:
  idle:
  attribution:
  energy:
  cpu_attribution:
exporters:
  prometheus: {listen: "127.0.0.1:0"}
service:
  telemetry: {listen: ""}
  pipelines:
    metrics: {interval: 5s, receiver_timeout: 60s, receivers: [nvml, procfs, rapl],
              processors: [idle, attribution, energy, cpu_attribution], exporters: [prometheus]}
"""
MODES = ("off", "on", "every")  # the GPU path; + CPU attribution (defaults); the same reading every process
UNSEEN = "unseen"  # --unseen: + cpu_attribution's unseen: containers
LABELS = {
    "off": "off (GPU path)",
    "on": "on (CPU attribution)",
    "every": 'on, procfs cgroup_root ""',
    UNSEEN: "on, unseen: containers",
}


def make_graph(root: Path, mode: str, clock: SteppedClock, components: Registry) -> Graph:
    cgroups = ', cgroup_root: ""' if mode == "every" else ""
    text = textwrap.dedent(GPU if mode == "off" else CPU).replace("CGROUP_ROOT", cgroups).replace("ROOT", str(root))
    if mode == UNSEEN:
        text = text.replace("  cpu_attribution:\n", "  cpu_attribution: {unseen: containers}\n")
    config = load_config_text(text, "bench.yaml", components, {"NODE_NAME": "bench"})
    return build(config, components, clock, Telemetry(clock))


def install_node(
    clock: SteppedClock, workdir: Path, host_processes: int = 2000, busy_services: int = 50, kernel_threads: int = 0
) -> ProcfsWriter:
    """The benchmark's simulated node (8 GPUs × 64 time-sliced processes + the host processes) installed, and the
    writer of its /proc and /sys under ``workdir`` (each cgroup's cpu.stat too, for procfs's cgroup_root)."""
    scenario = scale_scenario(
        mig_gpus=0,
        timesliced_gpus=8,
        processes_per_gpu=64,
        host_processes=host_processes,
        busy_services=busy_services,
        kernel_threads=kernel_threads,
    )
    return ProcfsWriter(simulator.install(scenario, clock), workdir, cgroups=True)


def _meter_parts(graph: Graph, containers: dict[str, list[int]]) -> dict[str, Meter]:
    """Meters around procfs's scan, cpu_attribution and the render; ``containers`` gets each tick's count of
    container CPU time records cpu_attribution was given ("given") and of those it billed unseen time ("billed")."""
    meters = {"cpu_attribution": Meter(), "render": Meter(), "procfs": Meter()}
    table: Any = graph.receivers["procfs"].table  # type: ignore[attr-defined]
    table.scan = meters["procfs"].wrap(table.scan)  # on the receiver's worker thread: metered there
    gpu_pids: Any = graph.receivers["procfs"]._gpu  # type: ignore[attr-defined]
    gpu_pids.scan = meters["procfs"].wrap(gpu_pids.scan)  # cpu_time off: the GPU processes only
    for cid, processor in graph.pipelines[0].processors:
        if cid == "cpu_attribution":
            metered: Any = processor
            process = meters["cpu_attribution"].wrap(processor.process)

            def counted(batch: Any, process: Any = process) -> Any:
                containers.setdefault("given", []).append(len(batch.container_cpu))
                return process(batch)

            metered.process = counted
            if (unseen := getattr(processor, "_unseen", None)) is not None:

                def weighed(*args: Any, weigh: Any = unseen.weigh) -> Any:
                    tick = weigh(*args)
                    containers.setdefault("billed", []).append(len(tick.records))
                    return tick

                unseen.weigh = weighed
    exporter: Any = graph.exporters["prometheus"]
    exporter.render = meters["render"].wrap(exporter.render)
    return meters


async def measure(  # long: one interleaved run, its set-up and teardown
    ticks: int,
    host_processes: int,
    busy_services: int,
    kernel_threads: int,
    workdir: Path,
    modes: tuple[str, ...] = MODES,
    containers: dict[str, dict[str, list[int]]] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """``ticks`` interleaved ticks of each of ``modes``: per mode, its own CPU and its parts' per tick (s);
    ``containers`` gets per mode each tick's count of container CPU time records (see _meter_parts)."""
    counts: dict[str, dict[str, list[int]]] = {} if containers is None else containers
    clock = SteppedClock()
    writer = install_node(clock, workdir, host_processes, busy_services, kernel_threads)
    driver = Meter()
    pynvml.nvmlLib = MeteredLibrary(pynvml.nvmlLib, driver)
    pynvml._nvmlGetFunctionPointer_cache = {}  # re-resolve every symbol through the metered library
    components = Registry.from_entry_points()
    graphs = {mode: make_graph(workdir, mode, clock, components) for mode in modes}
    runners = {mode: PipelineRunner(g, g.pipelines[0]) for mode, g in graphs.items()}
    parts = {mode: _meter_parts(g, counts.setdefault(mode, {})) for mode, g in graphs.items()}
    started_components = [c for g in graphs.values() for c in (*g.exporters.values(), *g.receivers.values())]
    for component in started_components:
        await call_optional(component, "start")
    settle_heap()
    out: dict[str, dict[str, list[float]]] = {m: {"own": [], **{name: [] for name in parts[m]}} for m in modes}
    try:
        for i in range(ticks + 2):  # the first two: every process starts and is read for the first time
            clock.advance(700.0 if i == 0 else 5.0)
            writer.refresh()
            for mode in modes if i % 2 == 0 else modes[::-1]:  # which goes first alternates
                before_driver = driver.cpu_s
                before = {name: m.cpu_s for name, m in parts[mode].items()}
                started = time.process_time()
                await runners[mode].tick()
                spent = time.process_time() - started
                if i >= 2:
                    out[mode]["own"].append(spent - (driver.cpu_s - before_driver))
                    for name, m in parts[mode].items():
                        out[mode][name].append(m.cpu_s - before[name])
    finally:
        for component in started_components:
            await call_optional(component, "shutdown")
        simulator.uninstall()
    return out


def _ratio(raw: dict[str, dict[str, list[float]]], mode: str, base: str) -> tuple[float, float, float]:
    """``mode``'s own CPU over ``base``'s per interleaved tick: the median, its p90, and the means' ratio."""
    ratios = [a / b for a, b in zip(raw[mode]["own"], raw[base]["own"], strict=True) if b > 0]
    # The mean too: procfs reads every process every FULL_READ_EVERY-th tick, which a median hides.
    mean = statistics.fmean(raw[mode]["own"]) / statistics.fmean(raw[base]["own"])
    return statistics.median(ratios), sorted(ratios)[int(0.9 * (len(ratios) - 1))], mean


def report(
    raw: dict[str, dict[str, list[float]]], modes: tuple[str, ...], containers: dict[str, dict[str, list[int]]]
) -> None:
    med = {mode: {name: statistics.median(v) * 1000 for name, v in values.items()} for mode, values in raw.items()}
    for mode in modes:
        m = med[mode]
        print(
            f"  {LABELS[mode]:<38} own {m['own']:6.2f} ms (procfs scan {m['procfs']:5.2f} ms, "
            f"cpu_attribution {m['cpu_attribution']:5.2f} ms, render {m['render']:5.2f} ms)"
        )
    for mode in ("on", "every"):
        ratio, p90, mean = _ratio(raw, mode, "off")
        verdict = "meets" if ratio <= 2.0 else "misses"
        print(
            f"{LABELS[mode].strip()} / off per interleaved tick: median {ratio:.2f}× (p90 {p90:.2f}×, "
            f"means {mean:.2f}×); ≤ 2×: {verdict} it"
        )
    if UNSEEN in modes:
        for base in ("off", "on"):
            ratio, p90, mean = _ratio(raw, UNSEEN, base)
            print(
                f"{LABELS[UNSEEN]} / {base} per interleaved tick: median {ratio:.3f}× (p90 {p90:.3f}×, means {mean:.3f}×)"
            )
        given, billed = containers[UNSEEN]["given"][2:], containers[UNSEEN].get("billed", [0, 0, 0])[2:]
        print(
            f"  per measured tick, containers whose CPU time cpu_attribution was given: {min(given)}–{max(given)} "
            f"({LABELS['on']}: {max(containers['on']['given'])}), billed unseen time: {min(billed)}–{max(billed)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--host-processes", type=int, default=2000)
    parser.add_argument(
        "--busy-services",
        type=int,
        default=50,
        help="how many of the 50 host services (svcN, a cgroup each) run; the others sleep throughout (default 50: all)",
    )
    parser.add_argument(
        "--kernel-threads",
        type=int,
        default=0,
        help="how many of the host processes are kernel threads (root cgroup, one in ten waking briefly; default 0)",
    )
    parser.add_argument(
        "--unseen",
        action="store_true",
        help="also run 'on' with cpu_attribution's unseen: containers, interleaved, as its own row and ratios",
    )
    args = parser.parse_args()
    modes = (*MODES, UNSEEN) if args.unseen else MODES
    containers: dict[str, dict[str, list[int]]] = {}
    with tempfile.TemporaryDirectory(prefix="cpu-tick-") as workdir:
        raw = asyncio.run(
            measure(
                args.ticks,
                args.host_processes,
                args.busy_services,
                args.kernel_threads,
                Path(workdir),
                modes,
                containers,
            )
        )
    print(
        f"8 GPUs × 64 processes + {args.host_processes} host processes ({args.kernel_threads} kernel threads, "
        f"{args.busy_services} of 50 services busy), "
        f"{args.ticks} interleaved ticks per mode; "
        "medians per tick of wattpipe's own CPU (the simulated driver's excluded)"
    )
    report(raw, modes, containers)


if __name__ == "__main__":
    main()
