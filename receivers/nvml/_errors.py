"""NVML errors, typed at the boundary: the rest of wattpipe never sees an ``NVMLError`` code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

__all__ = [
    "DeviceLost",
    "LibraryMissing",
    "NoPermission",
    "NotFound",
    "NotSupported",
    "NvmlFailure",
    "nvml_call",
    "nvml_optional",
]

T = TypeVar("T")


class NvmlFailure(Exception):
    """An NVML call failed; ``code`` is NVML's return code, ``call`` the wrapper's name."""

    def __init__(self, call: str, code: int | None, text: str) -> None:
        super().__init__(f"{call}: {text}")
        self.call = call
        self.code = code


class NotSupported(NvmlFailure):
    """This GPU cannot answer this question (e.g. the energy counter before Volta)."""


class NoPermission(NvmlFailure):
    pass


class NotFound(NvmlFailure):
    """Nothing to report (e.g. no utilisation samples since the last call): not an error."""


class DeviceLost(NvmlFailure):
    """The GPU fell off the bus or stopped answering; its handle must be re-acquired."""


class LibraryMissing(NvmlFailure):
    """No NVIDIA driver here: libnvidia-ml.so.1 is absent or the kernel module is not loaded."""


_BY_CODE: dict[int, type[NvmlFailure]] = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: NotSupported,
    pynvml.NVML_ERROR_NO_PERMISSION: NoPermission,
    pynvml.NVML_ERROR_NOT_FOUND: NotFound,
    pynvml.NVML_ERROR_GPU_IS_LOST: DeviceLost,
    pynvml.NVML_ERROR_UNKNOWN: DeviceLost,  # what a GPU that fell off the bus usually answers
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: LibraryMissing,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: LibraryMissing,
}


def nvml_call(fn: Callable[..., T], *args: Any) -> T:
    """Call a pynvml wrapper, turning its errors into ours."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        klass = _BY_CODE.get(code, NvmlFailure) if isinstance(code, int) else NvmlFailure
        raise klass(getattr(fn, "__name__", "nvml"), code, str(exc)) from None
    except pynvml.NVMLLibraryMismatchError as exc:  # a symbol this driver lacks: not an NVMLError
        raise NotSupported(getattr(fn, "__name__", "nvml"), None, f"this driver lacks the symbol ({exc})") from None


def nvml_optional(problems: list[str], fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)`` through NVML's error mapping, ``None`` where the device does not support it or the
    call failed (the failure noted in ``problems``); a lost device still raises."""
    try:
        return nvml_call(fn, *args)
    except NotSupported:
        return None
    except DeviceLost:
        raise
    except NvmlFailure as exc:
        problems.append(str(exc))
        return None
