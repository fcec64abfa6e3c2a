"""The two NVML calls that return an array every tick, made through ctypes with a buffer kept per GPU.

pynvml's wrappers for these ask twice (a NULL-buffer probe for the size, then the fill) and turn every
struct into a Python object through ``__getattribute__`` overrides. At 64 processes per GPU that was the
largest part of the receiver's own CPU per tick, and the probe is one more driver call per GPU per tick.
Here each call fills a buffer kept from the previous tick; when the driver answers INSUFFICIENT_SIZE
(more processes than last time) the buffer grows to what it asked for, with room to spare, and the call
is made again. The C symbols and struct layouts are NVML's own (``nvmlProcessInfo_v2_t``, which the v3
call fills, and ``nvmlProcessUtilizationSample_t``); where a symbol is missing (an old driver) the
reading is NotSupported, as with pynvml's version-mismatch error.
"""

from __future__ import annotations

import ctypes
import operator
import struct
from collections.abc import Callable
from typing import Any

import pynvml

from wattpipe.receivers.nvml._errors import NotSupported

__all__ = ["ProcessEntry", "ProcessList", "UtilisationSamples"]

ProcessEntry = tuple[int, int | None, int, int]
"""(pid, used memory in bytes or None, GPU-instance id, compute-instance id), as the driver lists it."""

_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # usedGpuMemory where the driver cannot say (WDDM)
_MEMORY = operator.itemgetter(1)
_RETRIES = 3  # processes may start between the calls; the buffer grows each time


class _ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _UtilisationSample(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


# The same layouts as struct formats (native alignment, as the C compiler lays them out): a filled buffer is
# read in one ``iter_unpack`` instead of a ctypes object and an attribute read per field per entry.
_PROCESS_INFO = struct.Struct("@IQII")
_UTILISATION_SAMPLE = struct.Struct("@IQIIII")
assert _PROCESS_INFO.size == ctypes.sizeof(_ProcessInfo)
assert _UTILISATION_SAMPLE.size == ctypes.sizeof(_UtilisationSample)


class _Buffer:
    """A ctypes array of ``struct`` that only grows, and the count passed to and returned by the driver."""

    def __init__(self, struct: type[ctypes.Structure], size: int = 16) -> None:
        self._struct = struct
        self.count = ctypes.c_uint(0)
        self.array: Any = (struct * size)()
        self.size = size

    def grow(self, needed: int) -> None:
        self.size = max(self.size, needed * 2 + 8)
        self.array = (self._struct * self.size)()

    def fill(self, call: Callable[[Any, Any], int]) -> int:
        """``call(array, byref(count))`` until the buffer is large enough; the entries filled, or NVMLError."""
        for _ in range(_RETRIES):
            self.count.value = self.size
            ret = call(self.array, ctypes.byref(self.count))
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            self.grow(self.count.value)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        return min(self.count.value, self.size)

    def entries(self, layout: struct.Struct, filled: int) -> Any:
        """The first ``filled`` structs as tuples of their fields, in declaration order."""
        return layout.iter_unpack(memoryview(self.array).cast("B")[: filled * layout.size])


def _symbol(name: str) -> Callable[..., int]:
    try:
        fn: Callable[..., int] = pynvml._nvmlGetFunctionPointer(name)
    except pynvml.NVMLError as exc:
        if getattr(exc, "value", None) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise NotSupported(name, None, "this driver lacks the symbol") from None
        raise
    return fn


class ProcessList:
    """``nvmlDeviceGetComputeRunningProcesses_v3`` for one GPU, with its buffer."""

    __name__ = "nvmlDeviceGetComputeRunningProcesses"  # what nvml_call names in its messages

    def __init__(self) -> None:
        self._buffer = _Buffer(_ProcessInfo)

    def __call__(self, handle: Any) -> list[ProcessEntry]:
        fn = _symbol("nvmlDeviceGetComputeRunningProcesses_v3")
        filled = self._buffer.fill(lambda array, count: fn(handle, count, array))
        entries: list[ProcessEntry] = list(self._buffer.entries(_PROCESS_INFO, filled))
        if _NOT_AVAILABLE in map(_MEMORY, entries):  # (a test in C; most drivers give every process's memory)
            return [(pid, None if memory == _NOT_AVAILABLE else memory, gi, ci) for pid, memory, gi, ci in entries]
        return entries


class UtilisationSamples:
    """``nvmlDeviceGetProcessUtilization`` for one GPU, with its buffer: ``(pid, timestamp_us, sm %, mem %)``
    entries (``memUtil``: the share of the sample in which the process read or wrote device memory)."""

    __name__ = "nvmlDeviceGetProcessUtilization"

    def __init__(self) -> None:
        self._buffer = _Buffer(_UtilisationSample)

    def __call__(self, handle: Any, last_seen_us: int) -> list[tuple[int, int, float, float]]:
        fn = _symbol("nvmlDeviceGetProcessUtilization")
        since = ctypes.c_ulonglong(last_seen_us)
        # NOT_FOUND raises too: "no sample since then", for the caller to read as zero.
        filled = self._buffer.fill(lambda array, count: fn(handle, array, count, since))
        entries = self._buffer.entries(_UTILISATION_SAMPLE, filled)
        return [(pid, ts, float(sm), float(mem)) for pid, ts, sm, mem, _, _ in entries]
