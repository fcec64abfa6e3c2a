"""The energy processor's series: one monotonic total (process, container, pod, MIG instance), its
lifecycle (running, ended, dropped after a retention) and its Totals record.

An ended series ages on the monotonic clock (a wall-clock step neither drops it early nor keeps it longer); the
state file keeps when it ended as a wall time, so that a restart counts wattpipe's downtime (:func:`ended_age_s`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.constructors import new_totals
from wattpipe.pipeline.records import Totals

__all__ = [
    "SERIES_START",
    "Order",
    "Series",
    "end",
    "ended_age_s",
    "ended_last",
    "prune",
    "restore",
    "saved",
    "series_start_value",
    "start_at",
    "to_totals",
]

Scope = Literal["process", "container", "pod", "instance", "vm"]


@dataclass(slots=True)
class Series:
    energy_mj: int
    start_wall_s: float
    power_w: float | None = None
    ended_wall_s: float | None = None  # None: running; else when it ended (wall time: saved, see ended_age_s)
    attrs: dict[str, str] = field(default_factory=dict)  # comm, exe, container_id, pod_uid when known
    # Made once and reused while unchanged: every series gives a Totals record every tick.
    start: Timestamp | None = None
    extra: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = ((), ())  # (attrs as read, sorted)
    seen: int = -1  # the last tick (the processor's count) that had a share of a running process for it
    start_ticks: int | None = None  # a process series' start time, where its key could not take it (not saved)
    ended_s: float | None = None  # when it ended on this run's monotonic clock (not saved; None: not placed yet)


def restore(row: Mapping[str, Any]) -> Series:
    """A series from its state-file row (:func:`saved`)."""
    return Series(
        energy_mj=int(row["energy_mj"]),
        start_wall_s=float(row["start_wall_s"]),
        ended_wall_s=None if row.get("ended_wall_s") is None else float(row["ended_wall_s"]),
        attrs={str(k): str(v) for k, v in dict(row.get("attrs", {})).items()},
    )


_STEPPED_S = 1.0  # the wall clock moved this much against the monotonic one: it stepped (NTP slews far less)


def saved(s: Series, wall_offset_s: float | None = None) -> dict[str, Any]:
    """A series' state-file row. ``wall_offset_s``: the wall clock less the monotonic one at the last tick. An
    ended series whose wall clock stepped since it ended is saved as ended when that clock says it did (its
    monotonic age before now), so that a restart ages it by the time since it ended, not by the step."""
    ended_wall_s, ended_s = s.ended_wall_s, s.ended_s
    if ended_wall_s is not None and ended_s is not None and wall_offset_s is not None:
        stepped = abs(wall_offset_s - (ended_wall_s - ended_s)) > _STEPPED_S  # (else as it was: no float noise)
        ended_wall_s = ended_s + wall_offset_s if stepped else ended_wall_s
    return {"energy_mj": s.energy_mj, "start_wall_s": s.start_wall_s, "ended_wall_s": ended_wall_s, "attrs": s.attrs}


class Order:
    """A table's keys in sorted order, sorted again only when the set of keys changed (Totals come out in a
    stable order; a node's series rarely change from one tick to the next, so re-sorting every tick was
    wasted: comparing the key sets is a hash lookup per key, sorting tuples is many comparisons)."""

    __slots__ = ("_columns", "_keys", "_order", "_split")

    def __init__(self, split: Callable[[list[Any]], tuple[list[Any], ...]]) -> None:
        self._split = split
        self._keys: set[Any] = set()
        self._order: list[Any] = []
        self._columns: tuple[list[Any], ...] = split([])

    def of(self, table: dict[Any, Any]) -> tuple[list[Any], tuple[list[Any], ...]]:
        """The keys in order, and ``split`` of them (the parts of each key a Totals record takes, made
        with the order: the same text objects tick after tick, which the catalog compares by identity)."""
        if table.keys() != self._keys:
            self._keys = set(table)
            self._order = sorted(self._keys)
            self._columns = self._split(self._order)
        return self._order, self._columns


SERIES_START = "series_start"
"""The attribute of a process series begun while the processor still keeps another series of its pid (the kernel
reused the pid within the retention): when it began. Kepler's labels (pid, comm, container, ..., state) cannot
tell the two apart once both have ended, and one label set with two totals shows one of them, falling to it:
the later series carries this from its first record to its last, so each keeps a label set of its own."""


def series_start_value(start_wall_s: float) -> str:
    """``SERIES_START``'s value: when a series began, RFC 3339 in UTC to the second."""
    return datetime.fromtimestamp(start_wall_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_at(now: Timestamp, start_wall_s: float) -> Timestamp:
    # The series began before this process (a restart): place it on this process's monotonic clock.
    return Timestamp(monotonic_s=now.monotonic_s - (now.wall_s - start_wall_s), wall_s=start_wall_s)


def to_totals(now: Timestamp, scope: Scope, key: str, device_id: str, s: Series) -> Totals:
    if s.start is None:
        s.start = start_at(now, s.start_wall_s)
    if s.attrs or s.extra[0]:  # (most series have no attributes: nothing to compare)
        items = tuple(s.attrs.items())
        if items != s.extra[0]:
            s.extra = (items, tuple(sorted(items)))
    # Positional (new_totals): one record per series per tick.
    return new_totals(
        now,
        s.extra[1],
        scope,
        key,
        device_id,
        s.energy_mj,
        s.power_w,
        "running" if s.ended_wall_s is None else "terminated",
        s.start,
    )


def end(series: Series, now: Timestamp) -> None:
    """The series ended at ``now``: on both clocks (every end goes through here, so the two agree)."""
    series.ended_wall_s, series.ended_s = now.wall_s, now.monotonic_s


def ended_age_s(series: Series, now: Timestamp) -> float:
    """How long ago an ended series ended, on the monotonic clock. One restored from the state file (ended in an
    earlier run: no time on this run's monotonic clock yet) is placed on it by its wall age, never below 0: a
    restart counts wattpipe's downtime, and a wall clock set back while it was down keeps it no longer than
    its retention from now."""
    if series.ended_s is None:
        ended_wall_s = now.wall_s if series.ended_wall_s is None else series.ended_wall_s
        series.ended_s = now.monotonic_s - max(0.0, now.wall_s - ended_wall_s)
    return now.monotonic_s - series.ended_s


def ended_last(table: Mapping[Any, Series], owners: AbstractSet[Any], now: Timestamp) -> dict[Any, Any]:
    """Each owner's (a key's first two parts: a pid on a device) ended series that ended last, of those kept."""
    ended = [(-ended_age_s(s, now), k) for k, s in table.items() if k[:2] in owners and s.ended_wall_s is not None]
    return {k[:2]: k for _, k in sorted(ended)}


def prune(
    table: dict[Any, Series], now: Timestamp, retention_s: Callable[[Any], float], max_terminated: int
) -> list[Any]:
    """Drop ended series past their retention (``retention_s`` of the key; their age on the monotonic clock,
    :func:`ended_age_s`), and beyond ``max_terminated`` the ones with least energy; returns the keys dropped."""
    ended = [(k, s) for k, s in table.items() if s.ended_wall_s is not None]
    expired = [k for k, s in ended if ended_age_s(s, now) > retention_s(k)]
    for key in expired:
        del table[key]
    ended = [(k, s) for k, s in ended if k in table]
    if len(ended) > max_terminated:
        # Bounded memory and cardinality: keep the exited ones that used the most energy.
        ended.sort(key=lambda ks: (-ks[1].energy_mj, ks[0]))
        for key, _ in ended[max_terminated:]:
            del table[key]
            expired.append(key)
    return expired
