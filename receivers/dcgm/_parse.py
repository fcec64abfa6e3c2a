"""dcgm-exporter's /metrics text → series keyed by label *names* → wattpipe records.

The text is parsed by prometheus_client's parser; this module only reads labels. Every vintage in
tests/fixtures/dcgm-exporter parses: ``Hostname`` or ``hostname``, ``UUID`` or ``uuid`` (the ``-o``
flag), with or without ``pci_bus_id`` and ``modelName``, pod labels empty (3.x) or absent (4.x),
whole-GPU rows beside GPU-instance rows, and families in any order (even split in two).

How rows become records:
- a row with ``GPU_I_ID`` belongs to that MIG GPU instance of the GPU named by ``UUID`` (the parent's);
- per instance, ``GR_ENGINE_ACTIVE`` (and ``SM_ACTIVE``) becomes a :class:`MigActivity`, whose ``fields``
  carry every field the instance owns (profiling ratios, framebuffer) for the saturation processor;
- per GPU, one :class:`DeviceSignals` holding every other field in SI units. A board field that a MIG
  GPU repeats on every instance row (power, energy, temperature, clocks) is taken ONCE: from the
  whole-GPU row if there is one, else from the instance with the lowest ``GPU_I_ID`` (the repeats can
  differ, being sampled at different instants; summing them would count the board once per instance).
  Fields an instance owns (``DCGM_FI_PROF_*``, framebuffer) are never device signals when they come
  from an instance row: they describe a slice, not the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceSignals, MigActivity, Record
from wattpipe.receivers.dcgm._collections import Collection
from wattpipe.receivers.dcgm._fields import instance_scoped, signal_for

__all__ = ["ParseError", "Scrape", "Series", "parse_exposition", "to_records"]

# The families a Prometheus text parser hands back with one sample per series.
_SCALAR_TYPES = frozenset({"gauge", "counter", "unknown", "untyped"})


class ParseError(ValueError):
    """The text is not Prometheus exposition text."""


@dataclass(frozen=True, slots=True)
class Series:
    """One DCGM field of one GPU (or GPU instance), as the exporter printed it (DCGM's units)."""

    field: str  # DCGM_FI_…
    value: float
    uuid: str  # the physical GPU's UUID, also on MIG instance rows
    gpu_index: int | None = None
    gpu_instance_id: int | None = None  # None: a whole-GPU row
    profile: str | None = None  # GPU_I_PROFILE, e.g. "1g.10gb"
    hostname: str | None = None  # the exporter's pod name under the GPU Operator, not the node's
    model: str | None = None
    pci_bus_id: str | None = None
    # The exporter's own pod mapping; None where the labels are absent (4.x) or empty (3.x).
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None


@dataclass(slots=True)
class Scrape:
    """What one answer held: DCGM series, and how many series were not usable (counted, not fatal)."""

    series: list[Series] = field(default_factory=list)
    other: int = 0  # series that are not DCGM fields (DCGM_EXP_*, a process collector, …)
    unusable: int = 0  # DCGM fields without a GPU UUID, or with a GPU_I_ID that is not a number
    problems: list[str] = field(default_factory=list)


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` that is present and not empty."""
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_exposition(text: str) -> Scrape:
    """Every DCGM series in ``text``; raises :class:`ParseError` if it is not exposition text at all."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError mostly, but IndexError/KeyError on some junk
        raise ParseError(f"{type(exc).__name__}: {exc}") from None
    scrape = Scrape()
    bad_gi: set[str] = set()
    for family in families:
        if family.type not in _SCALAR_TYPES or not family.name.startswith("DCGM_FI_"):
            scrape.other += len(family.samples)
            continue
        # The family's name, not the sample's: the parser appends "_total" to samples of a counter
        # that lacks it (TOTAL_ENERGY_CONSUMPTION, the violation counters).
        name = family.name
        for sample in family.samples:
            labels = sample.labels
            uuid = _label(labels, "UUID", "uuid")
            gi_text = _label(labels, "GPU_I_ID")
            gi = _int(gi_text)
            if math.isnan(sample.value):
                continue  # DCGM's "blank": absent, like a row the exporter left out
            if uuid is None or (gi_text is not None and gi is None):
                if gi_text is not None and gi is None and gi_text not in bad_gi:
                    bad_gi.add(gi_text)
                    scrape.problems.append(f"GPU_I_ID {gi_text!r} is not a number; those rows are skipped")
                scrape.unusable += 1
                continue
            scrape.series.append(
                Series(
                    field=name,
                    value=float(sample.value),
                    uuid=uuid,
                    gpu_index=_int(_label(labels, "gpu")),
                    gpu_instance_id=gi,
                    profile=_label(labels, "GPU_I_PROFILE") if gi is not None else None,
                    hostname=_label(labels, "Hostname", "hostname"),
                    model=_label(labels, "modelName"),
                    pci_bus_id=_label(labels, "pci_bus_id"),
                    namespace=_label(labels, "namespace"),
                    pod=_label(labels, "pod"),
                    container=_label(labels, "container"),
                )
            )
    return scrape


# --- series → records ----------------------------------------------------------------------------

# A candidate value for one device signal, ranked: a whole-GPU row beats an instance row, the canonical
# spelling beats the old one, a lower GPU_I_ID beats a higher one. The lowest rank wins.
_Rank = tuple[int, int, int]


@dataclass
class _Device:
    index: int | None
    signals: dict[str, tuple[_Rank, float]] = field(default_factory=dict)

    def offer(self, name: str, rank: _Rank, value: float) -> None:
        held = self.signals.get(name)
        if held is None or rank < held[0]:
            self.signals[name] = (rank, value)


@dataclass
class _Instance:
    profile: str | None
    activity: dict[str, tuple[int, float]] = field(default_factory=dict)  # name → (spelling rank, value)
    own: dict[str, tuple[int, float]] = field(default_factory=dict)  # the instance's own fields, ranked so


def _ranked(table: dict[str, tuple[int, float]], name: str, spelling: int, value: float) -> None:
    """Keep ``value`` under ``name`` unless a better-ranked spelling is already there."""
    held = table.get(name)
    if held is None or spelling < held[0]:
        table[name] = (spelling, value)


_ACTIVITY = frozenset({"gr_engine_active", "sm_active"})


def _signals(
    uuid: str, device: _Device, now: Timestamp, collections: Mapping[str, Collection] | None, window_s: float | None
) -> DeviceSignals:
    """A GPU's DeviceSignals, dated by its collection where the caller tracks them (else undated)."""
    new = collections.get(uuid) if collections else None
    return DeviceSignals(
        time=now,
        device_id=uuid,
        fields=tuple(sorted((name, value) for name, (_, value) in device.signals.items())),
        collected_after_s=new.after_s if new else None,
        collected_by_s=new.by_s if new else None,
        collect_s=window_s if collections is not None else None,
    )


def to_records(
    series: Iterable[Series],
    now: Timestamp,
    collections: Mapping[str, Collection] | None = None,
    window_s: float | None = None,
) -> list[Record]:
    """One DeviceSignals per GPU UUID (devices in GPU-index order), then one MigActivity per instance.

    ``collections``: the GPUs whose answer is a new collection (see ``_collections``); their MigActivity
    records and DeviceSignals say when it happened (given, an absent GPU's answer is a repeat). ``window_s``:
    the exporter's collection interval, on every MigActivity (and DeviceSignals, when ``collections`` is).
    """
    devices: dict[str, _Device] = {}
    instances: dict[tuple[str, int], _Instance] = {}
    for s in series:
        device = devices.setdefault(s.uuid, _Device(s.gpu_index))
        if device.index is None:
            device.index = s.gpu_index
        signal = signal_for(s.field)
        spelling = 0 if signal.canonical else 1
        value = s.value * signal.scale
        if s.gpu_instance_id is None:
            device.offer(signal.name, (0, spelling, 0), value)
            continue
        instance = instances.setdefault((s.uuid, s.gpu_instance_id), _Instance(s.profile))
        instance.profile = instance.profile or s.profile
        if signal.name in _ACTIVITY:
            _ranked(instance.activity, signal.name, spelling, value)
        if instance_scoped(s.field):
            _ranked(instance.own, signal.name, spelling, value)
        else:
            device.offer(signal.name, (1, spelling, s.gpu_instance_id), value)
    order = sorted(devices, key=lambda uuid: (devices[uuid].index is None, devices[uuid].index or 0, uuid))
    position = {uuid: pos for pos, uuid in enumerate(order)}
    records: list[Record] = [_signals(uuid, devices[uuid], now, collections, window_s) for uuid in order]
    for (uuid, gi), instance in sorted(instances.items(), key=lambda item: (position[item[0][0]], item[0][1])):
        gr = instance.activity.get("gr_engine_active")
        sm = instance.activity.get("sm_active")
        new = collections.get(uuid) if collections else None
        records.append(
            MigActivity(
                time=now,
                device_id=uuid,
                gpu_instance_id=gi,
                profile=instance.profile,
                gr_engine_active=gr[1] if gr else None,
                sm_active=sm[1] if sm else None,
                collected_after_s=new.after_s if new else None,
                collected_by_s=new.by_s if new else None,
                window_s=window_s,
                fields=tuple(sorted((name, value) for name, (_, value) in instance.own.items())),
            )
        )
    return records
