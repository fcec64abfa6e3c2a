"""receivers/procfs/_cgroupmoves.py: a cgroup's listed processes running ahead of its usage means one moved, not
that a busy cgroup's processes were read a little later in the scan than its ``cpu.stat``."""

from __future__ import annotations

import random

import pytest

from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import HostProcess
from wattpipe.receivers.procfs._cgroupmoves import ran_elsewhere

FILE = "/kubepods/a/cpu.stat"


def re_reads(cpus: float, jitter_s: float, interval_s: float, scans: int = 2000, moved_cpus: float = 0.0) -> int:
    """Scans that read identities again, for one cgroup running ``cpus`` busy CPUs whose process stat is read ~20 ms
    after its cpu.stat, ± ``jitter_s`` (a scan's timing on a loaded node); ``moved_cpus``: a process listed there that
    runs that much elsewhere (moved without an exec)."""
    rnd = random.Random(7)
    now = SteppedClock().now()
    excess: dict[str, float] = {}
    before: dict[str, int] = {}
    last: dict[int, HostProcess] = {}
    found = 0
    for scan in range(1, scans + 1):
        t_s = scan * interval_s
        skew_s = max(0.0, 0.02 + rnd.gauss(0.0, jitter_s))
        ticks = int(cpus * (t_s + skew_s) * 50) * 2  # utime and stime, each truncated to whole 10 ms ticks
        records = {
            10: HostProcess(time=now, pid=10, start_time_ticks=1, cpu_time_s=ticks / 100),
            11: HostProcess(time=now, pid=11, start_time_ticks=1, cpu_time_s=moved_cpus * t_s),
        }
        usec = {"/kubepods/a": (FILE, int(cpus * t_s * 1e6))}
        again = ran_elsewhere([(10, "/kubepods/a"), (11, "/kubepods/a")], records, last, usec, before, excess)
        found += bool(again)
        before, last = dict(usec.values()), records
    return found


@pytest.mark.parametrize(
    ("cpus", "jitter_s", "interval_s"), [(32, 0.01, 5.0), (64, 0.003, 5.0), (64, 0.01, 5.0), (8, 0.01, 1.0)]
)
def test_a_busy_cgroups_scan_skew_reads_nothing_again(cpus: float, jitter_s: float, interval_s: float) -> None:
    # The reviewer's numbers with a fixed slack alone: 32 CPUs and 10 ms of jitter re-read identities in 30 % of scans,
    # 64 CPUs and 3 ms in 20 % (and each such scan left the fast path the next).
    assert re_reads(cpus, jitter_s, interval_s) == 0


@pytest.mark.parametrize(("cpus", "moved_cpus"), [(32, 1.0), (4, 0.06), (0.5, 0.06)])
def test_a_moved_process_is_still_found_in_a_busy_cgroup(cpus: float, moved_cpus: float) -> None:
    # What the check is for: a process listed in the cgroup that runs elsewhere; found within a few scans at most.
    assert re_reads(cpus, 0.003, 5.0, scans=40, moved_cpus=moved_cpus) >= 1
