"""``wattpipe simulate --report`` on a CPU scenario, through the CLI's main, as the e2e tests run it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from wattpipe.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cpu-sim.yaml"


def cpu_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: Path, mode: str, unseen: str
) -> dict[str, Any]:
    """The ``cpu`` section of a 3-minute run of ``scenario`` under configs/cpu-sim.yaml, with cpu_attribution's
    ``mode`` and ``unseen`` (the config's ``WATTPIPE_CPU_MODE`` and ``WATTPIPE_CPU_UNSEEN``); every zone conserved
    and nothing unattributed, whatever the mode."""
    monkeypatch.setenv("WATTPIPE_CPU_MODE", mode)
    monkeypatch.setenv("WATTPIPE_CPU_UNSEEN", unseen)
    path = tmp_path / f"{scenario.stem}-{mode}-{unseen}.json"
    err = io.StringIO()
    args = ["simulate", "--scenario", str(scenario), "-c", str(CONFIG), "--duration", "3m", "--report", str(path),
            "--log-level", "error"]  # fmt: skip
    assert main(args, io.StringIO(), err) == 0, err.getvalue()
    cpu: dict[str, Any] = json.loads(path.read_text())["cpu"]
    for zone in cpu["zones"]:
        assert abs(zone["residual_j"]) <= 1e-6  # conserved either way
        assert zone["unattributed_j"] == 0.0
    return cpu


def group_errors(cpu: dict[str, Any]) -> dict[str, float]:
    """Each container's and pod's attributed energy's error against its truth (%), by ``scope/name``."""
    out = {f"container/{c['name']}": 100 * (c["attributed_j"] / c["true_j"] - 1) for c in cpu["containers"]}
    return out | {f"pod/{p['name']}": 100 * (p["attributed_j"] / p["true_j"] - 1) for p in cpu["pods"]}
