"""What a GPU model name implies: architecture, MIG support, memory, NVLink count.

The scenario names a GPU by its marketing name (what ``nvmlDeviceGetName`` returns); the simulator
derives the capabilities that real drivers tie to the chip, so a scenario cannot describe a GPU that
could not exist (MIG on a T4, an energy counter on a P100) unless it says so explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GpuModelInfo", "gpu_model_info", "mig_profile_memory_mib", "mig_profile_slices"]

# NVML_DEVICE_ARCH_* values (nvml.h); the names are ours.
ARCH_KEPLER = 2
ARCH_MAXWELL = 3
ARCH_PASCAL = 4
ARCH_VOLTA = 5
ARCH_TURING = 6
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10
ARCH_UNKNOWN = 0xFFFFFFFF

# Ordered: the first pattern that matches the model name wins (so "A100" is tried before "A10").
_ARCH_PATTERNS: tuple[tuple[str, int], ...] = (
    (r"\bG?B(100|200|300)\b|GB200|GB300", ARCH_BLACKWELL),
    (r"\bG?H(100|200|800|20)\b|GH200", ARCH_HOPPER),
    (r"\bL(4|40|40S|20)\b|RTX 40|Ada", ARCH_ADA),
    (r"\bA(100|800|30|40|10|16|2)\b|RTX A\d|RTX 30", ARCH_AMPERE),
    (r"\bT4\b|RTX 20|Quadro RTX|TITAN RTX", ARCH_TURING),
    (r"\bV100\b|TITAN V", ARCH_VOLTA),
    (r"\bP(100|40|4|6)\b|GTX 10|TITAN X", ARCH_PASCAL),
    (r"\bM(60|40|10|6)\b|GTX 9", ARCH_MAXWELL),
    (r"\bK(80|40|20|10)\b", ARCH_KEPLER),
)

# MIG-capable chips (GA100, GH100, GB100/GB200 families) and how many compute slices they have.
_MIG_SLICES: tuple[tuple[str, int], ...] = (
    (r"\bA30\b", 4),
    (r"\bA100\b|\bA800\b|\bH100\b|\bH200\b|\bH800\b|\bH20\b|GH200|\bB200\b|\bB100\b|GB200", 7),
)

# NVLink links per GPU by generation (0: PCIe-only card unless the scenario says otherwise).
_NVLINK_LINKS: tuple[tuple[str, int], ...] = (
    (r"\bB(100|200)\b|GB200", 18),
    (r"\bH(100|200|800)\b", 18),
    (r"\bA(100|800)\b", 12),
    (r"\bV100\b", 6),
)

_MEMORY_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)
_MIG_PROFILE = re.compile(r"^(\d)g\.(\d+)gb$")


@dataclass(frozen=True, slots=True)
class GpuModelInfo:
    """Capabilities the driver derives from the chip."""

    architecture: int
    mig_slices: int  # compute slices under MIG; 0 = MIG not supported
    nvlink_count: int
    memory_mib: int

    @property
    def mig_capable(self) -> bool:
        return self.mig_slices > 0

    @property
    def has_energy_counter(self) -> bool:
        # nvmlDeviceGetTotalEnergyConsumption: "For Volta or newer fully supported devices".
        return self.architecture == ARCH_UNKNOWN or self.architecture >= ARCH_VOLTA


def _first_match(patterns: tuple[tuple[str, int], ...], name: str, default: int) -> int:
    for pattern, value in patterns:
        if re.search(pattern, name):
            return value
    return default


def gpu_model_info(model: str) -> GpuModelInfo:
    memory = _MEMORY_GB.search(model)
    # Marketing "80GB" is 81,559 MiB usable on an H100; 1,000 MiB per GB is close enough for FB_* rows.
    memory_mib = int(memory.group(1)) * 1000 if memory else 16_000
    return GpuModelInfo(
        architecture=_first_match(_ARCH_PATTERNS, model, ARCH_UNKNOWN),
        mig_slices=_first_match(_MIG_SLICES, model, 0),
        nvlink_count=_first_match(_NVLINK_LINKS, model, 0),
        memory_mib=memory_mib,
    )


def mig_profile_slices(profile: str) -> int:
    """``"3g.40gb"`` → 3: the number of compute slices (the number before ``g``)."""
    match = _MIG_PROFILE.match(profile)
    if match is None:
        raise ValueError(f"MIG profile {profile!r} is not of the form '<N>g.<M>gb' (e.g. '1g.10gb')")
    return int(match.group(1))


def mig_profile_memory_mib(profile: str) -> int:
    match = _MIG_PROFILE.match(profile)
    if match is None:
        raise ValueError(f"MIG profile {profile!r} is not of the form '<N>g.<M>gb' (e.g. '1g.10gb')")
    return int(match.group(2)) * 1000
