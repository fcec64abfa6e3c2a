"""RAPL zones that vanish mid-run and come back (a simulator ``rapl`` fault: the zone's directory gone from the
powercap tree while its hardware counter counts on), end to end through `wattpipe simulate --report`: the energy
of the gap is split by the CPU time each process used over it (processors/_cpu_gap.py), so the bill is the one
a run without the fault gives, but for what a gap cannot know (how the power moved inside it)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cpu_report import CONFIG, SCENARIO, by
from wattpipe.cli import main

FAULTS = """
faults:
  - {at_s: 66, for_s: 15, target: rapl}                          # every zone: pid 3002 (61-73 s) ends inside
  - {at_s: 100, for_s: 12, target: rapl, zone: "intel-rapl:0"}   # one package alone
"""


def simulate(tmp_path: Path, scenario: Path, name: str) -> dict[str, Any]:
    report = tmp_path / f"{name}.json"
    err = io.StringIO()
    args = ["simulate", "--scenario", str(scenario), "-c", str(CONFIG), "--duration", "3m", "--report", str(report),
            "--log-level", "error"]  # fmt: skip
    assert main(args, io.StringIO(), err) == 0, err.getvalue()
    return json.loads(report.read_text())["cpu"]  # type: ignore[no-any-return]


def test_a_zone_gap_is_billed_as_a_run_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATTPIPE_CPU_MODE", "usage_ratio")
    faulty = tmp_path / "cpu-gap.yaml"
    faulty.write_text(SCENARIO.read_text() + FAULTS)
    gap, plain = simulate(tmp_path, faulty, "gap"), simulate(tmp_path, SCENARIO, "plain")
    zones, plain_zones = by(gap["zones"], "path"), by(plain["zones"], "path")
    for path, zone in zones.items():
        assert abs(zone["residual_j"]) <= 1e-6, zone
        assert zone["counter_j"] == pytest.approx(plain_zones[path]["counter_j"], abs=1e-3)  # nothing lost
        assert zone["attributed_j"] == pytest.approx(zone["active_j"], abs=1e-6)  # nothing left unattributed
        # The gap's idle/active split is the node's usage over the whole gap, not the last tick's.
        assert zone["active_j"] == pytest.approx(plain_zones[path]["active_j"], rel=1e-3)
    processes, plain_processes = by(gap["processes"], "pid"), by(plain["processes"], "pid")
    for pid in (900, 950, 2101, 2102, 2201, 3001, 7001):
        assert processes[pid]["attributed_j"] == pytest.approx(plain_processes[pid]["attributed_j"], rel=1e-3)
    # pid 3002 ended inside the gap: billed late by its CPU time over the gap, at the gap's mean power per
    # CPU-second (it ran in the gap's busiest seconds, which a gap cannot see): 2.2 % under the plain run.
    ended = processes[3002]["attributed_j"] / plain_processes[3002]["attributed_j"]
    assert 0.97 < ended < 1.0
    assert by(gap["pods"], "name")["etl-1"]["attributed_j"] == pytest.approx(
        sum(processes[pid]["attributed_j"] for pid in (3001, 3002, 3003)), abs=1e-6
    )
