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
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import GpuProcessSample, GpuShare, Workload

__all__ = ["LATE_DEVICE", "ExitedProcesses"]

LATE_DEVICE = "device_id"
"""The ``extra`` key of a late workload: the device whose late shares it is for."""

Pair = tuple[int, str]  # pid, device id


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
