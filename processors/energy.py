"""Processor ``energy``: monotonic energy totals per (process, device), container, pod, MIG instance and device.

Totals are integer millijoules and only grow: across process exit (a process that has left stays
exported with ``state="terminated"`` for ``terminated_retention``, at most ``max_terminated`` of them,
the ones that used the most energy kept), across a receiver outage, and across a restart (the totals and
each series' start time are kept in the state file; see ``service.state``). Retentions are counted from the
end on the monotonic clock (a wall-clock step drops nothing early, keeps nothing longer); across a restart
the time wattpipe was down counts (the state file keeps when each series ended as a wall time: ``saved``).

A device *answered* in a tick when it has a DevicePower record. The series on a device that did not answer
keep their totals and running state, and their watts are absent (``None``: not known, neither repeated nor
0). A device unanswered for longer than ``device_gone_after`` is gone: its series end, and they and its
device totals stop being exported ``terminated_retention`` later (the state file keeps when it was found gone:
a restart does not export it again). Its device totals are kept, so a device that comes back goes on counting
from where it was, from the same start (no counter reset).

Container and pod series (with a ``k8s`` processor in the pipeline): see :mod:`processors._energy_groups`.

With a ``procfs`` receiver in the pipeline, each process series also carries the process's ``comm``,
``exe``, ``container_id`` and ``pod_uid`` (as extra attributes), and series are keyed by (pid, device,
start time): a pid the kernel reuses for a new process ends the old series and starts a new one. Without
it, series are keyed by (pid, device) alone and a reused pid continues the old series.

**Late energy.** A MIG GPU's energy is held until dcgm-exporter's sample covering it arrives, then released
to the processes that were on each instance, also those that have exited since (processors/_mig_window.py):
a share of a pid the driver does not list this tick, with no watts. It is added to the pid's series on that
device, the running one or else the one that ended last, which stays ended (its watts are not revived,
and no series of unknown start is made for it). Ended series on a device that holds energy are kept for
``late_energy_wait`` after they end (when that is longer than ``terminated_retention``), so that their late
energy still finds them; should it come for a series dropped all the same, it counts as the device's
unattributed energy (and is logged): Σ process totals + unattributed still add up to the active energy. A
series late energy reaches is exported with it that tick, and dropped no sooner than the next (``_prune``).
Pid reuse within the wait: on another GPU the late energy stays with the process that ran; on the same GPU a
share naming its process's start time (the idle hold's, with procfs) finds that series, else the pid's latest
(of those kept).
A share of a device that did not answer this tick (no DevicePower: energy a hold released for a GPU down past
attribution's ``idle_wait`` or ``mig_max_wait``) is late too, whatever the listing says, and lowers the device's
held level. The idle hold's counts in the device's energy and active totals then; a MIG hold's (its mode a MIG
one) is in them since it was measured.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from itertools import repeat
from typing import Any, Literal

from pydantic import Field

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.records import DevicePower, DeviceTotals, GpuShare, HostProcess, Totals
from wattpipe.processors._energy_devices import DeviceEnergy, device_totals, dumped, held, placed, restored
from wattpipe.processors._energy_groups import GroupSeries, Late
from wattpipe.processors._energy_series import (
    SERIES_START,
    Order,
    Series,
    end,
    ended_last,
    prune,
    restore,
    saved,
    series_start_value,
    to_totals,
)
from wattpipe.processors._mig_attribution import MIG_MODES

__all__ = ["EnergyConfig", "EnergyProcessor", "factory"]


class EnergyConfig(ComponentConfig):
    terminated_retention: Duration = 60.0
    """How long an ended series (an exited process, a deleted pod, a gone device's) stays exported."""
    max_terminated: int = Field(default=500, ge=0)
    """At most this many ended series are kept per scope (those with the most energy)."""
    device_gone_after: Duration = Field(default=600.0, gt=0)
    """A device unanswered for longer than this is gone: its series end, and they and its device totals stop
    being exported ``terminated_retention`` later. Counted from this start: wattpipe's own downtime is not
    the device's."""
    late_energy_wait: Duration = Field(default=120.0, ge=0)
    """On a device whose energy is held (a MIG GPU waiting for dcgm-exporter's sample: up to attribution's
    ``mig_max_wait``, 90 s by default), an ended series stays at least this long, so that the energy
    released for it after its process exited still finds it. Keep it above ``mig_max_wait`` plus a tick."""


_UNKNOWN_START = -1  # no procfs source: the process's start time is not known

SeriesKey = tuple[int, str, int]  # pid, device id, process start time (clock ticks since boot)


def _process_columns(order: list[SeriesKey]) -> tuple[list[Any], ...]:
    return [str(pid) for pid, _, _ in order], [device for _, device, _ in order]


class _Listing:
    """The (pid, device) pairs the driver listed this tick, made only when a share may be late (few ticks)."""

    __slots__ = ("_batch", "_pairs")

    def __init__(self, batch: Batch) -> None:
        self._batch = batch
        self._pairs: set[tuple[int | None, str]] | None = None

    def lacks(self, share: GpuShare) -> bool:
        if share.start_time_ticks is not None:
            return True  # released for the process of that start (idle hold): maybe not the one listed now
        if "gpu_processes" not in self._batch.present:
            return False  # no listing to go by (no such receiver, or it failed): every share is a process's
        if self._pairs is None:
            self._pairs = {(p.pid, p.device_id) for p in self._batch.gpu_processes}
        return (share.pid, share.device_id) not in self._pairs


class EnergyProcessor:
    needs = frozenset({"device_power", "shares"})
    provides = frozenset({"totals", "device_totals"})

    def __init__(self, config: EnergyConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx
        self.series: dict[SeriesKey, Series] = {}
        self._running: dict[tuple[int, str], SeriesKey] = {}  # (pid, device) → its running series
        self._ended: dict[tuple[int, str], SeriesKey] = {}  # (pid, device) → its series that ended last
        self.devices: dict[str, DeviceEnergy] = {}
        self.instances: dict[tuple[str, int], Series] = {}  # (device, GPU instance) on MIG GPUs
        self.containers_and_pods = GroupSeries()
        self._series_order = Order(_process_columns)
        self._ticks = 0
        self.late_unattributed_mj = 0  # late energy whose series was dropped before it came
        self._late_keys: set[SeriesKey] = set()  # the series late energy reached this tick (kept until exported)
        self._wall_offset_s: float | None = None  # the last tick's wall less monotonic time (saved ends, ``saved``)

    # --- state -------------------------------------------------------------------------------

    def start(self) -> None:
        """Totals and series from the state file: every row read first, kept only if all of them could be (a
        section that raises leaves nothing half restored for the runtime's start without it)."""
        saved_state = self.ctx.state.section(self.ctx.state_key)
        if not saved_state:
            return
        series: dict[SeriesKey, Series] = {}
        for row in saved_state.get("processes", []):
            series[(int(row["pid"]), str(row["device_id"]), int(row.get("start_ticks", _UNKNOWN_START)))] = restore(row)
        groups = GroupSeries()
        groups.restore(saved_state)
        instances = {
            (str(row["device_id"]), int(row["gpu_instance_id"])): restore(row)
            for row in saved_state.get("instances", [])
        }
        devices = restored(saved_state.get("devices", {}))
        self.series, self.containers_and_pods, self.instances, self.devices = series, groups, instances, devices
        self._running = {key[:2]: key for key, s in series.items() if s.ended_wall_s is None}
        ended = sorted((s.ended_wall_s, key) for key, s in series.items() if s.ended_wall_s is not None)
        self._ended = {key[:2]: key for _, key in ended}  # of a pid's series on a device, the one that ended last
        self.ctx.logger.info(
            "energy totals restored: %d process series, %d devices", len(self.series), len(self.devices)
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "processes": [
                {"pid": pid, "device_id": device_id, "start_ticks": start_ticks, **saved(s, self._wall_offset_s)}
                for (pid, device_id, start_ticks), s in sorted(self.series.items())
            ],
            **self.containers_and_pods.snapshot(self._wall_offset_s),
            "instances": [
                {"device_id": device_id, "gpu_instance_id": gi, **saved(s, self._wall_offset_s)}
                for (device_id, gi), s in sorted(self.instances.items())
            ],
            "devices": dumped(self.devices, self._wall_offset_s),
        }

    # --- the tick ----------------------------------------------------------------------------

    def process(self, batch: Batch) -> Batch:
        now = batch.time
        self._wall_offset_s = now.wall_offset_s
        held_before = {device_id for device_id, d in self.devices.items() if held(d)}  # (see _prune)
        powers = self._add_powers(batch)
        gone = self._gone(now)
        # Devices whose energy was split among their processes: on the others (no answer, or a tick that
        # spans an outage or whose process listing failed) nobody's watts are known, and nobody has exited.
        split = {device_id for device_id, p in powers.items() if p.unattributable is None}
        hosts = {h.pid: h for h in batch.host_processes}
        self._ticks += 1
        tick = self._ticks
        listing = _Listing(batch)
        late: Late = {}
        if len(powers) < len(self.devices):  # a device did not answer: attribution may release its held energy
            self._released_unanswered(batch.shares, powers)
        for share in batch.shares:
            if share.pid is None:
                if share.device_id in self.devices:
                    self.devices[share.device_id].unattributed_energy_mj += share.energy_mj
                continue
            # Only a share with no watts can be late (released for a process that has exited, or for a device
            # that did not answer): the listing is looked at for those alone.
            if share.power_w == 0.0 and share.share == 0.0 and (share.device_id not in powers or listing.lacks(share)):
                late[(share.pid, share.device_id, share.start_time_ticks)] = self._late(share.pid, share)
                continue
            host = hosts.get(share.pid)
            running = None if host is not None else self._running.get((share.pid, share.device_id))
            if running is not None:  # the common case without procfs: a process already running, as is
                series = self.series[running]
            else:
                interval_s = powers[share.device_id].interval_s if share.device_id in powers else batch.interval_s
                _, series = self._series_for(share.pid, share.device_id, host, share.time, interval_s)
            series.energy_mj += share.energy_mj
            series.power_w = share.power_w
            series.ended_wall_s = None  # back (or still) running
            if share.gpu_instance_id is not None:
                series.attrs["gpu_instance_id"] = str(share.gpu_instance_id)
            series.seen = tick
        self.containers_and_pods.update(batch, tick, powers, split, gone, hosts, late)
        self._instances(batch, powers, split, gone, now)
        self._absent(tick, split, gone, now)
        self._prune(now, held_before)
        return batch.replace(
            totals=batch.totals + self._totals(now) + self.containers_and_pods.totals(now) + self._instance_totals(now),
            device_totals=batch.device_totals + self._device_totals(now),
        )

    def _add_powers(self, batch: Batch) -> dict[str, DevicePower]:
        """The tick's GPU DevicePowers, by device, added to their devices' totals. (A CPU zone's DevicePower,
        cpu_attribution earlier in the pipeline, is that processor's to total.)"""
        now = batch.time
        powers = {p.device_id: p for p in batch.device_power if p.device_type == "gpu"}
        for power in powers.values():
            # A series starts where the energy it counts starts: the beginning of its first interval.
            d = self.devices.setdefault(
                power.device_id, DeviceEnergy(start_wall_s=power.time.wall_s - power.interval_s)
            )
            # Energy held while the device's idle is learned is neither idle nor active yet: it joins the totals
            # when released (attribution, processors/_idle_hold.py), so energy == idle + active always.
            d.energy_mj += power.idle_energy_mj + power.active_energy_mj
            d.idle_energy_mj += power.idle_energy_mj
            d.active_energy_mj += power.active_energy_mj
            d.last = power
            d.seen_s, d.gone_s, d.gone_wall_s = now.monotonic_s, None, None
        return powers

    def _released_unanswered(self, shares: tuple[GpuShare, ...], powers: dict[str, DevicePower]) -> None:
        """Energy attribution's holds released for devices that did not answer this tick (down, or lost for good):
        the idle hold's (processors/_idle_hold.py: past ``idle_wait``) is in no total yet, all active, and joins
        them now; a MIG hold's (processors/_mig_window.py: past ``mig_max_wait``, a share in a MIG mode) is in the
        active energy since it was measured, and only its split waited. Either way the held level falls by it
        (no energy and no idle this tick: held now == held before − Σ shares)."""
        released: dict[str, list[int]] = {}  # device → [mJ new to its active energy, mJ off its held level]
        for share in shares:
            if share.device_id not in powers:
                mj = released.setdefault(share.device_id, [0, 0])
                mj[0] += 0 if share.mode in MIG_MODES else share.energy_mj
                mj[1] += share.energy_mj
        for device_id, (active_mj, held_mj) in released.items():
            d = self.devices.get(device_id)
            if d is None:
                continue  # never answered here (its DevicePower filtered out upstream): no totals to add to
            d.energy_mj += active_mj
            d.active_energy_mj += active_mj
            if d.last is not None and d.last.held_energy_mj:
                d.last = dataclasses.replace(d.last, held_energy_mj=max(0, d.last.held_energy_mj - held_mj))
            d.held_mj = max(0, d.held_mj - held_mj)

    def _late(self, pid: int, share: GpuShare) -> bool:
        """Add a late share's energy to its process's series on its device as it is (it says nothing of whether
        the process runs); returns whether there was one. When the series was dropped already, the energy is the
        device's unattributed: never lost, never revived."""
        key = self._late_series(pid, share.device_id, share.start_time_ticks)
        if key is not None:
            self.series[key].energy_mj += share.energy_mj
            self._late_keys.add(key)  # (exported with it this tick: not dropped before the next, see _prune)
            return True
        device = self.devices.get(share.device_id)
        if device is not None:
            device.unattributed_energy_mj += share.energy_mj
        if share.energy_mj:
            self.late_unattributed_mj += share.energy_mj
            self.ctx.telemetry.log.log(
                logging.WARNING,
                "late",
                f"processor {self.ctx.component_id}: energy released for pid {pid} on {share.device_id} "
                f"after its series was dropped counted as unattributed ({self.late_unattributed_mj / 1000:g} J so "
                "far): raise late_energy_wait above attribution's mig_max_wait (or max_terminated)",
            )
        return False

    def _late_series(self, pid: int, device_id: str, start: int | None) -> SeriesKey | None:
        """The series of a late share (its key): its process's (pid and ``start``: its start time, where attribution
        knew it), else the pid's running one or the one that ended last, unless its start time is known and another."""
        if start is not None and (pid, device_id, start) in self.series:
            return (pid, device_id, start)
        pair = (pid, device_id)
        for key in filter(None, (self._running.get(pair), self._ended.get(pair))):
            series = self.series.get(key)
            known = None if series is None else series.start_ticks if key[2] == _UNKNOWN_START else key[2]
            if series is not None and (start is None or known in (None, start)):
                return key
        return None

    def _absent(self, tick: int, split: set[str], gone: set[str], now: Timestamp) -> None:
        """The process series that had no share of a running process this tick: exited where their device's
        energy was split, not known elsewhere (ended only once the device is gone)."""
        for key, series in self.series.items():
            if series.seen == tick:
                continue
            if key[1] in split:
                series.power_w = 0.0
                if series.ended_wall_s is None:
                    self._end(key, series, now)  # its device was read and it was not on it: it has exited
            else:
                series.power_w = None  # how much it drew is not known
                if series.ended_wall_s is None and key[1] in gone:
                    self._end(key, series, now)

    def _gone(self, now: Timestamp) -> set[str]:
        """The devices unanswered for longer than ``device_gone_after`` (a device restored from the state file
        counts from this start's first tick: its first tick may bring a counter baseline and no power; one that
        was gone stays gone, its retention counted from when it was found gone)."""
        gone = set()
        for device_id, d in self.devices.items():
            if d.seen_s is None:
                d.seen_s = now.monotonic_s
                placed(d, now)
            elif now.monotonic_s - d.seen_s > self.config.device_gone_after:
                gone.add(device_id)
                if d.gone_s is None:
                    d.gone_s = now.monotonic_s
        return gone

    def _instances(
        self, batch: Batch, powers: dict[str, DevicePower], split: set[str], gone: set[str], now: Timestamp
    ) -> None:
        named: set[tuple[str, int]] = set()
        for inst in batch.instance_energy:
            ikey = (inst.device_id, inst.gpu_instance_id)
            named.add(ikey)
            interval_s = powers[inst.device_id].interval_s if inst.device_id in powers else batch.interval_s
            instance = self.instances.get(ikey)
            if instance is None:
                instance = self.instances[ikey] = Series(energy_mj=0, start_wall_s=inst.time.wall_s - interval_s)
            instance.energy_mj += inst.energy_mj
            instance.power_w = inst.power_w
            instance.ended_wall_s = None
            if inst.profile is not None:
                instance.attrs["profile"] = inst.profile
        for ikey, instance in self.instances.items():
            device_id = ikey[0]
            if device_id in split:
                if ikey not in named:  # none of the split energy was its (a repartition removed it): not its last
                    instance.power_w = 0.0
            else:
                instance.power_w = None
                if instance.ended_wall_s is None and device_id in gone:
                    end(instance, now)

    def _instance_totals(self, now: Timestamp) -> tuple[Totals, ...]:
        # Kept while their device is there (a handful per GPU); a repartition's old instances stop growing.
        return tuple(
            to_totals(now, "instance", str(gi), device, s) for (device, gi), s in sorted(self.instances.items())
        )

    def _series_for(
        self, pid: int, device_id: str, host: HostProcess | None, at: Timestamp, interval_s: float
    ) -> tuple[SeriesKey, Series]:
        start = host.start_time_ticks if host is not None and host.start_time_ticks is not None else _UNKNOWN_START
        running = self._running.get((pid, device_id))
        if running is not None:
            series = self.series[running]
            known = series.start_ticks if running[2] == _UNKNOWN_START else running[2]
            if start == _UNKNOWN_START or known in (None, start):
                # Its start time is known now (procfs answered): file the series under it. Unless that process
                # has a series there already (ended while it was off the GPU): replacing it lost its energy, and
                # adding this one's to it would send this one's energy twice to a backend summing OTLP deltas
                # (it was exported as a series of its own). It goes on as it is, under an unknown start.
                if running[2] == _UNKNOWN_START and start != _UNKNOWN_START:
                    if (pid, device_id, start) in self.series:
                        series.start_ticks = start  # (kept under an unknown start: tells a reused pid apart still)
                    else:
                        del self.series[running]
                        running = (pid, device_id, start)
                        self.series[running] = series
                        self._running[(pid, device_id)] = running
                self._describe(series, host)
                return running, series
            # Same pid, another start time: the kernel reused the pid for a new process.
            self._end(running, series, at)
        key = (pid, device_id, start)
        found = self.series.get(key)
        if found is None:
            found = self.series[key] = Series(energy_mj=0, start_wall_s=at.wall_s - interval_s)
            if (pid, device_id) in self._ended:  # the pid's last process here is kept still: a reused pid
                found.attrs[SERIES_START] = series_start_value(found.start_wall_s)
        self._running[(pid, device_id)] = key
        self._describe(found, host)
        return key, found

    @staticmethod
    def _describe(series: Series, host: HostProcess | None) -> None:
        if host is None:
            return
        for name in ("comm", "exe", "container_id", "pod_uid"):
            value = getattr(host, name)
            if value is not None:
                series.attrs[name] = value

    def _end(self, key: SeriesKey, series: Series, now: Timestamp) -> None:
        end(series, now)
        if self._running.get(key[:2]) == key:
            del self._running[key[:2]]
        self._ended[key[:2]] = key  # where energy released for it later goes

    def _prune(self, now: Timestamp, held_before: set[str]) -> None:
        retention_s, most = self.config.terminated_retention, self.config.max_terminated
        # On a device that holds energy, more may come for a process that has ended: its series (and its
        # container's and pod's) wait for it. A device holding nothing has released all it will for them, and
        # they go after the tick that released the last of it (``held_before``: it held before this tick) has
        # exported them.
        late_s = max(retention_s, self.config.late_energy_wait)
        holding = held_before | {device_id for device_id, d in self.devices.items() if held(d)}

        def keep_s(device_id: str) -> float:
            return late_s if device_id in holding else retention_s

        # A series late energy reached this tick is exported with it before it goes (else that energy was in no
        # total: the series dropped before the tick's Totals, the device's unattributed not given it).
        fresh = {key: self.series.pop(key) for key in self._late_keys if key in self.series}
        self._late_keys = set()
        dropped = prune(self.series, now, lambda k: keep_s(k[1]), most)
        self.series.update(fresh)
        lost = set()  # (pid, device) whose series that ended last was dropped
        for key in dropped:
            if self._ended.get(key[:2]) == key:
                del self._ended[key[:2]]
                lost.add(key[:2])
        if lost:  # max_terminated drops by energy, not age: an earlier series of the pid there may be kept still
            self._ended.update(ended_last(self.series, lost, now))
        prune(self.instances, now, lambda _: retention_s, most)
        self.containers_and_pods.prune(now, keep_s, most)
        # A device gone past the retention is no longer exported (_device_totals), but its totals are kept:
        # should it come back, its counters go on instead of starting again from 0.

    def _totals(self, now: Timestamp) -> tuple[Totals, ...]:
        order, (pids, devices) = self._series_order.of(self.series)
        scope: Iterator[Literal["process"]] = repeat("process")
        return tuple(map(to_totals, repeat(now), scope, pids, devices, map(self.series.__getitem__, order)))

    def _device_totals(self, now: Timestamp) -> tuple[DeviceTotals, ...]:
        return device_totals(self.devices, now, self.config.terminated_retention)


factory = Factory.of(
    EnergyProcessor,
    type="energy",
    kind="processor",
    config_model=EnergyConfig,
    description="Monotonic energy totals per process and device; exited processes kept for a retention period.",
    stability="alpha",
    provides=frozenset({"totals", "device_totals"}),
)
