"""How a MIG GPU's active energy is split: by instance (activity × compute slices), then per process.

GR_ENGINE_ACTIVE is normalised to its own instance (a busy 1g instance reads 1.0, like a busy 7g one;
NVIDIA/DCGM#138), so each instance's activity is weighted by its compute slices. Inside an instance the
split is equal: NVML has no per-process utilisation under MIG. An instance that was active but shows no
process (processes hidden from this node's view) keeps its part in the explicit remainder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from processors.attribution_math import apportion

__all__ = ["MigSplit", "split_mig"]


@dataclass(frozen=True, slots=True)
class MigSplit:
    by_pid: dict[int, int]  # mJ per process
    fraction_by_pid: dict[int, float]
    unattributed_mj: int
    by_instance: dict[int, int]  # mJ per GPU instance (processes' and unseen), known instances only


def split_mig(
    active_mj: int,
    processes: Sequence[tuple[int, int | None]],
    slices: Mapping[int, int | None],
    weight_of: Mapping[int, float],
) -> MigSplit:
    """``processes``: (pid, GPU-instance id); ``weight_of``: per instance, activity × slices (or slices).

    Instances are every one named in ``weight_of``, ``slices`` or by a process. A process whose instance is
    unknown (None) forms a group of its own with weight 0 unless nothing else has weight.
    """
    members: dict[int | None, list[int]] = {}
    for pid, gi in processes:
        members.setdefault(gi, []).append(pid)
    groups: list[int | None] = sorted({*weight_of, *slices, *members}, key=lambda g: (g is None, g or 0))
    weights = [max(0.0, weight_of.get(g, 0.0)) if g is not None else 0.0 for g in groups]
    if sum(weights) <= 0:
        # No activity anywhere: the instances that have processes share by slices (or equally).
        weights = [float(slices.get(g) or 1) if g is not None and members.get(g) else 0.0 for g in groups]
        if sum(weights) <= 0:
            weights = [1.0 if members.get(g) else 0.0 for g in groups]
    parts = apportion(active_mj, weights)
    total_w = sum(weights) or 1.0
    by_pid: dict[int, int] = {}
    fraction: dict[int, float] = {}
    unattributed = 0
    by_instance: dict[int, int] = {}
    for group, part, w in zip(groups, parts, weights, strict=True):
        if group is not None:
            by_instance[group] = part
        pids = sorted(members.get(group, []))
        if not pids:
            unattributed += part
            continue
        for pid, mj in zip(pids, apportion(part, [1.0] * len(pids)), strict=True):
            by_pid[pid] = by_pid.get(pid, 0) + mj
            fraction[pid] = fraction.get(pid, 0.0) + w / total_w / len(pids)
    return MigSplit(by_pid, fraction, unattributed, by_instance)
