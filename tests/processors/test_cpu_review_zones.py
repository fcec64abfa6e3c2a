"""Review of cpu_attribution off the happy path: a RAPL zone that misses ticks, then answers again."""

from __future__ import annotations

import pytest

from tests.processors.test_cpu_attribution import Node, processor, step, totals
from wattpipe.pipeline.batch import Batch


def _tick(node: Node, a_mj: int, b_mj: int, b_present: bool, b_uj: list[int]) -> None:
    """One 5 s tick at usage ratio 0.5: socket 1 spends ``a_mj``; socket 0's counter ``b_mj``, read or not (it
    sorts first: the tick's first record is the returning zone's)."""
    node.spend("intel-rapl:1", a_mj)
    b_uj[0] += b_mj * 1000
    if b_present:
        node.zones["intel-rapl:0"] = ("package", 0, b_uj[0], 0)
    else:
        node.zones.pop("intel-rapl:0", None)
    node.total_s += 10.0
    node.active_s += 5.0


def _gap_run() -> tuple[Batch, Node]:
    """Socket 0's zone misses three ticks while pid 1 runs; it answers again in the tick pid 2 starts in."""
    b_uj = [0]
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0), "intel-rapl:1": ("package", 1, 0, 0)})
    node.spawn(1)
    proc = processor()
    step(proc, node)
    for _ in range(3):
        _tick(node, 10_000, 10_000, False, b_uj)
        node.run(1, 5.0)
        step(proc, node)
    _tick(node, 10_000, 10_000, True, b_uj)
    node.spawn(2, cpu_s=5.0)  # started inside this tick: 5 s, and pid 1 none
    out = step(proc, node)
    return out, node


def test_a_zones_energy_over_ticks_it_missed_is_billed_by_the_cpu_time_over_them_not_the_returning_ticks() -> None:
    """Over its gap socket 0 spent 40 J (20 s at usage ratio 0.5: 20 J active) while pid 1 ran 15 CPU-s and
    pid 2 (started in the returning tick) 5: 15 J and 5 J, not all of it to pid 2 (the returning tick's only
    user). Socket 1, read every tick, is split by the tick's deltas as before."""
    out, _ = _gap_run()
    power = {p.device_id: p for p in out.device_power}
    back = power["intel-rapl:0"]
    assert back.energy_mj == 40_000  # measured: nothing lost
    assert (back.idle_energy_mj, back.active_energy_mj) == (20_000, 20_000)
    assert back.unattributable is None
    by_pid = totals(out, "process")
    assert by_pid[("2", "cpu:package")].energy_mj == 5_000 + 5_000  # socket 1's tick, and its share of the gap
    assert by_pid[("1", "cpu:package")].energy_mj == 3 * 5_000 + 15_000  # socket 1's three ticks, and the gap's
    by_zone = {t.device_id: t for t in out.device_totals}
    assert by_zone["intel-rapl:0"].unattributed_energy_mj == 0
    assert by_zone["intel-rapl:0"].attributed_energy_mj == 20_000


def test_process_watts_are_each_zones_share_over_its_own_interval_when_a_zone_returns_from_a_gap() -> None:
    """A process's watts are its shares over the intervals they span, summed: pid 2's 5 J of socket 1's 5 s
    tick (1 W) and 5 J of socket 0's 20 s gap (0.25 W); pid 1's 15 J of the gap (0.75 W), none of socket 1's."""
    out, _ = _gap_run()
    by_pid = totals(out, "process")
    assert by_pid[("2", "cpu:package")].power_w == pytest.approx(1.25)
    assert by_pid[("1", "cpu:package")].power_w == pytest.approx(0.75)


def test_idle_mode_a_zone_gone_for_good_stops_taking_its_types_share_of_idle_w() -> None:
    """The mmio window of package 0 read while intel_rapl_msr was not loaded, then replaced by the MSR zone
    (the receiver drops the twin): idle_w's package share must not stay split with a zone never read again,
    else the one package that remains is billed half the idle power as its processes' active energy, forever."""
    node = Node(zones={"intel-rapl-mmio:0": ("package", 0, 0, 0)})
    node.spawn(40)
    proc = processor(mode="idle", idle_w={"package": 40.0})
    step(proc, node)
    del node.zones["intel-rapl-mmio:0"]
    node.zones["intel-rapl:0"] = ("package", 0, 0, 0)
    power = None
    for _ in range(12 * 11):  # 11 minutes of 5 s ticks at 50 W
        node.spend("intel-rapl:0", 250_000)
        node.total_s += 10.0
        node.active_s += 1.0
        node.run(40, 1.0)
        out = step(proc, node)
        (power,) = out.device_power or (None,)
    assert power is not None
    assert (power.idle_energy_mj, power.active_energy_mj) == (200_000, 50_000)  # all of idle_w's 40 W
