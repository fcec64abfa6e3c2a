"""What the ``otlp`` exporter queues: a batch's points, detached from the batch, as OTLP will need them.

``export(batch)`` runs on the tick; the request is built later, on the sender thread, maybe minutes later
during an outage. So the tick takes only what the request needs (value, attributes typed for OTLP, the
time the value was read, the time its series began) and nothing that the next tick changes or that would
keep the whole batch alive while it waits.

A point's time is its record's (when the value was read), but never older than the batch that sends it: a
record handed on from an earlier read because its value is known to hold now (procfs ``cgroup_root``: a
process whose cgroup ran nothing) is stamped with the tick, as a backend expects of a point sent again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.catalog import FAMILIES, Family, LabelEngine, SeriesLabels, labelled_values, remember_devices

__all__ = ["AttributeValue", "Point", "Snapshot", "SnapshotTaker"]

AttributeValue = str | int

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

    def take(self, batch: Batch) -> Snapshot:
        """``batch``'s points as the sender needs them, detached from the catalog's shared label mappings."""
        remember_devices(self.devices, batch)
        metrics: list[tuple[Family, tuple[Point, ...]]] = []
        # A series' attributes, typed for OTLP, made once while it lasts: keyed by the identity of the catalog's
        # label mapping (held in the entry, so the identity cannot be reused), only this tick's kept. That
        # identity is promised by wattpipe.pipeline.series_labels.SeriesLabels (see its docstring).
        known, self._attributes = self._attributes, {}
        tick_ns = batch.time.wall_ns
        for family in FAMILIES:
            out: list[Point] = []
            for labels, value, record in labelled_values(family, batch, "otel", self.devices, engine=self._labels):
                entry = known.get(id(labels))
                if entry is None or entry[0] is not labels:
                    entry = (labels, {name: _attribute(name, text) for name, text in labels.items()})
                self._attributes[id(labels)] = entry
                raw = value * family.divisor if family.value is None else getattr(record, family.value)
                time_ns = max(record.time.wall_ns, tick_ns)
                start = getattr(record, "start", None)
                start_ns = min(start.wall_ns if start is not None else self.created_ns, time_ns)
                out.append(Point(entry[1], float(raw), start_ns, time_ns))
            if out:
                metrics.append((family, tuple(out)))
        return Snapshot(batch.pipeline, batch.count(), tuple(metrics))
