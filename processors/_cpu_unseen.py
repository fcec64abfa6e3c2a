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

A baseline (no unseen time that tick): a container first read (but a new one, all of whose listed processes
started since the last listing: ``_new``), one whose usage went backwards (a cgroup made
anew under the same id, where a receiver does not take it on from its last reading as procfs does), one not read
at the last listing (its delta would span more than the processes'); a
tick a zone is missing or back from a gap (``_cpu_gap.py`` splits those by the processes' summed deltas: the
containers' usage keeps going, and the gap's unseen time stays with the processes); the first tick after a
restart (the usage read before is not kept); a baseline drops the credit. A failed listing keeps the baselines: the next delta spans it, as
the processes' do. No ``container_cpu`` in the batch (no cgroup v2 mount, procfs ``cpu_time`` off): processes
only, said once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import CreateContext
from wattpipe.pipeline.records import HostProcess, NodeCpuTime
from wattpipe.pipeline.records_cpu import ContainerCpuTime
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
# How much earlier than the last listing a process may start and count as started since (cpu_attribution's too).
_START_SLACK_S = 0.02


@dataclass(frozen=True, slots=True)
class UnseenTick:
    """One tick's unseen CPU time: the containers with some, and their seconds (in the same order); and every
    container read this tick, with its pod (scope, id): their series stay running without a listed process."""

    records: Sequence[ContainerCpuTime] = ()
    seconds: Sequence[float] = ()
    alive: frozenset[tuple[str, str]] = frozenset()


class UnseenTime:
    """Each container's cgroup usage as last read, and the unseen seconds of each tick."""

    def __init__(self, ctx: CreateContext) -> None:
        self.ctx = ctx
        self._usage: dict[str, float] = {}  # container id → usage_s at the last listing
        self._credit: dict[str, float] = {}  # container id → what its processes showed beyond its usage (≤ 0 s)
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
        """The tick's unseen time per container, from its usage delta less its listed processes' ``cpu_s``
        (``hosts``: their listings; ``last``: the last listing, by pid); ``counted`` False (a zone gap open):
        baselines only. A process in another container than at the last listing moved in the tick: its delta
        is taken from both containers' (its time was in one of them, or both; not a second time in the one it
        left). ``since``: the last listing's time (Unix s) and /proc/stat then, for new containers (``_new``)."""
        if not listed:
            return UnseenTick()  # the baselines stay: the next delta spans the failed listing, as the processes'
        if "container_cpu" not in batch.present:
            if batch.host_processes:
                self._say_absent()
            self._usage = {}
            return UnseenTick()
        self._said = False
        seen: dict[str, float] = {}
        shown: dict[str, int] = {}  # container id → its processes listed with a delta
        for host, seconds in zip(hosts, cpu_s, strict=True):
            if host.container_id is not None:
                seen[host.container_id] = seen.get(host.container_id, 0.0) + seconds
                shown[host.container_id] = shown.get(host.container_id, 0) + 1
            was = last.get(host.pid)
            if (
                was is not None
                and (left := was.container_id) is not None
                and left != host.container_id
                and was.start_time_ticks == host.start_time_ticks  # (the same process: not a reused pid)
            ):
                seen[left] = seen.get(left, 0.0) + seconds
        previous, self._usage = self._usage, {}
        credit, self._credit = self._credit, {}
        records: list[ContainerCpuTime] = []
        unseen: list[float] = []
        alive: set[tuple[str, str]] = set()
        by_id = {r.container_id: r for r in batch.container_cpu}  # two receivers' of one container: its last
        new = _new(batch, since, [r for r in by_id.values() if r.container_id not in previous]) if counted else {}
        for record in by_id.values():
            cid = record.container_id
            self._usage[cid] = record.usage_s
            alive.add(("container", cid))
            if record.pod_uid is not None:
                alive.add(("pod", record.pod_uid))
            before = previous.get(cid, new.get(cid))
            if not counted or before is None or record.usage_s < before:
                continue  # a baseline
            seconds = record.usage_s - before - seen.get(cid, 0.0) + credit.get(cid, 0.0)
            if seconds > _MIN_S:
                records.append(record)
                unseen.append(seconds)
            elif seconds < 0:
                self._credit[cid] = max(seconds, -_TICK_S * (2 * shown.get(cid, 0) + 1))
        return UnseenTick(records, unseen, frozenset(alive))

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


def _new(batch: Batch, since: tuple[float, NodeCpuTime] | None, first: Sequence[ContainerCpuTime]) -> dict[str, float]:
    """Of the containers ``first`` read now, those that are new (their usage from 0): every process of theirs listed
    started since the last listing, and their usage is at most what the node ran since (so it is not a past the
    cgroup held before, with processes never listed). A container's processes start after its cgroup is made: all
    of its usage is since the last listing, as a process's first tick counts from its start."""
    node = batch.node_cpu[0] if batch.node_cpu else None
    if not first or since is None or node is None:
        return {}
    since_wall_s, node_before = since
    ran_s = node.active_s - node_before.active_s
    ids = {r.container_id for r in first if r.usage_s <= ran_s}
    started: dict[str, bool] = {}
    for host in batch.host_processes:
        if (cid := host.container_id) in ids:
            start = host.start_wall_s
            started[cid] = started.get(cid, True) and start is not None and start >= since_wall_s - _START_SLACK_S
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
