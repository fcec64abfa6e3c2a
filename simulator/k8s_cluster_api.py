"""The cluster-wide face of the Kubernetes API on 127.0.0.1: pods of every node, and nodes, from the
scenario's ``cluster`` section (the node agent's pod endpoints are ``simulator/k8sapi.py``).

    api = start_k8s_cluster_api(node)
    api.write_kubeconfig(tmp / "kubeconfig")

``GET /api/v1/pods``, ``/api/v1/nodes``, ``/apis/resource.k8s.io/v1/resourceslices`` and ``…/resourceclaims``
(DRA, ``_dra_objects``; a cluster-scoped list, selectors ignored: clients filter): a list (``resourceVersion`` in its metadata) or, with
``watch=true``, a chunked stream of ``{"type", "object"}`` lines from the given ``resourceVersion`` until
``timeoutSeconds`` (of scenario time, or real time, whichever ends first). Each pod is ADDED as Pending
(no ``spec.nodeName``, ``PodScheduled=False/Unschedulable``) at ``created_s``, MODIFIED to Running on its
node at ``scheduled_s``, MODIFIED to Succeeded at ``finished_s``; each node is ADDED at 0 with its
``status.allocatable``. One resourceVersion per event, shared by pods and nodes, in scenario-time order.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import yaml

from wattpipe.simulator._dra_objects import claim_object, pod_claims, pod_uid, slice_object
from wattpipe.simulator._k8s_objects import BASE_RV, Json, rfc3339, status_object
from wattpipe.simulator._loopback import JsonApiHandler, LoopbackHttp
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import ClusterNode, ClusterPod

__all__ = ["K8sClusterApi", "start_k8s_cluster_api"]

Kind = Literal["pods", "nodes", "resourceslices", "resourceclaims"]
_PATHS: dict[str, Kind] = {
    "/api/v1/pods": "pods",
    "/api/v1/nodes": "nodes",
    "/apis/resource.k8s.io/v1/resourceslices": "resourceslices",
    "/apis/resource.k8s.io/v1/resourceclaims": "resourceclaims",
}
_LIST_KIND = {"pods": "PodList", "nodes": "NodeList", "resourceslices": "ResourceSliceList"}


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    t_s: float
    kind: Kind
    type: Literal["ADDED", "MODIFIED"]
    object: Json


def _node_object(node: ClusterNode, rv: int) -> Json:
    allocatable = {name: str(count) for name, count in node.allocatable.items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "resourceVersion": str(rv)},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def _pod_object(pod: ClusterPod, rv: int, phase: str, created: str) -> Json:
    limits = {name: str(count) for name, count in pod.requests.items()}
    containers = [
        {"name": f"c{i}", "image": "registry.sim.local/job:v1", "resources": {"limits": limits, "requests": limits}}
        for i in range(pod.containers)
    ]
    spec: Json = {"containers": containers, "restartPolicy": "Never"}
    pod_claims(pod, spec)
    status: Json = {"phase": phase}
    if phase == "Pending":
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "Insufficient GPUs"}
        ]
    else:
        spec["nodeName"] = pod.node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod_uid(pod.namespace, pod.name),
            "resourceVersion": str(rv),
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": status,
    }


def _timeline(node: SimulatedNode) -> list[_Event]:
    steps: list[tuple[float, int, Kind, Literal["ADDED", "MODIFIED"], Any, str]] = []
    for i, cluster_node in enumerate(node.scenario.cluster.nodes):
        steps.append((0.0, i, "nodes", "ADDED", cluster_node, ""))
    for i, pod in enumerate(node.scenario.cluster.pods):
        steps.append((pod.created_s, 1000 + i, "pods", "ADDED", pod, "Pending"))
        if pod.scheduled_s is not None:
            steps.append((pod.scheduled_s, 1000 + i, "pods", "MODIFIED", pod, "Running"))
        if pod.finished_s is not None:
            steps.append((pod.finished_s, 1000 + i, "pods", "MODIFIED", pod, "Succeeded"))
    for i, item in enumerate(node.scenario.cluster.slices):
        steps.append((0.0, 100 + i, "resourceslices", "ADDED", item, ""))
    for i, claim in enumerate(node.scenario.cluster.claims):
        steps.append((0.0, 5000 + i, "resourceclaims", "ADDED", claim, ""))
        steps.append((claim.allocated_s, 5000 + i, "resourceclaims", "MODIFIED", claim, "allocated"))
    steps.sort(key=lambda s: (s[0], s[1], s[3] != "ADDED", s[5] != "Pending"))
    events = []
    for n, (t_s, _, kind, kind_type, item, phase) in enumerate(steps):
        rv = BASE_RV + n + 1
        if kind == "nodes":
            obj = _node_object(item, rv)
        elif kind == "resourceslices":
            obj = slice_object(item, rv)
        elif kind == "resourceclaims":
            obj = claim_object(item, rv, allocated=phase == "allocated")
        else:
            obj = _pod_object(item, rv, phase, rfc3339(node.wall_at(item.created_s)))
        events.append(_Event(rv, t_s, kind, kind_type, obj))
    return events


class K8sClusterApi:
    """A running cluster API face. Stop it with :meth:`close` (or by closing its node)."""

    def __init__(self, node: SimulatedNode, watch_poll_s: float = 0.02, dra: bool = True) -> None:
        self.node = node
        self.dra = dra
        self.events = _timeline(node)
        self._times = [e.t_s for e in self.events]
        self.watch_poll_s = watch_poll_s
        self.requests: dict[str, int] = {"list": 0, "watch": 0}
        self.closing = False
        self._http = LoopbackHttp(0, _handler(self), "sim-k8s-cluster-api")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.port}"

    def happened(self, t_s: float | None = None) -> int:
        """How many events have happened by scenario time ``t_s`` (default: now)."""
        return bisect.bisect_right(self._times, self.node.t_s() if t_s is None else t_s)

    def listing(self, kind: Kind) -> Json:
        count = self.happened()
        latest: dict[str, Json] = {}
        for event in self.events[:count]:
            if event.kind == kind:
                meta = event.object["metadata"]
                latest[f"{meta.get('namespace', '')}/{meta['name']}"] = event.object
        return {
            "kind": _LIST_KIND.get(kind, "ResourceClaimList"),
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(BASE_RV + count)},
            "items": [latest[key] for key in sorted(latest)],
        }

    def write_kubeconfig(self, path: str | Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim-cluster", "cluster": {"server": self.url}}],
            "users": [{"name": "sim", "user": {}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim-cluster", "user": "sim"}}],
            "current-context": "sim",
        }
        out = Path(path)
        out.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return out

    def close(self) -> None:
        self.closing = True
        self._http.stop()


def _handler(api: K8sClusterApi) -> type[BaseHTTPRequestHandler]:
    return type("ClusterHandler", (_Handler,), {"api": api})


class _Handler(JsonApiHandler):
    api: K8sClusterApi

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
        kind = _PATHS.get(url.path.rstrip("/"))
        if kind in ("resourceslices", "resourceclaims") and not self.api.dra:
            kind = None  # a cluster without the DRA API: 404, as an older API server answers
        if kind is None:
            self._json(404, status_object(404, "NotFound", "the server could not find the requested resource"))
            return
        if query.get("watch", "").lower() in ("true", "1"):
            self.api.requests["watch"] += 1
            self._watch(kind, query)
        else:
            self.api.requests["list"] += 1
            self._json(200, self.api.listing(kind))

    def _watch(self, kind: Kind, query: Mapping[str, str]) -> None:
        api = self.api
        since = query.get("resourceVersion", "")
        sent = int(since) - BASE_RV if since not in ("", "0") else api.happened()
        timeout_s = float(query.get("timeoutSeconds") or 300)
        self._start_watch()
        end_t_s, end_real_s = api.node.t_s() + timeout_s, time.monotonic() + timeout_s
        while not api.closing:
            t_s = api.node.t_s()
            upto = api.happened(min(t_s, end_t_s))
            for event in api.events[sent:upto]:
                if event.kind == kind and not self._event(event.type, event.object):
                    return
            sent = max(sent, upto)
            if t_s >= end_t_s or time.monotonic() >= end_real_s:
                break
            time.sleep(api.watch_poll_s)
        self._end()


def start_k8s_cluster_api(node: SimulatedNode, watch_poll_s: float = 0.02, dra: bool = True) -> K8sClusterApi:
    """Start the cluster face for ``node``'s scenario on 127.0.0.1; it stops when the node closes. ``dra``
    False: the resource.k8s.io endpoints answer 404, as on a cluster without DRA."""
    api = K8sClusterApi(node, watch_poll_s, dra)
    node.on_close(api.close)
    return api
