"""The CPU records beside ``records.py`` (which is near its size limit): the node's logical CPUs as
``/proc/cpuinfo`` describes them (Kepler's ``kepler_node_cpu_info``).

``pipeline/batch.py`` carries them in ``cpu_info`` and checks them against :data:`CPU_RECORD_TYPES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from wattpipe.pipeline._slots import quick_init
from wattpipe.pipeline.records import Record

__all__ = ["CPU_RECORD_TYPES", "CpuInfo"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuInfo(Record):
    """One logical CPU of ``/proc/cpuinfo``: static, read once by the ``procfs`` receiver. A key the kernel does
    not write on this architecture (``physical id`` in a VM, ``vendor_id`` on many ARM kernels) is None."""

    IDENTITY: ClassVar[tuple[str, ...]] = ("processor", "vendor_id", "model_name", "physical_id", "core_id")

    processor: str  # the logical CPU's number (``processor : 3``)
    vendor_id: str | None = None  # GenuineIntel, AuthenticAMD
    model_name: str | None = None  # ``model name``
    physical_id: str | None = None  # ``physical id``: the socket
    core_id: str | None = None  # ``core id``: the core within its socket


CPU_RECORD_TYPES: tuple[type[Record], ...] = (CpuInfo,)

for _record_type in CPU_RECORD_TYPES:
    quick_init(_record_type)
