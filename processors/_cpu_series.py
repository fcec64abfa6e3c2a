"""The CPU attribution processor's monotonic totals per process, container, pod and VM, per RAPL zone type.

The same series as the GPU side's energy processor (``processors/_energy_series.py``: integer mJ that only
grow, ``state="terminated"`` once the process has left, kept for a retention, at most ``max_terminated`` per
table, the ones with the most energy kept). A process series starts at its first tick with CPU energy and
ends when /proc no longer lists its (pid, start time); a container, pod or VM series is the sum of its
processes' shares and ends when none of its processes is listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.constructors import new_totals
from wattpipe.pipeline.records import HostProcess, Totals, Workload
from wattpipe.processors._energy_series import Scope, Series, prune, restore, saved, start_at

__all__ = [
    "CPU_DEVICE_PREFIX",
    "CpuSeries",
    "GroupScope",
    "Names",
    "ProcessKey",
    "TickShares",
    "device_id_of",
    "process_key",
]

CPU_DEVICE_PREFIX = "cpu:"
"""A CPU zone type's ``device_id`` on Totals (``cpu:package``): the catalog tells CPU totals from GPU ones by it."""

GroupScope = Literal["container", "pod", "vm"]
ProcessKey = tuple[int, int, str]  # pid, start time (clock ticks since boot; -1 unknown), zone type
GroupKey = tuple[GroupScope, str, str]  # scope, container id | pod UID | VM id, zone type


def device_id_of(zone: str) -> str:
    return CPU_DEVICE_PREFIX + zone


def process_key(host: HostProcess) -> tuple[int, int]:
    """What names a process across listings: its pid and start time (-1 when not known)."""
    return host.pid, -1 if host.start_time_ticks is None else host.start_time_ticks


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


@dataclass(frozen=True, slots=True)
class Names:
    """Kubernetes names from the k8s processor's Workloads: a GPU process's by pid, any other's by its cgroup's
    container id or pod UID through the roster (``Workload.listed`` entries name every container and pod)."""

    by_pid: Mapping[int, Workload]
    by_container: Mapping[str, Workload]
    by_pod: Mapping[str, Workload]

    @classmethod
    def of(cls, workloads: Iterable[Workload]) -> Names:
        by_pid: dict[int, Workload] = {}
        by_container: dict[str, Workload] = {}
        by_pod: dict[str, Workload] = {}
        for w in workloads:
            if w.pid is not None:
                by_pid[w.pid] = w
            elif w.container_id is not None and w.container_name is not None:
                by_container[w.container_id] = w
            elif w.pod_uid is not None and w.pod_name is not None:
                by_pod[w.pod_uid] = w
        return cls(by_pid, by_container, by_pod)

    def find(self, host: HostProcess) -> Workload | None:
        found = self.by_pid.get(host.pid)
        if found is None and host.container_id is not None:
            found = self.by_container.get(host.container_id)
        if found is None and host.pod_uid is not None:
            found = self.by_pod.get(host.pod_uid)  # the pod's names only: no container_name from it
            if found is not None and found.container_name is not None:
                found = None
        return found


@dataclass(frozen=True, slots=True)
class _Identity:
    """What a process's series are labelled with, and the groups it belongs to (worked out once)."""

    attrs: dict[str, str]
    groups: list[tuple[GroupScope, str, dict[str, str]]]
    named: bool  # its pod's names were known (from the k8s processor's Workloads)
    # Its listing's comm and container: where a later listing's differ, the process exec'd (see _forget_changed).
    comm: str | None
    container_id: str | None
    by_zone: dict[str, dict[str, str]] = field(default_factory=dict)  # attrs with the zone: one object per zone
    # Its series per zone type, each labelled with this identity's zone_attrs (a new identity starts empty: its
    # series are found in CpuSeries.processes again, and labelled anew).
    series: dict[str, Series] = field(default_factory=dict)
    # Per zone type, its groups' series as CpuSeries._join found (and labelled) them, and the group table's
    # version then: while that version holds, the table has the same series for its groups, labelled alike.
    joined: dict[str, tuple[int, tuple[Series, ...]]] = field(default_factory=dict)

    def zone_attrs(self, zone: str) -> dict[str, str]:
        found = self.by_zone.get(zone)
        if found is None:
            found = self.by_zone[zone] = {**self.attrs, "zone": zone}
        return found


def _process_attrs(host: HostProcess, workload: Workload | None) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for name in ("comm", "exe", "container_id", "pod_uid", "vm_id"):
        value = getattr(host, name)
        if value is not None:
            attrs[name] = str(value)
    attrs["type"] = host.type
    if workload is not None:
        for name in ("pod_name", "pod_namespace"):
            value = getattr(workload, name)
            if value is not None:
                attrs[name] = value
    return attrs


def _group_memberships(host: HostProcess, workload: Workload | None) -> list[tuple[GroupScope, str, dict[str, str]]]:
    out: list[tuple[GroupScope, str, dict[str, str]]] = []
    names = {}
    if workload is not None:
        names = {k: v for k in ("container_name", "pod_name", "pod_namespace") if (v := getattr(workload, k))}
    if host.container_id is not None:
        attrs = {k: v for k, v in names.items()}
        if host.pod_uid is not None:
            attrs["pod_uid"] = host.pod_uid
        if host.container_runtime is not None:
            attrs["runtime"] = host.container_runtime
        out.append(("container", host.container_id, attrs))
    if host.pod_uid is not None:
        out.append(("pod", host.pod_uid, {k: v for k, v in names.items() if k != "container_name"}))
    if host.vm_id is not None:
        attrs = {"hypervisor": host.hypervisor or "kvm"}
        if host.vm_name is not None:
            attrs["vm_name"] = host.vm_name
        out.append(("vm", host.vm_id, attrs))
    return out


class CpuSeries:
    """Every CPU series of one pipeline, and the Totals records they give each tick."""

    def __init__(self, retention_s: float, max_terminated: int) -> None:
        self.retention_s = retention_s
        self.max_terminated = max_terminated
        self.processes: dict[ProcessKey, Series] = {}
        self.groups: dict[GroupKey, Series] = {}
        # A process's identity does not change while its (pid, start time) stays: its attributes and groups
        # are worked out once (again when the k8s processor names its pod later), not every tick.
        self._known: dict[tuple[int, int], _Identity] = {}
        self._members: dict[tuple[GroupScope, str], set[tuple[int, int]]] = {}
        self._tick = 0  # ticks so far: a series whose ``seen`` is the tick's had a share in it
        self._rows: list[tuple[Series, Scope, str, str]] | None = None  # the Totals' order; None: tables changed
        self._groups_version = 0  # moves whenever a group series is added, dropped or relabelled
        self._restored = False  # groups restored whose members the next listing tells

    def _identity(self, pk: tuple[int, int], host: HostProcess, names: Names) -> _Identity:
        known = self._known.get(pk)
        if known is not None and (known.named or (host.container_id is None and host.pod_uid is None)):
            return known
        workload = names.find(host)
        named = workload is not None and workload.pod_name is not None
        if known is None or named:
            known = self._known[pk] = _Identity(
                attrs=_process_attrs(host, workload),
                groups=_group_memberships(host, workload),
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
                    if series.attrs is not attrs:
                        _label(series, attrs)  # a new identity (the pod named since): its series' labels follow
                    known.series[zone] = series
                elif nameable and not known.named and (host.container_id is not None or host.pod_uid is not None):
                    known = self._identity(pk, host, names)  # its pod may have been named since
                    if known.series.get(zone) is not series:  # it was: labelled as the new identity says
                        _label(series, known.zone_attrs(zone))
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
        for gseries, before_mj, per_mj in grouped:
            mj = gseries.energy_mj - before_mj  # the sum of its processes' shares
            gseries.power_w = None if per_mj is None else mj * per_mj
            gseries.ended_wall_s = None
        self._settle(now.wall_s, tick, hosts, listed)

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

    def _join(self, known: _Identity, zone: str, series: Series) -> tuple[int, tuple[Series, ...]]:
        """A process's group series in a zone type, found or begun (at its series' start), and labelled by its
        groups' attributes where theirs differ; and the group table's version after."""
        joined: list[Series] = []
        for scope, group, group_attrs in known.groups:
            gkey = (scope, group, zone)
            gseries = self.groups.get(gkey)
            if gseries is None:
                gseries = self.groups[gkey] = Series(energy_mj=0, start_wall_s=series.start_wall_s)
                self._rows = None
                self._groups_version += 1
            if gseries.attrs.get("zone") != zone or len(gseries.attrs) != len(group_attrs) + 1:
                _label(gseries, {**group_attrs, "zone": zone})
                self._groups_version += 1
            joined.append(gseries)
        return self._groups_version, tuple(joined)

    def _settle(self, wall_s: float, tick: TickShares, hosts: Mapping[int, HostProcess], listed: bool) -> None:
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
            self._idle_or_gone(series, zone, tick, gone, wall_s)
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
                remaining = self._members.get(gkey[:2])
                self._idle_or_gone(gseries, gkey[2], tick, listed and not remaining, wall_s)
        if ended and prune(self.processes, wall_s, lambda _: self.retention_s, self.max_terminated):
            self._rows = None
        for gkey in prune(self.groups, wall_s, lambda _: self.retention_s, self.max_terminated):
            self._rows = None
            self._groups_version += 1
            if not any(k[:2] == gkey[:2] for k in self.groups):
                self._members.pop(gkey[:2], None)

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
    def _idle_or_gone(series: Series, zone: str, tick: TickShares, gone: bool, wall_s: float) -> None:
        if gone:
            if series.ended_wall_s is None:
                series.ended_wall_s = wall_s
            series.power_w = 0.0
        elif zone in tick.split_zones:
            series.power_w = 0.0  # listed, and used no CPU this tick
        elif zone not in tick.read_zones:
            series.power_w = None  # its zone did not answer: how much it drew is not known

    def totals(self, now: Timestamp) -> list[Totals]:
        """A Totals record per series: the processes', then the containers', pods' and VMs', each in key order
        (sorted again only when a series came or went). Each is ``to_totals``'s record, made from what the
        series keeps: its labels (``_label``) and start, set once."""
        if self._rows is None:
            self._rows = self._ordered(now)
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
                {"pid": pid, "start_ticks": start, "zone": zone, **saved(s)}
                for (pid, start, zone), s in sorted(self.processes.items())
            ],
            "groups": [
                {"scope": scope, "key": key, "zone": zone, **saved(s)}
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
    _label(series, series.attrs)
    return series


def _label(series: Series, attrs: dict[str, str]) -> None:
    """Give a series its attributes, and the labels its Totals records carry (sorted, as ``to_totals`` makes
    them), made once here: a series' attributes are only ever replaced, by a new dict, through this."""
    series.attrs = attrs
    items = tuple(attrs.items())
    series.extra = (items, tuple(sorted(items)))
