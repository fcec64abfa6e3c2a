"""Saturation fields straight from NVML, for nodes without dcgm-exporter (``saturation: true``).

The same SI names the dcgm receiver uses, so the ``saturation`` processor reads either:
- ``nvmlDeviceGetViolationStatus(policy)`` → ``power_violation_s``, ``thermal_violation_s``,
  ``sync_boost_violation_s``, ``board_limit_violation_s``: NVML's ``violationTime`` is cumulative
  nanoseconds (its ``referenceTime`` is CPU µs; the processor uses its own tick times instead);
- ``nvmlDeviceGetCurrentClocksEventReasons`` (``…ClocksThrottleReasons`` on drivers before the rename)
  → ``clocks_event_reasons``, the bitmask as it is at the read;
- ``nvmlDeviceGetMemoryInfo`` → ``fb_used_bytes``, ``fb_free_bytes``, ``fb_total_bytes``.
A call the GPU does not support leaves its field out: absent, never 0. XIDs, counted from NVML's events,
are ``_xid``'s.
"""

from __future__ import annotations

from typing import Any

import pynvml

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceSignals
from wattpipe.receivers.nvml._errors import DeviceLost, NotSupported, NvmlFailure, nvml_call, nvml_optional

__all__ = ["VIOLATION_POLICIES", "read_saturation"]

VIOLATION_POLICIES: dict[str, int] = {
    "power_violation_s": pynvml.NVML_PERF_POLICY_POWER,
    "thermal_violation_s": pynvml.NVML_PERF_POLICY_THERMAL,
    "sync_boost_violation_s": pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    "board_limit_violation_s": pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
}


def _clock_reasons(handle: Any, problems: list[str]) -> int | None:
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(pynvml, name, None)
        if fn is None:
            continue
        try:
            return int(nvml_call(fn, handle))
        except NotSupported:
            return None
        except DeviceLost:
            raise
        except NvmlFailure as exc:
            if exc.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                continue  # a driver without this name: try the other
            problems.append(str(exc))
            return None
    return None


def read_saturation(handle: Any, uuid: str, now: Timestamp, problems: list[str]) -> DeviceSignals | None:
    """One GPU's saturation fields (None when the GPU gives none of them)."""
    fields: dict[str, float] = {}
    for name, policy in VIOLATION_POLICIES.items():
        violation = nvml_optional(problems, pynvml.nvmlDeviceGetViolationStatus, handle, policy)
        if violation is not None:
            fields[name] = violation.violationTime * 1e-9
    reasons = _clock_reasons(handle, problems)
    if reasons is not None:
        fields["clocks_event_reasons"] = float(reasons)
    memory = nvml_optional(problems, pynvml.nvmlDeviceGetMemoryInfo, handle)
    if memory is not None:
        fields["fb_used_bytes"] = float(memory.used)
        fields["fb_free_bytes"] = float(memory.free)
        fields["fb_total_bytes"] = float(memory.total)
    if not fields:
        return None
    return DeviceSignals(time=now, device_id=uuid, fields=tuple(sorted(fields.items())), source="nvml")
