"""Who a GPU process was after it exited, for as long as its energy may still arrive.

On a MIG GPU the ``attribution`` processor holds each tick's energy until dcgm-exporter's sample covering
it arrives (about 35 s with its 30 s collections, at most ``attribution.mig_max_wait``, 90 s by default),
then releases it to the processes that were on each instance, including those that have exited since: a
GpuShare of a pid the driver no longer lists. Without a Workload for that pid the ``energy`` processor
cannot add the energy to its container and pod, so each (pid, device)'s last workload is remembered for
``keep_s`` after the driver stops listing the pid on that device, at most ``max_pids`` of them (the earliest
exits forgotten first).

Only what the driver listed is ever remembered, as it was resolved then: a late share goes where the
process's earlier energy went, whatever /proc says of the pid now (the kernel may have reused it, also for a
process the driver lists on another GPU). So a late workload is for one device: it carries ``device_id`` in
``extra``, and the energy processor gives it to that device's late shares alone; the pid's own Workload (the
process that has it now) stays the one of every other share.

Per tick: one lookup per (pid, device) listed last tick, one per share of one not listed now; what is
remembered is forgotten from the front of a queue in the order it was learned, never by a scan.

What is remembered survives a restart (:meth:`ExitedProcesses.dump`, in the k8s processor's state section):
attribution's holds survive it too, and release after it the energy of processes that exited before it (or
while wattpipe was down), which must still reach their container and pod. The exited pairs keep their time to
be forgotten (as a wall time: wattpipe's downtime counts), the pairs listed at the stop are taken as last
tick's (those the driver no longer lists after the restart have exited: remembered from then on).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import GpuProcessSample, GpuShare, Workload

__all__ = ["LATE_DEVICE", "ExitedProcesses", "workload_of", "workload_row"]

LATE_DEVICE = "device_id"
"""The ``extra`` key of a late workload: the device whose late shares it is for."""

Pair = tuple[int, str]  # pid, device id
_NAMES = ("container_id", "container_name", "pod_uid", "pod_name", "pod_namespace")


class ExitedProcesses:
    """(pid, device) → the workload the pid had when the driver last listed it there, for ``keep_s`` after."""

    def __init__(self, keep_s: float, max_pids: int) -> None:
        self.keep_s = keep_s
        self.max_pids = max_pids
        self.dropped = 0  # remembered pairs forgotten early because ``max_pids`` were remembered
        self._listed: dict[Pair, Workload] = {}  # last tick's listed pairs, as they resolved
        self._gone: dict[Pair, tuple[Workload, float]] = {}  # pair → (its workload, when to forget it)
        # (when to forget, pair) in the order learned; an entry is stale once its pair was learned again since.
        self._queue: deque[tuple[float, Pair]] = deque()

    def __len__(self) -> int:
        return len(self._gone)

    @property
    def listed(self) -> Mapping[Pair, Workload]:
        """Last tick's listed pairs, as they resolved."""
        return self._listed

    def update(self, now_s: float, listed: dict[Pair, Workload]) -> None:
        """``listed``: this tick's resolution of every (pid, device) the driver lists. Those listed last tick and
        not now have exited (or left the GPU): remembered from now on."""
        if not self.max_pids:
            return  # remembering is off
        forget_at = now_s + self.keep_s
        for pair, workload in self._listed.items():
            if pair not in listed:
                self._gone[pair] = (workload, forget_at)
                self._queue.append((forget_at, pair))
        self._listed = listed
        while self._queue and (self._queue[0][0] <= now_s or len(self._queue) > self.max_pids):
            due, pair = self._queue.popleft()
            gone = self._gone.get(pair)
            if gone is not None and gone[1] == due:
                del self._gone[pair]
                self.dropped += due > now_s

    def late(self, time: Timestamp, shares: Sequence[GpuShare], on_gpu: Sequence[GpuProcessSample]) -> list[Workload]:
        """The remembered workloads of the (pid, device) pairs with a share this tick that the driver does not
        list (``on_gpu``: this tick's listing; a pair listed again is back, not late), each for its device."""
        out: dict[Pair, Workload] = {}
        listed: set[Pair] | None = None  # made only when a remembered pair has a share
        for share in shares:
            if share.pid is None:
                continue
            pair = (share.pid, share.device_id)
            if pair in out or (gone := self._gone.get(pair)) is None:
                continue
            if listed is None:
                listed = {(p.pid, p.device_id) for p in on_gpu}
            if pair not in listed:
                w = gone[0]
                extra = (*(kv for kv in w.extra if kv[0] != LATE_DEVICE), (LATE_DEVICE, share.device_id))
                out[pair] = dataclasses.replace(w, time=time, extra=extra)
        return list(out.values())

    # --- state -------------------------------------------------------------------------------

    def dump(self, wall_offset_s: float) -> dict[str, Any]:
        """What is remembered, JSON-able: the pairs listed last tick, and the exited ones in the order learned
        with when to forget them as wall times (``wall_offset_s``: wall − monotonic now)."""
        gone = []
        for due, pair in self._queue:
            remembered = self._gone.get(pair)
            if remembered is not None and remembered[1] == due:  # (not a stale entry)
                gone.append({**workload_row(pair, remembered[0]), "forget_wall_s": due + wall_offset_s})
        return {"listed": [workload_row(pair, w) for pair, w in self._listed.items()], "gone": gone}

    def load(self, saved: Mapping[str, Any], now: Timestamp) -> None:
        """Remember what :meth:`dump` saved (nothing when remembering is off). A section it cannot use raises
        ValueError naming what, with nothing restored."""
        offset_s = now.wall_offset_s
        listed: dict[Pair, Workload] = {}
        gone: list[tuple[float, Pair, Workload]] = []
        for i, row in enumerate(_rows(saved, "listed")):
            pair, w = workload_of(row, now, f"listed process {i}")
            listed[pair] = w
        for i, row in enumerate(_rows(saved, "gone")):
            pair, w = workload_of(row, now, f"exited process {i}")
            forget_wall_s = row.get("forget_wall_s")
            if isinstance(forget_wall_s, bool) or not isinstance(forget_wall_s, int | float):
                raise ValueError(f"exited process {i}: forget_wall_s {forget_wall_s!r} is not a time")
            # Never later than keep_s from now: one further on was saved before a step back of the wall clock,
            # and the queue forgets from its front only (it would hold everything learned after it as long).
            gone.append((min(float(forget_wall_s) - offset_s, now.monotonic_s + self.keep_s), pair, w))
        if not self.max_pids:
            return
        self._listed = listed
        for due, pair, w in gone:
            self._gone[pair] = (w, due)
            self._queue.append((due, pair))


def _rows(saved: Mapping[str, Any], name: str) -> list[Any]:
    rows = saved.get(name) if isinstance(saved, Mapping) else None
    if not isinstance(rows, list):
        raise ValueError(f"{name} is {type(rows).__name__}, not a list of processes")
    return rows


def workload_row(pair: Pair, w: Workload) -> dict[str, Any]:
    """A remembered (pid, device)'s workload as a state-file row (its time is not kept: a late one gets the
    tick's)."""
    return {
        "pid": pair[0],
        "device_id": pair[1],
        **{name: getattr(w, name) for name in _NAMES if getattr(w, name) is not None},
        "extra": [list(kv) for kv in w.extra],
    }


def workload_of(row: Any, now: Timestamp, where: str) -> tuple[Pair, Workload]:
    """The (pid, device) and workload of a :func:`workload_row`; ValueError naming ``where`` and what is wrong."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: {type(row).__name__}, not an object")
    pid, device_id, extra = row.get("pid"), row.get("device_id"), row.get("extra", [])
    if isinstance(pid, bool) or not isinstance(pid, int) or not isinstance(device_id, str):
        raise ValueError(f"{where}: pid {pid!r} on device {device_id!r}: not a pid and a device id")
    names = {name: row.get(name) for name in _NAMES}
    bad = [f"{name} {value!r}" for name, value in names.items() if value is not None and not isinstance(value, str)]
    if not isinstance(extra, list) or not all(
        isinstance(kv, list) and len(kv) == 2 and all(isinstance(x, str) for x in kv) for kv in extra
    ):
        bad.append(f"extra {extra!r}")
    if bad:
        raise ValueError(f"{where}: {', '.join(bad)}: not text (extra: a list of [name, value])")
    attrs = tuple((str(k), str(v)) for k, v in extra)
    return (pid, device_id), Workload(time=now, pid=pid, extra=attrs, **names)
