"""The typed records that flow through a pipeline, and the Batch that carries one tick's worth.

Every record is a frozen, slotted dataclass; units live in field names (``power_w``, ``energy_j``,
``util`` as a 0–1 fraction). Every record carries the :class:`Timestamp` at which it was read or
derived. ``None`` means *absent* (the source could not say), never zero: exporters skip absent values.

Each record class has a ``KIND`` (what a user filters on: device, process, container, pod, instance)
and ``attributes()``: its identifying attributes as strings, under canonical names that the catalog
maps to the Kepler and OpenTelemetry schemes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from wattpipe.pipeline.clock import Timestamp

__all__ = [
    "Attrs",
    "Batch",
    "DeviceAllocation",
    "DevicePower",
    "DeviceSample",
    "DeviceSignals",
    "DeviceTotals",
    "GpuProcessSample",
    "GpuShare",
    "HostProcess",
    "InstanceEnergy",
    "LabelAction",
    "MigActivity",
    "MigInstance",
    "Record",
    "ShareModel",
    "SharingMode",
    "Totals",
    "Workload",
    "new_process_sample",
    "new_share",
    "new_totals",
    "record_kind",
]

Attrs = tuple[tuple[str, str], ...]
"""Extra attributes on a record: sorted (name, value) pairs, so a record stays hashable and frozen."""

RecordKind = Literal["device", "process", "container", "pod", "instance"]


def _fmt(value: object) -> str:
    return str(value)


def _base_attributes(record: Record, names: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        value = getattr(record, name)
        if value is not None:
            out[name] = _fmt(value)
    out.update(record.extra)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """Base of every record: the time it describes and free-form extra attributes."""

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ()

    time: Timestamp
    extra: Attrs = ()

    def attributes(self) -> dict[str, str]:
        """Identifying attributes under canonical names (absent ones left out), then ``extra``."""
        return _base_attributes(self, self.IDENTITY)

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


# --- receivers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSample(Record):
    """One accelerator (or CPU package) as read from its driver in one tick.

    ``energy_mj`` is the hardware's cumulative energy counter (mJ since driver load); ``None`` where
    the hardware has none (pre-Volta NVIDIA), in which case energy is power × time downstream.
    """

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_type", "device_id", "device_index", "device_name", "vendor")

    device_id: str  # GPU UUID ("GPU-…"), or a RAPL zone path for CPUs
    device_type: Literal["gpu", "cpu"] = "gpu"
    device_index: int | None = None
    device_name: str | None = None
    vendor: str | None = None
    up: bool = True
    power_w: float | None = None
    energy_mj: float | None = None
    energy_counter_max_mj: float | None = None  # wrap range, where the counter wraps (RAPL)
    compute_mode: str | None = None  # default | exclusive_process | prohibited
    mig_enabled: bool | None = None
    # False when the driver could not list this device's processes this tick (an error, not "none"):
    # nothing may be learned about idle from such a tick, and its active energy goes unattributed.
    processes_known: bool = True
    # Changes when the energy counter's continuity is broken (the driver reloaded, the handle had to be
    # re-acquired): a delta between readings of two epochs is not energy.
    counter_epoch: int = 0
    # The device's own utilisation (0–1; NVML nvmlDeviceGetUtilizationRates .gpu: the share of the driver's
    # last sample period, 1/6 s to 1 s, in which any kernel ran; not the whole tick). None: not reported.
    util: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcessSample(Record):
    """A process running on a GPU (or on a MIG instance of it), as the driver lists it.

    ``sm_util`` is the process's SM utilisation integrated over the tick window (0–1); ``None`` where
    the driver gave no utilisation at all (MIG, or the call failed), ``0.0`` where it said "no samples".
    """

    KIND: ClassVar[RecordKind] = "process"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id", "pid", "gpu_instance_id")

    device_id: str
    pid: int
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    sm_util: float | None = None
    util_window_s: float | None = None
    # The driver's mean over the samples in which the process was busy (0–1), before ``sm_util`` scaled it
    # by the part of the window up to its last busy sample (the driver gives one entry per process): with
    # the process's start time, attribution takes off the part of the window before it started.
    sm_util_busy: float | None = None
    # The process's memory utilisation over the tick (0–1; the driver's memUtil: the share of time its
    # memory was read or written), integrated like ``sm_util``; None where ``sm_util`` is. For attribution's
    # learned model: at the same SM utilisation, a memory-bound process draws other watts than a compute-bound one.
    mem_util: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MigInstance(Record):
    """A MIG GPU instance of a physical GPU (the layout, from NVML)."""

    KIND: ClassVar[RecordKind] = "instance"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id", "gpu_instance_id", "profile")

    device_id: str
    gpu_instance_id: int
    profile: str | None = None
    compute_slices: int | None = None
    mig_uuid: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MigActivity(Record):
    """Activity of one MIG instance over the exporter's sampling window (0–1, normalised to the instance)."""

    KIND: ClassVar[RecordKind] = "instance"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id", "gpu_instance_id", "profile")

    device_id: str
    gpu_instance_id: int
    profile: str | None = None
    gr_engine_active: float | None = None
    sm_active: float | None = None
    # When the exporter collected these values, as the dcgm receiver inferred it (it prints no timestamps):
    # in (collected_after_s, collected_by_s] of this process's monotonic clock, set only on the scrape
    # that first saw the collection (None: a repeat, or not known). Each value is a mean over the window_s
    # before its collection (the exporter's interval; None: the source cannot say).
    collected_after_s: float | None = None
    collected_by_s: float | None = None
    window_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSignals(Record):
    """Raw per-device fields from dcgm-exporter, in SI units (name → value)."""

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id",)

    device_id: str
    fields: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceAllocation(Record):
    """A device (or MIG instance, or time-sliced replica) that the kubelet allocated to a container."""

    KIND: ClassVar[RecordKind] = "container"
    IDENTITY: ClassVar[tuple[str, ...]] = (
        "device_id",
        "gpu_instance_id",
        "resource_name",
        "pod_name",
        "pod_namespace",
        "container_name",
    )

    device_id: str
    resource_name: str
    pod_name: str
    pod_namespace: str
    container_name: str
    gpu_instance_id: int | None = None
    replica: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HostProcess(Record):
    """A process as /proc describes it: identity, its cgroup's container and pod, CPU time."""

    KIND: ClassVar[RecordKind] = "process"
    IDENTITY: ClassVar[tuple[str, ...]] = ("pid", "comm", "exe", "container_id", "container_runtime", "pod_uid")

    pid: int
    comm: str | None = None
    exe: str | None = None
    start_time_ticks: int | None = None  # /proc/<pid>/stat field 22: tells a reused pid apart
    container_id: str | None = None
    container_runtime: str | None = None  # containerd | cri-o | docker | podman, from the cgroup path
    pod_uid: str | None = None
    cpu_time_s: float | None = None
    start_wall_s: float | None = None  # when it started (Unix s), from its start time and /proc/uptime


# --- processors ------------------------------------------------------------------------------


# Energy that is attributed travels as integer millijoules, the unit of NVML's counter: then
# idle + Σ shares + unattributed == the counter's delta exactly (no float rounding), shares can be
# apportioned without losing a millijoule, and totals never drift however long they run. Exporters
# convert to joules once, at the edge.


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePower(Record):
    """A device's power and energy over one tick, split into idle and active.

    ``energy_mj`` is the tick's energy from the hardware counter's delta (``source="counter"``), or
    power × interval where the device has no counter or it reset (``source="power"``).
    ``idle_energy_mj + active_energy_mj == energy_mj`` exactly as the idle processor makes it. ``idle_w`` is
    ``None`` until an idle baseline is known; until then all energy is active, and attribution may hold it
    (``idle_pending``): then idle + active + (held now − held before) == energy_mj.
    """

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_type", "device_id", "device_index", "device_name", "vendor")

    device_id: str
    device_type: Literal["gpu", "cpu"] = "gpu"
    device_index: int | None = None
    device_name: str | None = None
    vendor: str | None = None
    interval_s: float
    power_w: float
    idle_w: float | None
    active_w: float
    energy_mj: int
    idle_energy_mj: int
    active_energy_mj: int
    source: Literal["counter", "power"] = "counter"
    # Why this tick's active energy cannot be split among processes (None: it can): ``gap``, the
    # interval spans an outage longer than the idle processor's ``max_gap`` (who used the GPU then is not
    # known); ``processes_unknown``, the process listing failed. Attribution then leaves it unattributed.
    unattributable: Literal["gap", "processes_unknown"] | None = None
    # Set by attribution: energy measured up to this tick and not yet split. MIG: active energy held until
    # dcgm-exporter's sample covering it arrives (counted in active_energy_mj). Idle pending (below): a tick's
    # whole energy, held until idle is known (in neither idle nor active yet). A level, not this tick's: per
    # tick, Σ shares + idle + (held now − held before) == energy_mj, and over any run Σ shares + idle + held
    # at its end == Σ energy_mj.
    held_energy_mj: int = 0
    # Where ``idle_w`` comes from (the idle processor's estimators, see docs/attribution.md) and how uncertain
    # it is (W, 1σ for a regression; None: the source cannot say). Both None while idle_w is.
    idle_source: Literal["configured", "free", "quiet", "regression", "prior"] | None = None
    idle_uncertainty_w: float | None = None
    # Idle mode auto, idle not known yet, and an estimator may still learn it (set by the idle processor):
    # attribution holds the tick's energy until it is (processors/_idle_hold.py). Then the record says
    # idle 0 and active 0 (nothing is known to be either yet), and ``held_energy_mj`` carries the level:
    # per tick idle + active + (held now − held before) == energy_mj, and Σ shares == active.
    idle_pending: bool = False

    @property
    def energy_j(self) -> float:
        return self.energy_mj / 1000.0


SharingMode = Literal[
    "exclusive", "time_slicing", "mig", "mig_held", "mig_slices", "mig_equal", "none", "gap", "processes_unknown"
]
ShareModel = Literal["utilisation", "learned"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuShare(Record):
    """The part of one device's active energy in one tick that one consumer used.

    ``pid is None`` is the explicit *unattributed* remainder (active energy with no process to carry
    it). ``mode`` is how the device's energy was split this tick.
    """

    KIND: ClassVar[RecordKind] = "process"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id", "pid", "gpu_instance_id")

    device_id: str
    pid: int | None
    share: float
    energy_mj: int
    power_w: float
    mode: SharingMode = "time_slicing"
    gpu_instance_id: int | None = None
    # time_slicing, where attribution's ``model: learned`` is configured: which weights this tick's split used,
    # each process's fitted watts per unit of utilisation (``learned``) or, where the fit was not identifiable,
    # its utilisation (``utilisation``). None: not configured, or not time-slicing.
    model: ShareModel | None = None

    @property
    def energy_j(self) -> float:
        return self.energy_mj / 1000.0


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceEnergy(Record):
    """One MIG instance's part of its GPU's active energy in one tick (its processes' shares, plus what it
    used with no visible process, which the device's remainder also carries)."""

    KIND: ClassVar[RecordKind] = "instance"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id", "gpu_instance_id", "profile")

    device_id: str
    gpu_instance_id: int
    profile: str | None = None
    energy_mj: int
    power_w: float
    activity: float | None = None  # the activity its weight came from (0–1, normalised to the instance)

    @property
    def energy_j(self) -> float:
        return self.energy_mj / 1000.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload(Record):
    """Who a process is in Kubernetes terms: pid → container → pod."""

    KIND: ClassVar[RecordKind] = "container"
    IDENTITY: ClassVar[tuple[str, ...]] = (
        "pid",
        "container_id",
        "container_name",
        "pod_uid",
        "pod_name",
        "pod_namespace",
    )

    pid: int | None
    container_id: str | None = None
    container_name: str | None = None
    pod_uid: str | None = None
    pod_name: str | None = None
    pod_namespace: str | None = None
    listed: Literal["api", "allocations"] | None = None
    """Set on a roster entry (``pid`` None), not a process's membership: this container (or pod, with no
    container fields) exists on the node this tick, as the Kubernetes API lists it, or the kubelet's
    allocations (names only). Whenever the k8s processor knows the node's pods it lists them all, plus one
    entry naming nothing (the list is complete); with no entries at all it cannot tell which pods exist."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Totals(Record):
    """A monotonic energy total for one consumer on one device (integer mJ, see above).

    ``scope`` says which consumer: a process (``key`` = pid), a container (container id) or a pod (UID).
    ``start`` is when the series began (its first tick), for exporters that carry start times.
    """

    # KIND is per instance here (its scope): always ask record_kind(), never read .KIND directly.
    IDENTITY: ClassVar[tuple[str, ...]] = ("scope", "key", "device_id", "state")

    scope: Literal["process", "container", "pod", "instance"]
    key: str
    device_id: str
    energy_mj: int
    power_w: float | None = None
    state: Literal["running", "terminated"] = "running"
    start: Timestamp | None = None

    @property
    def kind(self) -> RecordKind:
        return self.scope

    @property
    def energy_j(self) -> float:
        return self.energy_mj / 1000.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceTotals(Record):
    """A device's monotonic energy totals since the series began (integer mJ).

    ``energy_mj == idle_energy_mj + attributed_energy_mj + unattributed_energy_mj`` at every tick.
    """

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_type", "device_id", "device_index", "device_name", "vendor")

    device_id: str
    device_type: Literal["gpu", "cpu"] = "gpu"
    device_index: int | None = None
    device_name: str | None = None
    vendor: str | None = None
    energy_mj: int
    idle_energy_mj: int
    active_energy_mj: int
    attributed_energy_mj: int
    unattributed_energy_mj: int
    start: Timestamp | None = None


# --- the batch -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabelAction:
    """One edit of the attributes exporters render: insert a static value, rename or drop a key.

    ``kinds`` limits the edit to records of those kinds (empty: every record). ``insert`` never
    overwrites an attribute the record already has; ``upsert`` does.
    """

    op: Literal["insert", "upsert", "rename", "drop"]
    key: str
    value: str | None = None
    new_key: str | None = None
    kinds: frozenset[str] = frozenset()

    def apply(self, kind: str, labels: dict[str, str]) -> None:
        if self.kinds and kind not in self.kinds:
            return
        if self.op == "insert":
            labels.setdefault(self.key, self.value or "")
        elif self.op == "upsert":
            labels[self.key] = self.value or ""
        elif self.op == "rename":
            if self.key in labels and self.new_key:
                labels[self.new_key] = labels.pop(self.key)
        else:
            labels.pop(self.key, None)


_FIELD_BY_TYPE: dict[type[Record], str] = {
    DeviceSample: "devices",
    GpuProcessSample: "gpu_processes",
    MigInstance: "mig_instances",
    MigActivity: "mig_activity",
    DeviceSignals: "device_signals",
    DeviceAllocation: "allocations",
    HostProcess: "host_processes",
    DevicePower: "device_power",
    GpuShare: "shares",
    InstanceEnergy: "instance_energy",
    Workload: "workloads",
    Totals: "totals",
    DeviceTotals: "device_totals",
}


def _slot_setters(cls: type[Record], names: list[str]) -> tuple[dict[str, Any], list[str]]:
    """For a generated constructor: each named field's slot descriptor setter (``_set0``, ``_set1``, … in a
    namespace for ``exec``) and the body line that sets it on ``self`` from the parameter of its name."""
    namespace: dict[str, Any] = {}
    body: list[str] = []
    for number, name in enumerate(names):
        owner = next(klass for klass in cls.__mro__ if name in vars(klass))
        namespace[f"_set{number}"] = vars(owner)[name].__set__
        body.append(f"    _set{number}(self, {name})")
    return namespace, body


def _quick_init(cls: type[Record]) -> None:
    """Give a record class the ``__init__`` dataclasses writes, made cheaper: the same keyword-only
    signature and defaults, but each slot is set through its own descriptor instead of
    ``object.__setattr__`` by name. A frozen dataclass needs the latter for every field (its
    ``__setattr__`` refuses), and that lookup is most of a record's cost: records are made per process per
    tick (three each), and this about halves what each costs (the figures: docs/benchmarks.md). The
    class stays a frozen, slotted dataclass: assignment still raises, ``dataclasses.replace`` uses this."""
    fields = dataclasses.fields(cls)
    namespace, body = _slot_setters(cls, [f.name for f in fields])
    params: list[str] = []
    for number, f in enumerate(fields):
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a default factory needs the dataclass __init__")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_default{number}"] = f.default
            params.append(f"{f.name}=_default{number}")
    source = f"def __init__(self, *, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(source, namespace)  # generated from the class's own field names, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)  # inspect.signature shows the field types
    cls.__init__ = init  # type: ignore[method-assign]


for _record_type in _FIELD_BY_TYPE:
    _quick_init(_record_type)


_F = TypeVar("_F", bound=Callable[..., Record])


def _positional(cls: type[Record]) -> Callable[[_F], _F]:
    """Replace the decorated stub by a positional constructor of ``cls`` for a hot path: a record made
    per process per tick, where passing nine fields by keyword costs as much as setting them.

    The stub is the typed signature (mypy checks every call against it): its parameters must be exactly
    the class's fields in the class's order (``time``, ``extra``, then the class's own), none with a
    default, so a call reads like the class's definition. The generated function sets each slot through
    its descriptor, as the class's own ``__init__`` does, so the record is the very one ``cls(**fields)``
    makes (equal, hashed alike, frozen)."""

    def generate(stub: _F) -> _F:
        names = list(inspect.signature(stub).parameters)
        fields = [f.name for f in dataclasses.fields(cls)]
        if names != fields:
            raise TypeError(
                f"{stub.__name__}: parameters {names} are not the fields of {cls.__name__} in its order: {fields}"
            )
        namespace, body = _slot_setters(cls, names)
        namespace.update(_new=object.__new__, _cls=cls)
        body = ["    self = _new(_cls)", *body, "    return self"]
        source = f"def {stub.__name__}({', '.join(names)}):\n" + "\n".join(body) + "\n"
        exec(source, namespace)  # generated from the stub's own parameter names
        made: _F = namespace[stub.__name__]
        functools.update_wrapper(made, stub)
        del made.__wrapped__  # type: ignore[attr-defined]  # the stub's body is not the function
        return made

    return generate


@_positional(GpuProcessSample)
def new_process_sample(
    time: Timestamp,
    extra: Attrs,
    device_id: str,
    pid: int,
    used_memory_bytes: int | None,
    gpu_instance_id: int | None,
    compute_instance_id: int | None,
    sm_util: float | None,
    util_window_s: float | None,
    sm_util_busy: float | None,
    mem_util: float | None,
) -> GpuProcessSample:
    """``GpuProcessSample(...)`` with every field given, by position: for a receiver's per-process records."""
    raise NotImplementedError  # replaced by @_positional


@_positional(GpuShare)
def new_share(
    time: Timestamp,
    extra: Attrs,
    device_id: str,
    pid: int | None,
    share: float,
    energy_mj: int,
    power_w: float,
    mode: SharingMode,
    gpu_instance_id: int | None,
    model: ShareModel | None,
) -> GpuShare:
    """``GpuShare(...)`` with every field given, by position: for attribution's per-process records."""
    raise NotImplementedError  # replaced by @_positional


@_positional(Totals)
def new_totals(
    time: Timestamp,
    extra: Attrs,
    scope: Literal["process", "container", "pod", "instance"],
    key: str,
    device_id: str,
    energy_mj: int,
    power_w: float | None,
    state: Literal["running", "terminated"],
    start: Timestamp | None,
) -> Totals:
    """``Totals(...)`` with every field given, by position: for the energy processor's per-series records."""
    raise NotImplementedError  # replaced by @_positional


def record_kind(record: Record) -> str:
    """The kind a user filters on; a Totals record is of its scope's kind."""
    if isinstance(record, Totals):
        return record.scope
    return record.KIND


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One tick's records, one field per record kind, plus the tick's context.

    A Batch is immutable: a processor returns a new one (``batch.replace(shares=…)``), so every
    exporter sees the same finished batch and no processor can disturb another's view.
    ``label_actions`` are attribute edits (insert, rename, drop) that exporters apply when rendering
    labels, so typed records stay typed.
    """

    FIELDS: ClassVar[tuple[str, ...]] = tuple(_FIELD_BY_TYPE.values())

    time: Timestamp
    interval_s: float
    node: str
    pipeline: str = "metrics"
    devices: tuple[DeviceSample, ...] = ()
    gpu_processes: tuple[GpuProcessSample, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    mig_activity: tuple[MigActivity, ...] = ()
    device_signals: tuple[DeviceSignals, ...] = ()
    allocations: tuple[DeviceAllocation, ...] = ()
    host_processes: tuple[HostProcess, ...] = ()
    device_power: tuple[DevicePower, ...] = ()
    shares: tuple[GpuShare, ...] = ()
    instance_energy: tuple[InstanceEnergy, ...] = ()
    workloads: tuple[Workload, ...] = ()
    totals: tuple[Totals, ...] = ()
    device_totals: tuple[DeviceTotals, ...] = ()
    # Which fields some receiver or processor actually filled this tick (present, even if empty):
    # lets exporters tell "no processes" from "no process source".
    present: frozenset[str] = field(default_factory=frozenset)
    label_actions: tuple[LabelAction, ...] = ()

    @staticmethod
    def field_for(record_type: type[Record]) -> str:
        for klass in record_type.__mro__:
            name = _FIELD_BY_TYPE.get(klass)
            if name is not None:
                return name
        raise TypeError(f"{record_type.__name__} is not a record kind a Batch carries")

    def replace(self, **changes: Any) -> Batch:
        """A new batch with ``changes``; every record field named is marked present."""
        present = set(changes.pop("present", self.present))
        present.update(name for name in changes if name in self.FIELDS)
        return dataclasses.replace(self, present=frozenset(present), **changes)

    def with_records(self, records: Iterable[Record]) -> Batch:
        """A batch with ``records`` appended to the fields their types belong to."""
        grouped: dict[str, list[Record]] = {}
        known = _FIELD_BY_TYPE.get  # the exact type, most often; a subclass goes through field_for
        for record_type, run in itertools.groupby(records, type):  # receivers give their records in runs
            grouped.setdefault(known(record_type) or self.field_for(record_type), []).extend(run)
        changes: dict[str, Any] = {name: tuple(getattr(self, name)) + tuple(items) for name, items in grouped.items()}
        return self.replace(**changes)

    def labels(self, record: Record) -> dict[str, str]:
        """The attributes an exporter renders for ``record``: its own, after this batch's label actions."""
        labels = record.attributes()
        kind = record_kind(record)
        for action in self.label_actions:
            action.apply(kind, labels)
        return labels

    def records(self) -> Iterator[Record]:
        for name in self.FIELDS:
            yield from getattr(self, name)

    def count(self) -> int:
        return sum(len(getattr(self, name)) for name in self.FIELDS)
