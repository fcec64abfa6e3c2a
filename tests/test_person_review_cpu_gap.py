"""A RAPL zone that misses ticks and comes back: its energy over the gap was split by the last tick only.

Found in a review, running ``wattpipe run`` on the development VM's real /proc with a hand-made powercap tree
whose zone directory was moved away for ~5 s and back while its counter kept counting (as a hardware counter
does while a /sys mount or a read flaps): the first tick after it carried all ~8 s of energy (kepler_node_cpu
joules 190 → 580 in one tick) and cpu_attribution split it with that one tick's usage ratio and that one
tick's CPU-time deltas: a process that ran during the gap and not in the last tick got none of the gap's
energy. The rev-zones review made such a tick a gap (active part unattributed, ``unattributable="gap"``);
since processors/_cpu_gap.py the processor keeps, while a zone is missing, the node's CPU time and each
process's CPU-time deltas since the zone's last reading (processes that end meanwhile included), and splits
the gap's energy by them (docs/attribution.md, "CPU energy"). Was a strict xfail; passes now.
"""

from __future__ import annotations

import pytest

from tests.processors.test_cpu_attribution import Node, processor, step, totals
from wattpipe.pipeline.batch import Batch
from wattpipe.processors.cpu_attribution import CpuAttributionProcessor


def _step_without_rapl(proc: CpuAttributionProcessor, node: Node) -> Batch:
    """A tick in which the rapl receiver read no zone: ``cpu_zones`` absent, as the receiver leaves it."""
    batch = node.batch().replace(cpu_zones=())
    out = proc.process(batch.replace(present=batch.present - {"cpu_zones"}))  # (replace marks what it names present)
    node.clock.advance(5.0)
    return out


def test_energy_over_a_zone_gap_goes_to_who_used_the_cpu_during_the_gap() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 5_000_000, 0)})
    node.spawn(10)  # busy while the zone is gone
    node.spawn(20)  # busy only in the tick the zone comes back
    proc = processor()
    step(proc, node)  # baseline: the zone's first reading
    node.half_busy("intel-rapl:0", 20_000)  # one ordinary tick (both asleep: its energy unattributed)
    step(proc, node)

    # Two ticks with the zone gone (its counter runs on: 20 J a tick), process 10 busy, 20 asleep.
    for _ in range(2):
        node.spend("intel-rapl:0", 20_000)
        node.run(10, 5.0)
        node.total_s += 10.0
        node.active_s += 5.0
        _step_without_rapl(proc, node)

    # The zone is back: one more tick of 20 J, now process 20 busy and 10 asleep.
    node.spend("intel-rapl:0", 20_000)
    node.run(20, 5.0)
    node.total_s += 10.0
    node.active_s += 5.0
    out = step(proc, node)
    (power,) = out.device_power
    assert power.energy_mj == 60_000  # the gap's energy is counted (the receiver kept the counter): right

    by_pid = {key: t.energy_mj for (key, _), t in totals(out, "process").items()}
    assert power.unattributable is None  # split: by the CPU time used over the gap
    # Over the 15 s the delta covers, process 10 used 10 CPU-s and process 20 5: 2/3 and 1/3 of the active energy.
    active = power.active_energy_mj
    assert by_pid.get("10", 0) == pytest.approx(active * 2 / 3, rel=0.01)
    assert by_pid.get("20", 0) == pytest.approx(active / 3, rel=0.01)
