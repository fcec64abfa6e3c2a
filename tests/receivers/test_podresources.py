"""The podresources receiver against the simulator's kubelet over a real unix socket, and its id parser."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from concurrent import futures
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from tests.helpers.context import make_context
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.components import ENTRY_POINT_GROUP
from wattpipe.pipeline.proto.podresources.v1 import api_pb2, api_pb2_grpc
from wattpipe.pipeline.records import DeviceAllocation, MigInstance, Record
from wattpipe.processors.k8s._mig_uuids import resolve_mig_uuids
from wattpipe.receivers.podresources import (
    DEFAULT_ENDPOINT,
    ParsedDeviceId,
    PodResourcesConfig,
    PodResourcesError,
    PodResourcesRateLimited,
    PodResourcesReceiver,
    PodResourcesUnavailable,
    ResourceMatcher,
    factory,
    parse_device_id,
)
from wattpipe.simulator.kubelet import KUBELET_RATE_LIMIT, DeviceIdForm, KubeletServer
from wattpipe.simulator.scenario import hashed_uuid, parse_scenario

H100 = "GPU-00000000-1111-2222-3333-444444444444"
A100 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
TS_GPU = "GPU-" + hashed_uuid("gpu", "kube-node", 2)  # time-sliced as nvidia.com/gpu
SHARED_GPU = "GPU-" + hashed_uuid("gpu", "kube-node", 3)  # time-sliced, renamed nvidia.com/gpu.shared
A100_UPPER = "GPU-" + A100[4:].upper()
MIG_GI1 = simulator.mig_uuid(A100, 1)
MIG_GI2 = simulator.mig_uuid(A100, 2)


def scenario_data(faults: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """GPU 0 whole; GPU 1 MIG (gi 1, gi 2); GPU 2 time-sliced by two pods; GPU 3 shared under a renamed resource."""
    h100 = {"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700}
    return {
        "node": {"name": "kube-node"},
        "gpus": [
            {**h100, "uuid": H100},
            {
                "model": "NVIDIA A100-SXM4-40GB",
                "uuid": A100,
                "idle_w": 50,
                "max_w": 400,
                "mig": {"instances": [{"gi": 1, "profile": "3g.20gb"}, {"gi": 2, "profile": "1g.5gb"}]},
            },
            h100,
            h100,
        ],
        "pods": [
            {
                "name": "trainer-0",
                "namespace": "ml",
                "containers": [{"name": "main", "devices": [{"gpu": 0}]}, {"name": "sidecar"}],
            },
            {
                "name": "embed-0",
                "namespace": "ml",
                "containers": [
                    {
                        "name": "main",
                        "devices": [
                            {"resource": "nvidia.com/mig-1g.5gb", "gpu": 1, "gi": 2},
                            {"resource": "nvidia.com/mig-3g.20gb", "gpu": 1, "gi": 1},
                        ],
                    }
                ],
            },
            *(
                {"name": f"notebook-{n}", "namespace": "lab", "containers": [{"name": "jupyter", "devices": [ref]}]}
                for n, ref in enumerate([{"gpu": 2, "replica": 0}, {"gpu": 2, "replica": 1}])
            ),
            *(
                {"name": f"shared-{n}", "namespace": "lab", "containers": [{"name": "app", "devices": [ref]}]}
                for n, ref in enumerate(
                    [
                        {"resource": "nvidia.com/gpu.shared", "gpu": 3, "replica": 0},
                        {"resource": "nvidia.com/gpu.shared", "gpu": 3, "replica": 3},
                    ]
                )
            ),
            {"name": "web", "containers": [{"name": "nginx"}]},
        ],
        "faults": faults or [],
    }


def alloc(
    at: Timestamp,
    ns_pod_container: str,
    device_id: str,
    resource: str = "nvidia.com/gpu",
    gi: int | None = None,
    replica: int | None = None,
    extra: tuple[tuple[str, str], ...] = (),
) -> DeviceAllocation:
    namespace, pod, container = ns_pod_container.split("/")
    return DeviceAllocation(
        time=at,
        device_id=device_id,
        resource_name=resource,
        pod_name=pod,
        pod_namespace=namespace,
        container_name=container,
        gpu_instance_id=gi,
        replica=replica,
        extra=extra,
    )


def expected(at: Timestamp, form: DeviceIdForm = "mig", *, shared: bool = False) -> list[DeviceAllocation]:
    """What the receiver reports for scenario_data() at ``at`` (``shared``: with nvidia.com/gpu.shared)."""
    if form == "mig":
        mig = [
            alloc(at, "ml/embed-0/main", MIG_GI2, "nvidia.com/mig-1g.5gb", extra=_mig_extra(MIG_GI2)),
            alloc(at, "ml/embed-0/main", MIG_GI1, "nvidia.com/mig-3g.20gb", extra=_mig_extra(MIG_GI1)),
        ]
    else:
        legacy = (("compute_instance_id", "0"), ("device_id_form", "mig-legacy"))
        mig = [
            alloc(at, "ml/embed-0/main", A100, "nvidia.com/mig-1g.5gb", gi=2, extra=legacy),
            alloc(at, "ml/embed-0/main", A100, "nvidia.com/mig-3g.20gb", gi=1, extra=legacy),
        ]
    out = [
        alloc(at, "ml/trainer-0/main", H100),
        *mig,
        alloc(at, "lab/notebook-0/jupyter", TS_GPU, replica=0),
        alloc(at, "lab/notebook-1/jupyter", TS_GPU, replica=1),
    ]
    if shared:
        out += [
            alloc(at, "lab/shared-0/app", SHARED_GPU, "nvidia.com/gpu.shared", replica=0),
            alloc(at, "lab/shared-1/app", SHARED_GPU, "nvidia.com/gpu.shared", replica=3),
        ]
    return out


def _mig_extra(mig_uuid: str) -> tuple[tuple[str, str], ...]:
    return (("device_id_form", "mig"), ("mig_uuid", mig_uuid))


class Sim:
    """A simulated node, its kubelet on a unix socket in a temporary directory, and a receiver for it."""

    def __init__(self, data: dict[str, Any], form: DeviceIdForm = "mig", **kubelet: Any) -> None:
        self.clock = SteppedClock()
        self.node = simulator.build(parse_scenario(data), self.clock)
        self.kubelet = KubeletServer(self.node, device_id_form=form, poll_interval_s=None, **kubelet).start()

    def receiver(self, **options: Any) -> PodResourcesReceiver:
        return make_receiver(self.clock, endpoint=self.kubelet.endpoint, **options)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.kubelet.refresh()

    def lists(self) -> int:
        return self.kubelet.requests["List"]

    def close(self) -> None:
        self.node.close()


@pytest.fixture
def make_sim() -> Iterator[Callable[..., Sim]]:
    """Sims for a test, all closed at its end (which stops their kubelets and removes their sockets)."""
    made: list[Sim] = []

    def make(faults: list[dict[str, Any]] | None = None, form: DeviceIdForm = "mig", **kubelet: Any) -> Sim:
        made.append(Sim(scenario_data(faults), form, **kubelet))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture
def sim(make_sim: Callable[..., Sim]) -> Sim:
    return make_sim()


def make_receiver(clock: SteppedClock, **options: Any) -> PodResourcesReceiver:
    return PodResourcesReceiver(PodResourcesConfig(**options), make_context("podresources", "receiver", clock))


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a test's steps on one event loop, as the pipeline does (a gRPC aio channel belongs to its loop)."""
    asyncio.run(scenario())


async def collect(receiver: PodResourcesReceiver) -> list[Record]:
    return list(await receiver.collect())


# --- against the simulated kubelet ------------------------------------------------------------------


def test_whole_gpus_mig_devices_and_replicas_are_one_allocation_each(sim: Sim) -> None:
    receiver = sim.receiver()

    async def steps() -> None:
        await receiver.start()
        assert await collect(receiver) == expected(sim.clock.now())
        await receiver.shutdown()

    run(steps)
    assert sim.lists() == 1


def test_legacy_mig_ids_give_the_parent_gpu_and_its_instance(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(form="mig-legacy")
    receiver = sim.receiver()

    async def steps() -> None:
        assert await collect(receiver) == expected(sim.clock.now(), "mig-legacy")
        await receiver.shutdown()

    run(steps)


def test_a_time_sliced_gpu_keeps_every_pod_sharing_it(sim: Sim) -> None:
    receiver = sim.receiver(extra_resources=["nvidia.com/gpu.shared"])
    records: list[Record] = []

    async def steps() -> None:
        records.extend(await collect(receiver))
        await receiver.shutdown()

    run(steps)
    on = {
        gpu: [(r.pod_name, r.replica) for r in records if isinstance(r, DeviceAllocation) and r.device_id == gpu]
        for gpu in (TS_GPU, SHARED_GPU)
    }
    assert on == {TS_GPU: [("notebook-0", 0), ("notebook-1", 1)], SHARED_GPU: [("shared-0", 0), ("shared-1", 3)]}


def test_a_renamed_shared_resource_is_reported_when_configured(sim: Sim) -> None:
    receiver = sim.receiver(extra_resources=["nvidia.com/gpu.shared"])

    async def steps() -> None:
        assert await collect(receiver) == expected(sim.clock.now(), shared=True)
        await receiver.shutdown()

    run(steps)


def test_resources_not_configured_are_ignored(sim: Sim) -> None:
    whole_only = sim.receiver(resources=["nvidia.com/gpu"])
    shared_only = sim.receiver(resources=["nvidia.com/gpu.*"])

    async def steps() -> None:
        now = sim.clock.now()
        assert await collect(whole_only) == [
            alloc(now, "ml/trainer-0/main", H100),
            alloc(now, "lab/notebook-0/jupyter", TS_GPU, replica=0),
            alloc(now, "lab/notebook-1/jupyter", TS_GPU, replica=1),
        ]
        assert await collect(shared_only) == expected(now, shared=True)[-2:]
        await whole_only.shutdown()
        await shared_only.shutdown()

    run(steps)


def test_socket_absent_at_start_warns_raises_each_tick_then_recovers(
    make_sim: Callable[..., Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = make_sim([{"target": "kubelet", "kind": "down", "at_s": 0, "for_s": 10}])
    assert not sim.kubelet.serving
    receiver = sim.receiver()

    async def steps() -> None:
        with caplog.at_level(logging.WARNING):
            await receiver.start()
        assert f"receiver podresources: no kubelet socket at {sim.kubelet.socket_path} yet" in caplog.text
        for _ in range(2):  # a tick, and the next: no records, and a clear typed error each time
            with pytest.raises(
                PodResourcesUnavailable, match=re.escape(f"no kubelet socket at {sim.kubelet.socket_path}")
            ):
                await receiver.collect()
            sim.advance(5.0)
        assert sim.kubelet.serving
        assert await collect(receiver) == expected(sim.clock.now())
        await receiver.shutdown()

    run(steps)
    assert receiver.client.dials == 1  # no channel is opened to a socket that is not there


def test_a_restarted_kubelet_is_redialled_on_the_next_tick(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim([{"target": "kubelet", "kind": "down", "at_s": 10, "for_s": 5}])
    receiver = sim.receiver()

    async def steps() -> None:
        assert await collect(receiver) == expected(sim.clock.now())
        sim.advance(10.0)  # stopped: the socket is gone
        sim.advance(5.0)  # restarted: a new socket file at the same path, and no tick in between
        assert await collect(receiver) == expected(sim.clock.now())
        await receiver.shutdown()

    run(steps)
    assert receiver.client.dials == 2
    assert sim.lists() == 2


def test_a_tick_while_the_kubelet_is_down_fails_typed_and_the_next_one_reconnects(
    make_sim: Callable[..., Sim],
) -> None:
    sim = make_sim([{"target": "kubelet", "kind": "down", "at_s": 10, "for_s": 5}])
    receiver = sim.receiver()

    async def steps() -> None:
        assert len(await collect(receiver)) == 5
        sim.clock.advance(10.0)  # down, but the old server has not let go of the socket yet
        with pytest.raises(PodResourcesUnavailable, match=r"is unreachable \(UNAVAILABLE\)"):
            await receiver.collect()
        sim.kubelet.refresh()  # now the socket is gone
        with pytest.raises(PodResourcesUnavailable, match="no kubelet socket"):
            await receiver.collect()
        sim.advance(5.0)
        assert await collect(receiver) == expected(sim.clock.now())
        await receiver.shutdown()

    run(steps)
    assert receiver.client.dials == 2


def test_no_answer_within_the_timeout_is_unavailable(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim([{"target": "kubelet", "kind": "slow", "at_s": 5, "for_s": 5, "delay_s": 0.5}])
    receiver = sim.receiver(timeout="100ms")

    async def steps() -> None:
        assert len(await collect(receiver)) == 5
        sim.advance(5.0)
        with pytest.raises(PodResourcesUnavailable, match=r"did not answer in time \(DEADLINE_EXCEEDED\)"):
            await receiver.collect()
        sim.advance(5.0)
        assert await collect(receiver) == expected(sim.clock.now())
        await receiver.shutdown()

    run(steps)


def _drain(kubelet: KubeletServer) -> None:
    """Another client on the node spends the kubelet's whole burst (its tokens refill on the node clock)."""
    with grpc.insecure_channel(kubelet.endpoint) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        for _ in range(KUBELET_RATE_LIMIT.burst):
            stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_rate_limited_backs_off_and_reuses_the_last_answer(
    make_sim: Callable[..., Sim], caplog: pytest.LogCaptureFixture
) -> None:
    sim = make_sim(rate_limit=KUBELET_RATE_LIMIT)
    receiver = sim.receiver(backoff_max="3s")
    calls: list[int] = []  # List calls the receiver made, after each tick

    async def tick(advance_s: float, *, drain: bool = True) -> list[Record]:
        sim.advance(advance_s)
        if drain:
            _drain(sim.kubelet)
        before = sim.lists()
        records = await collect(receiver)
        calls.append(sim.lists() - before)
        return records

    async def steps() -> None:
        first = sim.clock.now()
        assert await tick(0.0, drain=False) == expected(first)
        with caplog.at_level(logging.WARNING):
            # Refused: the answer from 5 s ago, unchanged (its time says how old it is); back off 1 s.
            assert await tick(5.0) == expected(first)
            assert await tick(0.5) == expected(first)  # within the backoff: no call
            assert await tick(0.5) == expected(first)  # refused again: back off 2 s
            assert await tick(1.5) == expected(first)
            assert await tick(0.5) == expected(first)  # refused: 4 s, bounded by backoff_max to 3 s
            assert await tick(2.5) == expected(first)
            assert await tick(0.5) == expected(first)  # refused: 3 s
            assert await tick(3.0, drain=False) == expected(second := sim.clock.now())  # answered: fresh
            assert await tick(0.5) == expected(second)  # refused: back off 1 s again, not 6
            assert await tick(1.0, drain=False) == expected(sim.clock.now())
        await receiver.shutdown()

    run(steps)
    assert calls == [1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 1]
    # Rate-limited: one line however many ticks.
    assert [r.getMessage() for r in caplog.records] == [
        f"receiver podresources: the kubelet at {sim.kubelet.endpoint} refuses List with RESOURCE_EXHAUSTED "
        "(rate limit); reusing its answer from 5s ago, next try in 1s"
    ]


def test_rate_limited_before_any_answer_raises_a_typed_error(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(rate_limit=KUBELET_RATE_LIMIT)
    receiver = sim.receiver()

    async def steps() -> None:
        _drain(sim.kubelet)
        for _ in range(2):  # refused, then backing off without calling: the same error
            with pytest.raises(PodResourcesRateLimited, match="RESOURCE_EXHAUSTED") as raised:
                await receiver.collect()
            assert str(raised.value) == (
                f"the kubelet at {sim.kubelet.endpoint} refuses List with RESOURCE_EXHAUSTED (rate limit) "
                "and no answer came before; backing off"
            )
        assert sim.lists() == KUBELET_RATE_LIMIT.burst + 2
        sim.advance(1.0)
        assert await collect(receiver) == expected(sim.clock.now())
        await receiver.shutdown()

    run(steps)


def test_refresh_reuses_the_answer_with_the_time_it_was_given(sim: Sim) -> None:
    receiver = sim.receiver(refresh="30s")

    async def steps() -> None:
        first = sim.clock.now()
        assert await collect(receiver) == expected(first)
        sim.advance(29.0)
        assert await collect(receiver) == expected(first)
        assert sim.lists() == 1
        sim.advance(1.0)
        assert await collect(receiver) == expected(sim.clock.now())
        assert sim.lists() == 2
        await receiver.shutdown()

    run(steps)


# --- against a hand-written kubelet ---------------------------------------------------------------


class _FixedLister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, response: api_pb2.ListPodResourcesResponse) -> None:
        self.response = response

    def List(self, request: api_pb2.ListPodResourcesRequest, context: Any) -> api_pb2.ListPodResourcesResponse:
        return self.response


@pytest.fixture
def fixed_kubelet() -> Iterator[Callable[[api_pb2.ListPodResourcesResponse], str]]:
    """A kubelet answering one fixed List response on a unix socket: returns its endpoint."""
    directory = Path(tempfile.mkdtemp(prefix="wattpipe-podres-"))  # short: sun_path holds 107 bytes
    servers: list[Any] = []

    def serve(response: api_pb2.ListPodResourcesResponse) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_FixedLister(response), server)
        server.add_insecure_port(f"unix:{directory}/kubelet.sock")
        server.start()
        servers.append(server)
        return f"unix://{directory}/kubelet.sock"

    yield serve
    for server in servers:
        server.stop(grace=None).wait(timeout=5)
    shutil.rmtree(directory, ignore_errors=True)


def test_unknown_id_forms_are_skipped_with_a_warning_naming_them(
    fixed_kubelet: Callable[[api_pb2.ListPodResourcesResponse], str], caplog: pytest.LogCaptureFixture
) -> None:
    devices = api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["0", H100, H100])
    pod = api_pb2.PodResources(
        name="p", namespace="ns", containers=[api_pb2.ContainerResources(name="c", devices=[devices])]
    )
    clock = SteppedClock()
    receiver = make_receiver(clock, endpoint=fixed_kubelet(api_pb2.ListPodResourcesResponse(pod_resources=[pod])))

    async def steps() -> None:
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                assert await collect(receiver) == [alloc(clock.now(), "ns/p/c", H100)]  # the repeat: once
                clock.advance(5.0)
        await receiver.shutdown()

    run(steps)
    assert [r.getMessage() for r in caplog.records] == [
        "receiver podresources: device id '0' of nvidia.com/gpu (pod ns/p, container c) is of no known form "
        "(GPU-<uuid>, MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>, each with an optional ::<replica>); skipped. "
        "Is the device plugin's deviceIDStrategy 'index'? It must be 'uuid'"
    ]


def test_grouped_ids_are_split_and_other_resources_ignored(
    fixed_kubelet: Callable[[api_pb2.ListPodResourcesResponse], str],
) -> None:
    # Older kubelets group a resource's ids in one entry.
    devices = api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[H100, f"{A100}::2"])
    fpga = api_pb2.ContainerDevices(resource_name="example.com/fpga", device_ids=[H100])
    pod = api_pb2.PodResources(
        name="p", namespace="ns", containers=[api_pb2.ContainerResources(name="c", devices=[devices, fpga])]
    )
    clock = SteppedClock()
    receiver = make_receiver(clock, endpoint=fixed_kubelet(api_pb2.ListPodResourcesResponse(pod_resources=[pod])))

    async def steps() -> None:
        assert await collect(receiver) == [
            alloc(clock.now(), "ns/p/c", H100),
            alloc(clock.now(), "ns/p/c", A100, replica=2),
        ]
        await receiver.shutdown()

    run(steps)


def test_an_empty_answer_is_no_allocations_not_an_error(
    fixed_kubelet: Callable[[api_pb2.ListPodResourcesResponse], str],
) -> None:
    receiver = make_receiver(SteppedClock(), endpoint=fixed_kubelet(api_pb2.ListPodResourcesResponse()))

    async def steps() -> None:
        assert await collect(receiver) == []
        await receiver.shutdown()

    run(steps)


def test_other_grpc_failures_are_typed_errors() -> None:
    directory = Path(tempfile.mkdtemp(prefix="wattpipe-podres-"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))  # no servicer: List is UNIMPLEMENTED
    server.add_insecure_port(f"unix:{directory}/kubelet.sock")
    server.start()
    receiver = make_receiver(SteppedClock(), endpoint=f"unix://{directory}/kubelet.sock")

    async def steps() -> None:
        with pytest.raises(PodResourcesError, match="failed List: UNIMPLEMENTED") as raised:
            await receiver.collect()
        assert type(raised.value) is PodResourcesError
        await receiver.shutdown()

    try:
        run(steps)
    finally:
        server.stop(grace=None).wait(timeout=5)
        shutil.rmtree(directory, ignore_errors=True)


# --- the device-id parser ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (H100, ParsedDeviceId(H100, "gpu", H100)),
        (f"{H100}::0", ParsedDeviceId(f"{H100}::0", "gpu", H100, replica=0)),
        (f"{H100}::17", ParsedDeviceId(f"{H100}::17", "gpu", H100, replica=17)),
        (MIG_GI1, ParsedDeviceId(MIG_GI1, "mig", MIG_GI1)),
        (f"{MIG_GI1}::3", ParsedDeviceId(f"{MIG_GI1}::3", "mig", MIG_GI1, replica=3)),
        (f"MIG-{A100}/7/0", ParsedDeviceId(f"MIG-{A100}/7/0", "mig-legacy", A100, 7, 0)),
        (f"MIG-{A100}/13/2::1", ParsedDeviceId(f"MIG-{A100}/13/2::1", "mig-legacy", A100, 13, 2, 1)),
        (A100_UPPER, ParsedDeviceId(A100_UPPER, "gpu", A100_UPPER)),  # as given: no case folding
    ],
)
def test_parse_every_device_id_form(raw: str, parsed: ParsedDeviceId) -> None:
    assert parse_device_id(raw) == parsed


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "0",  # deviceIDStrategy: index
        "1::0",
        "GPU-",
        "GPU-xyz",
        H100[:-1],  # a digit short
        f"{H100}0",
        f"{H100}::",
        f"{H100}::-1",
        f"{H100}::a",
        f"{H100}:1",
        f"{H100}::1::2",
        f" {H100}",
        f"gpu-{H100[4:]}",
        "MIG-",
        f"MIG-{A100}",  # a GPU UUID after MIG- with no instance
        f"MIG-{A100}/1",
        f"MIG-{A100}/1/",
        f"MIG-{A100}/a/0",
        f"MIG-{A100}/1/0/0",
        f"MIG-{A100}/-1/0",
        "MIG-GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeee/1/0",
        f"{MIG_GI1}/1/0",
        "nvidia0",
        "/dev/nvidia0",
    ],
)
def test_garbage_device_ids_are_no_known_form(raw: str) -> None:
    assert parse_device_id(raw) is None


def test_mig_uuids_resolve_to_their_parent_gpu_and_instance() -> None:
    at = Timestamp(1.0, 2.0)
    instances = [
        MigInstance(time=at, device_id=A100, gpu_instance_id=1, profile="3g.20gb", mig_uuid=MIG_GI1),
        MigInstance(time=at, device_id=A100, gpu_instance_id=2, profile="1g.5gb", mig_uuid=MIG_GI2),
    ]
    gone = simulator.mig_uuid(A100, 5)  # destroyed since: left as it was, joining no GPU
    allocations = [
        alloc(at, "ml/a/c", H100),
        alloc(at, "ml/b/c", MIG_GI2, "nvidia.com/mig-1g.5gb", extra=_mig_extra(MIG_GI2)),
        alloc(at, "ml/c/c", gone, "nvidia.com/mig-1g.5gb", extra=_mig_extra(gone)),
        alloc(at, "ml/d/c", A100, "nvidia.com/mig-3g.20gb", gi=1),
    ]
    assert resolve_mig_uuids(allocations, instances) == [
        allocations[0],
        alloc(at, "ml/b/c", A100, "nvidia.com/mig-1g.5gb", gi=2, extra=_mig_extra(MIG_GI2)),
        allocations[2],
        allocations[3],
    ]


# --- options and registration -----------------------------------------------------------------------


def test_defaults() -> None:
    config = PodResourcesConfig()
    assert config.endpoint == DEFAULT_ENDPOINT == "unix:///var/lib/kubelet/pod-resources/kubelet.sock"
    assert (config.refresh, config.timeout, config.backoff_max) == (0.0, 2.0, 60.0)
    assert (config.resources, config.extra_resources) == (["nvidia.com/gpu", "nvidia.com/mig-*"], [])


def test_resource_matcher_takes_names_and_prefixes() -> None:
    wanted = ResourceMatcher.of(["nvidia.com/gpu", "nvidia.com/mig-*"])
    assert [
        wanted(n) for n in ("nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared", "nvidia.com/mig")
    ] == [
        True,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"resources": ["*"]}, "write a name"),
        ({"extra_resources": ["nvidia.com/*gpu"]}, "write a name"),
        ({"resources": ["nvidia.com/mig-**"]}, "write a name"),
        ({"endpoint": ""}, "names no socket"),
        ({"endpoint": "unix://"}, "names no socket"),
        ({"endpoint": "unix://var/lib/kubelet/pod-resources/kubelet.sock"}, "absolute path"),
        ({"refresh": "-1s"}, "refresh"),
        ({"timeout": 0}, "timeout"),
        ({"socket": "/x"}, "socket"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PodResourcesConfig(**options)


def test_registered_as_an_alpha_receiver_of_allocations() -> None:
    (entry,) = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "podresources"]
    assert entry.load() is factory
    assert (factory.stability, factory.provides) == ("alpha", frozenset({"allocations"}))
    receiver = factory.create(make_context("podresources", "receiver"), factory.default_config())
    assert isinstance(receiver, PodResourcesReceiver)
    assert receiver.provides == frozenset({"allocations"})
