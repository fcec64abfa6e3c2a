"""The CPU attribution processor's monotonic totals per process, container, pod and VM, per RAPL zone type.

The same series as the GPU side's energy processor (``processors/_energy_series.py``: integer mJ that only
grow, ``state="terminated"`` once the process has left, kept for a retention, at most ``max_terminated`` per
table, the ones with the most energy kept). A process series starts at its first tick with CPU energy and
ends when /proc no longer lists its (pid, start time); a container, pod or VM series is the sum of its
processes' shares and ends when none of its processes is listed. With ``cpu_attribution``'s ``unseen: containers``
a container's series (and its pod's) also takes its unseen CPU time's share (``_cpu_unseen.py``), and runs on
while its cgroup is read (``alive``), listed processes or not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, cast

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.constructors import new_totals
from wattpipe.pipeline.records import HostProcess, Totals
from wattpipe.pipeline.records_cpu import ContainerCpuTime
from wattpipe.processors._cpu_identity import GroupScope, Identity, Names, group_memberships, process_attrs
from wattpipe.processors._cpu_labels import PROCESS_PLACE, label, names_kept, tell_reused_apart
from wattpipe.processors._energy_series import Scope, Series, end, ended_age_s, prune, restore, saved, start_at

__all__ = [
    "CPU_DEVICE_PREFIX",
    "CpuSeries",
    "GroupScope",
    "LateShare",
    "Names",
    "ProcessKey",
    "TickShares",
    "device_id_of",
    "process_key",
    "started_since",
]

CPU_DEVICE_PREFIX = "cpu:"
"""A CPU zone type's ``device_id`` on Totals (``cpu:package``): the catalog tells CPU totals from GPU ones by it."""

ProcessKey = tuple[int, int, str]  # pid, start time (clock ticks since boot; -1 unknown), zone type
GroupKey = tuple[GroupScope, str, str]  # scope, container id | pod UID | VM id, zone type
# A share for a process no longer listed (it used CPU time during a zone's gap, and exited before the zone came
# back): its (pid, start time), its last listing, the zone type, the mJ (processors/_cpu_gap.py).
LateShare = tuple[tuple[int, int], HostProcess, str, int]


def device_id_of(zone: str) -> str:
    return CPU_DEVICE_PREFIX + zone


def process_key(host: HostProcess) -> tuple[int, int]:
    """What names a process across listings: its pid and start time (-1 when not known)."""
    return host.pid, -1 if host.start_time_ticks is None else host.start_time_ticks


# A start time read from /proc is whole clock ticks (10 ms) from a boot time off /proc/uptime (10 ms too): it can
# read up to about 20 ms before the process truly started. One not in the last listing that reads as started this
# close before it started after it (had it run then, the listing would have had it).
_START_SLACK_S = 0.02


def started_since(host: HostProcess, since_s: float) -> bool:
    """Whether a process started since ``since_s`` (the last listing's monotonic time, less ``_START_SLACK_S``).
    Its start on the monotonic clock is its age (its record's wall time − its start, one clock's two readings:
    procfs reads the start as now − /proc/uptime + its start ticks) before its record's monotonic time: its wall
    start against another tick's wall time would move by any step of the wall clock between. No start: False."""
    if host.start_wall_s is None:
        return False
    return host.time.monotonic_s - (host.time.wall_s - host.start_wall_s) >= since_s - _START_SLACK_S


@dataclass(frozen=True, slots=True)
class TickShares:
    """One tick's split, summed per zone type: each process's mJ, and which zone types were split."""

    interval_s: float
    keys: Sequence[tuple[int, int]]  # the processes that used CPU time this tick: (pid, start time)
    hosts: Sequence[HostProcess]  # their listings, in the same order
    by_zone: Mapping[str, Sequence[int]]  # zone type → each process's mJ, in the keys' order
    exited: AbstractSet[tuple[int, int]]  # the processes in the last listing and not in this one
    split_zones: frozenset[str]  # zone types whose active energy went to processes this tick (or could have)
    read_zones: frozenset[str]  # zone types that answered this tick (split or not)
    # Per zone type, the interval its split energy spans where it is not interval_s (a zone read again after a
    # tick that the listing missed too: its energy and the deltas span both): its watts are over it.
    zone_intervals: Mapping[str, float] = field(default_factory=dict)
    # Zone types with a zone back from a gap: each process's watts, in the keys' order (its shares over the
    # intervals they span, summed: a gap's energy is over the gap), in place of its mJ over zone_intervals'.
    zone_watts: Mapping[str, Sequence[float]] = field(default_factory=dict)
    late: Sequence[LateShare] = ()  # the shares of a gap for processes no longer listed
    # unseen: containers: the containers with CPU time no listed process carried, and per zone type their mJ
    unseen: Sequence[ContainerCpuTime] = ()
    unseen_by_zone: Mapping[str, Sequence[int]] = field(default_factory=dict)

    def with_unseen(self, unseen: Sequence[ContainerCpuTime], by_zone: Mapping[str, Sequence[int]]) -> TickShares:
        return replace(self, unseen=unseen, unseen_by_zone=by_zone) if by_zone else self


class CpuSeries:
    """Every CPU series of one pipeline, and the Totals records they give each tick."""

    def __init__(self, retention_s: float, max_terminated: int) -> None:
        self.retention_s = retention_s
        self.max_terminated = max_terminated
        self.processes: dict[ProcessKey, Series] = {}
        self.groups: dict[GroupKey, Series] = {}
        # A process's identity does not change while its (pid, start time) stays: its attributes and groups
        # are worked out once (again when the k8s processor names its pod later), not every tick.
        self._known: dict[tuple[int, int], Identity] = {}
        self._members: dict[tuple[GroupScope, str], set[tuple[int, int]]] = {}
        self._tick = 0  # ticks so far: a series whose ``seen`` is the tick's had a share in it
        self._rows: list[tuple[Series, Scope, str, str]] | None = None  # the Totals' order; None: tables changed
        self._groups_version = 0  # moves whenever a group series is added, dropped or relabelled
        self._restored = False  # groups restored whose members the next listing tells
        self._wall_offset_s: float | None = None  # the last tick's wall less monotonic time (saved ends, ``saved``)
        # Processes (pid, start time) and groups (scope, id) an open zone gap may yet bill (processors/_cpu_gap.py):
        # their ended series are not dropped until it closes (its late shares find them).
        self.pending: tuple[AbstractSet[tuple[int, int]], AbstractSet[tuple[str, str]]] = (frozenset(), frozenset())
        # unseen: containers: the containers (scope, id) whose cgroup was read this tick, and their pods: running
        self.alive: AbstractSet[tuple[str, str]] = frozenset()

    def _identity(self, pk: tuple[int, int], host: HostProcess, names: Names) -> Identity:
        known = self._known.get(pk)
        if known is not None and (known.named or (host.container_id is None and host.pod_uid is None)):
            return known
        workload = names.find(host)
        named = workload is not None and workload.pod_name is not None
        if known is None or named:
            known = self._known[pk] = Identity(
                attrs=process_attrs(host, workload),
                groups=group_memberships(host, workload),
                named=named,
                comm=host.comm,
                container_id=host.container_id,
            )
            for scope, group, _ in known.groups:
                self._members.setdefault((scope, group), set()).add(pk)
        return known

    def update(
        self,
        now: Timestamp,
        tick: TickShares,
        hosts: Mapping[int, HostProcess],
        names: Names,
        listed: bool,
    ) -> None:
        """Add a tick's shares; end the series whose processes /proc no longer lists (``listed``: it answered)."""
        self._tick += 1
        tick_no = self._tick
        self._wall_offset_s = now.wall_offset_s
        tick_start_s = now.wall_s - tick.interval_s
        # the group series with a share this tick, their energy before, and their zone type's mJ → W factor
        grouped: list[tuple[Series, int, float | None]] = []
        processes, known_by_pk = self.processes, self._known
        nameable = bool(names.by_pid or names.by_container or names.by_pod)  # else no pod gets named this tick
        self._forget_changed(tick, names)
        for zone, shares in tick.by_zone.items():
            zone_s = tick.zone_intervals.get(zone, tick.interval_s)
            per_mj = 1 / 1000.0 / zone_s if zone_s > 0 else None
            for pk, host, mj in zip(tick.keys, tick.hosts, shares, strict=True):
                known = known_by_pk.get(pk)
                series = known.series.get(zone) if known is not None else None
                if known is None or series is None:  # its first share in this zone type, or a new identity
                    series = processes.get((pk[0], pk[1], zone))
                    if series is None:
                        if mj == 0:
                            continue  # a series begins with the process's first CPU energy
                        begun = host.start_wall_s if host.start_wall_s is not None else tick_start_s
                        series = processes[(pk[0], pk[1], zone)] = Series(0, max(tick_start_s, begun))
                        self._rows = None
                    known = self._identity(pk, host, names)
                    attrs = known.zone_attrs(zone)
                    if series.attrs is not attrs:  # a new identity (the pod named since): its series' labels follow
                        label(series, names_kept(series.attrs, attrs, PROCESS_PLACE))
                    known.series[zone] = series
                elif nameable and not known.named and (host.container_id is not None or host.pod_uid is not None):
                    known = self._identity(pk, host, names)  # its pod may have been named since
                    if known.series.get(zone) is not series:  # it was: labelled as the new identity says
                        label(series, known.zone_attrs(zone))
                        known.series[zone] = series
                series.energy_mj += mj
                series.power_w = None if per_mj is None else mj * per_mj
                series.ended_wall_s = None
                series.seen = tick_no
                if not known.groups:
                    continue  # in no container, pod or VM
                joined = known.joined.get(zone)
                if joined is None or joined[0] != self._groups_version:
                    joined = known.joined[zone] = self._join(known, zone, series)
                for gseries in joined[1]:
                    if gseries.seen != tick_no:
                        gseries.seen = tick_no
                        grouped.append((gseries, gseries.energy_mj, per_mj))
                    gseries.energy_mj += mj
        if tick.unseen_by_zone:
            self._unseen(tick, names, tick_start_s, grouped)
        self._finish(now, tick, grouped)
        self._settle(now, tick, hosts, listed)

    def _finish(self, now: Timestamp, tick: TickShares, grouped: list[tuple[Series, int, float | None]]) -> None:
        """The groups with a share: running, their watts the sum of their processes' shares over the zone type's
        interval; where a zone came back from a gap, each share's watts over its own interval, and the late shares."""
        for gseries, before_mj, per_mj in grouped:
            mj = gseries.energy_mj - before_mj  # the sum of its processes' shares
            gseries.power_w = None if per_mj is None else mj * per_mj
            gseries.ended_wall_s = None
        if tick.zone_watts:
            self._gap_watts(tick)
        if tick.late:
            self._late(now, tick.late)

    def _unseen(
        self, tick: TickShares, names: Names, start_s: float, grouped: list[tuple[Series, int, float | None]]
    ) -> None:
        """Each container's share of its unseen CPU time, to its container's series and its pod's (begun where
        there is none, labelled as its processes' would be), with the groups that had a share (``grouped``)."""
        tick_no = self._tick
        memberships = [_container_groups(record, names) for record in tick.unseen]
        for zone, shares in tick.unseen_by_zone.items():
            zone_s = tick.zone_intervals.get(zone, tick.interval_s)
            per_mj = 1 / 1000.0 / zone_s if zone_s > 0 else None
            for groups, mj in zip(memberships, shares, strict=True):
                if mj == 0:
                    continue
                for scope, group, attrs in groups:
                    gseries = self._group_series(scope, group, attrs, zone, start_s)
                    if gseries.seen != tick_no:
                        gseries.seen = tick_no
                        grouped.append((gseries, gseries.energy_mj, per_mj))
                    gseries.energy_mj += mj

    def _forget_changed(self, tick: TickShares, names: Names) -> None:
        """The identities of processes whose listing says another comm or container now made anew, their old
        memberships dropped (a group ends without other members) and their new ones joined at once (a group
        they stay in does not end in a tick that gives them no share): their series are labelled anew.
        The same (pid, start time) says another thing after an exec (a container's first process is runc's
        until its runtime starts it): procfs reads what a process is again when its comm changes."""
        known_by_pk, members_by_group = self._known, self._members
        for pk, host in zip(tick.keys, tick.hosts, strict=True):
            known = known_by_pk.get(pk)
            if known is None or (host.comm == known.comm and host.container_id == known.container_id):
                continue
            del known_by_pk[pk]
            for scope, group, _ in known.groups:
                members = members_by_group.get((scope, group))
                if members is not None:
                    members.discard(pk)
            self._identity(pk, host, names)

    def _join(self, known: Identity, zone: str, series: Series) -> tuple[int, tuple[Series, ...]]:
        """A process's group series in a zone type (:meth:`_group_series`, begun at its series' start), and the
        group table's version after."""
        start_s = series.start_wall_s
        joined = tuple(self._group_series(scope, group, attrs, zone, start_s) for scope, group, attrs in known.groups)
        return self._groups_version, joined

    def _group_series(
        self, scope: GroupScope, group: str, group_attrs: Mapping[str, str], zone: str, start_s: float
    ) -> Series:
        """A group's series in a zone type, found or begun (at ``start_s``), and labelled by its group's
        attributes where its labels differ (begun now, or its pod named since)."""
        gkey = (scope, group, zone)
        gseries = self.groups.get(gkey)
        if gseries is None:
            gseries = self.groups[gkey] = Series(energy_mj=0, start_wall_s=start_s)
            self._rows = None
            self._groups_version += 1
        if gseries.attrs.get("zone") != zone or len(gseries.attrs) != len(group_attrs) + 1:
            attrs = names_kept(gseries.attrs, {**group_attrs, "zone": zone}, ())  # (its key is its place)
            if attrs != gseries.attrs:
                label(gseries, attrs)
                self._groups_version += 1
        return gseries

    def _settle(self, now: Timestamp, tick: TickShares, hosts: Mapping[int, HostProcess], listed: bool) -> None:
        """The series without a share this tick: idle (0 W), not known (their zone did not answer), or ended
        (their process is gone); then the ended ones past their retention dropped."""
        tick_no, split = self._tick, tick.split_zones
        ended = False  # (a series with a share this tick is running)
        for (pid, start, zone), series in self.processes.items():
            if series.seen == tick_no:
                continue
            gone = listed and (
                (host := hosts.get(pid)) is None
                or (host.start_time_ticks != start and process_key(host) != (pid, start))  # (cheap test first)
            )
            if not gone and series.power_w == 0.0 and zone in split and series.ended_wall_s is None:
                continue  # idle, and already at 0 W: nothing to change
            self._idle_or_gone(series, zone, tick, gone, now)
            ended = ended or series.ended_wall_s is not None
        if listed:
            # The identities and members are all of the last listing: the ones gone from it are the exited.
            for pk in tick.exited:
                self._known.pop(pk, None)  # exited: their identities go (their series stay)
            if tick.exited:
                for members in self._members.values():
                    members -= tick.exited
        if listed and self._restored:
            self._adopt_restored(hosts)
        for gkey, gseries in self.groups.items():
            if gseries.seen != tick_no:
                remaining = self._members.get(gkey[:2]) or gkey[:2] in self.alive
                self._idle_or_gone(gseries, gkey[2], tick, listed and not remaining, now)
        held, held_groups = self.pending
        if ended and self._prune(self.processes, now, held):
            self._rows = None
        for gkey in self._prune(self.groups, now, held_groups):
            self._rows = None
            self._groups_version += 1
            if not any(k[:2] == gkey[:2] for k in self.groups):
                self._members.pop(gkey[:2], None)

    def _prune(self, table: dict[Any, Series], now: Timestamp, held: AbstractSet[Any]) -> list[Any]:
        """``prune`` (retention, ``max_terminated``) of the ended series whose key's owner (its first two parts) is
        not ``held`` (an open gap may bill them)."""
        kept = {k: s for k, s in table.items() if s.ended_wall_s is not None and k[:2] in held} if held else {}
        for key, series in kept.items():
            ended_age_s(series, now)  # (placed on this run's clock now, as prune places the others)
            del table[key]
        dropped = prune(table, now, lambda _: self.retention_s, self.max_terminated)
        table.update(kept)
        return dropped

    def _gap_watts(self, tick: TickShares) -> None:
        """The watts of the zone types with a zone back from a gap: each process's its shares over their own
        intervals (``zone_watts``), a group's the sum of its processes' (in place of the tick's mJ over one)."""
        tick_no = self._tick
        for zone, watts in tick.zone_watts.items():
            summed: dict[int, tuple[Series, float]] = {}
            for pk, w in zip(tick.keys, watts, strict=True):
                series = self.processes.get((pk[0], pk[1], zone))
                if series is None or series.seen != tick_no:
                    continue
                series.power_w = w
                known = self._known.get(pk)
                joined = known.joined.get(zone) if known is not None else None
                for gseries in joined[1] if joined is not None else ():
                    summed[id(gseries)] = (gseries, summed.get(id(gseries), (gseries, 0.0))[1] + w)
            for gseries, w in summed.values():
                gseries.power_w = w

    def _late(self, now: Timestamp, late: Sequence[LateShare]) -> None:
        """A gap's shares for processes that exited during it, added to their series as they are (ended, or
        running until this tick's listing ends them) and their containers', pods' and VMs'. A process without a
        series (it used CPU only during the gap) gets one, ended now; a group without one gets one, which ends
        this tick unless /proc lists another of its processes."""
        for pk, host, zone, mj in late:
            series = self.processes.get((pk[0], pk[1], zone))
            if series is None:
                begun = host.start_wall_s if host.start_wall_s is not None else now.wall_s
                series = Series(0, min(begun, now.wall_s), power_w=0.0)
                end(series, now)
                self.processes[(pk[0], pk[1], zone)] = series
                label(series, {**process_attrs(host, None), "zone": zone})
                self._rows = None
            series.energy_mj += mj
            for scope, group, attrs in group_memberships(host, None):
                gseries = self.groups.get((scope, group, zone))
                if gseries is None:
                    gseries = self.groups[(scope, group, zone)] = Series(0, series.start_wall_s)
                    label(gseries, {**attrs, "zone": zone})
                    self._rows = None
                    self._groups_version += 1
                gseries.energy_mj += mj

    def _adopt_restored(self, hosts: Mapping[int, HostProcess]) -> None:
        """Groups restored from the state file know no members yet: their members are the listed processes
        of their container, pod or VM (else a restored group whose processes idle would end, and be pruned)."""
        self._restored = False
        unknown = {gkey[:2] for gkey in self.groups} - self._members.keys()
        if not unknown:
            return
        for member in unknown:
            self._members[member] = set()
        for host in hosts.values():
            pk = process_key(host)
            ids: tuple[tuple[GroupScope, str | None], ...] = (
                ("container", host.container_id),
                ("pod", host.pod_uid),
                ("vm", host.vm_id),
            )
            for scope, group in ids:
                if group is not None and (scope, group) in unknown:
                    self._members[(scope, group)].add(pk)

    @staticmethod
    def _idle_or_gone(series: Series, zone: str, tick: TickShares, gone: bool, now: Timestamp) -> None:
        if gone:
            if series.ended_wall_s is None:
                end(series, now)
            series.power_w = 0.0
        elif zone in tick.split_zones:
            series.power_w = 0.0  # listed, and used no CPU this tick
        elif zone not in tick.read_zones or series.ended_wall_s is None:
            # Its zone did not answer, or its energy went to nobody (the listing or /proc/stat failed): how much
            # it drew is not known (an ended series drew nothing, and keeps its 0 W).
            series.power_w = None

    def totals(self, now: Timestamp) -> list[Totals]:
        """A Totals record per series: the processes', then the containers', pods' and VMs', each in key order
        (sorted again only when a series came or went). Each is ``to_totals``'s record, made from what the
        series keeps: its labels (``label``) and start, set once."""
        if self._rows is None:
            self._rows = self._ordered(now)
            tell_reused_apart(self.processes)
        return [
            new_totals(
                now,
                s.extra[1],
                scope,
                key,
                device,
                s.energy_mj,
                s.power_w,
                "running" if s.ended_wall_s is None else "terminated",
                s.start,
            )
            for s, scope, key, device in self._rows
        ]

    def _ordered(self, now: Timestamp) -> list[tuple[Series, Scope, str, str]]:
        rows: list[tuple[Series, Scope, str, str]] = [
            (s, "process", str(pid), device_id_of(zone)) for (pid, _, zone), s in sorted(self.processes.items())
        ]
        rows += [(s, scope, key, device_id_of(zone)) for (scope, key, zone), s in sorted(self.groups.items())]
        for s, *_ in rows:
            if s.start is None:  # a series new this tick (or restored): when it began, once
                s.start = start_at(now, s.start_wall_s)
        return rows

    # --- state (the state file: totals go on across a restart) -------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "processes": [
                {"pid": pid, "start_ticks": start, "zone": zone, **saved(s, self._wall_offset_s)}
                for (pid, start, zone), s in sorted(self.processes.items())
            ],
            "groups": [
                {"scope": scope, "key": key, "zone": zone, **saved(s, self._wall_offset_s)}
                for (scope, key, zone), s in sorted(self.groups.items())
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Series from :meth:`snapshot`. A restored running series ends at the first tick /proc does not list
        its process (a group: none of its processes' shares that tick)."""
        for row in state.get("processes", []):
            self.processes[(int(row["pid"]), int(row["start_ticks"]), str(row["zone"]))] = _restored(row)
        for row in state.get("groups", []):
            scope = str(row["scope"])
            if scope in ("container", "pod", "vm"):
                self.groups[(cast(GroupScope, scope), str(row["key"]), str(row["zone"]))] = _restored(row)
        self._restored = bool(self.groups)
        self._rows = None
        self._groups_version += 1


def _restored(row: Mapping[str, Any]) -> Series:
    series = restore(row)
    label(series, series.attrs)
    return series


def _container_groups(record: ContainerCpuTime, names: Names) -> list[tuple[GroupScope, str, dict[str, str]]]:
    """A container's groups (itself, its pod) and their attributes, as one of its processes' would be: through
    a listing with no process (``pid`` -1: ``names.find`` goes by container and pod)."""
    host = HostProcess(
        time=record.time,
        pid=-1,
        container_id=record.container_id,
        container_runtime=record.container_runtime,
        pod_uid=record.pod_uid,
    )
    return group_memberships(host, names.find(host))
