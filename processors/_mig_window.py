"""MIG: hold each tick's energy until dcgm-exporter's sample covering that tick arrives, then split it.

dcgm-exporter collects every 30 s by default, and the GR_ENGINE_ACTIVE it prints is the mean over the
interval that ended at that collection. Splitting each tick by the latest value splits it by an earlier
stretch's activity: 14–30 % off per instance when activity moves. But an instance's power is
proportional to its activity × compute slices, so over a collection window W its true energy is
∝ slices × mean activity over W: the energy of exactly W, split by the sample for W, is split exactly.

So a MIG device's ticks are held: each tick's active energy, who was on which instance in it, and its
provisional split (by the latest activity, for when no window comes). When a new collection arrives, the
part of each held tick that its window covers is split by the window's activity and released to the
instances and to the processes that were on them *in that tick* (also those that have exited since).
A tick straddling two windows is cut where the collection happened. Results lag by up to one collection
interval and a scrape (35 s with dcgm-exporter's 30 s and a 5 s tick).

Where the window ends: DCGM prints the board's energy counter with the sample, the same counter NVML
reads every tick, so the collection is placed where that reading falls between two ticks' readings
(by time within that tick). Without it, midway between the scrape that first saw the collection and the
one before.

The held ticks survive a restart (:meth:`Hold.dump`, :meth:`Hold.load`: times as wall times), and wait on
for a window, or ``max_wait``, from where they were.

Nothing is held forever: a tick not covered within ``max_wait`` (dcgm-exporter down, or collecting less
often than that), or left uncovered between two windows, is released by its provisional split. Every
held millijoule is released exactly once: Σ released + held == Σ active energy, at every tick.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from wattpipe.processors._mig_shares import Group, group_order, with_unreported
from wattpipe.processors.attribution_math import apportion

__all__ = ["Collection", "Hold", "Release", "take"]

_MAX_TICKS = 4096  # held per device, whatever max_wait and the tick interval
_RECENT = 64  # ticks whose counters can place a collection (held or not: one may land in either)


@dataclass(frozen=True, slots=True)
class Collection:
    """A new dcgm-exporter collection of one GPU: when it happened and what it measured."""

    after_s: float  # it happened in (after_s, by_s], monotonic seconds
    by_s: float
    window_s: float  # each value is the mean over this long before the collection
    weights: dict[int, float]  # per instance: activity × compute slices over the window
    counter_mj: float | None = None  # the board's energy counter as DCGM read it at the collection
    slices: Mapping[int, int | None] = field(default_factory=dict)  # per instance of the layout


@dataclass(slots=True)
class Release:
    """Held energy handed out in one tick: per instance, and per (instance, who was on it)."""

    by_group: dict[Group, int] = field(default_factory=dict)
    by_members: dict[tuple[Group, tuple[int, ...]], int] = field(default_factory=dict)

    def add(self, parts: Mapping[Group, int], members: Mapping[Group, Sequence[int]]) -> None:
        for g, mj in parts.items():
            self.by_group[g] = self.by_group.get(g, 0) + mj
            key = (g, tuple(sorted(members.get(g, ()))))
            self.by_members[key] = self.by_members.get(key, 0) + mj

    def processes(self) -> tuple[dict[int, int], dict[int, Group], int]:
        """(mJ by pid, each pid's instance, unattributed mJ): each part split equally among its pids,
        once per release (an instance with no process keeps its part in the remainder)."""
        by_pid: dict[int, int] = {}
        group_of: dict[int, Group] = {}
        unattributed = 0
        for (g, pids), mj in self.by_members.items():
            if not pids:
                unattributed += mj
                continue
            for pid, part in zip(pids, apportion(mj, [1.0] * len(pids)), strict=True):
                by_pid[pid] = by_pid.get(pid, 0) + part
                group_of[pid] = g
        return by_pid, group_of, unattributed


@dataclass(slots=True)
class _Tick:
    start_s: float
    end_s: float
    members: dict[Group, Sequence[int]]  # who was on each instance in this tick
    open_from_s: float  # (open_from_s, end_s] is still held
    open_mj: int  # its active energy
    open_parts: dict[Group, int]  # its provisional split, Σ == open_mj

    def cut(self, to_s: float) -> tuple[int, dict[Group, int]]:
        """Take the energy of (open_from_s, to_s] off the held part (by time), with its provisional split."""
        if to_s >= self.end_s:
            mj = self.open_mj
        else:
            mj = round(self.open_mj * (to_s - self.open_from_s) / (self.end_s - self.open_from_s))
        parts = take(mj, self.open_parts)
        self.open_from_s, self.open_mj = to_s, self.open_mj - mj
        for g, part in parts.items():
            self.open_parts[g] -= part
        return mj, parts


class Hold:
    """One MIG device's held ticks, released as dcgm-exporter's windows cover them."""

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        self.ticks: deque[_Tick] = deque()
        self.last_end_s: float | None = None  # where the last window ended
        self._recent: deque[tuple[float, float, tuple[float, float]]] = deque(maxlen=_RECENT)  # span, counters
        self._out = Release()

    @property
    def held_mj(self) -> int:
        return sum(tick.open_mj for tick in self.ticks)

    def add(
        self,
        span_s: tuple[float, float],
        counters_mj: tuple[float, float] | None,
        parts: Mapping[Group, int],
        members: Mapping[Group, Sequence[int]],
        *,
        wait: bool,
    ) -> None:
        """A tick over ``span_s`` split provisionally into ``parts``; held if ``wait``, else released now.

        ``counters_mj``: NVML's energy counter at the tick's start and end, where its energy is their delta.
        """
        start_s, end_s = span_s
        if counters_mj is not None:
            self._recent.append((start_s, end_s, counters_mj))
        if not wait:
            self._out.add(parts, members)
            return
        self.ticks.append(_Tick(start_s, end_s, dict(members), start_s, sum(parts.values()), dict(parts)))
        while len(self.ticks) > _MAX_TICKS:
            self._provisional(self.ticks.popleft(), math.inf)

    def settle(self, collection: Collection) -> None:
        """Release the held energy inside the collection's window, split by the window's activity."""
        end = self._end_of(collection)
        if self.last_end_s is not None and end <= self.last_end_s:
            return  # not after the last window: nothing new to settle
        start = end - collection.window_s
        if self.last_end_s is not None:
            start = max(start, self.last_end_s)  # nothing is settled twice
        self.last_end_s = end
        covered: list[tuple[_Tick, int, dict[Group, int]]] = []
        for tick in self.ticks:
            if tick.open_from_s >= end:
                break
            if tick.open_from_s < start:
                self._provisional(tick, min(start, tick.end_s))  # no window will cover it any more
            if tick.open_from_s < min(end, tick.end_s):
                covered.append((tick, *tick.cut(min(end, tick.end_s))))
        self._split(covered, collection)
        self._drop_released()

    def _split(self, covered: list[tuple[_Tick, int, dict[Group, int]]], collection: Collection) -> None:
        """The window's energy by instance (exact), each instance's part to the ticks it had processes in (an
        instance with processes that the collection lacks weighed as the reported ones on average).

        The window says how much each instance used over it, not when: an instance's part goes to the
        processes on it in each tick, by the tick's energy, over the ticks it had any (a job that ran for
        part of the window gets all of it; under Kubernetes an instance belongs to one container).
        """
        members: dict[Group, list[int]] = {}
        for tick, _, _ in covered:
            for g, pids in tick.members.items():
                members.setdefault(g, []).extend(pids)
        weights = with_unreported(collection.weights, members, collection.slices)
        groups = sorted({g for _, _, given in covered for g in given}, key=group_order)
        window = [weights.get(g, 0.0) if g is not None else 0.0 for g in groups]
        if sum(window) <= 0:
            for tick, _, given in covered:
                self._out.add(given, tick.members)  # the window saw no activity: the provisional split stands
            return
        total = sum(mj for _, mj, _ in covered)
        for g, part in zip(groups, apportion(total, window), strict=True):
            busy = [(tick, mj) for tick, mj, _ in covered if tick.members.get(g)] or [(t, mj) for t, mj, _ in covered]
            for (tick, _), mj in zip(busy, apportion(part, [float(mj) for _, mj in busy]), strict=True):
                self._out.add({g: mj}, tick.members)

    def release_due(self, now_s: float) -> None:
        """Release, by their provisional split, the ticks that waited ``max_wait`` for a window."""
        for tick in self.ticks:
            if tick.end_s > now_s - self.max_wait_s:
                break
            self._provisional(tick, tick.end_s)
        self._drop_released()

    def release_all(self) -> None:
        for tick in self.ticks:
            self._provisional(tick, tick.end_s)
        self.ticks.clear()

    def take(self) -> Release:
        """What was released since the last take."""
        out, self._out = self._out, Release()
        return out

    def dump(self, wall_offset_s: float) -> dict[str, Any]:
        """The held ticks, where the last window ended and the recent counters, times as wall times
        (``wall_offset_s``: wall − monotonic now). Nothing released and not taken is left between ticks."""
        w = wall_offset_s
        return {
            "ticks": [
                {
                    "start_wall_s": t.start_s + w,
                    "end_wall_s": t.end_s + w,
                    "open_from_wall_s": t.open_from_s + w,
                    "open_mj": t.open_mj,
                    "members": [[g, list(t.members[g])] for g in sorted(t.members, key=group_order)],
                    "open_parts": [[g, t.open_parts[g]] for g in sorted(t.open_parts, key=group_order)],
                }
                for t in self.ticks
            ],
            "last_end_wall_s": None if self.last_end_s is None else self.last_end_s + w,
            "recent": [[start_s + w, end_s + w, low, high] for start_s, end_s, (low, high) in self._recent],
        }

    @classmethod
    def load(cls, max_wait_s: float, saved: Mapping[str, Any], wall_offset_s: float) -> Hold:
        """A hold as :meth:`dump` saved it; ValueError (naming what) for a row it cannot use."""
        hold = cls(max_wait_s)
        w = wall_offset_s
        try:
            for i, row in enumerate(saved["ticks"]):
                hold.ticks.append(_tick_of(row, w, i))
            last = saved["last_end_wall_s"]
            hold.last_end_s = None if last is None else float(last) - w
            for start_s, end_s, low, high in saved["recent"]:
                hold._recent.append((float(start_s) - w, float(end_s) - w, (float(low), float(high))))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from None
        return hold

    def _provisional(self, tick: _Tick, to_s: float) -> None:
        _, given = tick.cut(to_s)
        self._out.add(given, tick.members)

    def _drop_released(self) -> None:
        while self.ticks and self.ticks[0].open_from_s >= self.ticks[0].end_s:
            self.ticks.popleft()

    def _end_of(self, collection: Collection) -> float:
        """When the collection happened: where DCGM's counter reading falls among NVML's, else midway.

        It happened after the previous answered scrape, and no longer than one interval before this one
        (the exporter collects every interval): after a failed scrape or two, the second bound is closer.
        """
        after, by = max(collection.after_s, collection.by_s - collection.window_s), collection.by_s
        reading = collection.counter_mj
        if reading is not None:
            for start_s, end_s, (low, high) in self._recent:
                if low < reading <= high:
                    at = start_s + (reading - low) / (high - low) * (end_s - start_s)
                    return min(by, max(after, at))
        return (after + by) / 2


def _tick_of(row: Mapping[str, Any], wall_offset_s: float, i: int) -> _Tick:
    """A saved held tick, checked: whole mJ at or above 0, its provisional split adding up to it."""
    members: dict[Group, Sequence[int]] = {_group(g): [int(pid) for pid in pids] for g, pids in row["members"]}
    parts = {_group(g): mj for g, mj in row["open_parts"]}
    open_mj = row["open_mj"]
    numbers = [open_mj, *parts.values()]
    if any(type(mj) is not int or mj < 0 for mj in numbers) or sum(parts.values()) != open_mj:
        raise ValueError(f"tick {i}: open_mj {open_mj!r} and open_parts {row['open_parts']!r} (whole mJ ≥ 0, Σ == it)")
    start_s, end_s = float(row["start_wall_s"]) - wall_offset_s, float(row["end_wall_s"]) - wall_offset_s
    open_from_s = float(row["open_from_wall_s"]) - wall_offset_s
    if not (math.isfinite(start_s) and start_s <= open_from_s <= end_s and math.isfinite(end_s)):
        raise ValueError(f"tick {i}: start, open from and end are not in order")
    return _Tick(start_s, end_s, members, open_from_s, open_mj, parts)


def _group(saved: Any) -> Group:
    return None if saved is None else int(saved)


def take(mj: int, pools: Mapping[Group, int]) -> dict[Group, int]:
    """``mj`` out of ``pools`` (Σ pools >= mj) in proportion to them, never more than a pool holds."""
    groups = sorted(pools, key=group_order)
    if mj >= sum(pools.values()):
        return {g: pools[g] for g in groups}
    parts = dict(zip(groups, apportion(mj, [float(pools[g]) for g in groups]), strict=True))
    spill = 0
    for g in groups:  # largest-remainder rounding can leave a part 1 mJ over a tiny pool
        if parts[g] > pools[g]:
            spill += parts[g] - pools[g]
            parts[g] = pools[g]
    for g in groups:
        step = min(spill, pools[g] - parts[g])
        parts[g] += step
        spill -= step
    return parts
