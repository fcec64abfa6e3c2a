"""rev8 review: a RAPL zone gone for good (an intel-rapl-mmio twin replaced by its MSR zone, a socket's CPUs
offlined) kept a zone gap open for the rest of the run, and ``unseen: containers`` counts no unseen time while a
gap is open (a gap is split by its processes' summed deltas, without it). Past 10 minutes a gap sums nothing
(its zone's active energy is unattributed if it ever returns), yet every other zone's unseen time stayed
uncounted: the build container below fell from 4,000 to 1,600 mJ a tick (its compilers' 3 s a tick billed to
the other tenant) for as long as wattpipe ran."""

from __future__ import annotations

from tests.processors.test_cpu_attribution import processor, step
from tests.processors.test_cpu_attribution_unseen import build_node, build_tick, energy


def test_a_zone_gone_for_good_stops_holding_back_unseen_time_once_its_gap_is_past_ten_minutes() -> None:
    node = build_node()  # ci: make 1 s + 3 s unseen a tick, nginx 4 s: 8,000 mJ active a tick
    node.zones["intel-rapl:1"] = ("package", 1, 0, 0)
    proc = processor(unseen="containers")
    step(proc, node)
    build_tick(node)
    out = step(proc, node)
    assert energy(out, "container", "ci") == 4_000
    del node.zones["intel-rapl:1"]
    for _ in range(125):  # 625 s: the gap is past its 10 minutes
        build_tick(node)
        out = step(proc, node)
    before = (energy(out, "container", "ci"), energy(out, "container", "nginx"))
    for _ in range(10):
        build_tick(node)
        out = step(proc, node)
    ci = energy(out, "container", "ci") - before[0]
    nginx = energy(out, "container", "nginx") - before[1]
    assert (ci, nginx) == (40_000, 40_000)  # was (16,000, 64,000)
    (power,) = out.device_power
    assert (power.device_id, power.unattributable) == ("intel-rapl:0", None)


def test_while_the_gap_is_within_ten_minutes_unseen_time_still_waits() -> None:
    node = build_node()
    node.zones["intel-rapl:1"] = ("package", 1, 0, 0)
    proc = processor(unseen="containers")
    step(proc, node)
    del node.zones["intel-rapl:1"]
    for _ in range(10):
        build_tick(node)
        out = step(proc, node)
    assert energy(out, "container", "ci") == 10 * 1_600  # a gap sums processes' deltas only: as before
