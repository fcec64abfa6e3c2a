"""The NVML C symbols the simulated library exports, and the error names faults may use."""

from __future__ import annotations

import pynvml

__all__ = ["ALIASES", "ERROR_CODES", "SYMBOLS", "c_symbol"]

# Every C symbol the fake library implements. A wrapper whose symbol is missing gets
# NVMLError_FunctionNotFound from pynvml, exactly as with an old driver.
SYMBOLS: frozenset[str] = frozenset(
    {
        "nvmlInitWithFlags",
        "nvmlInit_v2",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlEventSetCreate",
        "nvmlEventSetFree",
        "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2",
    }
)

# pynvml's Python names whose C symbol differs; fault rules may use either spelling.
ALIASES: dict[str, str] = {
    "nvmlInit": "nvmlInitWithFlags",
    "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses": "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses": "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetNvLinkRemotePciInfo": "nvmlDeviceGetNvLinkRemotePciInfo_v2",
}

# "GPU_IS_LOST" → 15, from pynvml's own constants so the names always match the installed binding.
ERROR_CODES: dict[str, int] = {
    name.removeprefix("NVML_ERROR_"): value
    for name, value in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}


def c_symbol(name: str) -> str:
    """The C symbol for a Python wrapper name or a C symbol name; KeyError if not simulated."""
    symbol = ALIASES.get(name, name)
    if symbol not in SYMBOLS:
        raise KeyError(name)
    return symbol
