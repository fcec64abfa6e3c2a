"""Receiver ``dra``: GPUs allocated by Dynamic Resource Allocation (resource.k8s.io/v1), as DeviceAllocations.

Pods whose GPUs come from a DRA driver instead of the device plugin are not in the kubelet's device
lists. This node agent's receiver keeps the cluster's ResourceClaims and ResourceSlices and its own node's
pods by list + watch (``receivers/_list_watch.py``) and joins them (``_join``): each GPU, by UUID, that a
claim reserved for a pod on this node gives a container, as the same
:class:`~pipeline.records.DeviceAllocation` the ``podresources`` receiver makes, so the ``k8s``, ``energy``
and ``saturation`` processors treat DRA pods as any other. A cluster without the API (404): nothing, and
one log line. Needs get/list/watch on resourceclaims and resourceslices (resource.k8s.io) and pods.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.kube import api_client, kube_env
from wattpipe.pipeline.records import Record
from wattpipe.receivers._list_watch import Watcher, stop_all, wait_synced
from wattpipe.receivers.dra._join import DraStore, allocations

__all__ = ["DraConfig", "DraReceiver", "DraStore", "allocations", "factory"]

_PROVIDES = frozenset({"allocations"})


class DraConfig(ComponentConfig):
    node_name: str = ""
    """This node; empty: the pipeline's node name (``service.node_name``, else $NODE_NAME)."""
    drivers: list[str] = Field(default_factory=lambda: ["gpu.nvidia.com"], min_length=1)
    """DRA drivers whose devices are GPUs."""
    uuid_attribute: str = "uuid"
    """The device attribute holding the GPU UUID (NVIDIA's driver: ``uuid``)."""
    watch_timeout: Duration = Field(default=300.0, ge=1)
    relist_backoff: Duration = Field(default=5.0, gt=0)
    kubeconfig: str = ""
    """A kubeconfig file to reach the API server with; empty: in-cluster credentials, else ``$KUBECONFIG``."""
    initial_sync_timeout: Duration = Field(default=10.0, ge=0)
    """``start`` waits this long for the first lists, so the first tick has the allocations (0: do not wait)."""


class DraReceiver:
    provides = _PROVIDES

    def __init__(self, config: DraConfig, ctx: CreateContext, *, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.clock = ctx.clock
        self.log = ctx.logger
        self.rl = ctx.telemetry
        self._env = env if env is not None else os.environ
        self.store = DraStore(config.node_name or ctx.node_name)
        self.watchers: list[Watcher] = []
        self.unavailable = False  # the API server does not serve resource.k8s.io/v1

    async def start(self) -> None:
        client = api_client(kube_env(self._env, self.config.kubeconfig))
        if client is None:
            raise RuntimeError(f"receiver {self.component_id}: no Kubernetes API (not in a pod and no KUBECONFIG)")
        from kubernetes.client import CoreV1Api, ResourceV1Api

        dra, core = ResourceV1Api(client), CoreV1Api(client)
        calls: list[tuple[str, Any, dict[str, str]]] = [
            ("resourceclaims", dra.list_resource_claim_for_all_namespaces, {}),
            ("resourceslices", dra.list_resource_slice, {}),
            ("pods", core.list_pod_for_all_namespaces, {"field_selector": f"spec.nodeName={self.store.node_name}"}),
        ]
        for kind, call, kwargs in calls:
            watcher = Watcher(
                kind,
                call,
                self.store,
                watch_timeout_s=self.config.watch_timeout,
                backoff_s=self.config.relist_backoff,
                warn=self._warn,
                on_error=self._not_served,
                list_kwargs=kwargs,
            )
            watcher.start()
            self.watchers.append(watcher)
        kinds = {"resourceclaims", "resourceslices", "pods"}
        await wait_synced(self.store.synced, kinds, self.config.initial_sync_timeout, lambda: self.unavailable)

    def _not_served(self, exc: Exception) -> bool:
        if getattr(exc, "status", None) != 404:
            return False
        if not self.unavailable:
            self.unavailable = True
            self.log.info(
                "receiver %s: the API server does not serve resource.k8s.io/v1: no DRA allocations", self.component_id
            )
        return True

    async def shutdown(self) -> None:
        await stop_all(self.watchers)
        self.watchers = []

    async def collect(self) -> Sequence[Record]:
        if self.unavailable:
            return []
        missing = {"resourceclaims", "resourceslices", "pods"} - self.store.synced
        if missing:
            raise RuntimeError(f"receiver {self.component_id}: {', '.join(sorted(missing))} not listed yet")
        return allocations(
            self.store.snapshot(), frozenset(self.config.drivers), self.config.uuid_attribute, self.clock.now()
        )

    def _warn(self, key: str, message: str) -> None:
        self.rl.log.log(logging.WARNING, key, f"receiver {self.component_id}: {message}")


factory = Factory.of(
    DraReceiver,
    type="dra",
    kind="receiver",
    config_model=DraConfig,
    description="GPUs allocated by DRA (resource.k8s.io/v1 claims and slices) to pods on this node, by UUID.",
    stability="development",
    provides=_PROVIDES,
)
