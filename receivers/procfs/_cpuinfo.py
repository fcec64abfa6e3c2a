"""The node's logical CPUs from ``/proc/cpuinfo`` (Kepler's ``kepler_node_cpu_info``): static, read once."""

from __future__ import annotations

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records_cpu import CpuInfo

__all__ = ["parse_cpuinfo"]


def parse_cpuinfo(text: str, now: Timestamp) -> list[CpuInfo]:
    """One record per block with a ``processor`` number, with its ``vendor_id``, ``model name``, ``physical id``
    and ``core id`` (x86's keys; an architecture that writes none of them, or an empty value, leaves that field
    None). Blocks without a processor number (ARM's trailing ``Hardware`` block) and lines that are not
    ``key : value`` are skipped. Raises ValueError when no block names a processor."""
    out: list[CpuInfo] = []
    block: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if line.strip():
            key, sep, value = line.partition(":")
            if sep:
                block.setdefault(key.strip(), value.strip())
            continue
        processor = block.get("processor", "")
        if processor.isdigit():
            out.append(_record(processor, block, now))
        block = {}
    if not out:
        raise ValueError(f"no 'processor : <number>' line in {len(text)} characters")
    return out


def _record(processor: str, block: dict[str, str], now: Timestamp) -> CpuInfo:
    return CpuInfo(
        time=now,
        processor=processor,
        vendor_id=block.get("vendor_id") or None,
        model_name=block.get("model name") or None,
        physical_id=block.get("physical id") or None,
        core_id=block.get("core id") or None,
    )
