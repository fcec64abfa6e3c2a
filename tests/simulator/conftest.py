"""Shared scenarios for the simulator's tests: small, hand-checkable nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wattpipe.simulator.scenario import Scenario, parse_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "configs" / "scenarios"


def two_gpu_data() -> dict[str, Any]:
    """GPU 0: two time-sliced processes (one capped phase); GPU 1: MIG with two instances."""
    return {
        "node": {"name": "test-node", "uptime_s": 100},
        "gpus": [
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 500},
            {
                "model": "NVIDIA A100-SXM4-40GB",
                "idle_w": 50,
                "max_w": 400,
                "mig": {"instances": [{"gi": 1, "profile": "3g.20gb"}, {"gi": 2, "profile": "1g.5gb"}]},
            },
        ],
        "pods": [
            {
                "name": "trainer-0",
                "namespace": "ml",
                "containers": [{"name": "main", "devices": [{"gpu": 0}]}],
            },
            {
                "name": "embed-0",
                "namespace": "ml",
                "containers": [{"name": "main", "devices": [{"resource": "nvidia.com/mig-1g.5gb", "gpu": 1, "gi": 2}]}],
            },
        ],
        "processes": [
            # 0–10 s: 0.5·200 + 0.5·300 = 250 W dynamic; 10–20 s: 1.0·200 + 1.0·300 = 500 > 400 → capped.
            {"pid": 100, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "dynamic_w": 200,
             "util": [[0, 0.5], [10, 1.0], [20, 0.0]], "memory_mib": 1000, "cpu_cores": 1.0},
            {"pid": 101, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "dynamic_w": 300,
             "util": [[0, 0.5], [10, 1.0]], "end_s": 30, "memory_mib": 500, "cpu_cores": 0.5},
            {"pid": 200, "comm": "embed", "container": "ml/embed-0/main", "gpu": 1, "gi": 2, "dynamic_w": 50,
             "util": [[0, 0.6]], "memory_mib": 2000},
            {"pid": 201, "comm": "embed2", "container": "ml/embed-0/main", "gpu": 1, "gi": 2, "dynamic_w": 50,
             "util": [[0, 0.6]], "start_s": 5},
            {"pid": 300, "comm": "big", "gpu": 1, "gi": 1, "util": [[0, 0.25]]},
            {"pid": 900, "comm": "sshd", "cpu_cores": 0.25},
        ],
        "cpu": {"packages": 2, "cores": 8, "idle_w": 40, "w_per_core": 10, "max_range_uj": 1_000_000_000},
    }  # fmt: skip


@pytest.fixture
def two_gpu() -> Scenario:
    return parse_scenario(two_gpu_data())
