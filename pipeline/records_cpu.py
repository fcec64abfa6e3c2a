"""The CPU records beside ``records.py`` (which is near its size limit): the node's logical CPUs as
``/proc/cpuinfo`` describes them (Kepler's ``kepler_node_cpu_info``), and each container's cgroup CPU time.

``pipeline/batch.py`` carries them in ``cpu_info`` and ``container_cpu`` and checks them against
:data:`CPU_RECORD_TYPES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from wattpipe.pipeline._slots import quick_init
from wattpipe.pipeline.record_base import Record, RecordKind

__all__ = ["CPU_RECORD_TYPES", "ContainerCpuTime", "CpuInfo"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuInfo(Record):
    """One logical CPU of ``/proc/cpuinfo``: static, read once by the ``procfs`` receiver. A key the kernel does
    not write on this architecture (``physical id`` in a VM, ``vendor_id`` on many ARM kernels) is None."""

    IDENTITY: ClassVar[tuple[str, ...]] = ("processor", "vendor_id", "model_name", "physical_id", "core_id")

    processor: str  # the logical CPU's number (``processor : 3``)
    vendor_id: str | None = None  # GenuineIntel, AuthenticAMD
    model_name: str | None = None  # ``model name``
    physical_id: str | None = None  # ``physical id``: the socket
    core_id: str | None = None  # ``core id``: the core within its socket


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerCpuTime(Record):
    """A container's cgroup v2 CPU time (``cpu.stat`` ``usage_usec``, in seconds): every task the cgroup ever
    held, exited ones included, cumulative. From the ``procfs`` receiver with ``cpu_time`` and ``cgroup_root``,
    which says how far back its usage goes on unbroken (``since_s``): a container read with no record for a tick
    (a ``cpu.stat`` unreadable) has its next record's delta span that tick; and, for a container first read in a
    cgroup made since its last look (``made_after_s``), that its usage counts from 0."""

    KIND: ClassVar[RecordKind] = "container"
    IDENTITY: ClassVar[tuple[str, ...]] = ("container_id", "container_runtime", "pod_uid")

    container_id: str
    container_runtime: str | None = None  # containerd | cri-o | docker | podman, from the cgroup path
    pod_uid: str | None = None  # its pod's, from the cgroup path
    usage_s: float  # cumulative since the cgroup was made
    # The monotonic s of the reading this usage goes on from without a break: its delta from any record of this
    # container read at or after then is the container's own CPU time, ticks without a record between included.
    # Its own time where it starts over, a baseline (a first reading; its cgroups' set changed, or another
    # container's cgroup was below one of them, since its last record). None: not said (only a record of the
    # last tick goes on).
    since_s: float | None = None
    # On a container's first record only: its cgroups were made after this monotonic s (a look then, at the cgroups
    # of its pod, found none of them: procfs), so its usage was 0 at then and all of it is since (not a baseline,
    # where the consumer's last listing is no later). None: not known.
    made_after_s: float | None = None


CPU_RECORD_TYPES: tuple[type[Record], ...] = (CpuInfo, ContainerCpuTime)

for _record_type in CPU_RECORD_TYPES:
    quick_init(_record_type)
