"""A tick whose /proc listing failed: each read zone's active energy is held for the next listing, whose CPU-time
deltas span the failed ticks too, and split with that tick's (processors/_cpu_hold.py). In any order of failed
listings, zone gaps, counter resets and unseen container time: per zone per tick ``idle + active == energy``, the
zone's totals ``energy == idle + attributed + unattributed``, what is measured is in the totals or held, no total
goes down; and where nothing else goes wrong, every process (and container) gets exactly its CPU time's energy."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.processors.test_cpu_attribution import Node, processor, restarted, step, totals
from tests.processors.test_cpu_attribution_unseen import CgroupNode
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.catalog import FAMILIES, labelled_values
from wattpipe.pipeline.state import StateStore
from wattpipe.processors._cpu_gap import GAP_MAX_S
from wattpipe.processors.cpu_attribution import CpuAttributionProcessor

PACKAGE, DRAM = "intel-rapl:0", "intel-rapl:0:0"


def _node() -> CgroupNode:
    """pid 1 in container c1 (with processes never listed: its unseen time), pid 2 in c2; both started long ago."""
    node = CgroupNode(zones={PACKAGE: ("package", 0, 0, 0), DRAM: ("dram", 0, 0, 0)})
    node.spawn(1, comm="a", container_id="c1", pod_uid="p1")
    node.spawn(2, comm="b", container_id="c2", pod_uid="p2")
    node.cgroups = {"c1": ("p1", 10.0), "c2": ("p2", 10.0)}
    return node


def _tick(node: CgroupNode, a_s: int, b_s: int, hidden_s: int) -> None:
    """2,000 mJ on the package (200 on dram) per CPU-second at usage ratio 0.5: 1,000 (100) active per second."""
    seconds = a_s + b_s + hidden_s
    node.spend(PACKAGE, 2_000 * seconds)
    node.spend(DRAM, 200 * seconds)
    node.total_s += 10.0
    node.active_s += 5.0
    node.run(1, a_s)
    node.run(2, b_s)
    node.use("c1", a_s + hidden_s)
    node.use("c2", b_s)


def _drive(node: CgroupNode, proc: CpuAttributionProcessor, tick: dict[str, Any]) -> Batch:
    """One tick with its faults: the listing failed, the dram zone not read, the package counter reset."""
    _tick(node, tick["a"], tick["b"], tick["hidden"])
    if tick["reset"]:
        zone, socket, uj, epoch = node.zones[PACKAGE]
        node.zones[PACKAGE] = (zone, socket, uj % 7_000_000, epoch + 1)  # (a wrap is added back by the receiver)
    node.listed = tick["listed"]
    dram = node.zones.pop(DRAM) if tick["absent"] else None
    batch = node.batch()
    if not tick["stat"]:  # /proc/stat not read (procfs timed out, where the listing failed too)
        batch = batch.replace(node_cpu=(), present=batch.present - {"node_cpu"})
    out = proc.process(batch)
    node.clock.advance(5.0)
    if dram is not None:
        node.zones[DRAM] = dram
    return out


TICK = st.fixed_dictionaries(
    {
        "listed": st.booleans(),
        "stat": st.sampled_from([True, True, True, False]),
        "absent": st.sampled_from([False, False, False, True]),
        "reset": st.sampled_from([False, False, False, False, True]),
        "a": st.integers(0, 4),
        "b": st.integers(0, 4),
        "hidden": st.sampled_from([0, 0, 1, 3]),
    }
)


def _t(
    listed: bool = True,
    a: int = 1,
    b: int = 1,
    hidden: int = 0,
    absent: bool = False,
    reset: bool = False,
    stat: bool = True,
) -> Any:
    return {"listed": listed, "stat": stat, "absent": absent, "reset": reset, "a": a, "b": b, "hidden": hidden}


@settings(max_examples=120, deadline=None)
@given(st.lists(TICK, min_size=1, max_size=11), st.sampled_from(["none", "containers"]))
@example([_t(), _t(False, a=5, b=0), _t(a=0, b=5)], "none")  # rev8's case: 30 J each, nothing unattributed
@example([_t(False), _t(False, a=2), _t(), _t(False, a=3), _t(a=2)], "none")  # failed before any listing
@example([_t(), _t(False, a=4), _t(False, b=4), _t(a=0, b=1)], "none")  # twice in a row
@example([_t(), _t(False, a=4, hidden=3), _t(False, b=4, hidden=1), _t(hidden=3)], "containers")
@example([_t(), _t(False, a=4, hidden=3), _t(b=2, hidden=1)], "none")  # hidden time, unseen none: generic only
@example([_t(), _t(False, a=4, reset=True), _t(a=0, b=3)], "containers")  # a reset in the held tick
@example([_t(), _t(False, a=4), _t(b=3, reset=True), _t()], "none")  # a reset in the releasing tick
@example([_t(), _t(False, a=4, absent=True), _t(b=3), _t()], "containers")  # dram unread in the failed tick
@example([_t(), _t(False, a=4), _t(b=3, absent=True), _t(a=2)], "none")  # dram unread after it: held over a gap
@example([_t(), _t(False, a=4, stat=False), _t(b=3)], "containers")  # procfs timed out: /proc/stat absent too
@example([_t(), _t(False, a=4, stat=False), _t(False, b=3), _t(a=0, b=1)], "none")  # its whole split by the next
@example([_t(), _t(False, a=4, stat=False), _t(b=3, stat=False), _t()], "none")  # listed without /proc/stat
def test_any_order_of_failed_listings_conserves_and_splits_each_tick_by_its_cpu_time(
    ticks: list[dict[str, Any]], unseen: str
) -> None:
    node = _node()
    proc = processor(unseen=unseen, terminated_retention=1e9)
    measured = {PACKAGE: 0, DRAM: 0}
    held = {PACKAGE: 0, DRAM: 0}
    last: dict[tuple[str, str, str], int] = {}
    cpu_s, unseen_s = {"1": 0, "2": 0}, 0  # what each used since the first listing (the truth, at 1,000 mJ/s)
    listed_yet = False  # (the first tick is the zones' baseline; the first listing, the processes' and containers')
    out = Batch(time=node.clock.now(), interval_s=5.0, node="n")
    for tick in ticks:
        out = _drive(node, proc, tick)
        if listed_yet:
            cpu_s["1"] += tick["a"]
            cpu_s["2"] += tick["b"]
            unseen_s += tick["hidden"]
        listed_yet = listed_yet or tick["listed"]
        for power in out.device_power:
            change = power.held_energy_mj - held[power.device_id]
            assert power.idle_energy_mj + power.active_energy_mj + change == power.energy_mj
            assert power.held_energy_mj == 0 or power.unattributable == "processes_unknown"
            measured[power.device_id] += power.energy_mj
            held[power.device_id] = power.held_energy_mj
        for zone in out.device_totals:
            assert zone.idle_energy_mj + zone.attributed_energy_mj + zone.unattributed_energy_mj == zone.energy_mj
            assert zone.energy_mj + held[zone.device_id] == measured[zone.device_id]  # nothing lost
        for t in (*out.totals, *out.device_totals):
            key = (getattr(t, "scope", "zone"), getattr(t, "key", ""), t.device_id)
            assert t.energy_mj >= last.get(key, 0)
            last[key] = t.energy_mj
    package = {z.device_id: z for z in out.device_totals}.get(PACKAGE)
    processes = {key: t.energy_mj for (key, zone), t in totals(out, "process").items() if zone == "cpu:package"}
    if unseen == "none" and package is not None:
        assert sum(processes.values()) == package.attributed_energy_mj
    clean = not any(t["reset"] or t["absent"] or (t["listed"] and not t["stat"]) for t in ticks)
    clean = clean and (unseen == "containers" or unseen_s == 0)
    if clean and ticks[-1]["listed"]:  # nothing but failed listings: each process its CPU time's energy exactly
        assert processes.get("1", 0) == 1_000 * cpu_s["1"]
        assert processes.get("2", 0) == 1_000 * cpu_s["2"]
        assert held[PACKAGE] == 0
        if package is not None and ticks[0]["listed"]:  # (energy before any listing is nobody's)
            assert package.unattributed_energy_mj == 0
        if unseen == "containers":
            c1 = totals(out, "container").get(("c1", "cpu:package"))
            assert (c1.energy_mj if c1 else 0) == 1_000 * (cpu_s["1"] + unseen_s)


def _shares(out: Batch) -> dict[str, int]:
    return {key: t.energy_mj for (key, zone), t in totals(out, "process").items() if zone == "cpu:package"}


def _two() -> tuple[Node, CpuAttributionProcessor]:
    node = Node(zones={PACKAGE: ("package", 0, 0, 0)})
    node.spawn(1, comm="a")
    node.spawn(2, comm="b")
    proc = processor()
    step(proc, node)
    return node, proc


def test_two_failed_listings_in_a_row_are_held_and_split_with_the_next_listings_deltas() -> None:
    node, proc = _two()
    node.listed = False
    for pid in (1, 2):  # A 5 s in the first failed tick, B 5 s in the second: 50 J active each
        node.half_busy(PACKAGE, 100_000)
        node.run(pid, 5.0)
        (power,) = step(proc, node).device_power
    # idle settled as measured (50 J each tick), the active held
    assert (power.idle_energy_mj, power.active_energy_mj, power.held_energy_mj) == (50_000, 0, 100_000)
    assert power.unattributable == "processes_unknown"
    node.listed = True
    node.half_busy(PACKAGE, 20_000)  # 10 J active, 5 s each
    node.run(1, 5.0)
    node.run(2, 5.0)
    out = step(proc, node)
    (power,) = out.device_power
    assert (power.idle_energy_mj, power.active_energy_mj, power.held_energy_mj) == (10_000, 110_000, 0)
    assert power.unattributable is None
    assert _shares(out) == {"1": 55_000, "2": 55_000}  # 110 J by 10 s each
    (zone,) = out.device_totals
    assert (zone.energy_mj, zone.attributed_energy_mj, zone.unattributed_energy_mj) == (220_000, 110_000, 0)
    # the watts are over the 15 s the split spans: 55 J / 15 s
    assert totals(out, "process")[("1", "cpu:package")].power_w == pytest.approx(55.0 / 15.0)


def test_a_failed_listing_before_any_listing_holds_nothing() -> None:
    node = Node(zones={PACKAGE: ("package", 0, 0, 0)})
    node.spawn(1, comm="a")
    node.listed = False
    proc = processor()
    step(proc, node)  # baselines
    node.half_busy(PACKAGE, 100_000)
    node.run(1, 5.0)
    (power,) = step(proc, node).device_power
    assert (power.held_energy_mj, proc.zone_totals[PACKAGE].unattributed_mj) == (0, 50_000)  # no readings to span


def test_a_listing_failing_past_the_bound_releases_its_held_energy_unattributed() -> None:
    node, proc = _two()
    node.listed = False
    ticks = int(GAP_MAX_S / 5.0)
    for _ in range(ticks):  # held for the 600 s the bound allows
        node.half_busy(PACKAGE, 2_000)
        (power,) = step(proc, node).device_power
    assert (power.held_energy_mj, proc.zone_totals[PACKAGE].unattributed_mj) == (ticks * 1_000, 0)
    node.half_busy(PACKAGE, 2_000)
    (power,) = step(proc, node).device_power  # 605 s since the last listing: released, with its own
    assert (power.held_energy_mj, proc.zone_totals[PACKAGE].unattributed_mj) == (0, (ticks + 1) * 1_000)
    node.half_busy(PACKAGE, 2_000)
    (power,) = step(proc, node).device_power
    assert (power.held_energy_mj, proc.zone_totals[PACKAGE].unattributed_mj) == (0, (ticks + 2) * 1_000)


def test_a_procfs_timeout_holds_the_whole_energy_and_splits_it_by_the_next_ratio_and_deltas() -> None:
    # procfs timed out: /proc/stat is absent too, so the tick's idle is not known either. Its whole energy is held,
    # and split by the next tick's usage ratio, which spans both (the last /proc/stat reading is kept).
    node, proc = _two()
    node.listed = False
    node.half_busy(PACKAGE, 10_000)
    node.total_s += 10.0  # the failed tick: 5 of 20 CPU-seconds busy
    node.run(1, 2.0)
    batch = node.batch()
    (power,) = proc.process(batch.replace(node_cpu=(), present=batch.present - {"node_cpu"})).device_power
    node.clock.advance(5.0)
    assert (power.idle_energy_mj, power.active_energy_mj, power.held_energy_mj, power.idle_w) == (0, 0, 10_000, None)
    node.listed = True
    node.half_busy(PACKAGE, 30_000)  # 5 of 10: over both ticks 10 of 40, ratio 0.25
    node.total_s += 10.0
    node.run(2, 6.0)
    out = step(proc, node)
    (power,) = out.device_power
    assert (power.idle_energy_mj, power.active_energy_mj, power.held_energy_mj) == (30_000, 10_000, 0)
    assert _shares(out) == {"1": 2_500, "2": 7_500}  # 10 J active over both ticks, by 2 s and 6 s
    zone = proc.zone_totals[PACKAGE]
    assert (zone.energy_mj, zone.idle_mj, zone.active_mj, zone.unattributed_mj) == (40_000, 30_000, 10_000, 0)


def test_a_listing_that_answers_without_proc_stat_is_not_held() -> None:
    # Its deltas are this tick's: the next listing's do not span it. Its energy is unattributed (idle unknown).
    node, proc = _two()
    node.half_busy(PACKAGE, 10_000)
    node.run(1, 2.0)
    batch = node.batch()
    (power,) = proc.process(batch.replace(node_cpu=(), present=batch.present - {"node_cpu"})).device_power
    assert (power.held_energy_mj, power.active_energy_mj, power.idle_w) == (0, 10_000, None)
    assert proc.zone_totals[PACKAGE].unattributed_mj == 10_000


def test_a_restart_while_energy_is_held_keeps_it_in_the_totals_as_unattributed(tmp_path: Any) -> None:
    node, proc = _two()
    node.listed = False
    node.half_busy(PACKAGE, 100_000)
    node.run(1, 5.0)
    step(proc, node)
    store = StateStore(tmp_path / "state.json", node.clock, "n")
    again = restarted(proc, store)  # the next listing is a baseline after it: nobody's deltas span the held tick
    zone = again.zone_totals[PACKAGE]
    assert (zone.energy_mj, zone.idle_mj, zone.active_mj, zone.unattributed_mj) == (100_000, 50_000, 50_000, 50_000)
    assert proc.zone_totals[PACKAGE].energy_mj == 50_000  # (the running one: its idle; the active held)


def test_a_zone_gone_for_good_with_energy_held_has_it_in_its_totals_as_unattributed() -> None:
    node, proc = _two()
    node.listed = False
    node.half_busy(PACKAGE, 100_000)
    node.run(1, 5.0)
    (power,) = step(proc, node).device_power  # 50 J idle settled, 50 J active held
    assert power.held_energy_mj == 50_000
    node.listed = True
    del node.zones[PACKAGE]  # gone (an mmio twin removed): no listing will split what it held
    ticks = int(GAP_MAX_S / 5.0)
    for _ in range(ticks):
        step(proc, node)
    zone = proc.zone_totals[PACKAGE]
    assert (zone.energy_mj, zone.unattributed_mj) == (50_000, 0)  # still held: it may come back
    step(proc, node)  # unread for over GAP_MAX_S
    assert (zone.energy_mj, zone.active_mj, zone.unattributed_mj) == (100_000, 50_000, 50_000)


def test_the_held_energy_is_exported_while_held_as_the_gpu_side_does() -> None:
    # The zone's joules total trails its counter by what a failed listing holds; the GPU side says so with
    # wattpipe_node_gpu_held_joules, the CPU zones said nothing (the total just lagged, then jumped).
    held = next(f for f in FAMILIES if f.kepler == "wattpipe_node_cpu_held_joules")
    assert held.instrument == "gauge"
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(1, comm="a")
    proc = processor()
    step(proc, node)
    node.listed = False
    node.half_busy("intel-rapl:0", 100_000)  # 50 J active, held
    node.run(1, 5.0)
    ((labels, joules, _),) = labelled_values(held, step(proc, node), "kepler")
    assert (dict(labels)["zone"], dict(labels)["path"], joules) == ("package", "intel-rapl:0", 50.0)
    node.listed = True
    node.half_busy("intel-rapl:0", 20_000)
    node.run(1, 5.0)
    ((_, joules, _),) = labelled_values(held, step(proc, node), "kepler")
    assert joules == 0.0  # released into this tick's split
