"""``cpu_attribution``'s ``unseen: containers``: a container's cgroup CPU time that no listed process carried (its
short-lived processes, its processes' last seconds before they exited) joins the weights and is billed to the
container and its pod (processors/_cpu_unseen.py); ``none`` (the default) is the seed's model, unchanged."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.processors.test_cpu_attribution import Node, processor, restarted, step, totals
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records_cpu import ContainerCpuTime
from wattpipe.pipeline.state import StateStore
from wattpipe.processors._cpu_gap import GAP_MAX_S
from wattpipe.processors.cpu_attribution import CpuAttributionConfig

ZONE = {"intel-rapl:0": ("package", 0, 0, 0)}


@dataclass
class CgroupNode(Node):
    """A Node whose containers' cgroups are read too: container id → (pod UID, usage s); ``cgroups_read`` False:
    no cgroup v2 mount (the field absent); ``since_s``: each container's records' (not said where absent);
    ``unread``: the containers with no record this tick; ``made_after_s``: each container's records' (since when
    its cgroups were made)."""

    cgroups: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    cgroups_read: bool = True
    since_s: dict[str, float] = field(default_factory=dict)
    unread: set[str] = field(default_factory=set)
    made_after_s: dict[str, float] = field(default_factory=dict)

    def batch(self) -> Batch:
        out = super().batch()
        if not self.cgroups_read:
            return out
        now = self.clock.now()
        records = tuple(
            ContainerCpuTime(
                time=now,
                container_id=cid,
                container_runtime="containerd",
                pod_uid=pod,
                usage_s=s,
                since_s=self.since_s.get(cid),
                made_after_s=self.made_after_s.get(cid),
            )
            for cid, (pod, s) in self.cgroups.items()
            if cid not in self.unread
        )
        return out.replace(container_cpu=records)

    def use(self, cid: str, seconds: float) -> None:
        pod, s = self.cgroups[cid]
        self.cgroups[cid] = (pod, s + seconds)


def build_node() -> CgroupNode:
    """Pod ``build`` (container ``ci``: ``make``, pid 10) and another tenant, pod ``web`` (container ``nginx``,
    pid 20). Each tick ``make`` uses 1 s and its compiler children, which never live through a scan, 3 s more;
    nginx uses 4 s. 10,000 mJ a tick at usage ratio 0.8: 8,000 mJ active."""
    node = CgroupNode(zones=dict(ZONE))
    node.spawn(10, comm="make", container_id="ci", pod_uid="build")
    node.spawn(20, comm="nginx", container_id="nginx", pod_uid="web")
    node.cgroups = {"ci": ("build", 100.0), "nginx": ("web", 50.0)}
    return node


def build_tick(node: CgroupNode) -> None:
    node.spend("intel-rapl:0", 10_000)
    node.total_s += 10.0
    node.active_s += 8.0
    node.run(10, 1.0)
    node.run(20, 4.0)
    node.use("ci", 4.0)
    node.use("nginx", 4.0)


def energy(out: Batch, scope: str, key: str) -> int:
    return totals(out, scope)[(key, "cpu:package")].energy_mj


def test_the_setting_is_validated_by_name() -> None:
    assert CpuAttributionConfig().unseen == "none"
    with pytest.raises(ValidationError, match="unseen"):
        CpuAttributionConfig(unseen="pods")  # type: ignore[arg-type]


@pytest.mark.parametrize(("unseen", "ci_mj", "nginx_mj"), [("none", 1_600, 6_400), ("containers", 4_000, 4_000)])
def test_a_container_whose_short_lived_processes_were_never_listed_gets_their_energy(
    unseen: str, ci_mj: int, nginx_mj: int
) -> None:
    node = build_node()
    proc = processor(unseen=unseen)
    step(proc, node)
    build_tick(node)
    out = step(proc, node)
    # none: 8,000 mJ over 1 s (make) and 4 s (nginx): the other tenant pays for the compilers.
    # containers: over make's 1 s, nginx's 4 s and ci's 3 s unseen: 1,000 / 4,000 / 3,000.
    assert energy(out, "process", "10") == 1_000 if unseen == "containers" else 1_600
    assert energy(out, "process", "20") == nginx_mj
    assert (energy(out, "container", "ci"), energy(out, "pod", "build")) == (ci_mj, ci_mj)
    assert (energy(out, "container", "nginx"), energy(out, "pod", "web")) == (nginx_mj, nginx_mj)
    (zone,) = out.device_totals
    assert (zone.attributed_energy_mj, zone.unattributed_energy_mj, zone.idle_energy_mj) == (8_000, 0, 2_000)
    ci = totals(out, "container")[("ci", "cpu:package")]
    assert ci.power_w == pytest.approx(ci_mj / 5.0 / 1000.0)  # its watts include its unseen share


def test_first_read_and_backwards_usage_are_baselines() -> None:
    node = build_node()
    proc = processor(unseen="containers")
    step(proc, node)
    node.cgroups["late"] = ("build", 500.0)  # first read now: a baseline, though it used CPU before
    build_tick(node)
    out = step(proc, node)
    assert energy(out, "container", "ci") == 4_000
    assert ("late", "cpu:package") not in totals(out, "container")
    build_tick(node)
    node.cgroups["ci"] = ("build", 1.0)  # went back: made anew under the same id: no delta
    out = step(proc, node)
    assert energy(out, "container", "ci") == 4_000 + 1_600  # make's 1 s of 5 s: the seed's split this tick
    build_tick(node)
    out = step(proc, node)
    assert energy(out, "container", "ci") == 4_000 + 1_600 + 4_000


def test_a_container_with_no_listed_process_is_billed_and_stays_running_while_its_cgroup_is_read() -> None:
    node = build_node()
    proc = processor(unseen="containers")
    node.cgroups["batch"] = ("jobs", 0.0)  # its processes all live inside a tick
    step(proc, node)
    build_tick(node)
    node.use("batch", 2.0)
    out = step(proc, node)
    # 8,000 mJ over make 1, nginx 4, ci 3, batch 2 (10 s)
    assert [energy(out, "container", c) for c in ("ci", "nginx", "batch")] == [3_200, 3_200, 1_600]
    assert energy(out, "pod", "jobs") == 1_600
    batch = totals(out, "container")[("batch", "cpu:package")]
    assert (batch.state, batch.attributes()["pod_uid"], batch.attributes()["runtime"]) == (
        "running",
        "jobs",
        "containerd",
    )
    build_tick(node)  # batch idles this tick, its cgroup still read: running at 0 W
    out = step(proc, node)
    batch = totals(out, "container")[("batch", "cpu:package")]
    assert (batch.state, batch.energy_mj, batch.power_w) == ("running", 1_600, 0.0)
    del node.cgroups["batch"]  # no longer read (its cgroup removed): it ends
    build_tick(node)
    out = step(proc, node)
    assert totals(out, "container")[("batch", "cpu:package")].state == "terminated"
    assert totals(out, "pod")[("jobs", "cpu:package")].state == "terminated"


def test_without_container_cpu_time_it_says_so_once_and_splits_by_processes(caplog: pytest.LogCaptureFixture) -> None:
    node = build_node()
    node.cgroups_read = False
    proc = processor(unseen="containers")
    with caplog.at_level(logging.WARNING):
        step(proc, node)
        build_tick(node)
        out = step(proc, node)
        for _ in range(3):
            build_tick(node)
            step(proc, node)
    said = [r.getMessage() for r in caplog.records if "unseen" in r.getMessage()]
    assert len(said) == 1
    assert "no container CPU time" in said[0]
    assert "processes only" in said[0]
    assert energy(out, "container", "ci") == 1_600  # the seed's split


def test_a_zone_gap_is_a_baseline_for_unseen_time() -> None:
    node = CgroupNode(zones={**ZONE, "intel-rapl:1": ("package", 1, 0, 0)})
    node.spawn(10, comm="make", container_id="ci", pod_uid="build")
    node.spawn(20, comm="nginx", container_id="nginx", pod_uid="web")
    node.cgroups = {"ci": ("build", 100.0), "nginx": ("web", 50.0)}
    proc = processor(unseen="containers")
    step(proc, node)
    missing = node.zones.pop("intel-rapl:1")
    build_tick(node)
    out = step(proc, node)  # intel-rapl:1 missing: the tick is split by the processes alone
    assert energy(out, "container", "ci") == 1_600
    node.zones["intel-rapl:1"] = ("package", 1, missing[2] + 20_000_000, 0)
    build_tick(node)
    out = step(proc, node)  # back: the gap's split is the processes' (_cpu_gap.py); no unseen time this tick
    assert out.device_totals[0].unattributed_energy_mj == 0
    assert energy(out, "container", "ci") - energy(out, "process", "10") == 0
    build_tick(node)
    before = energy(out, "container", "ci")
    out = step(proc, node)
    assert energy(out, "container", "ci") - before == 4_000  # read every tick again: unseen time counts


@pytest.mark.parametrize(
    ("says", "ci_mj", "nginx_mj"),
    [("goes on", 10_691, 13_309), ("baseline", 7_200, 16_800), ("not said", 7_200, 16_800)],
)
def test_a_container_with_no_record_for_a_tick_is_unknown_and_its_next_record_spans_it(
    says: str, ci_mj: int, nginx_mj: int
) -> None:
    # ci's cgroup is not read for a tick (cpu.stat unreadable): unknown, not 0 s; that tick's 8,000 mJ go by make's
    # 1 s and nginx's 4 s (1,600 / 6,400). Its next record, where the receiver says it goes on from the last
    # (since_s at or before it), spans both ticks: 8 s of usage less make's 2 s of both ticks, 6 s unseen, weighed
    # beside this tick's make 1 s and nginx 4 s (8,000 × 7/11 to ci). A baseline (since_s its own time: a cgroup set
    # changed) or a record that does not say (since_s None) counts from there: 1,600 more, the rest nginx's.
    node = build_node()
    node.since_s = {"ci": 0.0, "nginx": 0.0}
    proc = processor(unseen="containers")
    step(proc, node)
    build_tick(node)
    assert energy(step(proc, node), "container", "ci") == 4_000
    build_tick(node)
    node.unread = {"ci"}
    assert energy(step(proc, node), "container", "ci") == 4_000 + 1_600
    node.unread = set()
    if says == "baseline":
        node.since_s["ci"] = node.clock.now().monotonic_s
    elif says == "not said":
        del node.since_s["ci"]
    build_tick(node)
    out = step(proc, node)
    assert (energy(out, "container", "ci"), energy(out, "container", "nginx")) == (ci_mj, nginx_mj)
    (zone,) = out.device_totals
    assert (zone.attributed_energy_mj, zone.unattributed_energy_mj) == (24_000, 0)
    build_tick(node)
    out = step(proc, node)
    assert energy(out, "container", "ci") == ci_mj + 4_000  # goes on from the record read last tick


def test_a_containers_last_record_is_kept_as_long_as_a_zones_gap_is() -> None:
    # A record goes on from the last one it was read at most GAP_MAX_S (10 minutes) ago: past that, none is kept
    # (bounded memory: a container whose cgroup was removed is never read again), and the next is a baseline.
    node = build_node()
    node.since_s = {"ci": 0.0, "nginx": 0.0}
    proc = processor(unseen="containers")
    step(proc, node)
    node.unread = {"ci"}
    for _ in range(2):
        node.clock.advance(GAP_MAX_S / 2 - 5.0)  # (and step's 5 s)
        build_tick(node)
        step(proc, node)
    assert proc._unseen is not None
    assert "ci" in proc._unseen._usage  # read 600 s ago: kept
    node.clock.advance(1.0)
    build_tick(node)
    before = energy(step(proc, node), "container", "ci")
    assert "ci" not in proc._unseen._usage
    node.unread = set()
    build_tick(node)
    assert energy(step(proc, node), "container", "ci") - before == 1_600  # its first record again: a baseline


# --- properties: churn, unseen time, containers coming and going ---------------------------------------


TICK = st.fixed_dictionaries(
    {
        "mj": st.integers(0, 50_000),
        "active_s": st.integers(0, 10),
        "spawn": st.lists(st.sampled_from(["a", "b", "c", None]), max_size=3),
        "exit": st.lists(st.integers(0, 20), max_size=2),
        "run": st.lists(st.floats(0.0, 3.0), max_size=6),
        "hidden": st.lists(st.floats(0.0, 4.0), min_size=3, max_size=3),  # unseen s per container a, b, c
        "cgroups": st.lists(st.booleans(), min_size=3, max_size=3),  # which containers are read this tick
        "listed": st.booleans(),
    }
)


@settings(max_examples=60, deadline=None)
@given(st.lists(TICK, min_size=1, max_size=12), st.booleans())
@example([{"mj": 1, "active_s": 1, "spawn": [], "exit": [], "run": [], "hidden": [0.5, 0.0, 0.0],
           "cgroups": [True, True, True], "listed": True}] * 3, False)  # fmt: skip
def test_conservation_and_monotonic_totals_with_churn_and_unseen_time(
    ticks: list[dict[str, Any]], goes_on: bool
) -> None:
    # goes_on: the records say their usage goes on from the first (since_s 0), so a container not read for a tick
    # has its next delta span it; else they do not say (only the last tick's record goes on).
    node = CgroupNode(zones=dict(ZONE))
    pods = {"a": "p1", "b": "p1", "c": "p2"}
    node.cgroups = {c: (pods[c], 0.0) for c in pods}
    node.since_s = {c: 0.0 for c in pods} if goes_on else {}
    proc = processor(unseen="containers", terminated_retention=1e9, max_terminated=10_000)
    container_of: dict[int, str | None] = {}
    last: dict[tuple[str, str], int] = {}
    next_pid = 100
    step(proc, node)
    for tick in ticks:
        for c in tick["spawn"]:
            node.spawn(next_pid, container_id=c, pod_uid=None if c is None else pods[c])
            container_of[next_pid] = c
            next_pid += 1
        for i in tick["exit"]:
            if node.procs:
                node.procs.pop(sorted(node.procs)[i % len(node.procs)])
        for i, seconds in enumerate(tick["run"]):
            if node.procs:
                pid = sorted(node.procs)[i % len(node.procs)]
                node.run(pid, seconds)
                if (c := container_of[pid]) is not None:
                    node.use(c, seconds)
        for c, seconds in zip(pods, tick["hidden"], strict=True):
            node.use(c, seconds)
        read = {c for c, on in zip(pods, tick["cgroups"], strict=True) if on}
        every = dict(node.cgroups)
        node.cgroups = {c: v for c, v in every.items() if c in read}
        node.listed = tick["listed"]
        node.spend("intel-rapl:0", tick["mj"])
        node.total_s += 10.0
        node.active_s += tick["active_s"]
        out = step(proc, node)
        node.cgroups = every
        (zone,) = out.device_totals
        assert zone.idle_energy_mj + zone.attributed_energy_mj + zone.unattributed_energy_mj == zone.energy_mj
        processes = {int(k[0]): t.energy_mj for k, t in totals(out, "process").items()}
        containers = {k[0]: t.energy_mj for k, t in totals(out, "container").items()}
        in_containers = {c: sum(mj for pid, mj in processes.items() if container_of[pid] == c) for c in pods}
        unseen = {c: containers.get(c, 0) - in_containers[c] for c in pods}
        assert all(mj >= 0 for mj in unseen.values())  # a container is at least the sum of its processes
        # every attributed mJ is a process's, or a container's unseen share: nothing lost, nothing twice
        assert sum(processes.values()) + sum(unseen.values()) == zone.attributed_energy_mj
        pods_mj = {k[0]: t.energy_mj for k, t in totals(out, "pod").items()}
        assert pods_mj.get("p1", 0) == containers.get("a", 0) + containers.get("b", 0)
        assert pods_mj.get("p2", 0) == containers.get("c", 0)
        for t in out.totals:
            key = (t.scope, t.key)
            assert t.energy_mj >= last.get(key, 0)  # monotonic
            last[key] = t.energy_mj


def test_it_asks_procfs_for_container_cpu_time_only_when_on() -> None:
    assert processor().wants == frozenset({"process_cpu_time"})
    assert processor(unseen="containers").wants == frozenset({"process_cpu_time", "container_cpu_time"})


def test_after_a_restart_the_first_tick_is_a_baseline_and_the_container_goes_on(tmp_path: Path) -> None:
    node = build_node()
    store = StateStore(tmp_path / "state.json", SteppedClock(), "n")
    proc = processor(store, unseen="containers")
    step(proc, node)
    build_tick(node)
    assert energy(step(proc, node), "container", "ci") == 4_000
    proc = restarted(proc, store, unseen="containers")
    build_tick(node)
    out = step(proc, node)  # a baseline for the zones, the processes and the containers alike (nothing kept)
    assert energy(out, "container", "ci") == 4_000
    assert proc._unseen is not None
    read = {cid: kept.usage_s for cid, kept in proc._unseen._usage.items()}
    assert read == {"ci": 108.0, "nginx": 58.0}  # read now: the next tick's deltas start here
    build_tick(node)
    assert energy(step(proc, node), "container", "ci") == 4_000 + 4_000  # the restored series goes on


def test_a_process_that_moved_to_another_container_is_not_billed_again_to_the_one_it_left() -> None:
    # pid 30 ran 2 s in ci's cgroup this tick, then moved to container m's: ci's usage counts its 2 s, and its
    # delta (listed in m now) is weighed as its own. Counted as ci's unseen too, its 2 s would weigh twice.
    node = build_node()
    node.spawn(30, comm="worker", container_id="ci", pod_uid="build")
    node.cgroups["m"] = ("other", 0.0)
    proc = processor(unseen="containers")
    step(proc, node)
    build_tick(node)  # make 1 s, nginx 4 s, ci's compilers 3 s
    node.run(30, 2.0)
    node.use("ci", 2.0)
    node.procs[30] = replace(node.procs[30], container_id="m", pod_uid="other")
    out = step(proc, node)
    # 8,000 mJ over make 1, nginx 4, the compilers 3 and the worker 2 (10 s): 800 mJ a second
    assert energy(out, "process", "30") == 1_600
    assert energy(out, "container", "ci") == 800 + 2_400  # make's and the compilers': not the worker's again
    assert energy(out, "container", "m") == 1_600
    assert out.device_totals[0].attributed_energy_mj == 8_000


def test_a_container_billed_only_unseen_time_is_named_once_its_pod_is_known() -> None:
    # A CronJob's container whose processes all live inside a tick: its series is begun by its unseen share,
    # before the k8s processor has listed its pod (the API cache syncs after the first ticks). Once the pod is
    # known its series carries the names, as a container with a listed process's would.
    from wattpipe.pipeline.records import Workload

    node = build_node()
    node.cgroups["cron"] = ("jobs", 0.0)
    proc = processor(unseen="containers")
    step(proc, node)
    build_tick(node)
    node.use("cron", 2.0)
    out = step(proc, node)
    assert "container_name" not in totals(out, "container")[("cron", "cpu:package")].attributes()
    build_tick(node)
    node.use("cron", 2.0)
    now = node.clock.now()
    roster = (
        Workload(time=now, pid=None, listed="api"),
        Workload(time=now, pid=None, pod_uid="jobs", pod_name="report", pod_namespace="batch", listed="api"),
        Workload(
            time=now,
            pid=None,
            container_id="cron",
            container_name="job",
            pod_uid="jobs",
            pod_name="report",
            pod_namespace="batch",
            listed="api",
        ),
    )
    out = proc.process(node.batch().replace(workloads=roster))
    cron = totals(out, "container")[("cron", "cpu:package")].attributes()
    assert (cron.get("container_name"), cron.get("pod_name"), cron.get("pod_namespace")) == ("job", "report", "batch")
    pod = totals(out, "pod")[("jobs", "cpu:package")].attributes()
    assert (pod.get("pod_name"), pod.get("pod_namespace")) == ("report", "batch")


MOVES = st.lists(
    st.fixed_dictionaries(
        {
            # (process, seconds run, the part of them before its move, if it moves), per process listed
            "run": st.lists(st.tuples(st.integers(0, 7), st.floats(0.0, 3.0), st.floats(0.0, 1.0)), max_size=8),
            "move": st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["a", "b", "c"])), max_size=2),
            "exit": st.lists(st.tuples(st.integers(0, 7), st.floats(0.0, 2.0)), max_size=2),  # and its last s
            "hidden": st.lists(st.floats(0.0, 4.0), min_size=3, max_size=3),  # per container a, b, c
        }
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=80, deadline=None)
@given(MOVES)
@example([{"run": [(0, 2.0, 1.0)], "move": [(0, "b")], "exit": [], "hidden": [0.0, 0.0, 0.0]}])
def test_no_cpu_second_is_weighed_twice_with_moves_and_exits(ticks: list[dict]) -> None:  # type: ignore[type-arg]
    # The truth: each container's cgroup usage grows by the time its processes ran in it (one that moves runs a
    # part of its tick in the container it left), its hidden processes' and its exited processes' last seconds.
    # Weighed: the processes' deltas and the containers' unseen seconds. Nothing twice: their sum is at most the
    # cgroups' growth; in a tick nothing moved, each container's unseen time is what /proc did not show.
    from tests.helpers.context import make_context
    from wattpipe.pipeline.records import HostProcess
    from wattpipe.processors._cpu_unseen import UnseenTime

    clock = SteppedClock()
    unseen = UnseenTime(make_context("cpu_attribution", clock=clock))
    usage = {"a": 0.0, "b": 0.0, "c": 0.0}
    procs = {pid: ("abc"[pid % 3], 0.0) for pid in range(8)}  # pid → its container, its CPU time

    def listing() -> tuple[Batch, dict[int, HostProcess]]:
        now = clock.now()
        hosts = {
            pid: HostProcess(time=now, pid=pid, start_time_ticks=pid, cpu_time_s=cpu, container_id=c)
            for pid, (c, cpu) in procs.items()
        }
        records = tuple(ContainerCpuTime(time=now, container_id=c, usage_s=s) for c, s in usage.items())
        return Batch(time=now, interval_s=5.0, node="n").replace(container_cpu=records), hosts

    batch, last = listing()
    unseen.weigh(batch, [], [], True, True, last)
    for tick in ticks:
        before = dict(usage)
        moves = dict(tick["move"])
        for pid, seconds, part in tick["run"]:
            if pid in procs:
                c, cpu = procs[pid]
                moved_to = moves.get(pid, c)
                usage[c] += seconds * part if moved_to != c else seconds
                usage[moved_to] += seconds * (1 - part) if moved_to != c else 0.0
                procs[pid] = (moved_to, cpu + seconds)
        for pid, c in moves.items():
            if pid in procs:
                procs[pid] = (c, procs[pid][1])
        for pid, last_s in tick["exit"]:
            if pid in procs:
                usage[procs.pop(pid)[0]] += last_s
        for c, seconds in zip("abc", tick["hidden"], strict=True):
            usage[c] += seconds
        clock.advance(5.0)
        batch, hosts = listing()
        deltas = [(h, h.cpu_time_s - last[pid].cpu_time_s) for pid, h in hosts.items() if pid in last]
        deltas = [(h, d) for h, d in deltas if d > 0]
        got = unseen.weigh(batch, [h for h, _ in deltas], [d for _, d in deltas], True, True, last)
        weighed = dict(zip((r.container_id for r in got.records), got.seconds, strict=True))
        growth = sum(usage.values()) - sum(before.values())
        assert sum(weighed.values()) + sum(d for _, d in deltas) <= growth + 1e-6
        if not any(pid in last for pid in moves):
            for c in usage:  # no move: a container's unseen time is its growth less what /proc showed of it,
                shown = sum(d for h, d in deltas if h.container_id == c)
                exact = max(0.0, usage[c] - before[c] - shown)
                # less what its processes showed beyond its growth before (a credit: 20 ms a process, and 10 ms)
                assert exact - 0.01 * (2 * 8 + 1) - 2e-6 <= weighed.get(c, 0.0) <= exact + 2e-6  # (8 processes at most)
        last = hosts


def test_a_container_two_receivers_both_read_is_billed_its_unseen_time_once() -> None:
    # Two procfs receivers in one pipeline (as a pid two receivers both list is one process, by its last record):
    # each gives the container's usage; its unseen time is once, not once per record.
    node = build_node()
    proc = processor(unseen="containers")

    def twice() -> Batch:
        batch = node.batch()
        return batch.replace(container_cpu=batch.container_cpu + batch.container_cpu)

    proc.process(twice())
    node.clock.advance(5.0)
    build_tick(node)
    out = proc.process(twice())
    assert (energy(out, "container", "ci"), energy(out, "container", "nginx")) == (4_000, 4_000)


def test_a_process_first_listed_long_after_it_started_has_its_tick_billed_once_to_its_container() -> None:
    # pid 30 ran in ci all along, but its stat could not be read at the last listing: listed now, its delta is 0
    # (its CPU time before is not this tick's), and its 2 s this tick are in ci's cgroup growth: ci's unseen time.
    node = build_node()
    proc = processor(unseen="containers")
    step(proc, node)
    build_tick(node)
    node.spawn(30, cpu_s=100.0, comm="worker", container_id="ci", pod_uid="build")
    node.procs[30] = replace(node.procs[30], start_wall_s=node.clock.now().wall_s - 3600)
    node.use("ci", 2.0)
    out = step(proc, node)
    # 8,000 mJ over make 1, nginx 4, ci's unseen 3 + 2 (10 s): the worker's 2 s weighed once, as ci's
    assert ("30", "cpu:package") not in totals(out, "process")
    assert energy(out, "container", "ci") == 800 * 6
    assert energy(out, "process", "20") == 800 * 4


def test_a_quiet_containers_rounding_is_not_billed_as_unseen_time() -> None:
    # /proc gives a process's CPU time in whole 10 ms ticks (the kernel's USER_HZ), its cgroup in µs: a process
    # using 15 ms a tick shows 20 ms one tick and 10 ms the next. Clipped at 0 tick by tick, the -5 ms went
    # unused and the +5 ms was billed as unseen: a sidecar at 0.3 % of a core was billed +16 % on the simulator
    # (the cpu.yaml node plus two quiet containers, idle mode). What /proc ran ahead of the cgroup by is owed back
    # (a credit, at most 10 ms per listed process and one more): over a run, nothing is billed that did not run.
    from tests.helpers.context import make_context
    from wattpipe.pipeline.records import HostProcess
    from wattpipe.processors._cpu_unseen import UnseenTime

    clock = SteppedClock()
    unseen = UnseenTime(make_context("cpu_attribution", clock=clock))

    def weigh(usage_s: float, cpu_s: float, delta_s: float) -> float:
        now = clock.now()
        host = HostProcess(time=now, pid=7, start_time_ticks=1, cpu_time_s=cpu_s, container_id="envoy")
        batch = Batch(time=now, interval_s=5.0, node="n").replace(
            container_cpu=(ContainerCpuTime(time=now, container_id="envoy", usage_s=usage_s),)
        )
        got = unseen.weigh(batch, [host] if delta_s else [], [delta_s] if delta_s else [], True, True, {7: host})
        clock.advance(5.0)
        return sum(got.seconds)

    assert weigh(1.000, 1.00, 0.0) == 0.0  # the baseline
    # 15 ms a tick in the cgroup; /proc's reading truncated to 10 ms: 1.01, 1.03, 1.04, 1.06, ... (deltas 10, 20 ms)
    readings = [1.00 + (15 * n // 10) / 100 for n in range(1, 41)]
    deltas = [b - a for a, b in zip([1.00, *readings], readings, strict=False)]
    billed = [weigh(1.000 + 0.015 * n, cpu, d) for n, (cpu, d) in enumerate(zip(readings, deltas, strict=True), 1)]
    # clipped tick by tick: 5 ms every other tick, 0.1 s over 40 ticks (+33 % of its 0.6 s); owed back: 5 ms once
    assert sum(billed) == pytest.approx(0.005, abs=1e-6)
    # a real unseen second still comes through, less at most the credit (20 ms for its one process, and 10 ms)
    assert weigh(1.000 + 0.015 * 41 + 1.0, 1.00 + 0.615, 0.015) == pytest.approx(1.0, abs=0.02)


def test_user_and_system_time_truncated_apart_are_not_billed_as_unseen_time() -> None:
    # The kernel writes a process's utime and stime to /proc/<pid>/stat each truncated to whole 10 ms ticks
    # (fs/proc/array.c, do_task_stat: nsec_to_clock_t(utime), nsec_to_clock_t(stime)): their sum, and so a delta,
    # is off by up to 20 ms either way, not 10. Two processes each 9 ms user and 9 ms system a tick show 40 ms
    # nine ticks in ten and 0 the tenth: a credit held to 10 ms a process (and one) billed 6 ms of every 36 as
    # unseen time, though nothing unseen ran.
    from tests.helpers.context import make_context
    from wattpipe.pipeline.records import HostProcess
    from wattpipe.processors._cpu_unseen import UnseenTime

    clock = SteppedClock()
    unseen = UnseenTime(make_context("cpu_attribution", clock=clock))
    last: dict[int, HostProcess] = {}
    billed = []
    for n in range(101):
        now = clock.now()
        ticks = 2 * int(0.9 * n)  # 9 ms user and 9 ms system a tick so far, each truncated to whole ticks
        hosts = [
            HostProcess(time=now, pid=pid, start_time_ticks=1, cpu_time_s=ticks / 100, container_id="app")
            for pid in (7, 8)
        ]
        shown = [h for h in hosts if h.pid in last and h.cpu_time_s != last[h.pid].cpu_time_s]
        deltas = [(h.cpu_time_s or 0.0) - (last[h.pid].cpu_time_s or 0.0) for h in shown]
        batch = Batch(time=now, interval_s=5.0, node="n").replace(
            container_cpu=(ContainerCpuTime(time=now, container_id="app", usage_s=0.036 * n),)
        )
        billed.append(sum(unseen.weigh(batch, shown, deltas, True, True, last).seconds))
        last = {h.pid: h for h in hosts}
        clock.advance(5.0)
    # what the cgroup ran beyond what /proc showed, over the run: 3.6 s less 3.6 s shown (0.36 s at tick 1 aside)
    assert sum(billed) == pytest.approx(0.036, abs=1e-6)


@pytest.mark.parametrize(("usage_s", "job_mj"), [(3.0, 8_000 * 3 / 11), (500.0, 8_000 * 1 / 9)])
def test_a_container_first_read_whose_processes_all_started_in_the_tick_is_billed_from_0(
    usage_s: float, job_mj: float
) -> None:
    # A container first read is a baseline (its usage before is not this tick's), but one whose every listed process
    # started since the last listing is new: its cgroup was made for them, all of its usage is of this tick (as a
    # process's first tick counts from its start). Unless it holds more than the node ran in the tick (8 s here):
    # a past its cgroup held before, with processes never listed: a baseline.
    node = build_node()
    proc = processor(unseen="containers")
    step(proc, node)
    build_tick(node)
    node.spawn(30, cpu_s=1.0, comm="job", container_id="job", pod_uid="jobs")  # started in the tick: 1 s
    node.cgroups["job"] = ("jobs", usage_s)  # its 1 s and, new, 2 s of processes never listed
    out = step(proc, node)
    # new: 8,000 mJ over make 1, nginx 4, ci's 3 unseen, the job's 1 and its 2 unseen; else its 1 s alone of 9
    assert energy(out, "container", "job") == pytest.approx(job_mj, abs=1)
    assert energy(out, "process", "30") == pytest.approx(8_000 / (11 if usage_s == 3.0 else 9), abs=1)
    assert out.device_totals[0].attributed_energy_mj == 8_000


@pytest.mark.parametrize(("made_ago_s", "short_mj"), [(5.0, 2_000), (5.001, 0), (10.0, 0)])
def test_a_container_first_read_in_cgroups_made_since_the_last_listing_is_billed_from_0(
    made_ago_s: float, short_mj: int
) -> None:
    # A container none of whose processes is listed, first read in cgroups made since procfs's last look (5 s back,
    # the last listing's time, or after): its usage is all since then, billed. Made after an earlier look only (the
    # last listing weighed without it, or procfs's look older than that listing's): a baseline, as any first
    # reading: its past may be of ticks already split.
    node = build_node()
    proc = processor(unseen="containers")
    step(proc, node)
    build_tick(node)
    node.cgroups["short"] = ("build", 2.0)  # 2 s run by processes never listed
    node.made_after_s["short"] = node.clock.now().monotonic_s - made_ago_s
    node.spend("intel-rapl:0", 2_000)
    node.total_s += 2.0
    node.active_s += 2.0
    out = step(proc, node)
    # 10,000 mJ active over make 1 s, nginx 4 s, ci's 3 s unseen and, billed, short's 2 s: 1,000 mJ a second
    # (a baseline: 1,250 mJ a second over the other 8 s)
    short = totals(out, "container").get(("short", "cpu:package"))
    assert (0 if short is None else short.energy_mj) == short_mj
    assert energy(out, "container", "ci") == (4_000 if short_mj else 5_000)
    (zone,) = out.device_totals
    assert zone.attributed_energy_mj == 10_000
