"""What ``wattpipe top`` shows, read from a wattpipe's Prometheus exposition (Kepler or OpenTelemetry names).

:func:`parse` turns ``/metrics`` text into a :class:`Snapshot`: per GPU its power, idle baseline and
source, attribution mode, MIG instances, and the tree of pods → containers → processes that carry its
energy; and per RAPL zone type (``package``, ``dram``...) its power, idle, active and energy summed over the
node's zones of that type, with the same tree built from the CPU consumer series (which are per zone type,
already summed over sockets). Names are matched through the metric catalog (:mod:`wattpipe.pipeline.catalog`), so both naming
schemes give the same snapshot; labels are turned into canonical attribute names (``device_id``,
``pod_name``...). A value the exposition does not carry stays ``None`` (absent is not zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from wattpipe.pipeline.catalog import ATTRIBUTES, FAMILIES, NODE, Family, prometheus_label, prometheus_name

__all__ = ["CpuZone", "Gpu", "Row", "Snapshot", "is_wattpipe", "parse"]

# Sample name in either scheme → (the family, the scheme it was named in).
_SAMPLES: dict[str, tuple[Family, str]] = {}
for _family in FAMILIES:
    _SAMPLES[prometheus_name(_family, "kepler")] = (_family, "kepler")
    _SAMPLES.setdefault(prometheus_name(_family, "otel"), (_family, "otel"))

# Label name in either scheme (Prometheus form) → canonical attribute name.
_LABELS: dict[str, str] = {}
for _attribute in (*ATTRIBUTES, NODE):
    if _attribute.kepler:
        _LABELS[_attribute.kepler] = _attribute.name
    if _attribute.otel:
        _LABELS[prometheus_label(_attribute.otel)] = _attribute.name


@dataclass
class Row:
    """A consumer of one GPU's energy: a pod, a container, a process, a MIG instance or the unattributed rest."""

    kind: str  # "pod", "container", "process", "instance", "unattributed"
    name: str
    watts: float | None = None
    joules: float | None = None
    state: str | None = None
    children: list[Row] = field(default_factory=list)


@dataclass
class Gpu:
    """One GPU as the exposition describes it; every value ``None`` until a series carries it."""

    uuid: str
    index: str | None = None
    name: str | None = None
    watts: float | None = None
    idle_w: float | None = None
    idle_source: str | None = None
    active_w: float | None = None
    joules: float | None = None
    unattributed_w: float | None = None
    unattributed_j: float | None = None
    held_j: float | None = None  # measured, not yet split: held by attribution while idle is not known
    up: bool | None = None
    compute_mode: str | None = None
    mig_enabled: bool | None = None
    mode: str | None = None
    model: str | None = None
    rows: list[Row] = field(default_factory=list)


@dataclass
class CpuZone:
    """One RAPL zone type (``package``, ``dram``...): its zones' values summed, ``None`` unless every zone has one.

    The CPU consumer series are per zone type (summed over sockets by ``cpu_attribution``), so one row per type
    is the level at which a consumer's share of the active power means something.
    """

    zone: str
    paths: list[str] = field(default_factory=list)  # its zones' powercap directories, e.g. intel-rapl:0
    watts: float | None = None
    idle_w: float | None = None
    active_w: float | None = None
    joules: float | None = None
    unattributed_j: float | None = None
    rows: list[Row] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Its device in the consumer trees and the sparkline history, as the pipeline names it: ``cpu:<zone>``."""
        return f"cpu:{self.zone}"


@dataclass
class Snapshot:
    """Everything one scrape said: the GPUs and CPU zone types (with their consumer trees), node, naming scheme."""

    gpus: list[Gpu]
    node: str | None = None
    scheme: str | None = None
    cpus: list[CpuZone] = field(default_factory=list)
    telemetry: bool = False  # wattpipe's own /metrics (service.telemetry.listen): a wattpipe, not its energy series


@dataclass
class _Sample:
    family: str  # the Kepler name, whichever scheme the sample used
    labels: dict[str, str]
    value: float


def _samples(text: str) -> tuple[list[_Sample], str | None]:
    out: list[_Sample] = []
    scheme: str | None = None
    for metric in text_string_to_metric_families(text):
        for sample in metric.samples:
            known = _SAMPLES.get(sample.name)
            if known is None:
                continue
            family, scheme = known
            labels = {_LABELS.get(k, k): v for k, v in sample.labels.items()}
            out.append(_Sample(family.kepler, labels, float(sample.value)))
    return out, scheme


_GPU_VALUES = {
    "kepler_node_gpu_watts": "watts",
    "kepler_node_gpu_idle_watts": "idle_w",
    "kepler_node_gpu_active_watts": "active_w",
    "kepler_node_gpu_joules_total": "joules",
    "wattpipe_node_gpu_unattributed_watts": "unattributed_w",
    "wattpipe_node_gpu_unattributed_joules_total": "unattributed_j",
    "wattpipe_node_gpu_held_joules": "held_j",
}


def _device(gpus: dict[str, Gpu], sample: _Sample) -> Gpu | None:
    uuid = sample.labels.get("device_id")
    if uuid is None:
        return None
    gpu = gpus.setdefault(uuid, Gpu(uuid))
    gpu.index = gpu.index or sample.labels.get("device_index")
    gpu.name = gpu.name or sample.labels.get("device_name")
    return gpu


def _device_sample(gpu: Gpu, sample: _Sample) -> None:
    labels = sample.labels
    if sample.family in _GPU_VALUES:
        setattr(gpu, _GPU_VALUES[sample.family], sample.value)
    elif sample.family == "wattpipe_node_gpu_idle_source":
        gpu.idle_source = labels.get("idle_source")
    elif sample.family == "wattpipe_device_up":
        gpu.up = sample.value == 1
    elif sample.family == "kepler_node_gpu_info":
        gpu.compute_mode = labels.get("compute_mode")
        mig = labels.get("mig_enabled")
        gpu.mig_enabled = None if mig is None else mig == "true"
    elif sample.family == "wattpipe_attribution_mode":
        gpu.mode, gpu.model = labels.get("mode"), labels.get("model")


_CONSUMERS = {
    "kepler_pod_gpu_watts": ("pod", "watts"),
    "kepler_pod_gpu_joules_total": ("pod", "joules"),
    "kepler_container_gpu_watts": ("container", "watts"),
    "kepler_container_gpu_joules_total": ("container", "joules"),
    "kepler_process_gpu_watts": ("process", "watts"),
    "kepler_process_gpu_joules_total": ("process", "joules"),
    "wattpipe_gpu_instance_watts": ("instance", "watts"),
    "wattpipe_gpu_instance_joules_total": ("instance", "joules"),
}
_CPU_CONSUMERS = {
    "kepler_pod_cpu_watts": ("pod", "watts"),
    "kepler_pod_cpu_joules_total": ("pod", "joules"),
    "kepler_container_cpu_watts": ("container", "watts"),
    "kepler_container_cpu_joules_total": ("container", "joules"),
    "kepler_process_cpu_watts": ("process", "watts"),
    "kepler_process_cpu_joules_total": ("process", "joules"),
}
_CPU_VALUES = {
    "kepler_node_cpu_watts": "watts",
    "kepler_node_cpu_idle_watts": "idle_w",
    "kepler_node_cpu_active_watts": "active_w",
    "kepler_node_cpu_joules_total": "joules",
    "wattpipe_node_cpu_unattributed_joules_total": "unattributed_j",
}


def _consumer_device(sample: _Sample) -> str | None:
    """The device a consumer sample is of: a GPU's UUID, or ``cpu:<zone>`` for a CPU zone type's."""
    if sample.family in _CPU_CONSUMERS:
        zone = sample.labels.get("zone")
        return None if zone is None else f"cpu:{zone}"
    return sample.labels.get("device_id")


def _consumer_key(kind: str, labels: dict[str, str]) -> tuple[str, str]:
    """(its own key, its name as shown)."""
    if kind == "pod":
        name = f"{labels.get('pod_namespace', '?')}/{labels.get('pod_name', '?')}"
        return labels.get("pod_uid", name), name
    if kind == "container":
        cid = labels.get("container_id", "?")
        return cid, labels.get("container_name") or cid[:12]
    if kind == "instance":
        gi = labels.get("gpu_instance_id", "?")
        profile = labels.get("profile")
        return gi, f"MIG {gi}" + (f" {profile}" if profile else "")
    pid = labels.get("pid", "?")
    comm = labels.get("comm")
    # A pid names two processes when one ended (its series kept, terminated) and the kernel gave its pid to
    # another: their names (or containers) tell them apart, their states too (_consumer_rows); nothing refers to a
    # process's key, so it can be the whole identity.
    identity = "\0".join((pid, comm or "", labels.get("container_id", "")))
    return identity, f"{pid} {comm}" if comm else pid


@dataclass
class _Found:
    row: Row
    parent: str | None  # the key of the row it hangs under (pod UID for a container, container ID for a process)


def _consumer_rows(samples: list[_Sample]) -> dict[tuple[str, str, str], _Found]:
    """(device, kind, key) → the row, with its values from the watts and joules series."""
    found: dict[tuple[str, str, str], _Found] = {}
    # A VM's name is on its own series (kepler_vm_cpu_*), its qemu process's series carry only its vm_id.
    vm_names = {
        s.labels["vm_id"]: s.labels.get("vm_name")
        for s in samples
        if "vm_id" in s.labels and s.family.startswith("kepler_vm_")
    }
    for sample in samples:
        what = _CONSUMERS.get(sample.family) or _CPU_CONSUMERS.get(sample.family)
        uuid = _consumer_device(sample)
        if what is None or uuid is None:
            continue
        kind, value = what
        key, name = _consumer_key(kind, sample.labels)
        if kind == "process" and (vm_id := sample.labels.get("vm_id")) is not None:
            # The VM before the command: a name column cut to fit keeps the VM's name (``7001 VM db-vm (qemu…``).
            pid, _, comm = name.partition(" ")
            name = f"{pid} VM {vm_names.get(vm_id) or vm_id[:8]}" + (f" ({comm})" if comm else "")
        state = sample.labels.get("state")
        known = found.get((uuid, kind, key))
        if kind == "process" and state and known and known.row.state and known.row.state != state:
            key = f"{key}\0{state}"  # the same pid and name, one ended and one running: two processes
        parent = {"container": "pod_uid", "process": "container_id"}.get(kind)
        item = found.setdefault((uuid, kind, key), _Found(Row(kind, name), sample.labels.get(parent or "")))
        setattr(item.row, value, sample.value)
        item.row.state = sample.labels.get("state", item.row.state)
    return found


def _tree(
    device: str, found: dict[tuple[str, str, str], _Found], unattributed: tuple[float | None, float | None]
) -> list[Row]:
    """A device's rows: MIG instances, pods → containers → processes, orphans, and the unattributed rest."""
    mine = {(kind, key): f for (uuid, kind, key), f in found.items() if uuid == device}
    instances = [f.row for (kind, _), f in mine.items() if kind == "instance"]
    pods = {key: f.row for (kind, key), f in mine.items() if kind == "pod"}
    containers = {key: f.row for (kind, key), f in mine.items() if kind == "container"}
    orphans: list[Row] = []  # a container with no pod known, a process with no container known
    for (kind, _), f in mine.items():
        if kind == "container" and f.parent in pods:
            pods[f.parent].children.append(f.row)
        elif kind == "process" and f.parent in containers:
            containers[f.parent].children.append(f.row)
        elif kind in ("container", "process"):
            orphans.append(f.row)
    rows = [*instances, *pods.values(), *orphans]
    if unattributed != (None, None):
        rows.append(Row("unattributed", "unattributed", *unattributed))
    return rows


def _cpu_zones(samples: list[_Sample], found: dict[tuple[str, str, str], _Found]) -> list[CpuZone]:
    """One :class:`CpuZone` per zone type, from its zones' series (by path) and its consumers' trees."""
    by_path: dict[tuple[str, str], dict[str, float]] = {}
    for sample in samples:
        zone, value = sample.labels.get("zone"), _CPU_VALUES.get(sample.family)
        if zone is not None and value is not None:
            by_path.setdefault((zone, sample.labels.get("path", "?")), {})[value] = sample.value
    zones: dict[str, CpuZone] = {}
    for zone, path in sorted(by_path):
        zones.setdefault(zone, CpuZone(zone)).paths.append(path)
    for cpu in zones.values():
        for value in _CPU_VALUES.values():  # a sum only when every zone of the type carries the value
            parts = [by_path[(cpu.zone, path)].get(value) for path in cpu.paths]
            setattr(cpu, value, None if None in parts else sum(p for p in parts if p is not None))
    for device, _, _ in found:
        if device.startswith("cpu:"):
            zones.setdefault(device.removeprefix("cpu:"), CpuZone(device.removeprefix("cpu:")))
    for cpu in zones.values():
        cpu.rows = _tree(cpu.key, found, (None, cpu.unattributed_j))
    return list(zones.values())


def is_wattpipe(text: str) -> bool:
    """Whether ``text`` is an exposition with a family of the catalog (either scheme), even one with no sample
    yet: a wattpipe on a node without GPUs (or without RAPL) is still one."""
    try:
        for metric in text_string_to_metric_families(text):
            if {metric.name, f"{metric.name}_total"} & _SAMPLES.keys():
                return True
            if any(sample.name in _SAMPLES for sample in metric.samples):
                return True
    except ValueError:
        return False
    return False


def parse(text: str) -> Snapshot:
    """The snapshot one ``/metrics`` text describes; raises ValueError for text that is not an exposition."""
    samples, scheme = _samples(text)
    gpus: dict[str, Gpu] = {}
    node: str | None = None
    for sample in samples:
        node = node or sample.labels.get("node_name")
        if sample.family in _CONSUMERS or sample.family in _CPU_CONSUMERS:
            continue
        gpu = _device(gpus, sample)
        if gpu is not None:
            _device_sample(gpu, sample)
    found = _consumer_rows(samples)
    for uuid, _, _ in found:
        if not uuid.startswith("cpu:"):
            gpus.setdefault(uuid, Gpu(uuid))
    for gpu in gpus.values():
        gpu.rows = _tree(gpu.uuid, found, (gpu.unattributed_w, gpu.unattributed_j))
    telemetry = "wattpipe_tick_duration_seconds" in text
    return Snapshot(list(gpus.values()), node, scheme, _cpu_zones(samples, found), telemetry=telemetry)
