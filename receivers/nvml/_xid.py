"""XID errors counted exactly, from NVML's event API (``saturation: true``).

dcgm-exporter's XID field holds the last code only; NVML delivers each XID as an event
(``nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError, set)``, then ``nvmlEventSetWait_v2``).
Each tick the set is drained without waiting (timeout 0) and every GPU's count grows by its events; the
count is cumulative since the receiver registered the GPU, as ``xid_count`` in a DeviceSignals record, and
the saturation processor takes its increase per window. A GPU that cannot register (MIG handles, a driver
without events) has no count: its XIDs are absent here, never 0.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import pynvml

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceSignals
from wattpipe.receivers.nvml._errors import NvmlFailure, nvml_call

__all__ = ["XidEvents"]

_MAX_PER_DRAIN = 10_000  # a storm of XIDs cannot hold a tick forever


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class XidEvents:
    """One event set for the receiver's GPUs; counts per GPU UUID."""

    def __init__(self) -> None:
        self._set: Any = None
        self._uuid_by_handle: dict[int, str] = {}
        self.counts: dict[str, int] = {}
        self.problems: list[str] = []

    def register(self, handle: Any, uuid: str) -> None:
        """Register a GPU (again after its handle changed); failures leave it without a count."""
        if _address(handle) in self._uuid_by_handle:
            return
        try:
            if self._set is None:
                self._set = nvml_call(pynvml.nvmlEventSetCreate)
            nvml_call(pynvml.nvmlDeviceRegisterEvents, handle, pynvml.nvmlEventTypeXidCriticalError, self._set)
        except NvmlFailure as exc:
            self.problems.append(f"XID events unavailable for {uuid}: {exc}")
            return
        self._uuid_by_handle[_address(handle)] = uuid
        self.counts.setdefault(uuid, 0)

    def drain(self) -> None:
        """Count every event waiting (blocking NVML calls: run off the event loop)."""
        if self._set is None:
            return
        for _ in range(_MAX_PER_DRAIN):
            try:
                event = nvml_call(pynvml.nvmlEventSetWait_v2, self._set, 0)
            except NvmlFailure:
                return  # NVML_ERROR_TIMEOUT: nothing waiting (any other failure: try next tick)
            if event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                uuid = self._uuid_by_handle.get(_address(event.device))
                if uuid is not None:
                    self.counts[uuid] += 1

    def records(self, now: Timestamp) -> list[DeviceSignals]:
        return [
            DeviceSignals(time=now, device_id=uuid, fields=(("xid_count", float(count)),), source="nvml")
            for uuid, count in self.counts.items()
        ]

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(NvmlFailure):
                nvml_call(pynvml.nvmlEventSetFree, self._set)
            self._set = None
