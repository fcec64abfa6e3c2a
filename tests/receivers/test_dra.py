"""The dra receiver against the simulator's cluster API: claims + slices → DeviceAllocations by GPU UUID."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DeviceAllocation, DeviceSignals
from wattpipe.processors.saturation import SaturationConfig, SaturationProcessor
from wattpipe.receivers.dra import DraConfig, DraReceiver, allocations
from wattpipe.simulator import build
from wattpipe.simulator.k8s_cluster_api import start_k8s_cluster_api
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import parse_scenario

NODE = "gpu-node-1"
G0 = "GPU-11111111-0000-0000-0000-000000000000"
G1 = "GPU-22222222-0000-0000-0000-000000000000"
OTHER = "GPU-33333333-0000-0000-0000-000000000000"

SCENARIO: dict[str, Any] = {
    "node": {"name": NODE},
    "cluster": {
        "pods": [
            {"name": "train", "namespace": "ml", "claims": ["train-gpus"], "scheduled_s": 0, "node": NODE},
            {"name": "a", "namespace": "ml", "claims": ["shared"], "scheduled_s": 0, "node": NODE},
            {"name": "b", "namespace": "ml", "claims": ["shared"], "scheduled_s": 0, "node": NODE},
            {"name": "elsewhere", "namespace": "ml", "claims": ["far"], "scheduled_s": 0, "node": "node-2"},
        ],
        "slices": [
            {"name": "s1", "node": NODE, "devices": [{"name": "gpu-0", "uuid": G0}, {"name": "gpu-1", "uuid": G1}]},
            {"name": "s2", "node": "node-2", "devices": [{"name": "gpu-0", "uuid": OTHER}]},
        ],
        "claims": [
            {"name": "train-gpus", "namespace": "ml", "pod": "train", "devices": [f"{NODE}/gpu-0"], "allocated_s": 20},
            {"name": "shared", "namespace": "ml", "pod": "a", "shared_with": ["b"], "devices": [f"{NODE}/gpu-1"]},
            {"name": "far", "namespace": "ml", "pod": "elsewhere", "devices": ["node-2/gpu-0"]},
        ],
    },
}


class Harness:
    def __init__(self, tmp: Path, dra: bool = True) -> None:
        self.clock = SteppedClock()
        self.node: SimulatedNode = build(parse_scenario(SCENARIO), self.clock)
        self.api = start_k8s_cluster_api(self.node, dra=dra)
        kubeconfig = self.api.write_kubeconfig(tmp / "kubeconfig")
        ctx = make_context("dra", "receiver", self.clock)
        self.receiver = DraReceiver(
            DraConfig(node_name=NODE, relist_backoff=0.05), ctx, env={"KUBECONFIG": str(kubeconfig)}
        )
        asyncio.run(self.receiver.start())

    def allocations_at(self, t_s: float, expected: int) -> list[DeviceAllocation]:
        self.clock.advance(t_s - self.node.t_s())
        got: list[DeviceAllocation] = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                got = [r for r in asyncio.run(self.receiver.collect()) if isinstance(r, DeviceAllocation)]
            except RuntimeError:
                got = []
            if len(got) == expected and (expected or self.receiver.unavailable or self.receiver.store.synced):
                return got
            time.sleep(0.02)
        raise AssertionError(f"at {t_s}s: {got}")

    def close(self) -> None:
        asyncio.run(self.receiver.shutdown())
        self.node.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


def test_claims_reserved_for_this_nodes_pods_become_allocations_by_uuid(harness: Harness) -> None:
    before = harness.allocations_at(5, 2)  # train's claim is not allocated until 20 s
    # The shared claim is reserved for a and b: each gets the GPU as a replica (shared, as time-slicing).
    assert sorted((a.device_id, a.pod_name, a.container_name, a.resource_name, a.replica) for a in before) == [
        (G1, "a", "c0", "gpu.nvidia.com", 0),
        (G1, "b", "c0", "gpu.nvidia.com", 1),
    ]
    after = harness.allocations_at(25, 3)
    assert {(a.device_id, a.pod_namespace, a.pod_name, a.container_name) for a in after} == {
        (G0, "ml", "train", "c0"),
        (G1, "ml", "a", "c0"),
        (G1, "ml", "b", "c0"),
    }
    assert OTHER not in {a.device_id for a in after}  # reserved for a pod on another node


def test_dra_pods_get_saturation_series(harness: Harness) -> None:
    allocations = harness.allocations_at(25, 3)
    now = Timestamp(25.0, 1_700_000_025.0)
    signals = DeviceSignals(time=now, device_id=G0, fields=(("clocks_event_reasons", 4.0),))
    batch = Batch(time=now, interval_s=5.0, node=NODE).with_records([signals, *allocations])
    out = SaturationProcessor(SaturationConfig()).process(batch)
    signals_g1 = DeviceSignals(time=now, device_id=G1, fields=(("clocks_event_reasons", 0.0),))
    out = SaturationProcessor(SaturationConfig()).process(batch.with_records([signals_g1]))
    pods = {(s.pod_name, s.saturation_scope) for s in out.saturation if s.signal == "clock_event_sw_power_cap"}
    assert pods == {(None, "device"), ("train", "exclusive"), ("a", "device_shared"), ("b", "device_shared")}


def test_a_cluster_without_dra_gives_nothing_and_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    h = Harness(tmp_path, dra=False)
    try:
        assert h.allocations_at(5, 0) == []
        time.sleep(0.3)  # several relists at 0.05 s backoff
        assert h.receiver.unavailable
        lines = [r for r in caplog.records if "does not serve resource.k8s.io/v1" in r.getMessage()]
        assert len(lines) == 1
    finally:
        h.close()


def test_the_shipped_saturation_scenarios_dra_pod(tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "saturation.yaml"
    clock = SteppedClock()
    with build(path, clock) as node:
        api = start_k8s_cluster_api(node)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        ctx = make_context("dra", "receiver", clock, node_name="saturation-node")
        receiver = DraReceiver(DraConfig(), ctx, env={"KUBECONFIG": str(kubeconfig)})
        asyncio.run(receiver.start())  # waits for the first lists
        try:
            (allocation,) = asyncio.run(receiver.collect())
        finally:
            asyncio.run(receiver.shutdown())
    assert isinstance(allocation, DeviceAllocation)
    assert (allocation.device_id, allocation.pod_namespace, allocation.pod_name, allocation.container_name) == (
        node.scenario.gpus[4].uuid,
        "ml",
        "dra-job",
        "c0",
    )


def _snapshot(attributes: dict[str, Any], nested: bool = False) -> dict[str, list[Mapping[str, Any]]]:
    device: dict[str, Any] = {"name": "gpu-0"}
    device.update({"basic": {"attributes": attributes}} if nested else {"attributes": attributes})
    pod = {
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpus", "resourceClaimName": "train-gpus"}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpus"}]}}, {"name": "sidecar"}],
        },
    }
    claim = {
        "metadata": {"namespace": "ml", "name": "train-gpus"},
        "status": {
            "allocation": {"devices": {"results": [{"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "train", "uid": "u1"}],
        },
    }
    slice_ = {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": NODE}, "devices": [device]}}
    return {"resourceclaims": [claim], "resourceslices": [slice_], "pods": [pod]}


@pytest.mark.parametrize(
    ("attributes", "nested"),
    [
        ({"uuid": {"string": G0}}, False),  # v1, as NVIDIA's driver publishes it
        ({"gpu.nvidia.com/uuid": {"string": G0}}, False),  # qualified with the driver's domain: the same name
        ({"uuid": {"string": G0}}, True),  # v1beta1: attributes under basic
    ],
)
def test_the_uuid_attribute_is_found_plain_qualified_or_nested(attributes: dict[str, Any], nested: bool) -> None:
    now = Timestamp(1.0, 1_700_000_001.0)
    got = allocations(_snapshot(attributes, nested), frozenset({"gpu.nvidia.com"}), "uuid", now)
    assert [(a.device_id, a.pod_name, a.container_name, a.replica) for a in got] == [(G0, "train", "main", None)]


def test_an_attribute_qualified_with_another_domain_is_not_the_uuid() -> None:
    now = Timestamp(1.0, 1_700_000_001.0)
    got = allocations(_snapshot({"example.com/uuid": {"string": G0}}), frozenset({"gpu.nvidia.com"}), "uuid", now)
    assert got == []
