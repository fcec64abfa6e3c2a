"""The pod totals wattpipe *exports* on the MIG scenarios (dcgm-exporter's real 30 s collections, the demo
pipeline: nvml, dcgm, podresources, procfs → idle, attribution, k8s, energy), against the ground truth.

``simulate --report`` groups processes by the scenario's own pod membership; this reads what the energy
processor exported in the last tick instead, so the k8s processor must have named every joule, including
the energy held for a job and released after it exited (a share of a pid the driver no longer lists).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_mig_report import simulate


def exported_pods(stdout: str) -> tuple[dict[tuple[str, str], int], int]:
    """Each pod's exported total (mJ, over its GPUs) in the last tick, and the energy still held then (mJ)."""
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    last = max(r["time"] for r in rows)
    pods: dict[tuple[str, str], int] = {}
    held_mj = 0
    for r in rows:
        if r["time"] != last:
            continue
        attrs, values = r["attributes"], r["values"]
        # GPU totals only: the demo config also bills the pods' CPU energy (device_id cpu:<zone>).
        if r["type"] == "Totals" and attrs["scope"] == "pod" and not attrs["device_id"].startswith("cpu:"):
            key = (attrs["pod_namespace"], attrs["pod_name"])
            pods[key] = pods.get(key, 0) + values["energy_mj"]
        elif r["type"] == "DevicePower":
            held_mj += values.get("held_energy_mj", 0)
    return pods, held_mj


@pytest.mark.parametrize("scenario", ["mig.yaml", "mig-bursty.yaml"])
def test_exported_pod_totals_include_the_late_energy_of_exited_processes(
    scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = simulate(tmp_path, scenario, monkeypatch)
    pods, held_mj = exported_pods(capsys.readouterr().out)
    assert held_mj == 0  # 3 min ends on a collection: nothing is left to split
    assert set(pods) == {(p["namespace"], p["name"]) for p in report["pods"]}
    for p in report["pods"]:
        exported_j = pods[(p["namespace"], p["name"])] / 1000
        # Every joule attributed to a pod's processes is in its exported total. Before late shares reached
        # their pods: batch/job-1 -56.5 %, dev/notebook -28.6 %, batch/job-2 -18.5 % (mig-bursty.yaml),
        # serving/embed-1 -2.2 % (mig.yaml).
        assert exported_j == pytest.approx(p["attributed_j"], abs=0.01), p
        assert exported_j == pytest.approx(p["true_j"], rel=0.03), p
