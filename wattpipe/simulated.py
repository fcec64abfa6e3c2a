"""``wattpipe demo`` and ``wattpipe simulate``: the pipeline on a simulated GPU node.

``demo`` runs in real time and says where to look. ``simulate`` runs on a stepped clock, as fast as the
machine allows, then compares what wattpipe attributed with the simulator's ground truth (a table on
stderr, and a JSON report with ``--report``). The comparison is taken from every tick as it happens,
so processes that exited long ago (and left the exported totals) are still in it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from wattpipe import (
    simulator,
    steps,  # the shared loading, building and running steps
)
from wattpipe._sim_state import state_for_simulated_node
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Clock, RealClock, SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import Config, ConfigError
from wattpipe.pipeline.graph import Graph
from wattpipe.pipeline.records import Saturation
from wattpipe.pipeline.runtime import Service
from wattpipe.progress import SimulationProgress
from wattpipe.simulated_cpu import CpuCollector, cpu_report, print_cpu_report
from wattpipe.simulator.k8s_cluster_api import start_k8s_cluster_api
from wattpipe.simulator.saturation_truth import saturation_rows
from wattpipe.steps import EXIT_CONFIG, EXIT_OK

__all__ = ["TruthCollector", "cmd_demo", "cmd_simulate", "truth_report"]

log = logging.getLogger("wattpipe")


class TruthCollector:
    """An exporter the simulate command adds to every pipeline: sums each tick's energy as attributed."""

    def __init__(self) -> None:
        self.ticks = 0
        self.process_mj: dict[tuple[int, str], int] = {}
        self.device: dict[str, dict[str, int]] = {}
        self.idle_w: dict[str, float | None] = {}
        self.idle_source: dict[str, str | None] = {}
        # Per device, the (start, end) wall times of the intervals wattpipe declared it could not split
        # (an outage's gap, a failed process listing): their energy is unattributed by design.
        self.unattributable: dict[str, list[tuple[float, float]]] = {}
        self.saturation: tuple[Saturation, ...] = ()  # the last tick's: the last complete window
        self.cpu = CpuCollector()  # the CPU zones and what cpu_attribution billed (simulated_cpu.py)

    async def export(self, batch: Batch) -> None:
        self.ticks += 1
        self.cpu.observe(batch)
        if "saturation" in batch.present:
            self.saturation = batch.saturation
        answered = set()
        for p in batch.device_power:
            if p.device_type == "cpu":
                continue  # in the cpu section
            answered.add(p.device_id)
            d = self.device.setdefault(p.device_id, {"counter": 0, "idle": 0, "attributed": 0, "unattributed": 0})
            d["counter"] += p.energy_mj
            d["idle"] += p.idle_energy_mj
            d["held"] = p.held_energy_mj  # a level: energy measured and not yet split (MIG, or idle pending)
            self.idle_w[p.device_id] = p.idle_w
            self.idle_source[p.device_id] = p.idle_source
            if p.unattributable is not None:
                self.unattributable.setdefault(p.device_id, []).append((p.time.wall_s - p.interval_s, p.time.wall_s))
        for s in batch.shares:
            d = self.device.setdefault(s.device_id, {"counter": 0, "idle": 0, "attributed": 0, "unattributed": 0})
            if s.device_id not in answered:
                # Released by a hold for a device with no DevicePower this tick (down, or lost for good: past
                # idle_wait or mig_max_wait): no record says the new level, which falls by the shares (no energy,
                # no idle this tick), as the energy processor counts it.
                d["held"] = d.get("held", 0) - s.energy_mj
            if s.pid is None:
                d["unattributed"] += s.energy_mj
            else:
                d["attributed"] += s.energy_mj
                key = (s.pid, s.device_id)
                self.process_mj[key] = self.process_mj.get(key, 0) + s.energy_mj


def truth_report(collector: TruthCollector, node: simulator.SimulatedNode) -> dict[str, Any]:
    """The simulate report: attributed energy beside the ground truth, per device, process, container, pod."""
    t_s = node.t_s()
    processes, by_container, by_pod = _process_rows(collector, node, t_s)
    for container, sums in by_container.items():
        sums[0] = node.truth.container_energy_j(container, t_s)
    for (namespace, pod), sums in by_pod.items():
        sums[0] = node.truth.pod_energy_j(namespace, pod, t_s)
    saturation = saturation_rows(collector.saturation, node)
    return {
        "ticks": collector.ticks,
        "simulated_s": t_s,
        "devices": _device_rows(collector, node),
        "processes": processes,
        "containers": [
            {
                "namespace": c.split("/")[0],
                "pod": c.split("/")[1],
                "name": c.split("/")[2],
                "true_j": s[0],
                "true_unattributable_j": s[2],
                "attributed_j": s[1],
            }
            for c, s in sorted(by_container.items())
        ],
        "pods": [
            {"namespace": ns, "name": pod, "true_j": s[0], "true_unattributable_j": s[2], "attributed_j": s[1]}
            for (ns, pod), s in sorted(by_pod.items())
        ],
        **({"saturation": saturation} if saturation else {}),  # only where a saturation processor ran
        **({"cpu": cpu_report(collector.cpu, node)} if collector.cpu.zones else {}),
    }


def _device_rows(collector: TruthCollector, node: simulator.SimulatedNode) -> list[dict[str, Any]]:
    """Per device: the counter's energy, how it was split, and the true idle power beside the detected one."""
    uuids = [g.uuid for g in node.scenario.gpus]
    devices = []
    for uuid, d in sorted(collector.device.items()):
        gpu = uuids.index(uuid) if uuid in uuids else None
        held = d.get("held", 0)
        residual = d["counter"] - d["idle"] - d["attributed"] - d["unattributed"] - held
        devices.append(
            {
                "uuid": uuid,
                "counter_j": d["counter"] / 1000,
                "idle_j": d["idle"] / 1000,
                "attributed_j": d["attributed"] / 1000,
                "unattributed_j": d["unattributed"] / 1000,
                "held_j": held / 1000,
                "residual_j": residual / 1000,
                "true_idle_w": node.scenario.gpus[gpu].idle_w if gpu is not None else None,
                "detected_idle_w": collector.idle_w.get(uuid),
                "detected_idle_source": collector.idle_source.get(uuid),
            }
        )
    return devices


def _process_rows(
    collector: TruthCollector, node: simulator.SimulatedNode, t_s: float
) -> tuple[list[dict[str, Any]], dict[str, list[float]], dict[tuple[str, str], list[float]]]:
    """Per (process, device): true and attributed energy; and per container and pod, the attributed and
    true-unattributable sums ([true (filled by the caller), attributed, unattributable], J)."""
    uuids = [g.uuid for g in node.scenario.gpus]
    processes = []
    by_container: dict[str, list[float]] = {}
    by_pod: dict[tuple[str, str], list[float]] = {}
    specs = {p.pid: p for p in node.scenario.processes}
    attributed_mj = dict(collector.process_mj)
    for gpu_process in node.scenario.processes:  # a GPU process billed nothing at all is in the report too
        if gpu_process.gpu is not None and node.truth.process_energy_j(gpu_process.pid, t_s) > 0:
            attributed_mj.setdefault((gpu_process.pid, uuids[gpu_process.gpu]), 0)
    for (pid, uuid), mj in sorted(attributed_mj.items()):
        true_j = node.truth.process_energy_j(pid, t_s)
        unattributable_j = _true_in(collector.unattributable.get(uuid, []), pid, node)
        processes.append(
            {
                "pid": pid,
                "gpu_uuid": uuid,
                "true_j": true_j,
                "true_unattributable_j": unattributable_j,
                "attributed_j": mj / 1000,
            }
        )
        spec = specs.get(pid)
        if spec is not None and spec.container:
            # Grouped by the scenario's own membership: what the Kubernetes processors will have to find.
            namespace, pod, _ = spec.container.split("/")
            for sums in (
                by_container.setdefault(spec.container, [0.0] * 3),
                by_pod.setdefault((namespace, pod), [0.0] * 3),
            ):
                sums[1] += mj / 1000
                sums[2] += unattributable_j
    return processes, by_container, by_pod


def _true_in(windows: list[tuple[float, float]], pid: int, node: simulator.SimulatedNode) -> float:
    """A process's true energy inside the intervals its device's energy could not be split (J)."""
    total_j = 0.0
    for start_wall_s, end_wall_s in windows:
        t0_s, t1_s = start_wall_s - node.start_wall_s, end_wall_s - node.start_wall_s
        total_j += node.truth.process_energy_j(pid, t1_s) - node.truth.process_energy_j(pid, max(0.0, t0_s))
    return total_j


def print_report(report: dict[str, Any], err: TextIO) -> None:
    print(
        f"\nattributed vs true energy after {report['simulated_s']:g} s of node time ({report['ticks']} ticks)",
        file=err,
    )
    print(f"  {'what':<40} {'wattpipe J':>12} {'true J':>12} {'error':>8}", file=err)
    for d in report["devices"]:
        idle, source = d["detected_idle_w"], d["detected_idle_source"]
        print(
            f"  gpu {d['uuid'][:12]}…  counter {d['counter_j']:.1f} J = idle {d['idle_j']:.1f} + attributed "
            f"{d['attributed_j']:.1f} + unattributed {d['unattributed_j']:.1f}"
            + (f" + held {d['held_j']:.1f}" if d["held_j"] else "")
            + f" (residual {d['residual_j']:g}); "
            f"idle {'unknown' if idle is None else f'{idle:.1f} W, {source}'} (true {d['true_idle_w']} W)",
            file=err,
        )
    if any(d["held_j"] for d in report["devices"]):
        print(
            "  (held: energy measured but not yet split: on a MIG GPU waiting for dcgm-exporter's next collection,\n"
            "   elsewhere for idle to be known (at most attribution's idle_wait); the processes that used it are\n"
            "   short of it below: end a run on a collection, or once idle is known, to compare them whole)",
            file=err,
        )
    for p in report["processes"]:
        _row(f"pid {p['pid']}", p, err)
    for c in report["containers"]:
        _row(f"container {c['namespace']}/{c['pod']}/{c['name']}", c, err)
    for pod in report["pods"]:
        _row(f"pod {pod['namespace']}/{pod['name']}", pod, err)
    if "cpu" in report:
        print_cpu_report(report["cpu"], err)
    print(
        "  (a process's true energy is its own dynamic power; until an idle baseline is known, idle energy\n"
        "   counts as active and goes to the processes: see docs/attribution.md. The error is against the\n"
        "   true energy outside the ticks wattpipe left unattributed on purpose (outages, failed process\n"
        "   listings), which is shown apart.)",
        file=err,
    )


def _row(what: str, row: dict[str, Any], err: TextIO) -> None:
    attributed_j, true_j = row["attributed_j"], row["true_j"] - row["true_unattributable_j"]
    error = f"{(attributed_j - true_j) / true_j * 100:+.2f}%" if true_j else "—"
    apart = f"  ({row['true_unattributable_j']:.1f} J left unattributed)" if row["true_unattributable_j"] else ""
    print(f"  {what:<40} {attributed_j:>12.1f} {true_j:>12.1f} {error:>8}{apart}", file=err)


# --- commands -------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The whole pipeline on a simulated GPU node, in real time: what wattpipe does, with no GPU."""
    return _on_simulated_node(args, RealClock(), out, err, stepped=False)


def cmd_simulate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The pipeline on a simulated node under a stepped clock, then attributed vs true energy."""
    return _on_simulated_node(args, SteppedClock(), out, err, stepped=True)


def _on_simulated_node(args: argparse.Namespace, clock: Clock, out: TextIO, err: TextIO, stepped: bool) -> int:
    registry = steps.load_registry(err)
    try:
        node = simulator.install(args.scenario, clock)
    except (simulator.ScenarioError, OSError) as exc:
        return steps.scenario_refused(exc, args.scenario, err)
    try:
        with tempfile.TemporaryDirectory(prefix="wattpipe-sim-") as tmp:
            # Every face stops with the node.
            dcgm = simulator.start_dcgm_exporter(node)
            kubelet = simulator.start_kubelet(node, socket_dir=Path(tmp) / "pod-resources")
            api = simulator.start_k8s_api(node)
            kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
            cluster = start_k8s_cluster_api(node).write_kubeconfig(Path(tmp) / "cluster-kubeconfig")
            # What a config may point at on the simulated node: /proc, dcgm-exporter, the kubelet's
            # pod-resources socket, and the API server (KUBECONFIG, NODE_NAME as the downward API gives it);
            # the scenario's wider cluster (pods of every node, DRA claims and slices) for the k8s_cluster
            # and dra receivers' kubeconfig option.
            faces = {
                "WATTPIPE_CLUSTER_KUBECONFIG": str(cluster),
                "WATTPIPE_PROC_ROOT": str(Path(tmp) / "proc"),
                "WATTPIPE_SYS_ROOT": str(Path(tmp) / "sys"),  # its RAPL zones, for the rapl receiver
                "WATTPIPE_DCGM_ENDPOINT": dcgm.url,
                "WATTPIPE_PODRESOURCES_ENDPOINT": kubelet.endpoint,
                "KUBECONFIG": str(kubeconfig),
                "NODE_NAME": node.scenario.node.name,
            }
            with _environment(faces):
                return _run_simulated(args, clock, registry, node, Path(tmp), err, stepped)
    finally:
        simulator.uninstall()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_simulated(
    args: argparse.Namespace,
    clock: Clock,
    registry: Registry,
    node: simulator.SimulatedNode,
    tmp: Path,
    err: TextIO,
    stepped: bool,
) -> int:
    config = steps.load_or_report(args.config, registry, err)
    if config is None:
        return EXIT_CONFIG
    level = args.log_level or config.service.telemetry.log_level
    steps.setup_logging(level)
    config = state_for_simulated_node(config, tmp, stepped)  # never a real node's state file
    if stepped:
        config = _without_listeners(config)
        config = _with_console_tables(config, registry) if args.console else _without_console_tables(config)
    elif args.port is not None:
        try:
            config = steps.with_port(config, args.port)
        except ConfigError as exc:
            print(f"error: {exc}", file=err)
            return EXIT_CONFIG
    graph = steps.build_or_report(config, registry, clock, err)
    if graph is None:
        return EXIT_CONFIG
    # One collector per pipeline: two pipelines attributing the same node would otherwise count it twice.
    collectors = {p.name: TruthCollector() for p in graph.pipelines}
    if stepped:
        graph = _with_exporters(graph, collectors)
    interval = min(p.config.interval for p in graph.pipelines)
    max_ticks = steps.ticks_to_run(graph, args.ticks, args.duration)
    log.info("simulated node %s: %d GPU(s) from %s", node.scenario.node.name, len(node.scenario.gpus), args.scenario)
    total_s = (max_ticks - 1) * interval if max_ticks else 0.0
    if stepped and max_ticks:
        _say_after_the_run(node, args.scenario, node.t_s() + total_s, err)
    progress = SimulationProgress(total_s, node.t_s, err, show=stepped and level in ("debug", "info"))
    say = _say_where_to_look(graph, config, err) if not stepped else None
    service = Service(graph, before_tick=_before_tick(config, node, tmp, progress, say))
    with progress:
        code = asyncio.run(steps.run_service(graph, max_ticks=max_ticks, service=service))
    if stepped and code == EXIT_OK:
        print(progress.summary(), file=err)
        report = _reports(collectors, node)
        print_report(report, err)
        if args.report:
            Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
            print(f"report written to {args.report}", file=err)
    return code


def _say_after_the_run(node: simulator.SimulatedNode, scenario: str, end_s: float, err: TextIO) -> None:
    """A scenario's processes that start, and ``moves`` that happen, past the run's end never do: said once each,
    not dropped in silence."""
    for index, process in enumerate(node.scenario.processes):
        named = f"processes.{index} (pid {process.pid})"
        if process.start_s >= end_s:
            print(
                f"note: scenario {scenario}: {named} starts at {process.start_s:g} s, after the run's end "
                f"({end_s:g} s): it never runs",
                file=err,
            )
            continue  # (its moves with it)
        for n, move in enumerate(process.moves):
            if move.at_s > end_s:
                where = f"{named}.moves.{n} at {move.at_s:g} s"
                print(
                    f"note: scenario {scenario}: {where} is after the run's end ({end_s:g} s): it never happens",
                    file=err,
                )


def _before_tick(
    config: Config,
    node: simulator.SimulatedNode,
    tmp: Path,
    progress: SimulationProgress,
    say: Callable[[], None] | None,
) -> Callable[[], None]:
    """What runs before each tick: /proc and /sys written as the node is at this tick's time (when a procfs
    or rapl receiver reads them), the progress bar moved on, and (``demo``) where to look, once."""
    writer = (
        # The node's CPUs too (kepler_node_cpu_info), and its cgroups' cpu.stat (procfs cgroup_root: auto finds them)
        simulator.ProcfsWriter(node, tmp, cpuinfo=True, cgroups=True)
        if any(cid.split("/")[0] in ("procfs", "rapl") for cid in config.receivers)
        else None
    )

    def before_tick() -> None:
        if say is not None:
            say()
        if writer is not None:
            writer.refresh()
        progress.tick()

    return before_tick


def _without_console_tables(config: Config) -> Config:
    """``simulate`` prints per-tick tables only with ``--console``: a console exporter in table format is
    taken out of every pipeline (one writing JSON lines, for a program, stays)."""
    tables = {cid for cid, cfg in config.exporters.items() if cid.split("/")[0] == "console" and _is_table(cfg)}
    if not tables:
        return config
    pipelines = {
        name: pipe.model_copy(update={"exporters": [e for e in pipe.exporters if e not in tables]})
        for name, pipe in config.service.pipelines.items()
    }
    service = config.service.model_copy(update={"pipelines": pipelines})
    exporters = {cid: cfg for cid, cfg in config.exporters.items() if cid not in tables}
    return dataclasses.replace(config, exporters=exporters, service=service)


def _with_console_tables(config: Config, registry: Registry) -> Config:
    """``--console`` on a pipeline without a console exporter in table format: one added to every pipeline."""
    factory = registry.get("exporter", "console")
    if factory is None or any(cid.split("/")[0] == "console" and _is_table(c) for cid, c in config.exporters.items()):
        return config
    cid = "console/simulate"
    pipelines = {
        name: pipe.model_copy(update={"exporters": [*pipe.exporters, cid]})
        for name, pipe in config.service.pipelines.items()
    }
    exporters = {**config.exporters, cid: factory.config_model.model_validate({})}
    return dataclasses.replace(
        config, exporters=exporters, service=config.service.model_copy(update={"pipelines": pipelines})
    )


def _is_table(cfg: object) -> bool:
    return getattr(cfg, "format", None) == "table"


def _without_listeners(config: Config) -> Config:
    """A stepped node's listeners could not be scraped in time anyway, and fixed ports could clash."""
    telemetry = config.service.telemetry.model_copy(update={"listen": ""})
    service = config.service.model_copy(update={"telemetry": telemetry})
    exporters = {
        cid: cfg.model_copy(update={"listen": "127.0.0.1:0"}) if "listen" in type(cfg).model_fields else cfg
        for cid, cfg in config.exporters.items()
    }
    return dataclasses.replace(config, exporters=exporters, service=service)


def _with_exporters(graph: Graph, collectors: dict[str, TruthCollector]) -> Graph:
    pipelines = tuple(
        dataclasses.replace(p, exporters=(*p.exporters, ("simulate/truth", collectors[p.name])))
        for p in graph.pipelines
    )
    return dataclasses.replace(graph, pipelines=pipelines)


def _reports(collectors: dict[str, TruthCollector], node: simulator.SimulatedNode) -> dict[str, Any]:
    """The report of the first pipeline that measured a device; every other such pipeline's own report
    is under ``other_pipelines`` (pipelines that share a receiver each get every read: they agree)."""
    reports = {name: truth_report(c, node) for name, c in collectors.items() if c.device or c.cpu.zones}
    if not reports:
        return truth_report(next(iter(collectors.values())), node)
    first, *others = reports
    report = {**reports[first], "pipeline": first}
    if others:
        report["other_pipelines"] = {name: reports[name] for name in others}
    return report


def _say_where_to_look(graph: Graph, config: Config, err: TextIO) -> Callable[[], None]:
    """What ``demo`` prints on its first tick, once the listeners are up: the URLs they really serve (a
    port taken stops the demo before, with what to change)."""
    said = False

    def say() -> None:
        nonlocal said
        if said:
            return
        said = True
        for cid, exporter in graph.exporters.items():
            try:
                url = getattr(exporter, "url", None)
            except RuntimeError:  # not started
                continue
            if isinstance(url, str) and url.startswith("http"):
                print(f"exporter {cid}: curl {url}/metrics", file=err)
        listen = config.service.telemetry.listen
        if listen and not listen.endswith(":0"):  # port 0: the log line 'telemetry listening on' has it
            print(f"wattpipe's own health: curl http://{listen}/readyz", file=err)

    return say
