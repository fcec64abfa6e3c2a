"""The k8s_cluster receiver against the simulator's cluster API: pending GPU pods, requests, requested/allocatable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.helpers.context import make_context
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import ClusterGpu
from wattpipe.receivers.k8s_cluster import K8sClusterConfig, K8sClusterReceiver
from wattpipe.simulator import build
from wattpipe.simulator.k8s_cluster_api import K8sClusterApi, start_k8s_cluster_api
from wattpipe.simulator.scenario import parse_scenario

GPU, SHARED, MIG = "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"

SCENARIO: dict[str, Any] = {
    "cluster": {
        "nodes": [
            {"name": "node-a", "allocatable": {GPU: 8, "cpu": 64}},
            {"name": "node-b", "allocatable": {GPU: 4, MIG: 7}},
        ],
        "pods": [
            {"name": "p1", "requests": {GPU: 4}, "scheduled_s": 0, "node": "node-a"},
            {"name": "p2", "requests": {GPU: 2, "cpu": 4}, "scheduled_s": 30, "node": "node-b"},
            {"name": "p3", "requests": {GPU: 8}, "created_s": 10},
            {
                "name": "p4",
                "requests": {MIG: 1},
                "containers": 2,
                "scheduled_s": 20,
                "node": "node-b",
                "finished_s": 50,
            },
            {"name": "p5", "namespace": "serving", "requests": {SHARED: 1}},
        ],
    }
}


class Cluster:
    def __init__(self, tmp: Path, **options: Any) -> None:
        self.clock = SteppedClock()
        self.node = build(parse_scenario(SCENARIO), self.clock)
        self.api: K8sClusterApi = start_k8s_cluster_api(self.node)
        kubeconfig = self.api.write_kubeconfig(tmp / "kubeconfig")
        config = K8sClusterConfig(relist_backoff=0.1, **options)
        self.receiver = K8sClusterReceiver(
            config, make_context("k8s_cluster", "receiver", self.clock), env={"KUBECONFIG": str(kubeconfig)}
        )
        asyncio.run(self.receiver.start())

    def at(self, t_s: float, expected: dict[str, tuple[int | None, int | None, float | None]]) -> None:
        """Move the clock to scenario time ``t_s`` and wait until the gauges are ``expected`` (real time, 5 s)."""
        self.clock.advance(t_s - self.node.t_s())
        got: dict[str, tuple[int | None, int | None, float | None]] = {}
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                records = asyncio.run(self.receiver.collect())
            except RuntimeError:
                records = []
            got = {
                r.resource_name: (r.pending_pod_count, r.pending_request_total, r.requested_allocatable_ratio)
                for r in records
                if isinstance(r, ClusterGpu)
            }
            if got.keys() == expected.keys() and all(
                got[k][:2] == expected[k][:2] and got[k][2] == pytest.approx(expected[k][2]) for k in expected
            ):
                return
            time.sleep(0.02)
        raise AssertionError(f"at {t_s}s: {got} != {expected}")

    def close(self) -> None:
        asyncio.run(self.receiver.shutdown())
        self.node.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.close()


def test_gauges_follow_pods_being_created_scheduled_and_finishing(cluster: Cluster) -> None:
    # The ratio is the seed's: devices requested by every non-terminated pod, pending ones included, over
    # allocatable, so demand beyond the cluster reads above 1 (p3's 8 GPUs on top of 6 asked of 12).
    cluster.at(5, {GPU: (1, 2, 6 / 12), MIG: (1, 2, 2 / 7), SHARED: (1, 1, None)})  # nothing allocates gpu.shared
    cluster.at(15, {GPU: (2, 10, 14 / 12), MIG: (1, 2, 2 / 7), SHARED: (1, 1, None)})  # p3 (8 GPUs) arrives
    cluster.at(25, {GPU: (2, 10, 14 / 12), MIG: (0, 0, 2 / 7), SHARED: (1, 1, None)})  # p4 (2 × 1 MIG) placed
    cluster.at(35, {GPU: (1, 8, 14 / 12), MIG: (0, 0, 2 / 7), SHARED: (1, 1, None)})  # p2 becomes schedulable
    cluster.at(55, {GPU: (1, 8, 14 / 12), MIG: (0, 0, 0.0), SHARED: (1, 1, None)})  # p4 finished: frees its MIGs


def test_it_watches_instead_of_polling_lists(cluster: Cluster) -> None:
    cluster.at(5, {GPU: (1, 2, 6 / 12), MIG: (1, 2, 2 / 7), SHARED: (1, 1, None)})
    cluster.at(35, {GPU: (1, 8, 14 / 12), MIG: (0, 0, 2 / 7), SHARED: (1, 1, None)})
    assert cluster.api.requests["list"] == 2  # pods and nodes, once each
    assert cluster.api.requests["watch"] >= 2


def test_each_gauge_can_be_switched_off(tmp_path: Path) -> None:
    c = Cluster(tmp_path, pending_request_total=False, requested_allocatable_ratio=False)
    try:
        c.at(5, {GPU: (1, None, None), MIG: (1, None, None), SHARED: (1, None, None)})
    finally:
        c.close()


def test_config_rejects_nothing_to_do_and_a_bad_pattern() -> None:
    with pytest.raises(ValidationError, match="every gauge is switched off"):
        K8sClusterConfig(pending_pod_count=False, pending_request_total=False, requested_allocatable_ratio=False)
    with pytest.raises(ValidationError, match="not a regular expression"):
        K8sClusterConfig(resource_pattern="(")


def test_no_api_is_a_clear_start_error() -> None:
    receiver = K8sClusterReceiver(K8sClusterConfig(), make_context("k8s_cluster", "receiver"), env={})
    with pytest.raises(RuntimeError, match="no Kubernetes API"):
        asyncio.run(receiver.start())


def test_values_are_absent_until_listed(tmp_path: Path) -> None:
    with build(parse_scenario(SCENARIO), SteppedClock()):
        receiver = K8sClusterReceiver(K8sClusterConfig(), make_context("k8s_cluster", "receiver"), env={})
        with pytest.raises(RuntimeError, match="not listed yet"):
            asyncio.run(receiver.collect())


def test_the_shipped_saturation_scenario(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "saturation.yaml"
    with build(path, clock) as node:
        api = start_k8s_cluster_api(node)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        receiver = K8sClusterReceiver(
            K8sClusterConfig(relist_backoff=0.1),
            make_context("k8s_cluster", "receiver", clock),
            env={"KUBECONFIG": str(kubeconfig)},
        )
        asyncio.run(receiver.start())
        try:
            harness = Cluster.__new__(Cluster)
            harness.clock, harness.node, harness.api, harness.receiver = clock, node, api, receiver
            # 60 s: big-job (4) and huge-job (16) wait beside 2 GPUs held: 22 asked of 10; mig-late waits for
            # the only MIG slice.
            harness.at(60, {GPU: (2, 20, 22 / 10), MIG: (1, 1, 1.0), SHARED: (0, 0, 0.0)})  # seen on a node: 0s
            # 130 s: big-job is placed on gpu-node-9; huge-job still waits.
            harness.at(130, {GPU: (1, 16, 22 / 10), MIG: (1, 1, 1.0), SHARED: (0, 0, 0.0)})
        finally:
            asyncio.run(receiver.shutdown())


def test_the_kubeconfig_option_is_used_before_the_environment(tmp_path: Path) -> None:
    # A config's kubeconfig wins over in-cluster credentials and $KUBECONFIG (here: neither would work).
    clock = SteppedClock()
    with build(parse_scenario(SCENARIO), clock) as node:
        kubeconfig = start_k8s_cluster_api(node).write_kubeconfig(tmp_path / "kubeconfig")
        env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": str(tmp_path / "missing")}
        receiver = K8sClusterReceiver(
            K8sClusterConfig(kubeconfig=str(kubeconfig)), make_context("k8s_cluster", "receiver", clock), env=env
        )
        asyncio.run(receiver.start())
        try:
            clock.advance(5.0)
            records = asyncio.run(receiver.collect())
            gauges = {r.resource_name: r.pending_pod_count for r in records if isinstance(r, ClusterGpu)}
        finally:
            asyncio.run(receiver.shutdown())
    assert gauges == {GPU: 1, MIG: 1, SHARED: 1}
