"""What the ``otlp`` exporter queues: a batch's points, detached from the batch, as OTLP will need them.

``export(batch)`` runs on the tick; the request is built later, on the sender thread, maybe minutes later
during an outage. So the tick takes only what the request needs (value, attributes typed for OTLP, the
time the value was read, the time its series began) and nothing that the next tick changes or that would
keep the whole batch alive while it waits.

A counter point's start is its record's ``start`` (a total's series start), or a process's start for its CPU
time (``process.cpu.time``), else the exporter's creation.

A point's time is its record's (when the value was read), but never older than the batch that sends it: a
record handed on from an earlier read because its value is known to hold now (procfs ``cgroup_root``: a
process whose cgroup ran nothing) is stamped with the tick, as a backend expects of a point sent again.

Nor older than the last tick of its pipeline: where the wall clock stepped back (an NTP step; also across a restart,
the last tick's time kept in the state file), each tick is stamped a millisecond after the last one's newest point
until the clock passes it again. Stamped with the clock instead, points would go back in time (refused as out of
order), and below the starts of the series begun within the step: a start taken down to the point's time moves every
tick, and a series under another start is another series (with ``delta``, each tick its whole total).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.catalog import FAMILIES, Family, LabelEngine, SeriesLabels, labelled_values, remember_devices

__all__ = ["AttributeValue", "Point", "Snapshot", "SnapshotTaker"]

AttributeValue = str | int

_SAVED_START_SLACK_NS = 60 * 1_000_000_000  # a restored process start against the one read after a restart
_STEPPED_TICK_NS = 1_000_000  # a tick's time after the last one's, while the wall clock is behind it
_INT_ATTRIBUTES = frozenset({"process.pid", "wattpipe.gpu.index", "wattpipe.gpu.instance.id", "cpu.logical_number"})
"""Attributes OpenTelemetry types as integers (the catalog renders every attribute as text)."""


@dataclass(frozen=True, slots=True)
class Point:
    attributes: Mapping[str, AttributeValue]
    raw: float
    """The record field's value, before the family's divisor (integer mJ for energy: exact deltas)."""
    start_ns: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One batch, queued: a :class:`~exporters._queued_sender.Request` (drops are counted in its records)."""

    pipeline: str
    records: int
    metrics: tuple[tuple[Family, tuple[Point, ...]], ...]


def _attribute(name: str, value: str) -> AttributeValue:
    return int(value) if name in _INT_ATTRIBUTES and value.lstrip("-").isdigit() else value


class SnapshotTaker:
    """Takes :class:`Snapshot` s of batches, remembering what keeps series stable from tick to tick."""

    def __init__(self, created_ns: int) -> None:
        self.created_ns = created_ns
        """Start time of a counter whose record does not know its own (the exporter's start, per the spec)."""
        self.devices: dict[str, dict[str, str]] = {}
        """Device attributes seen so far: an attributed series keeps its gpu labels through a tick in which the
        device was not read."""
        self._attributes: dict[int, tuple[SeriesLabels, Mapping[str, AttributeValue]]] = {}
        self._labels = LabelEngine()
        """This exporter's own label caches (see pipeline.labels.LabelEngine)."""
        self._began: dict[tuple[int, int | None], int] = {}
        self._begun: dict[tuple[int, int | None], int] = {}  # the last snapshot's (a tick's processes' starts)
        self._saved: dict[tuple[int, int | None], int] = {}  # the state file's (:meth:`keep_starts`), until a take
        self.ticks_ns: dict[str, int] = {}
        """Each pipeline's newest point time sent (its next points' times never go below it: a clock stepped back)."""

    def _start_ns(self, record: object) -> int:
        """A counter's start where its record has no ``start``: a process's (``process.cpu.time`` counts from it,
        also after a restart of wattpipe), else the exporter's creation. A process's start time is read from
        /proc against /proc/uptime, which moves by some 10 ms from read to read: it is taken down to the whole
        second once, and kept while the process is listed, so that its series keeps one start."""
        began = getattr(record, "start_wall_s", None)
        if began is None:
            return self.created_ns
        key = (getattr(record, "pid", 0), getattr(record, "start_time_ticks", None))
        start_ns = self._began.get(key)
        if start_ns is None:
            start_ns = self._begun.get(key)
            if start_ns is None:
                start_ns = int(began) * 1_000_000_000
                saved_ns = self._saved.get(key)
                if saved_ns is not None and abs(saved_ns - start_ns) <= _SAVED_START_SLACK_NS:
                    start_ns = saved_ns  # the start it was sent with before a restart
            self._began[key] = start_ns
        return start_ns

    def starts(self) -> list[list[int | None]]:
        """The last snapshot's process starts, ``[pid, start ticks, start_ns]`` rows (JSON), for :meth:`keep_starts`
        after a restart."""
        return [[pid, ticks, start_ns] for (pid, ticks), start_ns in sorted(self._began.items(), key=str)]

    def keep_starts(self, rows: object) -> None:
        """Rows of :meth:`starts` (a restart's): a process listed again in the next snapshot keeps the start its
        series was sent with, where the one read now is within a minute of it (the same process, its start read
        again: not one of a later boot that has its pid and start ticks). A malformed row is skipped."""
        for row in rows if isinstance(rows, list) else ():
            if isinstance(row, list) and len(row) == 3 and all(type(x) is int or x is None for x in row):
                pid, ticks, start_ns = row
                if pid is not None and start_ns is not None:
                    self._saved[(pid, ticks)] = start_ns

    def take(self, batch: Batch) -> Snapshot:
        """``batch``'s points as the sender needs them, detached from the catalog's shared label mappings."""
        remember_devices(self.devices, batch)
        metrics: list[tuple[Family, tuple[Point, ...]]] = []
        # A series' attributes, typed for OTLP, made once while it lasts: keyed by the identity of the catalog's
        # label mapping (held in the entry, so the identity cannot be reused), only this tick's kept. That
        # identity is promised by wattpipe.pipeline.series_labels.SeriesLabels (see its docstring).
        known, self._attributes = self._attributes, {}
        listed = "host_processes" in batch.present  # (a tick whose /proc listing failed keeps the starts as they are)
        if listed:
            self._began, self._begun = {}, self._began
        tick_ns = batch.time.wall_ns
        last_ns = self.ticks_ns.get(batch.pipeline)
        if last_ns is not None and tick_ns <= last_ns:
            tick_ns = last_ns + _STEPPED_TICK_NS  # the wall clock stepped back (see the module docstring)
        newest_ns = tick_ns  # the newest point's time (a record read after the tick began is stamped with its own)
        for family in FAMILIES:
            out: list[Point] = []
            for labels, value, record in labelled_values(family, batch, "otel", self.devices, engine=self._labels):
                entry = known.get(id(labels))
                if entry is None or entry[0] is not labels:
                    entry = (labels, {name: _attribute(name, text) for name, text in labels.items()})
                self._attributes[id(labels)] = entry
                raw = value * family.divisor if family.value is None else getattr(record, family.value)
                time_ns = max(record.time.wall_ns, tick_ns)
                if time_ns > newest_ns:
                    newest_ns = time_ns
                start = getattr(record, "start", None)
                start_ns = min(start.wall_ns if start is not None else self._start_ns(record), time_ns)
                out.append(Point(entry[1], float(raw), start_ns, time_ns))
            if out:
                metrics.append((family, tuple(out)))
        if listed:
            self._saved = {}
        self.ticks_ns[batch.pipeline] = newest_ns
        return Snapshot(batch.pipeline, batch.count(), tuple(metrics))
