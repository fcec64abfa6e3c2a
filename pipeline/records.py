"""The typed records that flow through a pipeline (``pipeline/batch.py`` carries one tick's worth): frozen, slotted
dataclasses, units in field names (``power_w``, ``energy_j``, ``util`` 0–1), each with the :class:`Timestamp` it was
read or derived at; ``None`` means *absent*, never zero. A class's ``KIND`` is what a user filters on (device,
process, container, pod, instance); ``attributes()`` its identifying attributes, named as the catalog maps them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from wattpipe.pipeline._slots import quick_init
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.record_base import Attrs, Record, RecordKind, record_kind

__all__ = [
    "RECORD_TYPES",
    "Attrs",
    "ClusterGpu",
    "CpuZoneSample",
    "DeviceAllocation",
    "DevicePower",
    "DeviceSample",
    "DeviceSignals",
    "DeviceTotals",
    "GpuProcessSample",
    "GpuShare",
    "HostProcess",
    "InstanceEnergy",
    "MigActivity",
    "MigInstance",
    "NodeCpuTime",
    "Record",
    "RecordKind",
    "Saturation",
    "ShareModel",
    "SharingMode",
    "Totals",
    "Workload",
    "record_kind",
]

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
    # When the exporter collected these (the dcgm receiver's inference, in (after, by] of the monotonic clock;
    # None: a repeat, or not known), each a mean over the window_s before. ``fields``: the instance's own.
    collected_after_s: float | None = None
    collected_by_s: float | None = None
    window_s: float | None = None
    fields: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSignals(Record):
    """Raw per-device fields from dcgm-exporter (or nvml's saturation fields), in SI units (name → value)."""

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id",)

    device_id: str
    fields: tuple[tuple[str, float], ...] = ()
    source: Literal["dcgm", "nvml"] = "dcgm"
    # dcgm: the collection these values come from happened in (after, by] (monotonic s), every collect_s; by
    # None with collect_s set: a repeat of one already seen. collect_s None: undated, the values are the tick's.
    collected_after_s: float | None = None
    collected_by_s: float | None = None
    collect_s: float | None = None


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
    # A virtual machine this process runs (a qemu/kvm process, from its cmdline); None: not a VM, or not known.
    vm_id: str | None = None  # qemu ``-uuid``
    vm_name: str | None = None  # qemu ``-name`` (its ``guest=`` part when given as ``guest=x,debug-threads=on``)
    hypervisor: str | None = None  # ``kvm`` for a qemu/kvm process

    @property
    def type(self) -> str:
        """Kepler's process ``type``: ``vm``, ``container`` or ``regular``."""
        return "vm" if self.vm_id is not None else "container" if self.container_id is not None else "regular"


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuZoneSample(Record):
    """One RAPL zone's energy counter, wrap-corrected by the receiver (``receivers/rapl/``)."""

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ("zone", "path")

    zone: str  # package | core | uncore | dram | psys (the powercap zone's ``name``; package-N -> package)
    path: str  # the powercap zone directory's name, e.g. intel-rapl:0, intel-rapl:0:0
    socket: int | None = None  # the package index the zone belongs to (None for psys)
    energy_uj: int  # monotonic since the receiver started: wraps already added back
    # +1 when the counter went backwards without a wrap (a reset): never subtract across epochs.
    counter_epoch: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCpuTime(Record):
    """Node CPU time from /proc/stat's ``cpu`` line, cumulative seconds (USER_HZ from os.sysconf)."""

    KIND: ClassVar[RecordKind] = "device"
    IDENTITY: ClassVar[tuple[str, ...]] = ()

    total_s: float  # user + nice + system + idle + iowait + irq + softirq + steal
    active_s: float  # total - idle - iowait
    cpu_count: int | None = None
    # Δactive_s / Δtotal_s since the previous reading: set by the cpu_attribution processor (None before).
    usage_ratio: float | None = None


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
    # known); ``processes_unknown``, the process listing failed. Attribution then leaves it unattributed
    # (cpu_attribution holds a failed /proc listing's tick for the next listing: ``held_energy_mj``).
    unattributable: Literal["gap", "processes_unknown"] | None = None
    # Set by attribution: energy measured up to this tick and not yet split. MIG: active energy held until
    # dcgm-exporter's sample covering it arrives (counted in active_energy_mj). Idle pending (below): a tick's
    # whole energy, held until idle is known (in neither idle nor active yet). A level, not this tick's: per
    # tick, Σ shares + idle + (held now − held before) == energy_mj, and over any run Σ shares + idle + held
    # at its end == Σ energy_mj. A CPU zone (cpu_attribution): the active energy of ticks whose /proc listing
    # failed (all of it where /proc/stat did too), in neither idle nor active yet, as idle pending's, until the
    # next listing splits it (processors/_cpu_hold.py).
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
    # Energy released after the tick that measured it (attribution's idle hold) for a process procfs dated: its
    # start time (``HostProcess.start_time_ticks``), which tells it apart from a later process given its pid.
    # None on every other share, and where the start was not known.
    start_time_ticks: int | None = None

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

    ``scope`` says which consumer: a process (``key`` = pid), a container (container id), a pod (UID), a MIG
    instance (its GPU instance id) or a virtual machine (``vm``: its qemu ``-uuid``; CPU energy only).
    ``start`` is when the series began (its first tick), for exporters that carry start times.
    """

    # KIND is per instance here (its scope): always ask record_kind(), never read .KIND directly.
    IDENTITY: ClassVar[tuple[str, ...]] = ("scope", "key", "device_id", "state")

    scope: Literal["process", "container", "pod", "instance", "vm"]
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Saturation(Record):
    """A saturation signal over the sliding window for a GPU, MIG instance or pod (docs/saturation.md)."""

    IDENTITY: ClassVar[tuple[str, ...]] = ("device_id", "gpu_instance_id", "pod_namespace", "pod_name")

    device_id: str
    gpu_instance_id: int | None = None
    signal: str  # the catalog's name: throttle_power, memory_used_max, xid_count, …
    value: float
    window_s: float
    window_end_s: float | None = None  # monotonic s where the data window ends (dcgm: its collection); None: time
    saturation_scope: Literal["device", "instance", "physical_gpu", "exclusive", "device_shared"] = "device"
    pod_name: str | None = None
    pod_namespace: str | None = None
    container_name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterGpu(Record):  # scheduler-level GPU saturation of one resource, cluster-wide (k8s_cluster receiver)
    resource_name: str
    pending_pod_count: int | None = None  # None: the gauge is switched off
    pending_request_total: int | None = None
    requested_allocatable_ratio: float | None = None  # None also when nothing is allocatable


RECORD_TYPES: tuple[type[Record], ...] = (
    DeviceSample,
    GpuProcessSample,
    MigInstance,
    MigActivity,
    DeviceSignals,
    DeviceAllocation,
    HostProcess,
    DevicePower,
    GpuShare,
    InstanceEnergy,
    Workload,
    Totals,
    DeviceTotals,
    Saturation,
    ClusterGpu,
    CpuZoneSample,
    NodeCpuTime,
)
"""Every concrete record type, in the order a Batch carries them (``pipeline/batch.py``)."""

for _record_type in RECORD_TYPES:
    quick_init(_record_type)
