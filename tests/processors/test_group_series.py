"""Container and pod series live as long as their pod, not as long as its GPU processes (issue 14, bug 5).

The k8s processor lists the pods and containers that exist on the node (``Workload.listed`` entries); the
energy processor keeps a container or pod series running (0 W, its total and start kept) while it is listed,
ends it when a complete list lacks it, and ends nothing when nobody can say. A series keeps its first key
when its pod's UID (or its container's id) becomes known later.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Literal

import pytest

from tests.helpers.context import make_context
from tests.processors.test_idle_energy import energy, power, share
from wattpipe.cli import main
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DeviceAllocation, GpuProcessSample, GpuShare, HostProcess, Totals, Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.energy import EnergyProcessor
from wattpipe.processors.k8s import K8sConfig, K8sProcessor, PodInfo

T0 = Timestamp(0.0, 0.0)
CID = "c" * 64
SCENARIO = Path(__file__).parents[2] / "configs" / "scenarios" / "faults-pods.yaml"


def member(pid: int, *, container_id: str | None = CID, pod_uid: str | None = "uid-a") -> Workload:
    """Process ``pid`` in container ``main`` of pod ``ml/trainer-0``."""
    return Workload(
        time=T0, pid=pid, container_id=container_id, container_name="main", pod_uid=pod_uid, pod_name="trainer-0",
        pod_namespace="ml",
    )  # fmt: skip


def listed(pod: str = "trainer-0", uid: str = "uid-a", cid: str = CID) -> Workload:
    return Workload(
        time=T0, pid=None, container_id=cid, container_name="main", pod_uid=uid, pod_name=pod, pod_namespace="ml",
        listed="api",
    )  # fmt: skip


COMPLETE = Workload(time=T0, pid=None, listed="api")  # the entry naming nothing: the list is complete


def step(
    proc: EnergyProcessor, clock: SteppedClock, shares: list[GpuShare], workloads: list[Workload], idle_mj: int = 500
) -> Batch:
    """One 5 s tick of device G (answering) with ``shares`` and ``workloads``."""
    total = sum(s.energy_mj for s in shares)
    out = proc.process(
        Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=(power(clock, total + idle_mj, idle_mj),), shares=tuple(shares), workloads=tuple(workloads)
        )
    )
    clock.advance(5.0)
    return out


def series(b: Batch, scope: Literal["container", "pod"]) -> dict[str, Totals]:
    return {t.key: t for t in b.totals if t.scope == scope}


def test_a_pod_whose_process_pauses_past_the_retention_keeps_one_running_series() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0)
    first = step(proc, clock, [share(clock, 1, 100)], [member(1), listed(), COMPLETE])
    start = series(first, "pod")["uid-a"].start
    for _ in range(20):  # 100 s without a GPU process: longer than the retention
        b = step(proc, clock, [], [listed(), COMPLETE])
        for scope, key in (("container", CID), ("pod", "uid-a")):
            t = series(b, scope)[key]  # type: ignore[arg-type]
            assert (t.energy_mj, t.state, t.power_w, t.start) == (100, "running", 0.0, start)
    b = step(proc, clock, [share(clock, 2, 40)], [member(2), listed(), COMPLETE])  # a new process, same container
    for scope, key in (("container", CID), ("pod", "uid-a")):
        t = series(b, scope)[key]  # type: ignore[arg-type]
        assert (t.energy_mj, t.state, t.power_w, t.start) == (140, "running", 0.008, start)


def test_series_end_when_their_pod_is_gone_and_are_dropped_after_the_retention() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=12.0)
    both = [listed(), listed("other-0", "uid-b", "d" * 64), COMPLETE]
    step(proc, clock, [share(clock, 1, 100), share(clock, 2, 30)], [member(1), member(2, pod_uid="uid-b"), *both])
    step(proc, clock, [], both)
    b = step(proc, clock, [], [listed(), COMPLETE])  # other-0 is gone; trainer-0 merely idle
    pods = {key: (t.energy_mj, t.state, t.power_w) for key, t in series(b, "pod").items()}
    assert pods == {"uid-a": (100, "running", 0.0), "uid-b": (30, "terminated", 0.0)}
    for _ in range(3):  # 15 s > 12 s retention
        b = step(proc, clock, [], [listed(), COMPLETE])
    assert set(series(b, "pod")) == {"uid-a"}
    assert set(series(b, "container")) == {CID}


def test_a_node_listed_with_no_pods_ends_them_all() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, [share(clock, 1, 100)], [member(1), listed(), COMPLETE])
    b = step(proc, clock, [], [COMPLETE])
    assert {t.state for t in b.totals if t.scope in ("container", "pod")} == {"terminated"}


def test_when_no_source_can_say_which_pods_exist_nothing_ends() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=10.0)
    step(proc, clock, [share(clock, 1, 100)], [member(1)])
    for _ in range(5):
        b = step(proc, clock, [], [])  # the k8s processor ran but listed nothing: API down, no pod-resources
    assert {(t.energy_mj, t.state, t.power_w) for t in b.totals if t.scope in ("container", "pod")} == {
        (100, "running", 0.0)
    }


def test_names_only_lists_keep_series_keyed_by_ids_from_the_cgroup() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=10.0)
    by_names = Workload(
        time=T0, pid=None, container_name="main", pod_name="trainer-0", pod_namespace="ml", listed="allocations"
    )
    complete = Workload(time=T0, pid=None, listed="allocations")
    step(proc, clock, [share(clock, 1, 100)], [member(1), by_names, complete])
    for _ in range(4):
        b = step(proc, clock, [], [by_names, complete])
    assert {(t.key, t.state) for t in b.totals if t.scope in ("container", "pod")} == {
        (CID, "running"),
        ("uid-a", "running"),
    }
    b = step(proc, clock, [], [complete])
    assert {t.state for t in b.totals if t.scope in ("container", "pod")} == {"terminated"}


def test_a_pod_first_known_by_name_continues_one_series_under_its_uid(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    proc = energy(clock, store)
    # Before the API cache syncs: no UID, no container id, names from pod-resources.
    b = step(proc, clock, [share(clock, 1, 100)], [member(1, container_id=None, pod_uid=None)])
    before = {t.scope: t for t in b.totals if t.scope in ("container", "pod")}
    b = step(proc, clock, [share(clock, 1, 50)], [member(1), listed(), COMPLETE])  # synced: UID and id known
    after = {t.scope: t for t in b.totals if t.scope in ("container", "pod")}
    assert {scope: (t.key, t.energy_mj, t.state) for scope, t in after.items()} == {
        "container": ("ml/trainer-0/main", 150, "running"),
        "pod": ("ml/trainer-0", 150, "running"),
    }
    for scope, t in after.items():
        assert (t.start, t.extra) == (before[scope].start, before[scope].extra)  # no new start, no new labels
    store.put("metrics/energy", proc.snapshot())
    store.save()
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = energy(clock, reloaded)
    b = step(again, clock, [share(clock, 1, 10)], [member(1), listed(), COMPLETE])
    assert {(t.key, t.energy_mj) for t in b.totals if t.scope in ("container", "pod")} == {
        ("ml/trainer-0/main", 160),
        ("ml/trainer-0", 160),
    }


def test_a_second_pod_under_a_name_already_taken_by_a_uid_starts_its_own_series() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    step(proc, clock, [share(clock, 1, 100)], [member(1, container_id=None, pod_uid=None)])
    step(proc, clock, [share(clock, 1, 10)], [member(1)])  # uid-a takes over the name's series
    # trainer-0 recreated (a StatefulSet): same name, a new UID and container.
    b = step(proc, clock, [share(clock, 2, 7)], [member(2, container_id="e" * 64, pod_uid="uid-new")])
    assert {(t.key, t.energy_mj, t.state) for t in b.totals if t.scope == "pod"} == {
        ("ml/trainer-0", 110, "running"),
        ("uid-new", 7, "running"),
    }


# --- the k8s processor's list ----------------------------------------------------------------


def k8s(clock: SteppedClock) -> K8sProcessor:
    proc = K8sProcessor(K8sConfig(api="off"), make_context("k8s", clock=clock), env={})
    proc.start()
    return proc


def roster(b: Batch) -> set[tuple[str | None, ...]]:
    return {
        (w.listed, w.pod_namespace, w.pod_name, w.pod_uid, w.container_name, w.container_id)
        for w in b.workloads
        if w.listed is not None
    }


def k8s_batch(clock: SteppedClock, **fields: object) -> Batch:
    return Batch(time=clock.now(), interval_s=5.0, node="n").replace(gpu_processes=(), **fields)


def test_the_k8s_processor_lists_the_live_pods_it_knows_and_says_when_it_knows_none() -> None:
    clock = SteppedClock()
    proc = k8s(clock)
    assert roster(proc.process(k8s_batch(clock))) == set()  # no API list yet, no pod-resources: cannot say
    proc.cache.replace(  # what the watch thread does after a list
        [
            PodInfo(uid="uid-a", name="trainer-0", namespace="ml", containers=((CID, "main"), ("s" * 64, "side"))),
            PodInfo(uid="uid-b", name="starting-1", namespace="ml"),  # no container has an id yet
            PodInfo(uid="uid-c", name="gone-2", namespace="ml"),
        ],
        clock.monotonic(),
    )
    proc.cache.delete("uid-c", clock.monotonic())  # a tombstone: known, but not there
    assert roster(proc.process(k8s_batch(clock))) == {
        ("api", None, None, None, None, None),
        ("api", "ml", "trainer-0", "uid-a", None, None),
        ("api", "ml", "trainer-0", "uid-a", "main", CID),
        ("api", "ml", "trainer-0", "uid-a", "side", "s" * 64),
        ("api", "ml", "starting-1", "uid-b", None, None),
    }
    proc.cache.replace([], clock.monotonic())
    assert roster(proc.process(k8s_batch(clock))) == {("api", None, None, None, None, None)}  # none: said


def test_without_the_api_the_k8s_processor_lists_the_allocations_owners_by_name() -> None:
    clock = SteppedClock()
    proc = k8s(clock)
    alloc = DeviceAllocation(
        time=clock.now(), device_id="G", resource_name="nvidia.com/gpu", pod_name="trainer-0", pod_namespace="ml",
        container_name="main",
    )  # fmt: skip
    got = roster(proc.process(k8s_batch(clock, allocations=(alloc, alloc))))
    assert got == {
        ("allocations", None, None, None, None, None),
        ("allocations", "ml", "trainer-0", None, "main", None),
    }
    assert roster(proc.process(k8s_batch(clock, allocations=()))) == {("allocations", None, None, None, None, None)}


def test_a_static_pod_is_listed_under_the_uid_its_cgroup_shows() -> None:
    clock = SteppedClock()
    proc = k8s(clock)
    proc.cache.replace(
        [PodInfo(uid="mirror", name="etcd-n", namespace="kube-system", containers=((CID, "etcd"),))], 0.0
    )
    host = HostProcess(time=clock.now(), pid=7, comm="etcd", container_id=CID, pod_uid="config-hash")
    running = k8s_batch(clock, host_processes=(host,)).replace(
        gpu_processes=(GpuProcessSample(time=clock.now(), device_id="G", pid=7),)
    )
    assert [w.pod_uid for w in proc.process(running).workloads if w.pid == 7] == ["config-hash"]
    later = roster(proc.process(k8s_batch(clock)))  # its GPU process paused: still listed under both UIDs
    assert {w[3] for w in later if w[2] == "etcd-n"} == {"mirror", "config-hash"}


@pytest.mark.parametrize("listed_by", ["api", "allocations"])
def test_listed_entries_are_not_processes_to_the_energy_processor(listed_by: Literal["api", "allocations"]) -> None:
    """A roster entry is not a degraded owner: it takes no share of a device's energy."""
    clock = SteppedClock()
    proc = energy(clock)
    entry = Workload(time=T0, pid=None, container_name="main", pod_name="x-0", pod_namespace="ml", listed=listed_by)
    b = step(proc, clock, [share(clock, 1, 100)], [member(1), entry, Workload(time=T0, pid=None, listed=listed_by)])
    assert {(t.key, t.energy_mj) for t in b.totals if t.scope == "pod"} == {("uid-a", 100)}


# --- end to end: configs/scenarios/faults-pods.yaml ------------------------------------------

PIPELINE = """
receivers:
  nvml: {required: true}
  podresources: {endpoint: "${env:WATTPIPE_PODRESOURCES_ENDPOINT}"}
  procfs: {root: "${env:WATTPIPE_PROC_ROOT}"}
processors:
  idle:
  attribution:
  k8s:
  energy:
exporters:
  console: {format: json, kinds: [totals]}
service:
  telemetry: {listen: ""}
  pipelines:
    metrics:
      interval: 5s
      receivers: [nvml, podresources, procfs]
      processors: [idle, attribution, k8s, energy]
      exporters: [console]
"""


def test_the_faults_pods_scenario_keeps_one_series_per_pod_through_a_pause_and_a_lost_gpu(tmp_path: Path) -> None:
    """ml/etl-1 has no GPU process from 60 s to 160 s (past the 60 s retention); GPU 0 under ml/trainer-0 is
    lost from 100 s to 190 s."""
    (tmp_path / "wattpipe.pipeline.yaml").write_text(PIPELINE)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        args = [
            "simulate",
            "--scenario",
            str(SCENARIO),
            "-c",
            str(tmp_path / "wattpipe.pipeline.yaml"),
            "--duration",
            "5m",
        ]
        assert main([*args, "--log-level", "warning"], out, err) == 0, err.getvalue()
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]

    def series(scope: str, pod: str) -> list[tuple[str, str, float, float | None, int]]:
        return [
            (r["attributes"]["key"], r["attributes"]["state"], r["values"]["start"]["wall_s"],
             r["values"].get("power_w"), r["values"]["energy_mj"])
            for r in rows
            if r["attributes"]["scope"] == scope and r["attributes"].get("pod_name") == pod
        ]  # fmt: skip

    etl, trainer = series("pod", "etl-1"), series("pod", "trainer-0")
    for pod in (etl, trainer, series("container", "etl-1")):
        assert len({(key, state, start) for key, state, start, _, _ in pod}) == 1  # one series, always running
        assert pod[0][1] == "running"
        assert [mj for *_, mj in pod] == sorted(mj for *_, mj in pod)
    assert sum(watts == 0.0 for _, _, _, watts, _ in etl) >= 19  # ~100 s idle at 0 W, not ended
    assert etl[-1][4] == 51_200_000  # the truth: 12,000 J before the pause, 39,200 J after
    assert sum(watts is None for _, _, _, watts, _ in trainer) >= 18  # GPU 0's 90 s: watts absent
    process = [r for r in rows if r["attributes"]["scope"] == "process" and r["attributes"]["key"] == "4242"]
    assert {r["attributes"]["state"] for r in process} == {"running"}  # never ended by the outage
