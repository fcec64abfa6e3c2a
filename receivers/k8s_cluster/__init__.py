"""Receiver ``k8s_cluster``: scheduler-level GPU saturation, cluster-wide (one instance per cluster).

Node agents cannot see pods that no node has taken. This receiver, run once per cluster (the Helm chart's
``cluster`` Deployment; off in the DaemonSet), keeps every pod and node in memory by list + watch
(``_watch``) and gives, per GPU resource name seen (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
``nvidia.com/mig-*``, or ``resource_pattern``), a :class:`~pipeline.records.ClusterGpu`:
- ``pending_pod_count``: pods not yet scheduled that ask for it;
- ``pending_request_total``: the devices they ask for;
- ``requested_allocatable_ratio``: devices requested by non-terminated pods (pending ones included, as in
  seed 003: above 1 when demand exceeds the cluster) / allocatable on all nodes.
Each can be switched off. Until both lists have answered, ``collect`` fails (counted, logged) and the
values are absent, never 0. Needs get/list/watch on pods and nodes (the chart's ClusterRole).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Self

from pydantic import model_validator

from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.kube import api_client, kube_env
from wattpipe.pipeline.records import ClusterGpu, Record
from wattpipe.receivers._list_watch import Watcher, stop_all, wait_synced
from wattpipe.receivers.k8s_cluster._state import ClusterState, Gauge, pod_requests

__all__ = ["ClusterState", "Gauge", "K8sClusterConfig", "K8sClusterReceiver", "factory", "pod_requests"]

_PROVIDES = frozenset({"cluster_gpu"})


class NotSynced(RuntimeError):
    """The pods or nodes have not been listed yet."""


class K8sClusterConfig(ComponentConfig):
    pending_pod_count: bool = True
    """``cluster_gpu_pending_pod_count{resource}``."""
    pending_request_total: bool = True
    """``cluster_gpu_pending_request_total{resource}``."""
    requested_allocatable_ratio: bool = True
    """``cluster_gpu_requested_allocatable_ratio{resource}``."""
    resource_pattern: str = r"nvidia\.com/(gpu|gpu\..+|mig-.+)"
    """Which resource names are GPUs (a full-match regular expression)."""
    watch_timeout: Duration = 300.0
    """Each watch request asks the API server to end it after this long; it is then renewed."""
    relist_backoff: Duration = 5.0
    """After a failed list or a broken watch, list again after this long."""
    kubeconfig: str = ""
    """A kubeconfig file to reach the API server with; empty: in-cluster credentials, else ``$KUBECONFIG``."""
    initial_sync_timeout: Duration = 10.0
    """``start`` waits this long for the first lists, so the first tick has values (0: do not wait)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        try:
            re.compile(self.resource_pattern)
        except re.error as exc:
            raise ValueError(f"resource_pattern {self.resource_pattern!r} is not a regular expression: {exc}") from None
        if not (self.pending_pod_count or self.pending_request_total or self.requested_allocatable_ratio):
            raise ValueError("every gauge is switched off: enable one, or remove the receiver")
        if self.watch_timeout < 1 or self.relist_backoff <= 0:
            raise ValueError("watch_timeout must be at least 1s and relist_backoff longer than 0s")
        return self


class K8sClusterReceiver:
    provides = _PROVIDES

    def __init__(self, config: K8sClusterConfig, ctx: CreateContext, *, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.clock = ctx.clock
        self.rl = ctx.telemetry
        self._env = env if env is not None else os.environ
        self.state = ClusterState(re.compile(config.resource_pattern))
        self.watchers: list[Watcher] = []

    async def start(self) -> None:
        client = api_client(kube_env(self._env, self.config.kubeconfig))
        if client is None:
            raise RuntimeError(
                f"receiver {self.component_id}: no Kubernetes API (not in a pod and no KUBECONFIG); "
                "the k8s_cluster receiver runs in the chart's cluster Deployment"
            )
        from kubernetes.client import CoreV1Api

        core = CoreV1Api(client)
        for kind, call in (("pods", core.list_pod_for_all_namespaces), ("nodes", core.list_node)):
            watcher = Watcher(
                kind,
                call,
                self.state,
                watch_timeout_s=self.config.watch_timeout,
                backoff_s=self.config.relist_backoff,
                warn=self._warn,
            )
            watcher.start()
            self.watchers.append(watcher)
        await wait_synced(self.state.synced, {"pods", "nodes"}, self.config.initial_sync_timeout)

    async def shutdown(self) -> None:
        await stop_all(self.watchers)
        self.watchers = []

    async def collect(self) -> Sequence[Record]:
        missing = {"pods", "nodes"} - self.state.synced
        if missing:
            raise NotSynced(f"receiver {self.component_id}: {' and '.join(sorted(missing))} not listed yet")
        now, c = self.clock.now(), self.config
        return [
            ClusterGpu(
                time=now,
                resource_name=g.resource,
                pending_pod_count=g.pending_pods if c.pending_pod_count else None,
                pending_request_total=g.pending_devices if c.pending_request_total else None,
                requested_allocatable_ratio=(
                    g.requested / g.allocatable if c.requested_allocatable_ratio and g.allocatable > 0 else None
                ),
            )
            for g in self.state.gauges()
        ]

    def _warn(self, key: str, message: str) -> None:
        self.rl.log.log(logging.WARNING, key, f"receiver {self.component_id}: {message}")


factory = Factory.of(
    K8sClusterReceiver,
    type="k8s_cluster",
    kind="receiver",
    config_model=K8sClusterConfig,
    description="Cluster-wide GPU scheduling saturation: pending GPU pods and requests, requested/allocatable.",
    stability="development",
    provides=_PROVIDES,
)
