"""A MIG GPU's instance layout: which GPU instances exist, their profiles and compute slices.

Reading the layout costs one NVML call per instance, so it is read when MIG mode is switched on, when a process
names an instance the cached layout lacks (a reconfiguration), when an instance has processes none of which was on
it the tick before (it may have been destroyed and made again under its id, with another profile: a repartition
hands ids out by placement, and an instance with processes cannot be destroyed), and every ``refresh_s`` (to see
instances removed or added empty). Between those, each tick's process list (from the parent handle, which carries
every process's GPU-instance id) is all the per-tick NVML work a MIG GPU needs: instances whose activity is 0 cost
no NVML calls at all.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

import pynvml

from wattpipe.receivers.nvml._errors import NotFound, NotSupported, NvmlFailure, nvml_call

__all__ = ["MigLayout", "MigSlot", "compute_slices", "profile_from_name"]

_PROFILE_IN_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")
_SLICES = re.compile(r"^(\d+)g\.")


def profile_from_name(name: str) -> str | None:
    """``NVIDIA A100-SXM4-40GB MIG 3g.20gb`` → ``3g.20gb`` (how drivers name a MIG device)."""
    match = _PROFILE_IN_NAME.search(name)
    return match.group(1) if match else None


def compute_slices(profile: str | None) -> int | None:
    """The compute slices of a profile: ``3g.40gb`` → 3, ``1g.10gb+me`` → 1; None when unknown."""
    match = _SLICES.match(profile or "")
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class MigSlot:
    gpu_instance_id: int
    mig_uuid: str | None
    profile: str | None
    compute_slices: int | None


class MigLayout:
    """The cached layout of one GPU, re-read only when something says it changed."""

    def __init__(self, refresh_s: float) -> None:
        self.refresh_s = refresh_s
        self.instances: dict[int, MigSlot] = {}
        self._read_at_s: float | None = None
        self._on: dict[int, set[int]] = {}  # the pids on each instance at the last call

    def current(self, handle: Any, now_s: float, on_instances: dict[int, set[int]]) -> dict[int, MigSlot]:
        """The layout, read again where it may have changed; ``on_instances``: the pids on each GPU instance now."""
        before, self._on = self._on, on_instances
        stale = (
            self._read_at_s is None
            or now_s - self._read_at_s >= self.refresh_s
            or not on_instances.keys() <= self.instances.keys()
            or any(before.get(gi, set()).isdisjoint(pids) for gi, pids in on_instances.items())
        )
        if stale:
            self.instances = self._read(handle)
            self._read_at_s = now_s
        return self.instances

    def forget(self) -> None:
        """MIG was switched off: the next time it is on, read the layout afresh."""
        self.instances = {}
        self._read_at_s = None
        self._on = {}

    @staticmethod
    def _read(handle: Any) -> dict[int, MigSlot]:
        out: dict[int, MigSlot] = {}
        count = nvml_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        for index in range(int(count)):
            try:
                mig = nvml_call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, index)
            except (NotFound, NotSupported):
                continue  # an empty slot: drivers answer NOT_FOUND past the instances that exist
            except NvmlFailure:
                continue
            gi = int(nvml_call(pynvml.nvmlDeviceGetGpuInstanceId, mig))
            uuid = name = None
            with contextlib.suppress(NvmlFailure):
                uuid = _text(nvml_call(pynvml.nvmlDeviceGetUUID, mig))
            with contextlib.suppress(NvmlFailure):
                name = _text(nvml_call(pynvml.nvmlDeviceGetName, mig))
            profile = profile_from_name(name) if name else None
            out[gi] = MigSlot(gi, uuid, profile, compute_slices(profile))
        return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
