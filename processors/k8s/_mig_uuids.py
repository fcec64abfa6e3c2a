"""``MIG-<uuid>`` allocations joined to the GPU and GPU instance NVML reports for that MIG UUID.

The kubelet names a MIG device by its own UUID (the device plugin's R470+ form), which contains neither the
parent GPU nor the GPU instance; only NVML's ``MigInstance.mig_uuid`` maps it back. The ``podresources``
receiver keeps the UUID in ``DeviceAllocation.extra["mig_uuid"]``; this processor does the join, because
only a processor sees both receivers' records in one Batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from wattpipe.pipeline.records import DeviceAllocation, MigInstance

__all__ = ["resolve_mig_uuids"]


def resolve_mig_uuids(
    allocations: Sequence[DeviceAllocation], instances: Iterable[MigInstance]
) -> list[DeviceAllocation]:
    """Allocations of ``MIG-<uuid>`` devices rewritten to their parent GPU and GPU instance.

    ``instances`` are the MIG instances NVML reports (the ``nvml`` receiver's ``mig_instances``). An
    allocation whose MIG UUID is among them gets ``device_id`` = the parent ``GPU-…`` UUID and its
    ``gpu_instance_id``; ``extra`` keeps ``mig_uuid``. One whose MIG UUID is not (the instance was
    destroyed, or NVML could not say) is returned unchanged: a join on ``device_id`` then finds no GPU
    and the allocation is left out of attribution rather than guessed.
    """
    by_uuid = {inst.mig_uuid: inst for inst in instances if inst.mig_uuid}
    out: list[DeviceAllocation] = []
    for alloc in allocations:
        mig_uuid = dict(alloc.extra).get("mig_uuid") if alloc.gpu_instance_id is None else None
        inst = by_uuid.get(mig_uuid) if mig_uuid else None
        if inst is None:
            out.append(alloc)
            continue
        out.append(dataclasses.replace(alloc, device_id=inst.device_id, gpu_instance_id=inst.gpu_instance_id))
    return out
