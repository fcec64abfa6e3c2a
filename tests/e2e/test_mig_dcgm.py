"""MIG end to end: nvml and dcgm receivers (real loopback HTTP) → idle → attribution → energy, on the simulator.

dcgm-exporter's collect interval is set to the tick interval (like ``dcgm-exporter -c 5000`` with a 5 s
tick), so each tick's activity is the mean over the same window as the tick's energy; the accuracy test
also runs with dcgm-exporter's 1 s sampling (activity from the tick's last second only).
"""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import pytest

import simulator
from pipeline.clock import SteppedClock
from pipeline.components import Registry
from pipeline.config import load_config_text
from pipeline.graph import build
from pipeline.records import Batch
from pipeline.runtime import Service
from pipeline.telemetry import Telemetry
from simulator.dcgm import DcgmExporterOptions
from simulator.scenario import parse_scenario

H = "tests.helpers.components"

# A process's power per unit of utilisation is proportional to its instance's compute slices, so that
# "activity × slices" is the true power split (what the method assumes of real MIG instances).
MIG_GPU: dict[str, Any] = {
    "model": "NVIDIA H100 80GB HBM3",
    "idle_w": 75,
    "max_w": 700,
    "mig": {
        "instances": [
            {"gi": 1, "profile": "3g.40gb"},
            {"gi": 2, "profile": "2g.20gb"},
            {"gi": 3, "profile": "1g.10gb"},
            {"gi": 4, "profile": "1g.10gb"},
        ]
    },
}
PROCESSES: list[dict[str, Any]] = [
    {"pid": 11, "comm": "a", "gpu": 0, "gi": 1, "dynamic_w": 150, "util": [[0, 0.8], [62.5, 0.4]]},
    {"pid": 21, "comm": "b", "gpu": 0, "gi": 2, "dynamic_w": 100, "util": [[0, 0.5], [43, 1.0]]},
    {"pid": 31, "comm": "c", "gpu": 0, "gi": 3, "dynamic_w": 50, "util": [[0, 0.3]]},
    {"pid": 32, "comm": "d", "gpu": 0, "gi": 3, "dynamic_w": 50, "util": [[0, 0.3]]},
    {"pid": 41, "comm": "e", "gpu": 0, "gi": 4, "dynamic_w": 50, "util": [[0, 1.0], [81.2, 0.0]]},
]


def pipeline(uuid: str, dcgm_url: str, hold: str = "60s") -> str:
    return textwrap.dedent(
        f"""
        receivers:
          nvml: {{required: true}}
          dcgm: {{endpoint: "{dcgm_url}", timeout: 2s}}
        processors:
          idle: {{mode: fixed, devices: {{{uuid}: 75}}}}
          attribution: {{activity_hold: {hold}}}
          energy:
        exporters:
          custom/rec: {{class: "{H}:Recorder"}}
        service:
          telemetry: {{listen: ""}}
          pipelines:
            metrics: {{interval: 5s, receivers: [nvml, dcgm], processors: [idle, attribution, energy],
                       exporters: [custom/rec]}}
        """
    )


def run(
    data: dict[str, Any], ticks: int, hold: str = "60s", collect_s: float = 5.0
) -> tuple[simulator.SimulatedNode, list[Batch], float]:
    clock = SteppedClock()
    scenario = parse_scenario(data)
    with simulator.install(scenario, clock) as node:
        dcgm = simulator.start_dcgm_exporter(node, DcgmExporterOptions(collect_interval_s=collect_s))
        registry = Registry.from_entry_points()
        text = pipeline(scenario.gpus[0].uuid, dcgm.url, hold)
        graph = build(load_config_text(text, "mig.yaml", registry, {}), registry, clock, Telemetry(clock))
        asyncio.run(Service(graph).run(max_ticks=ticks))
        return node, graph.exporters["custom/rec"].batches, node.t_s()  # type: ignore[attr-defined]


def conserved(batches: list[Batch]) -> None:
    for batch in batches:
        for power in batch.device_power:
            shares = [s for s in batch.shares if s.device_id == power.device_id]
            assert sum(s.energy_mj for s in shares) + power.idle_energy_mj == power.energy_mj


@pytest.mark.parametrize("collect_s", [5.0, 1.0], ids=["dcgm-window-equals-tick", "dcgm-default-1s"])
def test_mixed_profiles_each_instance_within_3_percent_of_truth(collect_s: float) -> None:
    data = {"node": {"name": "mig"}, "gpus": [MIG_GPU], "processes": PROCESSES}
    node, batches, t_end = run(data, ticks=25, collect_s=collect_s)
    conserved(batches)
    assert {s.mode for b in batches[1:] for s in b.shares} == {"mig"}
    totals = {int(t.key): t for t in batches[-1].totals if t.scope == "instance"}
    assert sorted(totals) == [1, 2, 3, 4]
    for gi in (1, 2, 3, 4):
        true_j = sum(node.truth.process_energy_j(p["pid"], t_end) for p in PROCESSES if p["gi"] == gi)
        assert totals[gi].energy_j == pytest.approx(true_j, rel=0.03), gi
        assert dict(totals[gi].extra)["profile"] == {1: "3g.40gb", 2: "2g.20gb", 3: "1g.10gb", 4: "1g.10gb"}[gi]
    # Inside instance 3 the two equal processes split equally; process series say their instance.
    processes = {int(t.key): t for t in batches[-1].totals if t.scope == "process"}
    assert processes[31].energy_mj == pytest.approx(processes[32].energy_mj, abs=1)
    assert dict(processes[11].extra)["gpu_instance_id"] == "1"


def test_dcgm_outage_holds_then_falls_back_to_slices_then_recovers_without_breaking_conservation() -> None:
    data = {
        "node": {"name": "mig"},
        "gpus": [MIG_GPU],
        "processes": PROCESSES,
        "faults": [{"at_s": 40, "for_s": 30, "target": "dcgm", "kind": "down"}],
    }
    _, batches, _ = run(data, ticks=25, hold="10s")
    conserved(batches)
    modes = [next(s.mode for s in b.shares) for b in batches[1:]]  # one mode per tick (a single GPU)
    # ticks at 5 … 120 s: dcgm answers until 40, is down 40–70, back from 70 s
    assert modes[:7] == ["mig"] * 7  # 5 … 35 s
    assert "mig_held" in modes[7:10]  # within the 10 s hold
    assert "mig_slices" in modes[9:14]  # then by slices
    assert modes[-5:] == ["mig"] * 5  # back to activity weighting


def test_mig_switched_off_mid_run_is_time_sliced_within_two_ticks() -> None:
    later = [
        {"pid": 51, "comm": "f", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.6]], "start_s": 60},
        {"pid": 52, "comm": "g", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.3]], "start_s": 60},
    ]
    data = {
        "node": {"name": "mig"},
        "gpus": [MIG_GPU],
        "processes": PROCESSES + later,
        "faults": [{"at_s": 60, "target": "gpu", "gpu": 0, "set": {"mig": None}}],
    }
    _, batches, _ = run(data, ticks=20)
    conserved(batches)
    modes = [next(s.mode for s in b.shares) for b in batches[1:]]  # ticks at 5 … 95 s
    assert modes[10] == "mig"  # 55 s
    assert "time_slicing" in modes[12:14]  # 65 or 70 s: within two ticks of the change at 60 s
    assert modes[-1] == "time_slicing"


def test_probe_dcgm_prints_what_the_receiver_saw(tmp_path: Any) -> None:
    import io
    import json

    from wattpipe.cli import main

    clock = SteppedClock()
    with simulator.build(
        parse_scenario({"node": {"name": "mig"}, "gpus": [MIG_GPU], "processes": PROCESSES}), clock
    ) as node:
        clock.advance(10.0)
        dcgm = simulator.start_dcgm_exporter(node)
        cfg = tmp_path / "probe.yaml"
        cfg.write_text(
            f"receivers: {{dcgm: {{endpoint: '{dcgm.url}'}}}}\n"
            "exporters: {console: {}}\n"
            "service: {pipelines: {metrics: {receivers: [dcgm], exporters: [console]}}}\n"
        )
        out, err = io.StringIO(), io.StringIO()
        assert main(["probe", "dcgm", "-c", str(cfg)], out, err) == 0, err.getvalue()
    records = json.loads(out.getvalue())
    activity = {
        r["attributes"]["gpu_instance_id"]: r["values"]["gr_engine_active"]
        for r in records
        if r["type"] == "MigActivity"
    }
    assert activity == {
        "1": pytest.approx(0.8),
        "2": pytest.approx(0.5),
        "3": pytest.approx(0.6),
        "4": pytest.approx(1.0),
    }
    (signals,) = [r for r in records if r["type"] == "DeviceSignals"]
    assert signals["values"]["fields"]["power_w"] > 75
