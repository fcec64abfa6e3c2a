"""Which pods and containers exist on this node, as ``Workload.listed`` entries for the energy processor.

A container or pod series ends when its pod is gone, not when its GPU processes pause, so the energy
processor needs to know which pods exist, whether or not they run anything on a GPU this tick. The sources,
in order of trust:

1. **the API cache**, once a list has succeeded: every pod of the node not deleted (tombstones are gone), with
   each container that has an id. While the API server is down the cache is kept, and so is this list: a pod
   deleted meanwhile is still listed (unknown is not gone) until the next list.
2. **the kubelet's allocations**, when its receiver answered this tick: the containers that hold a GPU, by
   name only (pod-resources gives no ids).
3. neither: no entries at all. The energy processor then ends no series.

A list from a source always includes one entry naming nothing, so that a node with no pods is told from a
node whose pods are unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceAllocation, Workload
from wattpipe.processors.k8s._cache import PodView

__all__ = ["from_allocations", "from_api"]


def from_api(time: Timestamp, view: PodView, cgroup_uids: Mapping[str, str]) -> list[Workload]:
    """The live pods of ``view``; ``cgroup_uids``: API UID → the other UID its processes' cgroup shows (a
    static pod's cgroup carries the kubelet's config hash, and its series are keyed by that)."""
    out = [Workload(time=time, pid=None, listed="api")]
    for pod in view.by_uid.values():
        if pod.deleted_at_s is not None:
            continue
        uids = (pod.uid, cgroup_uids[pod.uid]) if pod.uid in cgroup_uids else (pod.uid,)
        for uid in uids:
            out.append(_entry(time, pod.namespace, pod.name, uid))
        out.extend(_entry(time, pod.namespace, pod.name, pod.uid, name or None, cid) for cid, name in pod.containers)
    return out


def from_allocations(time: Timestamp, allocations: Sequence[DeviceAllocation]) -> list[Workload]:
    """The containers the kubelet allocated a GPU to, once each (a container may hold several)."""
    owners = dict.fromkeys((a.pod_namespace, a.pod_name, a.container_name) for a in allocations)
    out = [Workload(time=time, pid=None, listed="allocations")]
    out.extend(_entry(time, ns, pod, None, container, listed="allocations") for ns, pod, container in owners)
    return out


def _entry(
    time: Timestamp,
    namespace: str,
    pod: str,
    uid: str | None,
    container: str | None = None,
    container_id: str | None = None,
    listed: Literal["api", "allocations"] = "api",
) -> Workload:
    return Workload(
        time=time,
        pid=None,
        container_id=container_id,
        container_name=container,
        pod_uid=uid,
        pod_name=pod,
        pod_namespace=namespace,
        listed=listed,
    )
