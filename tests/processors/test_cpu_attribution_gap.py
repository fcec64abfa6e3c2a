"""A RAPL zone back from ticks it missed (processors/_cpu_gap.py): its energy over the gap is split by the CPU
time each process used over the gap (also those that ended meanwhile: late shares on their kept series), its
idle/active by the node's CPU usage over the gap; a gap over 10 minutes stays unattributed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.processors.test_cpu_attribution import Node, processor, restarted, step, totals
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.cpu_attribution import CpuAttributionProcessor

ZONE = "intel-rapl:0"


def step_missing(proc: CpuAttributionProcessor, node: Node, *missing: str) -> Batch:
    """A tick in which the zones ``missing`` (default: all) were not read; their counters run on in ``node``."""
    batch = node.batch()
    zones = tuple(z for z in batch.cpu_zones if missing and z.path not in missing)
    out = proc.process(batch.replace(cpu_zones=zones))
    node.clock.advance(5.0)
    return out


def tick(node: Node, mj: int, runs: dict[int, float], active_s: float = 5.0) -> None:
    """One 5 s tick: the package spends ``mj``, each pid in ``runs`` uses its CPU-s, and ``active_s`` of the
    node's 10 CPU-s are active (default: usage ratio 0.5)."""
    node.spend(ZONE, mj)
    for pid, cpu_s in runs.items():
        node.run(pid, cpu_s)
    node.total_s += 10.0
    node.active_s += active_s


def test_a_process_that_ends_during_the_gap_gets_its_share_on_its_ended_series_and_its_groups() -> None:
    """pid 10 (in a container) runs 5 CPU-s in the gap and ends inside it; pid 30 lives only inside it (5 CPU-s);
    pid 20 runs 10. The gap's 30 J of active energy go 1:1:2. A retention of 1 s and no room for ended series:
    the ended ones are kept all the same until the zone is back (their late energy must find them)."""
    node = Node(zones={ZONE: ("package", 0, 0, 0)})
    node.spawn(10, container_id="c1", pod_uid="p1")
    node.spawn(20)
    proc = processor(terminated_retention=1.0, max_terminated=0)
    step(proc, node)
    tick(node, 20_000, {10: 2.0, 20: 2.0})
    step(proc, node)  # 10 J active: 5 J each
    node.spawn(30, vm_id="vm-3")
    tick(node, 20_000, {10: 5.0, 30: 5.0})
    step_missing(proc, node)
    del node.procs[10], node.procs[30]  # both end (the container and the VM with them)
    tick(node, 20_000, {20: 5.0})
    out = step_missing(proc, node)
    assert ("10", "cpu:package") in totals(out, "process")  # ended, kept past its retention: the gap may bill it
    tick(node, 20_000, {20: 5.0})
    out = step(proc, node)

    (power,) = out.device_power
    assert (power.energy_mj, power.active_energy_mj, power.unattributable) == (60_000, 30_000, None)
    processes = totals(out, "process")
    assert {k: (t.energy_mj, t.state) for (k, _), t in processes.items()} == {
        "10": (5_000 + 7_500, "terminated"),
        "20": (5_000 + 15_000, "running"),
        "30": (7_500, "terminated"),  # a series made for it, ended
    }
    assert (processes[("10", "cpu:package")].power_w, processes[("30", "cpu:package")].power_w) == (0.0, 0.0)
    assert processes[("20", "cpu:package")].power_w == pytest.approx(15.0 / 15.0)  # its 15 J over the 15 s gap
    assert (
        totals(out, "container")[("c1", "cpu:package")].energy_mj,
        totals(out, "container")[("c1", "cpu:package")].state,
    ) == (12_500, "terminated")
    assert totals(out, "pod")[("p1", "cpu:package")].energy_mj == 12_500
    assert (totals(out, "vm")[("vm-3", "cpu:package")].energy_mj, totals(out, "vm")[("vm-3", "cpu:package")].state) == (
        7_500,
        "terminated",
    )
    (zone,) = out.device_totals
    assert (zone.attributed_energy_mj, zone.unattributed_energy_mj) == (40_000, 0)

    tick(node, 20_000, {20: 5.0})
    out = step(proc, node)  # the gap closed: the ended series go as the retention says
    assert set(totals(out, "process")) == {("20", "cpu:package")}


@pytest.mark.parametrize(("minutes", "split"), [(9, True), (11, False)])
def test_a_gap_up_to_ten_minutes_is_split_and_a_longer_one_stays_unattributed(minutes: int, split: bool) -> None:
    """pid 10 runs through the gap at usage 0.5 and the returning tick at 1.0: the gap's idle/active is the
    node's usage over the whole gap either way; past 10 minutes the CPU time is no longer kept (bounded
    memory) and the active energy stays unattributed (``gap``), as before this was built."""
    node = Node(zones={ZONE: ("package", 0, 0, 0)})
    node.spawn(10)
    proc = processor()
    step(proc, node)
    missed = minutes * 12
    for _ in range(missed):
        tick(node, 10_000, {10: 5.0})
        step_missing(proc, node)
    assert all((gap.cpu_s is None) != split for gap in proc._gaps.open.values())
    tick(node, 10_000, {10: 10.0}, active_s=10.0)
    out = step(proc, node)
    (power,) = out.device_power
    energy = (missed + 1) * 10_000
    active = round(energy * (missed * 5.0 + 10.0) / ((missed + 1) * 10.0))
    assert (power.energy_mj, power.active_energy_mj) == (energy, active)
    assert power.unattributable == (None if split else "gap")
    process = totals(out, "process").get(("10", "cpu:package"))
    assert (process.energy_mj if process is not None else 0) == (active if split else 0)
    assert not proc._gaps.open  # the zone is back: nothing kept


def test_idle_mode_over_a_gap_the_idle_is_the_idle_power_over_the_gap_and_the_rest_is_split_by_its_cpu_time() -> None:
    """``mode: idle`` with 2 W configured: the gap's 15 s are 30 J idle, the other 30 J active, split by the
    CPU time over the gap (pid 10 ran in the two missed ticks, pid 20 in the returning one)."""
    node = Node(zones={ZONE: ("package", 0, 0, 0)})
    node.spawn(10)
    node.spawn(20)
    proc = processor(mode="idle", idle_w={"package": 2.0})
    step(proc, node)
    for _ in range(2):
        tick(node, 20_000, {10: 5.0})
        step_missing(proc, node)
    tick(node, 20_000, {20: 5.0})
    out = step(proc, node)
    (power,) = out.device_power
    assert (power.idle_energy_mj, power.active_energy_mj, power.idle_source) == (30_000, 30_000, "configured")
    assert {k: t.energy_mj for (k, _), t in totals(out, "process").items()} == {"10": 20_000, "20": 10_000}


def test_a_restart_during_a_gap_makes_the_returning_reading_a_baseline_and_totals_go_on(tmp_path: Path) -> None:
    """The gap's CPU time is not in the state file: after a restart the zone's first reading is a baseline, as
    any first reading after a restart (the energy since its last reading is nobody's, as while wattpipe is
    down); the totals go on from the state file, and the next tick is split as usual."""
    node = Node(zones={ZONE: ("package", 0, 0, 0)})
    node.spawn(60, container_id="c6")
    node.spawn(61)
    store = StateStore(tmp_path / "s.json", node.clock, "n")
    proc = processor(store)
    step(proc, node)
    tick(node, 20_000, {60: 5.0})
    step(proc, node)
    tick(node, 20_000, {61: 5.0})
    step_missing(proc, node)
    del node.procs[61]
    again = restarted(proc, store)
    tick(node, 20_000, {60: 5.0})
    step_missing(again, node)
    tick(node, 20_000, {60: 5.0})
    out = step(again, node)
    assert out.device_power == ()  # a baseline
    (zone,) = out.device_totals
    assert (zone.energy_mj, zone.attributed_energy_mj) == (20_000, 10_000)  # as before the restart
    assert totals(out, "process")[("60", "cpu:package")].energy_mj == 10_000
    tick(node, 20_000, {60: 5.0})
    out = step(again, node)
    assert totals(out, "process")[("60", "cpu:package")].energy_mj == 20_000
    assert totals(out, "container")[("c6", "cpu:package")].energy_mj == 20_000


def test_a_gap_right_after_the_zones_first_reading_is_split_by_the_cpu_time_over_it() -> None:
    """The rapl receiver read the zone once (a baseline, no energy yet), then nothing for two ticks (``cpu_zones``
    absent): the processor still keeps the CPU time used meanwhile, as for any gap, so pid 30, which ran in the
    first missed tick and ended in the second, gets its share. pid 10 ran in both, pid 20 in the returning one."""
    node = Node(zones={ZONE: ("package", 0, 0, 0)})
    node.spawn(10)
    node.spawn(20)
    node.spawn(30)
    proc = processor()
    step(proc, node)
    for runs in ({10: 5.0, 30: 5.0}, {10: 5.0}):
        tick(node, 20_000, runs, active_s=10.0)
        node.procs.pop(30, None) if 30 not in runs else None
        batch = node.batch().replace(cpu_zones=())
        proc.process(batch.replace(present=batch.present - {"cpu_zones"}))  # (replace marks what it names present)
        node.clock.advance(5.0)
    tick(node, 20_000, {20: 5.0})
    out = step(proc, node)
    (power,) = out.device_power
    assert (power.energy_mj, power.active_energy_mj) == (60_000, 50_000)  # usage 25 of 30 CPU-s
    by_pid = {k: t.energy_mj for (k, _), t in totals(out, "process").items()}
    assert by_pid == {"10": 25_000, "20": 12_500, "30": 12_500}


def test_an_exec_in_the_tick_a_zone_comes_back_from_a_gap_keeps_its_container_running_and_billed() -> None:
    """tests/test_rev3_cpu_exec.py's case (runc:[2:INIT] exec's the entrypoint: the same pid and start time,
    another comm, the same container) where the zone is back from a missed tick: that tick is split now (not a
    gap), so the process and its container have the gap's share; the container is never told terminated."""
    node = Node(zones={ZONE: ("package", 0, 0, 0)})
    node.spawn(70, comm="runc:[2:INIT]", container_id="c7")
    proc = processor()
    step(proc, node)
    node.half_busy(ZONE, 10_000)
    node.run(70, 1.0)
    step(proc, node)
    node.run(70, 1.0)
    step_missing(proc, node)
    node.half_busy(ZONE, 10_000)
    node.procs[70] = replace(node.procs[70], comm="python3")
    node.run(70, 1.0)
    out = step(proc, node)
    (power,) = out.device_power
    assert (power.unattributable, power.active_energy_mj) == (None, 5_000)  # 10 J over 10 s, usage 5 of 10 CPU-s
    container = totals(out, "container")[("c7", "cpu:package")]
    assert (container.state, container.energy_mj) == ("running", 10_000)
    assert totals(out, "process")[("70", "cpu:package")].energy_mj == 10_000
    node.half_busy(ZONE, 10_000)
    node.run(70, 1.0)
    out = step(proc, node)
    container = totals(out, "container")[("c7", "cpu:package")]
    assert (container.state, container.energy_mj) == ("running", 15_000)
