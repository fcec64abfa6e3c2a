"""``cpu_time`` off, beside a receiver that lists the GPU processes (``nvml``): only those processes are read.

The runtime reads procfs after the GPU receiver of its tick (``after_records``), so /proc is not listed at all:
each GPU pid not known yet is read (its stat, cgroup, exe, ...: :meth:`ProcessTable._read_one`), and a known one
is not read again. NVML gives a pid, not a start time, so a pid is taken for the same process while the GPU
listing keeps it from one tick to the next; one that leaves it (the process ended, or its GPU was not read that
tick) is forgotten, and read again, identity and all, when it comes back: a pid reused by another process in
between is a new process. The residue: a process that ends and whose pid goes to another GPU process within
one interval, while the listing never misses it; the kernel hands pids out cyclically, so that takes
``pid_max`` new tasks within the interval.

Blocking file I/O: run on the receiver's scanning thread, as :meth:`ProcessTable.scan`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import HostProcess
from wattpipe.receivers.procfs._identity import Identity
from wattpipe.receivers.procfs._proc import ProcessTable, Scan

__all__ = ["GpuPids"]


class GpuPids:
    """The GPU processes' records, by pid: those of the last tick's GPU listing that could be read."""

    def __init__(self, table: ProcessTable) -> None:
        self.table = table
        self.records: dict[int, HostProcess] | None = None  # None: no GPU listing seen yet
        self._identities: dict[int, Identity] = {}

    def scan(self, now: Timestamp, pids: Iterable[int] | None) -> Scan:
        """This tick's records: of ``pids`` (the GPU listing), or the last ones handed on where it is
        unknown (None: the GPU receiver failed this tick; :attr:`records` None: none yet)."""
        table = self.table
        out = Scan()
        out.node_cpu = table._node_cpu(now, out)
        if pids is None:
            out.records = [] if self.records is None else list(self.records.values())
            return out
        wanted = table._capped(sorted({pid for pid in pids if pid > 0}), "GPU processes", out)
        last = self.records or {}
        records: dict[int, HostProcess] = {}
        identities: dict[int, Identity] = {}
        new = [pid for pid in wanted if pid not in last]
        table._cache = {}  # a pid not kept from the last listing is read afresh, its identity too
        boot_wall_s = table._boot_wall_s(now) if new else None
        failed = 0
        for pid in wanted:
            record = last.get(pid)
            if record is not None:
                records[pid], identities[pid] = record, self._identities[pid]
                continue
            got = table._read_one(pid, now, boot_wall_s, out)
            if got is None:
                failed += 1  # ended, or unreadable (said): tried again next tick while listed
            else:
                records[pid], identities[pid] = got
        if (failed and failed == len(new)) or out.node_cpu is None:  # no GPU pid read, or no /proc/stat
            _say_why(table, out)
        self.records, self._identities = records, identities
        table._cache = identities  # (what describe() counts: table.cached())
        out.records = list(records.values())
        return out


def _say_why(table: ProcessTable, out: Scan) -> None:
    """No GPU pid could be read, or no /proc/stat (as before any GPU process came): a root missing, or not a
    /proc (an empty directory where the host's /proc was to be mounted), is said as listing it would say it; a
    /proc of another pid namespace (hostPID off: the k8s processor's degraded mode) is not a fault. Listed only
    then: one ``listdir`` of root."""
    try:
        names = os.listdir(table._root)
    except OSError:
        out.problems.append(
            ("root", f"cannot read {table.root}: no host processes (is the host's /proc mounted there?)")
        )
        return
    if not any(name.isdigit() for name in names):
        out.problems.append(("empty", f"{table.root} has no process directories: is it a /proc?"))
