"""The MIG part of the ``attribution`` processor: per device, which activity to split by, and the hold.

Each tick of a MIG GPU is split by instance (activity × compute slices, ``_mig_shares``). Where the dcgm
receiver says when its samples were collected (it does from its first scrape), the tick's energy is held
until the sample covering it arrives and split by that sample (``_mig_window``): exact for any
collection interval, released late. The records of a tick then say two things:

- ``energy_mj``: the energy released this tick, for whatever earlier ticks it belongs to. A process
  that has exited since a held tick gets a share of its own, with ``power_w`` 0: it is not running;
- ``power_w``: this tick's power, split by the latest activity: the best estimate of *now*, so watts do
  not jump to 0 while energy is held and back up when it is released. Σ ``power_w`` is still the
  device's active watts.

The energy held at the end of a tick is on the device's DevicePower (``held_energy_mj``): per tick,
Σ shares + idle + the change of the held energy == the counter's delta, exactly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Container, Mapping, Sequence
from typing import Any

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import (
    DevicePower,
    DeviceSample,
    GpuProcessSample,
    GpuShare,
    InstanceEnergy,
    MigInstance,
    SharingMode,
)
from wattpipe.processors._mig_shares import (
    Group,
    MigSplit,
    instance_parts,
    members_of,
    split_members,
    unreported,
)
from wattpipe.processors._mig_window import Collection, Hold, Release

__all__ = ["MIG_MODES", "MigAttribution", "late_share", "late_shares"]

_MODES: dict[str, str] = {
    "mig": "shares by each instance's activity × compute slices (dcgm-exporter)",
    "mig_held": "dcgm-exporter is not answering: holding each instance's last activity",
    "mig_slices": "no instance activity: splitting by compute slices over the instances with processes",
    "mig_equal": "no instance activity or layout: splitting equally over the instances with processes",
}
MIG_MODES: frozenset[str] = frozenset(_MODES)
"""How a MIG device's energy may be split: never held for idle, and a MIG hold's release is active already."""


class MigAttribution:
    """State per MIG device: the last activity (for outages), the mode logged, the held ticks."""

    def __init__(self, activity_hold_s: float, max_wait_s: float, log: logging.Logger) -> None:
        self.activity_hold_s = activity_hold_s
        self.max_wait_s = max_wait_s
        self.log = log
        self._last: dict[str, tuple[dict[int, float], float]] = {}  # device → (activity by GI, when read)
        self._mode: dict[str, SharingMode] = {}
        self._holds: dict[str, Hold] = {}
        self._new_s: dict[str, float] = {}  # device → when a new dcgm-exporter collection was last seen
        self._stale: set[str] = set()  # devices whose exporter repeats an overdue collection (warned)
        self._unreported: set[tuple[str, int]] = set()  # instances with processes and no activity (warned)

    def holding(self, device_id: str, device: DeviceSample | None) -> bool:
        """Energy of this MIG device is held: its ticks go through :meth:`split` even without processes."""
        hold = self._holds.get(device_id)
        return hold is not None and bool(hold.ticks) and device is not None and bool(device.mig_enabled)

    def split(
        self,
        power: DevicePower,
        procs: Sequence[GpuProcessSample],
        instances: dict[int, MigInstance],
        activity: dict[int, float],
        batch: Batch,
    ) -> tuple[list[GpuShare], list[InstanceEnergy]]:
        dev = power.device_id
        activity = self._fresh(dev, power.time.monotonic_s, activity, batch)
        activity, mode = self._activity(dev, power.time.monotonic_s, activity, bool(instances))
        slices = {gi: inst.compute_slices for gi, inst in instances.items()}
        unique = sorted({p.pid: p for p in procs}.values(), key=lambda p: p.pid)
        members = members_of([(p.pid, p.gpu_instance_id) for p in unique])
        if power.unattributable is not None:
            # Nobody can say who used this tick's energy: released at once, unattributed.
            provisional: dict[Group, int] = {None: power.active_energy_mj}
            members, mode = {}, power.unattributable
        else:
            weight_of = {gi: a * (slices.get(gi) or 1) for gi, a in activity.items()}
            self._warn_unreported(dev, unreported(weight_of, members))
            provisional = instance_parts(power.active_energy_mj, members, slices, weight_of)
            mode = mode if unique else "none"
        release = self._release(power, provisional, members, batch, slices)
        rate = split_members(provisional, members)
        return _records(power, mode, unique, instances, activity, release, rate)

    def drained(self, device_id: str, power: DevicePower, shares: list[GpuShare]) -> list[GpuShare]:
        """``shares`` of a device that is no longer MIG, with whatever it still held released into them."""
        hold = self._holds.pop(device_id, None)
        if hold is None or not hold.ticks:
            return shares
        hold.release_all()
        by_pid, group_of, unattributed_mj = hold.take().processes()
        out = [
            dataclasses.replace(s, energy_mj=s.energy_mj + (unattributed_mj if s.pid is None else by_pid.pop(s.pid, 0)))
            for s in shares
        ]
        return out + late_shares(power.time, power.device_id, shares[0].mode, by_pid, group_of)

    def unanswered(self, answered: set[str], now: Timestamp) -> tuple[list[GpuShare], list[InstanceEnergy]]:
        """What the holds of devices with no DevicePower this tick (down, or lost for good: ``split`` never runs
        for them again) release: the ticks that have waited ``max_wait``, by their provisional split, as late
        shares and instance energy (no watts, share 0). Their energy is the device's active energy since it was
        measured (only its split waited): the mode (a MIG one) tells the energy processor not to count it again."""
        shares: list[GpuShare] = []
        per_instance: list[InstanceEnergy] = []
        for dev, hold in self._holds.items():
            if dev in answered or not hold.ticks:
                continue
            hold.release_due(now.monotonic_s)
            release = hold.take()
            by_pid, group_of, unattributed_mj = release.processes()
            shares += late_shares(now, dev, self._mode.get(dev, "mig"), by_pid, group_of, unattributed_mj)
            per_instance += [
                InstanceEnergy(time=now, device_id=dev, gpu_instance_id=gi, profile=None, energy_mj=mj, power_w=0.0)
                for gi, mj in sorted((g, mj) for g, mj in release.by_group.items() if g is not None and mj > 0)
            ]
        return shares, per_instance

    def dump(self, wall_offset_s: float) -> dict[str, Any]:
        """Each device's held ticks (``_mig_window.Hold.dump``), for the state file."""
        return {dev: hold.dump(wall_offset_s) for dev, hold in sorted(self._holds.items()) if hold.ticks}

    def load(self, saved: Mapping[str, Any], wall_offset_s: float) -> None:
        """Hold again what :meth:`dump` saved; all or nothing (ValueError naming the device and what)."""
        if not isinstance(saved, Mapping):
            raise ValueError(f"mig_hold is {type(saved).__name__}, not an object of devices")
        holds: dict[str, Hold] = {}
        for dev, row in saved.items():
            try:
                holds[str(dev)] = Hold.load(self.max_wait_s, row, wall_offset_s)
            except ValueError as exc:
                raise ValueError(f"mig_hold of device {dev}: {exc}") from None
        self._holds.update((dev, hold) for dev, hold in holds.items() if hold.ticks)

    def with_held(self, powers: tuple[DevicePower, ...]) -> tuple[DevicePower, ...]:
        """``powers`` with each device's held energy on it (the same tuple when nothing is held)."""
        held = {dev: hold.held_mj for dev, hold in self._holds.items() if hold.ticks}
        if not held:
            return powers
        return tuple(
            dataclasses.replace(p, held_energy_mj=held[p.device_id]) if p.device_id in held else p for p in powers
        )

    def _warn_unreported(self, dev: str, instances: list[int]) -> None:
        for gi in instances:
            if (dev, gi) not in self._unreported:
                self._unreported.add((dev, gi))
                self.log.warning(
                    "device %s (MIG): instance %d has processes but dcgm-exporter reports no activity for it "
                    "(made after dcgm-exporter started? restart it): weighed at the other instances' activity "
                    "per slice",
                    dev,
                    gi,
                )

    def _fresh(self, dev: str, now_s: float, activity: dict[int, float], batch: Batch) -> dict[int, float]:
        """``activity``, or none where dcgm-exporter repeats a collection overdue by more than twice its
        interval (a hung collection serves its last answer for ever): that is silence, as a failed scrape."""
        windows = [a.window_s for a in batch.mig_activity if a.device_id == dev and a.window_s]
        if not activity or not windows:
            return activity
        if dev not in self._new_s or any(
            a.collected_by_s is not None for a in batch.mig_activity if a.device_id == dev
        ):
            self._new_s[dev] = now_s
            self._stale.discard(dev)
            return activity
        if now_s - self._new_s[dev] <= 2 * max(windows):
            return activity
        if dev not in self._stale:
            self._stale.add(dev)
            self.log.warning(
                "device %s (MIG): dcgm-exporter has repeated one collection for %.0f s (its interval is %g s): "
                "its activity is stale, treated as not answering",
                dev,
                now_s - self._new_s[dev],
                max(windows),
            )
        return {}

    def _activity(
        self, dev: str, now_s: float, activity: dict[int, float], layout_known: bool
    ) -> tuple[dict[int, float], SharingMode]:
        """The activity to split this tick by, provisionally: this tick's, else the last one, else none."""
        mode: SharingMode
        if activity:
            self._last[dev] = (activity, now_s)
            mode = "mig"
        else:
            last = self._last.get(dev)
            if last is not None and now_s - last[1] <= self.activity_hold_s:
                activity, mode = last[0], "mig_held"
            else:
                mode = "mig_slices" if layout_known else "mig_equal"
        if self._mode.get(dev) != mode:
            self._mode[dev] = mode
            self.log.log(logging.INFO if mode == "mig" else logging.WARNING, "device %s (MIG): %s", dev, _MODES[mode])
        return activity, mode

    def _release(
        self,
        power: DevicePower,
        parts: dict[Group, int],
        members: dict[Group, list[int]],
        batch: Batch,
        slices: dict[int, int | None],
    ) -> Release:
        """What this tick releases: the held energy that is due, and this tick's own if it is not held."""
        dev, end_s = power.device_id, power.time.monotonic_s
        # Held only while the dcgm receiver answers and dates its samples: else no window may come for
        # this tick, and it is split at once by the held activity (or slices), as before.
        dated = any(a.window_s for a in batch.mig_activity if a.device_id == dev)
        wait = power.unattributable is None and dated and self.max_wait_s > 0
        hold = self._holds.get(dev)
        if hold is None and not wait:
            release = Release()
            release.add(parts, members)
            return release
        if hold is None:
            hold = self._holds[dev] = Hold(self.max_wait_s)
        hold.add((end_s - power.interval_s, end_s), _counters_mj(batch, power), parts, members, wait=wait)
        collection = _collection(batch, dev, slices)
        if collection is not None:
            hold.settle(collection)
        hold.release_due(end_s)
        return hold.take()


def _records(
    power: DevicePower,
    mode: SharingMode,
    unique: list[GpuProcessSample],
    instances: dict[int, MigInstance],
    activity: dict[int, float],
    release: Release,
    rate: MigSplit,
) -> tuple[list[GpuShare], list[InstanceEnergy]]:
    """Energy as released, watts (and ``share``) from this tick's own provisional split ``rate``."""
    time, dev, per_s, active = power.time, power.device_id, 1 / 1000.0 / power.interval_s, power.active_energy_mj
    by_pid, group_of, unattributed_mj = release.processes()
    remainder = GpuShare(
        time=time,
        device_id=dev,
        pid=None,
        share=rate.unattributed_mj / active if active else 0.0,
        energy_mj=unattributed_mj,
        power_w=rate.unattributed_mj * per_s,
        mode=mode,
    )
    shares = [
        GpuShare(
            time=time,
            device_id=dev,
            pid=p.pid,
            share=rate.fraction_by_pid.get(p.pid, 0.0),
            energy_mj=by_pid.get(p.pid, 0),
            power_w=rate.by_pid.get(p.pid, 0) * per_s,
            mode=mode,
            gpu_instance_id=p.gpu_instance_id,
        )
        for p in unique
    ]
    groups = sorted({*rate.by_instance, *(g for g in release.by_group if g is not None)})
    per_instance = [
        InstanceEnergy(
            time=time,
            device_id=dev,
            gpu_instance_id=gi,
            profile=instances[gi].profile if gi in instances else None,
            energy_mj=release.by_group.get(gi, 0),
            power_w=rate.by_instance.get(gi, 0) * per_s,
            activity=activity.get(gi),
        )
        for gi in groups
    ]
    exited = late_shares(time, dev, mode, by_pid, group_of, present={p.pid for p in unique})
    return [remainder, *shares, *exited], per_instance


def late_share(
    time: Timestamp,
    device_id: str,
    mode: SharingMode,
    pid: int | None,
    energy_mj: int,
    *,
    gpu_instance_id: int | None = None,
    start_time_ticks: int | None = None,
) -> GpuShare:
    """A share of energy released late (no tick of its own to split it): no watts, share 0; ``pid`` None: the
    device's remainder."""
    return GpuShare(
        time=time,
        device_id=device_id,
        pid=pid,
        share=0.0,
        energy_mj=energy_mj,
        power_w=0.0,
        mode=mode,
        gpu_instance_id=gpu_instance_id,
        start_time_ticks=start_time_ticks,
    )


def late_shares(
    time: Timestamp,
    device_id: str,
    mode: SharingMode,
    by_pid: Mapping[int, int],
    group_of: Mapping[int, Group] | None = None,
    unattributed_mj: int = 0,
    present: Container[int] = (),
) -> list[GpuShare]:
    """Shares of energy released with no tick of its own to split (held, then released late, or to processes
    no longer listed, those in ``present`` left out): no watts, share 0. The remainder first, when any."""
    shares = [late_share(time, device_id, mode, None, unattributed_mj)] if unattributed_mj else []
    groups = group_of or {}
    return shares + [
        late_share(time, device_id, mode, pid, mj, gpu_instance_id=groups.get(pid))
        for pid, mj in sorted(by_pid.items())
        if mj > 0 and pid not in present
    ]


def _collection(batch: Batch, device_id: str, slices: dict[int, int | None]) -> Collection | None:
    """The new dcgm-exporter collection of a MIG device in this batch, if the dcgm receiver saw one."""
    fresh = [a for a in batch.mig_activity if a.device_id == device_id and a.collected_by_s is not None]
    first = fresh[0] if fresh else None
    if first is None or first.collected_after_s is None or first.collected_by_s is None or not first.window_s:
        return None
    weights: dict[int, float] = {}
    for a in fresh:
        value = a.gr_engine_active if a.gr_engine_active is not None else a.sm_active
        if value is not None:
            weights[a.gpu_instance_id] = value * (slices.get(a.gpu_instance_id) or 1)
    signals = next(
        (dict(s.fields) for s in batch.device_signals if s.device_id == device_id and s.source == "dcgm"), {}
    )
    energy_j = signals.get("energy_j")
    return Collection(
        after_s=first.collected_after_s,
        by_s=first.collected_by_s,
        window_s=first.window_s,
        weights=weights,
        # Both counters count whole mJ: rounded, the J → mJ round trip cannot miss NVML's reading by a hair.
        counter_mj=None if energy_j is None else float(round(energy_j * 1000.0)),
        slices=slices,
    )


def _counters_mj(batch: Batch, power: DevicePower) -> tuple[float, float] | None:
    """NVML's energy counter at the tick's start and end (None where the energy is not their delta)."""
    sample = next((d for d in batch.devices if d.device_id == power.device_id), None)
    if power.source != "counter" or sample is None or sample.energy_mj is None or power.energy_mj <= 0:
        return None
    return sample.energy_mj - power.energy_mj, sample.energy_mj
