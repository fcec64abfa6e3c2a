"""Processor ``energy``: monotonic energy totals per (process, device) and per device.

Totals are integer millijoules and only grow: across process exit (a process that has left stays
exported with ``state="terminated"`` for ``terminated_retention``, at most ``max_terminated`` of them,
the ones that used the most energy kept), across a receiver outage (a device that was not observed in a
tick ends nobody's series), and across a restart (the totals and each series' start time are kept in
the state file; see ``service.state``).

Known limit: series are keyed by (pid, device). A pid the kernel reuses for a new process on the same
GPU continues the old series; the procfs receiver's start times will tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from pipeline.clock import Timestamp
from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.config import Duration
from pipeline.records import Batch, DevicePower, DeviceTotals, Totals

__all__ = ["EnergyConfig", "EnergyProcessor", "factory"]


class EnergyConfig(ComponentConfig):
    terminated_retention: Duration = 60.0
    """How long an exited process's totals stay exported."""
    max_terminated: int = Field(default=500, ge=0)
    """At most this many exited processes are kept (those with the most energy)."""


@dataclass
class _Series:
    energy_mj: int
    start_wall_s: float
    power_w: float | None = None
    ended_wall_s: float | None = None  # None: running


@dataclass
class _Device:
    energy_mj: int = 0
    idle_energy_mj: int = 0
    active_energy_mj: int = 0
    unattributed_energy_mj: int = 0
    start_wall_s: float = 0.0
    last: DevicePower | None = None


class EnergyProcessor:
    needs = frozenset({"device_power", "shares"})
    provides = frozenset({"totals", "device_totals"})

    def __init__(self, config: EnergyConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx
        self.series: dict[tuple[int, str], _Series] = {}
        self.devices: dict[str, _Device] = {}

    # --- state -------------------------------------------------------------------------------

    def start(self) -> None:
        saved = self.ctx.state.section(self.ctx.state_key)
        if not saved:
            return
        for row in saved.get("processes", []):
            self.series[(int(row["pid"]), str(row["device_id"]))] = _Series(
                energy_mj=int(row["energy_mj"]),
                start_wall_s=float(row["start_wall_s"]),
                ended_wall_s=None if row.get("ended_wall_s") is None else float(row["ended_wall_s"]),
            )
        for device_id, row in dict(saved.get("devices", {})).items():
            self.devices[str(device_id)] = _Device(
                energy_mj=int(row["energy_mj"]),
                idle_energy_mj=int(row["idle_energy_mj"]),
                active_energy_mj=int(row["active_energy_mj"]),
                unattributed_energy_mj=int(row["unattributed_energy_mj"]),
                start_wall_s=float(row["start_wall_s"]),
            )
        self.ctx.logger.info(
            "energy totals restored: %d process series, %d devices", len(self.series), len(self.devices)
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "processes": [
                {
                    "pid": pid,
                    "device_id": device_id,
                    "energy_mj": s.energy_mj,
                    "start_wall_s": s.start_wall_s,
                    "ended_wall_s": s.ended_wall_s,
                }
                for (pid, device_id), s in sorted(self.series.items())
            ],
            "devices": {
                device_id: {
                    "energy_mj": d.energy_mj,
                    "idle_energy_mj": d.idle_energy_mj,
                    "active_energy_mj": d.active_energy_mj,
                    "unattributed_energy_mj": d.unattributed_energy_mj,
                    "start_wall_s": d.start_wall_s,
                }
                for device_id, d in sorted(self.devices.items())
            },
        }

    # --- the tick ----------------------------------------------------------------------------

    def process(self, batch: Batch) -> Batch:
        now = batch.time
        powers = {p.device_id: p for p in batch.device_power}
        observed = set(powers)
        for power in batch.device_power:
            # A series starts where the energy it counts starts: the beginning of its first interval.
            d = self.devices.setdefault(power.device_id, _Device(start_wall_s=power.time.wall_s - power.interval_s))
            d.energy_mj += power.energy_mj
            d.idle_energy_mj += power.idle_energy_mj
            d.active_energy_mj += power.active_energy_mj
            d.last = power
        seen: set[tuple[int, str]] = set()
        for share in batch.shares:
            if share.pid is None:
                if share.device_id in self.devices:
                    self.devices[share.device_id].unattributed_energy_mj += share.energy_mj
                continue
            key = (share.pid, share.device_id)
            series = self.series.get(key)
            if series is None:
                interval_s = powers[share.device_id].interval_s if share.device_id in powers else batch.interval_s
                series = self.series[key] = _Series(energy_mj=0, start_wall_s=share.time.wall_s - interval_s)
            series.energy_mj += share.energy_mj
            series.power_w = share.power_w
            series.ended_wall_s = None  # back (or still) running
            seen.add(key)
        for key, series in self.series.items():
            if key not in seen and series.ended_wall_s is None and key[1] in observed:
                # Its device was read this tick and it was not on it: it has exited.
                series.ended_wall_s = now.wall_s
                series.power_w = 0.0
        self._prune(now.wall_s)
        return batch.replace(
            totals=batch.totals + self._totals(now), device_totals=batch.device_totals + self._device_totals(now)
        )

    def _prune(self, now_wall_s: float) -> None:
        ended = [(k, s) for k, s in self.series.items() if s.ended_wall_s is not None]
        expired = [
            k for k, s in ended if now_wall_s - (s.ended_wall_s or now_wall_s) > self.config.terminated_retention
        ]
        for key in expired:
            del self.series[key]
        ended = [(k, s) for k, s in ended if k not in set(expired)]
        if len(ended) > self.config.max_terminated:
            # Bounded memory and cardinality: keep the exited processes that used the most energy.
            ended.sort(key=lambda ks: (-ks[1].energy_mj, ks[0]))
            for key, _ in ended[self.config.max_terminated :]:
                del self.series[key]

    def _start(self, now: Timestamp, start_wall_s: float) -> Timestamp:
        # The series began before this process (a restart): place it on this process's monotonic clock.
        return Timestamp(monotonic_s=now.monotonic_s - (now.wall_s - start_wall_s), wall_s=start_wall_s)

    def _totals(self, now: Timestamp) -> tuple[Totals, ...]:
        return tuple(
            Totals(
                time=now,
                scope="process",
                key=str(pid),
                device_id=device_id,
                energy_mj=s.energy_mj,
                power_w=s.power_w,
                state="running" if s.ended_wall_s is None else "terminated",
                start=self._start(now, s.start_wall_s),
            )
            for (pid, device_id), s in sorted(self.series.items())
        )

    def _device_totals(self, now: Timestamp) -> tuple[DeviceTotals, ...]:
        out = []
        for device_id, d in sorted(self.devices.items()):
            last = d.last
            out.append(
                DeviceTotals(
                    time=now,
                    device_id=device_id,
                    device_type=last.device_type if last else "gpu",
                    device_index=last.device_index if last else None,
                    device_name=last.device_name if last else None,
                    vendor=last.vendor if last else None,
                    energy_mj=d.energy_mj,
                    idle_energy_mj=d.idle_energy_mj,
                    active_energy_mj=d.active_energy_mj,
                    attributed_energy_mj=d.active_energy_mj - d.unattributed_energy_mj,
                    unattributed_energy_mj=d.unattributed_energy_mj,
                    start=self._start(now, d.start_wall_s),
                )
            )
        return tuple(out)


def _create(ctx: CreateContext, config: ComponentConfig) -> EnergyProcessor:
    assert isinstance(config, EnergyConfig)
    return EnergyProcessor(config, ctx)


factory = Factory(
    type="energy",
    kind="processor",
    config_model=EnergyConfig,
    create=_create,
    description="Monotonic energy totals per process and device; exited processes kept for a retention period.",
    stability="alpha",
    provides=frozenset({"totals", "device_totals"}),
)
