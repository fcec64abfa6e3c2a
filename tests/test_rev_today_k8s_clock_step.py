"""The k8s processor's memory of exited processes, saved with each one's time to be forgotten as a wall time,
restored after the wall clock stepped back: those times lay an hour on, and as the queue forgets from its front
only, every process that exited after the restart was remembered beside them for that hour too (up to
max_exited, then 'forgotten early' and logged as too many), not keep_exited."""

from __future__ import annotations

import json

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import Workload
from wattpipe.processors.k8s._exited import ExitedProcesses

KEEP_S = 120.0


def _w(pid: int, t: Timestamp) -> Workload:
    return Workload(time=t, pid=pid, container_id=f"c{pid}", pod_uid=f"p{pid}")


def test_exited_processes_restored_after_the_wall_clock_stepped_back_are_forgotten_after_keep_exited() -> None:
    before = ExitedProcesses(KEEP_S, 4096)
    t0 = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)
    before.update(t0.monotonic_s, {(1, "G"): _w(1, t0)})
    before.update(1005.0, {})  # pid 1 exited: remembered until 1125 (wall …725)
    saved = json.loads(json.dumps(before.dump(t0.wall_s - t0.monotonic_s)))
    # Restarted with the wall clock an hour behind what it read at the stop.
    now = Timestamp(monotonic_s=1010.0, wall_s=1_767_225_610.0 - 3600.0)
    after = ExitedProcesses(KEEP_S, 4096)
    after.load(saved, now)
    after.update(1010.0, {(2, "G"): _w(2, now)})
    after.update(1015.0, {})  # pid 2 exited after the restart: remembered until 1135
    after.update(1010.0 + KEEP_S + 10.0, {})
    assert len(after) == 0
