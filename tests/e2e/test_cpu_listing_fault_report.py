"""A /proc that answers nothing for a while (a simulator ``procfs`` fault: the whole tree gone, as a mount that flaps
or a procfs receiver that times out: no listing and no /proc/stat), end to end through `wattpipe simulate --report`:
each zone's energy of those ticks is held (processors/_cpu_hold.py) and split with the next listing's tick, whose
usage ratio and CPU-time deltas span the failed ticks, so the bill is close to a run without the fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cpu_gap_report import simulate
from tests.e2e.test_cpu_report import SCENARIO, by

FAULTS = """
faults:
  - {at_s: 40, for_s: 12, target: procfs}   # about two 5 s ticks with no /proc at all
  - {at_s: 120, for_s: 4, target: procfs}   # one
"""


def test_ticks_with_no_proc_are_held_and_billed_as_a_run_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATTPIPE_CPU_MODE", "usage_ratio")
    faulty = tmp_path / "cpu-no-proc.yaml"
    faulty.write_text(SCENARIO.read_text() + FAULTS)
    failed, plain = simulate(tmp_path, faulty, "failed"), simulate(tmp_path, SCENARIO, "plain")
    zones, plain_zones = by(failed["zones"], "path"), by(plain["zones"], "path")
    for path, zone in zones.items():
        assert abs(zone["residual_j"]) <= 1e-6, zone
        assert zone["counter_j"] == pytest.approx(plain_zones[path]["counter_j"], abs=1e-3)  # nothing lost
        assert zone["attributed_j"] == pytest.approx(zone["active_j"], abs=1e-6)  # nothing left unattributed
        assert zone["active_j"] == pytest.approx(plain_zones[path]["active_j"], rel=2e-3)
    processes, plain_processes = by(failed["processes"], "pid"), by(plain["processes"], "pid")
    for pid in (900, 950, 2101, 2102, 2201, 3001, 7001):  # alive across the failed ticks
        assert processes[pid]["attributed_j"] == pytest.approx(plain_processes[pid]["attributed_j"], rel=5e-3)
