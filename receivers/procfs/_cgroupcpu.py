"""Which cgroups ran anything since the last scan, from their ``cpu.stat`` (cgroup v2), one read each.

``usage_usec`` is the CPU time of every task the cgroup (and its descendants) ever held, exited ones
included. If it has not moved between two scans, no process in the cgroup ran in between, so the CPU
time read for each of them at the earlier scan (read after that scan's ``cpu.stat``) is still exact: their
``stat`` need not be read again. A cgroup whose ``cpu.stat`` cannot be read (cgroup v1, a cgroup
namespace that hides the host's paths, a removed cgroup) counts as moved: its processes are read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["CgroupUsage", "unified_path"]


def unified_path(cgroup_text: str) -> str | None:
    """A process's cgroup v2 path (the ``0::`` line of ``/proc/<pid>/cgroup``); None under cgroup v1 only,
    or where a cgroup namespace shows it relative to an ancestor (``/..``)."""
    for line in cgroup_text.splitlines():
        if line.startswith("0::"):
            path = line[3:]
            return path if path.startswith("/") and "/.." not in path else None
    return None


def _usage_usec(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    for line in text.splitlines():
        if line.startswith(b"usage_usec "):
            try:
                return int(line[11:])
            except ValueError:
                return None
    return None


class CgroupUsage:
    """``usage_usec`` of each cgroup under ``root`` (the host's cgroup2 mount), remembered between scans."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._last: dict[str, int] = {}

    def moved(self, paths: Iterable[str]) -> set[str]:
        """The cgroups among ``paths`` that ran anything since the last call (or are new, or unreadable);
        only ``paths`` are remembered for the next."""
        out: set[str] = set()
        now: dict[str, int] = {}
        for path in paths:
            usage = _usage_usec(f"{self.root}{path}/cpu.stat")
            if usage is None:
                out.add(path)
                continue
            now[path] = usage
            if self._last.get(path) != usage:
                out.add(path)
        self._last = now
        return out
