"""How a MIG GPU's active energy is split: by instance (activity × compute slices), then per process.

GR_ENGINE_ACTIVE is normalised to its own instance (a busy 1g instance reads 1.0, like a busy 7g one;
NVIDIA/DCGM#138), so each instance's activity is weighted by its compute slices. Inside an instance the
split is equal: NVML has no per-process utilisation under MIG. An instance that was active but shows no
process (processes hidden from this node's view) keeps its part in the explicit remainder. An instance that
has processes but no reported activity (made after dcgm-exporter started, which then leaves it out until it
restarts; a field DCGM left blank) is not idle, only unknown: it is weighed as the reported instances are on
average, its slices × their activity per slice (:func:`with_unreported`). With no instance reported, the
split is by slices over the instances with processes: the same rule, all of them unknown.

The two steps are separate (:func:`instance_parts`, then :func:`split_members`) because the instance
parts of a tick may be corrected before they reach the processes (``_mig_window``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wattpipe.processors.attribution_math import apportion

__all__ = [
    "Group",
    "MigSplit",
    "group_order",
    "instance_parts",
    "members_of",
    "split_members",
    "split_mig",
    "unreported",
    "with_unreported",
]

Group = int | None
"""A GPU instance id; None groups the processes whose instance is not known."""


@dataclass(frozen=True, slots=True)
class MigSplit:
    by_pid: dict[int, int]  # mJ per process
    fraction_by_pid: dict[int, float]
    unattributed_mj: int
    by_instance: dict[int, int]  # mJ per GPU instance (processes' and unseen), known instances only


def group_order(group: Group) -> tuple[bool, int]:
    """Instances by id, the unknown-instance group last."""
    return group is None, group or 0


def members_of(processes: Sequence[tuple[int, int | None]]) -> dict[Group, list[int]]:
    """``processes``: (pid, GPU-instance id) → the pids of each group."""
    members: dict[Group, list[int]] = {}
    for pid, gi in processes:
        members.setdefault(gi, []).append(pid)
    return members


def instance_parts(
    active_mj: int,
    members: Mapping[Group, Sequence[int]],
    slices: Mapping[int, int | None],
    weight_of: Mapping[int, float],
) -> dict[Group, int]:
    """``active_mj`` split over every group named in ``weight_of``, ``slices`` or ``members``.

    ``weight_of``: per instance, activity × slices (or slices). The unknown-instance group has weight 0
    unless nothing else has weight; an instance with processes missing from it, its estimate
    (:func:`with_unreported`). Σ parts == active_mj.
    """
    weight_of = with_unreported(weight_of, members, slices)
    groups: list[Group] = sorted({*weight_of, *slices, *members}, key=group_order)
    weights = [max(0.0, weight_of.get(g, 0.0)) if g is not None else 0.0 for g in groups]
    if sum(weights) <= 0:
        # No activity anywhere: the instances that have processes share by slices (or equally).
        weights = [float(slices.get(g) or 1) if g is not None and members.get(g) else 0.0 for g in groups]
        if sum(weights) <= 0:
            weights = [1.0 if members.get(g) else 0.0 for g in groups]
    return dict(zip(groups, apportion(active_mj, weights), strict=True))


def unreported(weight_of: Mapping[int, float], members: Mapping[Group, Sequence[int]]) -> list[int]:
    """The instances that have processes but no weight, while some instance has one (dcgm-exporter reports
    others): their activity is unknown."""
    if not weight_of:
        return []
    return sorted(g for g, pids in members.items() if g is not None and pids and g not in weight_of)


def with_unreported(
    weight_of: Mapping[int, float], members: Mapping[Group, Sequence[int]], slices: Mapping[int, int | None]
) -> dict[int, float]:
    """``weight_of`` (activity × slices of the reported instances) with each :func:`unreported` instance
    weighed at the reported ones' activity per slice (Σ weight / Σ slices) × its own slices: unknown is
    neither idle (0: its processes billed nothing, its energy billed to the others) nor busy."""
    missing = unreported(weight_of, members)
    if not missing:
        return dict(weight_of)
    per_slice = sum(max(0.0, w) for w in weight_of.values()) / sum(slices.get(g) or 1 for g in weight_of)
    return {**weight_of, **{g: per_slice * (slices.get(g) or 1) for g in missing}}


def split_members(parts: Mapping[Group, int], members: Mapping[Group, Sequence[int]]) -> MigSplit:
    """Each group's part split equally among its pids; a group without pids goes to the remainder."""
    total = sum(parts.values())
    by_pid: dict[int, int] = {}
    fraction: dict[int, float] = {}
    unattributed = 0
    for group in sorted(parts, key=group_order):
        part = parts[group]
        pids = sorted(members.get(group, []))
        if not pids:
            unattributed += part
            continue
        for pid, mj in zip(pids, apportion(part, [1.0] * len(pids)), strict=True):
            by_pid[pid] = by_pid.get(pid, 0) + mj
            fraction[pid] = fraction.get(pid, 0.0) + (mj / total if total else 0.0)
    by_instance = {g: mj for g, mj in parts.items() if g is not None}
    return MigSplit(by_pid, fraction, unattributed, dict(sorted(by_instance.items())))


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
    members = members_of(processes)
    return split_members(instance_parts(active_mj, members, slices, weight_of), members)
