"""Review of failsplit9 (a failed /proc listing's energy held, processors/_cpu_hold.py) and unlisted9 (unseen:
containers finds a container none of whose processes is listed below its pod): the cases found still wrong."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from tests.e2e.test_cpu_listing_fault_report import SCENARIO, by, simulate
from tests.e2e.test_cpu_unseen_faults import (
    BUILD,
    SHORT,
    WEB,
    _close_receivers,  # noqa: F401 (the fixture: the receivers' files closed after each test)
    _failing,
    busy_tick,
    since,
    two_tenants,
    unattributed_mj,
    warm,
)
from tests.processors.test_cpu_attribution import processor, totals
from tests.processors.test_cpu_attribution_failed_listing import DRAM, PACKAGE, _drive, _node, _t


def test_a_zone_missing_in_a_failed_listings_tick_does_not_leave_the_other_zones_unattributed() -> None:
    # Found with the simulator (cpu.yaml, /proc gone 40-52 s, intel-rapl:0:0 gone 43-60 s): each package zone had
    # 410.6 J unattributed. The dram zone's gap opens keyed by the tick it was last read in, the same tick the
    # package was last read in, so the package's part took the gap's path and was not held (`read` was `gap is
    # None`): its failed tick's active energy went unattributed instead of to the next listing's split.
    node, proc = _node(), processor()
    _drive(node, proc, _t())  # the baselines
    held = _drive(node, proc, _t(False, a=4, b=1, absent=True))  # 10 J on the package, 5 J active: held
    (package,) = [p for p in held.device_power if p.device_id == PACKAGE]
    assert (package.idle_energy_mj, package.active_energy_mj, package.held_energy_mj) == (
        5_000,
        0,
        5_000,
    )  # was 5,000 active, 0 held
    out = _drive(node, proc, _t(a=1, b=3))  # 8 J, 4 J active, with the held 5 J: 9 J by 5 s and 4 s
    zones = {z.device_id: z for z in out.device_totals}
    assert zones[PACKAGE].unattributed_energy_mj == 0
    shares = {key: t.energy_mj for (key, zone), t in totals(out, "process").items() if zone == "cpu:package"}
    assert shares == {"1": 5_000, "2": 4_000}


def test_cpu_yaml_with_proc_gone_while_a_dram_zone_is_gone_bills_as_a_run_without_the_proc_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # End to end: the same run with the dram zone's gap alone is the reference (nothing unattributed, a gap under
    # 10 minutes is split). At e4aba98 each package zone had 410.6 J and the other dram 46.1 J unattributed.
    monkeypatch.setenv("WATTPIPE_CPU_MODE", "usage_ratio")
    gap = '  - {at_s: 43, for_s: 17, target: rapl, zone: "intel-rapl:0:0"}\n'
    plain, faulty = tmp_path / "gap.yaml", tmp_path / "gap-no-proc.yaml"
    plain.write_text(SCENARIO.read_text() + "faults:\n" + gap)
    faulty.write_text(SCENARIO.read_text() + "faults:\n" + gap + "  - {at_s: 40, for_s: 12, target: procfs}\n")
    failed, reference = simulate(tmp_path, faulty, "failed"), simulate(tmp_path, plain, "plain")
    zones = by(failed["zones"], "path")
    assert {path: zone["unattributed_j"] for path, zone in zones.items()} == dict.fromkeys(zones, 0.0)
    for path, zone in zones.items():
        assert abs(zone["residual_j"]) <= 1e-6, zone
        assert zone["active_j"] == pytest.approx(by(reference["zones"], "path")[path]["active_j"], rel=1e-3)
    processes, plain_processes = by(failed["processes"], "pid"), by(reference["processes"], "pid")
    for pid in (900, 950, 2101, 2102, 2201, 3001, 7001):  # alive across the failed ticks
        assert processes[pid]["attributed_j"] == pytest.approx(plain_processes[pid]["attributed_j"], rel=5e-3)


@pytest.mark.parametrize("made_at", [0, 2, 3])  # (the failed listing is the third of 7 ticks)
def test_a_never_listed_container_across_a_failed_listing_is_billed_its_time(tmp_path: Path, made_at: int) -> None:
    # unlisted9 with failsplit9: a container in the pod none of whose processes is ever listed (2 s a tick), made
    # before, in, or just after the tick whose /proc listing fails. Its time is held with the rest and split with
    # the next listing's, its first record counted from 0 where its cgroup was made since the last look.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    for i in range(7):
        busy_tick(host)
        if i >= made_at:
            host.hidden(SHORT, 2.0)
        with pytest.MonkeyPatch.context() as patch:
            if i == 2:
                patch.setattr(os, "listdir", functools.partial(_failing, proc=host.proc, real=os.listdir))
            out = host.tick(proc)
    short_mj = 2_000 * (7 - made_at)
    assert since(host, out, start) == {BUILD: (28_000, 28_000), WEB: (28_000, 28_000), SHORT: (short_mj, short_mj)}
    assert unattributed_mj(out) == 0


def test_held_energy_released_the_tick_another_zones_gap_opens_goes_to_the_cpu_time_it_spans() -> None:
    # The releasing tick's package part takes the path of the dram's gap opening that tick (keyed by the same last
    # read tick): its deltas are the listing's, which span the held tick, so each process gets its CPU time's.
    node, proc = _node(), processor()
    _drive(node, proc, _t())  # the baselines
    _drive(node, proc, _t(False, a=4, b=1))  # 10 J, 5 J active held
    _drive(node, proc, _t(a=0, b=3, absent=True))  # 6 J, 3 J active with the held 5 J: 8 J by 4 s and 4 s
    out = _drive(node, proc, _t(a=2, b=0))  # dram back: 4 J, 2 J active
    zones = {z.device_id: z for z in out.device_totals}
    assert zones[PACKAGE].unattributed_energy_mj == 0
    shares = {key: t.energy_mj for (key, zone), t in totals(out, "process").items() if zone == "cpu:package"}
    assert shares == {"1": 6_000, "2": 4_000}


@pytest.mark.xfail(
    strict=True,
    reason="a fix needs the held energy released in the reset's tick, by its listing's deltas, with no record "
    "saying 0 W for a tick whose delta is not energy (DevicePower.power_w is a float: unknown cannot be said); or "
    "the listing's deltas kept for the held energy until the zone splits again",
)
def test_energy_held_over_a_failed_listing_is_not_split_by_later_ticks_cpu_time_after_a_counter_reset() -> None:
    # The package counter resets in the tick the listing answers again: that tick's delta is not energy, and its
    # part was skipped, so what the zone held stayed held while the listing's deltas (which span the held tick)
    # were used up; the next listing split it by its own deltas, ticks later: pid 1's 4 s of the held tick went to
    # pid 2 (pid 1 0 mJ, pid 2 8,000 of 4,000).
    node, proc = _node(), processor()
    _drive(node, proc, _t())  # the baselines
    _drive(node, proc, _t(False, a=4, b=0))  # 8 J, 4 J active held: pid 1's
    _drive(node, proc, _t(a=0, b=0, reset=True))  # the listing answers, the package counter resets
    out = _drive(node, proc, _t(a=0, b=4))  # 8 J, 4 J active: pid 2's
    shares = {key: t.energy_mj for (key, zone), t in totals(out, "process").items() if zone == "cpu:package"}
    assert shares == {"1": 4_000, "2": 4_000}  # the held 4 J by the deltas that span it (was 0 and 8,000)
    package = {z.device_id: z for z in out.device_totals}[PACKAGE]
    assert (package.energy_mj, package.idle_energy_mj, package.unattributed_energy_mj) == (16_000, 8_000, 0)


@pytest.mark.xfail(
    strict=True,
    reason="a fix needs the pod look's first reading of a container to be no later than the listing (its usage "
    "then holds no time of a process that the next listing counts from its start), or that process's first "
    "delta to start at the container's first reading",
)
def test_a_container_found_below_its_pod_then_listed_is_billed_its_time_once(tmp_path: Path) -> None:
    # A process starts in a new container after a scan's listing, before the pod look reads the container's
    # cgroup: that reading (counted from 0, made_after_s) holds its first 0.3 s, and the next listing counts
    # all of its CPU time from its start (started since the last listing), 0.3 s again. The credit gives back
    # 0.03 s (at most 3 /proc clock ticks for one listed process): 1,558 mJ for 1,300 true, paid by the tenants.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    busy_tick(host)
    host.hidden(SHORT, 0.3)  # in the cgroup when the pod look read it; its pid not in that listing
    host.tick(proc)
    busy_tick(host)
    host.spawn(40, SHORT, new=True)  # listed now: started since the last listing, 1.3 s in all (+0.3 s below)
    cid, cpu_s, started = host.procs[40]
    host.procs[40] = (cid, cpu_s + 0.3, started)
    out = host.tick(proc)
    assert since(host, out, start)[SHORT] == (1_300, 1_300)


def test_a_new_container_that_ran_across_a_failed_listing_counts_from_0(tmp_path: Path) -> None:
    # A container whose first process starts in the tick whose /proc listing fails (/proc/stat still read), its
    # processes never listed busy (8 s that tick): first read at the next listing, it is new (each of its listed
    # processes started since the last listing) only where its usage is no more than the node ran since that
    # listing, but the node's reading it is weighed against is the failed tick's, one tick back, not the listing's.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    job = "f" * 64
    busy_tick(host)
    host.spawn(30, job, new=True)
    host.hidden(job, 8.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "listdir", functools.partial(_failing, proc=host.proc, real=os.listdir))
        host.tick(proc)
    for _ in range(3):
        busy_tick(host)
        host.run(30, 1.0)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (16_000, 16_000), WEB: (16_000, 16_000), job: (12_000, 12_000)}
    assert unattributed_mj(out) == 0


@pytest.mark.xfail(
    strict=True,
    reason="a fix needs a zone back from a gap in a failed listing's tick held with its gap's CPU time (the gap "
    "kept open, or its sums moved into the hold, until a listing answers), so that listing's deltas complete it",
)
def test_a_zone_back_from_a_gap_in_a_failed_listings_tick_is_split_by_the_cpu_time_it_spans() -> None:
    # Not held, as documented: its gap's active energy (700 mJ) is unattributed, and the next tick's own 400 mJ is
    # split by deltas that span the failed tick too (pid 1 222 mJ, pid 2 178; their CPU time that tick was 1 s and
    # 3 s). simulate cpu.yaml with intel-rapl:0:0 gone 28-42 s and /proc gone 40-52 s: 171.1 J of its 1,108.9 J
    # active unattributed (none with the dram gap alone), its active 71 J above (its idle not known either).
    node, proc = _node(), processor()
    _drive(node, proc, _t())  # the baselines
    _drive(node, proc, _t(a=1, b=1, absent=True))  # the dram zone missing
    _drive(node, proc, _t(False, a=4, b=1))  # back in a tick whose listing failed: 1,400 mJ, 700 active
    out = _drive(node, proc, _t(a=1, b=3))  # 800 mJ, 400 active
    shares = {key: t.energy_mj for (key, zone), t in totals(out, "process").items() if zone == "cpu:dram"}
    dram = {z.device_id: z for z in out.device_totals}[DRAM]
    assert (shares, dram.unattributed_energy_mj) == ({"1": 600, "2": 500}, 0)


def test_a_report_whose_run_ends_while_energy_is_held_says_it_held_not_residual(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cpu.yaml with /proc gone from 168 s to the end: each package zone's last ticks are held, and the report said
    # counter = idle + attributed + unattributed with a residual of 1,231.875 J (the GPU devices' rows say held_j).
    monkeypatch.setenv("WATTPIPE_CPU_MODE", "usage_ratio")
    faulty = tmp_path / "cpu-proc-gone-at-the-end.yaml"
    faulty.write_text(SCENARIO.read_text() + "faults:\n  - {at_s: 168, target: procfs}\n")
    zones = by(simulate(tmp_path, faulty, "end")["zones"], "path")
    assert (zones["intel-rapl:0"]["held_j"], zones["intel-rapl:0"]["residual_j"]) == (1231.875, 0.0)
    for zone in zones.values():
        assert zone["residual_j"] == 0.0
        parts = zone["idle_j"] + zone["attributed_j"] + zone["unattributed_j"] + zone["held_j"]
        assert zone["counter_j"] == pytest.approx(parts, abs=1e-6)


@pytest.mark.xfail(
    strict=True,
    reason="a fix needs a zone's deltas to start where its energy does: after a counter reset in a failed "
    "listing's tick, the next listing's deltas less the failed tick's CPU time (not known per tick: the processes' "
    "readings at the failed tick are not taken), or that tick's energy unattributed rather than split by them",
)
def test_a_counter_reset_in_a_failed_listings_tick_does_not_bill_its_cpu_time_with_the_next_ticks_energy() -> None:
    # The reset's tick is not energy (pid 1's 4 s then went with it), and the next tick's 3 J active, all pid 2's
    # CPU time, is split by deltas that span the reset's tick too: pid 1 1,714 mJ, pid 2 1,286 (3,000 true).
    node, proc = _node(), processor()
    _drive(node, proc, _t())  # the baselines
    _drive(node, proc, _t(False, a=4, b=0, reset=True))  # the listing fails, the package counter resets
    out = _drive(node, proc, _t(a=0, b=3))  # 6 J, 3 J active: pid 2's
    shares = {key: t.energy_mj for (key, zone), t in totals(out, "process").items() if zone == "cpu:package"}
    assert shares.get("1", 0) == 0
