"""The base of every record (``pipeline/records.py`` defines the concrete types): time, extra attributes, and
how a record describes itself (its kind, identifying attributes, measurements, JSON)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from wattpipe.pipeline.clock import Timestamp

__all__ = ["Attrs", "Record", "RecordKind", "record_kind"]

Attrs = tuple[tuple[str, str], ...]
"""Extra attributes on a record: sorted (name, value) pairs, so a record stays hashable and frozen."""

RecordKind = Literal["device", "process", "container", "pod", "instance", "vm"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """Base of every record: the time it describes and free-form extra attributes."""

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ()

    time: Timestamp
    extra: Attrs = ()

    def attributes(self) -> dict[str, str]:
        """Identifying attributes under canonical names (absent ones left out), then ``extra``."""
        out = {name: str(value) for name in self.IDENTITY if (value := getattr(self, name)) is not None}
        out.update(self.extra)
        return out

    def values(self) -> dict[str, Any]:
        """The record's measurements (every non-identity field), JSON-ready; absent values left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("time", "extra") or f.name in self.IDENTITY:
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, Timestamp):
                value = {"monotonic_s": value.monotonic_s, "wall_s": value.wall_s}
            elif isinstance(value, tuple):
                value = dict(value) if all(isinstance(v, tuple) and len(v) == 2 for v in value) else list(value)
            out[f.name] = value
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "kind": record_kind(self),
            "time": {"monotonic_s": self.time.monotonic_s, "wall_s": self.time.wall_s},
            "attributes": self.attributes(),
            "values": self.values(),
        }

    def with_extra(self, extra: Mapping[str, str]) -> Record:
        return dataclasses.replace(self, extra=tuple(sorted(extra.items())))

    @property
    def kind(self) -> str:
        """The kind a user filters on: ``KIND``, unless a record's kind is per instance (Totals: its scope)."""
        return self.KIND


def record_kind(record: Record) -> str:
    """The kind a user filters on; a Totals record is of its scope's kind."""
    return record.kind
