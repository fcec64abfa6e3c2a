"""Each process's ``/proc/<pid>/stat`` kept open between scans and read again with one ``pread``.

Reading a process's CPU time every tick by path costs an open, two reads and a close, each with the path
walked; a kept file costs one ``pread`` at offset 0, which makes procfs write the line afresh. An open
stat file belongs to its process, not to its pid: once the process has ended, procfs answers ESRCH (or
nothing), so a pid that was handed to a new process is never read through its predecessor's file. A tree
of plain files (a test's) would keep a removed file readable instead: where the root is not a procfs (it
has no ``self`` link), a kept file is also checked to be still linked (an ``fstat`` per read). The
simulator's tree has the link, and answers as procfs does: it empties an ended process's ``stat`` before
removing its directory.

At most ``budget`` files are kept (half the soft limit on open files, less a margin, by default); other
processes are read by path, as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Container

__all__ = ["MAX_BYTES", "StatFiles", "default_budget"]

_GONE = (errno.ENOENT, errno.ESRCH)
MAX_BYTES = 4096  # a stat line is a few hundred bytes; comm is at most 64


class Gone(Exception):
    """The process ended (or its pid now names another one)."""


def default_budget(max_processes: int) -> int:
    """How many stat files to keep open: never more than half of what the process may open (the HTTP
    listeners, the state file and NVML need the rest)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return max_processes
    return max(0, min(max_processes, (soft - 256) // 2))


class StatFiles:
    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget
        # A real procfs has /proc/self. Decided at the first read (the root may not be there yet at start).
        self.check_links: bool | None = None
        self.fds: dict[int, int] = {}

    def checks_links(self) -> bool:
        """Whether a kept file must also be checked to be still linked: where the root is not a procfs."""
        if self.check_links is None:
            self.check_links = not os.path.islink(f"{self.root}/self")
        return self.check_links

    def __len__(self) -> int:
        return len(self.fds)

    def read(self, pid: int) -> bytes:
        """The stat line of ``pid``'s current process; raises Gone, or OSError for anything else."""
        fd = self.fds.get(pid)
        if fd is not None:
            data = self._pread(fd)
            if data is not None:
                return data
            self._close(pid)  # ended: its pid may name a new process now, read by path below
        if len(self.fds) >= self.budget:
            return self._read_once(pid)
        fd = self._open(pid)
        data = self._pread(fd)
        if data is None:
            os.close(fd)
            raise Gone
        self.fds[pid] = fd
        return data

    def keep_only(self, pids: Container[int]) -> None:
        """Close the files of every pid not in ``pids`` (processes gone, or no longer read)."""
        for pid in [p for p in self.fds if p not in pids]:
            self._close(pid)

    def close(self) -> None:
        for pid in list(self.fds):
            self._close(pid)

    def _pread(self, fd: int) -> bytes | None:
        """The line, or None when the file's process has ended (or a plain file was removed)."""
        try:
            data = os.pread(fd, MAX_BYTES, 0)
        except OSError as exc:
            if exc.errno in _GONE:
                return None
            raise
        if not data or (self.checks_links() and os.fstat(fd).st_nlink == 0):
            return None
        return data

    def _read_once(self, pid: int) -> bytes:
        fd = self._open(pid)
        try:
            data = self._pread(fd)
        finally:
            os.close(fd)
        if data is None:
            raise Gone
        return data

    def _open(self, pid: int) -> int:
        """A new descriptor on ``pid``'s stat file; raises Gone, or OSError for anything else."""
        try:
            return os.open(f"{self.root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in _GONE:
                raise Gone from None
            raise

    def _close(self, pid: int) -> None:
        fd = self.fds.pop(pid)
        with contextlib.suppress(OSError):
            os.close(fd)
