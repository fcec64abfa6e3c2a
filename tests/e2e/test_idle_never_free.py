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
    # Before: idle never known, all of it billed: the notebooks' pod +22.6 %, Xorg +139 %. Then, with the
    # regression: Xorg +117 % (it carried the first 30 s of idle). Now the energy of the ticks before idle
    # is known is held and released once it is, its idle part taken off (processors/_idle_hold.py).
    report = simulate(tmp_path, "never-free.yaml", "5m", monkeypatch)
    (device,) = report["devices"]
    assert device["detected_idle_w"] == pytest.approx(device["true_idle_w"], abs=1.0)
    assert device["idle_j"] == pytest.approx(300 * 70.0, abs=70.0)  # the whole run's, the held ticks' too
    assert (device["residual_j"], device["held_j"]) == (0.0, 0.0)
    (pod,) = report["pods"]
    assert pod["attributed_j"] == pytest.approx(pod["true_j"], rel=0.02)
    processes = by_pid(report)
    for pid in (1200, 5301, 5302):  # Xorg too: before, +117 %
        assert processes[pid]["attributed_j"] == pytest.approx(processes[pid]["true_j"], rel=0.02)


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
    # Its energy was held for attribution's idle_wait (90 s) in case idle came, then released all as active.
    assert (device["held_j"], device["residual_j"]) == (0.0, 0.0)
