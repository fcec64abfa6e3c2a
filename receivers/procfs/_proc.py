"""Reading processes from a /proc tree, with each process's identity cached per (pid, start time).

Blocking file I/O: the receiver runs :meth:`ProcessTable.scan` on a worker thread. Nothing here raises
for a process that disappears while it is being read (the normal case on a busy node): it is left out.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import HostProcess, NodeCpuTime
from wattpipe.pipeline.records_cpu import ContainerCpuTime
from wattpipe.receivers.procfs._cgroup import parse_cgroup
from wattpipe.receivers.procfs._cgroupcpu import CgroupUsage, Note, unified_path
from wattpipe.receivers.procfs._containercpu import ContainerScans
from wattpipe.receivers.procfs._identity import Identity
from wattpipe.receivers.procfs._pidstat import ProcStat, comm_of, cpu_and_start, exec_head, parse_stat
from wattpipe.receivers.procfs._stat import parse_proc_stat
from wattpipe.receivers.procfs._statfiles import MAX_BYTES, Gone, StatFiles, default_budget
from wattpipe.receivers.procfs._vm import VmIdentity, looks_like_qemu, parse_qemu_cmdline

__all__ = ["FULL_READ_EVERY", "ProcStat", "ProcessTable", "Scan", "cpu_and_start", "parse_stat"]

# With cgroup_root, every this many scans reads every process all the same (the first scan is one): a process is
# watched through the cgroup it was in when first read, and one that moved since (read before its runtime
# placed it) while that cgroup idles would otherwise keep its CPU time for good; so it stands still for fewer
# scans than this (a minute at the default 5 s), its delta then arrives whole, and its identity (cgroup,
# container, pod) is read again: its CPU time grew while the cgroup it was read in did not.
FULL_READ_EVERY = 12

# ENOENT: the directory or file is gone; ESRCH: the kernel found the task gone while producing the file.
_GONE = (errno.ENOENT, errno.ESRCH)


@dataclass(slots=True)
class Scan:
    """One pass over /proc: a record per readable process, and problems worth a (rate-limited) warning."""

    records: list[HostProcess] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (key, message)
    node_cpu: NodeCpuTime | None = None  # None: /proc/stat could not be read
    # Each container's cgroup CPU time (_containercpu.py); None: not known (cpu_time off, no cgroup v2 mount).
    containers: list[ContainerCpuTime] | None = None
    listed: bool = True  # False: root could not be listed (or listed no process): no process is known this scan


class _Gone(Exception):
    """The process ended (or its pid was reused) while it was being read."""


def _read(path: str) -> str:
    """A whole /proc file. Plain os calls on a str path: this runs for every process every tick, and
    pathlib and buffered files cost more than the read itself."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _GONE:
            raise _Gone from None
        raise
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as exc:
        if exc.errno in _GONE:
            raise _Gone from None
        raise
    finally:
        os.close(fd)
    # A lenient decode: comm and cgroup paths are bytes to the kernel, not always UTF-8.
    return b"".join(chunks).decode("utf-8", errors="replace")


class ProcessTable:
    """Every process under ``root`` (a /proc), its identity read once and its CPU time every scan.

    The cache holds one entry per pid seen in the last scan, so it is bounded by the process count. An
    entry is trusted only while the pid's start time is unchanged: a reused pid is a new process.

    With ``cpu_time`` off, a pid seen in the previous scan is not read again at all: its record is the one
    made when it was first read (that read's time, ``cpu_time_s`` absent). Only new pids cost reads. A pid
    that ended and was handed to a new process between two scans would keep its predecessor's record; the
    kernel hands pids out cyclically, so that takes ``pid_max`` new tasks within one interval.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_processes: int,
        clock_ticks_per_s: int,
        cpu_time: bool = True,
        keep_open: int | None = None,
        cgroup_root: str = "",
        note: Note | None = None,
    ) -> None:
        self.root = root
        self._root = str(root)
        # cpu_time on: each process's stat is read every scan, through a file kept open (keep_open of them at
        # most; None: by the open-file limit). Off: a process is read once, by path. With cgroup_root, its
        # cpu.stat files kept open come out of the same half of the open-file limit (default_budget): a quarter
        # of it, 2,048 at most, and the stat files the rest.
        cgroup_files = min(2048, default_budget(8192) // 4) if cpu_time and cgroup_root else 0
        if keep_open is None:
            keep_open = default_budget(max_processes + cgroup_files) - cgroup_files
        budget = keep_open if cpu_time else 0
        self.stat_files = StatFiles(self._root, budget)
        # cpu_time on and cgroup_root set ("auto": beside root): a process whose cgroup ran nothing since the
        # last scan keeps its record. ``note`` hears, once, why it is off (not a cgroup v2 mount, ...).
        self._usage = CgroupUsage.of(cgroup_root, self._root, note, cgroup_files) if cpu_time else None
        self.containers = True  # with cgroup_root: each container's usage (receiver.asked: only where one wants it)
        self._containers = ContainerScans()  # what container usage keeps between scans (_containercpu.py)
        self._last: dict[int, HostProcess] = {}  # cpu_time on: the last scan's records, by pid
        self._lines: dict[int, bytes] = {}  # cpu_time on: each process's stat line its last record was made from
        self._scans = 0  # scans that read processes with cpu_time on: every FULL_READ_EVERY-th reads them all
        self.max_processes = max_processes
        self.clock_ticks_per_s = clock_ticks_per_s
        self.cpu_time = cpu_time
        self._cache: dict[int, Identity] = {}
        self._records: dict[int, HostProcess] = {}  # cpu_time off: each known pid's record, as first read
        self._names: list[bytes] | None = None  # cpu_time off: the last listing of root, and its problems
        self._name_set: set[bytes] = set()  # the names in it whose processes were read
        self._listing_problems: list[tuple[str, str]] = []
        self._listed: tuple[list[bytes], list[int]] = ([], [])  # cpu_time on: the last listing, and its pids

    def cached(self) -> int:
        return len(self._cache)

    def cgroup_state(self) -> dict[str, object] | None:
        """cgroup_root at work (see :meth:`CgroupUsage.describe`); None where it is off (or not looked at yet)."""
        return None if self._usage is None or not self._usage.looked() else self._usage.describe()

    def close(self) -> None:
        """Close the stat and cpu.stat files kept open (the receiver's shutdown, on the scanning thread)."""
        self.stat_files.close()
        if self._usage is not None:
            self._usage.close()

    def scan(self, now: Timestamp) -> Scan:
        out = Scan()
        out.node_cpu = self._node_cpu(now, out)
        names = None if self.cpu_time else self._listing()
        if names is not None and self._scan_changes(names, now, out):
            return out
        listed_before = self._listed[1]  # (the last scan's listing: _list replaces it where root lists others)
        pids = self._list(out, names)
        if pids is None:
            out.listed = False
            if names is not None:  # cpu_time off: the next scan reads every process again
                self._cache.clear()
                self._records.clear()
            # cpu_time on, the identities are kept (each trusted while its pid's start time is unchanged): the next
            # scan reads the cgroups of the last listed processes, whose usage spans this scan as their deltas do
            self.stat_files.close()
            self._names, self._name_set = None, set()
            return out
        boot_wall_s = self._boot_wall_s(now)
        self._scans += 1
        full = names is None and self._scans % FULL_READ_EVERY == 1
        cgroups = self._cache  # the last scan's processes: _idle reads their cgroups (before this scan replaces it)
        idle = None if names is not None or full else self._idle()
        if idle is not None and pids is listed_before and len(self._cache) == len(self._last) == len(pids):
            records, cache = self._read_stale(pids, idle, now, boot_wall_s, out)
        else:
            # cpu_time off: a known process is not read again; on, with cgroup_root: nor one whose cgroup is idle.
            known = self._records if names is not None else self._known(idle)
            moved: dict[int, HostProcess] = {}
            if full:
                # Every process read (see FULL_READ_EVERY); one of an idle cgroup whose CPU time grew anyway runs in
                # another cgroup now (moved: their last records), and its identity is read again.
                moved = self._known(self._idle())
            records, cache = {}, {}
            self._read_all(pids, known, now, boot_wall_s, out, records, cache, moved)
            self.stat_files.keep_only(cache)  # the files of processes gone (or skipped)
        out.records = list(records.values())  # in pid order
        usec = self._usage.readings() if self.containers and self._usage is not None and names is None else None
        usage = self._usage
        read, exists, children = (None, None, None) if usage is None else (usage.read, usage.exists, usage.children)
        out.containers = self._containers.scan(
            now, usec, cgroups, cache, records, self._last, read, exists=exists, children=children
        )
        self._cache = cache  # pids that are gone (or skipped) are forgotten
        if self.cpu_time:
            self._last = records
            lines = self._lines
            if len(lines) > len(cache):  # the stat lines of processes gone
                for pid in lines.keys() - cache.keys():
                    del lines[pid]
        if names is not None:  # cpu_time off: what the next scans compare their listing with
            self._records, self._listing_problems = records, [p for p in out.problems if p[0] == "max_processes"]
            self._remember(names, {str(pid).encode() for pid in pids} - {str(pid).encode() for pid in records})
        return out

    def _read_stale(
        self, pids: list[int], idle: set[str], now: Timestamp, boot_wall_s: float | None, out: Scan
    ) -> tuple[dict[int, HostProcess], dict[int, Identity]]:
        """The very processes of the last scan, each read then (the common case): their records are handed on as
        they were, in pid order, by copying the last scan's, and only those of cgroups that ran are read again,
        their records replaced in place (a copy of 2,500 entries costs less than a loop over them)."""
        records, cache = dict(self._last), dict(self._cache)
        stale = [pid for pid, identity in cache.items() if identity.cgroup_path not in idle]
        self._read_all(stale, {}, now, boot_wall_s, out, records, cache, {})
        if len(cache) < len(pids):  # some ended since: their files
            self.stat_files.keep_only(cache)
        return records, cache

    def _scan_changes(self, names: list[bytes], now: Timestamp, out: Scan) -> bool:
        """cpu_time off: read only the processes that are new since the last listing and forget those gone;
        False where a whole scan is due (the first, or more processes than ``max_processes``)."""
        if self._names is None:
            return False
        if names == self._names:  # not a process came or went
            out.records = list(self._records.values())
            out.problems.extend(self._listing_problems)
            return True
        current = set(names)
        new = sorted(int(n) for n in current - self._name_set if n.isdigit() and n.isascii())
        gone = [int(n) for n in self._name_set - current if n.isdigit() and n.isascii()]
        if len(self._records) - len(gone) + len(new) > self.max_processes:
            return False
        for pid in gone:
            self._records.pop(pid, None)
            self._cache.pop(pid, None)
        boot_wall_s = self._boot_wall_s(now) if new else None
        failed: set[bytes] = set()
        for pid in new:
            got = self._read_one(pid, now, boot_wall_s, out)
            if got is None:
                failed.add(str(pid).encode())
            else:
                self._records[pid], self._cache[pid] = got
        out.records = list(self._records.values())
        out.problems.extend(self._listing_problems)
        self._remember(names, failed)
        return True

    def _remember(self, names: list[bytes], failed: set[bytes]) -> None:
        """The listing the next scan compares with; processes that could not be read count as unseen, so
        that they are tried again (a process that ended goes from the listing by itself)."""
        self._name_set = set(names) - failed
        self._names = [] if failed else names  # [] is never equal to a listing: the next scan diffs, retrying them

    def _idle(self) -> set[str] | None:
        """cgroup_root set: the cgroups of the last scan's processes whose CPU usage has not moved since the
        last scan (their processes' CPU time cannot have changed); None where cgroup_root is off."""
        if self._usage is None:
            return None
        if not self._usage.ready():  # looked at once, on the first scan (this thread): not a cgroup v2 mount
            self._usage = None
            return None
        pending = self._containers.pending.values()  # (identities to be read again: their cgroups still read)
        paths = {path for i in chain(self._cache.values(), pending) if (path := i.cgroup_path) is not None}
        if self.containers:
            paths.update(self._containers.carried)  # (containers read at the last scan: read while they can be)
        return paths - self._usage.moved(paths)

    def _known(self, idle: set[str] | None) -> dict[int, HostProcess]:
        """The last records of the processes of ``idle`` cgroups, by pid."""
        if not idle:
            return {}
        last = self._last  # the last scan's: a pid not listed now is never looked up
        return {pid: last[pid] for pid, i in self._cache.items() if i.cgroup_path in idle and pid in last}

    def _read_all(
        self,
        pids: list[int],
        known: dict[int, HostProcess],
        now: Timestamp,
        boot_wall_s: float | None,
        out: Scan,
        records: dict[int, HostProcess],
        cache: dict[int, Identity],
        moved: dict[int, HostProcess],
    ) -> None:
        """Each pid's record (``known``'s where it has one, ``moved``: see scan) into ``records``, and its
        identity into ``cache``; a pid that cannot be read is taken out of both. Inline, the common case: a kept stat file
        whose line parses and is the cached identity's; any other goes through :meth:`_read_one`."""
        fds, pread, fstat, check = self.stat_files.fds, os.pread, os.fstat, self.stat_files.checks_links()
        last, lines, previous = self._cache, self._lines, self._last
        hz = self.clock_ticks_per_s  # (no file is kept with cpu_time off: every record below carries its CPU time)
        for pid in pids:
            # A known record is handed on as read: its CPU time is unchanged as of now (exporters/_otlp_snapshot.py).
            record = known.get(pid)
            if record is not None:
                records[pid], cache[pid] = record, last[pid]
                continue
            fd = fds.get(pid)
            identity = last.get(pid)
            line = None  # what _read_one is given: None to read it (again) itself
            if fd is not None and identity is not None:
                try:
                    line = pread(fd, MAX_BYTES, 0) or None  # empty: the process ended
                except OSError:
                    line = None  # gone, or a failure that _read_one meets again and reports
                if line is not None and check and fstat(fd).st_nlink == 0:
                    line = None  # a plain tree's removed file: read by path
            if line is not None and identity is not None:
                if line == lines.get(pid) and (record := previous.get(pid)) is not None:
                    # Not a byte of its stat changed (a process asleep): the record made from it last time holds.
                    records[pid], cache[pid] = record, identity
                    continue
                close = line.rfind(b")")
                rest = line[close + 1 :].split(None, 20) if close >= 0 else []  # field n is rest[n - 3]
                try:
                    cpu_ticks, start_ticks = int(rest[11]) + int(rest[12]), int(rest[19])
                except (IndexError, ValueError):
                    start_ticks = -1  # malformed: _read_one says so
                if (
                    start_ticks == identity.start_time_ticks
                    and ((head := identity.stat_head) is None or line[: close + 1] == head)
                    and ((kept := moved.get(pid)) is None or kept.cpu_time_s == cpu_ticks / hz)
                ):
                    start_wall_s = None if boot_wall_s is None else boot_wall_s + start_ticks / hz
                    record = identity.record(now, pid, cpu_ticks / hz, start_wall_s)
                    records[pid], cache[pid], lines[pid] = record, identity, line
                    continue
            got = self._read_one(pid, now, boot_wall_s, out, line, moved.get(pid))
            if got is None:
                records.pop(pid, None)  # (handed on by _read_stale: gone since)
                cache.pop(pid, None)
            else:
                records[pid], cache[pid] = got

    def _read_one(
        self,
        pid: int,
        now: Timestamp,
        boot_wall_s: float | None,
        out: Scan,
        line: bytes | None = None,
        kept: HostProcess | None = None,
    ) -> tuple[HostProcess, Identity] | None:
        """One process's record and identity (from its stat ``line`` where it was read already; ``kept``: its
        last record, its cgroup idle since: see _read_all), or None (gone: silently; unreadable: a problem
        noted)."""
        try:
            return self._read_process(pid, now, boot_wall_s, line, kept)
        except _Gone:
            return None
        except ValueError as exc:
            out.problems.append(("malformed", f"{self.root}/{pid}/stat cannot be parsed ({exc}); skipping it"))
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            out.problems.append(
                (f"unreadable/{exc.errno}", f"{self.root}/{pid} cannot be read ({reason}); skipping it")
            )
        return None

    def _listing(self) -> list[bytes] | None:
        """The names under root, as bytes: a fifth cheaper than str (no decoding), and int() takes them."""
        try:
            return os.listdir(os.fsencode(self._root))
        except OSError:
            return None  # _list lists again, and says why

    def _list(self, out: Scan, names: list[bytes] | None = None) -> list[int] | None:
        """The pids to read this scan (the lowest ``max_processes``), or None with the problem noted."""
        try:
            pids = self._pids() if names is None else self._pids_of(names)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            out.problems.append(
                ("root", f"cannot list {self.root}: {reason}; no host processes (is the host's /proc mounted there?)")
            )
            return None
        if not pids:
            out.problems.append(("empty", f"{self.root} has no process directories: is it a /proc?"))
            return None
        return self._capped(pids, f"processes under {self.root}", out)

    def _capped(self, pids: list[int], what: str, out: Scan) -> list[int]:
        """The lowest ``max_processes`` of the sorted ``pids`` (``what``: they, in the problem noted where that
        leaves some out); ``pids`` itself where it does not."""
        if len(pids) <= self.max_processes:
            return pids
        out.problems.append(
            (
                "max_processes",
                f"{len(pids)} {what}, more than max_processes ({self.max_processes}): "
                f"reading the {self.max_processes} lowest pids only",
            )
        )
        return pids[: self.max_processes]

    def _node_cpu(self, now: Timestamp, out: Scan) -> NodeCpuTime | None:
        try:
            return parse_proc_stat(_read(f"{self._root}/stat"), self.clock_ticks_per_s, now)
        except _Gone:  # a tree with no stat file (a test's) says nothing of the node: absent, as uptime
            pass
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            out.problems.append(("stat", f"cannot read {self.root}/stat ({reason}); no node CPU time"))
        except ValueError as exc:
            out.problems.append(("stat", f"{self.root}/stat cannot be parsed ({exc}); no node CPU time"))
        return None

    def _pids(self) -> list[int]:
        """The pids under root, sorted: the last scan's list again while root lists the very same names (as
        bytes, in the same order), which spares converting and sorting 2,500 names a tick."""
        names = os.listdir(os.fsencode(self._root))
        if names != self._listed[0]:
            self._listed = names, self._pids_of(names)
        return self._listed[1]

    @staticmethod
    def _pids_of(names: list[str] | list[bytes]) -> list[int]:
        return sorted(int(name) for name in names if name.isdigit() and name.isascii())

    def _boot_wall_s(self, now: Timestamp) -> float | None:
        """When the host booted (Unix s), from /proc/uptime (10 ms resolution; /proc/stat's btime is whole
        seconds, too coarse to place a process start inside a two-second tick)."""
        try:
            return now.wall_s - float(_read(f"{self._root}/uptime").split()[0])
        except (_Gone, OSError, ValueError, IndexError):  # a test tree without it: start times unknown
            return None

    def _read_process(
        self,
        pid: int,
        now: Timestamp,
        boot_wall_s: float | None,
        line: bytes | None = None,
        kept: HostProcess | None = None,
    ) -> tuple[HostProcess, Identity]:
        if line is None:
            try:
                line = self.stat_files.read(pid)
            except Gone:
                raise _Gone from None
        cpu_ticks, start_ticks = cpu_and_start(line)
        identity = self._cache.get(pid)
        hz = self.clock_ticks_per_s
        moved = kept is not None and kept.cpu_time_s != cpu_ticks / hz  # it ran, its cgroup did not: elsewhere
        if identity is None or identity.start_time_ticks != start_ticks or moved:
            identity = self._read_identity(f"{self._root}/{pid}", start_ticks, line)
        elif not identity.describes(line):
            identity = self._read_exec(identity, f"{self._root}/{pid}", line)
        start_wall_s = None if boot_wall_s is None else boot_wall_s + start_ticks / hz
        return identity.record(now, pid, cpu_ticks / hz if self.cpu_time else None, start_wall_s), identity

    def _read_exec(self, identity: Identity, directory: str, line: bytes) -> Identity:
        """A process whose comm changed: exec'd (its exe differs, or cannot be read), its identity read again;
        or renamed itself (prctl, the same exe), its identity kept, its first comm too (a label that followed
        every rename would make a new series each time), and the new line's head remembered."""
        try:
            exe: str | None = os.readlink(f"{directory}/exe")
        except OSError:
            exe = None
        if exe is not None and exe == identity.exe:
            return replace(identity, stat_head=exec_head(line))
        return self._read_identity(directory, identity.start_time_ticks, line)

    def _read_identity(self, directory: str, start_time_ticks: int, line: bytes) -> Identity:
        """comm comes from the stat ``line`` already read: the kernel writes the same name (task->comm, with a
        workqueue worker's suffix) into ``stat`` and ``comm``, so reading ``comm`` too would cost a file for nothing."""
        comm = comm_of(line)
        cgroup_text = _read(f"{directory}/cgroup")
        cgroup = parse_cgroup(cgroup_text)
        try:
            exe: str | None = os.readlink(f"{directory}/exe")
        except OSError:
            # Kernel threads have no exe; another user's process needs CAP_SYS_PTRACE to see it. Absent.
            exe = None
        vm = self._read_vm(directory) if looks_like_qemu(comm, exe) else None
        # The pid may have ended and been reused between the stat read and these: make sure the files
        # just read belong to the process whose start time the cache will file them under.
        again = _read(f"{directory}/stat")
        if not again or parse_stat(again).start_time_ticks != start_time_ticks:
            raise _Gone  # empty: the process ended (how the kernel answers an ended task's stat)
        return Identity(
            start_time_ticks=start_time_ticks,
            comm=comm,
            exe=exe,
            cgroup=cgroup,
            vm=vm,
            cgroup_path=unified_path(cgroup_text),
            stat_head=exec_head(line),
        )

    @staticmethod
    def _read_vm(directory: str) -> VmIdentity | None:
        try:
            return parse_qemu_cmdline(_read(f"{directory}/cmdline"))
        except OSError:  # not _Gone: a process that ended is left out whole, by the caller
            return None
