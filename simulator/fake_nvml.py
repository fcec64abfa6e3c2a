"""A stand-in for ``libnvidia-ml.so`` underneath pynvml, so pynvml's own wrapper code runs for real.

pynvml looks every C symbol up with ``getattr(pynvml.nvmlLib, NAME)`` and caches it in
``pynvml._nvmlGetFunctionPointer_cache``. :func:`install_nvml` puts a :class:`SimulatedNvmlLibrary` in
``nvmlLib`` and a fresh cache in place; :func:`uninstall_nvml` restores what was there. Every symbol is
a plain Python callable (not a ctypes callback, which would swallow exceptions) that returns an NVML
status code and writes its outputs through the ``byref`` objects pynvml passes, exactly like the C
library. Symbols not simulated are absent: pynvml then raises ``NVMLError_FunctionNotFound``.
"""

from __future__ import annotations

import threading
from typing import Any

import pynvml

import wattpipe.simulator._nvml_events
import wattpipe.simulator._nvml_topology  # noqa: F401  (registers the topology calls)
from wattpipe.simulator._ctypes_io import decode_handle
from wattpipe.simulator._nvml_calls import DEVICE_CALLS, INVALID_ARGUMENT, SUCCESS, UNINITIALIZED, Impl, mig_uuid
from wattpipe.simulator._nvml_symbols import ERROR_CODES, SYMBOLS
from wattpipe.simulator.node import SimulatedNode

__all__ = ["SimulatedNvmlLibrary", "install_nvml", "installed_node", "mig_uuid", "uninstall_nvml"]

_ERROR_STRINGS = {code: name.replace("_", " ").capitalize() for name, code in ERROR_CODES.items()}


class _Symbol:
    """One exported C symbol. A plain object, so pynvml may assign ``restype`` to it."""

    def __init__(self, name: str, call: Any) -> None:
        self.__name__ = name
        self._call = call
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)

    def __repr__(self) -> str:
        return f"<simulated NVML symbol {self.__name__}>"


class SimulatedNvmlLibrary:
    """The object installed as ``pynvml.nvmlLib``: one attribute per simulated C symbol."""

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._init_count = 0
        setattr(self, "nvmlInitWithFlags", _Symbol("nvmlInitWithFlags", self._init))  # noqa: B010
        setattr(self, "nvmlInit_v2", _Symbol("nvmlInit_v2", lambda: self._init(0)))  # noqa: B010
        setattr(self, "nvmlShutdown", _Symbol("nvmlShutdown", self._shutdown))  # noqa: B010
        setattr(self, "nvmlErrorString", _Symbol("nvmlErrorString", self._error_string))  # noqa: B010
        for name, (impl, takes_handle, gpu_arg) in DEVICE_CALLS.items():
            setattr(self, name, _Symbol(name, self._device_call(name, impl, takes_handle, gpu_arg)))

    @property
    def initialized(self) -> bool:
        return self._init_count > 0

    def _init(self, flags: Any) -> int:
        with self._lock:
            self._init_count += 1
        return SUCCESS

    def _shutdown(self) -> int:
        with self._lock:
            if self._init_count == 0:
                return UNINITIALIZED
            self._init_count -= 1
        return SUCCESS

    def _error_string(self, code: Any) -> bytes:
        value = int(getattr(code, "value", code))
        return _ERROR_STRINGS.get(value, "Unknown Error").encode()

    def _device_call(self, name: str, impl: Impl, takes_handle: bool, gpu_arg: int | None) -> Any:
        node = self.node

        def call(*args: Any) -> Any:
            if self._init_count == 0:
                return UNINITIALIZED
            t_s = node.t_s()
            device = None
            gpu: int | None = None
            if takes_handle:
                device = decode_handle(args[0])
                if device is None or not _exists(node, device, t_s):
                    return INVALID_ARGUMENT
                gpu = device.gpu
                args = args[1:]
            elif gpu_arg is not None:
                gpu = int(getattr(args[gpu_arg], "value", args[gpu_arg]))
            fault = node.nvml_fault(name, gpu, t_s)
            if fault is not None:
                return fault
            return impl(node, t_s, device, *args)

        return call


def _exists(node: SimulatedNode, device: Any, t_s: float) -> bool:
    """Whether a handle still names a device: MIG handles die with their instance."""
    if device.gpu >= len(node.scenario.gpus):
        return False
    if device.gi is None:
        return True
    mig = node.truth.gpu_state(device.gpu, t_s).mig
    return mig is not None and mig.instance(device.gi) is not None


class _Saved:
    def __init__(self, node: SimulatedNode) -> None:
        self.node = node
        self.lib = pynvml.nvmlLib
        self.cache = pynvml._nvmlGetFunctionPointer_cache
        self.refcount = pynvml._nvmlLib_refcount


_installed: _Saved | None = None
_install_lock = threading.Lock()


def install_nvml(node: SimulatedNode) -> SimulatedNvmlLibrary:
    """Make pynvml talk to ``node``. Call :func:`uninstall_nvml` to restore the previous library."""
    global _installed
    with _install_lock:
        if _installed is not None:
            raise RuntimeError("a simulated NVML library is already installed; call uninstall() first")
        library = SimulatedNvmlLibrary(node)
        with pynvml.libLoadLock:
            _installed = _Saved(node)
            pynvml.nvmlLib = library
            # pynvml caches symbols forever: a fresh cache so no symbol of another library survives.
            pynvml._nvmlGetFunctionPointer_cache = {}
            pynvml._nvmlLib_refcount = 0
        return library


def uninstall_nvml() -> SimulatedNode | None:
    """Restore pynvml's previous library; returns the node that was installed (None if none was)."""
    global _installed
    with _install_lock:
        saved, _installed = _installed, None
        if saved is None:
            return None
        with pynvml.libLoadLock:
            pynvml.nvmlLib = saved.lib
            pynvml._nvmlGetFunctionPointer_cache = saved.cache
            pynvml._nvmlLib_refcount = saved.refcount
        return saved.node


def installed_node() -> SimulatedNode | None:
    return None if _installed is None else _installed.node


def _check_symbols() -> None:
    exported = set(DEVICE_CALLS) | {"nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString"}
    if exported != SYMBOLS:
        raise AssertionError(f"symbol table out of date: {sorted(exported ^ SYMBOLS)}")


_check_symbols()
