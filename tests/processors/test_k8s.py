"""Processor ``k8s`` against the simulator's Kubernetes API face (real ``kubernetes`` client, loopback only)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.context import make_context
from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.records import DeviceAllocation, GpuProcessSample, HostProcess, MigInstance, Workload
from wattpipe.processors.k8s import DEGRADED, K8sConfig, K8sProcessor, PodCache, PodInfo, factory, pod_info
from wattpipe.simulator.k8sapi import K8sApiOptions, K8sApiServer, start_k8s_api
from wattpipe.simulator.scenario import Scenario, parse_scenario

NODE = "kube-node"
MIG_GPU = "GPU-0000aaaa-0000-0000-0000-000000000000"
MIG_UUID = "MIG-1111bbbb-0000-0000-0000-000000000000"


def _data(faults: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """GPU 0: trainer-0 alone; GPU 1: time-sliced between server-a and server-b; GPU 2: job-7 from 20 s."""
    return {
        "node": {"name": NODE},
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700}] * 3,
        "pods": [
            {"name": "trainer-0", "namespace": "ml", "containers": [
                {"name": "sidecar"}, {"name": "main", "devices": [{"gpu": 0}]}]},
            {"name": "server-a", "namespace": "infer", "containers": [
                {"name": "server", "runtime": "cri-o", "devices": [{"gpu": 1, "replica": 0}]}]},
            {"name": "server-b", "namespace": "infer", "containers": [
                {"name": "server", "devices": [{"gpu": 1, "replica": 1}]}]},
            {"name": "job-7", "namespace": "batch", "containers": [
                {"name": "run", "runtime": "docker", "devices": [{"gpu": 2}]}]},
        ],
        "processes": [
            {"pid": 100, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "end_s": 30},
            {"pid": 200, "comm": "server", "container": "infer/server-a/server", "gpu": 1},
            {"pid": 300, "comm": "server", "container": "infer/server-b/server", "gpu": 1},
            {"pid": 400, "comm": "run", "container": "batch/job-7/run", "gpu": 2, "start_s": 20},
        ],
        "faults": faults or [],
    }  # fmt: skip


class Node:
    """A simulated node with its API server, and the records a tick's receivers would give."""

    def __init__(self, clock: SteppedClock, api: K8sApiServer, tmp_path: Path) -> None:
        self.clock = clock
        self.api = api
        self.scenario: Scenario = api.node.scenario
        self.kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

    def env(self) -> dict[str, str]:
        return {"NODE_NAME": NODE, "KUBECONFIG": str(self.kubeconfig)}

    def ids(self, ref: str) -> tuple[str, str]:
        """(pod UID, container id) of ``namespace/pod/container``."""
        pod, container = self.scenario.container_ref(ref)
        return pod.uid, container.id

    def gpu(self, index: int) -> str:
        return self.scenario.gpus[index].uuid

    def host(self, pid: int, ref: str | None = None) -> HostProcess:
        """The HostProcess /proc gives ``pid``: in container ``ref``, or a host process."""
        pod_uid, container_id = self.ids(ref) if ref else (None, None)
        return HostProcess(time=self.clock.now(), pid=pid, comm="p", container_id=container_id, pod_uid=pod_uid)

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        return tuple(
            DeviceAllocation(
                time=self.clock.now(),
                device_id=self.gpu(device.gpu),
                resource_name=device.resource,
                pod_name=pod.name,
                pod_namespace=pod.namespace,
                container_name=container.name,
                replica=device.replica,
            )
            for pod in self.scenario.pods
            for container in pod.containers
            for device in container.devices
        )

    def batch(
        self,
        on_gpu: Sequence[tuple[int, int]],
        hosts: Sequence[HostProcess] = (),
        allocations: Sequence[DeviceAllocation] = (),
    ) -> Batch:
        """``on_gpu``: (pid, GPU index) pairs, as the nvml receiver would list them."""
        now = self.clock.now()
        samples = tuple(GpuProcessSample(time=now, device_id=self.gpu(gpu), pid=pid) for pid, gpu in on_gpu)
        return Batch(time=now, interval_s=1.0, node=NODE).replace(
            gpu_processes=samples, host_processes=tuple(hosts), allocations=tuple(allocations)
        )

    def all_hosts(self) -> list[HostProcess]:
        return [
            self.host(100, "ml/trainer-0/main"),
            self.host(200, "infer/server-a/server"),
            self.host(300, "infer/server-b/server"),
        ]


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def started(clock: SteppedClock) -> Iterator[Callable[..., K8sProcessor]]:
    """Builds and starts processors; every one is shut down when the test ends, however it ends."""
    made: list[K8sProcessor] = []

    def make(env: dict[str, str], **options: Any) -> K8sProcessor:
        options.setdefault("backoff_max", 0.05)
        proc = K8sProcessor(K8sConfig(**options), make_context("k8s", clock=clock), env=env)
        made.append(proc)
        proc.start()
        return proc

    yield make
    for proc in made:
        proc.shutdown()


@pytest.fixture
def make_node(clock: SteppedClock, tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """Builds a simulated node with its API server (``K8sApiOptions``, scenario faults); closed at the end."""
    with contextlib.ExitStack() as stack:

        def make(options: K8sApiOptions | None = None, faults: list[dict[str, Any]] | None = None) -> Node:
            sim = stack.enter_context(simulator.build(parse_scenario(_data(faults)), clock))
            return Node(clock, start_k8s_api(sim, options), tmp_path)

        yield make


@pytest.fixture
def node(make_node: Callable[..., Node]) -> Node:
    return make_node()


def _until(what: str, check: Callable[[], bool], timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.01)


def _members(batch: Batch) -> tuple[Workload, ...]:
    """The batch's Workload records of processes (and degraded owners), without the list of the node's pods."""
    return tuple(w for w in batch.workloads if w.listed is None)


def _by_pid(workloads: Sequence[Workload]) -> dict[int | None, Workload]:
    return {w.pid: w for w in workloads}


def _names(w: Workload) -> tuple[str | None, str | None, str | None]:
    return w.pod_namespace, w.pod_name, w.container_name


# --- names from the API ----------------------------------------------------------------------


def test_names_come_from_the_api_by_pod_uid_and_container_id(
    clock: SteppedClock, make_node: Callable[..., Node], started: Callable[..., K8sProcessor]
) -> None:
    labels = {"ml/trainer-0": {"app": "trainer", "team": "vision"}}
    annotations = {"ml/trainer-0": {"owner": "alice", "note": "not copied"}}
    node = make_node(K8sApiOptions(labels=labels, annotations=annotations))
    proc = started(node.env(), labels=["team", "absent"], annotations=["owner"])
    _until("the pod cache is synced", lambda: proc.view.synced)
    hosts = [*node.all_hosts(), node.host(900)]  # 900: a host process (no pod) on trainer-0's GPU
    out = proc.process(node.batch([(100, 0), (200, 1), (300, 1), (900, 0)], hosts, node.allocations()))
    assert "workloads" in out.present
    got = _by_pid(_members(out))
    assert set(got) == {100, 200, 300, 900}
    trainer_uid, trainer_cid = node.ids("ml/trainer-0/main")
    assert got[100] == Workload(
        time=clock.now(),
        pid=100,
        container_id=trainer_cid,
        container_name="main",  # by container id: the pod's other container is "sidecar"
        pod_uid=trainer_uid,
        pod_name="trainer-0",
        pod_namespace="ml",
        extra=(("annotation_owner", "alice"), ("label_team", "vision")),
    )
    # A time-sliced GPU shared by two pods: each process is named by its own cgroup.
    assert _names(got[200]) == ("infer", "server-a", "server")
    assert _names(got[300]) == ("infer", "server-b", "server")
    assert (got[200].pod_uid, got[200].container_id) == node.ids("infer/server-a/server")
    assert got[200].extra == ()  # no allow-listed label on it
    # The sole owner of GPU 0 is trainer-0, but /proc says 900 is in no pod: it is not given that name.
    assert got[900] == Workload(time=clock.now(), pid=900)
    assert node.api.requests["list"] == 1
    # And the pods that exist on the node, whether or not they run anything: every pod, and the list's end.
    listed = {(w.listed, w.pod_name, w.container_name) for w in out.workloads if w.listed is not None}
    pods = {(name, None) for name in ("trainer-0", "server-a", "server-b", "job-7")}
    containers = {("trainer-0", "sidecar"), ("trainer-0", "main"), ("server-a", "server"), ("server-b", "server")}
    assert listed == {("api", None, None)} | {("api", *names) for names in pods | containers | {("job-7", "run")}}


def test_the_watch_picks_up_a_pod_that_appears_later(
    clock: SteppedClock, make_node: Callable[..., Node], started: Callable[..., K8sProcessor]
) -> None:
    node = make_node(K8sApiOptions(pod_lifetimes="processes"))
    proc = started(node.env())
    _until("the pod cache is synced", lambda: proc.view.synced)
    job_uid, job_cid = node.ids("batch/job-7/run")
    assert job_uid not in proc.view.by_uid  # job-7's process starts at 20 s
    before = proc.process(node.batch([(400, 2)], [node.host(400, "batch/job-7/run")]))
    assert _members(before) == (Workload(time=clock.now(), pid=400, container_id=job_cid, pod_uid=job_uid),)
    clock.advance(21.0)
    _until("job-7 reaches the cache", lambda: job_uid in proc.view.by_uid)
    [after] = _members(proc.process(node.batch([(400, 2)], [node.host(400, "batch/job-7/run")])))
    assert (_names(after), after.pod_uid, after.container_id) == (("batch", "job-7", "run"), job_uid, job_cid)
    assert node.api.requests["list"] == 1  # the watch brought it, not a new list


def test_a_watch_too_old_to_resume_lists_again(
    clock: SteppedClock, make_node: Callable[..., Node], started: Callable[..., K8sProcessor]
) -> None:
    options = K8sApiOptions(pod_lifetimes="processes", history_events=0)
    node = make_node(options)
    proc = started(node.env(), watch_timeout=1)
    _until("the pod cache is synced", lambda: proc.view.synced)
    # The watch ends at 1 s; job-7 appears at 20 s; watching again from the old version is 410 Gone.
    clock.advance(25.0)
    job_uid, _ = node.ids("batch/job-7/run")
    _until("job-7 reaches the cache", lambda: job_uid in proc.view.by_uid)
    assert node.api.requests["list"] == 2
    assert proc.watcher is not None
    assert proc.watcher.failures == 0  # 410 is not a failure


def test_a_deleted_pod_is_kept_for_keep_deleted(
    clock: SteppedClock, make_node: Callable[..., Node], started: Callable[..., K8sProcessor]
) -> None:
    node = make_node(K8sApiOptions(pod_lifetimes="processes"))
    proc = started(node.env(), keep_deleted=60)
    _until("the pod cache is synced", lambda: proc.view.synced)
    uid, _ = node.ids("ml/trainer-0/main")
    clock.advance(31.0)  # trainer-0's only process ends at 30 s: DELETED
    _until("trainer-0 is deleted", lambda: proc.view.by_uid[uid].deleted_at_s is not None)
    late = node.batch([(100, 0)], [node.host(100, "ml/trainer-0/main")])
    assert _names(_members(proc.process(late))[0]) == ("ml", "trainer-0", "main")  # a straggling process
    clock.advance(60.0)
    gone = proc.process(node.batch([(100, 0)], [node.host(100, "ml/trainer-0/main")]))
    assert _names(_members(gone)[0]) == (None, None, None)
    assert uid not in proc.view.by_uid


# --- without the API -------------------------------------------------------------------------


def test_api_down_falls_back_to_allocations_then_recovers(
    clock: SteppedClock, make_node: Callable[..., Node], started: Callable[..., K8sProcessor]
) -> None:
    node = make_node(faults=[{"at_s": 0, "for_s": 10, "target": "k8sapi", "kind": "down"}])
    proc = started(node.env())
    _until("a list has failed", lambda: proc.watcher is not None and proc.watcher.failures >= 1)
    batch = node.batch([(100, 0), (200, 1), (300, 1)], node.all_hosts(), node.allocations())
    got = _by_pid(_members(proc.process(batch)))
    trainer_uid, trainer_cid = node.ids("ml/trainer-0/main")
    # GPU 0 has one owner: pod-resources names it; the ids stay the cgroup's.
    assert got[100] == Workload(
        time=clock.now(),
        pid=100,
        container_id=trainer_cid,
        container_name="main",
        pod_uid=trainer_uid,
        pod_name="trainer-0",
        pod_namespace="ml",
    )
    # GPU 1 has two owners and nothing here says which process is whose: no names, not a guess.
    for pid, ref in ((200, "infer/server-a/server"), (300, "infer/server-b/server")):
        assert got[pid] == Workload(time=clock.now(), pid=pid, container_id=node.ids(ref)[1], pod_uid=node.ids(ref)[0])
    assert proc.watcher is not None
    assert proc.watcher.is_alive()
    clock.advance(10.0)  # the API server is back
    _until("the cache is synced after the outage", lambda: proc.view.synced)
    got = _by_pid(_members(proc.process(node.batch([(200, 1), (300, 1)], node.all_hosts(), node.allocations()))))
    assert (_names(got[200]), _names(got[300])) == (
        ("infer", "server-a", "server"),
        ("infer", "server-b", "server"),
    )


@pytest.mark.parametrize(
    ("options", "env_keys"),
    [
        ({"api": "off"}, ("NODE_NAME", "KUBECONFIG")),
        ({}, ("NODE_NAME",)),  # no KUBECONFIG, and not in a pod
        ({}, ("KUBECONFIG",)),  # no NODE_NAME: no node to scope to, and never a cluster-wide list
    ],
    ids=["api-off", "no-kubeconfig", "no-node-name"],
)
def test_without_api_access_no_thread_runs_and_allocations_name_sole_owners(
    node: Node, started: Callable[..., K8sProcessor], options: dict[str, Any], env_keys: tuple[str, ...]
) -> None:
    proc = started({key: node.env()[key] for key in env_keys}, **options)
    assert proc.watcher is None
    got = _by_pid(_members(proc.process(node.batch([(100, 0), (200, 1)], node.all_hosts(), node.allocations()))))
    assert (_names(got[100]), _names(got[200])) == (("ml", "trainer-0", "main"), (None, None, None))
    assert node.api.requests == {}


def test_single_owners_must_agree_and_not_be_contradicted(node: Node, started: Callable[..., K8sProcessor]) -> None:
    proc = started(node.env(), api="off")
    # 500 runs on GPU 0 (owner trainer-0) and GPU 2 (owner job-7): two owners, so no name.
    # 600 is in a pod (its cgroup has a UID) and GPU 2 has one owner: with no API to say otherwise, that one.
    hosts = [node.host(500, "ml/trainer-0/main"), HostProcess(time=node.clock.now(), pid=600, pod_uid="u-600")]
    got = _by_pid(_members(proc.process(node.batch([(500, 0), (500, 2), (600, 2)], hosts, node.allocations()))))
    assert _names(got[500]) == (None, None, None)
    assert _names(got[600]) == ("batch", "job-7", "run")
    assert got[600].pod_uid == "u-600"  # the cgroup's UID is kept as is


def test_an_owner_the_api_knows_under_another_uid_is_not_taken(
    node: Node, started: Callable[..., K8sProcessor]
) -> None:
    proc = started(node.env())
    _until("the pod cache is synced", lambda: proc.view.synced)
    # A pod the API does not know (created a moment ago) on trainer-0's GPU: the allocation names trainer-0,
    # whose UID the API knows to be another one.
    stranger = HostProcess(time=node.clock.now(), pid=700, container_id="c" * 64, pod_uid="u-new")
    [w] = _members(proc.process(node.batch([(700, 0)], [stranger], node.allocations())))
    assert w == Workload(time=node.clock.now(), pid=700, container_id="c" * 64, pod_uid="u-new")


# --- degraded mode and MIG -------------------------------------------------------------------


def test_without_host_processes_each_owning_container_gets_a_degraded_record(
    node: Node, started: Callable[..., K8sProcessor]
) -> None:
    proc = started(node.env())
    _until("the pod cache is synced", lambda: proc.view.synced)
    out = proc.process(node.batch([(100, 0), (200, 1), (300, 1)], (), node.allocations()))
    # No per-pid records (the pids join nothing): one per owning container, ids and UIDs from the API.
    expected = []
    for gpu, ref in ((0, "ml/trainer-0/main"), (1, "infer/server-a/server"), (1, "infer/server-b/server")):
        namespace, pod, container = ref.split("/")
        uid, cid = node.ids(ref)
        expected.append(
            Workload(
                time=node.clock.now(),
                pid=None,
                container_id=cid,
                container_name=container,
                pod_uid=uid,
                pod_name=pod,
                pod_namespace=namespace,
                extra=tuple(sorted((DEGRADED, ("device_id", node.gpu(gpu))))),
            )
        )
    assert len(_members(out)) == 3
    assert set(_members(out)) == set(expected)


def test_degraded_records_without_api_carry_names_only(node: Node, started: Callable[..., K8sProcessor]) -> None:
    proc = started(node.env(), api="off")
    # GPU 0: no HostProcess for its pid (degraded); GPU 2: one of its pids is visible (not degraded).
    hosts = [node.host(401, "batch/job-7/run")]
    out = proc.process(node.batch([(100, 0), (400, 2), (401, 2)], hosts, node.allocations()))
    got = _by_pid(_members(out))
    assert set(got) == {None, 400, 401}
    assert got[None] == Workload(
        time=node.clock.now(),
        pid=None,
        container_name="main",
        pod_name="trainer-0",
        pod_namespace="ml",
        extra=tuple(sorted((DEGRADED, ("device_id", node.gpu(0))))),
    )
    assert _names(got[400]) == ("batch", "job-7", "run")  # no cgroup, but GPU 2's sole owner
    assert got[400].pod_uid is None


def test_mig_allocations_are_resolved_to_their_gpu_instance(node: Node, started: Callable[..., K8sProcessor]) -> None:
    proc = started(node.env(), api="off")
    now = node.clock.now()
    allocation = DeviceAllocation(
        time=now,
        device_id=MIG_UUID,
        resource_name="nvidia.com/mig-1g.10gb",
        pod_name="embed-0",
        pod_namespace="ml",
        container_name="main",
        extra=(("device_id_form", "mig"), ("mig_uuid", MIG_UUID)),
    )
    layout = (
        MigInstance(time=now, device_id=MIG_GPU, gpu_instance_id=2, mig_uuid=MIG_UUID),
        MigInstance(time=now, device_id=MIG_GPU, gpu_instance_id=1, mig_uuid="MIG-other"),
    )
    samples = (
        GpuProcessSample(time=now, device_id=MIG_GPU, pid=800, gpu_instance_id=2),
        GpuProcessSample(time=now, device_id=MIG_GPU, pid=801, gpu_instance_id=1),  # an instance nobody owns
        GpuProcessSample(time=now, device_id=MIG_GPU, pid=802, gpu_instance_id=2),  # no HostProcess
    )
    hosts = (
        HostProcess(time=now, pid=800, container_id="e" * 64, pod_uid="u-embed"),
        HostProcess(time=now, pid=801, container_id="f" * 64, pod_uid="u-other"),
    )
    batch = Batch(time=now, interval_s=1.0, node=NODE).replace(
        gpu_processes=samples, host_processes=hosts, allocations=(allocation,), mig_instances=layout
    )
    got = _by_pid(_members(proc.process(batch)))
    assert set(got) == {800, 801, 802}
    assert _names(got[800]) == _names(got[802]) == ("ml", "embed-0", "main")
    assert _names(got[801]) == (None, None, None)
    # Without the layout the MIG UUID joins no GPU instance: nothing is named.
    bare = _by_pid(_members(proc.process(batch.replace(mig_instances=()))))
    assert _names(bare[800]) == (None, None, None)
    # Degraded on the instance (a processor that never saw the pid in /proc): its record says which instance.
    fresh = started(node.env(), api="off")
    [degraded] = _members(fresh.process(batch.replace(gpu_processes=samples[:1], host_processes=())))
    assert dict(degraded.extra) == {"degraded": "no_host_pid", "device_id": MIG_GPU, "gpu_instance_id": "2"}
    assert _names(degraded) == ("ml", "embed-0", "main")


# --- lifecycle and registration --------------------------------------------------------------


def test_shutdown_stops_the_watch_thread(node: Node, started: Callable[..., K8sProcessor]) -> None:
    proc = started(node.env())
    _until("the watch is open", lambda: node.api.requests["watch"] >= 1)
    watcher = proc.watcher
    assert watcher is not None
    assert watcher.is_alive()
    began = time.monotonic()
    proc.shutdown()
    assert not watcher.is_alive()
    assert time.monotonic() - began < 1.0  # the open watch is interrupted, not waited out
    assert proc.watcher is None
    proc.shutdown()  # twice is harmless


def test_the_cache_is_bounded_and_drops_deleted_pods_first() -> None:
    cache = PodCache(max_pods=2, keep_deleted_s=60.0)
    cache.replace([PodInfo(uid="a", name="a", namespace="ns"), PodInfo(uid="b", name="b", namespace="ns")], 0.0)
    cache.upsert(PodInfo(uid="c", name="c", namespace="ns"))  # full of live pods: c is not kept
    assert (sorted(cache.view.by_uid), cache.dropped) == (["a", "b"], 1)
    cache.delete("a", 5.0)
    cache.upsert(PodInfo(uid="c", name="c", namespace="ns"))  # the tombstone makes room
    assert sorted(cache.view.by_uid) == ["b", "c"]
    cache.delete("b", 10.0)
    assert (cache.expire(69.0), cache.expire(70.0)) == (0, 1)
    assert sorted(cache.view.by_uid) == ["c"]


def test_pod_json_becomes_a_cache_entry() -> None:
    pod = {
        "metadata": {"uid": "u1", "name": "p", "namespace": "ns", "labels": {"team": "a", "x": "y"}},
        "status": {
            "initContainerStatuses": [{"name": "init", "containerID": "containerd://" + "1" * 64}],
            "containerStatuses": [
                {"name": "main", "containerID": "cri-o://" + "2" * 64},
                {"name": "starting"},  # no id yet
            ],
        },
    }
    info = pod_info(pod, labels=["team"], annotations=["note"])
    assert info == PodInfo(
        uid="u1",
        name="p",
        namespace="ns",
        containers=(("1" * 64, "init"), ("2" * 64, "main")),
        extra=(("label_team", "a"),),
    )
    assert pod_info({"metadata": {"name": "no-uid"}}) is None


def test_factory_and_options() -> None:
    registry = Registry.from_entry_points()
    assert registry.get("processor", "k8s") is factory
    config = factory.default_config()
    assert isinstance(config, K8sConfig)
    assert (config.api, config.node_name, config.labels, config.max_pods) == ("auto", "", [], 1000)
    proc = factory.create(make_context("k8s"), K8sConfig(labels=["team", "team"]))
    assert isinstance(proc, K8sProcessor)
    assert (proc.needs, proc.provides) == (frozenset({"gpu_processes"}), frozenset({"workloads"}))
    assert proc.config.labels == ["team"]
    with pytest.raises(ValueError, match="cannot be empty"):
        K8sConfig(annotations=[""])
    with pytest.raises(ValueError, match="api"):
        K8sConfig(api="on")


def test_a_process_gone_from_proc_in_its_last_tick_keeps_its_container(
    clock: SteppedClock, node: Node, started: Callable[..., K8sProcessor]
) -> None:
    # Tick 1: /proc has pid 100 in trainer-0/main. Tick 2: the driver still lists it (its last joules)
    # but /proc no longer has it. It must stay in the same container series, not a guessed one.
    proc = started({})  # no API: the allocation fallback alone would name it without a container id
    first = _by_pid(_members(proc.process(node.batch([(100, 0)], node.all_hosts(), node.allocations()))))[100]
    clock.advance(5.0)
    hosts = [h for h in node.all_hosts() if h.pid != 100]
    second = _by_pid(_members(proc.process(node.batch([(100, 0)], hosts, node.allocations()))))[100]
    assert second == dataclasses.replace(first, time=clock.now())
    assert second.container_id == node.ids("ml/trainer-0/main")[1]
    # Gone from the driver's list too: forgotten, so a new process under that pid starts clean.
    clock.advance(5.0)
    proc.process(node.batch([], hosts, node.allocations()))
    clock.advance(5.0)
    third = _by_pid(_members(proc.process(node.batch([(100, 0)], [node.host(100)], node.allocations()))))[100]
    assert third.container_id is None
    assert third.pod_name is None
