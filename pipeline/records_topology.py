"""The topology records (issue 19): each GPU pair's link and the node's best free set per request size.

Beside ``records.py`` (which is at its size limit) rather than in it; ``pipeline/batch.py`` carries them in
``gpu_links`` and ``gpu_set_scores`` and checks them against :data:`TOPOLOGY_RECORD_TYPES`. The scores are
:mod:`pipeline.topology`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from wattpipe.pipeline._slots import quick_init
from wattpipe.pipeline.records import Record

__all__ = ["TOPOLOGY_RECORD_TYPES", "GpuLink", "GpuSetScore"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuLink(Record):
    """The path between GPUs ``gpu_a`` < ``gpu_b`` (NVML indices): ``link`` as nvidia-smi prints it
    (``NV2``, ``SYS``…), the PCIe level beneath, the NVLinks the pair can use, and go-gpuallocator's score for it."""

    IDENTITY: ClassVar[tuple[str, ...]] = ("gpu_a", "gpu_b", "link")

    gpu_a: int
    gpu_b: int
    link: str
    pcie: str  # the PCIe common ancestor beneath any NVLinks (PIX … SYS)
    nvlinks: int
    score: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSetScore(Record):
    """The best set of ``size`` GPUs among the node's free ones: its summed pair scores and members
    (``gpus``, comma-separated indices). One per size up to the node's GPU count; ``score`` is ``None``
    (absent, no series) when fewer than ``size`` GPUs are free. ``free_gpus`` is the same on every one."""

    IDENTITY: ClassVar[tuple[str, ...]] = ("size",)

    size: int
    free_gpus: int
    score: int | None = None
    gpus: str | None = None


TOPOLOGY_RECORD_TYPES: tuple[type[Record], ...] = (GpuLink, GpuSetScore)

for _record_type in TOPOLOGY_RECORD_TYPES:
    quick_init(_record_type)
