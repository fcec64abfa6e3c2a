"""How a Python stand-in for a C library reads its arguments and writes its outputs.

pynvml passes outputs as ``byref(x)`` (a ``CArgObject`` whose ``_obj`` is ``x``), strings as
``create_string_buffer`` arrays, inputs as plain ints or ctypes scalars, and device handles as
``c_nvmlDevice_t`` (an opaque pointer). The simulator never dereferences a handle: the pointer's value
encodes which device it names.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceRef", "as_int", "decode_handle", "encode_handle", "out", "write_handle", "write_string"]

# Handles are fake addresses in a range no allocator hands out here; bits 0–7: 0 = the physical GPU,
# gi + 1 = a MIG device; bits 8 and up: the GPU index.
_HANDLE_BASE = 0x5EA1_0000_0000
_HANDLE_SPAN = 1 << 24


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """What a handle names: a physical GPU (``gi`` None) or one of its MIG devices."""

    gpu: int
    gi: int | None = None


def encode_handle(device: DeviceRef) -> int:
    return _HANDLE_BASE + (device.gpu << 8) + (0 if device.gi is None else device.gi + 1)


def decode_handle(handle: Any) -> DeviceRef | None:
    """The device a handle names, or None for anything that is not one of ours."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    if address is None or not _HANDLE_BASE <= address < _HANDLE_BASE + _HANDLE_SPAN:
        return None
    offset = address - _HANDLE_BASE
    slot = offset & 0xFF
    return DeviceRef(gpu=offset >> 8, gi=None if slot == 0 else slot - 1)


def out(ref: Any) -> Any:
    """The object behind ``byref(x)`` (or ``x`` itself when passed directly)."""
    return getattr(ref, "_obj", ref)


def as_int(value: Any) -> int:
    """An input argument as an int, whether passed as a Python int or a ctypes scalar."""
    return int(getattr(value, "value", value))


def write_handle(ref: Any, device: DeviceRef) -> None:
    pointer = out(ref)
    ctypes.c_void_p.from_buffer(pointer).value = encode_handle(device)


def write_string(buffer: Any, length: Any, text: str) -> bool:
    """Copy ``text`` NUL-terminated into a caller's buffer; False if it does not fit (INSUFFICIENT_SIZE)."""
    data = text.encode()
    if len(data) + 1 > as_int(length):
        return False
    buffer.value = data
    return True
