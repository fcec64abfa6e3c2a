"""rev8 review: a process's first tick after the wall clock stepped (NTP).

A process first listed counts all its CPU time where it started since the last listing. That was told on the
wall clock: its start (procfs: now − /proc/uptime + its start ticks, read on the clock of now) against the last
listing's wall time (read on the clock before the step). Stepped back 60 s, every process that started in the
tick read as started a minute before the last listing, and its CPU time up to its first listing went to the
others (below: 3 s of a 4 s tick, 37.5 J of 50 J, billed to the other process); stepped forward an hour, a
process first listed that had started before the last listing (one that listing missed) read as new and was
billed its whole past CPU time at once. A process's age (now − its start, both on one clock) against the time
since the last listing on the monotonic clock tells it through any step."""

from __future__ import annotations

from dataclasses import replace

from tests.processors.test_cpu_attribution import Node, processor, step, totals


def _node() -> Node:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(100, comm="old")
    return node


def test_a_process_started_in_the_tick_the_wall_clock_stepped_back_counts_its_first_tick() -> None:
    node = _node()
    proc = processor()
    step(proc, node)
    node.clock._offset_s -= 60.0  # the wall clock steps back a minute; the monotonic one runs on
    node.spawn(200, comm="new")  # started 5 s after the last listing, by the monotonic clock
    node.half_busy("intel-rapl:0", 100_000)
    node.run(100, 1.0)
    node.run(200, 3.0)
    out = step(proc, node)
    shares = {key: t.energy_mj for (key, _), t in totals(out, "process").items()}
    assert shares == {"100": 12_500, "200": 37_500}  # was {"100": 50_000}: 200's 3 s went to 100


def test_a_process_a_listing_missed_is_not_billed_its_past_after_the_clock_stepped_forward() -> None:
    node = _node()
    node.spawn(300, cpu_s=500.0, comm="missed")  # started now, 500 s of CPU time already (a hand-made record)
    missed = node.procs.pop(300)  # the first listing does not have it
    proc = processor()
    node.clock.advance(100.0)
    step(proc, node)
    node.clock._offset_s += 3600.0  # the wall clock steps forward an hour
    now = node.clock.now()
    node.procs[300] = replace(missed, time=now, start_wall_s=now.wall_s - 105.0)  # procfs: now − its age
    node.half_busy("intel-rapl:0", 100_000)
    node.run(100, 5.0)
    out = step(proc, node)
    shares = {key: t.energy_mj for (key, _), t in totals(out, "process").items()}
    assert shares == {"100": 50_000}  # was {"100": 495, "300": 49_505}: its 500 s before this tick billed
