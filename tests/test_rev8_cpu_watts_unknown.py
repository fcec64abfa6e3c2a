"""rev8 review: consumer watts in a tick whose zone was read but its active energy went to nobody.

A tick whose process listing failed, or whose /proc/stat could not be read (``processes_unknown``): the zone's
active energy is unattributed, so what each process drew that tick is not known. The process, container and pod
series kept the watts of the tick before (10 W, beside 0 J billed that tick), where the GPU side (the energy
processor) says ``None``, and the CPU side itself says ``None`` for a zone that did not answer."""

from __future__ import annotations

from tests.processors.test_cpu_attribution import Node, processor, step, totals
from wattpipe.processors.cpu_attribution import CpuAttributionProcessor


def _busy_node() -> tuple[Node, CpuAttributionProcessor]:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(100, comm="worker", container_id="c1", pod_uid="p1")
    node.spawn(101, comm="done", container_id="c2")
    proc = processor()
    step(proc, node)
    node.half_busy("intel-rapl:0", 100_000)
    node.run(100, 4.0)
    node.run(101, 1.0)
    out = step(proc, node)
    assert totals(out, "process")[("100", "cpu:package")].power_w == 8.0  # 50 J active × 4/5 over 5 s
    del node.procs[101]  # it exits: its series ends at 0 W, known
    node.half_busy("intel-rapl:0", 100_000)
    node.run(100, 5.0)
    out = step(proc, node)
    assert totals(out, "process")[("100", "cpu:package")].power_w == 10.0
    assert totals(out, "process")[("101", "cpu:package")].state == "terminated"
    return node, proc


def test_a_tick_whose_listing_failed_gives_process_container_and_pod_watts_as_unknown() -> None:
    node, proc = _busy_node()
    node.listed = False
    node.half_busy("intel-rapl:0", 100_000)
    out = step(proc, node)
    (power,) = out.device_power
    assert (power.unattributable, power.held_energy_mj) == ("processes_unknown", 50_000)  # (processors/_cpu_hold.py)
    process = totals(out, "process")[("100", "cpu:package")]
    assert (process.energy_mj, process.power_w) == (90_000, None)  # was 10.0 W: the tick before's
    assert totals(out, "container")[("c1", "cpu:package")].power_w is None
    assert totals(out, "pod")[("p1", "cpu:package")].power_w is None
    ended = totals(out, "process")[("101", "cpu:package")]
    assert (ended.state, ended.power_w) == ("terminated", 0.0)  # an ended process drew nothing: that is known


def test_a_tick_without_proc_stat_gives_process_watts_as_unknown() -> None:
    node, proc = _busy_node()
    node.half_busy("intel-rapl:0", 100_000)
    node.run(100, 5.0)
    batch = node.batch()
    out = proc.process(batch.replace(node_cpu=(), present=batch.present - {"node_cpu"}))
    (power,) = out.device_power
    assert (power.unattributable, power.idle_w) == ("processes_unknown", None)
    assert totals(out, "process")[("100", "cpu:package")].power_w is None  # was 10.0 W
    assert totals(out, "container")[("c1", "cpu:package")].power_w is None
