"""``cpu_attribution``'s ``unseen: containers``: a container billed for the CPU time its cgroup used that /proc
never showed per process.

The seed's model splits a zone's active energy by the CPU-time deltas of the processes /proc lists each tick.
A process that starts and ends between two listings is never seen, and one that ends loses its CPU time since
its last listing; the energy of that time goes to the processes that were seen, other tenants' included. A
container's cgroup v2 ``usage_usec`` (the ``procfs`` receiver's ``ContainerCpuTime``) counts every task it
ever held, so per container per tick::

    unseen_s = max(0, Δusage_s − Σ Δcpu_s of its listed processes, as the tick weighs them + credit)

(``credit`` ≤ 0: what they showed beyond its growth at the last tick, bounded by ``_TICK_S`` below).

is the CPU time of processes /proc did not show. It joins the tick's weights beside the processes' (one
apportioning: ``idle + Σ shares + unattributed == delta`` stays exact), and its share goes to the container's
series and its pod's, to no process.

A process that moved into the container without an exec may be listed there late, its delta spanning ticks whose
seconds the container was billed as unseen time (procfs hands its record on unread while the cgroup it left
idles, until a full read): where its container's listed processes showed more than its usage grew, that excess,
up to the unseen seconds the container was billed since the moved process's last read (kept ``_BANK_TICKS``
back), is taken back from the moved processes' deltas: weighed once, not twice. One read at the last listing
(moved in the tick, out of a busy cgroup) has nothing taken back: its time was this tick's.

A container with no record for a tick (its ``cpu.stat`` unreadable) is unknown, not 0 s: its last record is kept
(``_KEEP_S``) with its listed processes' deltas of the ticks since, and its next record that goes on from it
(``ContainerCpuTime.since_s`` at or before its time; one that does not say goes on from the last listing's only)
spans them, all of those deltas taken off. A baseline (no unseen time that tick): a record that goes on from none
kept (a first reading, one its receiver says starts over), unless the container is new (``_new``: each of its
listed processes started since, and its usage is no more than the node ran since; or its record says its cgroups
were made after a look no earlier than the last listing, ``made_after_s``: counted from 0); one whose
usage went backwards (a cgroup made anew under the same id, where a receiver does not take it on from its last
reading as procfs does); a tick a zone's gap sums the processes' CPU time (a zone missing, or back, within
``GAP_MAX_S``: ``_cpu_gap.py`` splits those by the processes' summed deltas, the containers' usage keeps going, and
the gap's unseen time stays with the processes, so no record is kept over it; a gap past it sums nothing, and its
ticks are counted); the first tick after a restart (the usage read before is not kept). A baseline drops the
credit and the unseen seconds kept. A failed listing keeps the baselines: the next delta spans it, as the
processes' do. No ``container_cpu`` in the batch (no cgroup v2 mount, procfs ``cpu_time`` off): processes only,
said once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import CreateContext
from wattpipe.pipeline.records import HostProcess, NodeCpuTime
from wattpipe.pipeline.records_cpu import ContainerCpuTime
from wattpipe.processors._cpu_gap import GAP_MAX_S
from wattpipe.processors._cpu_series import started_since
from wattpipe.processors.attribution_math import apportion

__all__ = ["UnseenTick", "UnseenTime", "split_active"]

# Below this a container's unseen time is rounding (cgroup µs against /proc's float seconds), not a process.
_MIN_S = 1e-6
# /proc's CPU times are whole clock ticks (USER_HZ, 100 on every architecture Linux runs wattpipe on), its utime and
# stime each truncated (fs/proc/array.c): a process's delta is off by up to two either way, so a container's listed
# processes may show up to twice this much more than its cgroup grew, per process, and give it back later. What
# they ran ahead by is owed back (a credit, at most two of these per listed process and one more): clipped tick by
# tick at 0, the half of the noise above 0 was billed.
_TICK_S = 0.01
# A process that moved to another cgroup without an exec may be read late: procfs hands its record on unread while the
# cgroup it was read in idles (it left it), until a full read (every FULL_READ_EVERY-th scan, 12) reads it where it
# is, its delta then spanning the scans unread, whose seconds its new container was billed as unseen time. So each
# container's unseen seconds of this many ticks back are kept, to be taken back from such a delta.
_BANK_TICKS = 16
# A container's last record is kept this long while it has none (a cpu.stat unreadable), as a zone's gap keeps the
# processes' CPU time: its next record that goes on from it (``ContainerCpuTime.since_s``) spans the ticks between.
_KEEP_S = GAP_MAX_S


@dataclass(slots=True)
class _Read:
    """A container's last record as weighed: its usage, when it was read (monotonic s), the listing it was read at
    (``UnseenTime._ticks``), and its listed processes' deltas weighed since, in the ticks it had no record."""

    usage_s: float
    read_s: float
    tick: int
    seen_s: float = 0.0


@dataclass(frozen=True, slots=True)
class UnseenTick:
    """One tick's unseen CPU time: the containers with some, and their seconds (in the same order); every
    container read this tick, with its pod (scope, id): their series stay running without a listed process; and
    the processes' deltas where some were taken back from (a moved process's late delta)."""

    records: Sequence[ContainerCpuTime] = ()
    seconds: Sequence[float] = ()
    alive: frozenset[tuple[str, str]] = frozenset()
    cpu_s: Sequence[float] | None = None  # the processes' deltas, less what was taken back; None: as they were


class UnseenTime:
    """Each container's cgroup usage as last read, its credit and the unseen seconds it was billed of late (to be
    taken back from a moved process's late delta), and the unseen seconds of each tick."""

    def __init__(self, ctx: CreateContext) -> None:
        self.ctx = ctx
        self._usage: dict[str, _Read] = {}  # container id → its last record (kept _KEEP_S while it has none)
        self._credit: dict[str, float] = {}  # container id → what its processes showed beyond its usage (≤ 0 s)
        # container id → the unseen seconds it was billed, by tick (number, midpoint monotonic s), _BANK_TICKS back
        self._bank: dict[str, list[tuple[int, float, float]]] = {}
        self._ticks = 0  # the listings weighed
        self._last_s: float | None = None  # the last listing's time (monotonic s)
        self._said = False  # that there is no container CPU time, since it was last there

    def weigh(
        self,
        batch: Batch,
        hosts: Sequence[HostProcess],
        cpu_s: Sequence[float],
        listed: bool,
        counted: bool,
        last: Mapping[int, HostProcess],
        since: tuple[float, NodeCpuTime] | None = None,
    ) -> UnseenTick:
        """The tick's unseen time per container: its usage delta less its listed processes' ``cpu_s`` (``hosts``:
        their listings; ``last``: the last listing, by pid); ``counted`` False (a zone's gap sums CPU time): baselines
        only. A process that moved since the last listing: its delta is taken from both containers' (not twice in the
        one it left), and the unseen time its container was billed since its last read is taken back from its delta
        (module doc; ``UnseenTick.cpu_s``). ``since``: the last listing's monotonic s and /proc/stat (``_new``)."""
        if not listed:
            return UnseenTick()  # the baselines stay: the next delta spans the failed listing, as the processes'
        if "container_cpu" not in batch.present:
            if batch.host_processes:
                self._say_absent()
            self._usage = {}
            return UnseenTick()
        self._said = False
        seen, shown, moved = _shown(hosts, cpu_s, last)
        previous, credit, bank = self._usage, self._credit, self._bank
        self._usage, self._credit, self._bank = {}, {}, {}
        self._ticks += 1
        mid_s = None if self._last_s is None else (self._last_s + batch.time.monotonic_s) / 2
        self._last_s = batch.time.monotonic_s
        weighed: list[float] | None = None  # cpu_s, less what was taken back
        records: list[ContainerCpuTime] = []
        unseen: list[float] = []
        alive: set[tuple[str, str]] = set()
        by_id = {r.container_id: r for r in batch.container_cpu}  # two receivers' of one container: its last
        starts = self._starts(batch, by_id, previous, since) if counted else {}
        for record in by_id.values():
            cid = record.container_id
            self._usage[cid] = _Read(record.usage_s, record.time.monotonic_s, self._ticks)
            alive.add(("container", cid))
            if record.pod_uid is not None:
                alive.add(("pod", record.pod_uid))
            before, seen_s = starts.get(cid, (None, 0.0))
            if before is None or record.usage_s < before:
                continue  # a baseline (its bank dropped)
            seconds = record.usage_s - before - seen_s - seen.get(cid, 0.0) + credit.get(cid, 0.0)
            kept = _recent(bank.get(cid, []), self._ticks - _BANK_TICKS)
            if seconds < 0 and kept and cid in moved:
                weighed = list(cpu_s) if weighed is None else weighed
                seconds += _take_back(kept, -seconds, moved[cid], hosts, last, weighed)
            if seconds > _MIN_S:
                records.append(record)
                unseen.append(seconds)
                if mid_s is not None:
                    kept.append((self._ticks, mid_s, seconds))
            elif seconds < 0:
                self._credit[cid] = max(seconds, -_TICK_S * (2 * shown.get(cid, 0) + 1))
            if kept:
                self._bank[cid] = kept
        self._keep(previous, by_id, seen, credit, bank, batch.time.monotonic_s - _KEEP_S if counted else None)
        return UnseenTick(records, unseen, frozenset(alive), weighed)

    def _starts(
        self,
        batch: Batch,
        by_id: Mapping[str, ContainerCpuTime],
        previous: Mapping[str, _Read],
        since: tuple[float, NodeCpuTime] | None,
    ) -> dict[str, tuple[float, float]]:
        """Where each record's delta starts: the usage of the record it goes on from and its listed processes'
        deltas weighed since in the ticks it had no record, or (0 s, 0 s) for a new container (``_new``, or its
        cgroups made since the last listing: ``made_after_s`` no earlier); none: a baseline."""
        starts = {
            c: (was.usage_s, was.seen_s)
            for c, r in by_id.items()
            if (was := previous.get(c)) is not None and _goes_on(r, was, self._ticks - 1)
        }
        first = [r for r in by_id.values() if r.container_id not in starts]
        new = _new(batch, since, first)
        if since is not None:
            new.update(
                (r.container_id, 0.0) for r in first if r.made_after_s is not None and r.made_after_s >= since[0]
            )
        return {**{c: (usage_s, 0.0) for c, usage_s in new.items()}, **starts}

    def _keep(
        self,
        previous: Mapping[str, _Read],
        by_id: Mapping[str, ContainerCpuTime],
        seen: Mapping[str, float],
        credit: Mapping[str, float],
        bank: Mapping[str, list[tuple[int, float, float]]],
        after_s: float | None,
    ) -> None:
        """The containers with no record this tick, read since ``after_s``: their last record kept, their listed
        processes' deltas of the tick (``seen``) added to it, their credit and bank kept, so their next record
        that goes on from it spans this tick (unknown, not 0 s). None (a zone's gap sums CPU time): none kept,
        their next record a baseline, as every record is this tick."""
        if after_s is None:
            return
        for cid, was in previous.items():
            if cid in by_id or was.read_s < after_s:
                continue
            was.seen_s += seen.get(cid, 0.0)
            self._usage[cid] = was
            if cid in credit:
                self._credit[cid] = credit[cid]
            if cid in bank:
                self._bank[cid] = bank[cid]

    def _say_absent(self) -> None:
        if self._said:
            return
        self._said = True
        self.ctx.telemetry.log.log(
            logging.WARNING,
            "unseen_containers",
            f"processor {self.ctx.component_id}: unseen: containers, but no container CPU time in the batch "
            "(the procfs receiver needs cpu_time and a cgroup v2 mount at cgroup_root): processes only",
        )


def _goes_on(record: ContainerCpuTime, was: _Read, last_tick: int) -> bool:
    """Whether ``record``'s usage goes on from ``was`` (a delta between them is the container's own): its receiver
    says it goes on unbroken since then or before (``since_s``), or, where it does not say, ``was`` is of the last
    listing (``last_tick``)."""
    if record.since_s is None:
        return was.tick == last_tick
    return record.since_s <= was.read_s


def _recent(kept: list[tuple[int, float, float]], after_tick: int) -> list[tuple[int, float, float]]:
    """A container's kept unseen seconds (tick, its midpoint, seconds) of the ticks after ``after_tick``."""
    return [b for b in kept if b[0] > after_tick] if kept and kept[0][0] <= after_tick else kept


def _shown(
    hosts: Sequence[HostProcess], cpu_s: Sequence[float], last: Mapping[int, HostProcess]
) -> tuple[dict[str, float], dict[str, int], dict[str, list[HostProcess]]]:
    """Per container id: its listed processes' ``cpu_s`` (and those of the processes that left it since ``last``),
    how many were listed with a delta, and those that moved into it since ``last``."""
    seen: dict[str, float] = {}
    shown: dict[str, int] = {}
    moved: dict[str, list[HostProcess]] = {}
    for host, seconds in zip(hosts, cpu_s, strict=True):
        if host.container_id is not None:
            seen[host.container_id] = seen.get(host.container_id, 0.0) + seconds
            shown[host.container_id] = shown.get(host.container_id, 0) + 1
        was = last.get(host.pid)
        if (
            was is not None
            and (left := was.container_id) != host.container_id
            and was.start_time_ticks == host.start_time_ticks  # (the same process: not a reused pid)
        ):
            if left is not None:
                seen[left] = seen.get(left, 0.0) + seconds
            if host.container_id is not None:
                moved.setdefault(host.container_id, []).append(host)
    return seen, shown, moved


def _take_back(
    bank: list[tuple[int, float, float]],
    excess_s: float,
    moved: Sequence[HostProcess],
    hosts: Sequence[HostProcess],
    last: Mapping[int, HostProcess],
    weighed: list[float],
) -> float:
    """What a container's processes showed beyond its usage growth (``excess_s``) that is the unseen time it was
    billed (``bank``, taken out of it) since the last read of a process that moved into it (``moved``, listed in
    ``hosts``; ``last``: the last listing, whose record of it is the one read last where procfs handed it on): that
    process's delta spans those ticks, their seconds counted twice. Taken back from the moved processes' deltas
    (``weighed``, by their index in ``hosts``) in proportion, never below 0: the seconds taken back."""
    ids = {id(host) for host in moved}  # (rare: their indexes are looked up only here)
    into = [i for i, host in enumerate(hosts) if id(host) in ids]
    since_s = min(last[host.pid].time.monotonic_s for host in moved)  # (a tick whose midpoint is after it)
    moved_s = sum(weighed[i] for i in into)
    wanted = min(excess_s, moved_s)
    taken = 0.0
    for n, (tick, mid_s, seconds) in enumerate(bank):
        if taken >= wanted:
            break
        if mid_s > since_s:
            take = min(seconds, wanted - taken)
            bank[n] = (tick, mid_s, seconds - take)
            taken += take
    if taken > 0:
        for i in into:
            weighed[i] *= 1 - taken / moved_s
    return taken


def _new(batch: Batch, since: tuple[float, NodeCpuTime] | None, first: Sequence[ContainerCpuTime]) -> dict[str, float]:
    """Of the containers ``first`` read now, those that are new (their usage from 0): every process of theirs listed
    started since the last listing, and their usage is at most what the node ran since (so it is not a past the
    cgroup held before, with processes never listed). A container's processes start after its cgroup is made: all
    of its usage is since the last listing, as a process's first tick counts from its start."""
    node = batch.node_cpu[0] if batch.node_cpu else None
    if not first or since is None or node is None:
        return {}
    since_s, node_before = since
    ran_s = node.active_s - node_before.active_s
    ids = {r.container_id for r in first if r.usage_s <= ran_s}
    started: dict[str, bool] = {}
    for host in batch.host_processes:
        if (cid := host.container_id) in ids:
            started[cid] = started.get(cid, True) and started_since(host, since_s)
    return {cid: 0.0 for cid, new in started.items() if new}


def split_active(
    groups: Mapping[tuple[str, int], tuple[int, float]], cpu_s: Sequence[float], unseen_s: Sequence[float]
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Each zone type's active energy apportioned over the processes' deltas and the containers' unseen seconds
    at once: (zone type → the processes' mJ, zone type → the containers' mJ); the latter empty without unseen."""
    if not unseen_s:
        return {zone: apportion(active, cpu_s) for (zone, _), (active, _) in groups.items()}, {}
    n = len(cpu_s)
    weights = [*cpu_s, *unseen_s]
    by_zone: dict[str, list[int]] = {}
    unseen: dict[str, list[int]] = {}
    for (zone, _), (active, _) in groups.items():
        shares = apportion(active, weights)
        by_zone[zone], unseen[zone] = shares[:n], shares[n:]
    return by_zone, unseen
