"""Review: the rapl receiver on a powercap tree that misbehaves, feeding cpu_attribution, against the truth.

Zones vanish for a few ticks and come back, read garbled, wrap (a small range: several wraps a run), /proc/stat
goes missing or backwards, the process listing fails, processes come and go. Whatever happens, each zone's
measured energy is its counter's true growth (nothing lost over an absence shorter than a trip round the
range), every tick conserves per zone, totals never fall, and no process is billed energy of a tick the
processes' CPU-time deltas do not span (a failed listing's tick is held for the next listing's, which span it).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from tests.receivers.test_rapl import write_zone
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import CpuZoneSample, HostProcess, NodeCpuTime
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.processors.cpu_attribution import CpuAttributionConfig, CpuAttributionProcessor
from wattpipe.receivers.rapl import RaplConfig, RaplReceiver

RANGE_UJ = 9_999_999  # values 0 … 9,999,999: 10 J a trip
ZONES = {"intel-rapl:0": "package-0", "intel-rapl:1": "package-1", "intel-rapl:0:0": "dram"}

Action = tuple[str, int]  # ("read" | "gone" | "garbled", µJ spent this tick)


@st.composite
def plans(draw: st.DrawFn) -> list[tuple[dict[str, Action], str, bool, dict[int, float]]]:
    out = []
    gone_for = dict.fromkeys(ZONES, 0)
    ticks = draw(st.integers(3, 14))
    for tick in range(ticks):
        actions: dict[str, Action] = {}
        for path in ZONES:
            what = "read" if tick >= ticks - 2 else draw(st.sampled_from(["read", "read", "read", "gone", "garbled"]))
            if what != "read" and gone_for[path] >= 2:
                what = "read"  # at most 3 ticks between reads: under one trip round the range
            gone_for[path] = gone_for[path] + 1 if what != "read" else 0
            actions[path] = (what, draw(st.integers(0, 2_400_000)))
        stat = draw(st.sampled_from(["ok", "ok", "ok", "missing", "backwards"]))
        listed = draw(st.booleans() | st.just(True))
        live = draw(st.dictionaries(st.integers(2, 9), st.one_of(st.just(0.0), st.floats(0.01, 8.0)), max_size=5))
        out.append((actions, stat, listed, live))
    return out


def _write(sys: Path, path: str, raw: int, what: str) -> None:
    directory = sys / "class" / "powercap" / path
    if what == "gone":
        shutil.rmtree(directory, ignore_errors=True)
        return
    write_zone(sys, path, ZONES[path], raw, RANGE_UJ)
    if what == "garbled":
        (directory / "energy_uj").write_text("1234x\n")


def _ticks(
    *ticks: tuple[int, str, bool, dict[int, float]],
) -> list[tuple[dict[str, Action], str, bool, dict[int, float]]]:
    """Every zone read, ``uj`` spent on each, /proc/stat ``ok`` or ``missing``, listed or not, the live processes."""
    return [({path: ("read", uj) for path in ZONES}, stat, listed, live) for uj, stat, listed, live in ticks]


@settings(max_examples=80, deadline=None)
@given(plans(), st.integers(0, RANGE_UJ))
@example(  # the counters wrap in a tick whose listing failed, then procfs answers nothing (a timeout), then both back
    _ticks(
        (1_000_000, "ok", True, {2: 1.0}),
        (2_400_000, "ok", False, {2: 3.0, 3: 1.0}),
        (1_000_000, "missing", False, {2: 4.0, 3: 1.0}),
        (500_000, "ok", True, {2: 5.0, 3: 2.0}),
    ),
    RANGE_UJ - 2_000_000,
)
def test_a_misbehaving_tree_loses_nothing_conserves_and_bills_no_gap(
    plan: list[tuple[dict[str, Action], str, bool, dict[int, float]]], start_uj: int
) -> None:
    clock = SteppedClock()
    with tempfile.TemporaryDirectory() as tmp:
        sys = Path(tmp)
        raw = dict.fromkeys(ZONES, start_uj)
        true_uj = dict.fromkeys(ZONES, 0)  # the counters' growth since the first tick
        for path in ZONES:
            _write(sys, path, start_uj, "read")
        receiver = RaplReceiver(
            RaplConfig(root=str(sys)), make_context("rapl", "receiver", clock, telemetry=Telemetry(clock))
        )
        proc = CpuAttributionProcessor(
            CpuAttributionConfig(terminated_retention=3600.0), make_context("cpu_attribution", clock=clock)
        )
        proc.start()
        procs: dict[int, HostProcess] = {}
        total_s, active_s = 1000.0, 100.0
        measured = dict.fromkeys(ZONES, 0)
        held = dict.fromkeys(ZONES, 0)  # each zone's active energy held over failed listings (its last level)
        first_read: dict[str, int] = {}
        last_read: dict[str, int] = {}
        previous_totals: dict[tuple[str, str, str], int] = {}
        stat, listed = "ok", True
        for tick in range(len(plan) + 1):
            now = clock.now()
            records = [r for r in asyncio.run(receiver.collect()) if isinstance(r, CpuZoneSample)]
            for r in records:
                first_read.setdefault(r.path, true_uj[r.path])
                last_read[r.path] = true_uj[r.path]
            fields: dict[str, object] = {}
            if records:
                fields["cpu_zones"] = tuple(records)
            if stat != "missing":
                fields["node_cpu"] = (NodeCpuTime(time=now, total_s=total_s, active_s=active_s),)
            if listed:
                fields["host_processes"] = tuple(procs.values())
            out = proc.process(Batch(time=now, interval_s=5.0, node="n").replace(**fields))
            by_type_active: dict[str, int] = {}
            for p in out.device_power:
                measured[p.device_id] += p.energy_mj
                change = p.held_energy_mj - held[p.device_id]  # (held over a failed listing: _cpu_hold.py)
                assert p.idle_energy_mj + p.active_energy_mj + change == p.energy_mj
                assert p.idle_energy_mj >= 0
                assert p.active_energy_mj >= 0
                if p.unattributable is None:  # (with what it held over failed listings, released now)
                    by_type_active[p.device_name or ""] = (
                        by_type_active.get(p.device_name or "", 0) + p.active_energy_mj
                    )
                held[p.device_id] = p.held_energy_mj
            grown: dict[str, int] = {}
            for t in out.totals:
                key = (t.scope, t.key, t.device_id)
                assert t.energy_mj >= previous_totals.get(key, 0), key
                if t.scope == "process":
                    zone = t.device_id.removeprefix("cpu:")
                    grown[zone] = grown.get(zone, 0) + t.energy_mj - previous_totals.get(key, 0)
                previous_totals[key] = t.energy_mj
            for zone, mj in grown.items():  # processes were billed only the split zones' active energy
                assert mj <= by_type_active.get(zone, 0), (tick, zone)
            for d in out.device_totals:
                assert d.attributed_energy_mj + d.unattributed_energy_mj == d.active_energy_mj
                assert d.idle_energy_mj + d.active_energy_mj == d.energy_mj
            if tick == len(plan):
                break
            actions, stat, listed, live = plan[tick]
            clock.advance(5.0)
            for path, (what, spent) in actions.items():
                true_uj[path] += spent
                raw[path] = (raw[path] + spent) % (RANGE_UJ + 1)
                _write(sys, path, raw[path], what)
            total_s += 10.0 if stat != "backwards" else -30.0
            active_s += 4.0 if stat != "backwards" else -3.0
            for pid in list(procs):
                if pid not in live:
                    del procs[pid]
            for pid, cpu_s in live.items():
                before = procs.get(pid)
                procs[pid] = HostProcess(
                    time=clock.now(),
                    pid=pid,
                    start_time_ticks=pid,
                    cpu_time_s=(before.cpu_time_s or 0.0) + cpu_s if before is not None else cpu_s,
                    start_wall_s=before.start_wall_s if before is not None else clock.now().wall_s - 1.0,
                )
        for path in ZONES:  # the last tick read every zone (each was back the tick before, or never gone)
            assert last_read[path] == true_uj[path], path
            # measured: the counter's growth between its first and last reads, exactly
            assert measured[path] == (start_uj + true_uj[path]) // 1000 - start_uj // 1000, path
