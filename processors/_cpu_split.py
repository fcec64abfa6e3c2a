"""One tick of CPU attribution, as seed 002 (Kepler's power attribution guide) defines it: pure arithmetic.

Per RAPL zone: the counter's delta (integer mJ), ``active = delta × usage ratio`` (node CPU time from
/proc/stat: Δactive_s / Δtotal_s), ``idle = delta − active``; the processes share the active energy by
their CPU-time delta over the sum of the processes' deltas (the seed's ``ProcessTotalCPUTimeDelta``),
apportioned by largest remainder so ``idle + Σ processes + unattributed == delta`` exactly. Where no process
used CPU time (or the listing failed), the active energy is the zone's explicit unattributed remainder.

``idle`` mode (optional, not the seed's): the zone's idle is a configured baseline × the interval (at most the
delta), and only the energy above it is active: on a node whose idle power is known this bills processes
their dynamic energy, where the usage ratio also bills them the idle power's share of their busy cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wattpipe.processors.attribution_math import apportion

__all__ = ["ZoneSplit", "idle_active", "split_zone", "splittable", "usage_ratio"]


@dataclass(frozen=True, slots=True)
class ZoneSplit:
    """One zone's tick: ``idle_mj + sum(shares_mj) + unattributed_mj == energy_mj``."""

    energy_mj: int
    idle_mj: int
    active_mj: int
    shares_mj: list[int]  # one per weight, in the weights' order
    unattributed_mj: int


def usage_ratio(delta_active_s: float, delta_total_s: float) -> float | None:
    """The node's CPU usage ratio over a tick (0–1); ``None`` when /proc/stat did not advance."""
    if delta_total_s <= 0:
        return None
    return min(1.0, max(0.0, delta_active_s / delta_total_s))


def split_zone(
    energy_mj: int,
    weights: Sequence[float],
    ratio: float | None,
    idle_mj: int | None = None,
    attributable: bool = True,
) -> ZoneSplit:
    """Split one zone's tick energy.

    ``ratio`` is the usage ratio (``None``: unknown; without ``idle_mj`` the whole delta is active and unattributed). ``idle_mj``,
    when given, is the idle mode's baseline for the tick and replaces the ratio's split. ``attributable``
    False (the process listing failed): the active energy is all unattributed.
    """
    idle, active = idle_active(energy_mj, ratio, idle_mj)
    if not splittable(weights, ratio, idle_mj, attributable):
        return ZoneSplit(energy_mj, idle, active, [0] * len(weights), active)
    shares = apportion(active, weights)
    return ZoneSplit(energy_mj, idle, active, shares, 0)


def idle_active(energy_mj: int, ratio: float | None, idle_mj: int | None = None) -> tuple[int, int]:
    """A zone's tick energy as (idle, active) mJ: by the idle mode's baseline, else the usage ratio, else all
    active (the ratio unknown)."""
    if energy_mj < 0:
        raise ValueError(f"a zone's tick energy cannot be negative ({energy_mj} mJ)")
    if idle_mj is not None:
        idle = min(energy_mj, max(0, idle_mj))
    elif ratio is not None:
        idle = energy_mj - round(energy_mj * ratio)
    else:
        idle = 0
    return idle, energy_mj - idle


def splittable(weights: Sequence[float], ratio: float | None, idle_mj: int | None, attributable: bool) -> bool:
    """Whether the active energy goes to processes: /proc answered, the split is known, someone used CPU."""
    return attributable and (ratio is not None or idle_mj is not None) and any(w > 0 for w in weights)
