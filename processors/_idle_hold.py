"""Hold a device's energy while its idle power is not known yet, and release it once it is.

A GPU that is never free (a display server on it from boot, notebooks holding contexts) gives the idle
processor nothing to learn idle from until its load varies (the regression). Until then idle is absent
and all of a tick's energy is active: split among the processes there, it bills them the idle watts too.
So, on such a device (``DevicePower.idle_pending``: idle mode auto, idle not known, an estimator may still
learn it), each tick that would be split among processes is held instead, with the split it would have had
(each process's share of it). When idle becomes known, every held tick is released: its idle part is
``idle_w`` × its interval (never more than its energy), the rest is split by that tick's own shares, also
to processes that have exited since (late shares: no watts). A device whose idle is still not known
``idle_wait`` after its first held tick is released as before (all active, by the held shares), and not
held again. A device that has not answered (no DevicePower) since ``idle_wait`` after its first held tick (a
GPU off the bus, maybe for good) is released the same way, in late shares alone: no tick of its own carries
them (see ``AttributionProcessor._unanswered``).

The held ticks survive a restart in attribution's state section (:meth:`IdleHold.dump`, :meth:`IdleHold.load`),
their ends as wall times: the wait goes on from the first held tick, wattpipe's downtime included, so a device
that does not answer after the restart (or whose idle is still not known) is released once it has waited
``idle_wait``, and one whose idle is known by then is released with it.

A held tick keeps each pid's process start time (procfs's ``start_time_ticks``, where the batch has it): energy
held for a process that has ended and whose pid another process has at the release goes to the ended one (a
late share carrying its start time: attribution's ``_merged``, the energy processor's ``_late_series``), not to
the new one. A held tick with no start times (no procfs; a state file from before they were kept) goes by the
pid alone: to whichever process has it at the release.

The held tick's record says nothing is idle or active yet (both 0) and carries the held level
(``held_energy_mj``); the release tick's idle and active include the released parts. Per tick,
idle + active + (held now − held before) == energy; Σ shares == active.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from wattpipe.pipeline.records import SharingMode
from wattpipe.processors._mig_attribution import MIG_MODES
from wattpipe.processors.attribution_math import apportion

__all__ = ["HeldTick", "IdleHold", "Process", "Released", "release"]

_MAX_TICKS = 4096  # held per device, whatever idle_wait and the tick interval

Process = tuple[int, int | None]
"""A held process: its pid and its start time (None: not known)."""


@dataclass(frozen=True, slots=True)
class HeldTick:
    end_s: float  # monotonic
    interval_s: float
    energy_mj: int  # the tick's whole energy (nothing was idle)
    pids: tuple[int, ...]
    shares: tuple[float, ...]  # each pid's share of the tick's active energy, Σ 1
    mode: SharingMode = "time_slicing"  # how it was split
    # Each pid's process start time (procfs's start_time_ticks; None: not known): which process had the pid
    # then. () where none was known (or a state file from before they were kept): the pid alone says who.
    starts: tuple[int | None, ...] = ()

    def processes(self) -> tuple[Process, ...]:
        return tuple(zip(self.pids, self.starts or (None,) * len(self.pids), strict=True))


@dataclass(slots=True)
class Released:
    idle_mj: int = 0
    by_process: dict[Process, int] | None = None
    unattributed_mj: int = 0

    @property
    def active_mj(self) -> int:
        return sum((self.by_process or {}).values()) + self.unattributed_mj


def release(ticks: list[HeldTick], idle_w: float | None) -> Released:
    """The held ``ticks`` split: idle_w × interval of each is idle (at most its energy), the rest by its shares."""
    out = Released(by_process={})
    assert out.by_process is not None
    for tick in ticks:
        idle_mj = 0 if idle_w is None else max(0, min(tick.energy_mj, round(idle_w * tick.interval_s * 1000.0)))
        out.idle_mj += idle_mj
        active = tick.energy_mj - idle_mj
        if not tick.pids:
            out.unattributed_mj += active
            continue
        for process, mj in zip(tick.processes(), apportion(active, list(tick.shares)), strict=True):
            out.by_process[process] = out.by_process.get(process, 0) + mj
    return out


class IdleHold:
    """Per device, the ticks held until idle is known (at most ``wait_s`` each device)."""

    def __init__(self, wait_s: float, log: logging.Logger) -> None:
        self.wait_s = wait_s
        self.log = log
        self._ticks: dict[str, deque[HeldTick]] = {}
        self._given_up: set[str] = set()

    def held_mj(self, device_id: str) -> int:
        return sum(t.energy_mj for t in self._ticks.get(device_id, ()))

    def holding(self, device_id: str) -> bool:
        return bool(self._ticks.get(device_id))

    def devices(self) -> list[str]:
        """The devices that hold energy."""
        return [device_id for device_id, ticks in self._ticks.items() if ticks]

    def mode(self, device_id: str) -> SharingMode:
        """How the device's last held tick was split (``time_slicing`` when it holds none)."""
        ticks = self._ticks.get(device_id)
        return ticks[-1].mode if ticks else "time_slicing"

    def may_hold(self, device_id: str) -> bool:
        return self.wait_s > 0 and device_id not in self._given_up

    def hold(self, device_id: str, tick: HeldTick) -> None:
        ticks = self._ticks.setdefault(device_id, deque())
        ticks.append(tick)
        if len(ticks) > _MAX_TICKS:
            self.give_up(device_id, "held more ticks than it keeps")

    def due(self, device_id: str, now_s: float) -> bool:
        """The device's first held tick has waited ``idle_wait`` since it ended: idle did not come in time."""
        ticks = self._ticks.get(device_id)
        return ticks is not None and bool(ticks) and now_s - ticks[0].end_s >= self.wait_s

    def give_up(self, device_id: str, why: str) -> None:
        if device_id not in self._given_up:
            self._given_up.add(device_id)
            self.log.warning(
                "device %s: idle power still not known (%s): its held energy is split as active, and no more is held",
                device_id,
                why,
            )

    def take(self, device_id: str, idle_w: float | None) -> Released:
        """Release all the device's held ticks (idle part by ``idle_w``; None: all active)."""
        ticks = self._ticks.pop(device_id, None)
        return release(list(ticks), idle_w) if ticks else Released(by_process={})

    # --- state -------------------------------------------------------------------------------

    def dump(self, wall_offset_s: float) -> dict[str, Any]:
        """The held ticks per device, each tick's end as a wall time (``wall_offset_s``: wall − monotonic now)."""
        return {
            device_id: [
                {
                    "end_wall_s": t.end_s + wall_offset_s,
                    "interval_s": t.interval_s,
                    "energy_mj": t.energy_mj,
                    "pids": list(t.pids),
                    "starts": list(t.starts),
                    "shares": list(t.shares),
                    "mode": t.mode,
                }
                for t in ticks
            ]
            for device_id, ticks in sorted(self._ticks.items())
            if ticks
        }

    def load(self, saved: Mapping[str, Any], wall_offset_s: float) -> None:
        """Hold again what :meth:`dump` saved (``wall_offset_s``: wall − monotonic now). All or nothing: a row it
        cannot use raises ValueError naming it, with nothing restored."""
        if not isinstance(saved, Mapping):
            raise ValueError(f"idle_hold is {type(saved).__name__}, not an object of devices")
        restored: dict[str, deque[HeldTick]] = {}
        for device_id, rows in saved.items():
            if not isinstance(rows, list):
                raise ValueError(f"idle_hold of device {device_id}: not a list of held ticks")
            restored[str(device_id)] = deque(_held_tick(device_id, i, row, wall_offset_s) for i, row in enumerate(rows))
        self._ticks.update((device_id, ticks) for device_id, ticks in restored.items() if ticks)


_HOLDABLE: frozenset[str] = frozenset(get_args(SharingMode)) - MIG_MODES


def _held_tick(device_id: object, i: int, row: Any, wall_offset_s: float) -> HeldTick:
    """One saved held tick, checked (energy a whole number of mJ, a share per pid)."""
    where = f"idle_hold of device {device_id}, tick {i}"
    try:
        end_s = float(row["end_wall_s"]) - wall_offset_s
        interval_s = float(row["interval_s"])
        energy_mj = row["energy_mj"]
        pids = tuple(int(pid) for pid in row["pids"])
        shares = tuple(float(share) for share in row["shares"])
        mode = row["mode"]
        # (a state file from before start times were kept has none: the pid alone says who)
        starts = tuple(None if start is None else _whole(start) for start in row.get("starts", ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {type(exc).__name__}: {exc}") from None
    if starts and len(starts) != len(pids):
        raise ValueError(f"{where}: {len(pids)} pids and {len(starts)} start times (one per pid, or none)")
    if type(energy_mj) is not int or energy_mj < 0:
        raise ValueError(f"{where}: energy_mj {energy_mj!r} is not a whole number of mJ at or above 0")
    if len(pids) != len(shares) or not all(math.isfinite(x) and x >= 0 for x in shares):
        raise ValueError(f"{where}: {len(pids)} pids and {len(shares)} shares (one finite share ≥ 0 per pid)")
    if mode not in _HOLDABLE or not (math.isfinite(end_s) and math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"{where}: mode {mode!r}, interval {interval_s!r} s: not a held tick's")
    return HeldTick(
        end_s, interval_s, energy_mj, pids, shares, mode, starts if any(x is not None for x in starts) else ()
    )


def _whole(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"start time {value!r} is not a whole number of clock ticks")
    return value
