"""Every metric family wattpipe exports, named twice: the Kepler scheme and the OpenTelemetry scheme.

A :class:`Family` says which record and field a value comes from, its instrument and unit, and which
canonical attributes (the keys of ``Record.attributes()``) label it. :data:`ATTRIBUTES` names each
canonical attribute in both schemes. :func:`points` turns a Batch into one family's labelled values, the
same way for every exporter, so the Prometheus and OTLP exporters cannot disagree about what a series is.

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

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Literal

from pipeline.records import (
    Batch,
    DevicePower,
    DeviceSample,
    DeviceTotals,
    GpuShare,
    Record,
    Totals,
)

__all__ = [
    "ATTRIBUTES",
    "DEVICE_DERIVED",
    "FAMILIES",
    "NODE",
    "Attribute",
    "Family",
    "Instrument",
    "Point",
    "Scheme",
    "device_attributes",
    "label_name",
    "points",
    "prometheus_label",
    "prometheus_name",
    "render_markdown",
]

Scheme = Literal["kepler", "otel"]
Instrument = Literal["gauge", "counter", "info"]


@dataclass(frozen=True, slots=True)
class Attribute:
    """A canonical attribute and its name in each scheme (``None``: not rendered in that scheme)."""

    name: str
    kepler: str | None
    otel: str | None
    description: str


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("device_id", "gpu_uuid", "hw.id", "The device's UUID (`GPU-…`)."),
    Attribute("device_index", "gpu", "wattpipe.gpu.index", "The device's index on the node (NVML order)."),
    Attribute("device_name", "gpu_name", "hw.name", "The device's model name."),
    Attribute("vendor", "vendor", "hw.vendor", "The device's vendor (`nvidia`)."),
    Attribute("device_type", None, "hw.type", "`gpu` (the Kepler scheme says it in the metric name)."),
    Attribute("compute_mode", "compute_mode", "wattpipe.gpu.compute_mode", "`default`, `exclusive_process`, `prohibited`."),
    Attribute("mig_enabled", "mig_enabled", "wattpipe.gpu.mig.enabled", "`true` when the GPU is in MIG mode."),
    Attribute("gpu_instance_id", "gpu_instance_id", "wattpipe.gpu.instance.id", "The MIG GPU instance."),
    Attribute("mode", "mode", "wattpipe.attribution.mode", "`exclusive`, `time_slicing`, `mig` or `none`."),
    Attribute("pid", "pid", "process.pid", "The process ID."),
    Attribute("comm", "comm", "process.command", "The process's command name."),
    Attribute("exe", "exe", "process.executable.path", "The process's executable."),
    Attribute("container_id", "container_id", "container.id", "The container ID."),
    Attribute("container_name", "container_name", "k8s.container.name", "The container's name in its pod."),
    Attribute("runtime", "runtime", "container.runtime", "The container runtime."),
    Attribute("pod_uid", "pod_id", "k8s.pod.uid", "The pod's UID."),
    Attribute("pod_name", "pod_name", "k8s.pod.name", "The pod's name."),
    Attribute("pod_namespace", "pod_namespace", "k8s.namespace.name", "The pod's namespace."),
    Attribute("state", "state", "wattpipe.state", "`running`, or `terminated` (kept for a retention period)."),
    Attribute("scope", None, None, "Which consumer a Totals record is about (the metric name says it)."),
)
NODE = Attribute("node_name", "node_name", "k8s.node.name", "The node (`service.node_name`); on every series.")

_BY_NAME = {a.name: a for a in (*ATTRIBUTES, NODE)}

DEVICE_DERIVED = ("device_index", "device_name", "vendor")
"""Attributes a record with only a ``device_id`` can take from the batch's device records."""


def label_name(attribute: str, scheme: Scheme) -> str | None:
    """``attribute``'s name in ``scheme``: ``None`` if that scheme does not render it; unknown names as is."""
    known = _BY_NAME.get(attribute)
    if known is None:
        return attribute
    return known.kepler if scheme == "kepler" else known.otel


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family, named in both schemes.

    ``value`` is the record field (``None``: the constant 1 of an info or state family), divided by
    ``divisor`` (1000 for the ``*_mj`` fields: exported in joules). ``where`` keeps only records whose
    fields have those values; ``aliases`` renames record attributes to canonical ones for this family
    (a Totals ``key`` is a pid, a container ID or a pod UID by scope).
    """

    kepler: str
    otel: str
    record: type[Record]
    value: str | None
    instrument: Instrument
    unit: str
    help: str
    labels: tuple[str, ...]
    optional: tuple[str, ...] = ()
    """Documented attributes that appear when a record carries them (as ``extra``)."""
    where: tuple[tuple[str, str], ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    divisor: int = 1
    extras: bool = True
    """Render the record's other attributes; off for families with one series per device."""

    @property
    def kind(self) -> str:
        """Whose family: device, process, container or pod (``per_process: false`` drops process ones)."""
        return dict(self.where).get("scope", self.record.KIND)

    def name(self, scheme: Scheme) -> str:
        return self.kepler if scheme == "kepler" else self.otel

    def label_source(self, attribute: str) -> Literal["attribute", "field", "device"]:
        if attribute in self.record.IDENTITY or attribute in dict(self.aliases).values():
            return "attribute"
        if attribute in {f.name for f in fields(self.record)}:
            return "field"
        if attribute in DEVICE_DERIVED:
            return "device"
        raise KeyError(f"{self.kepler}: {self.record.__name__} has no attribute or field {attribute!r}")

    def matches(self, record: Record) -> bool:
        return isinstance(record, self.record) and all(str(getattr(record, k)) == v for k, v in self.where)

    def read(self, record: Record) -> float | None:
        if self.value is None:
            return 1.0
        raw = getattr(record, self.value)
        if raw is None:
            return None
        return float(raw) / self.divisor if self.divisor != 1 else float(raw)


_GPU = (("device_type", "gpu"),)
_DEVICE = ("device_index", "device_id", "device_name", "vendor", "device_type")
_MJ = 1000


def _power(kepler: str, otel: str, value: str, help: str) -> Family:
    return Family(kepler, otel, DevicePower, value, "gauge", "W", help, _DEVICE, where=_GPU)


def _energy(kepler: str, otel: str, value: str, help: str) -> Family:
    return Family(kepler, otel, DeviceTotals, value, "counter", "J", help, _DEVICE, where=_GPU, divisor=_MJ)


def _consumer(scope: str, key: str, labels: tuple[str, ...], optional: tuple[str, ...]) -> tuple[Family, Family]:
    common = {
        "labels": (key, "device_index", "device_id", *labels, "state"),
        "optional": optional,
        "where": (("scope", scope),),
        "aliases": (("key", key),),
    }
    return (
        Family(
            f"kepler_{scope}_gpu_joules_total",
            f"wattpipe.{scope}.gpu.energy",
            Totals,
            "energy_mj",
            "counter",
            "J",
            f"GPU energy attributed to a {scope} on one GPU since its series began; terminated series stay for "
            "the energy processor's retention.",
            divisor=_MJ,
            **common,  # type: ignore[arg-type]
        ),
        Family(
            f"kepler_{scope}_gpu_watts",
            f"wattpipe.{scope}.gpu.power",
            Totals,
            "power_w",
            "gauge",
            "W",
            f"GPU power attributed to a {scope} on one GPU over the last tick (0 once terminated).",
            **common,  # type: ignore[arg-type]
        ),
    )


_K8S = ("pod_name", "pod_namespace")

FAMILIES: tuple[Family, ...] = (
    _power("kepler_node_gpu_watts", "hw.power", "power_w", "GPU power over the last tick."),
    _power(
        "kepler_node_gpu_idle_watts",
        "wattpipe.gpu.power.idle",
        "idle_w",
        "The GPU's idle power baseline; absent until one is known.",
    ),
    _power("kepler_node_gpu_active_watts", "wattpipe.gpu.power.active", "active_w", "GPU power above idle."),
    _energy("kepler_node_gpu_joules_total", "hw.energy", "energy_mj", "GPU energy since the series began."),
    _energy(
        "kepler_node_gpu_idle_joules_total", "wattpipe.gpu.energy.idle", "idle_energy_mj", "GPU idle energy."
    ),
    _energy(
        "kepler_node_gpu_active_joules_total",
        "wattpipe.gpu.energy.active",
        "active_energy_mj",
        "GPU energy above idle (attributed + unattributed).",
    ),
    _energy(
        "wattpipe_gpu_unattributed_joules_total",
        "wattpipe.gpu.energy.unattributed",
        "unattributed_energy_mj",
        "GPU active energy no process carried (the explicit remainder: idle + processes + this = total).",
    ),
    Family(
        "wattpipe_device_up",
        "wattpipe.device.up",
        DeviceSample,
        "up",
        "gauge",
        "",
        "1 when the device answered this tick, 0 when it is lost or failing.",
        ("device_index", "device_id", "device_type"),
        where=_GPU,
    ),
    Family(
        "kepler_node_gpu_info",
        "wattpipe.gpu.info",
        DeviceSample,
        None,
        "info",
        "",
        "The GPU and its sharing settings (always 1).",
        (*_DEVICE, "compute_mode", "mig_enabled"),
        where=_GPU,
    ),
    Family(
        "wattpipe_attribution_mode",
        "wattpipe.gpu.attribution",
        GpuShare,
        None,
        "gauge",
        "",
        "How the GPU's energy was split in the last tick (always 1; the mode is the label).",
        ("device_index", "device_id", "mode"),
        extras=False,
    ),
    *_consumer("process", "pid", (), ("gpu_instance_id", "comm", "exe", "container_id", *_K8S)),
    *_consumer("container", "container_id", ("container_name", "runtime", "pod_uid", *_K8S), ()),
    *_consumer("pod", "pod_uid", _K8S, ()),
)


# --- turning a batch into points ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """One labelled value of a family (labels under the scheme's names, node not included)."""

    labels: Mapping[str, str]
    value: float
    record: Record


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def device_attributes(batch: Batch) -> dict[str, dict[str, str]]:
    """device_id → its :data:`DEVICE_DERIVED` attributes, from the batch's device records."""
    out: dict[str, dict[str, str]] = {}
    for record in (*batch.devices, *batch.device_power, *batch.device_totals):
        known = out.setdefault(record.device_id, {})
        for name in DEVICE_DERIVED:
            value = getattr(record, name)
            if value is not None:
                known[name] = _text(value)
    return out


def points(
    family: Family, batch: Batch, scheme: Scheme, devices: Mapping[str, Mapping[str, str]] | None = None
) -> Iterator[Point]:
    """``family``'s points in ``batch``. ``devices``: :func:`device_attributes`, possibly remembered longer."""
    devices = device_attributes(batch) if devices is None else devices
    aliases = dict(family.aliases)
    for record in getattr(batch, Batch.field_for(family.record)):
        if not family.matches(record):
            continue
        value = family.read(record)
        if value is None:
            continue
        yield Point(_labels(family, record, batch, scheme, devices, aliases), value, record)


def _labels(
    family: Family,
    record: Record,
    batch: Batch,
    scheme: Scheme,
    devices: Mapping[str, Mapping[str, str]],
    aliases: Mapping[str, str],
) -> dict[str, str]:
    attrs = {aliases.get(k, k): v for k, v in batch.labels(record).items()}
    identity = {aliases.get(k, k) for k in record.IDENTITY}
    out: dict[str, str] = {}

    def put(attribute: str, value: str | None) -> None:
        name = label_name(attribute, scheme)
        if name is not None and value is not None:
            out.setdefault(name, value)

    for attribute in family.labels:
        source = family.label_source(attribute)
        if source == "attribute":
            put(attribute, attrs.get(attribute))
        elif source == "field":
            raw = getattr(record, attribute)
            put(attribute, None if raw is None else _text(raw))
        else:
            put(attribute, devices.get(getattr(record, "device_id", ""), {}).get(attribute))
    if family.extras:
        for attribute, value in attrs.items():
            if attribute not in identity:
                put(attribute, value)
    return out


# --- Prometheus names ----------------------------------------------------------------------------

_UNIT_WORDS = {"W": "watts", "J": "joules", "s": "seconds", "By": "bytes"}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_label(name: str) -> str:
    """A label name Prometheus accepts: every other character becomes ``_`` (``hw.id`` → ``hw_id``)."""
    out = _INVALID.sub("_", name)
    return f"_{out}" if out[:1].isdigit() else out


def prometheus_name(family: Family, scheme: Scheme) -> str:
    """The family's sample name in Prometheus text.

    Kepler names are Prometheus names already. OpenTelemetry names follow the OpenTelemetry →
    Prometheus rule: ``.`` (and any other invalid character) → ``_``, the unit's word appended unless
    the name ends with it (W → ``_watts``, J → ``_joules``), ``_total`` for counters, ``_info`` for
    info families: ``hw.power`` → ``hw_power_watts``, ``hw.energy`` → ``hw_energy_joules_total``.
    """
    if scheme == "kepler":
        return family.kepler
    name = prometheus_label(family.otel)
    word = _UNIT_WORDS.get(family.unit)
    if word and not name.endswith(f"_{word}"):
        name = f"{name}_{word}"
    suffix = {"counter": "_total", "info": "_info"}.get(family.instrument, "")
    return name if name.endswith(suffix) else name + suffix


# --- docs/metrics.md --------------------------------------------------------------------------------


def _source(family: Family) -> str:
    value = f"`{family.record.__name__}.{family.value}`" if family.value else f"`{family.record.__name__}` (1)"
    if family.divisor != 1:
        value += f" ÷ {family.divisor} (mJ → J)"
    where = ", ".join(f"{k} = {v}" for k, v in family.where)
    return f"{value}, where {where}" if where else value


def _label_rows(family: Family) -> Iterable[str]:
    aliases = {v: k for k, v in family.aliases}
    for attribute in (*family.labels, *family.optional, NODE.name):
        kepler, otel = label_name(attribute, "kepler"), label_name(attribute, "otel")
        if attribute == NODE.name:
            origin = "the exporter (constant)"
        elif attribute in family.optional:
            origin = "the record's extra attributes, when present"
        else:
            source = family.label_source(attribute)
            origin = {
                "attribute": f"attribute `{aliases.get(attribute, attribute)}`",
                "field": f"field `{attribute}`",
                "device": "the device records of the batch, by `device_id`",
            }[source]
        yield f"| `{attribute}` | {f'`{kepler}`' if kepler else '—'} | {f'`{otel}`' if otel else '—'} | {origin} |"


def render_markdown() -> str:
    """docs/metrics.md, generated from :data:`FAMILIES` and :data:`ATTRIBUTES`."""
    lines = [
        "# Metrics reference",
        "",
        "<!-- Generated from pipeline/catalog.py by scripts/gen_metrics_doc.py; do not edit by hand. -->",
        "",
        "Every family is named twice. The **Kepler scheme** (the Prometheus exporter's default,",
        "`naming: kepler`) keeps Kepler's names and labels, so Kepler dashboards work unchanged, and adds",
        "what Kepler lacks: a `gpu` label on every attributed series and an explicit unattributed remainder.",
        "The **OpenTelemetry scheme** (OTLP's default; `naming: otel` in Prometheus) uses the `hw.*`",
        "semantic conventions where they exist and the `wattpipe.*` namespace where they do not.",
        "",
        "- Energy is exported in joules (records carry integer millijoules; the value is divided by 1000).",
        "- Absent is not zero: a value its source could not give is not exported (no idle watts until an",
        "  idle baseline is known), and a label whose value is unknown is left out.",
        "- Attributed series (process, container, pod) know only the device's UUID; their `gpu` label is",
        "  the index the batch's device records give that UUID (remembered, so it stays while a device",
        "  is not read).",
        "- Attributes a record carries beyond its identity (`extra`, and keys inserted by the `attributes`",
        "  processor) are rendered too, under their name in the table below or under their own name.",
        "- `naming: otel` in Prometheus: `.` → `_` in metric and label names, the unit's word appended",
        "  (`W` → `_watts`, `J` → `_joules`), `_total` on counters, `_info` on info families.",
        "",
        "## Attributes",
        "",
        "| attribute | Kepler label | OpenTelemetry attribute | meaning |",
        "|---|---|---|---|",
    ]
    for a in (*ATTRIBUTES, NODE):
        kepler = f"`{a.kepler}`" if a.kepler else "—"
        otel = f"`{a.otel}`" if a.otel else "—"
        lines.append(f"| `{a.name}` | {kepler} | {otel} | {a.description} |")
    lines += ["", "## Families", ""]
    for family in FAMILIES:
        unit = f"`{family.unit}`" if family.unit else "none"
        lines += [
            f"### `{family.kepler}`",
            "",
            family.help,
            "",
            f"- OpenTelemetry: `{family.otel}` ({family.instrument}, unit {unit}); "
            f"Prometheus with `naming: otel`: `{prometheus_name(family, 'otel')}`",
            f"- Instrument: {family.instrument}; from {_source(family)}",
            "",
            "| attribute | Kepler label | OpenTelemetry attribute | from |",
            "|---|---|---|---|",
            *_label_rows(family),
            "",
        ]
    return "\n".join(lines)
