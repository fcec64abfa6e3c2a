"""The scenario file: one YAML document describing a GPU node (schema documented in docs/simulator.md).

Every model forbids unknown keys, so a typo fails at load time with the key's path. Values the file may
omit and that must still be stable between runs (GPU UUIDs, container ids, pod UIDs) are derived from a
hash of the names, never from randomness.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from wattpipe.pipeline.config import model_at, suggest, unrelated
from wattpipe.pipeline.yamlsource import SourceError, YamlSource, load_yaml_text
from wattpipe.simulator._faults import Fault, GpuChange, GpuFault, NvmlFault, RaplFault
from wattpipe.simulator._process_schema import Init, Move, Process
from wattpipe.simulator._schema_base import MigInstance, MigSpec, _hex64, _Model, hashed_uuid
from wattpipe.simulator.hardware import gpu_model_info

__all__ = [
    "Container",
    "CpuSpec",
    "DcgmSpec",
    "DeviceRef",
    "Gpu",
    "Init",
    "MigInstance",
    "MigSpec",
    "Move",
    "Node",
    "Pod",
    "Process",
    "Scenario",
    "ScenarioError",
    "Topology",
    "hashed_uuid",
    "load_scenario",
    "parse_scenario",
]

ComputeMode = Literal["default", "exclusive_process", "prohibited"]
Runtime = Literal["containerd", "cri-o", "docker"]


class ScenarioError(ValueError):
    """A scenario file that cannot describe a node: one message per problem, each naming the file, the
    line (when read from a file) and the key."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


class Node(_Model):
    name: str = "gpu-node-1"
    driver_version: str = "580.105.08"
    # How long the driver (and the host) has been up when the scenario starts: the energy counters
    # start from idle_w × uptime_s and /proc starttimes count from boot, as on a real node.
    uptime_s: float = Field(default=3600.0, ge=0)
    # Driver-side ring of per-process utilisation samples, per device (nvmlDeviceGetProcessUtilization).
    sample_buffer: int = Field(default=100, ge=1)
    cgroup_driver: Literal["systemd", "cgroupfs"] = "systemd"
    cgroup_version: Literal[1, 2] = 2


class Topology(_Model):
    numa: int = 0
    pcie_switch: int | None = None
    nvlinks: dict[int, int] = Field(default_factory=dict)  # peer GPU index → number of bonded links
    nvswitch: bool = False
    # Deeper PCIe tree (issue 19), all optional: GPUs on one board (PSB, e.g. a dual-GPU card), under one
    # upstream switch or root port (PXB), under one PCIe host bridge (PHB). Unset: only PIX, NODE and SYS.
    board: int | None = None
    pcie_root: int | None = None
    host_bridge: int | None = None


class Gpu(_Model):
    model: str
    uuid: str = ""  # "" → derived from the node name and the index
    pci_bus_id: str = ""  # "" → derived from the index
    idle_w: float = Field(gt=0)
    max_w: float = Field(gt=0)
    compute_mode: ComputeMode = "default"
    energy_counter: bool | None = None  # None → from the architecture (Volta and newer)
    memory_mib: int | None = Field(default=None, gt=0)  # None → from the model name
    mig: MigSpec | None = None
    topology: Topology = Field(default_factory=Topology)
    # Saturation (docs/saturation.md): [start_s, end_s) spans of thermal throttling, and [at_s, code] XIDs.
    thermal_throttle: list[tuple[float, float]] = Field(default_factory=list)
    xid: list[tuple[float, int]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Gpu:
        for start_s, end_s in self.thermal_throttle:
            if not 0 <= start_s < end_s:
                raise ValueError(f"thermal_throttle [{start_s}, {end_s}]: need 0 <= start_s < end_s")
        for at_s, code in self.xid:
            if at_s < 0 or code <= 0:
                raise ValueError(f"xid [{at_s}, {code}]: need at_s >= 0 and a positive XID code")
        if self.max_w < self.idle_w:
            raise ValueError(f"max_w ({self.max_w}) is below idle_w ({self.idle_w})")
        if self.uuid and not re.fullmatch(
            r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", self.uuid
        ):
            raise ValueError(f"uuid {self.uuid!r} is not of the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
        info = gpu_model_info(self.model)
        if self.energy_counter is None:
            self.energy_counter = info.has_energy_counter
        if self.memory_mib is None:
            self.memory_mib = info.memory_mib
        if self.mig is not None:
            _check_mig_fits(self.model, self.mig)
        return self


# A pid is one process for the whole run: the simulator does not reuse pids (docs/simulator.md).
_ONE_PID = "a scenario's pid is one process for the whole run (the simulator does not reuse pids)"


def _check_mig_fits(model: str, mig: MigSpec) -> None:
    slices = gpu_model_info(model).mig_slices
    if slices == 0:
        raise ValueError(f"mig: {model!r} cannot do MIG (only A100/A30/H100/H200/B200-class GPUs can)")
    used = sum(inst.slices for inst in mig.instances)
    if used > slices:
        raise ValueError(f"mig: instances use {used} compute slices but {model!r} has {slices}")


class DeviceRef(_Model):
    resource: str = "nvidia.com/gpu"
    gpu: int = Field(ge=0)
    gi: int | None = None
    replica: int | None = Field(default=None, ge=0)


class Container(_Model):
    name: str
    id: str = ""  # "" → 64 hex derived from namespace/pod/container
    runtime: Runtime = "containerd"
    devices: list[DeviceRef] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if value and not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError(f"container id {value!r} must be 64 lowercase hex digits")
        return value


class Pod(_Model):
    name: str
    namespace: str = "default"
    uid: str = ""  # "" → derived from namespace/name
    qos: Literal["guaranteed", "burstable", "besteffort"] = "burstable"
    containers: list[Container] = Field(default_factory=list)


class CpuSpec(_Model):
    packages: int = Field(default=1, ge=1)
    cores: int = Field(default=64, ge=1)  # logical CPUs, for /proc/stat
    idle_w: float = Field(default=40.0, ge=0)  # whole host, split evenly across packages
    w_per_core: float = Field(default=6.0, ge=0)
    dram_w: float = Field(default=0.0, ge=0)  # > 0 adds an intel-rapl:N:0 "dram" zone per package
    # DRAM's dynamic part: W per busy core on top of dram_w (split evenly over packages, like the package's);
    # 0 keeps the DRAM zones flat, as before.
    dram_w_per_core: float = Field(default=0.0, ge=0)
    max_range_uj: int = Field(default=262_143_328_850, gt=0)


class DcgmSpec(_Model):
    """The node's dcgm-exporter: ``-c`` (30 s by default, as the real one) and its collections' phase."""

    collect_interval_s: float = Field(default=30.0, gt=0)
    collect_offset_s: float = Field(default=0.0, ge=0)  # collections at offset + k·interval
    extra_fields: list[str] = Field(default_factory=list)  # beyond the default counters, e.g. the violations

    @model_validator(mode="after")
    def _offset_within_interval(self) -> DcgmSpec:
        if self.collect_offset_s >= self.collect_interval_s:
            raise ValueError("collect_offset_s must be less than collect_interval_s")
        return self


class ClusterNode(_Model):
    name: str = Field(min_length=1)
    allocatable: dict[str, int] = Field(default_factory=dict)  # e.g. {nvidia.com/gpu: 8}


class ClusterPod(_Model):
    """A pod of the wider cluster (the k8s_cluster receiver's view): Pending from ``created_s`` until
    ``scheduled_s`` (None: never), then Running on ``node`` until ``finished_s`` (None: never)."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    requests: dict[str, int] = Field(default_factory=dict)  # resource → devices, per container
    containers: int = Field(default=1, ge=1)
    created_s: float = Field(default=0.0, ge=0)
    scheduled_s: float | None = None
    node: str = ""
    finished_s: float | None = None
    claims: list[str] = Field(default_factory=list)  # DRA ResourceClaims (same namespace) its first container uses

    @model_validator(mode="after")
    def _order(self) -> ClusterPod:
        if self.scheduled_s is not None and (self.scheduled_s < self.created_s or not self.node):
            raise ValueError(f"pod {self.name}: scheduled_s needs a node and must not be before created_s")
        if self.finished_s is not None and (self.scheduled_s is None or self.finished_s < self.scheduled_s):
            raise ValueError(f"pod {self.name}: finished_s needs scheduled_s before it")
        return self


class DraDevice(_Model):
    name: str = Field(min_length=1)
    uuid: str = Field(min_length=1)  # the driver's ``uuid`` attribute: GPU-… (or MIG-…)


class DraSlice(_Model):
    """A ResourceSlice (resource.k8s.io/v1): one pool of devices a DRA driver publishes for a node."""

    name: str = Field(min_length=1)
    node: str = Field(min_length=1)
    driver: str = "gpu.nvidia.com"
    pool: str = ""  # "" → the node's name
    devices: list[DraDevice] = Field(default_factory=list)


class DraClaim(_Model):
    """A ResourceClaim, allocated at ``allocated_s`` to ``devices`` (``pool/device``) and reserved for ``pod``."""

    name: str = Field(min_length=1)
    namespace: str = "default"
    pod: str = Field(min_length=1)  # a cluster pod in the same namespace
    shared_with: list[str] = Field(default_factory=list)  # more pods the claim is reserved for (a shared claim)
    driver: str = "gpu.nvidia.com"
    devices: list[str] = Field(default_factory=list)
    allocated_s: float = Field(default=0.0, ge=0)


class ClusterSpec(_Model):
    """The cluster beyond this node, for the cluster-wide receiver and DRA (simulator/k8s_cluster_api.py)."""

    nodes: list[ClusterNode] = Field(default_factory=list)
    pods: list[ClusterPod] = Field(default_factory=list)
    slices: list[DraSlice] = Field(default_factory=list)
    claims: list[DraClaim] = Field(default_factory=list)


class Scenario(_Model):
    node: Node = Field(default_factory=Node)
    gpus: list[Gpu] = Field(default_factory=list)
    pods: list[Pod] = Field(default_factory=list)
    processes: list[Process] = Field(default_factory=list)
    cpu: CpuSpec = Field(default_factory=CpuSpec)
    dcgm: DcgmSpec = Field(default_factory=DcgmSpec)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    faults: list[Annotated[Fault, Field(discriminator="target")]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _resolve_and_check(self) -> Scenario:
        for index, gpu in enumerate(self.gpus):
            if not gpu.uuid:
                gpu.uuid = "GPU-" + hashed_uuid("gpu", self.node.name, index)
            if not gpu.pci_bus_id:
                gpu.pci_bus_id = f"00000000:{(0x18 + 0x11 * index) % 0x100:02X}:00.0"
        for pod in self.pods:
            if not pod.uid:
                pod.uid = hashed_uuid("pod", pod.namespace, pod.name)
            for container in pod.containers:
                if not container.id:
                    container.id = _hex64("container", pod.namespace, pod.name, container.name)
        _check_references(self)
        return self

    # --- lookups used by every face -------------------------------------------------------------

    def container_ref(self, ref: str) -> tuple[Pod, Container]:
        namespace, pod_name, container_name = ref.split("/")
        for pod in self.pods:
            if pod.namespace == namespace and pod.name == pod_name:
                for container in pod.containers:
                    if container.name == container_name:
                        return pod, container
        raise KeyError(ref)

    def gpu_changes(self, index: int) -> list[tuple[float, GpuChange]]:
        """Live reconfigurations of GPU ``index``, in time order."""
        changes = [(f.at_s, f.set) for f in self.faults if isinstance(f, GpuFault) and f.gpu == index]
        return sorted(changes, key=lambda change: change[0])

    def mig_at(self, index: int, at_s: float) -> MigSpec | None:
        mig = self.gpus[index].mig
        for change_s, change in self.gpu_changes(index):
            if change_s <= at_s and "mig" in change.model_fields_set:
                mig = change.mig
        return mig


def _check_references(scenario: Scenario) -> None:
    gpu_count = len(scenario.gpus)
    problems: list[str] = []
    for index, gpu in enumerate(scenario.gpus):
        for peer, links in gpu.topology.nvlinks.items():
            if not 0 <= peer < gpu_count or peer == index:
                problems.append(f"gpus.{index}.topology.nvlinks: no peer GPU {peer}")
            elif scenario.gpus[peer].topology.nvlinks.get(index) != links:
                problems.append(f"gpus.{index}.topology.nvlinks.{peer}: GPU {peer} must list {links} links back")
    names: set[tuple[str, str]] = set()
    for p_index, pod in enumerate(scenario.pods):
        if (pod.namespace, pod.name) in names:
            problems.append(f"pods.{p_index}: duplicate pod {pod.namespace}/{pod.name}")
        names.add((pod.namespace, pod.name))
        for c_index, container in enumerate(pod.containers):
            for d_index, device in enumerate(container.devices):
                where = f"pods.{p_index}.containers.{c_index}.devices.{d_index}"
                problems.extend(_check_device(scenario, device, where))
    pids: dict[int, int] = {}
    for index, process in enumerate(scenario.processes):
        where = f"processes.{index} (pid {process.pid})"
        if process.pid in pids:
            problems.append(f"{where}: duplicate pid: processes.{pids[process.pid]} has it; {_ONE_PID}")
        pids.setdefault(process.pid, index)
        refs = [("container", process.container)]
        refs += [(f"moves.{n}.container", move.container) for n, move in enumerate(process.moves)]
        for key, ref in refs:
            if ref is not None:
                try:
                    scenario.container_ref(ref)
                except (KeyError, ValueError):
                    problems.append(f"{where}.{key}: no container {ref!r} (namespace/pod/name)")
        if process.gpu is not None:
            if process.gpu >= gpu_count:
                problems.append(f"{where}.gpu: no GPU {process.gpu}")
                continue
            mig = scenario.mig_at(process.gpu, process.start_s)
            if mig is not None and process.gi is None:
                problems.append(f"{where}.gi: GPU {process.gpu} is in MIG mode at start_s; name the instance")
            if mig is None and process.gi is not None:
                problems.append(f"{where}.gi: GPU {process.gpu} is not in MIG mode at start_s")
            if mig is not None and process.gi is not None and mig.instance(process.gi) is None:
                problems.append(f"{where}.gi: GPU {process.gpu} has no GPU instance {process.gi}")
    for index, fault in enumerate(scenario.faults):
        gpu_index = fault.gpu if isinstance(fault, (GpuFault, NvmlFault)) else None
        if gpu_index is not None and gpu_index >= gpu_count:
            problems.append(f"faults.{index}.gpu: no GPU {gpu_index}")
        if isinstance(fault, GpuFault) and fault.gpu < gpu_count and fault.set.mig is not None:
            try:
                _check_mig_fits(scenario.gpus[fault.gpu].model, fault.set.mig)
            except ValueError as err:
                problems.append(f"faults.{index}.set.{err}")
        if isinstance(fault, RaplFault) and fault.zone is not None and fault.zone not in _rapl_zones(scenario.cpu):
            problems.append(
                f"faults.{index}.zone: no RAPL zone {fault.zone!r} (the node has {_rapl_zones(scenario.cpu)})"
            )
    if problems:
        raise _Problems(problems)


def _rapl_zones(cpu: CpuSpec) -> list[str]:
    """The RAPL zones' directory names the simulated powercap tree has (simulator/fake_host.py)."""
    dram = cpu.dram_w > 0 or cpu.dram_w_per_core > 0
    return [zone for p in range(cpu.packages) for zone in (f"intel-rapl:{p}", *([f"intel-rapl:{p}:0"] if dram else []))]


class _Problems(ValueError):
    """The reference checks' problems, each its own message (and line) in :class:`ScenarioError`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _check_device(scenario: Scenario, device: DeviceRef, where: str) -> list[str]:
    if device.gpu >= len(scenario.gpus):
        return [f"{where}.gpu: no GPU {device.gpu}"]
    mig = scenario.gpus[device.gpu].mig
    if device.gi is None:
        return [f"{where}: GPU {device.gpu} is in MIG mode; allocate an instance (gi)"] if mig else []
    instance = mig.instance(device.gi) if mig else None
    if instance is None:
        return [f"{where}.gi: GPU {device.gpu} has no GPU instance {device.gi}"]
    expected = f"nvidia.com/mig-{instance.profile}"
    if device.resource not in (expected, "nvidia.com/gpu"):
        return [f"{where}.resource: {device.resource!r} does not match the instance's {expected!r}"]
    return []


def parse_scenario(data: Any, source: str = "<scenario>", where: YamlSource | None = None) -> Scenario:
    """Validate a parsed YAML document; :class:`ScenarioError` names each key's path (``gpus.0.idle_w``),
    its line when ``where`` (the file as read) is given, and the key meant when one is misspelt."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError([m for e in err.errors() for m in _messages(e, source, where)]) from None


def load_scenario(path: str | Path) -> Scenario:
    """The scenario file at ``path``; :class:`ScenarioError` (``scenario node.yaml:12 gpus.0.idle_w: …``)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        source = load_yaml_text(text, str(path), expand=False)
    except SourceError as err:
        raise ScenarioError(err.messages) from None
    data = source.data if source.data is not None else {}
    if not isinstance(data, dict):
        raise ScenarioError([f"{path}: a scenario is a mapping (node, gpus, pods, processes, …)"])
    if data and unrelated(data, sorted(Scenario.model_fields)):  # one line, none of its contents echoed
        raise ScenarioError(
            [
                f"{path}: not a scenario: none of its {len(data)} top-level keys is one a scenario has "
                "(node, gpus, pods, processes, …)"
            ]
        )
    return parse_scenario(data, source=str(path), where=source)


def _messages(error: Any, source: str, where: YamlSource | None) -> list[str]:
    """One pydantic error as messages: ``<file>:<line> <path>: <what>`` (the reference checks give several)."""
    loc: tuple[str | int, ...] = tuple(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _Problems):
        return [_located(source, where, _leading_path(p), p) for p in cause.problems]
    dotted = ".".join(str(part) for part in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        model = model_at(Scenario, loc[:-1])
        options = sorted(model.model_fields) if model is not None else []
        return [_located(source, where, loc, f"{dotted}: unknown key{suggest(str(loc[-1]), options)}")]
    if error["type"] == "missing":
        return [_located(source, where, loc, f"{dotted}: required key is missing")]
    return [_located(source, where, loc, f"{dotted}: {str(error['msg']).removeprefix('Value error, ')}")]


def _located(source: str, where: YamlSource | None, path: tuple[str | int, ...], text: str) -> str:
    line = where.line_of(path) if where is not None else None
    return f"{source}:{line} {text}" if line is not None else f"{source}: {text}"


def _leading_path(problem: str) -> tuple[str | int, ...]:
    """``processes.1 (pid 7).gpu: …`` → ``("processes", 1)``: where a reference problem is in the file."""
    head = re.match(r"[A-Za-z_]+(?:\.[A-Za-z0-9_]+)*", problem)
    parts = head.group(0).split(".") if head else []
    return tuple(int(p) if p.isdigit() else p for p in parts)
