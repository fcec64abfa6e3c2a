"""Each container's cgroup CPU time, from the ``cpu.stat`` reads :class:`CgroupUsage` already makes.

``usage_usec`` of a container's cgroup counts every task it ever held, exited ones included: the processes a
scan lists, and those it never saw (started and ended between two scans) or saw last before they ended. The
``cpu_attribution`` processor's ``unseen: containers`` bills a container the difference.

The cgroups read are those of the last scan's processes (``_proc.py`` ``_idle``), before this scan reads any
process: so a container whose last process ended since the last scan is read once more, and its final
seconds are counted (if its cgroup is still there: a removed cgroup answers nothing, and its last seconds are
lost). A container none of whose processes a scan listed is not read (finding it would mean walking the
cgroup tree every tick); one first listed now is read from the next scan on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records_cpu import ContainerCpuTime
from wattpipe.receivers.procfs._cgroup import CgroupIdentity

__all__ = ["container_usage"]


def _outermost(paths: set[str]) -> list[str]:
    """The paths none of whose ancestors is among ``paths`` (a nested cgroup's usage is in its parent's)."""
    if len(paths) == 1:
        return list(paths)
    return [p for p in paths if not any(a != p and p.startswith(a.rstrip("/") + "/") for a in paths)]


def container_usage(
    now: Timestamp, cgroups: Iterable[tuple[str, CgroupIdentity]], usec: Mapping[str, tuple[str, int]]
) -> list[ContainerCpuTime]:
    """A record per container of ``cgroups`` (each process's cgroup path and its identity), its usage the sum of
    its outermost cgroups' readings (``usec``: path → the ``cpu.stat`` read and its ``usage_usec``), each file
    once (two threaded cgroups are read through their domain's one file); none for a container one of whose
    cgroups gave no reading (removed, unreadable): unknown, not less."""
    by_container: dict[str, tuple[CgroupIdentity, set[str]]] = {}
    for path, identity in cgroups:
        if identity.container_id is not None:
            by_container.setdefault(identity.container_id, (identity, set()))[1].add(path)
    out = []
    for container_id, (identity, paths) in sorted(by_container.items()):
        readings = [usec.get(path) for path in _outermost(paths)]
        if any(r is None for r in readings):
            continue
        total = sum(dict(r for r in readings if r is not None).values())  # by file: each counted once
        out.append(
            ContainerCpuTime(
                time=now,
                container_id=container_id,
                container_runtime=identity.runtime,
                pod_uid=identity.pod_uid,
                usage_s=total / 1e6,
            )
        )
    return out
