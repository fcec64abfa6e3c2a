"""``cpu_attribution``: a zone's energy held over ticks whose process listing failed.

A tick whose /proc listing failed (``host_processes`` absent: unknown, not empty) has no CPU-time deltas, while the
processor keeps the last listing's readings, so the next listing's deltas span the failed ticks as well as its own.
Its zones were read: only who used their active energy is not known. So each read zone's active energy is held, per
zone, and the next tick that splits the zone with a listing splits it with its own: the energy and the deltas then
span the same ticks (a zone back from a gap meanwhile: the gap's deltas, which span them too). Where that tick cannot
split the zone (no process used CPU time, the ratio not known), the held energy is unattributed with the tick's.
Where /proc/stat failed too (procfs timed out: all its fields absent), the tick's idle is not known either: its
whole energy is held, and split into idle and active by the usage ratio of the next tick that reads /proc/stat (the
processor keeps the last reading, so that ratio spans the failed tick too), as a zone's gap is.

Not held: ticks with no listing yet (no readings for the next deltas to start from), a zone back from a gap in the
failed tick (its energy may span more than the next deltas); a listing failing for longer than ``GAP_MAX_S`` since
the last one answered releases what was held (its active energy unattributed) and holds nothing more until a
listing answers (a listing down for good holds nobody's energy back for long). A zone unread for longer than that
(gone for good) has what it held added to its totals as unattributed, with no record (``Holds.expired``).

The records say it as the GPU side's idle hold does (pipeline/records.py): a tick's ``DevicePower`` has the energy
it measured, the idle and active settled that tick (held: its active energy, or all of it, is in neither yet),
``unattributable="processes_unknown"`` (no watts for any process that tick) and the level held in
``held_energy_mj``; per zone per tick ``idle + active + (held now − held before) == energy`` and ``Σ shares +
unattributed == active``. The releasing tick's idle and active include what it released (its watts over the tick's
own interval; the processes' over the interval their energy spans). The zone's totals are the records' sums, so
they take held energy when it is released: ``energy == idle + attributed + unattributed`` stays exact, no total
goes down, and the zone's energy total lags the counter by the level held. The state file has no held energy: a
restart's first listing is a baseline, so the held is saved as unattributed (``Holds.saved``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from wattpipe.pipeline.records import CpuZoneSample
from wattpipe.processors._cpu_split import idle_active

__all__ = ["Held", "Holds", "Settled"]


@dataclass(frozen=True, slots=True)
class Held:
    """A zone's held energy (mJ): active (its idle settled when it was measured) and whole (idle not known then),
    and the interval it spans (s: its held ticks', summed)."""

    active_mj: int = 0
    whole_mj: int = 0
    span_s: float = 0.0

    @property
    def mj(self) -> int:
        return self.active_mj + self.whole_mj


class Settled(NamedTuple):
    """A read zone's tick as its record says it: idle and active settled, the level held after it, and the
    interval the active energy spans (the tick's, and the held ticks' where it released them)."""

    idle_mj: int
    active_mj: int
    held_mj: int
    span_s: float


class Holds:
    """Each zone's held energy, by path."""

    def __init__(self) -> None:
        self.zones: dict[str, Held] = {}

    def settle(
        self, path: str, tick: Settled, ratio: float | None, *, release: bool, hold: bool, idle_known: bool
    ) -> Settled:
        """One read zone's ``tick`` (its own idle, active and interval): ``release`` (the listing answered, or
        failed past the bound): what it held joins the tick's, the whole energy split by ``ratio`` (all active
        where it is not known); else ``hold``: the tick's active energy joins the held (all of it, where its idle
        is not known; where it is and ``ratio`` too, the whole energy held is split by it); neither: the held
        stays."""
        before = self.zones.get(path)
        if release:
            if before is None:
                return tick
            del self.zones[path]
            idle, active = idle_active(before.whole_mj, ratio)
            return Settled(
                tick.idle_mj + idle, tick.active_mj + before.active_mj + active, 0, tick.span_s + before.span_s
            )
        held = before or Held()
        if not hold:
            return tick._replace(held_mj=held.mj)
        if idle_known:  # (a whole energy held before: split by this tick's ratio, which spans it)
            idle, active, whole = 0, 0, held.whole_mj
            if whole and ratio is not None:
                (idle, active), whole = idle_active(whole, ratio), 0
            after = Held(held.active_mj + tick.active_mj + active, whole, held.span_s + tick.span_s)
            self.zones[path] = after
            return Settled(tick.idle_mj + idle, 0, after.mj, tick.span_s)
        after = Held(held.active_mj, held.whole_mj + tick.idle_mj + tick.active_mj, held.span_s + tick.span_s)
        self.zones[path] = after
        return Settled(0, 0, after.mj, tick.span_s)

    def expired(self, zones: Mapping[str, CpuZoneSample], before_s: float) -> dict[str, Held]:
        """What the zones last read before ``before_s`` held (taken out): gone for good, no listing will split it."""
        gone = [path for path in self.zones if zones[path].time.monotonic_s < before_s]
        return {path: self.zones.pop(path) for path in gone}

    def saved(self, rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The zones' state-file rows (``_cpu_zone_totals.dumped``'s), each zone's held energy in them as
        unattributed: after a restart no listing's deltas span it (the first listing is a baseline), and a total
        never goes down."""
        for path, held in self.zones.items():
            if (row := rows.get(path)) is not None and held.mj:
                for key in ("energy_mj", "active_mj", "unattributed_mj"):
                    row[key] += held.mj
        return rows
