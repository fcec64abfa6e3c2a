"""The ``cpu`` section of ``wattpipe simulate --report``: CPU energy as attributed beside the simulator's truth.

Collected from every tick as it happens (``CpuCollector.observe``, called by the simulate command's truth
exporter), so processes that exited long ago are still in it. ``true_j`` is the workload's own dynamic CPU
energy (``simulator/cpu_truth.py``) over the window wattpipe attributed (from its first CPU tick's start to
its last tick); ``cpu_s`` is the CPU time wattpipe saw in /proc over that window (null for a process it never
read), ``true_cpu_s`` the truth's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TextIO

from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.simulator.cpu_truth import CpuTruth

__all__ = ["CpuCollector", "cpu_report", "print_cpu_report"]

_CPU = "cpu:"


@dataclass
class _Zone:
    zone: str
    socket: int | None
    counter_mj: int = 0
    idle_mj: int = 0
    active_mj: int = 0
    attributed_mj: int = 0  # the last DeviceTotals' (cumulative over the same ticks)
    unattributed_mj: int = 0
    held_mj: int = 0  # the last record's level: energy measured, held over a failed /proc listing, not yet split


@dataclass
class _Process:
    baseline_cpu_s: float  # its CPU time when first seen (0 when it started inside a CPU tick)
    last_cpu_s: float


@dataclass
class CpuCollector:
    """Sums each tick's CPU zones, keeps each CPU series' last total and each process's CPU time."""

    zones: dict[str, _Zone] = field(default_factory=dict)
    series: dict[tuple[str, str, str, float], tuple[int, dict[str, str]]] = field(default_factory=dict)
    processes: dict[int, _Process] = field(default_factory=dict)
    first_wall_s: float | None = None
    last_wall_s: float | None = None

    def observe(self, batch: Batch) -> None:
        for p in batch.device_power:
            if p.device_type != "cpu":
                continue
            z = self.zones.setdefault(p.device_id, _Zone(p.device_name or "", p.device_index))
            z.counter_mj += p.energy_mj
            z.idle_mj += p.idle_energy_mj
            z.active_mj += p.active_energy_mj
            z.held_mj = p.held_energy_mj
            if self.first_wall_s is None:
                self.first_wall_s = p.time.wall_s - p.interval_s
            self.last_wall_s = p.time.wall_s
        for d in batch.device_totals:
            if d.device_type == "cpu" and d.device_id in self.zones:
                self.zones[d.device_id].attributed_mj = d.attributed_energy_mj
                self.zones[d.device_id].unattributed_mj = d.unattributed_energy_mj
        for t in batch.totals:
            if t.device_id.startswith(_CPU):
                start = t.start.wall_s if t.start is not None else 0.0
                self.series[(t.scope, t.key, t.device_id, start)] = (t.energy_mj, dict(t.extra))
        started = self.first_wall_s
        for h in batch.host_processes:
            if h.cpu_time_s is None:
                continue
            seen = self.processes.get(h.pid)
            if seen is None:
                inside = started is not None and h.start_wall_s is not None and h.start_wall_s >= started
                seen = self.processes[h.pid] = _Process(0.0 if inside else h.cpu_time_s, h.cpu_time_s)
            seen.last_cpu_s = h.cpu_time_s

    def attributed_mj(self, scope: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for (s, key, _, _), (mj, _) in self.series.items():
            if s == scope:
                out[key] = out.get(key, 0) + mj
        return out


def cpu_report(collector: CpuCollector, node: simulator.SimulatedNode) -> dict[str, Any]:
    """The report's ``cpu`` section (zones, processes, containers, pods, VMs; joules)."""
    truth = CpuTruth(node.truth)
    t0 = (collector.first_wall_s or node.start_wall_s) - node.start_wall_s
    t1 = (collector.last_wall_s or node.start_wall_s) - node.start_wall_s
    zones = [
        {
            "zone": z.zone,
            "path": path,
            "counter_j": z.counter_mj / 1000,
            "idle_j": z.idle_mj / 1000,
            "active_j": z.active_mj / 1000,
            "attributed_j": z.attributed_mj / 1000,
            "unattributed_j": z.unattributed_mj / 1000,
            "held_j": z.held_mj / 1000,
            "residual_j": (z.counter_mj - z.idle_mj - z.attributed_mj - z.unattributed_mj - z.held_mj) / 1000,
            "true_counter_j": truth.zone_energy_j(z.zone, z.socket or 0, t0, t1),
        }
        for path, z in sorted(collector.zones.items())
    ]
    by_pid = collector.attributed_mj("process")
    pids = sorted({int(k) for k in by_pid} | {p.pid for p in node.scenario.processes if p.cpu_cores > 0})
    comms = {p.pid: p.comm for p in node.scenario.processes}
    processes = []
    for pid in pids:
        seen = collector.processes.get(pid)
        processes.append(
            {
                "pid": pid,
                "comm": comms.get(pid),
                "true_j": truth.process_energy_j(pid, t0, t1) if pid in node.truth.plans else None,
                "attributed_j": by_pid.get(str(pid), 0) / 1000,
                "cpu_s": seen.last_cpu_s - seen.baseline_cpu_s if seen is not None else None,  # never read: unknown
                "true_cpu_s": truth.process_cpu_s(pid, t0, t1) if pid in node.truth.plans else None,
            }
        )
    return {
        "window_s": [t0, t1],
        "zones": zones,
        "processes": processes,
        **_groups(collector, node, truth, t0, t1),
    }


def _groups(
    collector: CpuCollector, node: simulator.SimulatedNode, truth: CpuTruth, t0: float, t1: float
) -> dict[str, list[dict[str, Any]]]:
    by_container = collector.attributed_mj("container")
    by_pod = collector.attributed_mj("pod")
    containers, pods = [], []
    for pod in node.scenario.pods:
        for container in pod.containers:
            ref = f"{pod.namespace}/{pod.name}/{container.name}"
            containers.append(
                {
                    "namespace": pod.namespace,
                    "pod": pod.name,
                    "name": container.name,
                    "true_j": truth.container_energy_j(ref, t0, t1),
                    "attributed_j": by_container.get(container.id, 0) / 1000,
                }
            )
        pods.append(
            {
                "namespace": pod.namespace,
                "name": pod.name,
                "true_j": truth.pod_energy_j(pod.namespace, pod.name, t0, t1),
                "attributed_j": by_pod.get(pod.uid, 0) / 1000,
            }
        )
    vm_mj = collector.attributed_mj("vm")
    vms = [
        {
            "vm_id": vm_id,
            "vm_name": truth.vm_names.get(vm_id),
            "true_j": truth.sum_energy_j(pids, t0, t1),
            "attributed_j": vm_mj.get(vm_id, 0) / 1000,
        }
        for vm_id, pids in sorted(truth.vms.items())
    ]
    return {"containers": containers, "pods": pods, "vms": vms}


def print_cpu_report(report: dict[str, Any], err: TextIO) -> None:
    print("  cpu (true: each workload's own dynamic CPU energy; idle power is nobody's)", file=err)
    for z in report["zones"]:
        print(
            f"  {z['zone']} {z['path']}: counter {z['counter_j']:.1f} J (true {z['true_counter_j']:.1f}) = idle "
            f"{z['idle_j']:.1f} + attributed {z['attributed_j']:.1f} + unattributed {z['unattributed_j']:.1f}"
            + (f" + held {z['held_j']:.1f}" if z.get("held_j") else "")
            + f" (residual {z['residual_j']:g})",
            file=err,
        )
    rows = [
        (f"cpu pid {p['pid']} {p['comm'] or ''}".rstrip(), p)
        for p in report["processes"]
        if p["true_j"] or p["attributed_j"]
    ]
    rows += [(f"cpu container {c['namespace']}/{c['pod']}/{c['name']}", c) for c in report["containers"]]
    rows += [(f"cpu pod {p['namespace']}/{p['name']}", p) for p in report["pods"]]
    rows += [(f"cpu vm {v['vm_name'] or v['vm_id'][:13]}", v) for v in report["vms"]]
    for what, row in rows:
        true_j = row["true_j"] or 0.0
        error = f"{(row['attributed_j'] - true_j) / true_j * 100:+.2f}%" if true_j else "—"
        print(f"  {what:<40} {row['attributed_j']:>12.1f} {true_j:>12.1f} {error:>8}", file=err)
