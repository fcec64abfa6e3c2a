"""A GPU lost for good (GPU_IS_LOST from 20 s to past the run's end) while its idle is not known yet and
attribution holds its energy (processors/_idle_hold.py), through `wattpipe simulate --report`: the held
energy reaches the process once the hold has waited ``idle_wait`` (90 s), with no DevicePower to carry it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_simulate_report import simulate

SCENARIO = {
    "node": {"name": "lost"},
    "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}],
    # Xorg at 2 % from the start: never free, never quiet, a steady load: idle is not known before the loss.
    "processes": [{"pid": 1200, "comm": "Xorg", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.02]]}],
    "faults": [{"target": "nvml", "gpu": 0, "error": "GPU_IS_LOST", "at_s": 20, "for_s": 600}],
}


@pytest.fixture
def report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    scenario = tmp_path / "lost.yaml"
    scenario.write_text(json.dumps(SCENARIO))
    return simulate(tmp_path, str(scenario), "3m", monkeypatch)


def test_the_energy_held_for_a_lost_gpu_reaches_its_process(report: dict) -> None:  # type: ignore[type-arg]
    (device,) = report["devices"]
    assert device["counter_j"] > 1000  # ~20 s at ~76 W before the loss
    assert device["attributed_j"] + device["idle_j"] + device["unattributed_j"] == device["counter_j"]
    (xorg,) = report["processes"]
    assert xorg["attributed_j"] == device["counter_j"]  # all active: idle never became known


def test_the_report_says_nothing_is_held_any_more(report: dict) -> None:  # type: ignore[type-arg]
    (device,) = report["devices"]
    assert (device["residual_j"], device["held_j"]) == (0.0, 0.0)


MIG_SCENARIO = {
    "node": {"name": "lost-mig"},
    "dcgm": {"collect_interval_s": 30},
    "gpus": [
        {
            "model": "NVIDIA H100 80GB HBM3",
            "idle_w": 75,
            "max_w": 700,
            "mig": {"instances": [{"gi": 2, "profile": "3g.40gb"}, {"gi": 9, "profile": "1g.10gb"}]},
        }
    ],
    "processes": [
        {"pid": 3001, "comm": "python", "gpu": 0, "gi": 2, "start_s": 4, "util": [[0, 0.9]]},
        {"pid": 3101, "comm": "python", "gpu": 0, "gi": 9, "start_s": 4, "util": [[0, 1.0]]},
    ],
    # Lost between two of dcgm-exporter's collections: the ticks since the last one are held for its next.
    "faults": [{"target": "nvml", "gpu": 0, "error": "GPU_IS_LOST", "at_s": 50, "for_s": 600}],
}


def test_a_mig_gpu_lost_for_good_holds_nothing_at_the_end_and_its_processes_get_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "lost-mig.yaml"
    scenario.write_text(json.dumps(MIG_SCENARIO))
    report = simulate(tmp_path, str(scenario), "3m", monkeypatch)
    (device,) = report["devices"]
    assert (device["residual_j"], device["held_j"]) == (0.0, 0.0)
    active_j = device["counter_j"] - device["idle_j"] - device["unattributed_j"]
    assert sum(p["attributed_j"] for p in report["processes"]) == pytest.approx(active_j, abs=1e-9)
    assert active_j > 1000
