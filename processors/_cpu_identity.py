"""Who a CPU series belongs to: a process's attributes (from /proc and the k8s processor's Workloads) and the
containers, pods and VMs it is in, worked out once per (pid, start time) (``processors/_cpu_series.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from wattpipe.pipeline.records import HostProcess, Workload
from wattpipe.processors._energy_series import Series
from wattpipe.processors.k8s._exited import LATE_DEVICE

__all__ = ["GroupScope", "Identity", "Names", "group_memberships", "process_attrs"]

GroupScope = Literal["container", "pod", "vm"]


@dataclass(frozen=True, slots=True)
class Names:
    """Kubernetes names from the k8s processor's Workloads: a GPU process's by pid, any other's by its cgroup's
    container id or pod UID through the roster (``Workload.listed`` entries name every container and pod)."""

    by_pid: Mapping[int, Workload]
    by_container: Mapping[str, Workload]
    by_pod: Mapping[str, Workload]

    @classmethod
    def of(cls, workloads: Iterable[Workload]) -> Names:
        by_pid: dict[int, Workload] = {}
        by_container: dict[str, Workload] = {}
        by_pod: dict[str, Workload] = {}
        for w in workloads:
            if w.pid is not None:
                if any(key == LATE_DEVICE for key, _ in w.extra):
                    continue  # who the pid *was* on a GPU, for that GPU's late shares: not its process now
                by_pid[w.pid] = w
            elif w.container_id is not None and w.container_name is not None:
                by_container[w.container_id] = w
            elif w.pod_uid is not None and w.pod_name is not None:
                by_pod[w.pod_uid] = w
        return cls(by_pid, by_container, by_pod)

    def find(self, host: HostProcess) -> Workload | None:
        found = self.by_pid.get(host.pid)
        if found is None and host.container_id is not None:
            found = self.by_container.get(host.container_id)
        if found is None and host.pod_uid is not None:
            found = self.by_pod.get(host.pod_uid)  # the pod's names only: no container_name from it
            if found is not None and found.container_name is not None:
                found = None
        return found


@dataclass(frozen=True, slots=True)
class Identity:
    """What a process's series are labelled with, and the groups it belongs to (worked out once)."""

    attrs: dict[str, str]
    groups: list[tuple[GroupScope, str, dict[str, str]]]
    named: bool  # its pod's names were known (from the k8s processor's Workloads)
    # Its listing's comm and container: where a later listing's differ, the process exec'd (see _forget_changed).
    comm: str | None
    container_id: str | None
    by_zone: dict[str, dict[str, str]] = field(default_factory=dict)  # attrs with the zone: one object per zone
    # Its series per zone type, each labelled with this identity's zone_attrs (a new identity starts empty: its
    # series are found in CpuSeries.processes again, and labelled anew).
    series: dict[str, Series] = field(default_factory=dict)
    # Per zone type, its groups' series as CpuSeries._join found (and labelled) them, and the group table's
    # version then: while that version holds, the table has the same series for its groups, labelled alike.
    joined: dict[str, tuple[int, tuple[Series, ...]]] = field(default_factory=dict)

    def zone_attrs(self, zone: str) -> dict[str, str]:
        found = self.by_zone.get(zone)
        if found is None:
            found = self.by_zone[zone] = {**self.attrs, "zone": zone}
        return found


def process_attrs(host: HostProcess, workload: Workload | None) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for name in ("comm", "exe", "container_id", "pod_uid", "vm_id"):
        value = getattr(host, name)
        if value is not None:
            attrs[name] = str(value)
    attrs["type"] = host.type
    if workload is not None:
        for name in ("pod_name", "pod_namespace"):
            value = getattr(workload, name)
            if value is not None:
                attrs[name] = value
    return attrs


def group_memberships(host: HostProcess, workload: Workload | None) -> list[tuple[GroupScope, str, dict[str, str]]]:
    out: list[tuple[GroupScope, str, dict[str, str]]] = []
    names = {}
    if workload is not None:
        names = {k: v for k in ("container_name", "pod_name", "pod_namespace") if (v := getattr(workload, k))}
    if host.container_id is not None:
        attrs = {k: v for k, v in names.items()}
        if host.pod_uid is not None:
            attrs["pod_uid"] = host.pod_uid
        if host.container_runtime is not None:
            attrs["runtime"] = host.container_runtime
        out.append(("container", host.container_id, attrs))
    if host.pod_uid is not None:
        out.append(("pod", host.pod_uid, {k: v for k, v in names.items() if k != "container_name"}))
    if host.vm_id is not None:
        attrs = {"hypervisor": host.hypervisor or "kvm"}
        if host.vm_name is not None:
            attrs["vm_name"] = host.vm_name
        out.append(("vm", host.vm_id, attrs))
    return out
