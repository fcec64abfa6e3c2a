"""Turning a Batch into one family's labelled values, the same way for every exporter, so the Prometheus
and OTLP exporters cannot disagree about what a series is.

Label rules, in order:

1. the family's ``labels``, each from the record's attributes (after the batch's label actions), from a
   record field (``compute_mode``, ``mode``), or derived from the device (``device_index``: records
   that know only a ``device_id``, such as Totals and GpuShare, get it from the device records of the
   same batch, or of an earlier one, so a series keeps its label set while its device is not read);
2. every other attribute a record carries that is not part of its identity (``extra``, and keys that
   label actions inserted or renamed), under its name in the scheme or, if the catalog does not know
   it, under its own name; these never override the family's own labels;
3. the node: ``node_name`` (Kepler) / ``k8s.node.name`` (OpenTelemetry), added by the exporter.

Absent values are never rendered: a label whose value is unknown is left out, and a record whose field
is ``None`` yields no point (absent is not zero).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from wattpipe.pipeline._label_plan import LastCall, Plan, new_plan
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.families import DEVICE_DERIVED, Family, Scheme
from wattpipe.pipeline.records import Attrs, DevicePower, DeviceSample, DeviceTotals, Record
from wattpipe.pipeline.series_labels import SeriesLabels, label_text

__all__ = [
    "DEFAULT_ENGINE",
    "Columns",
    "LabelEngine",
    "Point",
    "SeriesLabels",
    "device_attributes",
    "labelled_columns",
    "labelled_values",
    "points",
    "remember_devices",
]

# --- turning a batch into points ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """One labelled value of a family; ``labels`` is a :class:`SeriesLabels` (see its identity promise)."""

    labels: SeriesLabels
    value: float
    record: Record


def device_attributes(batch: Batch) -> dict[str, dict[str, str]]:
    """device_id → its :data:`DEVICE_DERIVED` attributes, from the batch's device records."""
    out: dict[str, dict[str, str]] = {}
    records: tuple[DeviceSample | DevicePower | DeviceTotals, ...] = (
        *batch.devices,
        *batch.device_power,
        *batch.device_totals,
    )
    for record in records:
        known = out.setdefault(record.device_id, {})
        for name in DEVICE_DERIVED:
            value = getattr(record, name)
            if value is not None:
                known[name] = label_text(value)
    return out


def remember_devices(devices: dict[str, dict[str, str]], batch: Batch, limit: int = 1024) -> None:
    """Merge ``batch``'s :func:`device_attributes` into ``devices``, an exporter's memory of them.

    An attributed series' gpu label comes from the device records; remembering them keeps the label (and so
    the series) stable through a tick in which the device was not read. Bounded: past ``limit`` device ids
    the memory starts over (a node has a handful of GPUs).
    """
    current = device_attributes(batch)
    if len(devices) + len(current) > limit:
        devices.clear()
    for device_id, attrs in current.items():
        devices.setdefault(device_id, {}).update(attrs)


def points(
    family: Family,
    batch: Batch,
    scheme: Scheme,
    devices: Mapping[str, Mapping[str, str]] | None = None,
    *,
    engine: LabelEngine | None = None,
) -> Iterator[Point]:
    """``family``'s points in ``batch``, one per label set (in the order of their first record; the last
    record's value wins).

    ``devices`` is :func:`device_attributes` of the batch, possibly merged with what earlier batches said.
    """
    for labels, value, record in labelled_values(family, batch, scheme, devices, engine=engine):
        yield Point(labels, value, record)


def labelled_values(
    family: Family,
    batch: Batch,
    scheme: Scheme,
    devices: Mapping[str, Mapping[str, str]] | None = None,
    *,
    engine: LabelEngine | None = None,
) -> Collection[tuple[SeriesLabels, float, Record]]:
    """What :func:`points` yields, as ``(labels, value, record)`` triples: for exporters that render
    thousands of series per tick and need no :class:`Point` for each (the labels are the same mappings)."""
    return list(zip(*labelled_columns(family, batch, scheme, devices, engine=engine), strict=True))


class Columns(NamedTuple):
    """A family's points as three parallel sequences (what :func:`labelled_values` zips into triples).

    Never changed once handed out: a family whose records are keyed as in the last call gets that call's
    very ``labels`` list again (where no two records shared a series), which a renderer may compare by identity."""

    labels: Sequence[SeriesLabels]
    values: Sequence[float]
    records: Sequence[Record]


_NO_COLUMNS = Columns((), (), ())


def labelled_columns(
    family: Family,
    batch: Batch,
    scheme: Scheme,
    devices: Mapping[str, Mapping[str, str]] | None = None,
    *,
    engine: LabelEngine | None = None,
) -> Columns:
    """:func:`labelled_values` as columns, for a renderer that takes the labels and the values apart anyway.

    ``engine`` owns the caches the labels are found in (see :class:`LabelEngine`); ``None``: the module's
    :data:`DEFAULT_ENGINE`, for scripts and tests. An exporter passes its own."""
    return (DEFAULT_ENGINE if engine is None else engine).columns(family, batch, scheme, devices)


class LabelEngine:
    """The label engine's caches, owned by whoever renders with it: each exporter builds its own, so one
    exporter's series and batches never evict another's, and each cache has one owner (and one thread that
    renders through it at a time, the owner's). What the caches keep is described where they are used:

    - per (family, scheme), a plan (how its labels are made) and its labels by record key (a
      :class:`LabelCache` (pipeline/_label_plan.py), which keeps :class:`SeriesLabels`' identity promise);
    - per (batch field, where test, key fields, pipeline), the last batch's selected records and their keys
      (:meth:`_shared_columns`);
    - per (batch field, tested fields), each record's combination of the tested values as text, numbered, for
      a few recent record tuples (:meth:`_text_mask`);
    - tokens for label actions and device attributes (:meth:`_token`).
    """

    __slots__ = ("_columns", "_plans", "_texts", "_tokens")

    def __init__(self) -> None:
        self._plans: dict[tuple[Family, Scheme], Plan] = {}
        self._columns: dict[
            tuple[object, ...], tuple[tuple[Record, ...], Sequence[Record], list[str], list[object], list[Attrs]]
        ] = {}
        """Per (batch field, where test, key fields, pipeline): the pipeline's last batch's record tuple and,
        from it, the records a family selects and their devices, identities and extras (see
        labelled_columns). A Batch's fields are tuples, so the same object is the same records; the entry
        holds it, so its identity is not reused."""
        self._texts: dict[tuple[str, tuple[str, ...]], tuple[tuple[tuple[Record, ...], list[int], list[Any]], ...]] = {}
        self._tokens: dict[tuple[object, ...], int] = {}

    def plan(self, family: Family, scheme: Scheme) -> Plan:
        """``family``'s plan in ``scheme``, with this engine's label cache for it."""
        plan = self._plans.get((family, scheme))
        if plan is None:
            plan = self._plans[(family, scheme)] = new_plan(family, scheme)  # one assignment: thread-safe
        return plan

    def columns(
        self, family: Family, batch: Batch, scheme: Scheme, devices: Mapping[str, Mapping[str, str]] | None = None
    ) -> Columns:
        """:func:`labelled_columns` with this engine's caches.

        Written column by column (``map``/``zip`` over the records, which run in C) rather than as one loop
        over the records: it runs for every series on every tick, and this halves its cost."""
        plan = self.plan(family, scheme)
        # A record's labels depend only on its identity, extras and label-source fields, the batch's label
        # actions and its device's attributes, never on its values: so they are cached across ticks (a series
        # keeps its labels from tick to tick; only the value is new). Actions and devices enter the key as
        # tokens, hashed once per call rather than once per record. Without label actions, a family that renders
        # none of a record's other attributes is keyed by the fields its labels come from alone: a device's
        # shares then make one key, not one per process.
        plain = not batch.label_actions and plan.identify_plain is not None
        records, device_ids, identities, extras = self._shared_columns(plan, batch, plain)
        if not records:
            return _NO_COLUMNS
        # The family's value (1 for an info family), scaled by its divisor; records without one have no point.
        if plan.get_value is None:
            values: list[float] = [1.0] * len(records)
        else:
            raw = list(map(plan.get_value, records))
            if not plan.value_present and None in raw:
                keep = [value is not None for value in raw]
                records = list(itertools.compress(records, keep))
                device_ids = list(itertools.compress(device_ids, keep))
                identities = list(itertools.compress(identities, keep))
                extras = list(itertools.compress(extras, keep))
                raw = list(itertools.compress(raw, keep))
            values = _scaled(raw, family.divisor)
        devices = device_attributes(batch) if devices is None else devices
        device_token = {
            device_id: self._token(tuple(devices.get(device_id, {}).items()))
            for device_id in (set(device_ids) if plan.device_of is not None else ("",))  # (records without a device)
        }
        actions = self._token(batch.label_actions)
        last = plan.cache.last
        if (
            last is not None
            and last.actions == actions
            and last.device_token == device_token
            and last.device_ids == device_ids
            and last.identities == identities
            and last.extras == extras
        ):
            # The same records, in the same order, as the last call (a steady node, tick after tick): the same
            # labels, found without a key per record (comparing the lists is a loop in C).
            return _kept(last.found, values, records, last.kept)
        keys = list(zip(identities, extras, itertools.repeat(actions), map(device_token.__getitem__, device_ids)))
        found = _find(plan, keys, records, batch, devices, device_ids)
        # One point per label set: records that collapse onto one series (a device's many shares, for the
        # attribution mode) would otherwise be duplicate samples, which Prometheus and OTLP both reject. The
        # last record's value wins; the series keeps the place of its first. Which positions are kept depends on
        # the labels alone, so a steady node reuses them (above) with the labels.
        last_of_series = dict(zip(map(_SERIES, found), itertools.count()))  # in first-seen order: the last position
        kept = None if len(last_of_series) == len(found) else list(last_of_series.values())
        plan.cache.used = len(last_of_series)
        plan.cache.last = LastCall(actions, device_token, device_ids, identities, extras, found, kept)
        return _kept(found, values, records, kept)

    def _shared_columns(
        self, plan: Plan, batch: Batch, plain: bool
    ) -> tuple[Sequence[Record], list[str], list[object], list[Attrs]]:
        """The records ``plan``'s family selects in ``batch``, with their devices, cache identities and extras.

        Families that select the same records and key them by the same fields (a process's joules and watts)
        share these columns: worked out once per batch. Kept per pipeline, so pipelines that render in turn do
        not undo each other's; only its latest batch, which its exporters hold anyway (keeping older ones alive
        cost more in the garbage collector than the sharing saves)."""
        source = getattr(batch, plan.field)
        shared_key = (
            plan.field,
            plan.where,
            plan.wanted,
            plan.plain_names if plain else plan.key_names,
            batch.pipeline,
        )
        shared = self._columns.get(shared_key)
        if shared is not None and shared[0] is source:
            return shared[1:]
        identify = plan.identify_plain if plain and plan.identify_plain is not None else plan.identify
        records = self._selected(plan, batch)
        device_ids = [""] * len(records) if plan.device_of is None else list(map(plan.device_of, records))
        identities = list(map(identify, records))
        extras = list(map(_EXTRA, records))
        if len(self._columns) >= _COLUMNS_MAX:
            self._columns.clear()
        self._columns[shared_key] = (source, records, device_ids, identities, extras)  # one assignment: thread-safe
        return records, device_ids, identities, extras

    def _selected(self, plan: Plan, batch: Batch) -> Sequence[Record]:
        # Every record in a Batch field is of that field's type (Batch's contract), and a family's record
        # type is the type of its field: no isinstance test is needed.
        records: tuple[Record, ...] = getattr(batch, plan.field)
        if not plan.where or not records:
            return records
        masks: list[Sequence[bool]] = []
        if plan.text_where:
            mask = self._text_mask(plan, records)
            if mask is False:
                return ()
            if mask is not True:
                masks.append(mask)
        for name, wanted in zip(plan.where, plan.wanted, strict=True):
            # Absent or present: tested as such, no text made for every value.
            if wanted == "None":
                masks.append(list(map(operator.is_, map(operator.attrgetter(name), records), _NONES)))
            elif wanted == "!None":
                masks.append(list(map(operator.is_not, map(operator.attrgetter(name), records), _NONES)))
        if not masks:
            return records
        if len(masks) == 1:
            return records if all(masks[0]) else list(itertools.compress(records, masks[0]))
        return list(itertools.compress(records, map(all, zip(*masks, strict=True))))

    def _text_mask(self, plan: Plan, records: tuple[Record, ...]) -> bool | Sequence[bool]:
        """Which records pass the ``where`` tests on the text of fields (True: all of them, False: none).

        The tested fields' texts take few distinct combinations (a scope and a device): each record's
        combination is numbered once per record tuple and tested fields, shared by every family that tests
        those fields (eight test a Totals' scope and device), and each family tests the few combinations,
        then picks its records by number (a loop in C)."""
        key = (plan.field, plan.text_where)
        recent = self._texts.get(key, ())
        found = next(((c, t) for r, c, t in recent if r is records), None)
        if found is None:
            # Numbered by the values themselves, made text only once per combination: the tested fields hold
            # texts and ints (the catalog's), whose equal values print alike.
            combos = list(map(operator.attrgetter(*plan.text_where), records))  # a value, or a tuple of them
            number = {combo: i for i, combo in enumerate(dict.fromkeys(combos))}
            single = len(plan.text_where) == 1
            texts = [(str(combo),) if single else tuple(map(str, combo)) for combo in number]
            found = list(map(number.__getitem__, combos)), texts
            self._texts[key] = ((records, *found), *recent[: _TEXTS_KEEP - 1])  # one assignment: safe across threads
        codes, distinct = found
        passing = {i for i, combo in enumerate(distinct) if all(map(_passes, combo, plan.text_wanted))}
        if not passing or len(passing) == len(distinct):
            return bool(passing)
        return list(map(passing.__contains__, codes))

    def _token(self, value: tuple[object, ...]) -> int:
        token = self._tokens.get(value)
        if token is None:
            if len(self._tokens) >= _TOKENS_MAX:
                self._tokens.clear()
            token = self._tokens[value] = next(_TOKEN_COUNT)
        return token


DEFAULT_ENGINE = LabelEngine()
"""The engine of calls that pass none (scripts, tests); every exporter builds its own."""


def _scaled(raw: list[Any], divisor: int) -> list[float]:
    """The values as floats, divided by ``divisor``: an int or float divided by a float is the float that
    ``float()`` and then the division would give, in one pass; any other number a custom component put in a
    record (a ``Decimal``, a numeric text) goes through ``float()`` first, as every value once did."""
    if divisor == 1:
        return list(map(float, raw))
    try:
        return list(map(operator.truediv, raw, itertools.repeat(float(divisor))))
    except TypeError:
        return list(map(operator.truediv, map(float, raw), itertools.repeat(float(divisor))))


def _kept(found: list[SeriesLabels], values: list[float], records: Sequence[Record], kept: list[int] | None) -> Columns:
    """The columns at the ``kept`` positions (``None``: all of them, no two records shared a series)."""
    if kept is None:
        return Columns(found, values, records)
    return Columns([found[i] for i in kept], [values[i] for i in kept], [records[i] for i in kept])


def _find(
    plan: Plan,
    keys: Sequence[tuple[object, ...]],
    records: Sequence[Record],
    batch: Batch,
    devices: Mapping[str, Mapping[str, str]],
    device_ids: list[str],
) -> list[SeriesLabels]:
    """The labels of each key, from the family's cache, made where it has none."""
    cache, older = plan.cache.renewed()
    found: list[SeriesLabels | None] = list(map(cache.get, keys))
    if None in found:
        for i, labels in enumerate(found):
            if labels is None:
                key = keys[i]
                labels = cache.get(key)  # an earlier record of this call may have made it
                if labels is None:
                    # A series still alive since the last renewal keeps its mapping (SeriesLabels' identity promise).
                    labels = older.get(key)
                    if labels is None:
                        labels = plan.labels(records[i], batch, devices.get(device_ids[i], {}))
                    cache[key] = labels
                found[i] = labels
    return found  # type: ignore[return-value]  # every None was replaced


def _passes(text: str, wanted: str) -> bool:
    """A ``where`` test on a field's text: ``^cpu:`` a prefix (a CPU zone type's totals), ``!^cpu:`` not it,
    anything else the very text."""
    if wanted.startswith("^"):
        return text.startswith(wanted[1:])
    if wanted.startswith("!^"):
        return not text.startswith(wanted[2:])
    return text == wanted


_EXTRA = operator.attrgetter("extra")
_COLUMNS_MAX = 512  # a few dozen per pipeline; past this (many pipeline names over time) it starts over
_SERIES = operator.attrgetter("series")


def _plan(family: Family, scheme: Scheme) -> Plan:
    """``family``'s plan in :data:`DEFAULT_ENGINE`."""
    return DEFAULT_ENGINE.plan(family, scheme)


# LabelEngine._text_mask. Which records a family selects depends only on the record tuple, which is immutable. The tested
# fields' values, as text, are read once per tuple and tested fields (sixteen families test a Totals' scope and
# device), and each record's combination of them numbered; kept for a few recent tuples, so pipelines that
# render in turn do not redo each other's. Each family then tests the few distinct combinations and picks
# its records with ``compress`` over their numbers (a loop in C, where testing every record's texts for every
# family was one list per test and family): a family no combination passes (the container, pod and MIG
# instance families on a node without them) selects nothing at once.
_TEXTS_KEEP = 4
_NONES = itertools.repeat(None)


# LabelEngine._token. Label actions and device attributes take part in every cache key; hashing them once per call, not once
# per record, is what these tokens are for. A token is never reused for another value, so dropping the
# table only costs cache misses. The count is shared by every engine.
_TOKENS_MAX = 4096
_TOKEN_COUNT = itertools.count()
