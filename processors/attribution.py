"""Processor ``attribution``: split each device's active energy of a tick among the processes that used it.

How, per device and tick (re-decided every tick, so a change of sharing mode is honoured at once):

- **exclusive** (compute mode EXCLUSIVE_PROCESS, or a single process): that process gets it all;
- **time_slicing** (and MPS, as an approximation: MPS clients run concurrently, and SM utilisation
  per client is what the driver reports): shares by each process's SM utilisation integrated over the
  tick (the nvml receiver's ``sm_util``); when every share is zero but processes run, or utilisation is
  unavailable, an equal split. With ``model: learned``, by each process's fitted watts per unit of SM and
  memory utilisation × its utilisations, wherever the fit is identifiable (``_learned.py``; the share
  says which in ``model``);
- **mig**: by instance (dcgm-exporter's activity × compute slices), then equally inside an instance;
  while the dcgm receiver dates its samples, each tick's energy is held until the sample covering it
  arrives and split by that sample (exact for any collection interval; released up to one collection
  interval and a scrape later). See ``_mig_attribution``;
- **none**: no process: the active energy is *unattributed*, carried by an explicit record
  (``pid=None``) so it is never silently lost. So is the energy of a tick the idle processor marks
  unattributable (mode ``gap``: it spans a long outage; ``processes_unknown``: the process listing
  failed): nobody can say who used it, and guessing would bill someone for it. Every device has that record every tick (0 mJ when its
  processes carried everything), so the remainder is an observed value, never an absent one.

Conservation is exact, in integer millijoules: shares are apportioned by the largest-remainder
method, so Σ process mJ + unattributed mJ == active mJ, and with the idle part == the counter's delta.
A process is attributed from its first tick.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import Field

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.constructors import new_share
from wattpipe.pipeline.records import (
    DevicePower,
    DeviceSample,
    GpuProcessSample,
    GpuShare,
    HostProcess,
    InstanceEnergy,
    MigInstance,
    ShareModel,
    SharingMode,
)
from wattpipe.processors._idle_hold import HeldTick, IdleHold, Process, Released
from wattpipe.processors._learned import LearnedConfig, LearnedModel, Reason, row_of
from wattpipe.processors._mig_attribution import MigAttribution, late_share, late_shares
from wattpipe.processors.attribution_math import apportion, fractions, since_start

__all__ = ["AttributionConfig", "AttributionProcessor", "apportion", "factory"]


class AttributionConfig(ComponentConfig):
    activity_hold: Duration = 60.0
    """MIG: how long an instance's last activity stands in when dcgm-exporter stops answering."""
    mig_max_wait: Duration = 90.0
    """MIG: the longest a tick's energy is held for dcgm-exporter's sample covering it (normally one
    collection interval and a scrape); then it is split by the latest activity. 0: never held."""
    model: Literal["utilisation", "learned"] = "utilisation"
    """time_slicing: split by SM utilisation (as Kepler does), or by each process's learned watts per unit of
    utilisation where a fit over the window identifies them (utilisation shares where not)."""
    learned: LearnedConfig = Field(default_factory=LearnedConfig)
    idle_wait: Duration = Field(default=90.0, ge=0)
    """While a device's idle power is not known yet but may still be learned (idle mode auto), each tick's
    energy is held (with its split) and released once idle is known, its idle part taken off. Held at most
    this long (its first held tick, since it ended): then released all as active, and no more held. 0: never.
    Keep the energy processor's ``late_energy_wait`` above it plus a tick."""


class AttributionProcessor:
    needs = frozenset({"device_power", "gpu_processes"})
    provides = frozenset({"shares", "instance_energy"})

    def __init__(self, config: AttributionConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx
        self.log = ctx.logger
        self._mig = MigAttribution(config.activity_hold, config.mig_max_wait, ctx.logger)
        self._idle = IdleHold(config.idle_wait, ctx.logger)
        self._learned = LearnedModel(config.learned) if config.model == "learned" else None
        self._reasons: dict[str, Reason] = {}  # each device's last learned-model outcome (logged when it changes)

    # --- state -------------------------------------------------------------------------------

    def start(self) -> None:
        """Hold again the energy held at the last checkpoint (idle not known yet; a MIG tick waiting for
        dcgm-exporter): measured, in no process total yet. The waits go on from the held ticks' own times, so a
        device that does not answer after the restart is released once they are over (see ``_unanswered``)."""
        saved = self.ctx.state.section(self.ctx.state_key)
        if not saved:
            return
        missing = sorted({"idle_hold", "mig_hold"} - saved.keys())
        if missing:
            raise ValueError(f"not an attribution section: it has no {' and no '.join(missing)}")
        now = self.ctx.clock.now()
        offset_s = now.wall_offset_s
        ahead_s = max((t - now.wall_s for t in _wall_times(saved)), default=0.0)
        if ahead_s > 1.0:  # saved before the stop, yet after now: the wall clock stepped back since
            self.log.warning(
                "state file: held ticks end up to %.0f s after now (the wall clock stepped back?): taken as ending "
                "now, their waits going on from there",
                ahead_s,
            )
            offset_s += ahead_s
        idle = IdleHold(self.config.idle_wait, self.log)
        idle.load(saved["idle_hold"], offset_s)
        mig = MigAttribution(self.config.activity_hold, self.config.mig_max_wait, self.log)
        mig.load(saved["mig_hold"], offset_s)
        self._idle, self._mig = idle, mig  # all or nothing
        held = {dev: idle.held_mj(dev) for dev in idle.devices()}
        if held or saved["mig_hold"]:
            self.log.info(
                "held energy restored: %s (idle not known); MIG ticks of %d devices",
                ", ".join(f"{mj / 1000:g} J of {dev}" for dev, mj in held.items()) or "none",
                len(saved["mig_hold"]),
            )

    def snapshot(self) -> dict[str, Any]:
        now = self.ctx.clock.now()
        offset_s = now.wall_offset_s
        return {"idle_hold": self._idle.dump(offset_s), "mig_hold": self._mig.dump(offset_s)}

    # --- the tick ----------------------------------------------------------------------------

    def process(self, batch: Batch) -> Batch:
        devices = {d.device_id: d for d in batch.devices}
        by_device: dict[str, list[GpuProcessSample]] = {}
        # A receiver lists a device's processes together: grouped by runs (in C), then merged per device.
        for device_id, run in itertools.groupby(batch.gpu_processes, key=_DEVICE):
            by_device.setdefault(device_id, []).extend(run)
        instances: dict[str, dict[int, MigInstance]] = {}
        for inst in batch.mig_instances:
            instances.setdefault(inst.device_id, {})[inst.gpu_instance_id] = inst
        activity: dict[str, dict[int, float]] = {}
        for a in batch.mig_activity:
            value = a.gr_engine_active if a.gr_engine_active is not None else a.sm_active
            if value is not None:
                activity.setdefault(a.device_id, {})[a.gpu_instance_id] = value
        shares: list[GpuShare] = []
        instance_energy: list[InstanceEnergy] = []
        if self._learned is not None:
            self._learned.begin_tick()
        # When each process started (procfs): one that started inside the tick is weighed from its start.
        starts = {h.pid: h.start_wall_s for h in batch.host_processes if h.start_wall_s is not None}
        powers: list[DevicePower] = []
        for power in batch.device_power:
            if power.device_type != "gpu":
                powers.append(power)  # a CPU zone (cpu_attribution earlier in the pipeline): not this processor's
                continue
            dev = power.device_id
            procs = by_device.get(dev, [])
            device = devices.get(dev)
            mig = self._mig.holding(dev, device) or (
                power.unattributable is None and self._mode(device, procs) == "mig"
            )
            drained = False
            if mig:
                tick, per_instance = self._mig.split(power, procs, instances.get(dev, {}), activity.get(dev, {}), batch)
                instance_energy.extend(per_instance)
            elif power.unattributable is not None:
                tick = [_unattributed(power, power.unattributable)]
            else:
                own = self._device(power, device, procs, starts)
                tick = self._mig.drained(dev, power, own)
                # A tick that carries what a MIG hold released is not idle-held: holding zeroes its shares'
                # energy, and the released part (earlier ticks', not in this tick's energy) was lost.
                drained = tick is not own
            holdable = not mig and not drained and not (device is not None and device.mig_enabled)
            tick, power = self._idle_held(power, tick, batch.host_processes, holdable=holdable)
            shares.extend(tick)
            powers.append(power)
        late, late_instances = self._unanswered(batch, {p.device_id for p in powers})
        shares.extend(late)
        instance_energy.extend(late_instances)
        return batch.replace(
            shares=batch.shares + tuple(shares),
            instance_energy=batch.instance_energy + tuple(instance_energy),
            # The same tuple where no record changed (nothing held, nothing released).
            device_power=self._mig.with_held(
                batch.device_power if all(map(operator.is_, powers, batch.device_power)) else tuple(powers)
            ),
        )

    def _idle_held(
        self, power: DevicePower, tick: list[GpuShare], hosts: tuple[HostProcess, ...], *, holdable: bool
    ) -> tuple[list[GpuShare], DevicePower]:
        """The tick's shares and record with the idle hold applied (processors/_idle_hold.py): this tick held
        while idle is pending, or what was held released into it once idle is known (or the wait is over).
        ``hosts``: procfs's processes, whose start times tell which process had a pid."""
        dev = power.device_id
        hold = self._idle
        processes = [s for s in tick if s.pid is not None]
        if (
            holdable
            and power.idle_w is None
            and power.idle_pending
            and power.unattributable is None
            and processes
            and hold.may_hold(dev)
            and not hold.due(dev, power.time.monotonic_s)
        ):
            fracs = fractions([s.share for s in processes])
            start_of = _start_ticks(hosts)
            starts = tuple(start_of.get(s.pid) for s in processes if s.pid is not None)
            hold.hold(
                dev,
                HeldTick(
                    power.time.monotonic_s,
                    power.interval_s,
                    power.active_energy_mj + power.idle_energy_mj,
                    tuple(s.pid for s in processes if s.pid is not None),
                    tuple(fracs),
                    processes[0].mode,
                    starts if any(start is not None for start in starts) else (),
                ),
            )
            # Watts stay the provisional split (the best estimate of now); the energy waits.
            held = [dataclasses.replace(s, energy_mj=0) for s in tick]
            level = hold.held_mj(dev)
            return held, dataclasses.replace(power, idle_energy_mj=0, active_energy_mj=0, held_energy_mj=level)
        if not hold.holding(dev):
            return tick, power
        if power.idle_w is not None:
            released = hold.take(dev, power.idle_w)
        elif not holdable or hold.due(dev, power.time.monotonic_s) or not hold.may_hold(dev):
            if holdable:
                hold.give_up(dev, f"not learned within idle_wait {self.config.idle_wait:g} s")
            released = hold.take(dev, None)
        elif not power.idle_pending:
            released = hold.take(dev, None)
        else:
            # Idle pending still, but this tick is not held (unattributable, free, or idle no longer learnable):
            # what was held waits on.
            return tick, dataclasses.replace(power, held_energy_mj=hold.held_mj(dev))
        return _merged(tick, released, power, _start_ticks(hosts)), dataclasses.replace(
            power,
            idle_energy_mj=power.idle_energy_mj + released.idle_mj,
            active_energy_mj=power.active_energy_mj + released.active_mj,
            held_energy_mj=hold.held_mj(dev),
        )

    def _unanswered(self, batch: Batch, answered: set[str]) -> tuple[list[GpuShare], list[InstanceEnergy]]:
        """What the idle hold keeps for devices with no DevicePower this tick (down, or lost for good) whose
        first held tick has waited ``idle_wait``: released as the wait's end releases it (all active, by the held
        ticks' own shares), and no more held. As late shares (no watts, share 0): the device has no tick to carry
        them. Its held level falls by their energy (no energy and no idle this tick), as the energy processor
        counts it. Then what the MIG holds of such devices release past ``mig_max_wait`` (``_mig.unanswered``)."""
        now = batch.time
        out, per_instance = self._mig.unanswered(answered, now)
        for dev in self._idle.devices():
            if dev in answered or not self._idle.due(dev, now.monotonic_s):
                continue
            self._idle.give_up(
                dev, f"the device has not answered since; not learned within idle_wait {self.config.idle_wait:g} s"
            )
            mode = self._idle.mode(dev)
            released = self._idle.take(dev, None)
            # (a held tick always has processes: its remainder is kept for conservation)
            out += late_shares(now, dev, mode, {}, unattributed_mj=released.unattributed_mj)
            out += _late(now, dev, mode, released.by_process or {})
        return out, per_instance

    def _mode(self, device: DeviceSample | None, procs: list[GpuProcessSample]) -> SharingMode:
        if not procs:
            return "none"
        if device is not None and device.mig_enabled:
            return "mig"
        if len(procs) == 1 or (device is not None and device.compute_mode == "exclusive_process"):
            return "exclusive"
        return "time_slicing"

    def _device(
        self, power: DevicePower, device: DeviceSample | None, procs: list[GpuProcessSample], starts: dict[int, float]
    ) -> list[GpuShare]:
        # One record per pid: a driver listing a pid twice (two contexts) must not double its weight.
        # (Built from the end, so the first record of a pid is the one that stays.)
        unique = dict(zip(map(_PID, reversed(procs)), reversed(procs), strict=True))
        procs = sorted(unique.values(), key=_PID)
        mode = self._mode(device, procs)
        time, device_id, interval_s = power.time, power.device_id, power.interval_s
        if mode == "none":
            return [_unattributed(power, mode)]
        model: ShareModel | None = "utilisation" if self._learned is not None and mode == "time_slicing" else None
        utilisation = list(map(_SM_UTIL, procs))
        if mode == "exclusive" and len(procs) > 1:
            # EXCLUSIVE_PROCESS yet several listed (a process just exiting as another starts): by utilisation.
            weights = [u or 0.0 for u in utilisation]
        elif None not in utilisation:
            weights = utilisation  # no None in it
            if starts:
                weights = _from_start(procs, weights, starts)
            if self._learned is not None:
                weights, model = self._learn(power, procs, weights, mode)
        else:
            # Utilisation unavailable for some: no basis to weigh them but the part of the tick they existed.
            tick_start_s = power.time.wall_s - interval_s
            weights = [since_start(1.0, 1.0, starts.get(p.pid), tick_start_s, interval_s) for p in procs]
        frac = fractions(weights)
        parts = apportion(power.active_energy_mj, frac)
        # The remainder is explicit every tick: here the processes carried it all, so it is an observed 0.
        remainder = GpuShare(
            time=time, device_id=device_id, pid=None, share=0.0, energy_mj=0, power_w=0.0, mode=mode, model=model
        )
        return [remainder] + [
            new_share(
                time, (), device_id, p.pid, fraction, mj, mj / 1000.0 / interval_s, mode, p.gpu_instance_id, model, None
            )
            for p, fraction, mj in zip(procs, frac, parts, strict=True)
        ]

    def _learn(
        self, power: DevicePower, procs: list[GpuProcessSample], weights: list[float], mode: SharingMode
    ) -> tuple[list[float], ShareModel | None]:
        """The learned weights of a time-sliced tick where the fit has them, else ``weights`` (utilisation).
        Every tick with known utilisation adds to the device's window, an exclusive one too (it shows its
        process's watts alone), but only a time-sliced tick's split is changed."""
        assert self._learned is not None
        dev = power.device_id
        learned: dict[int, float] | None = None
        reason: Reason = "too_many_processes"
        if not self._learned.crowded(dev, len(procs)):
            busy = {p.pid: (w, p.mem_util or 0.0) for p, w in zip(procs, weights, strict=True)}
            row = row_of(power.time.monotonic_s, power.interval_s, power.energy_mj / 1000.0 / power.interval_s, busy)
            learned, reason = self._learned.weights(dev, row, power.idle_w, busy)
        if mode != "time_slicing":
            return weights, None
        if reason != self._reasons.get(dev):
            level = logging.INFO if "learned" in (reason, self._reasons.get(dev)) else logging.DEBUG
            self.log.log(level, "device %s: time-slicing shares by %s", dev, _REASON_TEXT[reason])
            self._reasons[dev] = reason
        if learned is None:
            return weights, "utilisation"
        return [learned[p.pid] for p in procs], "learned"


def _from_start(procs: list[GpuProcessSample], weights: list[float], starts: dict[int, float]) -> list[float]:
    """Each weight less the part of its window before its process started (see ``since_start``)."""
    out = list(weights)
    for i, p in enumerate(procs):
        start_s = starts.get(p.pid)
        if start_s is not None and p.util_window_s:
            out[i] = since_start(out[i], p.sm_util_busy, start_s, p.time.wall_s - p.util_window_s, p.util_window_s)
    return out


def _merged(
    tick: list[GpuShare], released: Released, power: DevicePower, start_of: Mapping[int, int]
) -> list[GpuShare]:
    """This tick's shares with released held energy added: to the share of the process it was held for, to the
    remainder, and as late shares (no watts, share 0) of the processes not in this tick. A process is its pid,
    and its start time where procfs gave one then and gives one now (``start_of``): energy held for a pid's
    process that has another start time now (or none known) is late, carrying its start (see ``_late``)."""
    owed = dict(released.by_process or {})
    out = []
    for s in tick:
        if s.pid is None:
            extra = released.unattributed_mj
        else:
            now_start = start_of.get(s.pid)
            mine = [p for p in owed if p[0] == s.pid and p[1] in (None, now_start)] if owed else []
            extra = sum(map(owed.pop, mine))
        out.append(dataclasses.replace(s, energy_mj=s.energy_mj + extra) if extra else s)
    if released.unattributed_mj and not any(s.pid is None for s in tick):
        out.insert(
            0,
            dataclasses.replace(
                _unattributed(power, "none"), share=0.0, energy_mj=released.unattributed_mj, power_w=0.0
            ),
        )
    return out + _late(power.time, power.device_id, tick[0].mode if tick else "none", owed)


def _late(time: Timestamp, device_id: str, mode: SharingMode, owed: Mapping[Process, int]) -> list[GpuShare]:
    """Late shares (no watts, share 0) of energy held for processes, by pid (then start time), each with the
    process's start time where it was known: the energy processor adds it to that process's series, not to
    a later one's of its pid."""
    return [
        late_share(time, device_id, mode, pid, mj, start_time_ticks=start)
        for (pid, start), mj in sorted(owed.items(), key=_process_order)
        if mj > 0
    ]


def _process_order(item: tuple[Process, int]) -> tuple[int, int]:
    """Late shares' order: by pid, then start time (an unknown one first)."""
    (pid, start), _ = item
    return pid, -1 if start is None else start


def _start_ticks(hosts: tuple[HostProcess, ...]) -> dict[int, int]:
    """Each pid's process start time, where procfs gave one."""
    return {h.pid: h.start_time_ticks for h in hosts if h.start_time_ticks is not None}


def _unattributed(power: DevicePower, mode: SharingMode) -> GpuShare:
    """The device's whole active energy as the explicit remainder: no process to carry it (``none``), or
    no basis to tell which did (``gap``, ``processes_unknown``; see DevicePower.unattributable)."""
    return GpuShare(
        time=power.time,
        device_id=power.device_id,
        pid=None,
        share=1.0,
        energy_mj=power.active_energy_mj,
        power_w=power.active_energy_mj / 1000.0 / power.interval_s,
        mode=mode,
    )


_REASON_TEXT: dict[Reason, str] = {
    "learned": "learned watts per unit of utilisation",
    "idle_unknown": "utilisation (learned model: idle power not known yet)",
    "too_many_processes": "utilisation (learned model: more processes than learned.max_processes)",
    "few_ticks": "utilisation (learned model: too few ticks in the window yet)",
    "collinear": "utilisation (learned model: loads have not varied independently)",
    "poor_fit": "utilisation (learned model: the fit does not explain the device's power)",
    "uncertain": "utilisation (learned model: coefficients too uncertain for this tick's busy processes)",
}
_PID = operator.attrgetter("pid")

_DEVICE = operator.attrgetter("device_id")
_SM_UTIL = operator.attrgetter("sm_util")


factory = Factory.of(
    AttributionProcessor,
    type="attribution",
    kind="processor",
    config_model=AttributionConfig,
    description="Splits each device's active energy among its processes by sharing mode; exact, with the remainder explicit.",
    stability="alpha",
    provides=frozenset({"shares", "instance_energy"}),
)


def _wall_times(saved: object) -> Iterator[float]:
    """Every wall time (a ``…_wall_s`` number) in a saved attribution section, at any depth."""
    if isinstance(saved, Mapping):
        for key, value in saved.items():
            if str(key).endswith("_wall_s") and isinstance(value, int | float) and not isinstance(value, bool):
                yield float(value)
            else:
                yield from _wall_times(value)
    elif isinstance(saved, list):
        for value in saved:
            yield from _wall_times(value)
