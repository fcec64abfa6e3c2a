"""Processes listed in a cgroup they have left: a cgroup whose usage grew less than its listed processes ran.

procfs reads a process's cgroup once per (pid, start time), again after an exec. A process moved to another cgroup
without an exec (``echo $pid > cgroup.procs``, a runtime's start) stays listed in the one it left, while its time
grows the usage of the one it is in: with ``cpu_attribution``'s ``unseen: containers`` that time would be weighed
twice, as the process's own and as the unseen time of its new container. The check: per ``cpu.stat`` file read
(a cgroup's, or a threaded subtree's domain's), the CPU time its listed processes ran since the last scan beyond
its usage's growth. Beyond is normal a little: /proc's times are whole 10 ms ticks (utime and stime each: up to
two per process, given back later), and a process's stat is read after its cgroup's usage in a scan, so that some of its time is ahead of
the usage until the next scan. So the excess is summed over scans (never below 0: what a scan gives back cancels
what an earlier one ran ahead by) and only past a bound (``SLACK_S`` and 20 ms a process that ran) are the cgroup's
processes that ran taken as perhaps moved: their identities are read again at the next scan, which finds the one
that moved where it is now. Made only where container usage is (``unseen: containers``), from what the scan read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from wattpipe.pipeline.records import HostProcess

__all__ = ["GROWTH_SHARE", "SLACK_S", "ran_elsewhere"]

# How far ahead of their cgroup's usage a cgroup's listed processes may run, summed over scans, before they are read
# again: the skew of a scan (its stat reads after its cpu.stat reads: a few ms per busy thread) with room to spare.
SLACK_S = 0.25
# … and a share of what the cgroup ran in the scan: how far a stat read later in the scan runs ahead is the cgroup's
# CPU rate × the scan's timing jitter (32 busy CPUs and 10 ms: 0.3 s either way), a fixed slack alone re-read
# identities in a third of a busy cgroup's scans. A process that moved still adds its whole time every scan.
GROWTH_SHARE = 0.05
_TICK_S = 0.01  # USER_HZ 100: /proc's CPU times are whole 10 ms ticks (utime and stime each: two per process)


def ran_elsewhere(
    listed: Iterable[tuple[int, str]],
    records: Mapping[int, HostProcess],
    last: Mapping[int, HostProcess],
    usec: Mapping[str, tuple[str, int]],
    before: Mapping[str, int],
    excess: dict[str, float],
) -> set[int]:
    """The pids to read again: those that ran in a cgroup whose usage fell behind them past the bound. ``listed``:
    (pid, cgroup path) as the last scan read them; ``records``/``last``: this scan's and the last scan's records;
    ``usec``: this scan's readings (path → the file read, its ``usage_usec``); ``before``: the last scan's, by file;
    ``excess``: the running excess by file (updated here; files not read now are dropped)."""
    ran: dict[str, list[int]] = {}
    ran_s: dict[str, float] = {}
    for pid, path in listed:
        reading = usec.get(path)
        now, was = records.get(pid), last.get(pid)
        if reading is None or now is None or was is None or now is was:
            continue
        if now.start_time_ticks != was.start_time_ticks:
            continue  # the pid names another process now: no time run in the old one's cgroup
        delta_s = (now.cpu_time_s or 0.0) - (was.cpu_time_s or 0.0)
        if delta_s > 0:
            ran.setdefault(reading[0], []).append(pid)
            ran_s[reading[0]] = ran_s.get(reading[0], 0.0) + delta_s
    growth_s: dict[str, float] = {}
    for file, usage in usec.values():
        was_usec = before.get(file)
        if was_usec is not None and usage >= was_usec:  # (lower: a cgroup made again under its path, a baseline)
            growth_s[file] = (usage - was_usec) / 1e6
    again: set[int] = set()
    for file in list(excess.keys() - growth_s.keys()):
        del excess[file]
    for file, grew_s in growth_s.items():
        running = max(0.0, excess.get(file, 0.0) + ran_s.get(file, 0.0) - grew_s)
        if running > SLACK_S + 2 * _TICK_S * len(ran.get(file, ())) + GROWTH_SHARE * grew_s:
            again.update(ran.get(file, ()))  # (none ran: an excess under the last scan's bound, past this one's)
            running = 0.0
        excess[file] = running
    return again
