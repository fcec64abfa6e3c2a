"""Idle on GPUs that always hold a process (issue 15), through `wattpipe simulate --report`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_simulate_report import simulate


def by_pid(report: dict) -> dict[int, dict]:  # type: ignore[type-arg]
    return {p["pid"]: p for p in report["processes"]}


def test_a_gpu_never_free_learns_idle_once_its_load_varies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: idle never known, all of it billed: the notebooks' pod +22.6 %, Xorg +139 %.
    report = simulate(tmp_path, "never-free.yaml", "5m", monkeypatch)
    (device,) = report["devices"]
    assert device["detected_idle_w"] == pytest.approx(device["true_idle_w"], abs=1.0)
    assert device["idle_j"] == pytest.approx(270 * 70.0, abs=2 * 70.0)  # known from 30 s on (a tick or so)
    (pod,) = report["pods"]
    assert pod["attributed_j"] == pytest.approx(pod["true_j"], rel=0.02)
    processes = by_pid(report)
    for pid in (5301, 5302):
        assert processes[pid]["attributed_j"] == pytest.approx(processes[pid]["true_j"], rel=0.02)
    # Xorg held the GPU alone at a steady 2 % for 30 s: nothing can tell idle from its power then (one
    # equation, two unknowns), so it carries that half-minute of idle. A prior (or mode fixed) would not.
    xorg = processes[1200]
    assert xorg["attributed_j"] - xorg["true_j"] == pytest.approx(30 * 70.0, abs=70.0)


def test_a_gpu_whose_load_always_varies_learns_idle_in_its_first_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = simulate(tmp_path, "always-varying.yaml", "5m", monkeypatch)  # before: +24.6 %, +25.4 %
    (device,) = report["devices"]
    assert device["detected_idle_w"] == pytest.approx(device["true_idle_w"], abs=1.0)
    assert device["idle_j"] >= 240 * 35.0  # known within the first minute
    for p in report["processes"]:
        assert p["attributed_j"] == pytest.approx(p["true_j"], rel=0.02), p


def test_a_steady_load_on_a_gpu_never_quiet_leaves_idle_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "steady.yaml"
    scenario.write_text(
        json.dumps(
            {
                "node": {"name": "steady"},
                "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}],
                "processes": [{"pid": 7000, "comm": "server", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.5]]}],
            }
        )
    )
    report = simulate(tmp_path, str(scenario), "3m", monkeypatch)
    (device,) = report["devices"]
    assert (device["detected_idle_w"], device["idle_j"]) == (None, 0.0)  # absent, not a guess
