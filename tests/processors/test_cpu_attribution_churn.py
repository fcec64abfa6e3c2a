"""CPU attribution under every kind of churn at once: pids reused, failed listings, zones missing a tick, counter
resets, pods named later (and not), records handed on unchanged (the very object) or rebuilt, restarts, series
pruned. Every tick, to the millijoule: each zone type's attributed energy is its process series' growth, each
container's, pod's and VM's growth the sum of its processes', and no series ever falls; and no two series share a
label set (a pid reused by the same program in the same place: its two ended series apart by ``series_start``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import CpuZoneSample, HostProcess, NodeCpuTime, Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.cpu_attribution import CpuAttributionConfig, CpuAttributionProcessor

ZONES = {"intel-rapl:0": ("package", 0), "intel-rapl:1": ("package", 1), "intel-rapl:0:0": ("dram", 0)}
GROUPS: list[dict[str, str]] = [
    {},
    {"container_id": "c0", "pod_uid": "p0", "container_runtime": "containerd"},
    {"container_id": "c0", "pod_uid": "p0"},  # the same container, read with fewer attributes
    {"container_id": "c1", "pod_uid": "p0"},
    {"container_id": "c2", "pod_uid": "p1"},
    {"pod_uid": "p1"},
    {"vm_id": "v0", "hypervisor": "kvm", "vm_name": "guest"},
]
ROSTER: list[dict[str, str]] = [
    {"container_id": "c0", "container_name": "web", "pod_uid": "p0", "pod_name": "shop", "pod_namespace": "prod"},
    {"container_id": "c1", "container_name": "db", "pod_uid": "p0", "pod_name": "shop", "pod_namespace": "prod"},
    {"pod_uid": "p0", "pod_name": "shop", "pod_namespace": "prod"},
    {"pod_uid": "p1", "pod_name": "one", "pod_namespace": "ns"},
]
CPU_S = st.sampled_from([0.0, 0.0, 0.01, 0.5, 2.0])
ACTION = st.one_of(
    st.tuples(st.just("spawn"), st.integers(1, 6), CPU_S, st.integers(0, len(GROUPS) - 1), st.booleans()),
    st.tuples(st.just("exit"), st.integers(1, 6), st.just(0.0)),
    st.tuples(st.just("run"), st.integers(1, 6), CPU_S),
)
TICK = st.fixed_dictionaries(
    {
        "actions": st.lists(ACTION, min_size=1, max_size=6),
        "listed": st.sampled_from([True] * 5 + [False]),
        "missing": st.sampled_from([None] * 5 + list(ZONES)),
        "reset": st.sampled_from([None] * 10 + list(ZONES)),
        "mj": st.lists(st.integers(0, 30_000), min_size=3, max_size=3),
        "active": st.sampled_from([0.0, 0.4, 1.0]),
        "rebuilt": st.sampled_from([False] * 4 + [True]),  # every record a new object with the same values
        "named": st.lists(st.integers(0, len(ROSTER) - 1), max_size=3),
        "restart": st.sampled_from([False] * 12 + [True]),
        "dt": st.sampled_from([5.0] * 4 + [30.0]),
    }
)
CONFIGS = [
    {"terminated_retention": 10.0, "max_terminated": 2},
    {"terminated_retention": 0.0, "max_terminated": 0},
    {"mode": "idle", "idle_w": {"package": 1.0}, "terminated_retention": 10.0, "max_terminated": 3},
]


def processor(config: dict[str, Any], clock: SteppedClock, saved: dict[str, Any] | None) -> CpuAttributionProcessor:
    store = StateStore(None, clock, "n")
    if saved is not None:
        store.put("metrics/cpu_attribution", json.loads(json.dumps(saved)))  # as the state file gives it back
    ctx = make_context("cpu_attribution", clock=clock, pipeline="metrics", state=store)
    proc = CpuAttributionProcessor(CpuAttributionConfig(**config), ctx)
    proc.start()
    return proc


def energies(proc: CpuAttributionProcessor) -> dict[tuple[Any, ...], int]:
    out: dict[tuple[Any, ...], int] = {("process", *k): s.energy_mj for k, s in proc.series.processes.items()}
    out |= {k: s.energy_mj for k, s in proc.series.groups.items()}
    return out


def attributed(proc: CpuAttributionProcessor) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in proc.zone_totals.values():
        assert t.idle_mj + t.active_mj == t.energy_mj
        out[t.zone] = out.get(t.zone, 0) + t.active_mj - t.unattributed_mj
    return out


def grown_sums(
    grew: Mapping[tuple[Any, ...], int], groups_of: Mapping[tuple[int, int], Mapping[str, str]]
) -> tuple[dict[str, int], dict[tuple[str, str, str], int]]:
    """The process series' growth (``energies``' keys) summed per zone type, and per container, pod and VM
    (``groups_of``: (pid, start) → its group attributes)."""
    by_zone: dict[str, int] = {}
    by_group: dict[tuple[str, str, str], int] = {}
    for key, mj in grew.items():
        if key[0] != "process":
            continue
        _, pid, began, zone = key
        by_zone[zone] = by_zone.get(zone, 0) + mj
        member = groups_of[(pid, began)]
        for scope, field in (("container", "container_id"), ("pod", "pod_uid"), ("vm", "vm_id")):
            if field in member:
                gkey = (scope, member[field], zone)
                by_group[gkey] = by_group.get(gkey, 0) + mj
    return by_zone, by_group


def _plain_tick(actions: list[tuple[Any, ...]], mj: list[int], active: float) -> dict[str, Any]:
    return {"actions": actions, "listed": True, "missing": None, "reset": None, "mj": mj, "active": active,
            "rebuilt": False, "named": [], "restart": False, "dt": 5.0}  # fmt: skip


# Found: pid 1 spawned again in the same place, both with energy in one zone, then gone: two ended series of
# one label set (the later one now carries series_start).
_REUSED = [
    _plain_tick([("spawn", 1, 0.0, 0, False)], [0, 0, 0], 0.0),
    _plain_tick([("spawn", 1, 0.01, 0, True)], [0, 1, 0], 1.0),
    _plain_tick([("spawn", 1, 0.01, 0, True)], [0, 1, 0], 1.0),
    _plain_tick([("exit", 1, 0.0)], [0, 0, 0], 0.0),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CONFIGS), st.lists(TICK, min_size=4, max_size=25))
@example(CONFIGS[0], _REUSED)
# long: one simulated node driven through a plan, its checks after every tick
def test_every_tick_conserves_and_sums_through_reuse_gaps_naming_restarts_and_pruning(
    config: dict[str, Any], plan: list[dict[str, Any]]
) -> None:
    clock = SteppedClock()
    proc = processor(config, clock, None)
    procs: dict[int, HostProcess] = {}
    groups_of: dict[tuple[int, int], dict[str, str]] = {}  # (pid, start) → its container, pod, VM
    uj, epoch = dict.fromkeys(ZONES, 0), dict.fromkeys(ZONES, 0)
    total_s, active_s, start = 1000.0, 100.0, 1000
    before, before_attributed = energies(proc), attributed(proc)
    held: dict[str, int] = {}  # each zone's held level, as its last record said
    for tick in plan:
        now = clock.now()
        for kind, pid, cpu_s, *spawn in tick["actions"]:
            if kind == "spawn":
                group, started_now = spawn
                start += 1  # a pid spawned again is a new process: a new start time
                began = now.wall_s - (0.0 if started_now else 100.0)
                procs[pid] = HostProcess(
                    time=now, pid=pid, start_time_ticks=start, cpu_time_s=cpu_s, start_wall_s=began, **GROUPS[group]
                )
                groups_of[(pid, start)] = GROUPS[group]
            elif kind == "exit":
                procs.pop(pid, None)
            elif pid in procs and cpu_s:  # a process that ran nothing keeps its record (the very object)
                procs[pid] = replace(procs[pid], time=now, cpu_time_s=(procs[pid].cpu_time_s or 0.0) + cpu_s)
        if tick["rebuilt"]:
            procs = {pid: replace(p) for pid, p in procs.items()}
        if tick["reset"] is not None:
            epoch[tick["reset"]] += 1
        for path, mj in zip(ZONES, tick["mj"], strict=True):
            uj[path] += mj * 1000 + 7
        total_s += 4 * tick["dt"]
        active_s += 4 * tick["dt"] * tick["active"]
        zones = tuple(
            CpuZoneSample(time=now, zone=zone, path=path, socket=socket, energy_uj=uj[path], counter_epoch=epoch[path])
            for path, (zone, socket) in ZONES.items()
            if path != tick["missing"]
        )
        fields: dict[str, Any] = {
            "cpu_zones": zones,
            "node_cpu": (NodeCpuTime(time=now, total_s=total_s, active_s=active_s),),
            "workloads": tuple(Workload(time=now, pid=None, listed="api", **ROSTER[i]) for i in set(tick["named"])),
        }
        if tick["listed"]:
            fields["host_processes"] = tuple(procs.values())
        out = proc.process(Batch(time=now, interval_s=5.0, node="n").replace(**fields))
        for power in out.device_power:  # (energy held over a failed listing: processors/_cpu_hold.py)
            change = power.held_energy_mj - held.get(power.device_id, 0)
            assert power.idle_energy_mj + power.active_energy_mj + change == power.energy_mj
            held[power.device_id] = power.held_energy_mj
        label_sets = [(t.scope, t.key, t.device_id, t.state, t.extra) for t in out.totals]
        assert len(set(label_sets)) == len(label_sets), label_sets  # a reused pid's two ended series too
        after, after_attributed = energies(proc), attributed(proc)
        grew = {k: v - before.get(k, 0) for k, v in after.items()}
        assert all(v >= 0 for k, v in grew.items() if k in before), grew  # no series falls
        by_zone, by_group = grown_sums(grew, groups_of)
        assert by_zone == {z: mj - before_attributed.get(z, 0) for z, mj in after_attributed.items() if z in by_zone}
        assert sum(after_attributed.values()) - sum(before_attributed.values()) == sum(by_zone.values())
        assert {k: v for k, v in by_group.items() if v} == {k: v for k, v in grew.items() if k[0] != "process" and v}
        before, before_attributed = after, after_attributed
        if tick["restart"]:
            proc = processor(config, clock, proc.snapshot())
            held = {}  # (saved as unattributed)
        clock.advance(tick["dt"])
