"""The simulated kubelet pod-resources API, called through the generated stubs over its unix socket."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.proto.podresources.v1 import api_pb2, api_pb2_grpc
from wattpipe.simulator.fake_nvml import mig_uuid
from wattpipe.simulator.kubelet import KUBELET_RATE_LIMIT, KubeletServer, RateLimit, device_id, start_kubelet
from wattpipe.simulator.scenario import DeviceRef, hashed_uuid, parse_scenario

H100 = "GPU-00000000-1111-2222-3333-444444444444"
A100 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
# A100 MIG instances, derived the way the NVML face names them.
MIG_GI1 = mig_uuid(A100, 1)
MIG_GI2 = mig_uuid(A100, 2)


def _data() -> dict[str, Any]:
    """GPU 0: a whole H100 (NUMA 0); GPU 1: an A100 in MIG (NUMA 1); GPU 2: time-sliced by three pods."""
    return {
        "node": {"name": "kube-node"},
        "gpus": [
            {"model": "NVIDIA H100 80GB HBM3", "uuid": H100, "idle_w": 100, "max_w": 700},
            {
                "model": "NVIDIA A100-SXM4-40GB",
                "uuid": A100,
                "idle_w": 50,
                "max_w": 400,
                "mig": {"instances": [{"gi": 1, "profile": "3g.20gb"}, {"gi": 2, "profile": "1g.5gb"}]},
                "topology": {"numa": 1},
            },
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700, "topology": {"numa": 1}},
        ],
        "pods": [
            {
                "name": "trainer-0",
                "namespace": "ml",
                "containers": [
                    {"name": "main", "devices": [{"gpu": 0}]},
                    {"name": "sidecar"},
                ],
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
                {
                    "name": f"notebook-{n}",
                    "namespace": "lab",
                    "containers": [
                        {"name": "jupyter", "devices": [{"resource": "nvidia.com/gpu.shared", "gpu": 2, "replica": n}]}
                    ],
                }
                for n in range(3)
            ),
            {"name": "web", "containers": [{"name": "nginx"}]},
        ],
        "faults": [{"target": "kubelet", "kind": "down", "at_s": 10, "for_s": 5}],
    }


GPU2 = "GPU-" + hashed_uuid("gpu", "kube-node", 2)  # the scenario's derived UUID for GPU 2

# (namespace, pod, container, [(resource, device ids, NUMA ids)]) as List answers, in order.
EXPECTED_LIST = [
    ("ml", "trainer-0", "main", [("nvidia.com/gpu", [H100], [0])]),
    ("ml", "trainer-0", "sidecar", []),
    (
        "ml",
        "embed-0",
        "main",
        [("nvidia.com/mig-1g.5gb", [MIG_GI2], [1]), ("nvidia.com/mig-3g.20gb", [MIG_GI1], [1])],
    ),
    ("lab", "notebook-0", "jupyter", [("nvidia.com/gpu.shared", [f"{GPU2}::0"], [1])]),
    ("lab", "notebook-1", "jupyter", [("nvidia.com/gpu.shared", [f"{GPU2}::1"], [1])]),
    ("lab", "notebook-2", "jupyter", [("nvidia.com/gpu.shared", [f"{GPU2}::2"], [1])]),
    ("default", "web", "nginx", []),
]

Devices = list[tuple[str, list[str], list[int]]]


def _devices(entries: Any) -> Devices:
    return [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in entries]


def _flatten(pods: Any) -> list[tuple[str, str, str, Devices]]:
    return [(p.namespace, p.name, c.name, _devices(c.devices)) for p in pods for c in p.containers]


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def node(clock: SteppedClock) -> Iterator[simulator.SimulatedNode]:
    with simulator.build(parse_scenario(_data()), clock) as built:
        yield built


@contextmanager
def _stub(kubelet: KubeletServer) -> Iterator[api_pb2_grpc.PodResourcesListerStub]:
    # Its own subchannels: gRPC's global pool would hand a new channel the failure (and reconnect backoff) a
    # channel to the same address met while the socket was down (a flake under load).
    with grpc.insecure_channel(kubelet.endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        yield api_pb2_grpc.PodResourcesListerStub(channel)


def _list(kubelet: KubeletServer) -> api_pb2.ListPodResourcesResponse:
    with _stub(kubelet) as stub:
        response: api_pb2.ListPodResourcesResponse = stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
    return response


def test_list_reports_every_pod_container_and_device(node: simulator.SimulatedNode) -> None:
    with KubeletServer(node, poll_interval_s=None) as kubelet:
        assert kubelet.endpoint == f"unix://{kubelet.socket_path}"
        assert kubelet.socket_path.name == "kubelet.sock"
        response = _list(kubelet)
    assert _flatten(response.pod_resources) == EXPECTED_LIST
    assert node.scenario.gpus[2].uuid == GPU2
    assert MIG_GI2.startswith("MIG-")
    assert len(MIG_GI2) == 40
    trainer = response.pod_resources[0].containers[0]
    # CPU and memory managers run their default "none" policy: nothing exclusive to report.
    assert (list(trainer.cpu_ids), len(trainer.memory), len(trainer.dynamic_resources)) == ([], 0, 0)
    assert kubelet.requests == {"List": 1}


def test_legacy_mig_ids_name_the_parent_gpu_instance_and_compute_instance(node: simulator.SimulatedNode) -> None:
    with KubeletServer(node, device_id_form="mig-legacy", poll_interval_s=None) as kubelet:
        embed = _list(kubelet).pod_resources[1]
    assert _devices(embed.containers[0].devices) == [
        ("nvidia.com/mig-1g.5gb", [f"MIG-{A100}/2/0"], [1]),
        ("nvidia.com/mig-3g.20gb", [f"MIG-{A100}/1/0"], [1]),
    ]


def test_device_id_forms() -> None:
    scenario = parse_scenario(_data())
    assert device_id(scenario, DeviceRef(gpu=0)) == H100
    assert device_id(scenario, DeviceRef(gpu=0, replica=4)) == f"{H100}::4"
    assert device_id(scenario, DeviceRef(gpu=1, gi=2)) == MIG_GI2
    assert device_id(scenario, DeviceRef(gpu=1, gi=2), "mig-legacy") == f"MIG-{A100}/2/0"
    assert device_id(scenario, DeviceRef(gpu=1, gi=2, replica=1), "mig-legacy") == f"MIG-{A100}/2/0::1"


def test_grouped_shape_puts_a_resources_ids_in_one_entry() -> None:
    scenario = parse_scenario(
        {
            "gpus": [
                {"model": "NVIDIA H100 80GB HBM3", "uuid": H100, "idle_w": 100, "max_w": 700},
                {"model": "NVIDIA H100 80GB HBM3", "uuid": A100, "idle_w": 100, "max_w": 700, "topology": {"numa": 1}},
            ],
            "pods": [{"name": "p", "containers": [{"name": "c", "devices": [{"gpu": 0}, {"gpu": 1}]}]}],
        }
    )
    with simulator.build(scenario, SteppedClock()) as two_gpus, KubeletServer(two_gpus, group_devices=True) as kubelet:
        pod = _list(kubelet).pod_resources[0]
    assert _devices(pod.containers[0].devices) == [("nvidia.com/gpu", [H100, A100], [0, 1])]


def test_shared_time_sliced_gpu_keeps_all_its_pods(node: simulator.SimulatedNode) -> None:
    with KubeletServer(node, poll_interval_s=None) as kubelet:
        response = _list(kubelet)
    on_gpu2 = {
        (pod.namespace, pod.name): device_id
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
        if device_id.startswith(GPU2)
    }
    assert on_gpu2 == {
        ("lab", "notebook-0"): f"{GPU2}::0",
        ("lab", "notebook-1"): f"{GPU2}::1",
        ("lab", "notebook-2"): f"{GPU2}::2",
    }


def test_get_answers_one_pod(node: simulator.SimulatedNode) -> None:
    with KubeletServer(node, poll_interval_s=None) as kubelet, _stub(kubelet) as stub:
        response = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="notebook-1", pod_namespace="lab"), timeout=5)
    assert _flatten([response.pod_resources]) == [EXPECTED_LIST[4]]


def test_get_of_an_unknown_pod_fails_as_the_kubelet_does(node: simulator.SimulatedNode) -> None:
    request = api_pb2.GetPodResourcesRequest(pod_name="trainer-0", pod_namespace="default")  # trainer-0 is in ml
    kubelet = KubeletServer(node, poll_interval_s=None)
    with kubelet, _stub(kubelet) as stub, pytest.raises(grpc.RpcError) as raised:
        stub.Get(request, timeout=5)
    # The kubelet returns a plain Go error, which gRPC sends as UNKNOWN.
    assert raised.value.code() == grpc.StatusCode.UNKNOWN
    assert raised.value.details() == "pod trainer-0 in namespace default not found"


def test_get_of_an_unknown_pod_can_answer_not_found(node: simulator.SimulatedNode) -> None:
    kubelet = KubeletServer(node, get_not_found_code=grpc.StatusCode.NOT_FOUND, poll_interval_s=None)
    with kubelet, _stub(kubelet) as stub, pytest.raises(grpc.RpcError) as raised:
        stub.Get(api_pb2.GetPodResourcesRequest(pod_name="gone", pod_namespace="ml"), timeout=5)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert raised.value.details() == "pod gone in namespace ml not found"


def test_allocatable_lists_every_advertised_device(node: simulator.SimulatedNode) -> None:
    with KubeletServer(node, poll_interval_s=None) as kubelet, _stub(kubelet) as stub:
        response = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)
    assert _devices(response.devices) == [
        ("nvidia.com/gpu", [H100], [0]),
        ("nvidia.com/mig-3g.20gb", [MIG_GI1], [1]),
        ("nvidia.com/mig-1g.5gb", [MIG_GI2], [1]),
        ("nvidia.com/gpu.shared", [f"{GPU2}::0"], [1]),
        ("nvidia.com/gpu.shared", [f"{GPU2}::1"], [1]),
        ("nvidia.com/gpu.shared", [f"{GPU2}::2"], [1]),
    ]
    assert (list(response.cpu_ids), len(response.memory)) == ([], 0)


def test_allocatable_follows_a_mig_repartition_and_allocations_stay(clock: SteppedClock) -> None:
    data = _data()
    data["faults"] = [
        {"target": "gpu", "gpu": 1, "at_s": 20, "set": {"mig": {"instances": [{"gi": 3, "profile": "7g.40gb"}]}}}
    ]
    with simulator.build(parse_scenario(data), clock) as repartitioned, KubeletServer(repartitioned) as kubelet:
        clock.advance(20.0)
        with _stub(kubelet) as stub:
            allocatable = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)
        embed = _list(kubelet).pod_resources[1]
    assert _devices(allocatable.devices)[1:2] == [("nvidia.com/mig-7g.40gb", [mig_uuid(A100, 3)], [1])]
    assert len(allocatable.devices) == 5
    assert _devices(embed.containers[0].devices)[0] == ("nvidia.com/mig-1g.5gb", [MIG_GI2], [1])


def test_down_fault_removes_the_socket_and_restores_it(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    with KubeletServer(node, poll_interval_s=None) as kubelet:
        assert stat.S_ISSOCK(os.stat(kubelet.socket_path).st_mode)
        clock.advance(10.0)  # the fault: 10 s ≤ t < 15 s
        assert kubelet.refresh() is False
        assert not kubelet.socket_path.exists()
        assert not kubelet.serving
        with _stub(kubelet) as stub, pytest.raises(grpc.RpcError) as raised:
            stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        clock.advance(4.9)
        assert kubelet.refresh() is False
        clock.advance(0.1)
        assert kubelet.refresh() is True
        assert stat.S_ISSOCK(os.stat(kubelet.socket_path).st_mode)
        assert _flatten(_list(kubelet).pod_resources) == EXPECTED_LIST  # a new connection gets answers again
        assert kubelet.requests == {"List": 1}  # the refused call never reached the server


def test_a_call_reaching_the_server_after_the_fault_began_is_unavailable(
    node: simulator.SimulatedNode, clock: SteppedClock
) -> None:
    with KubeletServer(node, poll_interval_s=None) as kubelet, _stub(kubelet) as stub:
        stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
        clock.advance(12.0)  # no refresh: the old server is still bound
        with pytest.raises(grpc.RpcError) as raised:
            stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert raised.value.details() == "kubelet is down (simulated)"
        assert kubelet.requests == {"List": 2}


def test_the_poller_applies_the_fault_without_an_explicit_refresh(
    node: simulator.SimulatedNode, clock: SteppedClock
) -> None:
    with KubeletServer(node, poll_interval_s=0.01) as kubelet:
        clock.advance(10.0)
        deadline = time.monotonic() + 3.0
        while kubelet.socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not kubelet.socket_path.exists()
        clock.advance(5.0)
        while not kubelet.socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kubelet.socket_path.exists()


def test_a_server_started_inside_the_fault_binds_when_it_ends(clock: SteppedClock) -> None:
    with simulator.build(parse_scenario(_data()), clock) as node:
        clock.advance(11.0)
        kubelet = start_kubelet(node, poll_interval_s=None)
        assert not kubelet.socket_path.exists()
        clock.advance(4.0)
        assert kubelet.refresh() is True
        assert len(_list(kubelet).pod_resources) == 6
    assert not kubelet.socket_path.parent.exists()  # closing the node stopped it and removed its directory


def test_rate_limit_refuses_beyond_the_burst_until_the_clock_refills(
    node: simulator.SimulatedNode, clock: SteppedClock
) -> None:
    assert RateLimit(qps=100.0, burst=10) == KUBELET_RATE_LIMIT
    with KubeletServer(node, rate_limit=KUBELET_RATE_LIMIT, poll_interval_s=None) as kubelet, _stub(kubelet) as stub:
        request = api_pb2.ListPodResourcesRequest()
        for _ in range(10):
            assert len(stub.List(request, timeout=5).pod_resources) == 6
        with pytest.raises(grpc.RpcError) as raised:
            stub.List(request, timeout=5)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert raised.value.details() == "rejected by rate limit"
        clock.advance(0.01)  # 100/s × 0.01 s = one token
        assert len(stub.List(request, timeout=5).pod_resources) == 6
        with pytest.raises(grpc.RpcError):
            stub.List(request, timeout=5)
        assert kubelet.requests == {"List": 13}


def test_stop_removes_the_socket_and_its_temporary_directory(node: simulator.SimulatedNode, tmp_path: Path) -> None:
    own = KubeletServer(node, poll_interval_s=None).start()
    given = KubeletServer(node, socket_dir=tmp_path / "pod-resources", poll_interval_s=None).start()
    assert own.socket_path.exists()
    assert given.socket_path == tmp_path.resolve() / "pod-resources" / "kubelet.sock"
    own.stop()
    given.stop()
    given.stop()  # idempotent
    assert not own.socket_path.parent.exists()
    assert (tmp_path / "pod-resources").is_dir()
    assert not given.socket_path.exists()


def test_a_socket_path_too_long_for_unix_sockets_is_refused(node: simulator.SimulatedNode, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        KubeletServer(node, socket_dir=tmp_path / ("d" * 120))
    with pytest.raises(ValueError, match="device_id_form"):
        KubeletServer(node, device_id_form="uuid")  # type: ignore[arg-type]


def test_starts_and_answers_inside_an_asyncio_app(node: simulator.SimulatedNode) -> None:
    async def app() -> list[str]:
        with KubeletServer(node) as kubelet:
            async with grpc.aio.insecure_channel(kubelet.endpoint) as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                response = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
        return [pod.name for pod in response.pod_resources]

    assert asyncio.run(app()) == ["trainer-0", "embed-0", "notebook-0", "notebook-1", "notebook-2", "web"]


def test_slow_fault_answers_after_its_delay_in_real_seconds(clock: SteppedClock) -> None:
    data = _data()
    data["faults"] = [{"target": "kubelet", "kind": "slow", "at_s": 5, "for_s": 1, "delay_s": 0.2}]
    with simulator.build(parse_scenario(data), clock) as slow_node, KubeletServer(slow_node) as kubelet:
        started = time.monotonic()
        assert len(_list(kubelet).pod_resources) == 6
        fast_s = time.monotonic() - started
        clock.advance(5.0)
        started = time.monotonic()
        assert len(_list(kubelet).pod_resources) == 6
        slow_s = time.monotonic() - started
    assert slow_s >= 0.2
    assert fast_s < 0.2
