"""``cpu_attribution``: a zone's active energy held over ticks whose process listing failed.

A tick whose /proc listing failed (``host_processes`` absent: unknown, not empty) has no CPU-time deltas, while the
processor keeps the last listing's readings, so the next listing's deltas span the failed ticks as well as its own.
Its zones were read, and their idle/active split is known (the usage ratio, or the idle mode's idle): only who used
the active energy is not. So each read zone's active energy is held, per zone, and the next tick that splits the
zone with a listing splits it with its own: the energy and the deltas then span the same ticks (a zone back from a
gap meanwhile: the gap's deltas, which span them too). Where that tick cannot split the zone (no process used CPU
time, the ratio not known), the held energy is unattributed with the tick's.

Not held: a tick whose idle is not known too (no /proc/stat: its active energy is all of it, idle included), and
ticks with no listing yet (no readings for the next deltas to start from); a listing failing for longer than
``GAP_MAX_S`` since the last one answered releases what was held as unattributed and holds nothing more until a
listing answers (a listing down for good holds nobody's energy back for long).

The records say it as a held MIG tick does (pipeline/records.py): the failed tick's ``DevicePower`` has its idle
and active energy as measured, ``unattributable="processes_unknown"`` (no watts for any process that tick) and the
held level in ``held_energy_mj``; per zone per tick ``idle + Σ shares + unattributed + (held now − held before) ==
energy``. The zone's totals (``DeviceTotals``) count held energy when it is released, as the GPU side's idle hold
does, so ``energy == idle + attributed + unattributed`` stays exact and no total goes down. The state file has
no held energy: a restart's first listing is a baseline, so the held is saved as unattributed (``rows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Held", "Holds", "ZoneTotals", "restored_zone"]


@dataclass(frozen=True, slots=True)
class Held:
    """A zone's held active energy (mJ) and the interval it spans (s: its held ticks', summed)."""

    mj: int = 0
    span_s: float = 0.0


_NONE = Held()


class Holds:
    """Each zone's held active energy, by path."""

    def __init__(self) -> None:
        self.zones: dict[str, Held] = {}

    def get(self, path: str) -> Held:
        return self.zones.get(path, _NONE)

    def settle(
        self, path: str, active_mj: int, interval_s: float, *, release: bool, hold: bool
    ) -> tuple[Held, int, int]:
        """One read zone's tick: what is released of its held energy (to split with the tick's active energy, or to
        leave unattributed with it), and the level held before and after it. ``release``: the listing answered
        (or failed past the bound); else ``hold``: the tick's active energy joins the held (False: it stays)."""
        before = self.zones.get(path, _NONE)
        if release:
            self.zones.pop(path, None)
            return before, before.mj, 0
        if hold:
            self.zones[path] = Held(before.mj + active_mj, before.span_s + interval_s)
            return _NONE, before.mj, before.mj + active_mj
        return _NONE, before.mj, before.mj


@dataclass(slots=True)
class ZoneTotals:
    """A zone's totals (mJ) since its series began: held energy joins them when it is released."""

    zone: str
    socket: int | None
    start_wall_s: float
    energy_mj: int = 0
    idle_mj: int = 0
    active_mj: int = 0
    unattributed_mj: int = 0
    extra: tuple[tuple[str, str], ...] = field(default=())


def restored_zone(path: str, row: Mapping[str, Any]) -> ZoneTotals:
    """A zone's totals from its state-file row (``rows``')."""
    zone = str(row["zone"])
    return ZoneTotals(
        zone=zone,
        socket=None if row.get("socket") is None else int(row["socket"]),
        start_wall_s=float(row["start_wall_s"]),
        energy_mj=int(row["energy_mj"]),
        idle_mj=int(row["idle_mj"]),
        active_mj=int(row["active_mj"]),
        unattributed_mj=int(row["unattributed_mj"]),
        extra=(("path", path), ("zone", zone)),
    )


def rows(totals: Mapping[str, ZoneTotals], holds: Holds) -> dict[str, dict[str, Any]]:
    """The zones' state-file rows, each zone's held energy in them as unattributed: after a restart no listing's
    deltas span it (the first listing is a baseline), and a total never goes down."""
    out = {path: {k: v for k, v in asdict(t).items() if k != "extra"} for path, t in totals.items()}
    for path, held in holds.zones.items():
        if (row := out.get(path)) is not None and held.mj:
            for key in ("energy_mj", "active_mj", "unattributed_mj"):
                row[key] += held.mj
    return out
