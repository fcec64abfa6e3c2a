"""Fault rules of the scenario file: what breaks, when, and for how long (scenario seconds)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from wattpipe.simulator._nvml_symbols import ERROR_CODES, c_symbol
from wattpipe.simulator._schema_base import MigSpec, _Model

__all__ = [
    "DcgmFault",
    "Fault",
    "GpuChange",
    "GpuFault",
    "K8sApiFault",
    "KubeletFault",
    "NvmlFault",
    "ProcfsFault",
    "RaplFault",
]

ComputeMode = Literal["default", "exclusive_process", "prohibited"]
RELOAD_FOR_S = 5.0  # how long a reloading driver answers errors, unless the fault says


class _Timed(_Model):
    at_s: float = Field(ge=0)
    for_s: float | None = Field(default=None, gt=0)  # None: until the end of the scenario

    @property
    def until_s(self) -> float:
        return math.inf if self.for_s is None else self.at_s + self.for_s

    def active(self, t_s: float) -> bool:
        return self.at_s <= t_s < self.until_s


class NvmlFault(_Timed):
    """NVML calls answer ``error`` instead of their result (``kind: error``, the default).

    ``gpu`` None: every device; ``call`` None: every call that takes that device's handle.

    ``kind: reload``: the driver reloads at ``at_s``. Every call on the GPU (all GPUs with ``gpu`` None)
    answers ``error`` (default GPU_IS_LOST) for ``for_s`` (default 5 s), and the energy counter counts
    from 0 again from when the driver is back (``at_s + for_s``), as a real counter counts energy since
    driver load. The ground truth is not affected: the GPU and its processes draw power throughout.
    """

    target: Literal["nvml"]
    kind: Literal["error", "reload"] = "error"
    gpu: int | None = Field(default=None, ge=0)
    call: str | None = None
    error: str | None = None

    @field_validator("call")
    @classmethod
    def _known_call(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return c_symbol(value)
        except KeyError:
            raise ValueError(f"{value!r} is not an NVML call the simulator implements") from None

    @field_validator("error")
    @classmethod
    def _known_error(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name = value.upper().removeprefix("NVML_ERROR_")
        if name not in ERROR_CODES:
            raise ValueError(f"{value!r} is not an NVML error name (e.g. GPU_IS_LOST, NOT_SUPPORTED)")
        return name

    @model_validator(mode="after")
    def _complete(self) -> NvmlFault:
        if self.kind == "error":
            if self.error is None:
                raise ValueError("error: name the NVML error the calls answer (e.g. GPU_IS_LOST)")
            return self
        if self.call is not None:
            raise ValueError("call: a reload fails every call of the GPU; leave call out")
        if self.error is None:
            self.error = "GPU_IS_LOST"
        if self.for_s is None:
            self.for_s = RELOAD_FOR_S
        return self

    @property
    def code(self) -> int:
        return ERROR_CODES[self.error or "GPU_IS_LOST"]


class DcgmFault(_Timed):
    """The dcgm-exporter endpoint misbehaves: ``down`` closes connections unanswered, ``slow`` answers
    after ``delay_s`` real seconds, ``garbage`` answers 200 with bytes that are not exposition text,
    ``oversized`` answers with ``size_bytes`` of valid-looking series."""

    target: Literal["dcgm"]
    kind: Literal["down", "slow", "garbage", "oversized"]
    delay_s: float = Field(default=5.0, ge=0)
    size_bytes: int = Field(default=32 * 1024 * 1024, gt=0)


class KubeletFault(_Timed):
    target: Literal["kubelet"]
    kind: Literal["down", "slow"]
    delay_s: float = Field(default=5.0, ge=0)


class K8sApiFault(_Timed):
    target: Literal["k8sapi"]
    kind: Literal["down", "slow"]
    delay_s: float = Field(default=5.0, ge=0)


class RaplFault(_Timed):
    """A RAPL zone's directory is missing from the powercap tree (``kind: gone``; ``zone`` None: every zone), as
    where a ``/sys`` mount or a read flaps; its hardware counter counts on meanwhile, so the first reading after it
    holds the whole gap's energy. The ground truth is not affected."""

    target: Literal["rapl"]
    kind: Literal["gone"] = "gone"
    zone: str | None = None  # a zone's directory name: intel-rapl:0, intel-rapl:0:0


class ProcfsFault(_Timed):
    """The node's /proc answers nothing (``kind: gone``): the whole tree away, as a mount that flaps or a procfs
    receiver that times out, so no process is listed and /proc/stat is not read. Its processes run on and their
    CPU time counts on meanwhile (the files come back with it). The ground truth is not affected."""

    target: Literal["procfs"]
    kind: Literal["gone"] = "gone"


class GpuChange(_Model):
    """New settings for a GPU; only the keys present change (``mig: null`` disables MIG)."""

    mig: MigSpec | None = None
    compute_mode: ComputeMode | None = None
    max_w: float | None = Field(default=None, gt=0)


class GpuFault(_Model):
    """A live reconfiguration at ``at_s``. Processes whose placement no longer exists end then."""

    target: Literal["gpu"]
    at_s: float = Field(ge=0)
    gpu: int = Field(ge=0)
    set: GpuChange

    @model_validator(mode="after")
    def _something_changes(self) -> GpuFault:
        if not self.set.model_fields_set:
            raise ValueError("set: name at least one of mig, compute_mode, max_w")
        return self


Fault = NvmlFault | DcgmFault | KubeletFault | K8sApiFault | GpuFault | RaplFault | ProcfsFault
