"""The pods of this node as the API server last described them, indexed the ways a PID's cgroup joins.

A writer (the watch thread) changes the cache under a lock and publishes a new immutable
:class:`PodView` after every change; readers (``process()``) take the current view without locking,
so a tick never waits for the API. Changes are rare (pods start and stop) and a node holds at most a
few hundred pods, so rebuilding the indexes per change costs little.

A deleted pod is kept for ``keep_deleted_s`` (a *tombstone*): the driver may still list a process of a
pod for a tick or two after the API server reports the pod gone, and its energy still belongs to it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from wattpipe.pipeline.records import Attrs

__all__ = ["PodCache", "PodInfo", "PodView", "pod_info", "strip_runtime"]


def strip_runtime(container_id: str) -> str:
    """``containerd://<id>`` → ``<id>``: the id that ``/proc/<pid>/cgroup`` shows."""
    _, sep, bare = container_id.partition("://")
    return bare if sep else container_id


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What a Workload needs of one pod; ``extra`` holds only the allow-listed labels and annotations."""

    uid: str
    name: str
    namespace: str
    containers: tuple[tuple[str, str], ...] = ()  # (container id without its runtime prefix, container name)
    extra: Attrs = ()
    deleted_at_s: float | None = None  # monotonic time the pod was seen gone; None while it exists

    def container_name(self, container_id: str) -> str | None:
        return next((name for cid, name in self.containers if cid == container_id), None)

    def container_id(self, container_name: str) -> str | None:
        return next((cid for cid, name in self.containers if name == container_name), None)


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pod_info(pod: Mapping[str, Any], labels: Iterable[str] = (), annotations: Iterable[str] = ()) -> PodInfo | None:
    """The cache entry for a pod as the API serves it (JSON), or None for an object without a UID or name."""
    meta, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    uid, name = meta.get("uid"), meta.get("name")
    if not isinstance(uid, str) or not isinstance(name, str) or not uid or not name:
        return None
    statuses = [
        _dict(s)
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
        for s in status.get(key) or ()
    ]
    # A container being created has no id yet: it joins nothing until a MODIFIED event brings one.
    containers = tuple(
        (strip_runtime(str(s["containerID"])), str(s.get("name", ""))) for s in statuses if s.get("containerID")
    )
    have_labels, have_annotations = _dict(meta.get("labels")), _dict(meta.get("annotations"))
    extra = [(f"label_{k}", str(have_labels[k])) for k in labels if k in have_labels]
    extra += [(f"annotation_{k}", str(have_annotations[k])) for k in annotations if k in have_annotations]
    return PodInfo(
        uid=uid,
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        containers=containers,
        extra=tuple(sorted(extra)),
    )


@dataclass(frozen=True, slots=True)
class PodView:
    """An immutable snapshot of the cache: pods by UID, by container id, and by (namespace, name)."""

    by_uid: Mapping[str, PodInfo] = field(default_factory=dict)
    by_container: Mapping[str, PodInfo] = field(default_factory=dict)
    by_name: Mapping[tuple[str, str], PodInfo] = field(default_factory=dict)
    synced: bool = False  # a list has succeeded at least once

    @classmethod
    def of(cls, pods: Iterable[PodInfo], synced: bool) -> PodView:
        # Tombstones first, so a live pod wins a name or container id that a deleted one also had
        # (a StatefulSet pod recreated under its old name).
        ordered = sorted(pods, key=lambda p: p.deleted_at_s is None)
        by_container = {cid: p for p in ordered for cid, _ in p.containers}
        return cls(
            by_uid=MappingProxyType({p.uid: p for p in ordered}),
            by_container=MappingProxyType(by_container),
            by_name=MappingProxyType({(p.namespace, p.name): p for p in ordered}),
            synced=synced,
        )


class PodCache:
    """Pods of one node, at most ``max_pods`` (tombstones included); thread-safe, readers never block."""

    def __init__(self, max_pods: int, keep_deleted_s: float) -> None:
        self.max_pods = max_pods
        self.keep_deleted_s = keep_deleted_s
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._synced = False
        self.view = PodView()
        self.dropped = 0  # pods not kept because the cache was full

    def __len__(self) -> int:
        return len(self._pods)

    def replace(self, pods: Iterable[PodInfo], now_s: float) -> None:
        """A fresh list: pods it lacks become tombstones (deleted while we were not watching)."""
        with self._lock:
            fresh = {p.uid: p for p in pods}
            for uid, old in self._pods.items():
                if uid not in fresh:
                    fresh[uid] = old if old.deleted_at_s is not None else dataclasses.replace(old, deleted_at_s=now_s)
            self._pods = {}
            # Live pods first, so a full cache drops tombstones rather than pods that exist.
            for pod in sorted(fresh.values(), key=lambda p: p.deleted_at_s is not None):
                self._put(pod)
            self._synced = True
            self._publish()

    def upsert(self, pod: PodInfo) -> None:
        with self._lock:
            self._put(pod)
            self._publish()

    def delete(self, uid: str, now_s: float) -> None:
        with self._lock:
            pod = self._pods.get(uid)
            if pod is not None and pod.deleted_at_s is None:
                self._pods[uid] = dataclasses.replace(pod, deleted_at_s=now_s)
                self._publish()

    def expire(self, now_s: float) -> int:
        """Forget tombstones older than ``keep_deleted_s``; returns how many."""
        view = self.view
        if not any(p.deleted_at_s is not None for p in view.by_uid.values()):
            return 0  # the common case, without taking the lock
        with self._lock:
            old = [
                uid
                for uid, p in self._pods.items()
                if p.deleted_at_s is not None and now_s - p.deleted_at_s >= self.keep_deleted_s
            ]
            for uid in old:
                del self._pods[uid]
            if old:
                self._publish()
            return len(old)

    def _put(self, pod: PodInfo) -> None:
        if pod.uid not in self._pods and len(self._pods) >= self.max_pods:
            tombstones = [p for p in self._pods.values() if p.deleted_at_s is not None]
            if not tombstones:
                self.dropped += 1
                return
            del self._pods[min(tombstones, key=lambda p: p.deleted_at_s or 0.0).uid]
        self._pods[pod.uid] = pod

    def _publish(self) -> None:
        self.view = PodView.of(self._pods.values(), self._synced)
