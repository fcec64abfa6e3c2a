"""Receiver ``procfs``: every process on the node from /proc — comm, exe, start time, CPU time, the
container and pod its cgroup names (containerd, CRI-O, Docker, podman; cgroup v1 and v2; systemd and
cgroupfs drivers; nested and cgroup-namespaced paths), the VM a qemu/kvm process runs — and the node's CPU
time from /proc/stat (:class:`NodeCpuTime`), every tick; the node's logical CPUs from /proc/cpuinfo
(:class:`CpuInfo`, Kepler's ``kepler_node_cpu_info``), read once and given every tick.

With ``cpu_time: true`` (CPU attribution needs it) it lists *every* process and reads each one's ``stat``
every tick for its CPU time (kept open, one ``pread`` each: ``_statfiles.py``), which also tells a reused pid
by its start time; a process's identity (comm, exe, cgroup, VM) is read once per (pid, start time). With
``cpu_time: false`` (the GPU path needs no CPU time) it lists only the GPU processes: it reads after the
receivers of its tick that provide ``gpu_processes`` (``after_records``: the runtime hands it their records),
reads each GPU pid it does not know yet and hands on the records of those it does (``_gpupids.py``: a pid is
the same process while the GPU listing keeps it); /proc is not listed at all. A tick whose GPU listing is
unknown (``nvml`` failed) gets the last records again. With no receiver of ``gpu_processes`` in its tick group
it lists every process as with ``cpu_time: true``, but reads a process once, when first seen. Either way the
join happens downstream, by pid (and ``start_time_ticks`` where a processor keeps state across ticks); see
docs/cpu.md, "Cost". The default, ``auto``, is true exactly where a processor of a pipeline this receiver
feeds asks for CPU time (``cpu_attribution``: the graph calls :meth:`ProcfsReceiver.asked`).
``max_processes`` bounds a tick's work on a node with runaway pids.

Failure modes, each degrading rather than stopping:
- ``root`` missing, unreadable (``/host/proc`` not mounted) or listing no process: one rate-limited warning, no
  records, ``host_processes`` and ``container_cpu`` absent (unknown, not "no process": ``cpu_attribution``'s next
  deltas span the tick); the processes' identities are kept, so the next scan reads the same cgroups;
- a process ending while it is read: left out, silently (the normal case on a busy node);
- ``exe`` unreadable (a kernel thread, or another user's process without CAP_SYS_PTRACE): absent;
- a scan still running when the next tick asks (a hung /proc read): that tick gets no records, its fields
  absent (unknown, not "no process");
- ``/proc/stat`` unreadable: a warning, and ``node_cpu`` absent that tick.
- ``/proc/cpuinfo`` unreadable or not parseable: one warning naming the path and why, and no ``cpu_info``
  (not read again); missing (a test's tree): a debug line, the same.
- ``cgroup_root`` not a cgroup v2 mount (cgroup v1, not mounted): one info line (``auto``) or warning (a
  path said outright) naming it, and every process's ``stat`` read every tick, as without it; in a cgroup
  namespace whose root it cannot find under the mount, one info line, the same.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.records import GpuProcessSample, Record
from wattpipe.pipeline.records_cpu import CpuInfo
from wattpipe.pipeline.telemetry import ComponentTelemetry
from wattpipe.receivers.procfs._cgroup import CgroupIdentity, Runtime, parse_cgroup, parse_cgroup_path
from wattpipe.receivers.procfs._cpuinfo import parse_cpuinfo
from wattpipe.receivers.procfs._gpupids import GpuPids
from wattpipe.receivers.procfs._proc import ProcessTable, ProcStat, Scan, parse_stat

__all__ = [
    "CgroupIdentity",
    "ProcStat",
    "ProcfsConfig",
    "ProcfsReceiver",
    "Runtime",
    "clock_ticks_per_s",
    "factory",
    "parse_cgroup",
    "parse_cgroup_path",
    "parse_cpuinfo",
    "parse_stat",
]


class ProcfsConfig(ComponentConfig):
    root: str = "/proc"
    """The host's /proc: ``/host/proc`` when wattpipe runs in a container with it mounted there."""
    max_processes: int = Field(default=10_000, ge=1)
    """Read at most this many processes a tick (the lowest pids), warning when there are more."""
    cpu_time: bool | Literal["auto"] = "auto"
    """True: read every process's CPU time every tick (CPU attribution needs it). False: a process is read once,
    when first seen; its records carry no ``cpu_time_s``. Enough for the GPU path, at a fraction of the cost.
    ``auto``: true where a processor of a pipeline this receiver feeds asks for it (``cpu_attribution``), false
    otherwise."""
    cgroup_root: str = "auto"
    """With cpu_time: the host's cgroup v2 mount (``/sys/fs/cgroup``; ``/host/sys/fs/cgroup`` in a container).
    A process whose cgroup's ``cpu.stat`` usage has not moved since the last tick ran nothing: its record is
    kept, not read again. ``auto``: the ``sys/fs/cgroup`` beside ``root`` (``/proc`` → ``/sys/fs/cgroup``,
    ``/host/proc`` → ``/host/sys/fs/cgroup``), used where it is a cgroup v2 mount (one info line where it is
    not); a path said outright that is not one: a warning. Empty: every process is read every tick."""


def clock_ticks_per_s() -> int:
    """USER_HZ, the unit of /proc's CPU times: 100 on every mainstream Linux build."""
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that knows the name
        return 100


_PROVIDES = frozenset({"host_processes", "node_cpu", "cpu_info", "container_cpu"})
_GPU = frozenset({"gpu_processes"})


class ProcfsReceiver:
    provides = _PROVIDES

    def __init__(self, config: ProcfsConfig, ctx: CreateContext, *, ticks_per_s: int | None = None) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.clock = ctx.clock
        self.rl: ComponentTelemetry = ctx.telemetry
        self._ticks_per_s = ticks_per_s or clock_ticks_per_s()
        # auto: on until the graph says what the pipelines want (asked); a receiver built alone reads it all
        self.table = self._table(config.cpu_time is not False)
        # One worker that owns the table: a scan left running by a tick's timeout is never joined by a
        # second one racing it over the cache. No thread starts until the first collect().
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="procfs")
        self._pending: Future[Scan] | None = None
        self._gpu = GpuPids(self.table)  # cpu_time off, beside a GPU receiver: the GPU processes only
        self._cpu_info: list[CpuInfo] | None = None  # None: not read yet; [] missing or unreadable
        self._cgroup_said: str | None = None  # cgroup_root's last line (why it is off), for describe()

    def _table(self, cpu_time: bool) -> ProcessTable:
        return ProcessTable(
            Path(self.config.root),
            max_processes=self.config.max_processes,
            clock_ticks_per_s=self._ticks_per_s,
            cpu_time=cpu_time,
            cgroup_root=self.config.cgroup_root,
            note=self._note,
        )

    def asked(self, wants: frozenset[str]) -> None:
        """``cpu_time: auto``: every process's CPU time every tick only if a processor downstream wants it; each
        container's cgroup CPU time (``ContainerCpuTime``) only if one wants that (``cpu_attribution``'s unseen)."""
        if self.config.cpu_time == "auto" and ("process_cpu_time" in wants) != self.table.cpu_time:
            self.table = self._table("process_cpu_time" in wants)
            self._gpu = GpuPids(self.table)
        self.table.containers = "container_cpu_time" in wants  # ContainerCpuTime only for who bills by it

    @property
    def after_records(self) -> frozenset[str]:
        """cpu_time off: read after the tick's receivers of ``gpu_processes`` (see :meth:`collect_after`)."""
        return frozenset() if self.table.cpu_time else _GPU

    async def collect(self) -> Sequence[Record]:
        """Every process under root (no receiver of ``gpu_processes`` in the tick group, or cpu_time on)."""
        return await self._collect(None)

    async def collect_after(self, records: Sequence[Record], unknown: frozenset[str]) -> Sequence[Record]:
        """cpu_time off: the GPU processes of ``records`` only; the last ones where the GPU listing is ``unknown``."""
        pids = None if "gpu_processes" in unknown else [r.pid for r in records if isinstance(r, GpuProcessSample)]
        return await self._collect(pids, gpu=True)

    async def _collect(self, pids: list[int] | None, *, gpu: bool = False) -> Sequence[Record]:
        now = self.clock.now()
        if self._pending is not None and not self._pending.done():
            self._warn("slow", f"the scan of {self.config.root} from an earlier tick is still running; none this tick")
            self.provides = frozenset()  # unknown this tick, not "no process": every field absent
            return []
        self._pending = (
            self._executor.submit(self._gpu.scan, now, pids) if gpu else self._executor.submit(self.table.scan, now)
        )
        scan = await asyncio.wrap_future(self._pending)
        for key, message in scan.problems:
            self._warn(key, message)
        cpus = self._read_cpu_info()  # as first read (an exporter that stamps points sends them at the tick's time)
        # node_cpu (cpu_info) is absent, not empty, in a tick whose /proc/stat (a node whose /proc/cpuinfo)
        # could not be read.
        missing = {"node_cpu"} if scan.node_cpu is None else set()
        missing |= set() if cpus else {"cpu_info"}
        missing |= {"container_cpu"} if scan.containers is None else set()  # no cgroup v2 mount, or cpu_time off
        missing |= set() if scan.listed else {"host_processes", "container_cpu"}  # root not listed: unknown
        missing |= {"host_processes"} if gpu and self._gpu.records is None else set()  # no GPU listing seen yet
        self.provides = _PROVIDES - missing
        node = [] if scan.node_cpu is None else [scan.node_cpu]
        return [*scan.records, *node, *cpus, *(scan.containers or ())]

    def _read_cpu_info(self) -> list[CpuInfo]:
        """/proc/cpuinfo, parsed on the first tick only (it does not change while the node runs)."""
        if self._cpu_info is None:
            path = Path(self.config.root) / "cpuinfo"
            try:
                self._cpu_info = parse_cpuinfo(path.read_text(errors="replace"), self.clock.now())
            except FileNotFoundError:
                self._cpu_info = []  # a tree without it (the simulator's, a non-Linux /proc): said once, not a fault
                self.rl.log.log(logging.DEBUG, "cpuinfo", f"receiver {self.component_id}: no {path}: no CPU info")
            except (OSError, ValueError) as exc:
                self._cpu_info = []
                self._warn("cpuinfo", f"{path}: {exc}; no kepler_node_cpu_info")
        return self._cpu_info

    async def shutdown(self) -> None:
        # The kept stat files are closed on the scanning thread, after a scan still running (if any).
        self._executor.submit(self.table.close)
        self._executor.shutdown(wait=False)

    def _note(self, level: int, message: str) -> None:
        """cgroup_root's one line (off, and why; a cgroup namespace it could not place), from the scan's thread."""
        self._cgroup_said = message
        self.rl.log.log(level, "cgroup_root", f"receiver {self.component_id}: {message}")

    def describe(self) -> dict[str, Any]:
        """What ``wattpipe probe procfs`` shows beside the records: where it reads, whether every process's CPU
        time is read, how many processes it knows, and whether cgroup_root skips idle cgroups (the mount, where
        our cgroup namespace's root sits in it, how many cgroups it watches) or why not."""
        watched = self.table.cgroup_state()
        if watched is None:
            why = 'cgroup_root: ""' if not self.config.cgroup_root else "no CPU time read (cpu_time)"
            watched = {"off": self._cgroup_said or why}
        return {
            "root": self.config.root,
            "cpu_time": self.table.cpu_time,
            "processes": self.table.cached(),
            "cgroup_root": watched,
        }

    def _warn(self, key: str, message: str) -> None:
        self.rl.log.log(logging.WARNING, key, f"receiver {self.component_id}: {message}")


factory = Factory.of(
    ProcfsReceiver,
    type="procfs",
    kind="receiver",
    config_model=ProcfsConfig,
    description="Processes from /proc: comm, exe, start time, CPU time, container, pod, VM; node CPU time.",
    stability="alpha",
    provides=_PROVIDES,
)
