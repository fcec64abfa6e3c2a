"""NVML's event API in the simulated library, for XID errors (the scenario's ``gpus[].xid``).

``nvmlEventSetCreate`` hands out an opaque set (a fake address, like device handles); a GPU registered
for ``nvmlEventTypeXidCriticalError`` receives every XID the scenario raises after its registration, one
per ``nvmlEventSetWait_v2``, in time order; with none waiting, the wait answers ``NVML_ERROR_TIMEOUT`` at
once (simulated time does not pass while a call blocks). Other event types are accepted and never fire.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import pynvml

from wattpipe.simulator._ctypes_io import DeviceRef, as_int, encode_handle, out
from wattpipe.simulator._nvml_calls import INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS, _call
from wattpipe.simulator.node import SimulatedNode

__all__: list[str] = []

_SET_BASE = 0x5EB2_0000_0000
_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
_XID: int = pynvml.nvmlEventTypeXidCriticalError
_NO_ID = 0xFFFFFFFF


@dataclass
class _EventSet:
    delivered: dict[int, int] = field(default_factory=dict)  # gpu → XIDs already delivered (or before registering)


_sets: weakref.WeakKeyDictionary[SimulatedNode, dict[int, _EventSet]] = weakref.WeakKeyDictionary()
_ids = itertools.count(1)
_lock = threading.Lock()


def _set_of(node: SimulatedNode, handle: Any) -> _EventSet | None:
    address = ctypes.cast(handle, ctypes.c_void_p).value or 0
    return _sets.get(node, {}).get(address - _SET_BASE)


def _raised(node: SimulatedNode, gpu: int, t_s: float) -> list[tuple[float, int]]:
    return sorted((at, code) for at, code in node.scenario.gpus[gpu].xid if at <= t_s)


@_call("nvmlEventSetCreate", handle=False)
def _create(node: SimulatedNode, t_s: float, _: None, set_ref: Any) -> int:
    with _lock:
        number = next(_ids)
        _sets.setdefault(node, {})[number] = _EventSet()
    ctypes.c_void_p.from_buffer(out(set_ref)).value = _SET_BASE + number
    return SUCCESS


@_call("nvmlEventSetFree", handle=False)
def _free(node: SimulatedNode, t_s: float, _: None, handle: Any) -> int:
    address = ctypes.cast(handle, ctypes.c_void_p).value or 0
    with _lock:
        return SUCCESS if _sets.get(node, {}).pop(address - _SET_BASE, None) is not None else INVALID_ARGUMENT


@_call("nvmlDeviceRegisterEvents")
def _register(node: SimulatedNode, t_s: float, device: DeviceRef, types: Any, handle: Any) -> int:
    if device.gi is not None:
        return NOT_SUPPORTED
    event_set = _set_of(node, handle)
    if event_set is None:
        return INVALID_ARGUMENT
    if as_int(types) & _XID:
        with _lock:
            event_set.delivered.setdefault(device.gpu, len(_raised(node, device.gpu, t_s)))
    return SUCCESS


@_call("nvmlEventSetWait_v2", handle=False)
def _wait(node: SimulatedNode, t_s: float, _: None, handle: Any, data: Any, timeout_ms: Any) -> int:
    event_set = _set_of(node, handle)
    if event_set is None:
        return INVALID_ARGUMENT
    with _lock:
        pending: list[tuple[float, int, int]] = []
        for gpu, delivered in event_set.delivered.items():
            raised = _raised(node, gpu, t_s)
            if len(raised) > delivered:
                pending.append((raised[delivered][0], gpu, raised[delivered][1]))
        if not pending:
            return _TIMEOUT
        first = min(pending)
        gpu, code = first[1], first[2]
        event_set.delivered[gpu] += 1
    event = out(data)
    ctypes.c_void_p.from_buffer(event, type(event).device.offset).value = encode_handle(DeviceRef(gpu))
    event.eventType = _XID
    event.eventData = code
    event.gpuInstanceId = _NO_ID
    event.computeInstanceId = _NO_ID
    return SUCCESS
