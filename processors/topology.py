"""Processor ``gpu_placement``: the node's best free GPU set of every request size, and its score.

Needs ``gpu_links`` (receiver ``gpu_topology``) and ``devices`` (receiver ``nvml``: which UUID each index
is). A GPU is taken when the kubelet allocated it (``allocations``, receiver ``podresources``: whole, or any
time-sliced replica of it) or it is in MIG mode (a whole-GPU request cannot have it). Without a pod-resources
answer this tick nobody can say which GPUs are free: the set scores are then left out (absent), unless
``assume_free: true`` (a node with no kubelet to ask) counts every GPU free. The search
(:func:`pipeline.topology.best_sets`) runs again only when the topology or the free GPUs change.
"""

from __future__ import annotations

import logging

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.records_topology import GpuSetScore
from wattpipe.pipeline.topology import BestSet, GpuTopology, TopologyError, best_sets
from wattpipe.pipeline.topology_batch import free_of, topology_of

__all__ = ["PlacementConfig", "PlacementProcessor", "factory"]


class PlacementConfig(ComponentConfig):
    assume_free: bool = False
    """Count every GPU free when no pod-resources answer says otherwise (no ``podresources`` receiver)."""


class PlacementProcessor:
    needs = frozenset({"gpu_links", "devices"})
    provides = frozenset({"gpu_set_scores"})

    def __init__(self, config: PlacementConfig, ctx: CreateContext) -> None:
        self.config = config
        self.telemetry = ctx.telemetry
        self._cache: tuple[GpuTopology, tuple[int, ...], list[BestSet]] | None = None

    def _sets(self, topology: GpuTopology, free: list[int]) -> list[BestSet]:
        if self._cache is None or self._cache[:2] != (topology, tuple(free)):
            self._cache = (topology, tuple(free), best_sets(topology, free))
        return self._cache[2]

    def process(self, batch: Batch) -> Batch:
        if "gpu_links" not in batch.present or "devices" not in batch.present:
            return batch
        if "allocations" not in batch.present and not self.config.assume_free:
            return batch
        try:
            topology = topology_of(batch)
        except TopologyError as exc:
            self.telemetry.log.log(logging.WARNING, "topology", f"GPU topology not scored this tick: {exc}")
            return batch
        free = free_of(batch, topology)
        found = {s.size: s for s in self._sets(topology, free)}
        records = []
        for size in range(1, len(topology) + 1):
            best = found.get(size)
            records.append(
                GpuSetScore(
                    time=batch.time,
                    size=size,
                    free_gpus=len(free),
                    score=None if best is None else best.score,
                    gpus=None if best is None else ",".join(map(str, best.gpus)),
                )
            )
        return batch.replace(gpu_set_scores=tuple(records))


factory = Factory.of(
    PlacementProcessor,
    type="gpu_placement",
    kind="processor",
    config_model=PlacementConfig,
    description="The best free GPU set of every request size on this node and its topology score (KEP-690).",
    stability="alpha",
    provides=frozenset({"gpu_set_scores"}),
)
