"""Processor ``cpu_attribution``: RAPL energy split into idle and active, and the active part billed to
processes, containers, pods and VMs by CPU time, as seed 002 (Kepler's power attribution guide) defines it.

Per zone (``intel-rapl:0``, ``intel-rapl:0:0``, …) per tick: the counter's delta in integer mJ (the receiver
``rapl`` has added wraps back; a new ``counter_epoch`` is a reset, and that tick's delta is not energy);
``active = delta × usage ratio`` (Δactive_s / Δtotal_s of /proc/stat), ``idle = delta − active``; each
process's share of the active energy is its CPU-time delta over the sum of all processes' deltas, split
exactly (``processors/_cpu_split.py``). A process that started inside the tick counts all its CPU time.
Per zone per tick ``idle + Σ processes + unattributed == delta`` exactly, the same invariant and units as
the GPU path. A zone back from ticks it missed is measured and split across them: by the node's usage and each
process's CPU time since its last reading, kept while it was missing (``processors/_cpu_gap.py``; past 10
minutes its active energy is unattributed, ``unattributable="gap"``). A tick whose /proc listing failed holds its
zones' energy for the next listing, whose deltas span it (``processors/_cpu_hold.py``). Processes' shares are summed per
zone *type* (two sockets' ``package`` zones are one ``package`` series per process, as Kepler labels them),
then into containers, pods and VMs (``processors/_cpu_series.py``). ``unseen: containers`` adds each container's
cgroup CPU time that no listed process carried to the weights, billed to the container and its pod (``_cpu_unseen.py``).

Out: a ``DevicePower`` (``device_type="cpu"``) and a ``DeviceTotals`` per zone, labelled ``zone`` and
``path``; a ``Totals`` per process, container and pod per zone type, with ``device_id`` ``cpu:<zone>``; and the
tick's usage ratio on its ``NodeCpuTime`` (``usage_ratio``, Kepler's ``kepler_node_cpu_usage_ratio``), with or
without RAPL.
Place it after the GPU processors (``idle``, ``attribution``, ``energy``); placed before them, they leave the CPU
zones' records alone (they split and total GPUs only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from pydantic import Field, model_validator

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.records import CpuZoneSample, DevicePower, DeviceTotals, HostProcess, NodeCpuTime
from wattpipe.processors._cpu_gap import GAP_MAX_S, Gaps, merge_shares
from wattpipe.processors._cpu_hold import Holds, Settled
from wattpipe.processors._cpu_idle import ZoneIdle, ZoneIdles
from wattpipe.processors._cpu_series import CpuSeries, Names, TickShares, process_key, started_since
from wattpipe.processors._cpu_split import idle_active, splittable, usage_ratio
from wattpipe.processors._cpu_unseen import UnseenTick, UnseenTime, split_active
from wattpipe.processors._cpu_zone_totals import ZoneTotals, device_totals, dumped, restored, totals_for

__all__ = ["CpuAttributionConfig", "CpuAttributionProcessor", "factory"]

# A zone not read for this long is gone (as a GPU is after the energy processor's device_gone_after, 10 minutes):
# in the idle mode it no longer takes a share of its zone type's idle_w; back, its gap's active energy stays
# unattributed (processors/_cpu_gap.py keeps the processes' CPU time over a gap up to this long).
_ZONE_GONE_AFTER_S = GAP_MAX_S

_Unattributable = Literal["gap", "processes_unknown"] | None


class _Part(NamedTuple):
    """One zone's split in a tick, as ``_power`` takes it."""

    sample: CpuZoneSample
    interval_s: float
    idle_mj: int
    active_mj: int
    split: bool
    why: _Unattributable
    zone_idle: ZoneIdle | None
    idle_known: bool
    energy_mj: int  # the counter's delta (idle + active, but where energy is held or released)
    held_mj: int = 0  # the zone's energy held after this tick (processors/_cpu_hold.py)


class CpuAttributionConfig(ComponentConfig):
    mode: Literal["usage_ratio", "idle"] = "usage_ratio"
    """``usage_ratio``: the seed's model (active = delta × node CPU usage ratio). ``idle``: active = delta −
    ``idle_w`` × interval, for zones whose idle power is known (docs/attribution.md, "CPU")."""
    idle_w: dict[str, float] = Field(default_factory=dict)
    """Idle mode: the node's idle power per zone type (``package: 40``), split evenly over that type's zones.
    A zone type not listed is learned (``learn_idle``), else split by the usage ratio."""
    terminated_retention: Duration = 60.0
    """How long an ended series (an exited process, a gone container, pod or VM) stays exported."""
    unseen: Literal["none", "containers"] = "none"
    """``containers``: a container's cgroup CPU time no listed process carried (processes that lived inside a tick,
    or ended since their last listing) joins the weights, billed to it and its pod (docs/attribution.md)."""
    max_terminated: int = Field(default=500, ge=0)
    """At most this many ended series are kept per table (the ones with the most energy)."""

    learn_idle: bool = True
    """Idle mode: learn the idle power of the zone types ``idle_w`` does not list, by regression of each zone's
    power on the usage ratio (until a fit passes, such a zone is split by the usage ratio)."""

    @model_validator(mode="after")
    def _idle_needs_values(self) -> CpuAttributionConfig:
        if self.mode == "idle" and not self.idle_w and not self.learn_idle:
            raise ValueError(
                "mode idle needs idle_w (the node's idle power per zone type, e.g. {package: 40}) or learn_idle: true"
            )
        for zone, watts in self.idle_w.items():
            if watts < 0:
                raise ValueError(f"idle_w.{zone}: {watts} W is negative")
        return self


@dataclass(frozen=True, slots=True)
class _Weights:
    keys: list[tuple[int, int]]
    hosts: list[HostProcess]  # the keys' listings
    cpu_s: list[float]
    listed: bool  # /proc answered this tick
    exited: AbstractSet[tuple[int, int]] = frozenset()  # in the last listing, not in this one
    unseen: UnseenTick = field(default_factory=UnseenTick)  # unseen: containers: the containers with unseen time


class CpuAttributionProcessor:
    needs = frozenset({"cpu_zones", "node_cpu", "host_processes"})
    provides = frozenset({"device_power", "device_totals", "totals"})
    wants = frozenset({"process_cpu_time"})  # procfs cpu_time: auto reads every process's CPU time for it

    def __init__(self, config: CpuAttributionConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx
        self._zones: dict[str, CpuZoneSample] = {}
        self._node: NodeCpuTime | None = None
        self._hosts: Mapping[int, HostProcess] = {}  # the last listing, by pid: the deltas start from it
        self._last_s: float | None = None  # the monotonic time of the last listing: the deltas start from it
        self._listed_node: NodeCpuTime | None = None  # unseen: containers: /proc/stat as of the last listing
        self._tick = 0  # process() calls: a zone's last reading and the last listing are placed by it
        self._zone_tick: dict[str, int] = {}  # the tick each zone was last read in
        self.zone_totals: dict[str, ZoneTotals] = {}
        self.series = CpuSeries(config.terminated_retention, config.max_terminated)
        self._idles = ZoneIdles(config.idle_w, config.learn_idle, ctx.logger) if config.mode == "idle" else None
        self._gaps = Gaps(_ZONE_GONE_AFTER_S)  # the CPU time used while a zone is missing, by its last-read tick
        self._holds = Holds()  # the zones' energy of ticks whose listing failed, held (processors/_cpu_hold.py)
        self._unseen = UnseenTime(ctx) if config.unseen == "containers" else None
        self.wants = self.wants | {"container_cpu_time"} if self._unseen else self.wants  # procfs: ContainerCpuTime

    # --- state: totals and series go on across a restart (``service.state``) ------------------------------

    def start(self) -> None:
        """Totals, series (and the idle mode's learned idles) from the state file. All or nothing: every row is
        read before any is kept, so a bad one (it raises: the runtime starts this again without the section)
        leaves no series restored beside zone totals from 0."""
        saved_state = self.ctx.state.section(self.ctx.state_key)
        if not saved_state:
            return
        zones = restored(saved_state.get("zones", {}))
        series = CpuSeries(self.config.terminated_retention, self.config.max_terminated)
        series.restore(saved_state)
        self.zone_totals, self.series = zones, series
        if self._idles is not None:  # (a bad row of these is reported and left out: it does not fail the start)
            self._idles.load(saved_state.get("idle_fits"), self.ctx.node_name)
        self.ctx.logger.info(
            "CPU totals restored: %d zones, %d process series", len(self.zone_totals), len(self.series.processes)
        )

    def snapshot(self) -> dict[str, Any]:
        section = {"zones": self._holds.saved(dumped(self.zone_totals)), **self.series.snapshot()}
        if self._idles is not None:
            section["idle_fits"] = self._idles.dump(self.ctx.node_name)
        return section

    def process(self, batch: Batch) -> Batch:
        self._tick += 1
        node_before = self._node  # /proc/stat as of the last tick: where a gap opening now starts
        ratio = self._ratio(batch)
        if ratio is not None:  # the tick's ratio on its node CPU time: kepler_node_cpu_usage_ratio
            batch = batch.replace(node_cpu=(replace(batch.node_cpu[0], usage_ratio=ratio), *batch.node_cpu[1:]))
        if "cpu_zones" not in batch.present and not self.zone_totals and not self._zones:
            return batch  # no RAPL on this node (or not yet): the GPU side alone
        now = batch.time
        # By pid, as the GPU side reads a listing (a pid two receivers both list is one process: its last record);
        # a pid's start time tells the process it names now from one that had it before.
        hosts = {h.pid: h for h in batch.host_processes if h.cpu_time_s is not None}
        if batch.host_processes and not hosts:
            self.ctx.telemetry.log.log(
                logging.WARNING,
                "no_cpu_time",
                f"processor {self.ctx.component_id}: /proc's processes carry no CPU time (procfs cpu_time: false?): "
                "CPU energy stays unattributed; set cpu_time: true on the procfs receiver",
            )
        last_listing = self._hosts  # (the deltas' start: a process's container there, where it moved since)
        listed_node = self._listed_node  # (/proc/stat at the last listing: a failed one's tick may be between)
        since = None if self._last_s is None or listed_node is None else (self._last_s, listed_node)
        weights = self._weights(batch, hosts)
        absent = self._absent(batch)
        if self._unseen is not None:  # (not while a zone's gap sums CPU time: _cpu_unseen.py)
            counted = not self._gaps.summing(absent, now.monotonic_s)
            u = self._unseen.weigh(batch, weights.hosts, weights.cpu_s, weights.listed, counted, last_listing, since)
            cpu_s = weights.cpu_s if u.cpu_s is None else list(u.cpu_s)  # (a moved process's late delta: less)
            weights, self.series.alive = replace(weights, unseen=u, cpu_s=cpu_s), u.alive
            self._listed_node = self._node if weights.listed else listed_node
        if absent or self._gaps.open:  # a zone missing: the CPU time used meanwhile is kept (processors/_cpu_gap.py)
            self._gaps.track(absent, node_before)
            if weights.listed:
                self._gaps.add(weights.keys, weights.hosts, weights.cpu_s, now.monotonic_s)
        powers, tick = self._split(batch, ratio, weights, hosts)
        if self._gaps.open:  # (the gaps that close now too: their late shares go to series this tick)
            self.series.pending = self._gaps.pending()
            self._gaps.keep(absent)
        elif self.series.pending[0]:
            self.series.pending = (frozenset(), frozenset())
        self.series.update(now, tick, hosts, Names.of(batch.workloads), weights.listed)
        return batch.replace(
            device_power=batch.device_power + tuple(powers),
            device_totals=batch.device_totals + self._device_totals(now),
            totals=batch.totals + tuple(self.series.totals(now)),
        )

    @staticmethod
    def _intervals(powers: list[DevicePower]) -> dict[str, float]:
        """Each split zone type's interval (its first zone's, by path): a type read again after a tick that the
        listing missed too spans both, where another type spans one."""
        out: dict[str, float] = {}
        for p in powers:
            if p.unattributable is None:
                out.setdefault(p.device_name or "", p.interval_s)
        return out

    # --- the tick's inputs ------------------------------------------------------------------------

    def _ratio(self, batch: Batch) -> float | None:
        node = batch.node_cpu[0] if batch.node_cpu else None
        previous, self._node = self._node, node if node is not None else self._node
        if node is None or previous is None:
            return None
        return usage_ratio(node.active_s - previous.active_s, node.total_s - previous.total_s)

    def _weights(self, batch: Batch, hosts: Mapping[int, HostProcess]) -> _Weights:
        """Each listed process's CPU-time delta since the last listing (s): all of it for one started since,
        none for one first seen that started before (its time before is not this tick's). After a failed listing
        the deltas span the gap, and a process that started in it counts from its start."""
        if "host_processes" not in batch.present:
            return _Weights([], [], [], listed=False)  # keep the previous readings: the next delta spans the gap
        keys, listings, cpu_s = [], [], []
        previous = self._hosts
        since = self._last_s
        carried = 0  # how many of the last listing are listed again
        reused: list[HostProcess] = []  # the last listing's processes whose pid another process has now
        for pid, host in hosts.items():
            before = previous.get(pid)
            if before is host:  # the very record of the last listing (procfs cgroup_root: its cgroup ran nothing)
                carried += 1
                continue  # no CPU time since: no share
            now_s = host.cpu_time_s or 0.0
            if (
                before is not None
                and before.start_time_ticks != host.start_time_ticks  # (the cheap test first: they rarely differ)
                and process_key(before) != process_key(host)
            ):  # the pid names another process now
                reused.append(before)
                before = None
            if before is not None:
                carried += 1
                delta = now_s - (before.cpu_time_s or 0.0)
            elif since is not None and started_since(host, since):
                delta = now_s  # its first tick counts
            else:
                delta = 0.0
            if delta > 0:  # a process that used no CPU time has no share (its series, if any, runs at 0 W)
                keys.append(process_key(host))
                listings.append(host)
                cpu_s.append(delta)
        exited: AbstractSet[tuple[int, int]] = frozenset()
        if carried < len(previous):
            gone = [previous[pid] for pid in previous.keys() - hosts.keys()]
            exited = {process_key(h) for h in gone + reused}
        self._hosts = hosts
        self._last_s = batch.time.monotonic_s  # when the readings the next deltas start from were taken
        return _Weights(keys, listings, cpu_s, listed=True, exited=exited)

    # --- the split ---------------------------------------------------------------------------------

    def _split(
        self, batch: Batch, ratio: float | None, weights: _Weights, hosts: Mapping[int, HostProcess]
    ) -> tuple[list[DevicePower], TickShares]:
        """Each zone's idle and active; the active energy of the zones split alike shared by CPU time once per
        group (a zone type's zones read last tick: by the tick's deltas; those back from one gap: by its deltas,
        and the gap's usage ratio), so a process's shares in a group are one apportioning; a zone's whole
        active energy is either attributed or unattributed."""
        samples = sorted(batch.cpu_zones, key=lambda z: z.path)
        per_type = self._per_type(samples)
        node = batch.node_cpu[0] if batch.node_cpu else None
        parts: list[_Part] = []
        groups: dict[tuple[str, int], tuple[int, float]] = {}  # (zone type, gap's tick or -1) → active, interval
        gap_paths: set[str] = set()
        spans: dict[str, float] = {}  # zone type → the interval its split spans, where energy held was released
        for sample in samples:
            previous, self._zones[sample.path] = self._zones.get(sample.path), sample
            read_tick, self._zone_tick[sample.path] = self._zone_tick.get(sample.path, 0), self._tick
            if previous is None or previous.counter_epoch != sample.counter_epoch:
                continue  # a baseline (first reading, or after a reset): no energy yet
            energy_mj = sample.energy_uj // 1000 - previous.energy_uj // 1000  # floors telescope: nothing lost
            if energy_mj < 0:
                continue  # went backwards in one epoch: the receiver should have said reset; not energy
            interval_s = sample.time.monotonic_s - previous.time.monotonic_s
            # A zone that missed ticks: split by the CPU time used since it was last read (processors/_cpu_gap.py).
            gap = self._gaps.open.get(read_tick)
            if gap is None:
                zone_ratio = ratio
                part = self._part(sample, energy_mj, interval_s, per_type[sample.zone], ratio, weights, False)
            else:
                gap_paths.add(sample.path)
                zone_ratio = gap.ratio(node)
                cpu_s = None if gap.cpu_s is None or interval_s > _ZONE_GONE_AFTER_S else list(gap.cpu_s.values())
                part = self._part(sample, energy_mj, interval_s, per_type[sample.zone], zone_ratio, weights, cpu_s)
            # (held where read last tick: a gap opening now for another zone read then is keyed by that tick too)
            read = read_tick == self._tick - 1
            part, span_s = self._settle(part, zone_ratio, weights.listed, read, batch.time.monotonic_s)
            parts.append(part)
            if part.split:  # (with the energy held for it: the deltas span its ticks too)
                group = (sample.zone, -1 if gap is None else read_tick)
                active, group_s = groups.get(group, (0, span_s))
                groups[group] = (active + part.active_mj, group_s)
                if group_s > interval_s and gap is None:
                    spans[sample.zone] = group_s
        powers = [self._power(batch.time, *part) for part in parts]
        if self._holds.zones:  # a zone gone for good with energy held: into its totals, unattributed
            for path, held in self._holds.expired(self._zones, batch.time.monotonic_s - GAP_MAX_S).items():
                totals = self.zone_totals[path]
                totals.energy_mj, totals.active_mj = totals.energy_mj + held.mj, totals.active_mj + held.mj
                totals.unattributed_mj += held.mj
        return powers, self._shares(batch, powers, groups, weights, hosts, gap_paths, spans)

    def _settle(self, part: _Part, ratio: float | None, listed: bool, read: bool, now_s: float) -> tuple[_Part, float]:
        """A zone's held energy (processors/_cpu_hold.py): released where the listing answered, or has failed for
        longer than GAP_MAX_S; else the tick's held where the zone was ``read`` last tick (not back from a gap:
        its energy may span more than the next listing's deltas) and a listing answered before. The part as its
        record says it, and the interval its active energy spans."""
        if listed and not self._holds.zones:
            return part, part.interval_s  # nothing held, none to hold: the common tick
        lately = self._last_s is not None and now_s - self._last_s <= GAP_MAX_S
        tick = Settled(part.idle_mj, part.active_mj, 0, part.interval_s)
        out = self._holds.settle(
            part.sample.path, tick, ratio, release=listed or not lately, hold=read, idle_known=part.idle_known
        )
        return part._replace(idle_mj=out.idle_mj, active_mj=out.active_mj, held_mj=out.held_mj), out.span_s

    def _per_type(self, samples: list[CpuZoneSample]) -> dict[str, int]:
        """Zones per type, every zone read lately: one that did not answer this tick keeps its share of idle_w;
        one not read for _ZONE_GONE_AFTER_S (removed: an mmio twin replaced by its MSR zone) gives it back."""
        since_s = max((z.time.monotonic_s for z in samples), default=0.0) - _ZONE_GONE_AFTER_S
        zone_of = {path: z.zone for path, z in self._zones.items() if z.time.monotonic_s >= since_s}
        zone_of |= {z.path: z.zone for z in samples}
        per_type: dict[str, int] = {}
        for zone in zone_of.values():
            per_type[zone] = per_type.get(zone, 0) + 1
        return per_type

    def _part(
        self,
        sample: CpuZoneSample,
        energy_mj: int,
        interval_s: float,
        zones_of_type: int,
        ratio: float | None,
        weights: _Weights,
        gap_cpu_s: list[float] | Literal[False] | None,
    ) -> _Part:
        """One zone's split: ``gap_cpu_s`` False for a zone read last tick (the tick's deltas and ratio), else it
        is back from a gap: ``ratio`` the gap's, the deltas summed over it (None: longer than the bound)."""
        gap = gap_cpu_s is not False
        zone_idle = self._zone_idle(sample, zones_of_type, energy_mj, interval_s, None if gap else ratio)
        idle_mj = None if zone_idle is None else round(zone_idle.idle_w * interval_s * 1000)
        idle, active = idle_active(energy_mj, ratio, idle_mj)
        idle_known = ratio is not None or idle_mj is not None
        why: _Unattributable = None
        if not (weights.listed and idle_known):
            why = "processes_unknown"
        elif gap_cpu_s is None:
            why = "gap"
        cpu_s = weights.cpu_s if gap_cpu_s is False else gap_cpu_s or []
        cpu_s = [*cpu_s, *weights.unseen.seconds] if weights.unseen.seconds and gap_cpu_s is False else cpu_s
        split = gap_cpu_s is not None and splittable(cpu_s, ratio, idle_mj, weights.listed)
        return _Part(sample, interval_s, idle, active, split, why, zone_idle, idle_known, energy_mj)

    def _shares(
        self,
        batch: Batch,
        powers: list[DevicePower],
        groups: dict[tuple[str, int], tuple[int, float]],
        weights: _Weights,
        hosts: Mapping[int, HostProcess],
        gap_paths: set[str],
        spans: Mapping[str, float],
    ) -> TickShares:
        """The tick's shares per zone type; where a zone came back from a gap, merged with the gap's processes'
        (and their watts over their own intervals, and the late shares of those that exited meanwhile); ``spans``:
        the zone types whose split took energy held over failed listings, and the interval it spans."""
        # The watts are over the interval of the energy that was split (a gap's is longer, or held energy's).
        interval_s = next((p.interval_s for p in powers if p.device_id not in gap_paths), batch.interval_s)
        interval_s = max(interval_s, *spans.values()) if spans else interval_s
        intervals = self._intervals(powers) | dict(spans)
        split_zones = frozenset(intervals)  # the zone types split: those with an interval
        read_zones = frozenset(p.device_name or "" for p in powers)
        if all(since < 0 for _, since in groups):  # no zone back from a gap: the tick's deltas alone
            by_zone, unseen = split_active(groups, weights.cpu_s, weights.unseen.seconds)
            return TickShares(
                interval_s, weights.keys, weights.hosts, by_zone, weights.exited, split_zones, read_zones, intervals
            ).with_unseen(weights.unseen.records, unseen)
        m = merge_shares(weights.keys, weights.hosts, weights.cpu_s, groups, self._gaps.open, hosts)
        span_s = max(span_s for _, span_s in groups.values())  # a series begun now began within the gap (its start)
        return TickShares(
            span_s, m.keys, m.hosts, m.by_zone, weights.exited, split_zones, read_zones, intervals, m.watts, m.late
        )

    def _absent(self, batch: Batch) -> dict[int, float]:
        """The zones this tick did not read: the tick each was last read in, and when (the gaps open now)."""
        zones = self._zones
        if len(batch.cpu_zones) == len(zones) and all(z.path in zones for z in batch.cpu_zones):
            return {}
        read = {z.path for z in batch.cpu_zones}
        return {self._zone_tick[path]: z.time.monotonic_s for path, z in zones.items() if path not in read}

    def _zone_idle(
        self, sample: CpuZoneSample, zones_of_type: int, energy_mj: int, interval_s: float, ratio: float | None
    ) -> ZoneIdle | None:
        """The idle mode's idle for this zone and tick (None: split by the usage ratio); learned from the tick
        where ``ratio`` is given (not over a zone's gap: the ratio is the last tick's, the power the gap's)."""
        if self._idles is None:
            return None
        if ratio is not None and interval_s > 0 and self._idles.learns(sample.zone):
            self._idles.observe(
                sample.zone, sample.path, sample.time.monotonic_s, ratio, energy_mj / interval_s / 1000.0
            )
        return self._idles.idle(sample.zone, sample.path, zones_of_type)

    def _power(
        self,
        now: Timestamp,
        sample: CpuZoneSample,
        interval_s: float,
        idle_mj: int,
        active_mj: int,
        split: bool,
        why: _Unattributable,
        zone_idle: ZoneIdle | None,
        idle_known: bool,
        energy_mj: int,
        held_mj: int,
    ) -> DevicePower:
        """The zone's tick record, and its totals. ``split``: its active energy went to processes (else it is
        unattributed); ``why`` marks the tick unattributable: ``processes_unknown`` (the listing failed, or the
        ratio is not known), ``gap`` (the zone missed ticks); ``idle_known`` False (no ratio, no idle): the idle
        watts are absent, all is active. ``held_mj``: the level held after the tick (processors/_cpu_hold.py):
        idle and active are what the tick settled, so ``energy`` is the counter's delta, not their sum."""
        totals = totals_for(self.zone_totals, sample, now.wall_s - interval_s, self.ctx.logger)
        totals.energy_mj += idle_mj + active_mj
        totals.idle_mj += idle_mj
        totals.active_mj += active_mj
        if not split:
            totals.unattributed_mj += active_mj
        per_s = 1.0 / interval_s / 1000.0 if interval_s > 0 else 0.0
        return DevicePower(
            time=now,
            extra=totals.extra,
            device_id=sample.path,
            device_type="cpu",
            device_index=sample.socket,
            device_name=sample.zone,
            interval_s=interval_s,
            power_w=energy_mj * per_s,
            idle_w=idle_mj * per_s if idle_known else None,
            active_w=active_mj * per_s,
            energy_mj=energy_mj,
            idle_energy_mj=idle_mj,
            active_energy_mj=active_mj,
            unattributable=why,
            held_energy_mj=held_mj,
            idle_source=None if zone_idle is None else zone_idle.source,
            idle_uncertainty_w=None if zone_idle is None else zone_idle.uncertainty_w,
        )

    def _device_totals(self, now: Timestamp) -> tuple[DeviceTotals, ...]:
        return device_totals(self.zone_totals, now)


factory = Factory.of(
    CpuAttributionProcessor,
    type="cpu_attribution",
    kind="processor",
    config_model=CpuAttributionConfig,
    description="RAPL zone energy split idle/active by the node's CPU usage ratio and billed to processes, "
    "containers, pods and VMs by CPU time (seed 002, Kepler's model).",
    stability="alpha",
    provides=frozenset({"device_power", "device_totals", "totals"}),
)
