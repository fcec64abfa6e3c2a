"""A Batch's GPU topology and free GPUs, as the ``gpu_placement`` processor and the ``node_annotation``
exporter both read them (``pipeline/`` because components never import each other)."""

from __future__ import annotations

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.topology import GpuTopology, Link, TopologyError, free_gpus

__all__ = ["free_of", "topology_of"]


def topology_of(batch: Batch) -> GpuTopology:
    """The GPU topology a batch's ``gpu_links`` and ``devices`` describe; TopologyError when they disagree."""
    gpus = sorted(
        (d.device_index, d.device_id) for d in batch.devices if d.device_type == "gpu" and d.device_index is not None
    )
    indices = [index for index, _ in gpus]
    if indices != list(range(len(gpus))):
        raise TopologyError(f"GPU indices {indices} are not 0…{len(gpus) - 1}: a GPU is missing")
    links = [Link(r.gpu_a, r.gpu_b, r.pcie, r.nvlinks) for r in batch.gpu_links]
    return GpuTopology([uuid for _, uuid in gpus], links)


def free_of(batch: Batch, topology: GpuTopology) -> list[int]:
    """GPUs that no allocation holds (whole or by a replica: the device id is the GPU's UUID) and not in MIG mode."""
    taken = {a.device_id for a in batch.allocations}
    taken |= {d.device_id for d in batch.devices if d.mig_enabled}
    return free_gpus(topology, taken)
