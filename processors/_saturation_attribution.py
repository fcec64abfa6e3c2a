"""Saturation per pod and container, from the allocations the kubelet made (``DeviceAllocation``).

Saturation is a property of a device, not of a tenant, so nothing is split here:
- a GPU allocated whole to one container: that container's series carry the GPU's values, ``scope="exclusive"``;
- a GPU shared (time-slicing or MPS replicas ``GPU-x::N``, or several containers on one device id): every
  sharer's series carry the device's values with ``scope="device_shared"``: whoever is on it sees the
  saturation, and no tenant is said to have caused it;
- a MIG instance: the instance's own values (framebuffer, profiling ratios) with ``scope="instance"``, and
  the board's (throttle counters, the clock-event bitmask, XIDs) with ``scope="physical_gpu"``: the hardware
  has one of each per physical GPU, shared by all its instances.
A ``MIG-<uuid>`` allocation is placed through the MIG instances the nvml receiver lists (``mig_uuid``); one
that cannot be placed gets no series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from wattpipe.pipeline.records import DeviceAllocation, MigInstance, Saturation
from wattpipe.processors._saturation_signals import BOARD_SIGNALS

__all__ = ["attribute"]

_Owner = tuple[str, str, str]  # namespace, pod, container
_Place = tuple[str, int | None]  # physical GPU UUID, GPU instance (None: the whole GPU)


def _placements(
    allocations: Iterable[DeviceAllocation], instances: Iterable[MigInstance]
) -> dict[_Place, list[tuple[_Owner, bool]]]:
    """Per place, its containers and whether each holds a shared replica."""
    by_mig_uuid: dict[str, _Place] = {i.mig_uuid: (i.device_id, i.gpu_instance_id) for i in instances if i.mig_uuid}
    out: dict[_Place, list[tuple[_Owner, bool]]] = {}
    for a in allocations:
        place: _Place | None
        if a.device_id.startswith("MIG-") and a.gpu_instance_id is None:
            place = by_mig_uuid.get(a.device_id)
            if place is None:
                continue
        else:
            place = (a.device_id, a.gpu_instance_id)
        owner = (a.pod_namespace, a.pod_name, a.container_name)
        entries = out.setdefault(place, [])
        if all(o != owner for o, _ in entries):
            entries.append((owner, a.replica is not None))
    return out


def attribute(
    device_records: Sequence[Saturation],
    allocations: Iterable[DeviceAllocation],
    instances: Iterable[MigInstance],
) -> list[Saturation]:
    """The pod/container records for ``device_records`` (the device- and instance-level values)."""
    by_place: dict[_Place, list[Saturation]] = {}
    for record in device_records:
        by_place.setdefault((record.device_id, record.gpu_instance_id), []).append(record)
    out: list[Saturation] = []
    for (uuid, gi), owners in sorted(
        _placements(allocations, instances).items(), key=lambda i: (i[0][0], i[0][1] or -1)
    ):
        shared = len(owners) > 1 or any(replica for _, replica in owners)
        if gi is None:
            sources = [(r, "device_shared" if shared else "exclusive") for r in by_place.get((uuid, None), [])]
        else:
            own = by_place.get((uuid, gi), [])
            board = [r for r in by_place.get((uuid, None), []) if r.signal in BOARD_SIGNALS]
            own_names = {r.signal for r in own}
            sources = [(r, "device_shared" if shared else "instance") for r in own]
            sources += [(r, "physical_gpu") for r in board if r.signal not in own_names]
        for (namespace, pod, container), _ in owners:
            for record, scope in sources:
                out.append(
                    Saturation(
                        time=record.time,
                        device_id=uuid,
                        gpu_instance_id=gi,
                        signal=record.signal,
                        value=record.value,
                        window_s=record.window_s,
                        window_end_s=record.window_end_s,
                        saturation_scope=scope,  # type: ignore[arg-type]
                        pod_name=pod,
                        pod_namespace=namespace,
                        container_name=container,
                    )
                )
    return out
