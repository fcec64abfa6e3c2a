"""Exporter ``node_annotation``: the node's GPU topology and best-set scores as a node annotation (opt-in).

For ``wattpipe extender`` (docs/topology.md): one compact annotation (``wattpipe.io/gpu-topology``, format in
:mod:`pipeline.topology_annotation`) with the link matrix, the free GPUs and the best free set's score of
each size, patched onto this node (``service.node_name``, or ``node_name``) through the API server. Written
only when it changes (the topology never does; the free GPUs when pods come and go), so a steady node costs
the API server nothing. A failed patch is retried at the next tick. Needs RBAC ``patch`` on ``nodes``: the
Helm chart grants it only with ``topology.annotateNode``. Without a pod-resources answer (no set scores)
nothing is written: a stale annotation is better than one claiming every GPU free.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.topology import BestSet
from wattpipe.pipeline.topology_annotation import ANNOTATION, encode
from wattpipe.pipeline.topology_batch import free_of, topology_of

__all__ = ["NodeAnnotationConfig", "NodeAnnotationExporter", "factory"]


class NodeAnnotationConfig(ComponentConfig):
    annotation: str = ANNOTATION
    """The annotation key (``wattpipe extender`` reads ``wattpipe.io/gpu-topology``)."""
    node_name: str = ""
    """The node to annotate; empty: ``service.node_name``."""


class NodeAnnotationExporter:
    def __init__(self, config: NodeAnnotationConfig, ctx: CreateContext) -> None:
        self.config = config
        self.node = config.node_name or ctx.node_name
        self.log = ctx.logger
        self.written: str | None = None
        self._core: Any = None

    def render(self, batch: Batch) -> str | None:
        """The annotation this batch gives, or None when it says too little (no links, devices or scores)."""
        if not {"gpu_links", "devices", "gpu_set_scores"} <= batch.present or not batch.gpu_set_scores:
            return None
        topology = topology_of(batch)
        sets = [
            BestSet(size=r.size, gpus=tuple(int(g) for g in r.gpus.split(",")), score=r.score)
            for r in sorted(batch.gpu_set_scores, key=lambda r: r.size)
            if r.score is not None and r.gpus is not None
        ]
        return encode(topology, free_of(batch, topology), sets)

    def _patch(self, text: str) -> None:
        if self._core is None:
            from kubernetes import client

            from wattpipe.pipeline.kube import api_client

            api = api_client(os.environ)
            if api is None:
                raise RuntimeError("no Kubernetes API to patch the node annotation in (not in a pod and no KUBECONFIG)")
            self._core = client.CoreV1Api(api)
        self._core.patch_node(self.node, {"metadata": {"annotations": {self.config.annotation: text}}})

    async def export(self, batch: Batch) -> None:
        text = self.render(batch)
        if text is None or text == self.written:
            return
        await asyncio.to_thread(self._patch, text)
        self.written = text
        self.log.info("node %s: annotation %s updated (%d bytes)", self.node, self.config.annotation, len(text))


factory = Factory.of(
    NodeAnnotationExporter,
    type="node_annotation",
    kind="exporter",
    config_model=NodeAnnotationConfig,
    description="Patches this node's GPU topology and best-set scores into a node annotation, when they change.",
    stability="alpha",
)
