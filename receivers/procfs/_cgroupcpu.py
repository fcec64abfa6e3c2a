"""Which cgroups ran anything since the last scan, from their ``cpu.stat`` (cgroup v2), one read each.

``usage_usec`` is the CPU time of every task the cgroup (and its descendants) ever held, exited ones
included. If it has not moved between two scans, no process in the cgroup ran in between, so the CPU
time read for each of them at the earlier scan (read after that scan's ``cpu.stat``) is still exact: their
``stat`` need not be read again. A cgroup whose ``cpu.stat`` cannot be read (a removed cgroup, a path that
cannot be placed under the mount) counts as moved: its processes are read.

Where the paths are. ``/proc/<pid>/cgroup`` shows a path relative to the *reader's* cgroup namespace:
the host's own path in the host's namespace, ``/../../kubepods.slice/…`` for a process outside a
container's namespace, ``/`` for one at its root. The mount (the host's, bind-mounted: ``/host/sys/fs/cgroup``)
shows the host's tree. So on its first scan the tracker finds where our own namespace's root sits in that
tree (:func:`namespace_root`) and places every path under it; paths are taken as they are (the host's) where
``<procfs root>/self/cgroup`` names a cgroup that holds us (the host's namespace) or cannot be read (a
simulated or hand-written tree).
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Iterable

__all__ = ["CgroupUsage", "Note", "mount_for", "namespace_root", "unified_path"]

Note = Callable[[int, str], None]
"""How the tracker says something once: (logging level, message)."""

# The walk that looks for our own cgroup: bounded, done once (a kubelet node's tree is a few hundred
# directories, its pods four or five levels down; a kind node's seven).
MAX_DEPTH = 12
MAX_DIRS = 20_000


def unified_path(cgroup_text: str) -> str | None:
    """A process's cgroup v2 path (the ``0::`` line of ``/proc/<pid>/cgroup``) as the reader's cgroup
    namespace shows it (``/..`` components where it lies outside that namespace); None under cgroup v1 only."""
    for line in cgroup_text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def mount_for(setting: str, proc_root: str) -> str:
    """The cgroup v2 mount a ``cgroup_root`` setting names: ``auto`` is the ``sys/fs/cgroup`` beside the
    procfs root (``/proc`` → ``/sys/fs/cgroup``, ``/host/proc`` → ``/host/sys/fs/cgroup``), or its ``unified``
    directory in systemd's hybrid layout (:meth:`CgroupUsage.ready` looks); "" is off."""
    if setting != "auto":
        return setting
    return posixpath.join(posixpath.dirname(posixpath.normpath(proc_root)), "sys", "fs", "cgroup")


def _relative(path: str) -> bool:
    """Whether the path climbs out of the reader's namespace (``/../..``: the kernel puts those first)."""
    return ".." in path.split("/")


def _lists(directory: str, pid: bytes) -> bool:
    """Whether the cgroup ``directory``'s ``cgroup.procs`` lists ``pid``."""
    try:
        with open(f"{directory}/cgroup.procs", "rb") as f:
            return pid in f.read().split()
    except OSError:
        return False


def namespace_root(mount: str, self_path: str, pid: int) -> str | None:
    """Where the root of the reader's cgroup namespace sits under ``mount`` ("/…"; "/" for the host's
    namespace), found by the cgroup whose ``cgroup.procs`` lists ``pid`` (ours: the file shows pids in the
    reader's pid namespace) and ``self_path``, our own path as ``/proc/self/cgroup`` shows it (normally
    "/": we sit at our namespace's root). None where no cgroup within the walk's bounds holds us."""
    if _relative(self_path):  # we sit outside our own namespace: its root cannot be told from our place
        return None
    mount, wanted = mount.rstrip("/"), str(pid).encode()
    suffix = self_path.rstrip("/")
    if suffix and _lists(f"{mount}{suffix}", wanted):
        return "/"  # our own path is the host's: the host's namespace (the common case, one read)
    level, seen = [""], 0
    for _ in range(MAX_DEPTH + 1):
        below: list[str] = []
        for relative in level:
            seen += 1
            if seen > MAX_DIRS:
                return None
            if _lists(mount + relative, wanted):
                if not relative.endswith(suffix):
                    return None
                return relative[: len(relative) - len(suffix)] or "/"
            try:
                with os.scandir(mount + relative) as entries:
                    below.extend(f"{relative}/{e.name}" for e in entries if e.is_dir(follow_symlinks=False))
            except OSError:
                continue
        level = below
    return None


def _usage_usec(text: bytes) -> int | None:
    for line in text.splitlines():
        if line.startswith(b"usage_usec "):
            try:
                return int(line[11:])
            except ValueError:
                return None
    return None


class _CpuStatFiles:
    """Each cgroup's ``cpu.stat`` kept open from scan to scan and read again with one ``pread``: on this VM's
    kernfs that is 1.3 µs against 6.5 µs to open, read and close it, for every cgroup every tick. A read that
    fails (a removed cgroup answers ENODEV) or a file no longer linked (a plain tree's, rewritten by rename or
    removed) is opened by path again, once; beyond ``limit`` files none is kept."""

    def __init__(self, limit: int) -> None:
        self.fds: dict[str, int] = {}
        self.limit = limit

    def usage_usec(self, path: str) -> int | None:
        fd = self.fds.get(path)
        if fd is not None:
            try:
                if os.fstat(fd).st_nlink:
                    return _usage_usec(os.pread(fd, 4096, 0))
            except OSError:
                pass
            del self.fds[path]
            os.close(fd)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return _usage_usec(os.pread(fd, 4096, 0))
        except OSError:
            return None
        finally:
            if len(self.fds) < self.limit and path not in self.fds:
                self.fds[path] = fd
            else:
                os.close(fd)

    def keep_only(self, paths: set[str]) -> None:
        for path in [p for p in self.fds if p not in paths]:
            os.close(self.fds.pop(path))

    def close(self) -> None:
        self.keep_only(set())


def _is_v2(mount: str) -> bool:
    """Whether ``mount`` is the root of a cgroup v2 hierarchy (only that has ``cgroup.controllers``)."""
    return os.path.isfile(f"{mount}/cgroup.controllers")


def _cgroup_type(directory: str) -> bytes:
    """A cgroup's ``cgroup.type`` (``domain``, ``threaded``, ...); ``domain`` where it has none (the root, a
    plain tree) or it cannot be read."""
    try:
        with open(f"{directory}/cgroup.type", "rb") as f:
            return f.read().strip()
    except OSError:
        return b"domain"


def _self_path(proc_root: str) -> str | None:
    """Our own cgroup v2 path from ``<proc_root>/self/cgroup``; None where it cannot be read (a tree that
    is not a procfs: the simulator's ``self`` names a process it does not write)."""
    try:
        with open(f"{proc_root}/self/cgroup", encoding="utf-8", errors="replace") as f:
            return unified_path(f.read())
    except OSError:
        return None


class CgroupUsage:
    """``usage_usec`` of each cgroup under ``root`` (the host's cgroup2 mount), remembered between scans.

    :meth:`ready` looks, once (on the scanning thread), whether ``root`` is a cgroup v2 mount and where our
    cgroup namespace's root sits in it; until then, and where it is not one, nothing is tracked.
    """

    def __init__(
        self,
        root: str,
        *,
        proc_root: str = "/proc",
        note: Note | None = None,
        explicit: bool = True,
        keep_open: int = 2048,
    ) -> None:
        self.root = root.rstrip("/")
        self._proc_root = proc_root
        self._note = note or (lambda level, message: None)
        self._explicit = explicit
        self._last: dict[str, int] = {}
        self._files = _CpuStatFiles(keep_open)  # beyond keep_open, a cpu.stat is opened, read and closed
        # What each path is joined to: "" the paths are the host's (the host's namespace); a namespace's
        # root; None a namespace whose root was not found (no path can be placed).
        self._prefix: str | None = ""
        self._where: dict[str, str | None] = {}  # each path asked about last time: its cpu.stat (_cpu_stat)
        self._shared = False  # whether a threaded cgroup was met (read through its subtree's root's cpu.stat)
        self._ready: bool | None = None  # None: not looked yet

    @classmethod
    def of(cls, setting: str, proc_root: str, note: Note | None = None, keep_open: int = 2048) -> CgroupUsage | None:
        """The tracker a ``cgroup_root`` setting asks for (``auto``: beside ``proc_root``); None for ""."""
        if not setting:
            return None
        mount = mount_for(setting, proc_root)
        return cls(mount, proc_root=proc_root, note=note, explicit=setting != "auto", keep_open=keep_open)

    def looked(self) -> bool:
        """Whether :meth:`ready` has looked at the mount yet (the first scan with CPU time)."""
        return self._ready is not None

    def describe(self) -> dict[str, object]:
        """The mount taken, where our cgroup namespace's root sits in it ("/": the host's namespace; None: not
        found, so no path can be placed), and how many cgroups the last scan watched."""
        root = "/" if self._prefix == "" else self._prefix
        return {"mount": self.root, "namespace_root": root, "cgroups": len(self._last)}

    def ready(self) -> bool:
        """Whether ``root`` is a cgroup v2 mount (it has ``cgroup.controllers``), said once where it is not.
        The first call also places our cgroup namespace (:func:`namespace_root`), saying so where it cannot."""
        if self._ready is None:
            if not self._explicit and not _is_v2(self.root) and _is_v2(f"{self.root}/unified"):
                self.root = f"{self.root}/unified"  # systemd's hybrid layout: v1 controllers, the v2 hierarchy here
            self._ready = _is_v2(self.root)
            if self._ready:
                self._place_namespace()
            elif self._explicit or os.path.lexists(f"{self._proc_root}/self"):
                self._say_not_mounted()  # (auto on a tree that is not a procfs, a test's plain files: nothing to say)
        return self._ready

    def _say_not_mounted(self) -> None:
        if self._explicit:
            self._note(
                logging.WARNING,
                f"cgroup_root {self.root} is not a cgroup v2 mount (no cgroup.controllers); "
                "every process's stat is read every tick",
            )
        else:
            self._note(
                logging.INFO,
                f"cgroup_root auto: {self.root} is not a cgroup v2 mount, nor is its unified/ (cgroup v1 "
                "or not mounted); every process's stat is read every tick",
            )

    def _place_namespace(self) -> None:
        mine = _self_path(self._proc_root)
        if mine is None:
            return  # a tree that is not a procfs: its paths are taken as the host's
        found = namespace_root(self.root, mine, os.getpid())
        if found is None:
            self._prefix = None
            self._note(
                logging.INFO,
                f"cgroup_root {self.root}: no cgroup there holds this process (pid "
                f"{os.getpid()}, {mine} in its cgroup namespace): its paths cannot be placed, every "
                "process's stat is read every tick",
            )
        elif found != "/":
            self._prefix = found
            self._note(logging.DEBUG, f"cgroup_root {self.root}: this cgroup namespace's root is {found}")

    def _place(self, path: str) -> str | None:
        """``path`` as the mount shows it; None where it cannot be placed."""
        prefix = self._prefix
        if prefix is None:
            return None
        if not prefix:
            return None if _relative(path) else path  # a path above the mount's root: not in it
        return posixpath.normpath(prefix + path)

    def _cpu_stat(self, path: str) -> str | None:
        """The ``cpu.stat`` that tells whether a process in ``path`` ran: its cgroup's, or where that cgroup is
        ``threaded`` (cgroup v2's thread mode: the process's other threads may sit in other cgroups of the
        subtree, and ``/proc/<pid>/cgroup`` names its main thread's) the subtree's root's, the nearest ancestor
        that is not, whose usage counts every thread in the subtree. None where it cannot be placed."""
        placed = self._place(path)
        if placed is None:
            return None
        while placed != "/" and _cgroup_type(f"{self.root}{placed}") == b"threaded":
            placed = posixpath.dirname(placed)
            self._shared = True  # from now on, paths may outnumber the files they are read through
        return f"{self.root}{placed}/cpu.stat"

    def moved(self, paths: Iterable[str]) -> set[str]:
        """The cgroups among ``paths`` that ran anything since the last call (or are new, or unreadable);
        only ``paths`` are remembered for the next."""
        out: set[str] = set()
        now: dict[str, int] = {}
        where, files, last = self._where, self._files, self._last
        # Each path's cpu.stat, found when the path is first asked about (placed, and its type looked at once)
        found: dict[str, str | None] = {}
        for path in paths:
            stat = found[path] = where[path] if path in where else self._cpu_stat(path)
            usage = None if stat is None else files.usage_usec(stat)
            if usage is None:
                out.add(path)
                continue
            now[path] = usage
            if last.get(path) != usage:
                out.add(path)
        self._last, self._where = now, found
        # cgroups no longer asked about (gone, or their processes): let them go (threaded cgroups share a file)
        if len(files.fds) > len(now) or self._shared:
            live = {stat for path in now if (stat := found[path]) is not None}
            if len(files.fds) > len(live):
                files.keep_only(live)
        return out

    def readings(self) -> dict[str, tuple[str, int]] | None:
        """The last :meth:`moved`'s readings: each path asked about that could be read, the ``cpu.stat`` read for
        it (a threaded cgroup's is its threaded domain's, which other paths may share) and its ``usage_usec``;
        None where no path can be placed under the mount (our cgroup namespace's root not found): none is known."""
        if self._prefix is None:
            return None
        where = self._where
        return {path: (stat, usage) for path, usage in self._last.items() if (stat := where.get(path)) is not None}

    def read(self, paths: Iterable[str]) -> dict[str, tuple[str, int]]:
        """``paths`` read now, as :meth:`readings` gives them (those that could be), without counting as the last
        :meth:`moved`'s: whether their processes ran is asked from the next scan's reading, taken before their
        ``stat`` files are read (procfs reads a container's first in the scan that first lists it)."""
        out: dict[str, tuple[str, int]] = {}
        for path in paths:
            stat = self._where[path] if path in self._where else self._cpu_stat(path)
            if stat is not None and (usage := self._files.usage_usec(stat)) is not None:
                out[path] = (stat, usage)
        return out

    def exists(self, path: str) -> bool:
        """Whether ``path``'s cgroup is there (its directory under the mount): a cgroup whose ``cpu.stat`` gave no
        reading was removed (not read again) or is there and was unreadable (read again: its usage goes on)."""
        placed = self._place(path)
        return placed is not None and os.path.isdir(f"{self.root}{placed}")

    def children(self, path: str) -> list[str] | None:
        """The names of the cgroups directly below ``path`` (one ``scandir``); None where it cannot be placed under
        the mount or listed."""
        placed = self._place(path)
        if placed is None:
            return None
        try:
            with os.scandir(f"{self.root}{placed}") as entries:
                return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            return None

    def close(self) -> None:
        """Close the cpu.stat files kept open (on the scanning thread)."""
        self._files.close()
