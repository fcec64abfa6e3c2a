"""CPU attribution end to end (issue 17): `wattpipe simulate --report` on configs/scenarios/cpu.yaml (two
sockets with package and DRAM zones, a counter wrap mid-run, a KVM VM, short-lived processes, a pod on CPU and
GPU), read by the real rapl and procfs receivers, checked against the simulator's ground truth."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from wattpipe.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu-sim.yaml"
SCENARIO = ROOT / "configs" / "scenarios" / "cpu.yaml"
LONG_LIVED = (900, 950, 2101, 2201, 7001)  # alive over the whole window


def simulate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str = "usage_ratio", config: Path = CONFIG
) -> dict[str, Any]:
    monkeypatch.setenv("WATTPIPE_CPU_MODE", mode)
    report = tmp_path / "report.json"
    err = io.StringIO()
    args = ["simulate", "--scenario", str(SCENARIO), "-c", str(config), "--duration", "5m", "--report", str(report),
            "--log-level", "error"]  # fmt: skip
    assert main(args, io.StringIO(), err) == 0, err.getvalue()
    assert "cpu (true:" in err.getvalue()
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def by(rows: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
    return {row[key]: row for row in rows}


def test_seed_model_conserves_every_zone_and_loses_nothing_through_the_wrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = simulate(tmp_path, monkeypatch)
    cpu = report["cpu"]
    assert {(z["zone"], z["path"]) for z in cpu["zones"]} == {
        ("package", "intel-rapl:0"),
        ("package", "intel-rapl:1"),
        ("dram", "intel-rapl:0:0"),
        ("dram", "intel-rapl:1:0"),
    }
    for z in cpu["zones"]:
        assert abs(z["residual_j"]) <= 1e-6, z
        assert z["counter_j"] == pytest.approx(z["idle_j"] + z["active_j"], abs=1e-9)
        # Both packages wrap near t = 150 s: the counter's sum is the truth's energy to the millijoule.
        assert z["counter_j"] == pytest.approx(z["true_counter_j"], abs=2e-3), z
    # The GPU side of the same node is reported as before, beside it.
    assert [d["residual_j"] for d in report["devices"]] == [0.0]


def test_seed_model_shares_by_cpu_time_and_groups_are_sums(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = simulate(tmp_path, monkeypatch)["cpu"]
    processes = by(cpu["processes"], "pid")
    attributed = sum(p["attributed_j"] for p in processes.values())
    cpu_s = sum(p["cpu_s"] for p in processes.values() if p["cpu_s"] is not None)
    for pid in LONG_LIVED:
        p = processes[pid]
        assert p["cpu_s"] == pytest.approx(p["true_cpu_s"], abs=0.02)
        assert p["attributed_j"] / attributed == pytest.approx(p["cpu_s"] / cpu_s, rel=0.01), p
        # The seed bills the idle power's share of the busy cores too: above the dynamic truth, by the same 3 %.
        assert p["attributed_j"] / p["true_j"] == pytest.approx(1.0295, abs=0.005), p
    # Processes of 30 s or more that did not live the whole window: the seed's model bills a CPU-second at the
    # node's power per core *of that tick*, so one running only in busier ticks pays more per CPU-second
    # (3001, from 40 s: 15.05 % of the energy for 14.84 % of the CPU time). Per tick the split is exact.
    # Read as percentage points, the 1 % holds for them too (0.21 points for 3001).
    for pid in (2102, 3001):
        p = processes[pid]
        assert p["attributed_j"] / attributed == pytest.approx(p["cpu_s"] / cpu_s, rel=0.015), p
        assert p["attributed_j"] / attributed == pytest.approx(p["cpu_s"] / cpu_s, abs=0.01), p
    pods = {(p["namespace"], p["name"]): p["attributed_j"] for p in cpu["pods"]}
    containers = {(c["namespace"], c["pod"], c["name"]): c["attributed_j"] for c in cpu["containers"]}
    assert pods[("shop", "shop-web")] == pytest.approx(processes[2101]["attributed_j"] + processes[2102]["attributed_j"] + processes[2201]["attributed_j"], abs=1e-9)  # fmt: skip
    assert containers[("shop", "shop-web", "app")] == pytest.approx(processes[2201]["attributed_j"], abs=1e-9)
    assert pods[("batch", "etl-1")] == pytest.approx(sum(processes[p]["attributed_j"] for p in (3001, 3002, 3003)))
    (vm,) = cpu["vms"]
    assert (vm["vm_id"], vm["vm_name"]) == ("6f1c2a4e-9b1d-4c1e-8a53-2b7f0d9e4c11", "db-vm")
    assert (processes[7001]["comm"], processes[2201]["comm"]) == ("qemu-system-x86", "python")  # a reader's names
    assert vm["attributed_j"] == pytest.approx(processes[7001]["attributed_j"], abs=1e-9)
    # A process that lives inside one tick is never seen in /proc: its CPU time goes to the others.
    assert processes[3003]["attributed_j"] == 0.0
    assert processes[3003]["cpu_s"] is None  # never read: its CPU time is unknown to wattpipe, not zero


def test_idle_mode_within_2_percent_of_each_process_truth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = simulate(tmp_path, monkeypatch, mode="idle")["cpu"]
    processes = by(cpu["processes"], "pid")
    for pid in (*LONG_LIVED, 2102, 3001):
        p = processes[pid]
        assert p["attributed_j"] == pytest.approx(p["true_j"], rel=0.02), p
    for z in cpu["zones"]:
        assert abs(z["residual_j"]) <= 1e-6, z


def test_idle_mode_learning_the_idle_within_2_percent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No idle_w: each zone's idle is learned by regression of its power on the usage ratio; the ticks before
    # the first fit passes are split by the usage ratio (the seed's model).
    cpu = simulate(tmp_path, monkeypatch, config=CONFIG.with_name("cpu-sim-learned.yaml"))["cpu"]
    processes = by(cpu["processes"], "pid")
    for pid in (*LONG_LIVED, 2102, 3001):
        p = processes[pid]
        assert p["attributed_j"] == pytest.approx(p["true_j"], rel=0.02), p
    for z in cpu["zones"]:
        assert abs(z["residual_j"]) <= 1e-6, z
