"""How one family's labels are made in one scheme (:class:`Plan`, worked out once per family and scheme) and
the bounded per-family cache of the labels it made (:class:`LabelCache`); used by ``pipeline/labels.py``."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.families import DEVICE_DERIVED, Family, Scheme, label_name
from wattpipe.pipeline.records import Attrs, Record
from wattpipe.pipeline.series_labels import SeriesLabels, label_text

__all__ = ["LABEL_CACHE_MIN", "LabelCache", "LastCall", "Plan", "new_plan"]

LABEL_CACHE_MIN = 1024
"""A family's label cache is renewed when it outgrows twice the series of its last call, or this."""


@dataclass(frozen=True, slots=True)
class LastCall:
    """What a family's last call keyed its records by, and the labels it found (see labelled_values)."""

    actions: int
    device_token: dict[str, int]
    device_ids: list[str]
    identities: list[object]
    extras: list[Attrs]
    found: list[SeriesLabels]
    kept: list[int] | None
    """The position of each series' last record, in the order the series first appear; ``None`` where no
    two records shared a series (every position is kept)."""


class LabelCache:
    """One family's labels by record key, bounded by what is in use, not by what was ever seen.

    Two generations: lookups go to ``current``, then ``older`` (a hit moves the entry back into
    ``current``). When ``current`` outgrows twice the series of the last call (or ``LABEL_CACHE_MIN``),
    it becomes ``older`` and the previous ``older`` is dropped: the labels of processes that are gone
    (a node with 20 new processes a tick) are forgotten within two renewals, while a live series keeps
    its mapping object through any number of them.
    """

    __slots__ = ("current", "last", "older", "used")

    def __init__(self) -> None:
        self.current: dict[tuple[object, ...], SeriesLabels] = {}
        self.older: dict[tuple[object, ...], SeriesLabels] = {}
        self.used = 0
        self.last: LastCall | None = None  # replaced whole, in one assignment: safe across threads

    def renewed(self) -> tuple[dict[tuple[object, ...], SeriesLabels], dict[tuple[object, ...], SeriesLabels]]:
        if len(self.current) > max(LABEL_CACHE_MIN, 2 * self.used):
            self.older, self.current = self.current, {}
        return self.current, self.older

    def __len__(self) -> int:
        return len(self.current) + len(self.older)


@dataclass(frozen=True, slots=True)
class Plan:
    """How one family's labels are made in one scheme, worked out once (it is the same for every record)."""

    family: Family
    scheme: Scheme
    field: str
    """The Batch field its records are in."""
    where: tuple[str, ...]
    """The fields that ``family.where`` tests."""
    wanted: tuple[str, ...]
    """The values ``family.where`` wants in them, as text."""
    text_where: tuple[str, ...]
    """The fields of ``where`` tested by their text (a value or a prefix), not for being absent or present."""
    text_wanted: tuple[str, ...]
    """What ``where`` wants in each of ``text_where``."""
    labels_from: tuple[tuple[str, str, Literal["attribute", "field", "device"]], ...]  # attribute, name, source
    aliases: Mapping[str, str]
    identity: frozenset[str]
    identify: Callable[[Record], object]
    """The record fields its labels can depend on (identity attributes and label-source fields), as one key."""
    identify_plain: Callable[[Record], object] | None
    """For a family without extras, when the batch has no label actions: only the fields its labels are
    read from (``None``: the same as ``identify``)."""
    key_names: tuple[str, ...]
    """The fields ``identify`` reads."""
    plain_names: tuple[str, ...]
    """The fields ``identify_plain`` reads."""
    get_value: Callable[[Record], Any] | None
    """The family's value field (``None``: an info family, always 1)."""
    value_present: bool
    """Whether ``where`` selects only records whose value field is present (no record then lacks a point)."""
    device_of: Callable[[Record], str] | None
    """The record's ``device_id`` (``None``: a record type without one, whose records all have ``""``)."""
    cache: LabelCache

    def labels(self, record: Record, batch: Batch, device: Mapping[str, str]) -> SeriesLabels:
        aliases = self.aliases
        attrs = {aliases.get(k, k): v for k, v in batch.labels(record).items()}
        out: dict[str, str] = {}
        for attribute, name, source in self.labels_from:
            if source == "attribute":
                value = attrs.get(attribute)
                if value is None and attribute in DEVICE_DERIVED and getattr(record, attribute, None) is None:
                    # The record does not know it (device totals restored from state, before the device's
                    # first reading) but the device records do. A value the record has and a label action
                    # dropped stays dropped.
                    value = device.get(attribute)
            elif source == "field":
                raw = getattr(record, attribute)
                value = None if raw is None else label_text(raw)
            else:
                value = device.get(attribute)
            if value is not None:
                out.setdefault(name, value)
        if self.family.extras:
            for attribute, value in attrs.items():
                if attribute not in self.identity:
                    extra_name = label_name(attribute, self.scheme)
                    if extra_name is not None:
                        out.setdefault(extra_name, value)
        return SeriesLabels(out)


def _getter(names: list[str]) -> Callable[[Record], object]:
    """The named fields of a record, as one tuple (or value, for one name): a part of a cache key."""
    return operator.attrgetter(*names) if names else _nothing


def _nothing(_: Record) -> object:
    return ()


_PRESENCE = ("None", "!None")  # where tests for a field being absent or present, not for its text


def new_plan(family: Family, scheme: Scheme) -> Plan:
    aliases = dict(family.aliases)
    labels_from = []
    for attribute in family.labels:
        name = label_name(attribute, scheme)
        if name is not None:
            labels_from.append((attribute, name, family.label_source(attribute)))
    # Fields the record type does not have are None on every record: they cannot tell two labels apart.
    # (No record type is subclassed; a subclass that added one would need it here.)
    has = {f.name for f in fields(family.record)}
    key_fields = [
        name
        for name in dict.fromkeys(
            (*family.record.IDENTITY, *(a for a, _, src in labels_from if src == "field"), *DEVICE_DERIVED)
        )
        if name in has
    ]
    # With no label actions and no extras, a label's value is read from the record's field of the same name
    # (through an alias, for Totals), from ``extra`` (part of every key) or from the device (its token).
    field_of = {canonical: name for name, canonical in family.aliases}
    plain_fields = [
        name
        for name in dict.fromkeys((*(field_of.get(a, a) for a, _, _ in labels_from), *DEVICE_DERIVED))
        if name in has
    ]
    return Plan(
        family=family,
        scheme=scheme,
        field=Batch.field_for(family.record),
        where=tuple(name for name, _ in family.where),
        wanted=tuple(value for _, value in family.where),
        text_where=tuple(name for name, value in family.where if value not in _PRESENCE),
        text_wanted=tuple(value for _, value in family.where if value not in _PRESENCE),
        labels_from=tuple(labels_from),
        aliases=aliases,
        identity=frozenset(aliases.get(k, k) for k in family.record.IDENTITY),
        identify=_getter(key_fields),
        identify_plain=None if family.extras else _getter(plain_fields),
        key_names=tuple(key_fields),
        plain_names=tuple(plain_fields),
        get_value=operator.attrgetter(family.value) if family.value is not None else None,
        value_present=(family.value, "!None") in family.where,
        device_of=operator.attrgetter("device_id") if "device_id" in has else None,
        cache=LabelCache(),
    )
