"""Each container's cgroup CPU time, from the ``cpu.stat`` reads :class:`CgroupUsage` already makes.

``usage_usec`` of a container's cgroup counts every task it ever held, exited ones included: the processes a
scan lists, and those it never saw (started and ended between two scans) or saw last before they ended. The
``cpu_attribution`` processor's ``unseen: containers`` bills a container the difference.

The cgroups read are those of the last scan's processes (``_proc.py`` ``_idle``), before this scan reads any
process, and, for a container with a record at the last scan none of whose processes that scan listed, the cgroups
of that record (``ContainerScans.carried``): so a container whose last process ended is read on while its cgroup is
there, its final seconds and the processes that live between two scans counted (a removed cgroup answers nothing,
and its last seconds are lost), and so is one whose processes a listing cut at ``max_processes`` left out. One
first listed now is read in that scan, after its processes' ``stat`` (its first reading: a baseline). A container
none of whose processes a scan lists is found below its pod (``_unlisted``: the cgroups directly below the pod
cgroup of each container read, one ``scandir`` a pod a scan), its identity from its path, and read then too; one
not there at the last scan's look was made since, its usage all since then (its first record's ``made_after_s``).
Containers outside a pod, or in a pod none of whose containers is read, are not looked for (that would walk the
cgroup tree every tick); one made and removed between two scans is never read.

A file read lower than at the last scan is a cgroup removed and made again under its path since (a container
restarted under its id): its usage is taken on from its last reading (``_continued``), all of the
new cgroup's time since that scan.

No record (unknown, not a wrong number) for a container:

- one of whose cgroups gave no reading (removed, unreadable): its next record, of the same cgroups, goes on from
  its last (its ``since_s`` kept: the consumer's delta spans the scans without one); its cgroups are read again
  while they are there, whether or not a process of it is listed (a removed one is not);
- with another container's cgroup below one of its own (Docker-in-Docker without a delegated leaf): a
  cgroup's usage counts its descendants', so its usage holds the inner container's processes, billed on their own;
- whose cgroups read differ from those of its last record (a process in a cgroup of it none was in, or none left
  in one): the sum is of other cgroups, and a cgroup that joins it brings its whole past.

After either of the last two, its next record is a baseline: its ``since_s`` is its own time, as a container's
first record's is (and every record's of a receiver started afresh).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import chain

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import HostProcess
from wattpipe.pipeline.records_cpu import ContainerCpuTime
from wattpipe.receivers.procfs._cgroup import CgroupIdentity, parse_cgroup_path
from wattpipe.receivers.procfs._cgroupmoves import ran_elsewhere
from wattpipe.receivers.procfs._identity import Identity

__all__ = ["Chain", "ContainerScans", "container_usage"]

_MANY = ""  # below a cgroup: more than one container's cgroups

Chain = tuple[frozenset[str], float | None]
"""A container's usage as its records go on: the files it is summed from, and the monotonic s since which it goes on
unbroken (its records' ``since_s``; None: broken, its next record is a baseline)."""


def _outermost(paths: set[str]) -> list[str]:
    """The paths none of whose ancestors is among ``paths`` (a nested cgroup's usage is in its parent's)."""
    if len(paths) == 1:
        return list(paths)
    return [p for p in paths if not any(a != p and p.startswith(a.rstrip("/") + "/") for a in paths)]


def _below(owners: Mapping[str, str]) -> dict[str, str]:
    """Each ancestor of the paths of ``owners`` (path → its container id): the one container with cgroups below
    it, or ``_MANY``."""
    below: dict[str, str] = {}
    for path, cid in owners.items():
        ancestor = path.rstrip("/")
        while (cut := ancestor.rfind("/")) > 0:
            ancestor = ancestor[:cut]
            found = below.get(ancestor)
            if found in (cid, _MANY):
                continue
            below[ancestor] = cid if found is None else _MANY
    return below


def container_usage(
    now: Timestamp,
    cgroups: Iterable[tuple[str, CgroupIdentity]],
    usec: Mapping[str, tuple[str, int]],
    listed: Iterable[tuple[str, CgroupIdentity]] = (),
    chains: Mapping[str, Chain] | None = None,
    made: Mapping[str, float] | None = None,
) -> tuple[list[ContainerCpuTime], dict[str, Chain]]:
    """A record per container of ``cgroups`` (each process's cgroup path and its identity, as the last scan
    listed them), its usage the sum of its outermost cgroups' readings (``usec``: path → the ``cpu.stat`` read
    and its ``usage_usec``), each file once (two threaded cgroups are read through their domain's one file);
    none where the module's docstring says. ``listed``: this scan's processes' cgroups (a container inside
    another's that starts now is in the outer's usage already); ``chains``: each container's at the last scan
    (None: every record a first reading, its ``since_s`` its own time); ``made``: the containers whose cgroups were
    made since a look at that monotonic s (their first record's ``made_after_s``). Returns the records and this scan's
    chains: kept as they were for a container with a cgroup unreadable now (its next record goes on from its
    last), broken where its usage does not go on (a set changed, a container below)."""
    by_container: dict[str, tuple[CgroupIdentity, set[str]]] = {}
    owners: dict[str, str] = {}
    for path, identity in cgroups:
        if (cid := identity.container_id) is not None:
            by_container.setdefault(cid, (identity, set()))[1].add(path)
            owners[path] = cid
    for path, identity in listed:
        if identity.container_id is not None:
            owners[path] = identity.container_id
    below = _below(owners) if len(by_container) > 1 or len(set(owners.values())) > 1 else {}
    out = []
    now_chains: dict[str, Chain] = {}
    for container_id, (identity, paths) in sorted(by_container.items()):
        outermost = _outermost(paths)
        readings = [usec.get(path) for path in outermost]
        last = None if chains is None else chains.get(container_id)
        if any(r is None for r in readings):
            if last is not None:
                now_chains[container_id] = last  # unknown now: its next reading goes on from its last record's
            continue
        by_file = dict(r for r in readings if r is not None)  # each file once
        read = frozenset(by_file)
        if any(below.get(p.rstrip("/"), container_id) != container_id for p in outermost):
            now_chains[container_id] = (read, None)
            continue  # another container's cgroup inside it: its usage counts that one's
        if last is not None and last[0] != read:
            now_chains[container_id] = (read, None)
            continue  # summed from other cgroups than its last record's
        since_s = now.monotonic_s if last is None or last[1] is None else last[1]
        now_chains[container_id] = (read, since_s)
        out.append(
            ContainerCpuTime(
                time=now,
                container_id=container_id,
                container_runtime=identity.runtime,
                pod_uid=identity.pod_uid,
                usage_s=sum(by_file.values()) / 1e6,
                since_s=since_s,
                made_after_s=made.get(container_id) if made and last is None else None,
            )
        )
    return out, now_chains


class ContainerScans:
    """What the process table keeps from scan to scan for its containers' usage (only where a processor asks):
    each container's chain (the files its usage is summed from, since when it goes on), each file's last reading
    and how far its processes ran ahead of it (``_cgroupmoves.py``), and the identities taken out of the table's
    cache to be read again, whose cgroups are still read (``pending``)."""

    def __init__(self) -> None:
        self.chains: dict[str, Chain] = {}
        self.file_usec: dict[str, int] = {}
        self.excess: dict[str, float] = {}
        self.pending: dict[int, Identity] = {}
        # the cgroups of the containers with a record this scan: read again at the next whether or not a process
        # of theirs is listed (its last one ended, or the listing was cut at max_processes), while they can be
        self.carried: dict[str, CgroupIdentity] = {}
        # what each file's usage is taken on from: the readings before its cgroup was removed and made again (≥ 0);
        # each file's last reading, those read after the stat files too (file_usec: those before them only)
        self.offset_usec: dict[str, int] = {}
        self.raw_usec: dict[str, int] = {}
        # the cgroups below each pod cgroup of the containers read, at the last scan's look (_unlisted): each name's
        # identity, by pod cgroup; that look's time; the pod each parent of a container's cgroup names (None: none)
        self.below: dict[str, dict[str, CgroupIdentity]] = {}
        self.below_s: float | None = None
        self.pods: dict[str, str | None] = {}

    def scan(
        self,
        now: Timestamp,
        usec: Mapping[str, tuple[str, int]] | None,
        cgroups: Mapping[int, Identity],
        cache: dict[int, Identity],
        records: Mapping[int, HostProcess],
        last: Mapping[int, HostProcess],
        read: Callable[[Iterable[str]], Mapping[str, tuple[str, int]]] | None = None,
        exists: Callable[[str], bool] | None = None,
        children: Callable[[str], list[str] | None] | None = None,
    ) -> list[ContainerCpuTime] | None:
        """This scan's container records (None where ``usec``, the cgroup readings of the last scan's processes
        ``cgroups``, is None), the identities of processes that ran ahead of their cgroup taken out of ``cache``
        (this scan's: they are read again next scan). ``read``: reads cgroups now (those of a container first
        listed in this scan, after its processes' ``stat``: its first reading, a baseline, a scan earlier, and those
        of containers none of whose processes is listed found below their pods, ``_unlisted``); ``exists``: whether a
        cgroup is there (one that read nothing, unreadable and not removed, is read again); ``children``: the
        cgroups below a cgroup (``CgroupUsage.children``; None: none is looked for)."""
        read_again, self.pending = self.pending, {}
        if usec is None:
            return None
        # (with the identities read again this scan: their cgroups were read, and their containers' usage holds)
        was = chain(cgroups.values(), read_again.values())
        paths = {i.cgroup_path: i.cgroup for i in was if i.cgroup_path is not None}
        known = {c.container_id for c in paths.values()}
        # a container read at the last scan none of whose processes it listed: its cgroups then (a set that changed
        # would make the container's sum another's: no record, as for its processes' cgroups)
        paths.update((path, c) for path, c in self.carried.items() if c.container_id not in known)
        known.update(c.container_id for c in self.carried.values())
        listed = [(i.cgroup_path, i.cgroup) for i in cache.values() if i.cgroup_path is not None]
        by_file = dict(usec.values())  # (each file once: threaded cgroups share their domain's)
        raw_before, offsets_before = self.raw_usec, self.offset_usec
        readings, self.offset_usec = _continued(usec, by_file, raw_before, offsets_before)
        self.raw_usec = by_file
        made: dict[str, float] = {}
        if read is not None:  # (not the moves' check below: read after the stat files, they are ahead of them)
            new = {path: c for path, c in listed if c.container_id is not None and c.container_id not in known}
            if children is not None:
                known.update(c.container_id for c in new.values())
                found, made = self._unlisted(now, {**paths, **new}, known, children)
                new.update(found)
            if new and (late := read(new)):
                readings = {**readings, **self._late(late, raw_before, offsets_before)}
                paths.update(new)
        out, self.chains = container_usage(now, paths.items(), readings, listed, self.chains, made)
        self._keep_unread(raw_before, offsets_before)
        self.carried = self._carried(paths, {r.container_id for r in out}, exists)
        pids_in = ((pid, i.cgroup_path) for pid, i in cgroups.items() if i.cgroup_path is not None)
        again = ran_elsewhere(pids_in, records, last, usec, self.file_usec, self.excess)
        # moved without an exec, perhaps: its identity (cgroup) is read again next scan, its cgroup too
        self.pending = {pid: identity for pid in again if (identity := cache.pop(pid, None)) is not None}
        self.file_usec = by_file
        return out

    def _unlisted(
        self,
        now: Timestamp,
        paths: Mapping[str, CgroupIdentity],
        known: set[str | None],
        children: Callable[[str], list[str] | None],
    ) -> tuple[dict[str, CgroupIdentity], dict[str, float]]:
        """The cgroups of the containers not ``known`` (none of their processes listed, nor read at the last scan)
        directly below the pod cgroups of ``paths`` (those of containers whose parent names their pod, as the
        kubelet lays them out; one ``children`` each), their identity from their path (a name that is not a
        container's, another pod's: none); and, of those not below at the last scan's look, when that was
        (container id → its monotonic s: their cgroups were made since, their usage is all since then). What is
        below each pod now is kept for the next scan's look (each name's identity with it: parsed once)."""
        pods: dict[str, str | None] = {}  # a container's parent → the pod uid it names (None: none, a container's)
        named = self.pods
        for path, c in paths.items():
            if c.pod_uid is not None and c.container_id is not None:
                parent = path.rstrip("/").rpartition("/")[0]
                if parent not in pods:
                    if (uid := named.get(parent, "")) == "":  # (not met at the last scan)
                        pod = parse_cgroup_path(parent)
                        uid = pod.pod_uid if pod.container_id is None else None
                    pods[parent] = uid
        self.pods = pods
        before, before_s = self.below, self.below_s
        self.below, self.below_s = {}, now.monotonic_s
        found: dict[str, CgroupIdentity] = {}
        made: dict[str, float] = {}
        for pod_path, uid in pods.items():
            if uid is None or (names := children(pod_path)) is None:
                continue
            was = before.get(pod_path)
            below = self.below[pod_path] = {}
            for name in names:
                path = f"{pod_path}/{name}"
                c = below[name] = was[name] if was is not None and name in was else parse_cgroup_path(path)
                if c.container_id is None or c.container_id in known or c.pod_uid != uid:
                    continue
                found[path] = c
                if was is not None and name not in was and before_s is not None:
                    made[c.container_id] = before_s
        return found, made

    def _carried(
        self, paths: Mapping[str, CgroupIdentity], recorded: set[str | None], exists: Callable[[str], bool] | None
    ) -> dict[str, CgroupIdentity]:
        """The cgroups to read at the next scan though none of their processes is listed: those of the containers
        ``recorded`` now, and those whose chain goes on over a cgroup that read nothing, while their cgroups are
        there (unreadable for a scan, not removed), so that one none of whose processes is listed is read again."""
        unread = {cid for cid, (_, since_s) in self.chains.items() if since_s is not None and cid not in recorded}
        return {
            path: c
            for path, c in paths.items()
            if c.container_id in recorded or (c.container_id in unread and exists is not None and exists(path))
        }

    def _keep_unread(self, raw_before: Mapping[str, int], offsets_before: Mapping[str, int]) -> None:
        """The last reading and offset of each file of a chain kept though the file gave none now (unreadable): its
        next reading goes on from them, one lower a cgroup made again meanwhile (``_continued``)."""
        unread = {f for files, _ in self.chains.values() for f in files if f not in self.raw_usec}
        if unread:
            self.raw_usec = {**{f: raw_before[f] for f in unread if f in raw_before}, **self.raw_usec}
            self.offset_usec = {**{f: offsets_before[f] for f in unread if f in offsets_before}, **self.offset_usec}

    def _late(
        self, late: Mapping[str, tuple[str, int]], raw_before: Mapping[str, int], offsets_before: Mapping[str, int]
    ) -> Mapping[str, tuple[str, int]]:
        """``late``, cgroups read after the stat files (a container first listed now, or found unlisted below its
        pod), taken on as every reading is (``_continued``: a container none of whose processes is listed may have
        a chain kept from before, its file made again since), and remembered with this scan's readings."""
        self.raw_usec = {**self.raw_usec, **dict(late.values())}
        late, offsets = _continued(late, dict(late.values()), raw_before, offsets_before)
        self.offset_usec = {**self.offset_usec, **offsets}
        return late


def _continued(
    usec: Mapping[str, tuple[str, int]],
    by_file: Mapping[str, int],
    before: Mapping[str, int],
    offsets: Mapping[str, int],
) -> tuple[Mapping[str, tuple[str, int]], dict[str, int]]:
    """``usec`` with each file's usage going on from its last reading (``before``) where it went back: its cgroup was
    removed and made again under its path since the last scan (a container restarted under its id), so all of its
    usage now is since then (a new cgroup whose usage passed the old one's already is not told apart: its delta is
    short by the old one's, never over). ``by_file``: ``usec``'s readings by file; ``offsets``: what each file's
    usage was taken on from at the last scan. Returns them and each file's offset now (where not 0)."""
    kept = {}
    for file, usage in by_file.items():
        offset = offsets.get(file, 0)
        if (was := before.get(file)) is not None and usage < was:
            offset += was
        if offset:
            kept[file] = offset
    if not kept:
        return usec, kept
    return {path: (file, usage + kept.get(file, 0)) for path, (file, usage) in usec.items()}, kept
