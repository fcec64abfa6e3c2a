"""A loaded NVML library with one of its functions held: a GPU slower than the receiver's ``device_timeout``."""

from __future__ import annotations

import threading
from typing import Any


class Hang:
    """Stands in for ``pynvml.nvmlLib``: every function is the library's, ``function`` waits until ``release``
    is set (5 s at most) first. Clear ``pynvml._nvmlGetFunctionPointer_cache`` after putting it in place."""

    def __init__(self, lib: Any, function: str) -> None:
        self.lib, self.function, self.release = lib, function, threading.Event()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.lib, name)
        if name != self.function:
            return fn

        def held(*args: Any) -> Any:
            self.release.wait(5.0)
            return fn(*args)

        return held
