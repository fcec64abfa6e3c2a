"""Receiver ``gpu_topology``: every GPU pair's link (PCIe common ancestor, NVLinks) and its score, each tick.

The topology is read from NVML once (``_topology.py``) and the same links are reported every tick, dated
now, so the scores are always in the Batch beside the devices. A read that fails is retried at the next
tick; until one succeeds the field stays absent (the tick's failure is logged and counted by the runtime).
NVML is initialised by this receiver too (NVML counts initialisations; the ``nvml`` receiver's are its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pynvml

from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.records import Record
from wattpipe.pipeline.records_topology import GpuLink
from wattpipe.pipeline.topology import GpuTopology
from wattpipe.receivers.nvml._errors import LibraryMissing, NvmlFailure, nvml_call
from wattpipe.receivers.nvml._topology import open_handles, read_topology

__all__ = ["TopologyConfig", "TopologyReceiver", "factory"]


class TopologyConfig(ComponentConfig):
    required: bool = False
    """Fail to start when NVML is unavailable, instead of reporting no GPU pairs."""


class TopologyReceiver:
    provides = frozenset({"gpu_links"})

    def __init__(self, config: TopologyConfig, ctx: CreateContext) -> None:
        self.config = config
        self.clock = ctx.clock
        self.log = ctx.logger
        self.available = False
        self.topology: GpuTopology | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._init)

    def _init(self) -> None:
        try:
            nvml_call(pynvml.nvmlInit)
        except NvmlFailure as exc:
            if self.config.required:
                raise RuntimeError(f"NVML is not available and gpu_topology is required: {exc}") from None
            reason = "no NVIDIA driver on this node?" if isinstance(exc, LibraryMissing) else "failed to initialise"
            self.log.warning("NVML is not available (%s: %s): no GPU topology", reason, exc)
            return
        self.available = True

    def _read(self) -> GpuTopology:
        topology = read_topology(open_handles())
        self.log.info("GPU topology: %d GPUs, %d pairs", len(topology), len(topology.links))
        return topology

    async def collect(self) -> Sequence[Record]:
        if not self.available:
            return ()
        if self.topology is None:
            self.topology = await asyncio.to_thread(self._read)
        now = self.clock.now()
        return [
            GpuLink(
                time=now,
                gpu_a=link.a,
                gpu_b=link.b,
                link=link.name,
                pcie=link.pcie,
                nvlinks=link.nvlinks,
                score=link.score,
            )
            for link in self.topology.links
        ]

    async def shutdown(self) -> None:
        if self.available:
            try:
                await asyncio.to_thread(nvml_call, pynvml.nvmlShutdown)
            except NvmlFailure as exc:
                self.log.warning("nvmlShutdown failed: %s", exc)
            self.available = False


factory = Factory.of(
    TopologyReceiver,
    type="gpu_topology",
    kind="receiver",
    config_model=TopologyConfig,
    description="NVIDIA GPU topology through NVML: each GPU pair's PCIe level, NVLinks (NVSwitch by P2P) and score.",
    stability="alpha",
    provides=frozenset({"gpu_links"}),
)
