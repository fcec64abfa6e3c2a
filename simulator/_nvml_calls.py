"""The device calls of the simulated NVML library, each with the real driver's semantics.

Each implementation receives the node, the scenario time of the call, the device its handle names (if
it takes one) and the raw ctypes arguments pynvml passed; it returns an NVML status code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pynvml

from wattpipe.simulator._ctypes_io import DeviceRef, as_int, out, write_handle, write_string
from wattpipe.simulator._util_samples import utilisation_entries
from wattpipe.simulator.hardware import gpu_model_info, mig_profile_memory_mib
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.saturation_truth import thermal_s

__all__ = ["DEVICE_CALLS", "Impl"]

Impl = Callable[..., Any]

# symbol → (implementation, whether its first argument is a device handle, position of a GPU index)
DEVICE_CALLS: dict[str, tuple[Impl, bool, int | None]] = {}

SUCCESS: int = pynvml.NVML_SUCCESS
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
_NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId when MIG is off
_MIB = 1024 * 1024
_COMPUTE_MODES = {
    "default": pynvml.NVML_COMPUTEMODE_DEFAULT,
    "exclusive_process": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    "prohibited": pynvml.NVML_COMPUTEMODE_PROHIBITED,
}


def _call(name: str, handle: bool = True, gpu_arg: int | None = None) -> Callable[[Impl], Impl]:
    """Register ``impl(node, t_s, device, *remaining C arguments) -> status`` as symbol ``name``."""

    def register(impl: Impl) -> Impl:
        DEVICE_CALLS[name] = (impl, handle, gpu_arg)
        return impl

    return register


# --- system and identity --------------------------------------------------------------------------


@_call("nvmlSystemGetDriverVersion", handle=False)
def _driver_version(node: SimulatedNode, t_s: float, _: None, buf: Any, length: Any) -> int:
    return SUCCESS if write_string(buf, length, node.scenario.node.driver_version) else INSUFFICIENT_SIZE


@_call("nvmlSystemGetNVMLVersion", handle=False)
def _nvml_version(node: SimulatedNode, t_s: float, _: None, buf: Any, length: Any) -> int:
    text = "13." + node.scenario.node.driver_version
    return SUCCESS if write_string(buf, length, text) else INSUFFICIENT_SIZE


@_call("nvmlSystemGetCudaDriverVersion", handle=False)
def _cuda_version(node: SimulatedNode, t_s: float, _: None, version: Any) -> int:
    out(version).value = 13000
    return SUCCESS


@_call("nvmlDeviceGetCount_v2", handle=False)
def _count(node: SimulatedNode, t_s: float, _: None, count: Any) -> int:
    out(count).value = len(node.scenario.gpus)
    return SUCCESS


@_call("nvmlDeviceGetHandleByIndex_v2", handle=False, gpu_arg=0)
def _handle_by_index(node: SimulatedNode, t_s: float, _: None, index: Any, handle: Any) -> int:
    gpu = as_int(index)
    if not 0 <= gpu < len(node.scenario.gpus):
        return INVALID_ARGUMENT
    write_handle(handle, DeviceRef(gpu))
    return SUCCESS


@_call("nvmlDeviceGetHandleByUUID", handle=False)
def _handle_by_uuid(node: SimulatedNode, t_s: float, _: None, uuid: Any, handle: Any) -> int:
    wanted = (getattr(uuid, "value", uuid) or b"").decode()
    for index, gpu in enumerate(node.scenario.gpus):
        if gpu.uuid == wanted:
            write_handle(handle, DeviceRef(index))
            return SUCCESS
        mig = node.truth.gpu_state(index, t_s).mig
        for instance in mig.instances if mig else []:
            if mig_uuid(gpu.uuid, instance.gi) == wanted:
                write_handle(handle, DeviceRef(index, instance.gi))
                return SUCCESS
    return NOT_FOUND


def mig_uuid(gpu_uuid: str, gi: int) -> str:
    """The R470+ MIG device UUID (``MIG-<uuid>``), derived from the parent UUID and the instance."""
    digest = hashlib.sha256(f"{gpu_uuid}/{gi}".encode()).hexdigest()
    return f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


@_call("nvmlDeviceGetIndex")
def _index(node: SimulatedNode, t_s: float, device: DeviceRef, index: Any) -> int:
    if device.gi is not None:
        return NOT_SUPPORTED
    out(index).value = device.gpu
    return SUCCESS


@_call("nvmlDeviceGetMinorNumber")
def _minor(node: SimulatedNode, t_s: float, device: DeviceRef, minor: Any) -> int:
    if device.gi is not None:
        return NOT_SUPPORTED
    out(minor).value = device.gpu  # /dev/nvidia<minor>
    return SUCCESS


@_call("nvmlDeviceGetUUID")
def _uuid(node: SimulatedNode, t_s: float, device: DeviceRef, buf: Any, length: Any) -> int:
    uuid = node.scenario.gpus[device.gpu].uuid
    text = uuid if device.gi is None else mig_uuid(uuid, device.gi)
    return SUCCESS if write_string(buf, length, text) else INSUFFICIENT_SIZE


@_call("nvmlDeviceGetName")
def _name(node: SimulatedNode, t_s: float, device: DeviceRef, buf: Any, length: Any) -> int:
    name = node.scenario.gpus[device.gpu].model
    if device.gi is not None:
        name += f" MIG {_profile(node, t_s, device)}"
    return SUCCESS if write_string(buf, length, name) else INSUFFICIENT_SIZE


@_call("nvmlDeviceGetSerial")
def _serial(node: SimulatedNode, t_s: float, device: DeviceRef, buf: Any, length: Any) -> int:
    digits = str(int(hashlib.sha256(node.scenario.gpus[device.gpu].uuid.encode()).hexdigest(), 16))[:13]
    return SUCCESS if write_string(buf, length, digits) else INSUFFICIENT_SIZE


@_call("nvmlDeviceGetArchitecture")
def _architecture(node: SimulatedNode, t_s: float, device: DeviceRef, arch: Any) -> int:
    out(arch).value = gpu_model_info(node.scenario.gpus[device.gpu].model).architecture
    return SUCCESS


def fill_pci(pci: Any, bus_id: str) -> None:
    domain, bus, dev_fn = bus_id.split(":")
    pci.busId = bus_id.encode()
    pci.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{dev_fn}".encode()
    pci.domain = int(domain, 16)
    pci.bus = int(bus, 16)
    pci.device = int(dev_fn.split(".")[0], 16)
    pci.pciDeviceId = 0x233010DE
    pci.pciSubSystemId = 0x16C110DE


@_call("nvmlDeviceGetPciInfo_v3")
def _pci_info(node: SimulatedNode, t_s: float, device: DeviceRef, pci: Any) -> int:
    fill_pci(out(pci), node.scenario.gpus[device.gpu].pci_bus_id)
    return SUCCESS


# --- power, energy, memory, utilisation -----------------------------------------------------------


@_call("nvmlDeviceGetPowerUsage")
def _power(node: SimulatedNode, t_s: float, device: DeviceRef, milliwatts: Any) -> int:
    if device.gi is not None:
        return NOT_SUPPORTED  # board-level sensor: MIG devices have none of their own
    out(milliwatts).value = node.power_reading_mw(device.gpu, t_s)
    return SUCCESS


@_call("nvmlDeviceGetTotalEnergyConsumption")
def _energy(node: SimulatedNode, t_s: float, device: DeviceRef, millijoules: Any) -> int:
    if device.gi is not None or not node.scenario.gpus[device.gpu].energy_counter:
        return NOT_SUPPORTED
    out(millijoules).value = node.energy_counter_mj(device.gpu, t_s)
    return SUCCESS


@_call("nvmlDeviceGetPowerManagementLimit")
@_call("nvmlDeviceGetEnforcedPowerLimit")
def _power_limit(node: SimulatedNode, t_s: float, device: DeviceRef, limit: Any) -> int:
    if device.gi is not None:
        return NOT_SUPPORTED
    out(limit).value = round(node.truth.gpu_state(device.gpu, t_s).max_w * 1000)
    return SUCCESS


@_call("nvmlDeviceGetMemoryInfo")
def _memory(node: SimulatedNode, t_s: float, device: DeviceRef, memory: Any) -> int:
    if device.gi is None:
        total_mib = node.scenario.gpus[device.gpu].memory_mib or 0
    else:
        total_mib = mig_profile_memory_mib(_profile(node, t_s, device))
    used_mib = min(total_mib, node.truth.memory_used_mib(device.gpu, t_s, device.gi))
    info = out(memory)
    info.total = int(total_mib * _MIB)
    info.used = int(used_mib * _MIB)
    info.free = info.total - info.used
    return SUCCESS


@_call("nvmlDeviceGetUtilizationRates")
def _utilization(node: SimulatedNode, t_s: float, device: DeviceRef, rates: Any) -> int:
    if device.gi is not None or node.truth.gpu_state(device.gpu, t_s).mig is not None:
        return NOT_SUPPORTED  # per-instance activity is a DCGM profiling metric, not an NVML one
    activity = node.truth.activity(device.gpu, None, t_s - 1.0, t_s)
    util = out(rates)
    util.gpu = round(100 * activity)
    util.memory = round(50 * activity)  # synthetic: memory-controller busy half as often as the SMs
    return SUCCESS


@_call("nvmlDeviceGetTemperature")
def _temperature(node: SimulatedNode, t_s: float, device: DeviceRef, sensor: Any, celsius: Any) -> int:
    if device.gi is not None or as_int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
        return NOT_SUPPORTED
    out(celsius).value = node.temperature_c(device.gpu, t_s)
    return SUCCESS


@_call("nvmlDeviceGetComputeMode")
def _compute_mode(node: SimulatedNode, t_s: float, device: DeviceRef, mode: Any) -> int:
    out(mode).value = _COMPUTE_MODES[node.truth.gpu_state(device.gpu, t_s).compute_mode]
    return SUCCESS


# --- processes --------------------------------------------------------------------------------------


@_call("nvmlDeviceGetComputeRunningProcesses_v3")
def _compute_processes(node: SimulatedNode, t_s: float, device: DeviceRef, count: Any, infos: Any) -> int:
    # On a MIG-enabled parent every process is listed with its instance ids; a MIG device lists its own.
    running = node.truth.running(device.gpu, t_s, device.gi)
    counter = out(count)
    capacity = counter.value
    counter.value = len(running)
    if infos is None:
        # The NULL-buffer probe: SUCCESS with 0 means "no processes", otherwise "this many".
        return SUCCESS if not running else INSUFFICIENT_SIZE
    if capacity < len(running):
        return INSUFFICIENT_SIZE
    for slot, plan in enumerate(running):
        info = infos[slot]
        info.pid = plan.pid
        info.usedGpuMemory = int(plan.spec.memory_mib * _MIB)
        info.gpuInstanceId = _NO_ID if plan.gi is None else plan.gi
        info.computeInstanceId = _NO_ID if plan.gi is None else 0
    return SUCCESS


@_call("nvmlDeviceGetGraphicsRunningProcesses_v3")
@_call("nvmlDeviceGetMPSComputeRunningProcesses_v3")
def _no_processes(node: SimulatedNode, t_s: float, device: DeviceRef, count: Any, infos: Any) -> int:
    out(count).value = 0  # the scenario models compute (CUDA) contexts only, and no MPS
    return SUCCESS


@_call("nvmlDeviceGetProcessUtilization")
def _process_utilization(
    node: SimulatedNode, t_s: float, device: DeviceRef, samples: Any, count: Any, last_seen: Any
) -> int:
    if device.gi is not None or node.truth.gpu_state(device.gpu, t_s).mig is not None:
        return NOT_SUPPORTED
    entries = utilisation_entries(
        node.truth,
        device.gpu,
        t_s,
        start_wall_us=round(node.start_wall_s * 1e6),
        last_seen_us=as_int(last_seen),
        buffer_samples=node.scenario.node.sample_buffer,
    )
    if not entries:
        return NOT_FOUND  # no samples newer than lastSeenTimeStamp: utilisation 0, not an error
    counter = out(count)
    capacity = counter.value
    counter.value = len(entries)
    if samples is None or capacity < len(entries):
        return INSUFFICIENT_SIZE
    for slot, entry in enumerate(entries):
        sample = samples[slot]
        sample.pid = entry.pid
        sample.timeStamp = entry.timestamp_us
        sample.smUtil = entry.sm_util_pct
        sample.memUtil = entry.mem_util_pct
        sample.encUtil = 0
        sample.decUtil = 0
    return SUCCESS


# --- MIG --------------------------------------------------------------------------------------------


def _profile(node: SimulatedNode, t_s: float, device: DeviceRef) -> str:
    mig = node.truth.gpu_state(device.gpu, t_s).mig
    instance = mig.instance(device.gi) if mig and device.gi is not None else None
    return instance.profile if instance else "unknown"


@_call("nvmlDeviceGetMigMode")
def _mig_mode(node: SimulatedNode, t_s: float, device: DeviceRef, current: Any, pending: Any) -> int:
    if device.gi is not None or not gpu_model_info(node.scenario.gpus[device.gpu].model).mig_capable:
        return NOT_SUPPORTED
    enabled = int(node.truth.gpu_state(device.gpu, t_s).mig is not None)
    out(current).value = enabled
    out(pending).value = enabled
    return SUCCESS


@_call("nvmlDeviceGetMaxMigDeviceCount")
def _max_mig(node: SimulatedNode, t_s: float, device: DeviceRef, count: Any) -> int:
    if device.gi is not None:
        return INVALID_ARGUMENT
    # "Returns zero if MIG is not supported or enabled."
    enabled = node.truth.gpu_state(device.gpu, t_s).mig is not None
    out(count).value = gpu_model_info(node.scenario.gpus[device.gpu].model).mig_slices if enabled else 0
    return SUCCESS


@_call("nvmlDeviceGetMigDeviceHandleByIndex")
def _mig_handle(node: SimulatedNode, t_s: float, device: DeviceRef, index: Any, handle: Any) -> int:
    info = gpu_model_info(node.scenario.gpus[device.gpu].model)
    if device.gi is not None or not info.mig_capable:
        return NOT_SUPPORTED
    position = as_int(index)
    if not 0 <= position < info.mig_slices:
        return INVALID_ARGUMENT
    mig = node.truth.gpu_state(device.gpu, t_s).mig
    instances = sorted(mig.instances, key=lambda inst: inst.gi) if mig else []
    if position >= len(instances):
        return NOT_FOUND
    write_handle(handle, DeviceRef(device.gpu, instances[position].gi))
    return SUCCESS


@_call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
def _parent_handle(node: SimulatedNode, t_s: float, device: DeviceRef, handle: Any) -> int:
    if device.gi is None:
        return INVALID_ARGUMENT
    write_handle(handle, DeviceRef(device.gpu))
    return SUCCESS


@_call("nvmlDeviceIsMigDeviceHandle")
def _is_mig(node: SimulatedNode, t_s: float, device: DeviceRef, is_mig: Any) -> int:
    out(is_mig).value = int(device.gi is not None)
    return SUCCESS


@_call("nvmlDeviceGetGpuInstanceId")
def _gpu_instance_id(node: SimulatedNode, t_s: float, device: DeviceRef, gi: Any) -> int:
    if device.gi is None:
        return NOT_SUPPORTED
    out(gi).value = device.gi
    return SUCCESS


@_call("nvmlDeviceGetComputeInstanceId")
def _compute_instance_id(node: SimulatedNode, t_s: float, device: DeviceRef, ci: Any) -> int:
    if device.gi is None:
        return NOT_SUPPORTED
    out(ci).value = 0  # one compute instance per GPU instance, as the GPU Operator creates them
    return SUCCESS


# --- saturation (docs/saturation.md) ------------------------------------------------------------------


def _throttled_s(node: SimulatedNode, gpu: int, policy: int, t_s: float) -> float | None:
    """Cumulative seconds the GPU was held back by ``policy`` (POWER 0, THERMAL 1, SYNC_BOOST 2, BOARD_LIMIT 3)."""
    if policy == pynvml.NVML_PERF_POLICY_POWER:
        return node.truth.device_capped_s(gpu, t_s)
    if policy == pynvml.NVML_PERF_POLICY_THERMAL:
        return thermal_s(node, gpu, t_s)
    if policy in (pynvml.NVML_PERF_POLICY_SYNC_BOOST, pynvml.NVML_PERF_POLICY_BOARD_LIMIT):
        return 0.0
    return None


@_call("nvmlDeviceGetViolationStatus")
def _violation_status(node: SimulatedNode, t_s: float, device: DeviceRef, policy: Any, violation: Any) -> int:
    if device.gi is not None:
        return NOT_SUPPORTED
    held_s = _throttled_s(node, device.gpu, as_int(policy), t_s)
    if held_s is None:
        return NOT_SUPPORTED
    result = out(violation)
    result.referenceTime = round(node.wall_at(t_s) * 1e6)  # CPU µs
    result.violationTime = round(held_s * 1e9)  # cumulative ns
    return SUCCESS


@_call("nvmlDeviceGetCurrentClocksEventReasons")
@_call("nvmlDeviceGetCurrentClocksThrottleReasons")
def _clocks_event_reasons(node: SimulatedNode, t_s: float, device: DeviceRef, reasons: Any) -> int:
    if device.gi is not None:
        return NOT_SUPPORTED
    gpu, since_s = device.gpu, max(0.0, t_s - 1.0)
    capped = node.truth.device_capped_s(gpu, t_s) > node.truth.device_capped_s(gpu, since_s)
    thermal = thermal_s(node, gpu, t_s) > thermal_s(node, gpu, since_s)
    idle = node.truth.activity(gpu, None, since_s, t_s) == 0.0 if t_s > 0 else True
    out(reasons).value = (0x4 if capped else 0) | (0x20 if thermal else 0) | (0x1 if idle else 0)
    return SUCCESS
