"""The energy processor's container and pod series, from the k8s processor's Workload records.

A container or pod series lives as long as its pod, not as long as its processes: while none of its
processes is on the GPU it runs on at 0 W; it ends when the k8s processor's list of the node's pods
(``Workload.listed``) lacks it, never while nobody can say which pods exist. A pod first seen by name (no
UID yet) keeps that key and its labels when its UID becomes known, and a container first seen by name
likewise when its id does, so the exported series does not fork.

**Late energy** (a MIG GPU's energy held for dcgm-exporter's sample, released after its process exited,
see ``processors/_mig_attribution.py``) goes to the container and pod the process was in, as the k8s
processor remembers them, but says nothing about whether they run: it neither starts their watts nor
brings back a series that ended (a pod gone since gets it in its ended series, while that is retained).
A pid the driver lists again (reused on another GPU) has its new process's Workload, but the old process's
late energy still goes to the old one's: the k8s processor's late Workload is for one device (``device_id``
in its ``extra``), and a late share looks up its (pid, device) first (tests/test_rev_energy_late_reuse.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import repeat
from typing import Any

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DevicePower, GpuShare, HostProcess, Totals, Workload
from wattpipe.processors._energy_series import Order, Series, end, prune, restore, saved, to_totals
from wattpipe.processors.attribution_math import apportion
from wattpipe.processors.k8s._exited import LATE_DEVICE

__all__ = ["GroupKey", "GroupSeries", "Late"]

GroupKey = tuple[str, str, str]  # "container" | "pod", container id | pod UID, device id
Late = dict[tuple[int, str, int | None], bool]
"""(pid, device, start time) of this tick's late shares → whether their energy went to a process series (when
not, it counted as unattributed, and goes to no container or pod either). The start time is the share's
(``GpuShare.start_time_ticks``): None on a running process's share, and on most late ones."""
_Part = tuple[int, float, dict[str, str]]  # energy (mJ), watts, attributes: one group's part of a tick


class _Roster:
    """The containers and pods that exist on the node this tick, as the k8s processor listed them. Looked up
    only for series that had no share this tick (few, most ticks): the keys are made at the first lookup."""

    __slots__ = ("_by_name", "_entries", "_keys")

    def __init__(self) -> None:
        self._entries: list[Workload] = []
        self._keys: set[tuple[str, str]] | None = None  # (scope, key) under every identity an entry has
        self._by_name = False  # some entries have names only (the kubelet's allocations)

    def add(self, w: Workload) -> None:
        self._entries.append(w)

    def lists(self, key: GroupKey, series: Series) -> bool:
        if self._keys is None:
            self._keys = {identity for w in self._entries for identity in _identities(w)}
            self._by_name = any(w.listed == "allocations" for w in self._entries)
        scope, group, _ = key
        if (scope, group) in self._keys:
            return True
        # A series keyed by its cgroup's ids, against a list of names: it is listed if its names are.
        return self._by_name and (scope, _name(scope, series.attrs)) in self._keys


def _group_columns(order: list[GroupKey]) -> tuple[list[Any], ...]:
    return [scope for scope, _, _ in order], [key for _, key, _ in order], [device for _, _, device in order]


class GroupSeries:
    """Container and pod series per device, with the aliases of those first keyed by name."""

    def __init__(self) -> None:
        self.groups: dict[GroupKey, Series] = {}
        # A group first keyed by name, whose UID (container id) became known later: later key → first key,
        # and first key → the later one that took it (one only: a pod recreated under the name is another).
        self.aliases: dict[GroupKey, GroupKey] = {}
        self._claimed: dict[GroupKey, GroupKey] = {}
        self._device_gone: set[GroupKey] = set()  # series ended because their device was gone (not saved)
        self._order = Order(_group_columns)
        self._late_keys: set[GroupKey] = set()  # the series late energy reached this tick (kept until exported)

    # --- state -------------------------------------------------------------------------------

    def restore(self, saved_state: Mapping[str, Any]) -> None:
        for row in saved_state.get("groups", []):
            self.groups[(str(row["scope"]), str(row["key"]), str(row["device_id"]))] = restore(row)
        for row in saved_state.get("aliases", []):
            later = (str(row["scope"]), str(row["key"]), str(row["device_id"]))
            first = (str(row["scope"]), str(row["first_key"]), str(row["device_id"]))
            if first in self.groups:
                self.aliases[later], self._claimed[first] = first, later

    def snapshot(self, wall_offset_s: float | None = None) -> dict[str, Any]:
        return {
            "groups": [
                {"scope": scope, "key": key, "device_id": device_id, **saved(s, wall_offset_s)}
                for (scope, key, device_id), s in sorted(self.groups.items())
            ],
            "aliases": [
                {"scope": scope, "key": key, "device_id": device_id, "first_key": first[1]}
                for (scope, key, device_id), first in sorted(self.aliases.items())
            ],
        }

    # --- the tick ----------------------------------------------------------------------------

    def update(
        self,
        batch: Batch,
        tick: int,
        powers: dict[str, DevicePower],
        split: set[str],
        gone: set[str],
        hosts: dict[int, HostProcess],
        late: Late,
    ) -> None:
        """Container and pod totals from the Workload records (pid → container → pod) of this tick (``tick``:
        the processor's count). A series runs while its pod exists, at 0 W while none of its processes does;
        it ends when the k8s processor's list lacks it (nothing ends when there is no list: unknown is not
        gone), or when its device is gone."""
        if "workloads" not in batch.present:
            for unknown in self.groups.values():
                unknown.power_w = None  # the k8s processor failed this tick (or there is none, and no groups)
            return
        running, released, roster = _parts(batch, hosts, late)
        wall_s = batch.time.wall_s
        for key, (mj, watts, attrs) in running.items():
            series = self.groups.get(key)
            aliased = False
            if series is None:
                series, aliased = self._series(key, attrs, wall_s - _interval(key, powers, batch))
            series.energy_mj += mj
            series.power_w = watts if series.seen != tick else (series.power_w or 0.0) + watts  # two keys, one series
            series.ended_wall_s = None
            series.seen = tick
            if not aliased:
                series.attrs.update(attrs)
        for key, (mj, _, attrs) in released.items():
            # Not seen: its state and watts are decided below, by whether its pod exists, as without it.
            series = self.groups.get(key) or self._series(key, attrs, wall_s - _interval(key, powers, batch))[0]
            series.energy_mj += mj
            self._late_keys.add(key if key in self.groups else self.aliases[key])
        self._unseen(tick, split, gone, roster, batch.time)

    def _unseen(self, tick: int, split: set[str], gone: set[str], roster: _Roster | None, now: Timestamp) -> None:
        """The series with no share this tick: running at 0 W while their pod exists, ended when it is not."""
        for key, series in self.groups.items():
            if series.seen == tick:
                continue
            series.power_w = 0.0 if key[2] in split else None  # none of its processes ran; or not known
            # A name's series that a UID (container id) took is that pod's (container's): listed by it, not by
            # the name, which a recreated pod (a restarted container) now has.
            if series.ended_wall_s is None:
                if key[2] in gone:
                    end(series, now)
                    self._device_gone.add(key)
                elif roster is not None and not roster.lists(self._claimed.get(key, key), series):
                    end(series, now)
                    self._device_gone.discard(key)  # (back since, it ran again: its pod is gone now)
            elif key in self._device_gone and key[2] in split and roster is not None:
                # Ended with its device, which is back: it runs again while its pod exists (not a new series).
                self._device_gone.discard(key)
                if roster.lists(self._claimed.get(key, key), series):
                    series.ended_wall_s = None

    def _series(self, key: GroupKey, attrs: dict[str, str], start_wall_s: float) -> tuple[Series, bool]:
        """The series of a key that none is filed under, and whether it is another key's (then it keeps its
        own attributes): the one the pod (container) began under its name, or a new one.

        A pod first seen by name (no UID yet: before the API cache synced, in degraded mode, or without /proc)
        and by UID later keeps its first key and labels, so that its exported series does not fork; the same
        for a container first seen by name and later by id. Only one UID takes a name's series: a pod
        recreated under the name is another pod."""
        first = self.aliases.get(key)
        if first is None:
            name = _name(key[0], attrs)
            by_name = (key[0], name or "", key[2])
            # Not a name's series that ended with its pod (a pod under the name now is another); one that ended
            # with its device (back now) is that pod's still.
            ended = by_name in self.groups and self.groups[by_name].ended_wall_s is not None
            taken = (
                by_name not in self.groups or by_name in self._claimed or (ended and by_name not in self._device_gone)
            )
            if name is not None and name != key[1] and not taken:
                self.aliases[key], self._claimed[by_name] = by_name, key
                first = by_name
        if first is not None:
            return self.groups[first], True
        series = self.groups[key] = Series(energy_mj=0, start_wall_s=start_wall_s, attrs=dict(attrs))
        return series, False

    def prune(self, now: Timestamp, retention_s: Callable[[str], float], max_terminated: int) -> None:
        """Drop the ended series past their retention or beyond ``max_terminated``, but those late energy reached
        this tick: exported with it first (else it was in no total), dropped no sooner than the next tick."""
        fresh = {key: self.groups.pop(key) for key in self._late_keys if key in self.groups}
        self._late_keys = set()
        dropped = prune(self.groups, now, lambda key: retention_s(key[2]), max_terminated)
        self.groups.update(fresh)
        for first in dropped:
            self._device_gone.discard(first)
            later = self._claimed.pop(first, None)
            if later is not None:
                del self.aliases[later]

    def totals(self, now: Timestamp) -> tuple[Totals, ...]:
        order, (scopes, keys, devices) = self._order.of(self.groups)
        return tuple(map(to_totals, repeat(now), scopes, keys, devices, map(self.groups.__getitem__, order)))


def _interval(key: GroupKey, powers: dict[str, DevicePower], batch: Batch) -> float:
    return powers[key[2]].interval_s if key[2] in powers else batch.interval_s


def _parts(
    batch: Batch, hosts: dict[int, HostProcess], late: Late
) -> tuple[dict[GroupKey, _Part], dict[GroupKey, _Part], _Roster | None]:
    """This tick's energy, watts and attributes per group, from running processes and released late, and the
    k8s processor's list of what exists (None: it could not say)."""
    workloads: dict[int, Workload] = {}
    late_workloads: dict[tuple[int, str], Workload] = {}  # the k8s processor's, each for one device
    for w in batch.workloads:
        if w.pid is not None:
            device_id = dict(w.extra).get(LATE_DEVICE)
            if device_id is None:
                workloads[w.pid] = w
            else:
                late_workloads[(w.pid, device_id)] = w
    owners, roster = _owners_and_roster(batch.workloads)
    running: dict[GroupKey, _Part] = {}
    released: dict[GroupKey, _Part] = {}
    pooled: dict[tuple[str, str | None, bool], tuple[int, float]] = {}
    for share in batch.shares:
        if share.pid is None:
            continue
        landed = late.get((share.pid, share.device_id, share.start_time_ticks)) if late else None
        if landed is False:
            continue  # its process series was dropped: the device's remainder has it
        gi = None if share.gpu_instance_id is None else str(share.gpu_instance_id)
        if (share.device_id, gi) in owners:
            mj, watts = pooled.get((share.device_id, gi, bool(landed)), (0, 0.0))
            pooled[(share.device_id, gi, bool(landed))] = (mj + share.energy_mj, watts + share.power_w)
            continue
        # A late share is the exited process's, as the k8s processor remembers it on that device; the pid's own
        # Workload (whoever has the pid now) only where there is none such, and not where the share names the
        # process it is for and /proc has another one under its pid (its workload is the other one's).
        member = (late_workloads.get((share.pid, share.device_id)) if landed else None) or (
            None if landed and _another(share, hosts.get(share.pid)) else workloads.get(share.pid)
        )
        if member is not None:
            # A late share's pid may be another process's by now: /proc says nothing of the one that ran.
            runtime = None if landed else _runtime(member, hosts.get(share.pid))
            _add(released if landed else running, member, share.device_id, share.energy_mj, share.power_w, runtime)
    for (device_id, gi, is_late), (mj, watts) in pooled.items():
        members = owners[(device_id, gi)]
        for w, part in zip(members, apportion(mj, [1.0] * len(members)), strict=True):
            _add(released if is_late else running, w, device_id, part, watts / len(members))
    return running, released, roster


def _another(share: GpuShare, host: HostProcess | None) -> bool:
    """The share is for a process of a known start time, and procfs's process of its pid now started at another."""
    start = share.start_time_ticks
    return start is not None and host is not None and host.start_time_ticks not in (None, start)


def _owners_and_roster(
    workloads: tuple[Workload, ...],
) -> tuple[dict[tuple[str, str | None], list[Workload]], _Roster | None]:
    """Degraded mode (no host pid view): per device or MIG instance, the containers pod-resources says own it;
    and the list of what exists."""
    owners: dict[tuple[str, str | None], list[Workload]] = {}
    roster: _Roster | None = None
    for w in workloads:
        if w.pid is not None:
            continue
        if w.listed is not None:
            roster = roster or _Roster()
            roster.add(w)
            continue
        extra = dict(w.extra)
        if extra.get("degraded") and "device_id" in extra:
            owners.setdefault((extra["device_id"], extra.get("gpu_instance_id")), []).append(w)
    return owners, roster


def _runtime(member: Workload, host: HostProcess | None) -> str | None:
    """The container runtime /proc showed for the process, when it is in the workload's container."""
    return host.container_runtime if host is not None and member.container_id == host.container_id else None


def _add(
    parts: dict[GroupKey, _Part], w: Workload, device_id: str, mj: int, watts: float, runtime: str | None = None
) -> None:
    for key, attrs in _memberships(w, device_id, runtime):
        old_mj, old_w, _ = parts.get(key, (0, 0.0, attrs))
        parts[key] = (old_mj + mj, old_w + watts, attrs)


def _memberships(w: Workload, device_id: str, runtime: str | None = None) -> list[tuple[GroupKey, dict[str, str]]]:
    """The container and pod a process belongs to, as group keys with their descriptive attributes
    (``runtime``: the container runtime /proc showed for the process, when it is in that container)."""
    pod = {k: v for k, v in (("pod_name", w.pod_name), ("pod_namespace", w.pod_namespace)) if v is not None}
    pod.update({k: v for k, v in w.extra if k.startswith(("label_", "annotation_"))})
    out: list[tuple[GroupKey, dict[str, str]]] = []
    container_key = w.container_id or (
        f"{w.pod_namespace}/{w.pod_name}/{w.container_name}"
        if w.pod_name and w.pod_namespace and w.container_name
        else None
    )
    if container_key is not None:
        attrs = {**pod, **({"container_name": w.container_name} if w.container_name else {})}
        attrs.update({k: v for k, v in w.extra if k == "runtime"})
        if runtime:
            attrs["runtime"] = runtime
        if w.pod_uid is not None:
            attrs["pod_uid"] = w.pod_uid
        out.append((("container", container_key, device_id), attrs))
    pod_key = w.pod_uid or (f"{w.pod_namespace}/{w.pod_name}" if w.pod_name and w.pod_namespace else None)
    if pod_key is not None:
        out.append((("pod", pod_key, device_id), pod))
    return out


def _identities(w: Workload) -> list[tuple[str, str]]:
    """Every (scope, key) a roster entry's container and pod may have been filed under: ids and names."""
    out = [("pod", key) for key in (w.pod_uid,) if key]
    out += [("container", key) for key in (w.container_id,) if key]
    if w.pod_name and w.pod_namespace:
        out.append(("pod", f"{w.pod_namespace}/{w.pod_name}"))
        if w.container_name:
            out.append(("container", f"{w.pod_namespace}/{w.pod_name}/{w.container_name}"))
    return out


def _name(scope: str, attrs: dict[str, str]) -> str | None:
    """A group's name key from its attributes (``namespace/pod[/container]``), where they have it."""
    namespace, pod, container = attrs.get("pod_namespace"), attrs.get("pod_name"), attrs.get("container_name")
    if namespace is None or pod is None:
        return None
    if scope == "pod":
        return f"{namespace}/{pod}"
    return None if container is None else f"{namespace}/{pod}/{container}"
