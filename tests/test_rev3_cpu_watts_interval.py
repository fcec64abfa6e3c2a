"""rev3 review: process watts per zone type when the split zones' intervals differ (a zone and the listing both
missed the same tick: not a gap, its energy split over the two ticks the deltas span)."""

from __future__ import annotations

import pytest

from tests.processors.test_cpu_attribution import Node, processor, step, totals


def test_a_zone_types_process_watts_are_over_its_own_interval() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0), "intel-rapl:0:0": ("dram", 0, 0, 0)})
    node.spawn(1)
    proc = processor()
    step(proc, node)
    node.spend("intel-rapl:0", 10_000)
    node.spend("intel-rapl:0:0", 10_000)
    node.half_busy("intel-rapl:0", 0)
    node.run(1, 1.0)
    step(proc, node)
    # tick 3: the listing fails and the dram zone is not read
    dram = node.zones.pop("intel-rapl:0:0")
    node.listed = False
    node.spend("intel-rapl:0", 10_000)
    node.half_busy("intel-rapl:0", 0)
    node.run(1, 1.0)
    step(proc, node)
    # tick 4: both back; dram's counter grew 10 J over each of the two ticks
    node.listed = True
    node.zones["intel-rapl:0:0"] = ("dram", 0, dram[2] + 20_000_000, 0)
    node.spend("intel-rapl:0", 10_000)
    node.half_busy("intel-rapl:0", 0)
    node.run(1, 1.0)
    out = step(proc, node)
    power = {p.device_id: p for p in out.device_power}
    assert power["intel-rapl:0:0"].unattributable is None  # split: the deltas span its 10 s too
    series = totals(out, "process")[("1", "cpu:dram")]
    dram_active_j = power["intel-rapl:0:0"].active_energy_mj / 1000
    assert series.power_w == pytest.approx(dram_active_j / 10.0)  # over dram's own 10 s
