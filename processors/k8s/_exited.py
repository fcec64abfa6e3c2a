"""Who a GPU process was after it exited, for as long as its energy may still arrive.

On a MIG GPU the ``attribution`` processor holds each tick's energy until dcgm-exporter's sample covering
it arrives (about 35 s with its 30 s collections, at most ``attribution.mig_max_wait``, 90 s by default),
then releases it to the processes that were on each instance, including those that have exited since: a
GpuShare of a pid the driver no longer lists. Without a Workload for that pid the ``energy`` processor
cannot add the energy to its container and pod, so each pid's last workload is remembered for ``keep_s``
after the driver stops listing it, at most ``max_pids`` of them (the earliest exits forgotten first).

Only what the driver listed is ever remembered, as it was resolved then: a late share goes where the
process's earlier energy went, whatever /proc says of the pid now (the kernel may have reused it).

Per tick: one lookup per pid listed last tick, one per share of a pid not listed now; what is remembered
is forgotten from the front of a queue in the order it was learned, never by a scan.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import GpuProcessSample, GpuShare, Workload

__all__ = ["ExitedProcesses"]


class ExitedProcesses:
    """pid → the workload it had when the driver last listed it, for ``keep_s`` after that."""

    def __init__(self, keep_s: float, max_pids: int) -> None:
        self.keep_s = keep_s
        self.max_pids = max_pids
        self.dropped = 0  # remembered pids forgotten early because ``max_pids`` were remembered
        self._listed: dict[int, Workload] = {}  # last tick's listed pids, as they resolved
        self._gone: dict[int, tuple[Workload, float]] = {}  # pid → (its workload, when to forget it)
        # (when to forget, pid) in the order learned; an entry is stale once its pid was learned again since.
        self._queue: deque[tuple[float, int]] = deque()

    def __len__(self) -> int:
        return len(self._gone)

    def update(self, now_s: float, listed: dict[int, Workload]) -> None:
        """``listed``: this tick's resolution of every pid the driver lists. Those listed last tick and not
        now have exited (or left the GPU): remembered from now on."""
        if not self.max_pids:
            return  # remembering is off
        forget_at = now_s + self.keep_s
        for pid, workload in self._listed.items():
            if pid not in listed:
                self._gone[pid] = (workload, forget_at)
                self._queue.append((forget_at, pid))
        self._listed = listed
        while self._queue and (self._queue[0][0] <= now_s or len(self._queue) > self.max_pids):
            due, pid = self._queue.popleft()
            gone = self._gone.get(pid)
            if gone is not None and gone[1] == due:
                del self._gone[pid]
                self.dropped += due > now_s

    def late(self, time: Timestamp, shares: Sequence[GpuShare], on_gpu: Sequence[GpuProcessSample]) -> list[Workload]:
        """The remembered workloads of the pids with a share this tick that the driver does not list
        (``on_gpu``: this tick's listing; a pid listed again is another process's, or back: not late)."""
        out: dict[int, Workload] = {}
        listed: set[int] | None = None  # made only when a remembered pid has a share
        for share in shares:
            pid = share.pid
            if pid is None or pid in out or (gone := self._gone.get(pid)) is None:
                continue
            if listed is None:
                listed = {p.pid for p in on_gpu}
            if pid not in listed:
                out[pid] = dataclasses.replace(gone[0], time=time)
        return list(out.values())
