"""Receiver ``rapl``: CPU energy from the Linux powercap tree (Intel RAPL, and AMD Zen through the same tree).

Every tick it reads each zone's ``energy_uj`` under ``<root>/class/powercap`` (``root`` is ``/sys``, or
``/host/sys`` in a container with the host's /sys mounted there) and emits one :class:`CpuZoneSample` per
zone: package, core, uncore, dram, psys; each socket's zones by their own path (``intel-rapl:1:0``);
``intel-rapl-mmio`` duplicates of a package dropped. ``energy_uj`` in the record is monotonic: wraps at
``max_energy_range_uj`` are added back, and a counter that went backwards without a plausible wrap is a
reset (a new ``counter_epoch``, counted in ``wattpipe_rapl_counter_resets_total`` and logged).

Failure modes, each degrading rather than stopping:
- no powercap tree, or no RAPL zones in it (most VMs; a container without the mount): one log line naming
  the path and why, no records, ``cpu_zones`` absent (not empty); looked for again every tick;
- ``energy_uj`` unreadable (root-only since Linux 5.10): one log line naming the zones and the reason, no
  records from them;
- a zone that disappears (driver unloaded) or appears (a package registered after the first discovery): the
  tree's listing (one ``listdir`` a tick) differs from the one the zones were found from, and the tree is read
  again; a zone gone is one log line naming it (while it lasts), and one that comes back goes on from its last
  reading, so the energy over its gap is counted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.records import CpuZoneSample, Record
from wattpipe.receivers.rapl._counter import ZoneCounter
from wattpipe.receivers.rapl._zones import Discovery, Zone, discover, listing, max_range, read_int, zone_kind

__all__ = ["RaplConfig", "RaplReceiver", "Zone", "ZoneCounter", "discover", "factory", "zone_kind"]

_PROVIDES = frozenset({"cpu_zones"})
_ROOT_ONLY = (
    "permission denied (energy_uj is readable by root only since Linux 5.10, CVE-2020-8694: run wattpipe as "
    "root, or make the files readable to its user)"
)


class RaplConfig(ComponentConfig):
    root: str = "/sys"
    """The host's /sys: ``/host/sys`` when wattpipe runs in a container with it mounted there."""
    max_power_w: float = Field(default=5000.0, gt=0)
    """A zone's counter going backwards is a wrap only if the energy that implies, over the time since the
    last read, is at most this power on average; otherwise it is a reset."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, PermissionError):
        return _ROOT_ONLY
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc)


class RaplReceiver:
    def __init__(self, config: RaplConfig, ctx: CreateContext) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.clock = ctx.clock
        self.log = ctx.telemetry.log
        self.powercap = os.path.join(config.root, "class", "powercap")
        # What this tick's records fill: nothing when there is no RAPL to read (absent, not empty).
        self.provides: frozenset[str] = _PROVIDES
        self._zones: list[Zone] | None = None
        self._seen: tuple[str, ...] = ()  # the zone directories the zones were found from
        self._gone: list[str] = []  # zones read before, not in the tree now
        self._counters: dict[str, ZoneCounter] = {}
        self._said: set[str] = set()  # problems logged and not yet gone
        self.resets = ctx.telemetry.counter(
            "wattpipe_rapl_counter_resets",
            "RAPL energy counters that went backwards without a plausible wrap (a new counter_epoch).",
            ("path",),
        )

    async def collect(self) -> Sequence[Record]:
        now = self.clock.now()
        problems: dict[str, str] = {}
        if self._zones is None or listing(self.powercap) != self._seen:  # (one listdir a tick: zones come later)
            found = discover(self.powercap)
            self._seen = found.seen
            if found.problem is not None and not self._counters:  # never had RAPL (zones gone later: below)
                problems["discovery"] = found.problem
                self._zones = None
            else:
                self._zones = found.zones
                for z in found.zones:  # a zone back after a gap goes on from its last reading (nothing lost)
                    self._counters.setdefault(z.path, self._new_counter())
                self._gone = sorted(self._counters.keys() - {z.path for z in found.zones} - set(found.dropped))
        if self._gone and self._zones is not None:
            problems[f"gone/{','.join(self._gone)}"] = (
                f"{', '.join(self._gone)} gone from {self.powercap} (a driver unloaded, a package's CPUs offline); "
                f"no energy from {'it' if len(self._gone) == 1 else 'them'} until back, when the counter's growth "
                "meanwhile is counted"
            )
        records: list[Record] = []
        unreadable: dict[str, list[str]] = {}
        for zone in self._zones or ():
            try:
                raw_uj = read_int(os.path.join(zone.directory, "energy_uj"))
            except FileNotFoundError:
                self._zones = None  # the tree changed: read it again next tick
                continue
            except (OSError, ValueError) as exc:
                unreadable.setdefault(_reason(exc), []).append(zone.path)
                continue
            records.append(self._sample(zone, raw_uj, now))
        for reason, paths in unreadable.items():
            problems[f"unreadable/{reason}/{','.join(paths)}"] = (
                f"cannot read energy_uj of {', '.join(paths)} under {self.powercap}: {reason}; no energy from "
                f"{'that zone' if len(paths) == 1 else 'those zones'}"
            )
        self._report(problems)
        self.provides = _PROVIDES if records else frozenset()
        return records

    def _new_counter(self) -> ZoneCounter:
        return ZoneCounter(max_power_w=self.config.max_power_w)

    def _sample(self, zone: Zone, raw_uj: int, now: Timestamp) -> CpuZoneSample:
        counter = self._counters[zone.path]  # every discovered zone has one (collect makes them)
        before_uj = counter.last_raw_uj
        range_uj = zone.max_energy_range_uj
        if range_uj is None and before_uj is not None and raw_uj < before_uj:
            # Unreadable when the tree was read: read again where a wrap needs it (else every wrap is a reset).
            range_uj = max_range(zone.directory)
        elapsed_s = None if counter.last_s is None else now.monotonic_s - counter.last_s
        if elapsed_s is not None and counter.may_have_lapped(elapsed_s, range_uj):
            self.log.log(
                logging.WARNING,
                f"lapped/{zone.path}",
                f"receiver {self.component_id}: {zone.path} read again after {elapsed_s:.0f} s, longer than its counter "
                f"takes to go round its range at the highest power seen ({counter.peak_w:.0f} W): each trip round "
                f"more than one ({(range_uj or 0) / 1e6:.0f} J) is not counted (the reading cannot show it)",
            )
        if counter.update(raw_uj, range_uj, now.monotonic_s) == "reset":
            self.resets.inc(path=zone.path)
            self.log.log(
                logging.WARNING,
                f"reset/{zone.path}",
                f"receiver {self.component_id}: {zone.directory}/energy_uj went back from {before_uj} to {raw_uj} "
                f"without a plausible wrap (range {range_uj} µJ): counter reset, epoch "
                f"{counter.epoch}; that interval's energy is unknown",
            )
        return CpuZoneSample(
            time=now,
            zone=zone.zone,
            path=zone.path,
            socket=zone.socket,
            energy_uj=counter.total_uj,
            counter_epoch=counter.epoch,
        )

    def _report(self, problems: dict[str, str]) -> None:
        """Log each problem once while it lasts (again only if it goes away and comes back)."""
        for key, message in problems.items():
            if key not in self._said:
                self.log.log(logging.WARNING, f"rapl/{key}", f"receiver {self.component_id}: {message}")
        self._said = set(problems)

    def describe(self) -> dict[str, Any]:
        """What ``wattpipe probe rapl`` shows: every zone found, readable or not, its counter and range."""
        found: Discovery = discover(self.powercap)
        zones: list[dict[str, Any]] = []
        for zone in found.zones:
            entry: dict[str, Any] = {
                "path": zone.path,
                "name": zone.name,
                "zone": zone.zone,
                "socket": zone.socket,
                "max_energy_range_uj": zone.max_energy_range_uj,
            }
            try:
                entry["energy_uj"] = read_int(os.path.join(zone.directory, "energy_uj"))
                entry["readable"] = True
            except (OSError, ValueError) as exc:
                entry["readable"] = False
                entry["error"] = _reason(exc)
            zones.append(entry)
        problem = found.problem
        if zones and not any(z["readable"] for z in zones):
            reasons = "; ".join(sorted({z["error"] for z in zones}))
            problem = f"no zone's energy_uj under {self.powercap} can be read ({reasons}): no CPU energy"
        return {
            "powercap": self.powercap,
            "problem": problem,
            "dropped_duplicates": found.dropped,
            "zones": zones,
        }


factory = Factory.of(
    RaplReceiver,
    type="rapl",
    kind="receiver",
    config_model=RaplConfig,
    description="CPU energy from Linux powercap RAPL zones (package, core, uncore, dram, psys), wraps added back.",
    stability="alpha",
    provides=_PROVIDES,
)
