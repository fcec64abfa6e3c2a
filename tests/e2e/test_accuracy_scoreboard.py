"""benchmarks/accuracy.py: every number the scoreboard reports is the simulate report's, recomputed here."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import accuracy

SCENARIOS = Path(__file__).resolve().parents[2] / "configs" / "scenarios"
CHOSEN = ("demo", "jobs-burst")  # pods and host processes, time-sliced and exclusive GPUs, short jobs


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    reports = tmp_path_factory.mktemp("reports")
    argv = ["--duration", "90s", "--json", "--reports", str(reports)]
    for name in CHOSEN:
        argv += ["--scenario", str(SCENARIOS / f"{name}.yaml")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert accuracy.main(argv) == 0
    return json.loads(out.getvalue()), reports


Row = dict[str, Any]


def _errors(rows: list[Row], name_of: Callable[[Row], str]) -> dict[str, float]:
    """Every entity's relative error against what it could have been billed, above the 1 J floor."""
    errors = {}
    for row in rows:
        attributable_j = row["true_j"] - row["true_unattributable_j"]
        if attributable_j >= 1.0:
            errors[name_of(row)] = (row["attributed_j"] - attributable_j) / attributable_j
    return errors


def test_each_scenario_row_matches_its_report(board: tuple[dict[str, Any], Path]) -> None:
    document, reports = board
    assert document["duration_s"] == 90.0
    assert document["floor_j"] == 1.0
    assert [row["scenario"] for row in document["scenarios"]] == list(CHOSEN)
    for row in document["scenarios"]:
        report = json.loads((reports / f"{row['scenario']}.json").read_text())
        assert row["simulated_s"] == pytest.approx(90.0)
        assert (row["ticks"], row["gpus"]) == (report["ticks"], len(report["devices"]))
        kinds: dict[str, tuple[list[Row], Callable[[Row], str]]] = {
            "process": (report["processes"], lambda r: f"pid {r['pid']}"),
            "container": (report["containers"], lambda r: f"{r['namespace']}/{r['pod']}/{r['name']}"),
            "pod": (report["pods"], lambda r: f"{r['namespace']}/{r['name']}"),
        }
        for kind, (entities, name_of) in kinds.items():
            errors = _errors(entities, name_of)
            worst = row[kind]
            assert errors, (row["scenario"], kind)  # both scenarios have each kind: the check is not vacuous
            assert worst["counted"] == len(errors)
            assert worst["error"] == errors[worst["name"]]
            assert abs(worst["error"]) == max(abs(e) for e in errors.values())
            entity = next(e for e in entities if name_of(e) == worst["name"])
            assert worst["attributed_j"] == entity["attributed_j"]
        devices = report["devices"]
        assert all(d["detected_idle_w"] is not None for d in devices)
        assert row["idle_absent"] == 0
        assert row["idle_error_w"] == max(abs(d["detected_idle_w"] - d["true_idle_w"]) for d in devices)
        assert row["residual_j"] == max(abs(d["residual_j"]) for d in devices)
        assert row["residual_rel"] <= 1e-6
        assert row["unattributed_j"] == pytest.approx(sum(d["unattributed_j"] for d in devices), abs=1e-9)
        assert row["held_j"] == pytest.approx(sum(d["held_j"] for d in devices), abs=1e-9)
        below = [p["attributed_j"] for p in report["processes"] if p["true_j"] - p["true_unattributable_j"] < 1.0]
        assert row["stray_j"] == pytest.approx(sum(below), abs=1e-9)


def test_absent_idle_is_said_and_tiny_entities_are_billed_as_stray() -> None:
    device = {"counter_j": 1000.0, "idle_j": 0.0, "attributed_j": 1000.0, "unattributed_j": 0.0, "residual_j": 0.0}
    report: Row = {
        "ticks": 31,
        "simulated_s": 60.0,
        "devices": [
            {**device, "uuid": "GPU-a", "true_idle_w": 70.0, "detected_idle_w": None},
            {**device, "uuid": "GPU-b", "true_idle_w": 55.0, "detected_idle_w": 57.5},
        ],
        "processes": [
            # truly 0 J (a context held at 0 %), billed 12 J: no relative error, 12 J stray
            {"pid": 10, "gpu_uuid": "GPU-a", "true_j": 0.0, "true_unattributable_j": 0.0, "attributed_j": 12.0},
            # 100 J true, 20 J of it inside a gap nobody could split: 90 J billed against 80 J is +12.5 %
            {"pid": 11, "gpu_uuid": "GPU-a", "true_j": 100.0, "true_unattributable_j": 20.0, "attributed_j": 90.0},
            {"pid": 12, "gpu_uuid": "GPU-b", "true_j": 400.0, "true_unattributable_j": 0.0, "attributed_j": 380.0},
        ],
        "containers": [],
        "pods": [],
    }
    row = accuracy.score("made-up", report)
    assert row.process is not None
    assert (row.process.name, row.process.counted) == ("pid 11", 2)
    assert row.process.error == pytest.approx(0.125)
    assert (row.container, row.pod) == (None, None)
    assert row.stray_j == 12.0
    assert (row.idle_error_w, row.idle_absent) == (2.5, 1)
    table = accuracy.render_table([row], 60.0)
    assert "2.5 W, absent on 1 of 2" in table
    assert "+12.50 % (pid 11)" in table

    never = {**report, "devices": [{**d, "detected_idle_w": None} for d in report["devices"]]}
    row = accuracy.score("never-learned", never)
    assert (row.idle_error_w, row.idle_absent) == (None, 2)
    assert "absent" in accuracy.render_markdown([row])


def test_a_scenario_that_cannot_run_is_reported_and_the_exit_status_says_so(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus: [{model: 'NVIDIA H100 80GB HBM3', idle_w: 70, max_w: 700, idle_watts: 3}]\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert accuracy.main(["--scenario", str(broken), "--duration", "10s", "--json"]) == 1
    (row,) = json.loads(out.getvalue())["scenarios"]
    assert row["scenario"] == "broken"
    assert "exited 2" in row["failed"]
    assert "idle_watts" in row["failed"]
