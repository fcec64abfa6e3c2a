"""ResourceClaims + ResourceSlices (+ the node's pods) → which container got which GPU, by UUID.

A claim's ``status.allocation.devices.results[]`` names devices by (driver, pool, device); the
ResourceSlice of that driver and pool lists the device with its attributes, where NVIDIA's DRA driver puts
the GPU's ``uuid`` (v1: ``attributes.uuid.string``, or the same name qualified with the driver's domain,
``gpu.nvidia.com/uuid``; v1beta1 nests attributes under ``basic``).
``status.reservedFor[]`` names the pods using the claim; a pod's ``spec.resourceClaims[]`` (or, for claims
made from a template, ``status.resourceClaimStatuses[]``) gives the claim a name in the pod, and each
container lists the names it uses in ``resources.claims[]``. A claim reserved for several pods is shared:
every user gets the device, marked with a replica number (as a time-sliced device-plugin GPU is).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceAllocation

__all__ = ["DraStore", "allocations"]

Obj = Mapping[str, Any]


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class DraStore:
    """Claims, slices and this node's pods, kept by the list + watch threads."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._lock = threading.Lock()
        self.tables: dict[str, dict[str, Obj]] = {"resourceclaims": {}, "resourceslices": {}, "pods": {}}
        self.synced: set[str] = set()

    def _keep(self, kind: str, obj: Obj) -> bool:
        return kind != "pods" or (obj.get("spec") or {}).get("nodeName") == self.node_name

    def replace(self, kind: str, items: list[Obj]) -> None:
        with self._lock:
            self.tables[kind] = {_key(o): o for o in items if self._keep(kind, o)}
            self.synced.add(kind)

    def apply(self, kind: str, event_type: str, obj: Obj) -> None:
        with self._lock:
            if event_type == "DELETED" or not self._keep(kind, obj):
                self.tables[kind].pop(_key(obj), None)
            elif event_type in ("ADDED", "MODIFIED"):
                self.tables[kind][_key(obj)] = obj

    def snapshot(self) -> dict[str, list[Obj]]:
        with self._lock:
            return {kind: list(table.values()) for kind, table in self.tables.items()}


def _uuids(slices: Iterable[Obj], attribute: str) -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name", "")
        qualified = f"{spec.get('driver', '')}/{attribute}"  # an unqualified name is in the driver's domain
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or (device.get("basic") or {}).get("attributes") or {}
            value = (attributes.get(attribute) or attributes.get(qualified) or {}).get("string")
            if value:
                out[(str(spec.get("driver", "")), str(pool), str(device.get("name", "")))] = value
    return out


def _containers(pod: Obj, claim_name: str) -> list[str]:
    """The pod's containers that use the claim named ``claim_name``."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    local = {c.get("name") for c in spec.get("resourceClaims") or [] if c.get("resourceClaimName") == claim_name}
    local |= {
        c.get("name") for c in status.get("resourceClaimStatuses") or [] if c.get("resourceClaimName") == claim_name
    }
    return [
        str(c.get("name"))
        for c in spec.get("containers") or []
        if any(ref.get("name") in local for ref in (c.get("resources") or {}).get("claims") or [])
    ]


def allocations(
    snapshot: Mapping[str, list[Obj]], drivers: frozenset[str], attribute: str, now: Timestamp
) -> list[DeviceAllocation]:
    """One DeviceAllocation per (GPU, container) that a claim reserved for a pod on this node gives."""
    uuids = _uuids(snapshot["resourceslices"], attribute)
    pods = {_key(p): p for p in snapshot["pods"]}
    out: list[DeviceAllocation] = []
    for claim in sorted(snapshot["resourceclaims"], key=_key):
        meta, status = claim.get("metadata") or {}, claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        users = [r for r in status.get("reservedFor") or [] if r.get("resource", "pods") == "pods"]
        for n, user in enumerate(users):
            pod = pods.get(f"{meta.get('namespace', '')}/{user.get('name', '')}")
            if pod is None:
                continue  # on another node (or not seen yet)
            for result in results:
                driver = str(result.get("driver", ""))
                uuid = uuids.get((driver, str(result.get("pool", "")), str(result.get("device", ""))))
                if driver not in drivers or uuid is None:
                    continue
                for container in _containers(pod, str(meta.get("name", ""))):
                    out.append(
                        DeviceAllocation(
                            time=now,
                            device_id=uuid,
                            resource_name=driver,
                            pod_name=str(user.get("name")),
                            pod_namespace=str(meta.get("namespace", "")),
                            container_name=container,
                            replica=n if len(users) > 1 else None,
                        )
                    )
    return out
