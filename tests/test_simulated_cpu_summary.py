"""``wattpipe simulate``'s CPU summary (wattpipe/simulated_cpu.py, ``print_cpu_report``): what a person reads
after a run, beside the report file's ``cpu`` section."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tests.helpers.cpu_report import CONFIG
from wattpipe.cli import main
from wattpipe.simulated_cpu import print_cpu_report


def _report() -> dict[str, Any]:
    zone = {"zone": "package", "path": "intel-rapl:0", "counter_j": 100.0, "true_counter_j": 100.0, "idle_j": 40.0,
            "attributed_j": 60.0, "unattributed_j": 0.0, "residual_j": 0.0}  # fmt: skip
    return {
        "zones": [zone],
        "processes": [{"pid": 10, "comm": "nginx", "true_j": 30.0, "attributed_j": 33.0}],
        "containers": [
            {"namespace": "shop", "pod": "web", "name": "nginx", "true_j": 40.0, "attributed_j": 30.0},
            {"namespace": "shop", "pod": "web", "name": "log-shipper", "true_j": 20.0, "attributed_j": 30.0},
        ],
        "pods": [{"namespace": "shop", "name": "web", "true_j": 60.0, "attributed_j": 60.0}],
        "vms": [],
    }


def test_each_container_has_a_row_as_in_the_gpu_summary() -> None:
    # docs/accuracy.md's CPU tables (cpu-moves, cpu-build) are per container; a pod of two containers each off
    # by 25 % the other way reads 0.00 %, so the summary shows the containers too, between processes and pods.
    err = io.StringIO()
    print_cpu_report(_report(), err)
    lines = err.getvalue().splitlines()
    rows = [line.split() for line in lines if line.startswith("  cpu ") and line.split()[1] != "(true:"]
    assert [row[:3] for row in rows] == [
        ["cpu", "pid", "10"],
        ["cpu", "container", "shop/web/nginx"],
        ["cpu", "container", "shop/web/log-shipper"],
        ["cpu", "pod", "shop/web"],
    ]
    assert rows[1][-3:] == ["30.0", "40.0", "-25.00%"]
    assert rows[2][-3:] == ["30.0", "20.0", "+50.00%"]
    assert rows[3][-1] == "+0.00%"


def test_a_move_after_the_run_is_said_not_dropped_in_silence(tmp_path: Path) -> None:
    """A person who wrote a move at 500 s and ran 1 minute is told it never happened, naming the move."""
    scenario = tmp_path / "late.yaml"
    scenario.write_text(
        "cpu: {packages: 1, cores: 8, idle_w: 40, w_per_core: 5}\n"
        "processes:\n"
        "  - {pid: 11, comm: agent, cpu_cores: 0.5, moves: [{at_s: 20, cgroup: /a.scope}, {at_s: 500, cgroup: /b.scope}]}\n"
    )
    err = io.StringIO()
    args = ["simulate", "--scenario", str(scenario), "-c", str(CONFIG), "--duration", "1m", "--log-level", "error"]
    assert main(args, io.StringIO(), err) == 0, err.getvalue()
    notes = [line for line in err.getvalue().splitlines() if "never happens" in line]
    assert notes == [
        f"note: scenario {scenario}: processes.0 (pid 11).moves.1 at 500 s is after the run's end (60 s): it never happens"
    ]


def test_a_process_that_starts_after_the_run_is_said_not_dropped_in_silence(tmp_path: Path) -> None:
    """A process written to start at 300 s in a 1-minute run never runs: the person is told, naming it; one that
    starts inside the run, or a GPU process that does, is not mentioned."""
    scenario = tmp_path / "late.yaml"
    scenario.write_text(
        "cpu: {packages: 1, cores: 8, idle_w: 40, w_per_core: 5}\n"
        "processes:\n"
        "  - {pid: 11, comm: agent, cpu_cores: 0.5}\n"
        "  - {pid: 12, comm: batch, cpu_cores: 2, start_s: 30}\n"
        "  - {pid: 13, comm: nightly, cpu_cores: 4, start_s: 300, end_s: 400}\n"
    )
    err = io.StringIO()
    args = ["simulate", "--scenario", str(scenario), "-c", str(CONFIG), "--duration", "1m", "--log-level", "error"]
    assert main(args, io.StringIO(), err) == 0, err.getvalue()
    notes = [line for line in err.getvalue().splitlines() if "never" in line]
    assert notes == [
        f"note: scenario {scenario}: processes.2 (pid 13) starts at 300 s, after the run's end (60 s): it never runs"
    ]
