"""Benchmark-sized scenarios, generated: many GPUs, MIG instances, time-sliced and host processes."""

from __future__ import annotations

from typing import Any

from wattpipe.simulator.scenario import Scenario, parse_scenario

__all__ = ["churn_scenario", "scale_scenario"]


def scale_scenario(
    mig_gpus: int = 8,
    timesliced_gpus: int = 8,
    processes_per_gpu: int = 64,
    host_processes: int = 2000,
    duration_s: float = 3600.0,
    busy_services: int = 50,
    kernel_threads: int = 0,
) -> Scenario:
    """A node with ``mig_gpus`` H100s split into seven 1g instances (one pod and process each),
    ``timesliced_gpus`` H100s shared by ``processes_per_gpu`` processes with changing utilisation, and
    ``host_processes`` CPU-only processes, process ``n`` named ``svc{n % 50}`` (one service, and one cgroup, per
    name) using ``0.01 · (n % 5)`` of a core: 4 in 5 run all the time. ``busy_services`` < 50: only the
    services ``svc0`` … below it run at all, the others sleep throughout (a node of mostly idle services).
    ``kernel_threads``: that many of the host processes are kernel threads instead (``kworker/N``, in the root
    cgroup as on a real node, no exe), one in ten waking for 0.2 % of a core, the others asleep.
    Deterministic: the same arguments give the same node."""
    gpus: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    pid = 10_000
    instances = [{"gi": 7 + i, "profile": "1g.10gb"} for i in range(7)]
    for index in range(mig_gpus):
        gpus.append({"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700, "mig": {"instances": instances}})
        for inst in instances:
            name = f"mig-{index}-{inst['gi']}"
            device = {"resource": "nvidia.com/mig-1g.10gb", "gpu": index, "gi": inst["gi"]}
            pods.append({"name": name, "namespace": "bench", "containers": [{"name": "main", "devices": [device]}]})
            util = [[0, 0.2 + 0.1 * (pid % 7)], [duration_s / 2, 0.9]]
            processes.append({"pid": pid, "comm": "python", "container": f"bench/{name}/main", "gpu": index,
                              "gi": inst["gi"], "util": util, "cpu_cores": 0.5, "memory_mib": 4000})  # fmt: skip
            pid += 1
    for offset in range(timesliced_gpus):
        index = mig_gpus + offset
        gpus.append({"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700})
        name = f"shared-{index}"
        pods.append({"name": name, "namespace": "bench", "containers": [{"name": "main", "devices": [{"gpu": index}]}]})
        for n in range(processes_per_gpu):
            start_s = (n * 37) % 600
            util = [[0, 0.01 * (n % 10)], [start_s + 300, 0.02 * (n % 7)], [start_s + 900, 0.015]]
            processes.append({"pid": pid, "comm": "worker", "container": f"bench/{name}/main", "gpu": index,
                              "dynamic_w": 10 + n % 20, "util": util, "start_s": start_s,
                              "cpu_cores": 0.1, "memory_mib": 512})  # fmt: skip
            pid += 1
    for n in range(kernel_threads):
        cores = 0.002 if n % 10 == 0 else 0.0
        processes.append({"pid": pid, "comm": f"kworker/{n}", "cgroup": "/", "cpu_cores": cores})
        pid += 1
    for n in range(host_processes - kernel_threads):
        cores = 0.01 * (n % 5) if n % 50 < busy_services else 0.0
        processes.append({"pid": pid, "comm": f"svc{n % 50}", "cpu_cores": cores, "start_s": n % 100})
        pid += 1
    data = {"node": {"name": "bench-node"}, "gpus": gpus, "pods": pods, "processes": processes,
            "cpu": {"packages": 2, "cores": 128}}  # fmt: skip
    return parse_scenario(data, source="scale_scenario")


def churn_scenario(ticks: int = 2000, per_tick: int = 20, tick_s: float = 1.0) -> Scenario:
    """Process churn on one H100: ``per_tick`` new processes every ``tick_s`` for ``ticks`` ticks, each
    living one or two ticks (drill 8a's shape: the first start is at 5.5 ticks, mid-tick, so the first
    polls see an idle GPU). Process ``j`` of a tick draws ``10 + j`` W at ``0.2 + 0.02·j`` utilisation."""
    processes = [
        {"pid": 10_000 + k * per_tick + j, "comm": f"job{j}", "gpu": 0, "dynamic_w": 10 + j,
         "util": [[0, min(1.0, 0.2 + 0.02 * j)]], "start_s": (5.5 + k) * tick_s,
         "end_s": (5.5 + k + (1 if j % 2 else 2)) * tick_s}
        for k in range(ticks)
        for j in range(per_tick)
    ]  # fmt: skip
    data = {"node": {"name": "churn-node", "sample_buffer": 1000},
            "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}], "processes": processes}  # fmt: skip
    return parse_scenario(data, source="churn_scenario")
