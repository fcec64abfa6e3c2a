"""rev3 review: a process's exec (another comm in its listing) in a tick that splits none of its zone's energy."""

from __future__ import annotations

from dataclasses import replace

from tests.processors.test_cpu_attribution import Node, processor, step, totals


def test_an_exec_in_a_tick_whose_zone_is_a_gap_does_not_end_the_container_it_stays_in() -> None:
    # runc:[2:INIT] exec's the container's entrypoint: the same (pid, start time), another comm, the same
    # container. The tick it is seen in, the zone is back from a missed tick (a gap: nothing split), so the
    # process has no share; its container still has it, running, and must not be told terminated. (A gap
    # shorter than ten minutes is split by the CPU time over it since the gap review; this one is longer.)
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(70, comm="runc:[2:INIT]", container_id="c7")
    proc = processor()
    step(proc, node)
    node.half_busy("intel-rapl:0", 10_000)
    node.run(70, 1.0)
    out = step(proc, node)
    assert totals(out, "container")[("c7", "cpu:package")].state == "running"
    saved = node.zones.pop("intel-rapl:0")  # the zone misses a tick
    node.run(70, 1.0)
    step(proc, node)
    node.clock.advance(11 * 60)  # past GAP_MAX_S: its active energy stays unattributed
    node.zones["intel-rapl:0"] = saved
    node.half_busy("intel-rapl:0", 10_000)
    node.procs[70] = replace(node.procs[70], comm="python3")
    node.run(70, 1.0)
    out = step(proc, node)
    assert next(p for p in out.device_power if p.device_id == "intel-rapl:0").unattributable == "gap"
    assert totals(out, "container")[("c7", "cpu:package")].state == "running"
    node.half_busy("intel-rapl:0", 10_000)
    node.run(70, 1.0)
    out = step(proc, node)
    container = totals(out, "container")[("c7", "cpu:package")]
    assert (container.state, container.energy_mj) == ("running", 10_000)
