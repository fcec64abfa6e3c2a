"""A RAPL zone's absence: the CPU time each process (and the node) used while it was not read.

A zone that misses ticks (``energy_uj`` unreadable, its directory gone for a while) while its counter runs on
brings the whole absence's energy the tick it is read again (the rapl receiver keeps its counter). To split
that energy as any tick's, the processor keeps, from the first tick a zone is missing, a :class:`Gap` per
tick the missing zones were last read in: /proc/stat as it was then (the gap's usage ratio starts there) and
each process's CPU-time deltas of every listing since, summed, with its last listing (a process that exits
during the gap keeps its sum, and is billed its share when the zone returns: a *late* share). A gap longer
than :data:`GAP_MAX_S` (the 10 minutes after which a zone counts as gone) stops summing: its memory is
bounded, and the zone's active energy that tick stays unattributed (``unattributable="gap"``); its idle/active
split still uses the node's CPU time over the whole gap.

No zone missing: nothing is kept, nothing is summed (the tick's cost is one comparison per zone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from wattpipe.pipeline.records import HostProcess, NodeCpuTime
from wattpipe.processors._cpu_series import LateShare, process_key
from wattpipe.processors._cpu_split import usage_ratio
from wattpipe.processors.attribution_math import apportion

__all__ = ["GAP_MAX_S", "Gap", "GapShares", "Gaps", "LateShare", "merge_shares"]

GAP_MAX_S = 600.0
"""A zone unread for longer than this is gone (also the idle mode's ``idle_w`` share, cpu_attribution): its gap
keeps no CPU time beyond it, and its energy's active part stays unattributed when it returns."""

Key = tuple[int, int]  # pid, start time: process_key


@dataclass(slots=True)
class Gap:
    """The CPU time used since the missing zones were last read (in tick ``since_tick``)."""

    since_s: float  # monotonic time of the zones' last reading
    node: NodeCpuTime | None  # /proc/stat when they were last read (None: not read then)
    cpu_s: dict[Key, float] | None = field(default_factory=dict)  # None: longer than GAP_MAX_S, no longer summed
    hosts: dict[Key, HostProcess] = field(default_factory=dict)  # each process's last listing with CPU time

    def ratio(self, node: NodeCpuTime | None) -> float | None:
        """The node's usage ratio over the gap (None: /proc/stat not read at one end, or it did not advance)."""
        if node is None or self.node is None:
            return None
        return usage_ratio(node.active_s - self.node.active_s, node.total_s - self.node.total_s)


class Gaps:
    """The open gaps, by the tick their zones were last read in."""

    def __init__(self, max_s: float = GAP_MAX_S) -> None:
        self.max_s = max_s
        self.open: dict[int, Gap] = {}

    def track(self, absent: Mapping[int, float], node: NodeCpuTime | None) -> None:
        """Open a gap for each last-read tick of the zones missing this tick (``absent``: tick → when); ``node``
        is /proc/stat before this tick (a gap opens the tick after its zones' last reading: theirs)."""
        for tick, since_s in absent.items():
            if tick not in self.open:
                self.open[tick] = Gap(since_s, node)

    def add(self, keys: Sequence[Key], hosts: Sequence[HostProcess], cpu_s: Sequence[float], now_s: float) -> None:
        """A listing's CPU-time deltas into every open gap not past ``max_s`` (one past it forgets its sums)."""
        for gap in self.open.values():
            if gap.cpu_s is None:
                continue
            if now_s - gap.since_s > self.max_s:
                gap.cpu_s, gap.hosts = None, {}
                continue
            sums, last = gap.cpu_s, gap.hosts
            for key, host, seconds in zip(keys, hosts, cpu_s, strict=True):
                sums[key] = sums.get(key, 0.0) + seconds
                last[key] = host

    def summing(self, absent: Mapping[int, float], now_s: float) -> bool:
        """Whether a gap sums CPU time this tick: one opening now (``absent``'s ticks not open yet), or an open one
        not past ``max_s``. A zone gone for good leaves its gap open, past ``max_s`` summing nothing."""
        if any(tick not in self.open for tick in absent):
            return True
        return any(g.cpu_s is not None and now_s - g.since_s <= self.max_s for g in self.open.values())

    def keep(self, ticks: Mapping[int, float]) -> None:
        """Close the gaps no missing zone was last read in (their zones are back)."""
        for tick in [t for t in self.open if t not in ticks]:
            del self.open[tick]

    def pending(self) -> tuple[frozenset[Key], frozenset[tuple[str, str]]]:
        """The processes an open gap may yet bill, and their containers, pods and VMs (scope, id): their ended
        series must stay until it closes."""
        keys: set[Key] = set()
        groups: set[tuple[str, str]] = set()
        for gap in self.open.values():
            if gap.cpu_s is None:
                continue
            keys.update(gap.cpu_s)
            for host in gap.hosts.values():
                for scope, group in (("container", host.container_id), ("pod", host.pod_uid), ("vm", host.vm_id)):
                    if group is not None:
                        groups.add((scope, group))
        return frozenset(keys), frozenset(groups)


@dataclass(frozen=True, slots=True)
class GapShares:
    """A tick's shares where a zone came back from a gap: per zone type, each listed process's mJ and watts (in
    ``keys``' order: the tick's processes, then those that used CPU only during a gap), and the late shares."""

    keys: list[Key]
    hosts: list[HostProcess]
    by_zone: dict[str, list[int]]
    watts: dict[str, list[float]]
    late: list[LateShare]


# Per group of zones split alike (zone type, last-read tick of a gap or -1: the tick's own deltas): active mJ
# and the interval it spans.
Groups = Mapping[tuple[str, int], tuple[int, float]]


def merge_shares(
    keys: Sequence[Key],
    hosts: Sequence[HostProcess],
    cpu_s: Sequence[float],
    groups: Groups,
    gaps: Mapping[int, Gap],
    listing: Mapping[int, HostProcess],
) -> GapShares:
    """Apportion each group's active energy by its deltas (a gap's: summed over it) and sum the shares per zone
    type over the tick's processes and the gaps' (listed now: their listing; else a late share). A process's
    watts are its shares over their own intervals, summed."""
    out_keys, out_hosts = list(keys), list(hosts)
    at = {key: i for i, key in enumerate(out_keys)}
    split: list[tuple[str, float, Sequence[Key], Sequence[HostProcess], list[int]]] = []
    for (zone, since), (active_mj, interval_s) in groups.items():
        if since < 0:
            gkeys, ghosts, weights = keys, hosts, cpu_s
        else:
            gap = gaps[since]
            sums = gap.cpu_s or {}
            gkeys, weights = list(sums), list(sums.values())
            ghosts = [gap.hosts[k] for k in gkeys]
        split.append((zone, interval_s, gkeys, ghosts, apportion(active_mj, weights)))
        for key in gkeys:
            now = listing.get(key[0])
            if key not in at and now is not None and process_key(now) == key:
                at[key] = len(out_keys)
                out_keys.append(key)
                out_hosts.append(now)
    by_zone: dict[str, list[int]] = {}
    watts: dict[str, list[float]] = {}
    late: list[LateShare] = []
    for zone, interval_s, gkeys, ghosts, shares in split:
        mj = by_zone.setdefault(zone, [0] * len(out_keys))
        w = watts.setdefault(zone, [0.0] * len(out_keys))
        per_s = 1.0 / 1000.0 / interval_s if interval_s > 0 else 0.0
        for key, host, share in zip(gkeys, ghosts, shares, strict=True):
            i = at.get(key)
            if i is not None:
                mj[i] += share
                w[i] += share * per_s
            elif share:
                late.append((key, host, zone, share))
    return GapShares(out_keys, out_hosts, by_zone, watts, late)
