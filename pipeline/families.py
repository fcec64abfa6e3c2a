"""The metric families wattpipe exports, named twice: the Kepler scheme and the OpenTelemetry scheme.

A :class:`Family` says which record and field a value comes from, its instrument and unit, and which
canonical attributes (the keys of ``Record.attributes()``) label it. :data:`ATTRIBUTES` names each
canonical attribute in both schemes. This module is the table and the names only; how a Batch becomes a
family's labelled values is :mod:`pipeline.labels`. Import both through :mod:`pipeline.catalog`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Literal

from wattpipe.pipeline.records import (
    DevicePower,
    DeviceSample,
    DeviceTotals,
    GpuProcessSample,
    GpuShare,
    InstanceEnergy,
    MigActivity,
    Record,
    Totals,
)
from wattpipe.pipeline.records_topology import GpuLink, GpuSetScore

__all__ = [
    "ATTRIBUTES",
    "DEVICE_DERIVED",
    "GPU_FAMILIES",
    "NODE",
    "Attribute",
    "Family",
    "Instrument",
    "Scheme",
    "label_name",
    "prometheus_label",
    "prometheus_name",
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
    Attribute(
        "compute_mode", "compute_mode", "wattpipe.gpu.compute_mode", "`default`, `exclusive_process`, `prohibited`."
    ),
    Attribute("mig_enabled", "mig_enabled", "wattpipe.gpu.mig.enabled", "`true` when the GPU is in MIG mode."),
    Attribute("gpu_instance_id", "gpu_instance_id", "wattpipe.gpu.instance.id", "The MIG GPU instance."),
    Attribute("profile", "profile", "wattpipe.gpu.instance.profile", "The MIG instance's profile (`3g.40gb`)."),
    Attribute(
        "mode",
        "mode",
        "wattpipe.attribution.mode",
        "`exclusive`, `time_slicing`, `mig` (`mig_held`, `mig_slices`, `mig_equal`), `none`, or `gap` and `processes_unknown` where the tick could not be split (all unattributed).",
    ),
    Attribute(
        "model",
        "model",
        "wattpipe.attribution.model",
        "time_slicing with attribution's `model: learned`: `learned` (split by each process's fitted watts per unit of utilisation) or `utilisation` (the fit was not identifiable this tick: split by utilisation); absent otherwise.",
    ),
    Attribute("pid", "pid", "process.pid", "The process ID."),
    Attribute("comm", "comm", "process.command", "The process's command name."),
    Attribute("exe", "exe", "process.executable.path", "The process's executable."),
    Attribute("container_id", "container_id", "container.id", "The container ID."),
    Attribute("container_name", "container_name", "k8s.container.name", "The container's name in its pod."),
    Attribute("runtime", "runtime", "container.runtime", "The container runtime."),
    Attribute("pod_uid", "pod_id", "k8s.pod.uid", "The pod's UID."),
    Attribute("pod_name", "pod_name", "k8s.pod.name", "The pod's name."),
    Attribute("pod_namespace", "pod_namespace", "k8s.namespace.name", "The pod's namespace."),
    Attribute(
        "state",
        "state",
        "wattpipe.state",
        "`running`, or `terminated` (kept for a retention period, counted from its end on the monotonic clock).",
    ),
    Attribute(
        "series_start",
        "series_start",
        "wattpipe.series.start",
        "Only on the series of a process that began while an earlier process of its pid is still kept (the kernel "
        "reused the pid within the retention): when this series began (RFC 3339, UTC), so that once both have "
        "ended each keeps a label set of its own.",
    ),
    Attribute(
        "idle_source",
        "idle_source",
        "wattpipe.gpu.idle.source",
        "Where the idle power comes from: `configured`, `free`, `quiet`, `regression` or `prior` (docs/attribution.md).",
    ),
    Attribute("scope", None, None, "Which consumer a Totals record is about (the metric name says it)."),
    Attribute("gpu_a", "gpu_a", "wattpipe.gpu.link.a", "The lower GPU index of a GPU pair (NVML order)."),
    Attribute("gpu_b", "gpu_b", "wattpipe.gpu.link.b", "The higher GPU index of a GPU pair (NVML order)."),
    Attribute(
        "link",
        "link",
        "wattpipe.gpu.link.type",
        "The pair's link as `nvidia-smi topo -m` prints it: `NV<n>`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`.",
    ),
    Attribute("size", "size", "wattpipe.gpu.set.size", "A request's GPU count (docs/topology.md)."),
    Attribute("resource_name", "resource", "k8s.resource.name", "A Kubernetes extended resource (`nvidia.com/gpu`)."),
    Attribute(
        "saturation_scope",
        "scope",
        "wattpipe.saturation.scope",
        "What a saturation value describes: `device`, `instance` (a MIG instance's own), `physical_gpu` (a board "
        "value, such as the clock-event bitmask, seen from a MIG instance), `exclusive` (a pod alone on its GPU) or "
        "`device_shared` (time-sliced/MPS: every sharer sees the device's value).",
    ),
    Attribute("zone", "zone", "wattpipe.cpu.zone", "A RAPL zone type: `package`, `core`, `uncore`, `dram`, `psys`."),
    Attribute("path", "path", "wattpipe.cpu.zone.path", "A RAPL zone's powercap directory (`intel-rapl:0`)."),
    Attribute("type", "type", "wattpipe.process.type", "What a process is: `container`, `vm` or `regular`."),
    Attribute("vm_id", "vm_id", "wattpipe.vm.id", "The VM a (qemu/kvm) process runs: its `-uuid`."),
    Attribute("vm_name", "vm_name", "wattpipe.vm.name", "The VM's `-name`."),
    Attribute("hypervisor", "hypervisor", "wattpipe.vm.hypervisor", "`kvm`."),
    Attribute("processor", "processor", "cpu.logical_number", "A logical CPU's number (`/proc/cpuinfo`)."),
    Attribute("vendor_id", "vendor_id", "host.cpu.vendor.id", "The CPU's vendor (`GenuineIntel`, `AuthenticAMD`)."),
    Attribute("model_name", "model_name", "host.cpu.model.name", "The CPU's model name (`/proc/cpuinfo`)."),
    Attribute("physical_id", "physical_id", "wattpipe.cpu.physical_id", "The socket a logical CPU is on."),
    Attribute("core_id", "core_id", "wattpipe.cpu.core_id", "The core a logical CPU is on, within its socket."),
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


@dataclass(frozen=True, slots=True, eq=False)
class Family:
    """One metric family, named in both schemes.

    Each family is one object, compared and hashed by identity: it keys the caches that work out its
    labels and its header (hashing every field, as a dataclass would, cost ~0.7 µs per lookup per tick).

    ``value`` is the record field (``None``: the constant 1 of an info or state family), divided by
    ``divisor`` (1000 for the ``*_mj`` fields: exported in joules). ``where`` keeps only records whose
    fields have those values, as text (``"None"``: the field is absent; ``"!None"``: it is present; ``"^x"``: its
    text starts with x, ``"!^x"``: it does not — how CPU totals, ``device_id`` ``cpu:<zone>``, are told apart);
    ``aliases`` renames record attributes to canonical ones for this family (a Totals ``key`` is a pid, a
    container ID or a pod UID by scope).
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
    kind: Literal["device", "process", "container", "pod"] = "device"
    """Whose family: ``per_process: false`` in the Prometheus exporter drops the process ones."""

    def name(self, scheme: Scheme) -> str:
        return self.kepler if scheme == "kepler" else self.otel

    def label_source(self, attribute: str) -> Literal["attribute", "field", "device"]:
        if attribute in self.record.IDENTITY or attribute in dict(self.aliases).values():
            return "attribute"
        if attribute in {f.name for f in fields(self.record)}:
            return "field"
        if isinstance(getattr(self.record, attribute, None), property):
            return "field"  # derived from fields (HostProcess.type): those must be labels too, to key its cache
        if attribute in DEVICE_DERIVED:
            return "device"
        raise KeyError(f"{self.kepler}: {self.record.__name__} has no attribute or field {attribute!r}")


_GPU = (("device_type", "gpu"),)
_CPU = (("device_type", "cpu"),)
_CPU_TOTALS = "^cpu:"  # a Totals record of a CPU zone type has device_id cpu:<zone> (processors/_cpu_series.py)
_NOT_CPU = "!^cpu:"
_DEVICE = ("device_index", "device_id", "device_name", "vendor", "device_type")
_MJ = 1000


def _power(kepler: str, otel: str, value: str, help: str) -> Family:
    return Family(kepler, otel, DevicePower, value, "gauge", "W", help, _DEVICE, where=_GPU)


def _energy(kepler: str, otel: str, value: str, help: str) -> Family:
    return Family(kepler, otel, DeviceTotals, value, "counter", "J", help, _DEVICE, where=_GPU, divisor=_MJ)


def _consumer_families(
    scope: str,
    device: Literal["gpu", "cpu"],
    kind: Literal["process", "container", "pod"],
    key: str,
    labels: tuple[str, ...],
    optional: tuple[str, ...],
    where: tuple[tuple[str, str], ...],
    energy_help: str,
    power_help: str,
) -> tuple[Family, Family]:
    """A consumer's energy counter and power gauge, from its Totals records (``key``: what a Totals ``key`` is
    for this scope)."""
    energy = Family(
        f"kepler_{scope}_{device}_joules_total",
        f"wattpipe.{scope}.{device}.energy",
        Totals,
        "energy_mj",
        "counter",
        "J",
        energy_help,
        labels,
        optional=optional,
        where=where,
        aliases=(("key", key),),
        divisor=_MJ,
        kind=kind,
    )
    power = replace(
        energy,
        kepler=f"kepler_{scope}_{device}_watts",
        otel=f"wattpipe.{scope}.{device}.power",
        value="power_w",
        instrument="gauge",
        unit="W",
        help=power_help,
        divisor=1,
    )
    return energy, power


def _consumer(
    scope: Literal["process", "container", "pod"], key: str, optional: tuple[str, ...]
) -> tuple[Family, Family]:
    return _consumer_families(
        scope,
        "gpu",
        scope,
        key,
        (key, "device_index", "device_id", "vendor", "state"),
        optional,
        (("scope", scope), ("device_id", _NOT_CPU)),
        f"GPU energy attributed to a {scope} on one GPU since its series began; terminated series stay for "
        "the energy processor's retention.",
        f"GPU power attributed to a {scope} on one GPU over the last tick (0 once terminated; absent while its GPU does not answer).",
    )


_K8S = ("pod_name", "pod_namespace")

GPU_FAMILIES: tuple[Family, ...] = (
    _power("kepler_node_gpu_watts", "hw.power", "power_w", "GPU power over the last tick."),
    _power(
        "kepler_node_gpu_idle_watts",
        "wattpipe.gpu.power.idle",
        "idle_w",
        "The GPU's idle power baseline; absent until one is known.",
    ),
    Family(
        "wattpipe_node_gpu_idle_source",
        "wattpipe.gpu.power.idle.source",
        DevicePower,
        None,
        "gauge",
        "",
        "Where the GPU's idle power baseline comes from (always 1; the source is the label); absent while idle is.",
        ("device_index", "device_id", "idle_source"),
        where=(*_GPU, ("idle_source", "!None")),
        extras=False,
    ),
    _power(
        "wattpipe_node_gpu_idle_uncertainty_watts",
        "wattpipe.gpu.power.idle.uncertainty",
        "idle_uncertainty_w",
        "How uncertain the idle power baseline is: a regression's standard error (1σ); for a free or quiet "
        "span, how far its counter average was from the power readings; absent for a configured value or a "
        "prior.",
    ),
    _power("kepler_node_gpu_active_watts", "wattpipe.gpu.power.active", "active_w", "GPU power above idle."),
    _energy("kepler_node_gpu_joules_total", "hw.energy", "energy_mj", "GPU energy since the series began."),
    _energy("kepler_node_gpu_idle_joules_total", "wattpipe.gpu.energy.idle", "idle_energy_mj", "GPU idle energy."),
    _energy(
        "kepler_node_gpu_active_joules_total",
        "wattpipe.gpu.energy.active",
        "active_energy_mj",
        "GPU energy above idle (attributed + unattributed).",
    ),
    _energy(
        "wattpipe_node_gpu_unattributed_joules_total",
        "wattpipe.gpu.energy.unattributed",
        "unattributed_energy_mj",
        "GPU active energy no process carried (the explicit remainder: idle + processes + this = total).",
    ),
    Family(
        "wattpipe_node_gpu_held_joules",
        "wattpipe.gpu.energy.held",
        DevicePower,
        "held_energy_mj",
        "gauge",
        "J",
        "GPU energy the counter measured that attribution has not split among processes yet. While the GPU's "
        "idle is not known (at most attribution's idle_wait) it is in no total: the GPU's joules total lags the "
        "counter by it, and counts it once released. On a MIG GPU waiting for dcgm-exporter's next collection "
        "it is in the active total already and waits only for its split among the instances.",
        _DEVICE,
        where=_GPU,
        divisor=_MJ,
    ),
    Family(
        "wattpipe_node_gpu_unattributed_watts",
        "wattpipe.gpu.power.unattributed",
        GpuShare,
        "power_w",
        "gauge",
        "W",
        "GPU active power no process carried over the last tick (0 when processes carried it all), so that "
        "Σ process watts + this = active watts.",
        ("device_index", "device_id"),
        where=(("pid", "None"),),
        extras=False,
    ),
    Family(
        "kepler_process_gpu_compute_utilization",
        "wattpipe.process.gpu.utilization",
        GpuProcessSample,
        "sm_util",
        "gauge",
        "1",
        "The process's SM utilisation over the last tick (0–1); absent where the driver gives none (MIG).",
        ("pid", "device_index", "device_id", "vendor"),
        optional=("gpu_instance_id", "comm", "exe", "container_id"),
        kind="process",
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
        ("device_index", "device_id", "mode", "model"),
        extras=False,
    ),
    Family(
        "wattpipe_gpu_instance_watts",
        "wattpipe.gpu.instance.power",
        InstanceEnergy,
        "power_w",
        "gauge",
        "W",
        "A MIG instance's part of its GPU's active power over the last tick (activity × compute slices).",
        ("device_index", "device_id", "gpu_instance_id", "profile"),
        extras=False,
    ),
    Family(
        "wattpipe_gpu_instance_joules_total",
        "wattpipe.gpu.instance.energy",
        Totals,
        "energy_mj",
        "counter",
        "J",
        "A MIG instance's part of its GPU's active energy since the series began.",
        ("gpu_instance_id", "device_index", "device_id"),
        optional=("profile",),
        where=(("scope", "instance"), ("device_id", _NOT_CPU)),
        aliases=(("key", "gpu_instance_id"),),
        divisor=_MJ,
    ),
    Family(
        "wattpipe_gpu_instance_activity",
        "wattpipe.gpu.instance.activity",
        MigActivity,
        "gr_engine_active",
        "gauge",
        "1",
        "A MIG instance's graphics-engine activity from dcgm-exporter (0–1, normalised to the instance).",
        ("device_index", "device_id", "gpu_instance_id", "profile"),
        extras=False,
    ),
    *_consumer("process", "pid", ("gpu_instance_id", "comm", "exe", "container_id", *_K8S, "series_start")),
    *_consumer("container", "container_id", ("container_name", "runtime", "pod_uid", *_K8S)),
    *_consumer("pod", "pod_uid", _K8S),
    Family(
        "wattpipe_gpu_link_score",
        "wattpipe.gpu.link.score",
        GpuLink,
        "score",
        "gauge",
        "1",
        "A GPU pair's topology score (go-gpuallocator's table: PCIe level 10–60, plus 100 per NVLink; docs/topology.md).",
        ("gpu_a", "gpu_b", "link"),
        extras=False,
    ),
    Family(
        "wattpipe_node_gpu_set_score",
        "wattpipe.node.gpu.set.score",
        GpuSetScore,
        "score",
        "gauge",
        "1",
        "The summed pair scores of the best set of `size` free GPUs on the node; no series when fewer are free.",
        ("size",),
        extras=False,
    ),
    Family(
        "wattpipe_node_gpus_free",
        "wattpipe.node.gpu.free",
        GpuSetScore,
        "free_gpus",
        "gauge",
        "1",
        "GPUs on the node that no pod holds (whole, by replica, or in MIG mode): the ones the set scores choose from.",
        (),
        where=(("size", "1"),),
        extras=False,
    ),
)


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
