"""Each RAPL zone's running totals in cpu_attribution (energy, idle, active, unattributed, in integer mJ), keyed by
the zone's path: what ``kepler_node_cpu_*_joules_total`` exports and the state file keeps across a restart.

A path that reads another zone type than its restored totals say (the subzones enumerated in another order after a
reboot, DRAM RAPL switched on) starts its totals again from 0 under the new type, with a warning: the old type's
series ends there rather than carry its energy on under the new type's label."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import CpuZoneSample, DeviceTotals
from wattpipe.processors._energy_series import start_at

__all__ = ["ZoneTotals", "device_totals", "dumped", "restored", "totals_for"]


@dataclass(slots=True)
class ZoneTotals:
    zone: str
    socket: int | None
    start_wall_s: float
    energy_mj: int = 0
    idle_mj: int = 0
    active_mj: int = 0
    unattributed_mj: int = 0
    extra: tuple[tuple[str, str], ...] = field(default=())


def restored(saved: Mapping[Any, Any]) -> dict[str, ZoneTotals]:
    """Every zone's totals from the state section's ``zones`` (:func:`dumped`'s); a bad row raises."""
    return {str(path): _restored_zone(str(path), row) for path, row in dict(saved).items()}


def dumped(table: Mapping[str, ZoneTotals]) -> dict[str, dict[str, Any]]:
    """The state section's ``zones``: each zone's totals, by path."""
    return {path: {k: v for k, v in asdict(t).items() if k != "extra"} for path, t in table.items()}


def _restored_zone(path: str, row: Mapping[str, Any]) -> ZoneTotals:
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


def totals_for(
    table: dict[str, ZoneTotals], sample: CpuZoneSample, start_wall_s: float, log: logging.Logger
) -> ZoneTotals:
    """``sample``'s zone's totals in ``table``: new ones from ``start_wall_s`` where it has none, or where the path's
    totals are of another zone type (said once, as the module docstring has it)."""
    totals = table.get(sample.path)
    if totals is not None and totals.zone != sample.zone:
        log.warning(
            "zone %s reads as %s now, %s in the state file (the zones enumerated in another order since the "
            "restart?): its totals start again from 0 under zone=%s; the %s series ends",
            sample.path,
            sample.zone,
            totals.zone,
            sample.zone,
            totals.zone,
        )
        totals = None
    if totals is None:
        extra = (("path", sample.path), ("zone", sample.zone))
        totals = table[sample.path] = ZoneTotals(sample.zone, sample.socket, start_wall_s, extra=extra)
    return totals


def device_totals(table: Mapping[str, ZoneTotals], now: Timestamp) -> tuple[DeviceTotals, ...]:
    """A ``DeviceTotals`` per zone, in path order."""
    return tuple(
        DeviceTotals(
            time=now,
            extra=t.extra,
            device_id=path,
            device_type="cpu",
            device_index=t.socket,
            device_name=t.zone,
            energy_mj=t.energy_mj,
            idle_energy_mj=t.idle_mj,
            active_energy_mj=t.active_mj,
            attributed_energy_mj=t.active_mj - t.unattributed_mj,
            unattributed_energy_mj=t.unattributed_mj,
            start=start_at(now, t.start_wall_s),
        )
        for path, t in sorted(table.items())
    )
