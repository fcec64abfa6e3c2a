"""From one tick's GPU processes to Workload records: pure logic over a Batch and a pod-cache view.

Per GPU process (a pid), in order of trust:

1. **cgroup + API**: the pid's HostProcess names its container id and pod UID; the API view names the
   pod (by UID, else by container id: a static pod's cgroup UID is its config hash, not the mirror
   pod's UID) and the container (by container id).
2. **cgroup + pod-resources**: the API does not know the pod (no API access, or not synced yet). The
   kubelet's allocations name the pod, namespace and container that own the process's device (or MIG
   instance); they are used only when they point at exactly one container, and not when they are
   contradicted (the cgroup says the process is in no pod, or the API knows that owner under another UID).
   A shared GPU (several owners) decides nothing: names stay absent rather than guessed.

**Degraded mode** (no ``hostPID``: /proc shows none of the device's processes): the device's processes
cannot be told apart, so instead of per-pid records the device (or MIG instance) gets one
``Workload(pid=None)`` per owning (pod, container), marked ``degraded=no_host_pid`` and carrying
``device_id`` (and ``gpu_instance_id``) in ``extra``; the energy processor splits the device's energy
equally among them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import Attrs, DeviceAllocation, HostProcess, Workload
from wattpipe.processors.k8s._cache import PodInfo, PodView
from wattpipe.processors.k8s._mig_uuids import resolve_mig_uuids

__all__ = ["DEGRADED", "DeviceKey", "Owner", "resolve"]

DEGRADED = ("degraded", "no_host_pid")

DeviceKey = tuple[str, int | None]
"""(GPU UUID, GPU instance id or None for a whole GPU): what a process runs on, what a container owns."""


@dataclass(frozen=True, slots=True)
class Owner:
    """A container that the kubelet allocated a device to."""

    pod_namespace: str
    pod_name: str
    container_name: str


def owners_by_device(allocations: Sequence[DeviceAllocation], batch: Batch) -> dict[DeviceKey, list[Owner]]:
    """Each device's owning containers, in the kubelet's order, without repeats (replicas of one pod)."""
    out: dict[DeviceKey, list[Owner]] = {}
    for alloc in resolve_mig_uuids(allocations, batch.mig_instances):
        owners = out.setdefault((alloc.device_id, alloc.gpu_instance_id), [])
        owner = Owner(alloc.pod_namespace, alloc.pod_name, alloc.container_name)
        if owner not in owners:
            owners.append(owner)
    return out


def resolve(
    batch: Batch, view: PodView, remembered: Mapping[int, Workload]
) -> tuple[list[Workload], dict[int, Workload]]:
    """Each GPU process's workload, and what to remember for the next tick.

    ``remembered``: how pids resolved while /proc had them. A process in its last tick is still listed by
    the driver (its energy counts) but gone from /proc, and keeps that resolution instead of a guess from
    allocations. A pid is remembered while the driver lists it (bounded by the node's GPU processes), and
    learned only from /proc, never from a guess.
    """
    hosts = {h.pid: h for h in batch.host_processes}
    owners = owners_by_device(batch.allocations, batch)
    devices_of: dict[int, list[DeviceKey]] = {}
    pids_on: dict[DeviceKey, list[int]] = {}
    for sample in batch.gpu_processes:
        key = (sample.device_id, sample.gpu_instance_id)
        devices_of.setdefault(sample.pid, []).append(key)
        pids_on.setdefault(key, []).append(sample.pid)
    degraded = {key for key, pids in pids_on.items() if not any(pid in hosts or pid in remembered for pid in pids)}
    sole = {key: found[0] for key, found in owners.items() if len(found) == 1}

    out: list[Workload] = []
    for pid, keys in devices_of.items():
        host = hosts.get(pid)
        if host is None and pid in remembered:
            out.append(dataclasses.replace(remembered[pid], time=batch.time))
            continue
        if host is None and all(key in degraded for key in keys):
            continue  # its device's energy goes to the owners' degraded records below
        # A process on several GPUs: the single owners of its devices must agree, or none is taken.
        candidates = {sole[key] for key in keys if key in sole}
        owner = next(iter(candidates)) if len(candidates) == 1 else None
        out.append(_workload(batch.time, pid, host, owner, view))
    for key in sorted(degraded, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        out.extend(_degraded(batch.time, key, owners.get(key, []), view))
    keep = {w.pid: w for w in out if w.pid is not None and (w.pid in hosts or w.pid in remembered)}
    return out, keep


def _workload(time: Timestamp, pid: int, host: HostProcess | None, owner: Owner | None, view: PodView) -> Workload:
    """``owner``: the one container that pod-resources says owns the process's device(s), if exactly one."""
    container_id = host.container_id if host is not None else None
    pod_uid = host.pod_uid if host is not None else None

    pod = _pod_of(view, pod_uid, container_id)
    if pod is not None:
        container_name = pod.container_name(container_id) if container_id else None
        if (
            container_name is None
            and owner is not None
            and (owner.pod_namespace, owner.pod_name) == (pod.namespace, pod.name)
        ):
            container_name = owner.container_name  # a restarted container's new id, not in the cache yet
        return Workload(
            time=time,
            pid=pid,
            container_id=container_id,
            container_name=container_name,
            pod_uid=pod_uid or pod.uid,
            pod_name=pod.name,
            pod_namespace=pod.namespace,
            extra=pod.extra,
        )

    if owner is None or (host is not None and not _may_own(owner, host, view)):
        return Workload(time=time, pid=pid, container_id=container_id, pod_uid=pod_uid)
    known = view.by_name.get((owner.pod_namespace, owner.pod_name))
    return Workload(
        time=time,
        pid=pid,
        container_id=container_id or (known.container_id(owner.container_name) if known else None),
        container_name=owner.container_name,
        pod_uid=pod_uid or (known.uid if known else None),
        pod_name=owner.pod_name,
        pod_namespace=owner.pod_namespace,
        extra=known.extra if known else (),
    )


def _pod_of(view: PodView, pod_uid: str | None, container_id: str | None) -> PodInfo | None:
    if pod_uid is not None and (pod := view.by_uid.get(pod_uid)) is not None:
        return pod
    return view.by_container.get(container_id) if container_id is not None else None


def _may_own(owner: Owner, host: HostProcess, view: PodView) -> bool:
    """Whether the process /proc describes can be the allocation owner's (nothing says otherwise)."""
    if host.pod_uid is None:
        return False  # its cgroup is no pod's: a host process, or a container outside Kubernetes
    known = view.by_name.get((owner.pod_namespace, owner.pod_name))
    return known is None or known.uid == host.pod_uid


def _degraded(time: Timestamp, key: DeviceKey, owners: Sequence[Owner], view: PodView) -> list[Workload]:
    device_id, instance = key
    where: Attrs = (("device_id", device_id),) + ((("gpu_instance_id", str(instance)),) if instance is not None else ())
    out = []
    for owner in owners:
        known = view.by_name.get((owner.pod_namespace, owner.pod_name))
        out.append(
            Workload(
                time=time,
                pid=None,
                container_id=known.container_id(owner.container_name) if known else None,
                container_name=owner.container_name,
                pod_uid=known.uid if known else None,
                pod_name=owner.pod_name,
                pod_namespace=owner.pod_namespace,
                extra=tuple(sorted((*(known.extra if known else ()), DEGRADED, *where))),
            )
        )
    return out
