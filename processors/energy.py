"""Processor ``energy``: monotonic energy totals per (process, device), container, pod, MIG instance and device.

Totals are integer millijoules and only grow: across process exit (a process that has left stays
exported with ``state="terminated"`` for ``terminated_retention``, at most ``max_terminated`` of them,
the ones that used the most energy kept), across a receiver outage, and across a restart (the totals and
each series' start time are kept in the state file; see ``service.state``).

A device *answered* in a tick when it has a DevicePower record. The series on a device that did not answer
keep their totals and running state, and their watts are absent (``None``: not known, neither repeated nor
0). A device unanswered for longer than ``device_gone_after`` is gone: its series end, and they and its
device totals stop being exported ``terminated_retention`` later. Its device totals are kept, so a device
that comes back goes on counting from where it was, from the same start (no counter reset).

Container and pod series (with a ``k8s`` processor in the pipeline) live as long as their pod, not as
long as their processes: while none of its processes is on the GPU a series runs on at 0 W; it ends when
the k8s processor's list of the node's pods (``Workload.listed``) lacks it, never while nobody can say
which pods exist. A pod first seen by name (no UID yet) keeps that key and its labels when its UID becomes
known, and a container first seen by name likewise when its id does, so the exported series does not fork.

With a ``procfs`` receiver in the pipeline, each process series also carries the process's ``comm``,
``exe``, ``container_id`` and ``pod_uid`` (as extra attributes), and series are keyed by (pid, device,
start time): a pid the kernel reuses for a new process ends the old series and starts a new one. Without
it, series are keyed by (pid, device) alone and a reused pid continues the old series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal

from pydantic import Field

from pipeline.clock import Timestamp
from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.config import Duration
from pipeline.records import Batch, DevicePower, DeviceTotals, HostProcess, Totals, Workload, new_totals
from processors.attribution_math import apportion

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


_UNKNOWN_START = -1  # no procfs source: the process's start time is not known

SeriesKey = tuple[int, str, int]  # pid, device id, process start time (clock ticks since boot)
GroupKey = tuple[str, str, str]  # "container" | "pod", container id | pod UID, device id


@dataclass(slots=True)
class _Series:
    energy_mj: int
    start_wall_s: float
    power_w: float | None = None
    ended_wall_s: float | None = None  # None: running
    attrs: dict[str, str] = field(default_factory=dict)  # comm, exe, container_id, pod_uid when known
    # Made once and reused while unchanged: every series gives a Totals record every tick.
    start: Timestamp | None = None
    extra: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = ((), ())  # (attrs as read, sorted)
    seen: int = -1  # the last tick (the processor's count) that had a share for it


@dataclass
class _Device:
    energy_mj: int = 0
    idle_energy_mj: int = 0
    active_energy_mj: int = 0
    unattributed_energy_mj: int = 0
    start_wall_s: float = 0.0
    last: DevicePower | None = None
    seen_s: float | None = None  # monotonic time it last answered (or this start's first tick); not saved
    gone_wall_s: float | None = None  # when it was found gone (its series ended then); None: not gone


class _Roster:
    """The containers and pods that exist on the node this tick, as the k8s processor listed them. Looked up
    only for series that had no share this tick (few, most ticks): the keys are made at the first lookup."""

    __slots__ = ("_by_name", "_entries", "_keys")

    def __init__(self) -> None:
        self._entries: list[Workload] = []
        self._keys: set[tuple[str, str]] | None = None  # (scope, key) under every identity an entry has
        self._by_name = False  # some entries have names only (the kubelet's allocations)

    def add(self, w: Workload) -> None:
        self._entries.append(w)

    def lists(self, key: GroupKey, series: _Series) -> bool:
        if self._keys is None:
            self._keys = {identity for w in self._entries for identity in _identities(w)}
            self._by_name = any(w.listed == "allocations" for w in self._entries)
        scope, group, _ = key
        if (scope, group) in self._keys:
            return True
        # A series keyed by its cgroup's ids, against a list of names: it is listed if its names are.
        return self._by_name and (scope, _name(scope, series.attrs)) in self._keys


class _Order:
    """A table's keys in sorted order, sorted again only when the set of keys changed (Totals come out in a
    stable order; a node's series rarely change from one tick to the next, so re-sorting every tick was
    wasted: comparing the key sets is a hash lookup per key, sorting tuples is many comparisons)."""

    __slots__ = ("_columns", "_keys", "_order", "_split")

    def __init__(self, split: Callable[[list[Any]], tuple[list[Any], ...]]) -> None:
        self._split = split
        self._keys: set[Any] = set()
        self._order: list[Any] = []
        self._columns: tuple[list[Any], ...] = split([])

    def of(self, table: dict[Any, Any]) -> tuple[list[Any], tuple[list[Any], ...]]:
        """The keys in order, and ``split`` of them (the parts of each key a Totals record takes, made
        with the order: the same text objects tick after tick, which the catalog compares by identity)."""
        if table.keys() != self._keys:
            self._keys = set(table)
            self._order = sorted(self._keys)
            self._columns = self._split(self._order)
        return self._order, self._columns


def _process_columns(order: list[SeriesKey]) -> tuple[list[Any], ...]:
    return [str(pid) for pid, _, _ in order], [device for _, device, _ in order]


def _group_columns(order: list[GroupKey]) -> tuple[list[Any], ...]:
    return [scope for scope, _, _ in order], [key for _, key, _ in order], [device for _, _, device in order]


class EnergyProcessor:
    needs = frozenset({"device_power", "shares"})
    provides = frozenset({"totals", "device_totals"})

    def __init__(self, config: EnergyConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx
        self.series: dict[SeriesKey, _Series] = {}
        self._running: dict[tuple[int, str], SeriesKey] = {}  # (pid, device) → its running series
        self.devices: dict[str, _Device] = {}
        self.instances: dict[tuple[str, int], _Series] = {}  # (device, GPU instance) on MIG GPUs
        self.groups: dict[GroupKey, _Series] = {}  # containers and pods, per device
        # A group first keyed by name, whose UID (container id) became known later: later key → first key,
        # and first key → the later one that took it (one only: a pod recreated under the name is another).
        self.aliases: dict[GroupKey, GroupKey] = {}
        self._claimed: dict[GroupKey, GroupKey] = {}
        self._series_order = _Order(_process_columns)
        self._ticks = 0
        self._group_order = _Order(_group_columns)

    # --- state -------------------------------------------------------------------------------

    def start(self) -> None:
        saved = self.ctx.state.section(self.ctx.state_key)
        if not saved:
            return
        for row in saved.get("processes", []):
            key = (int(row["pid"]), str(row["device_id"]), int(row.get("start_ticks", _UNKNOWN_START)))
            self.series[key] = _Series(
                energy_mj=int(row["energy_mj"]),
                start_wall_s=float(row["start_wall_s"]),
                ended_wall_s=None if row.get("ended_wall_s") is None else float(row["ended_wall_s"]),
                attrs={str(k): str(v) for k, v in dict(row.get("attrs", {})).items()},
            )
            if self.series[key].ended_wall_s is None:
                self._running[key[:2]] = key
        for row in saved.get("groups", []):
            self.groups[(str(row["scope"]), str(row["key"]), str(row["device_id"]))] = _Series(
                energy_mj=int(row["energy_mj"]),
                start_wall_s=float(row["start_wall_s"]),
                ended_wall_s=None if row.get("ended_wall_s") is None else float(row["ended_wall_s"]),
                attrs={str(k): str(v) for k, v in dict(row.get("attrs", {})).items()},
            )
        for row in saved.get("aliases", []):
            later = (str(row["scope"]), str(row["key"]), str(row["device_id"]))
            first = (str(row["scope"]), str(row["first_key"]), str(row["device_id"]))
            if first in self.groups:
                self.aliases[later], self._claimed[first] = first, later
        for row in saved.get("instances", []):
            self.instances[(str(row["device_id"]), int(row["gpu_instance_id"]))] = _Series(
                energy_mj=int(row["energy_mj"]),
                start_wall_s=float(row["start_wall_s"]),
                ended_wall_s=None if row.get("ended_wall_s") is None else float(row["ended_wall_s"]),
                attrs={str(k): str(v) for k, v in dict(row.get("attrs", {})).items()},
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
                    "start_ticks": start_ticks,
                    "energy_mj": s.energy_mj,
                    "start_wall_s": s.start_wall_s,
                    "ended_wall_s": s.ended_wall_s,
                    "attrs": s.attrs,
                }
                for (pid, device_id, start_ticks), s in sorted(self.series.items())
            ],
            "groups": [
                {
                    "scope": scope,
                    "key": key,
                    "device_id": device_id,
                    "energy_mj": s.energy_mj,
                    "start_wall_s": s.start_wall_s,
                    "ended_wall_s": s.ended_wall_s,
                    "attrs": s.attrs,
                }
                for (scope, key, device_id), s in sorted(self.groups.items())
            ],
            "aliases": [
                {"scope": scope, "key": key, "device_id": device_id, "first_key": first[1]}
                for (scope, key, device_id), first in sorted(self.aliases.items())
            ],
            "instances": [
                {
                    "device_id": device_id,
                    "gpu_instance_id": gi,
                    "energy_mj": s.energy_mj,
                    "start_wall_s": s.start_wall_s,
                    "ended_wall_s": s.ended_wall_s,
                    "attrs": s.attrs,
                }
                for (device_id, gi), s in sorted(self.instances.items())
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
        for power in batch.device_power:
            # A series starts where the energy it counts starts: the beginning of its first interval.
            d = self.devices.setdefault(power.device_id, _Device(start_wall_s=power.time.wall_s - power.interval_s))
            d.energy_mj += power.energy_mj
            d.idle_energy_mj += power.idle_energy_mj
            d.active_energy_mj += power.active_energy_mj
            d.last = power
            d.seen_s, d.gone_wall_s = now.monotonic_s, None
        gone = self._gone(now)
        # Devices whose energy was split among their processes: on the others (no answer, or a tick that
        # spans an outage or whose process listing failed) nobody's watts are known, and nobody has exited.
        split = {device_id for device_id, p in powers.items() if p.unattributable is None}
        hosts = {h.pid: h for h in batch.host_processes}
        self._ticks += 1
        tick = self._ticks
        for share in batch.shares:
            if share.pid is None:
                if share.device_id in self.devices:
                    self.devices[share.device_id].unattributed_energy_mj += share.energy_mj
                continue
            host = hosts.get(share.pid)
            running = None if host is not None else self._running.get((share.pid, share.device_id))
            if running is not None:  # the common case without procfs: a process already running, as is
                series = self.series[running]
            else:
                interval_s = powers[share.device_id].interval_s if share.device_id in powers else batch.interval_s
                _, series = self._series_for(share.pid, share.device_id, host, share.time.wall_s, interval_s)
            series.energy_mj += share.energy_mj
            series.power_w = share.power_w
            series.ended_wall_s = None  # back (or still) running
            if share.gpu_instance_id is not None:
                series.attrs["gpu_instance_id"] = str(share.gpu_instance_id)
            series.seen = tick
        self._groups(batch, powers, split, hosts, now.wall_s, gone)
        self._instances(batch, powers, split, gone, now.wall_s)
        self._absent(tick, split, gone, now.wall_s)
        self._prune(now.wall_s)
        return batch.replace(
            totals=batch.totals + self._totals(now) + self._group_totals(now) + self._instance_totals(now),
            device_totals=batch.device_totals + self._device_totals(now),
        )

    def _absent(self, tick: int, split: set[str], gone: set[str], wall_s: float) -> None:
        """The process series that had no share this tick: exited where their device's energy was split, not
        known elsewhere (ended only once the device is gone)."""
        for key, series in self.series.items():
            if series.seen == tick:
                continue
            if key[1] in split:
                series.power_w = 0.0
                if series.ended_wall_s is None:
                    self._end(key, series, wall_s)  # its device was read and it was not on it: it has exited
            else:
                series.power_w = None  # how much it drew is not known
                if series.ended_wall_s is None and key[1] in gone:
                    self._end(key, series, wall_s)

    def _gone(self, now: Timestamp) -> set[str]:
        """The devices unanswered for longer than ``device_gone_after`` (a device restored from the state file
        counts from this start's first tick: its first tick may bring a counter baseline and no power)."""
        gone = set()
        for device_id, d in self.devices.items():
            if d.seen_s is None:
                d.seen_s = now.monotonic_s
            elif now.monotonic_s - d.seen_s > self.config.device_gone_after:
                gone.add(device_id)
                if d.gone_wall_s is None:
                    d.gone_wall_s = now.wall_s
        return gone

    def _instances(
        self, batch: Batch, powers: dict[str, DevicePower], split: set[str], gone: set[str], wall_s: float
    ) -> None:
        for inst in batch.instance_energy:
            ikey = (inst.device_id, inst.gpu_instance_id)
            interval_s = powers[inst.device_id].interval_s if inst.device_id in powers else batch.interval_s
            instance = self.instances.get(ikey)
            if instance is None:
                instance = self.instances[ikey] = _Series(energy_mj=0, start_wall_s=inst.time.wall_s - interval_s)
            instance.energy_mj += inst.energy_mj
            instance.power_w = inst.power_w
            instance.ended_wall_s = None
            if inst.profile is not None:
                instance.attrs["profile"] = inst.profile
        for (device_id, _), instance in self.instances.items():
            if device_id not in split:
                instance.power_w = None
                if instance.ended_wall_s is None and device_id in gone:
                    instance.ended_wall_s = wall_s

    def _instance_totals(self, now: Timestamp) -> tuple[Totals, ...]:
        # Kept while their device is there (a handful per GPU); a repartition's old instances stop growing.
        return tuple(
            self._total(now, "instance", str(gi), device, s) for (device, gi), s in sorted(self.instances.items())
        )

    def _series_for(
        self, pid: int, device_id: str, host: HostProcess | None, wall_s: float, interval_s: float
    ) -> tuple[SeriesKey, _Series]:
        start = host.start_time_ticks if host is not None and host.start_time_ticks is not None else _UNKNOWN_START
        running = self._running.get((pid, device_id))
        if running is not None:
            if start == _UNKNOWN_START or running[2] in (_UNKNOWN_START, start):
                series = self.series[running]
                if running[2] == _UNKNOWN_START and start != _UNKNOWN_START:
                    # Its start time is known now (procfs answered): file the series under it.
                    del self.series[running]
                    running = (pid, device_id, start)
                    self.series[running] = series
                    self._running[(pid, device_id)] = running
                self._describe(series, host)
                return running, series
            # Same pid, another start time: the kernel reused the pid for a new process.
            self._end(running, self.series[running], wall_s)
        key = (pid, device_id, start)
        series = self.series.get(key) or _Series(energy_mj=0, start_wall_s=wall_s - interval_s)
        self.series[key] = series
        self._running[(pid, device_id)] = key
        self._describe(series, host)
        return key, series

    @staticmethod
    def _describe(series: _Series, host: HostProcess | None) -> None:
        if host is None:
            return
        for name in ("comm", "exe", "container_id", "pod_uid"):
            value = getattr(host, name)
            if value is not None:
                series.attrs[name] = value

    def _end(self, key: SeriesKey, series: _Series, wall_s: float) -> None:
        series.ended_wall_s = wall_s
        if self._running.get(key[:2]) == key:
            del self._running[key[:2]]

    def _prune(self, now_wall_s: float) -> None:
        retention_s, most = self.config.terminated_retention, self.config.max_terminated
        _prune(self.series, now_wall_s, retention_s, most)
        _prune(self.instances, now_wall_s, retention_s, most)
        for first in _prune(self.groups, now_wall_s, retention_s, most):
            later = self._claimed.pop(first, None)
            if later is not None:
                del self.aliases[later]
        # A device gone past the retention is no longer exported (_device_totals), but its totals are kept:
        # should it come back, its counters go on instead of starting again from 0.

    def _groups(
        self,
        batch: Batch,
        powers: dict[str, DevicePower],
        split: set[str],
        hosts: dict[int, HostProcess],
        wall_s: float,
        gone: set[str],
    ) -> None:
        """Container and pod totals from the Workload records (pid → container → pod) of this tick. A series
        runs while its pod exists, at 0 W while none of its processes does; it ends when the k8s processor's
        list lacks it (nothing ends when there is no list: unknown is not gone), or when its device is gone."""
        if "workloads" not in batch.present:
            for unknown in self.groups.values():
                unknown.power_w = None  # the k8s processor failed this tick (or there is none, and no groups)
            return
        tick, roster = self._group_tick(batch, hosts)
        this_tick = self._ticks
        for key, (mj, watts, attrs) in tick.items():
            series = self.groups.get(key)
            aliased = False
            if series is None:
                interval_s = powers[key[2]].interval_s if key[2] in powers else batch.interval_s
                series, aliased = self._group_series(key, attrs, wall_s - interval_s)
            series.energy_mj += mj
            series.power_w = (
                watts if series.seen != this_tick else (series.power_w or 0.0) + watts
            )  # two keys, one series
            series.ended_wall_s = None
            series.seen = this_tick
            if not aliased:
                series.attrs.update(attrs)
        for key, series in self.groups.items():
            if series.seen == this_tick:
                continue
            series.power_w = 0.0 if key[2] in split else None  # none of its processes ran; or not known
            if series.ended_wall_s is None and (
                key[2] in gone or (roster is not None and not roster.lists(key, series))
            ):
                series.ended_wall_s = wall_s

    def _group_tick(
        self, batch: Batch, hosts: dict[int, HostProcess]
    ) -> tuple[dict[GroupKey, tuple[int, float, dict[str, str]]], _Roster | None]:
        """This tick's energy, watts and attributes per group, and the k8s processor's list of what exists
        (None: it could not say)."""
        workloads = {w.pid: w for w in batch.workloads if w.pid is not None}
        # Degraded mode (no host pid view): per device or MIG instance, the containers pod-resources says own it.
        owners: dict[tuple[str, str | None], list[Workload]] = {}
        roster: _Roster | None = None
        for w in batch.workloads:
            if w.pid is not None:
                continue
            if w.listed is not None:
                roster = roster or _Roster()
                roster.add(w)
                continue
            extra = dict(w.extra)
            if extra.get("degraded") and "device_id" in extra:
                owners.setdefault((extra["device_id"], extra.get("gpu_instance_id")), []).append(w)
        tick: dict[GroupKey, tuple[int, float, dict[str, str]]] = {}

        def add(w: Workload, device_id: str, mj: int, watts: float, runtime: str | None = None) -> None:
            for key, attrs in _memberships(w, device_id, runtime):
                old_mj, old_w, _ = tick.get(key, (0, 0.0, attrs))
                tick[key] = (old_mj + mj, old_w + watts, attrs)

        pooled: dict[tuple[str, str | None], tuple[int, float]] = {}
        for share in batch.shares:
            if share.pid is None:
                continue
            gi = None if share.gpu_instance_id is None else str(share.gpu_instance_id)
            if (share.device_id, gi) in owners:
                mj, watts = pooled.get((share.device_id, gi), (0, 0.0))
                pooled[(share.device_id, gi)] = (mj + share.energy_mj, watts + share.power_w)
                continue
            member = workloads.get(share.pid)
            if member is not None:
                host = hosts.get(share.pid)
                same_container = host is not None and member.container_id == host.container_id
                runtime = host.container_runtime if host is not None and same_container else None
                add(member, share.device_id, share.energy_mj, share.power_w, runtime)
        for (device_id, gi), (mj, watts) in pooled.items():
            members = owners[(device_id, gi)]
            for w, part in zip(members, apportion(mj, [1.0] * len(members)), strict=True):
                add(w, device_id, part, watts / len(members))
        return tick, roster

    def _group_series(self, key: GroupKey, attrs: dict[str, str], start_wall_s: float) -> tuple[_Series, bool]:
        """The series of a group key that none is filed under, and whether it is another key's (then it keeps
        its own attributes): a new series, or the one the pod (container) began under its name.

        A pod first seen by name (no UID yet: before the API cache synced, or without /proc) and by UID later
        keeps its first key and labels, so that its exported series does not fork; the same for a container
        first seen by name and later by id. Only one UID takes a name's series: a pod recreated under the
        name is another pod."""
        first = self.aliases.get(key)
        if first is None:
            name = _name(key[0], attrs)
            by_name = (key[0], name or "", key[2])
            if name is not None and name != key[1] and by_name in self.groups and by_name not in self._claimed:
                self.aliases[key], self._claimed[by_name] = by_name, key
                first = by_name
        if first is not None:
            return self.groups[first], True
        series = self.groups[key] = _Series(energy_mj=0, start_wall_s=start_wall_s)
        return series, False

    def _group_totals(self, now: Timestamp) -> tuple[Totals, ...]:
        order, (scopes, keys, devices) = self._group_order.of(self.groups)
        return tuple(map(self._total, repeat(now), scopes, keys, devices, map(self.groups.__getitem__, order)))

    def _start(self, now: Timestamp, start_wall_s: float) -> Timestamp:
        # The series began before this process (a restart): place it on this process's monotonic clock.
        return Timestamp(monotonic_s=now.monotonic_s - (now.wall_s - start_wall_s), wall_s=start_wall_s)

    def _totals(self, now: Timestamp) -> tuple[Totals, ...]:
        order, (pids, devices) = self._series_order.of(self.series)
        scope: Iterator[Literal["process"]] = repeat("process")
        return tuple(map(self._total, repeat(now), scope, pids, devices, map(self.series.__getitem__, order)))

    def _total(
        self,
        now: Timestamp,
        scope: Literal["process", "container", "pod", "instance"],
        key: str,
        device_id: str,
        s: _Series,
    ) -> Totals:
        if s.start is None:
            s.start = self._start(now, s.start_wall_s)
        if s.attrs or s.extra[0]:  # (most series have no attributes: nothing to compare)
            items = tuple(s.attrs.items())
            if items != s.extra[0]:
                s.extra = (items, tuple(sorted(items)))
        # Positional (new_totals): one record per series per tick.
        return new_totals(
            now,
            scope,
            key,
            device_id,
            s.energy_mj,
            s.power_w,
            s.extra[1],
            "running" if s.ended_wall_s is None else "terminated",
            s.start,
        )

    def _device_totals(self, now: Timestamp) -> tuple[DeviceTotals, ...]:
        out = []
        for device_id, d in sorted(self.devices.items()):
            if d.gone_wall_s is not None and now.wall_s - d.gone_wall_s > self.config.terminated_retention:
                continue  # gone, past the retention as its series: not exported (kept, should it come back)
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


def _memberships(w: Workload, device_id: str, runtime: str | None = None) -> list[tuple[GroupKey, dict[str, str]]]:
    """The container and pod a process belongs to, as group keys with their descriptive attributes
    (``runtime``: the container runtime /proc showed for the process, when it is in that container)."""
    pod = {k: v for k, v in (("pod_name", w.pod_name), ("pod_namespace", w.pod_namespace)) if v is not None}
    pod.update({k: v for k, v in w.extra if k.startswith(("label_", "annotation_"))})
    out: list[tuple[GroupKey, dict[str, str]]] = []
    container_key = w.container_id or (
        f"{w.pod_namespace}/{w.pod_name}/{w.container_name}"
        if w.pod_name and w.pod_namespace and w.container_name
        else None
    )
    if container_key is not None:
        attrs = {**pod, **({"container_name": w.container_name} if w.container_name else {})}
        attrs.update({k: v for k, v in w.extra if k == "runtime"})
        if runtime:
            attrs["runtime"] = runtime
        if w.pod_uid is not None:
            attrs["pod_uid"] = w.pod_uid
        out.append((("container", container_key, device_id), attrs))
    pod_key = w.pod_uid or (f"{w.pod_namespace}/{w.pod_name}" if w.pod_name and w.pod_namespace else None)
    if pod_key is not None:
        out.append((("pod", pod_key, device_id), pod))
    return out


def _identities(w: Workload) -> list[tuple[str, str]]:
    """Every (scope, key) a roster entry's container and pod may have been filed under: ids and names."""
    out = [("pod", key) for key in (w.pod_uid,) if key]
    out += [("container", key) for key in (w.container_id,) if key]
    if w.pod_name and w.pod_namespace:
        out.append(("pod", f"{w.pod_namespace}/{w.pod_name}"))
        if w.container_name:
            out.append(("container", f"{w.pod_namespace}/{w.pod_name}/{w.container_name}"))
    return out


def _name(scope: str, attrs: dict[str, str]) -> str | None:
    """A group's name key from its attributes (``namespace/pod[/container]``), where they have it."""
    namespace, pod, container = attrs.get("pod_namespace"), attrs.get("pod_name"), attrs.get("container_name")
    if namespace is None or pod is None:
        return None
    if scope == "pod":
        return f"{namespace}/{pod}"
    return None if container is None else f"{namespace}/{pod}/{container}"


def _prune(table: dict[Any, _Series], now_wall_s: float, retention_s: float, max_terminated: int) -> list[Any]:
    """Drop ended series past the retention, and beyond ``max_terminated`` the ones with least energy; returns
    the keys dropped."""
    ended = [(k, s) for k, s in table.items() if s.ended_wall_s is not None]
    expired = [k for k, s in ended if now_wall_s - (s.ended_wall_s or now_wall_s) > retention_s]
    for key in expired:
        del table[key]
    ended = [(k, s) for k, s in ended if k in table]
    if len(ended) > max_terminated:
        # Bounded memory and cardinality: keep the exited ones that used the most energy.
        ended.sort(key=lambda ks: (-ks[1].energy_mj, ks[0]))
        for key, _ in ended[max_terminated:]:
            del table[key]
            expired.append(key)
    return expired


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
