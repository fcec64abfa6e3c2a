"""What the cluster's pods and nodes say about GPU resources, kept from list + watch events, and the gauges.

A pod is *pending* while ``status.phase`` is ``Pending`` and it has no ``spec.nodeName`` (the scheduler has not
placed it); it *requests* its devices until it Succeeded or Failed (non-terminated, pending or placed: seed 003's
denominator, so demand beyond the cluster reads above 1). A container's devices of a
resource are its ``limits`` (extended resources must have requests == limits; ``requests`` where no limit is
given); init containers are not counted. Allocatable is the sum of ``status.allocatable`` over the nodes.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ClusterState", "Gauge", "pod_requests"]

_DONE = frozenset({"Succeeded", "Failed"})


def _count(text: object) -> int:
    try:
        return int(str(text))
    except ValueError:
        return 0  # a quantity like "500m" is not a device count: no devices


def pod_requests(pod: Mapping[str, Any], wanted: re.Pattern[str]) -> dict[str, int]:
    """Devices per matching resource the pod's containers ask for."""
    out: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, quantity in asked.items():
            if wanted.fullmatch(name):
                out[name] = out.get(name, 0) + _count(quantity)
    return out


@dataclass(frozen=True, slots=True)
class _Pod:
    pending: bool
    live: bool  # not terminated (Succeeded/Failed): its requests count, placed or not
    requests: dict[str, int]


@dataclass(frozen=True, slots=True)
class Gauge:
    resource: str
    pending_pods: int
    pending_devices: int
    requested: int
    allocatable: int


class ClusterState:
    """Pods and nodes by key, updated from watch threads and read by ``collect`` (under one lock)."""

    def __init__(self, wanted: re.Pattern[str]) -> None:
        self.wanted = wanted
        self._lock = threading.Lock()
        self._pods: dict[str, _Pod] = {}  # only pods that ask for a matching resource: the others count nowhere
        self._nodes: dict[str, dict[str, int]] = {}
        self.synced: set[str] = set()  # "pods", "nodes": listed at least once

    def _pod(self, obj: Mapping[str, Any]) -> _Pod:
        phase = (obj.get("status") or {}).get("phase")
        placed = bool((obj.get("spec") or {}).get("nodeName"))
        return _Pod(phase == "Pending" and not placed, phase not in _DONE, pod_requests(obj, self.wanted))

    def _node(self, obj: Mapping[str, Any]) -> dict[str, int]:
        allocatable = (obj.get("status") or {}).get("allocatable") or {}
        return {name: _count(q) for name, q in allocatable.items() if self.wanted.fullmatch(name)}

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")

    def replace(self, kind: str, items: list[Mapping[str, Any]]) -> None:
        """A fresh list: everything of ``kind`` is what it says."""
        with self._lock:
            if kind == "pods":
                pods = ((self._key(o), self._pod(o)) for o in items)
                self._pods = {key: pod for key, pod in pods if pod.requests}
            else:
                self._nodes = {self._key(o): self._node(o) for o in items}
            self.synced.add(kind)

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            table: dict[str, Any] = self._pods if kind == "pods" else self._nodes
            key = self._key(obj)
            if event_type == "DELETED":
                table.pop(key, None)
            elif event_type in ("ADDED", "MODIFIED"):
                if kind != "pods":
                    table[key] = self._node(obj)
                elif (pod := self._pod(obj)).requests:
                    table[key] = pod
                else:
                    table.pop(key, None)  # asks for no matching resource: counts nowhere

    def gauges(self) -> list[Gauge]:
        with self._lock:
            pods, nodes = list(self._pods.values()), list(self._nodes.values())
        resources = sorted({r for p in pods for r in p.requests} | {r for n in nodes for r in n})
        out = []
        for r in resources:
            pending = [p.requests.get(r, 0) for p in pods if p.pending and p.requests.get(r, 0) > 0]
            out.append(
                Gauge(
                    resource=r,
                    pending_pods=len(pending),
                    pending_devices=sum(pending),
                    requested=sum(p.requests.get(r, 0) for p in pods if p.live),
                    allocatable=sum(n.get(r, 0) for n in nodes),
                )
            )
        return out
