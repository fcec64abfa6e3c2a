"""The whole GPU chain on a simulated node, checked against the simulator's ground truth.

nvml receiver → idle → attribution → energy, under a stepped clock. Asserted: exact conservation per
device per tick, device totals equal to the true energy integral, process totals monotonic and close
to each process's true energy, a process that starts mid-run attributed from its first tick, and an
exited one kept as terminated.
"""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import pytest

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.scenario import parse_scenario

H = "tests.helpers.components"

SCENARIO: dict[str, Any] = {
    "node": {"name": "acc"},
    "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700},
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 60, "max_w": 700},
    ],
    "processes": [
        # GPU 0: three time-sliced processes with the same power per unit of utilisation, changing load
        # (changes fall mid-tick on purpose: ticks are at multiples of 5 s)
        {"pid": 101, "comm": "a", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.6], [62, 0.2], [121.5, 0.9]]},
        {"pid": 102, "comm": "b", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.3], [93, 0.5]], "end_s": 148},
        {"pid": 103, "comm": "c", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.4]], "start_s": 47},
        # GPU 1: one process, then nothing (its energy must show as unattributed, not vanish)
        {"pid": 201, "comm": "d", "gpu": 1, "dynamic_w": 250, "util": [[0, 0.8]], "end_s": 101.5},
    ],
}

PIPELINE = f"""
receivers:
  nvml: {{required: true}}
processors:
  idle: {{mode: fixed, devices: {{GPU0: 70, GPU1: 60}}}}
  attribution:
  energy: {{terminated_retention: 1h}}
exporters:
  custom/rec: {{class: "{H}:Recorder"}}
service:
  telemetry: {{listen: ""}}
  pipelines:
    metrics: {{interval: 5s, receivers: [nvml], processors: [idle, attribution, energy], exporters: [custom/rec]}}
"""


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    clock = SteppedClock()
    scenario = parse_scenario(SCENARIO)
    uuids = [g.uuid for g in scenario.gpus]
    with simulator.install(scenario, clock) as node:
        registry = Registry.from_entry_points()
        text = textwrap.dedent(PIPELINE).replace("GPU0", uuids[0]).replace("GPU1", uuids[1])
        graph = build(load_config_text(text, "acc.yaml", registry, {}), registry, clock, Telemetry(clock))
        asyncio.run(Service(graph).run(max_ticks=41))  # 0 … 200 s
        batches = graph.exporters["custom/rec"].batches  # type: ignore[attr-defined]
        return {"node": node, "uuids": uuids, "batches": batches, "t_end": node.t_s()}


def test_conservation_is_exact_every_tick_on_every_device(run: dict[str, Any]) -> None:
    checked = 0
    for batch in run["batches"]:
        for power in batch.device_power:
            shares = [s for s in batch.shares if s.device_id == power.device_id]
            assert sum(s.energy_mj for s in shares) + power.idle_energy_mj == power.energy_mj
            checked += 1
    assert checked == 2 * 40  # the first tick only sets the counters' baseline


def test_device_totals_equal_the_true_energy_integral(run: dict[str, Any]) -> None:
    node, last = run["node"], run["batches"][-1]
    for gpu, uuid in enumerate(run["uuids"]):
        (dt,) = [d for d in last.device_totals if d.device_id == uuid]
        truth_j = node.truth.device_energy_between_j(gpu, 0.0, run["t_end"])
        assert dt.energy_mj / 1000 == pytest.approx(truth_j, abs=41 * 0.002)  # integer-mJ counter reads


def test_process_energy_is_close_to_the_truth(run: dict[str, Any]) -> None:
    node, last = run["node"], run["batches"][-1]
    totals = {int(t.key): t for t in last.totals}
    for pid in (101, 102, 103, 201):
        true_j = node.truth.process_energy_j(pid, run["t_end"])
        assert totals[pid].energy_j == pytest.approx(true_j, rel=0.015), pid  # measured 2026-11-25: within 0.9 %


def test_process_started_mid_run_is_attributed_from_its_first_tick(run: dict[str, Any]) -> None:
    # pid 103 starts at 47 s; the tick at 50 s must already carry its energy
    batch_50 = run["batches"][10]
    assert batch_50.time.monotonic_s - run["batches"][0].time.monotonic_s == pytest.approx(50.0)
    (s,) = [s for s in batch_50.shares if s.pid == 103]
    assert s.energy_mj > 0


def test_exited_processes_stay_as_terminated_with_their_energy(run: dict[str, Any]) -> None:
    last = run["batches"][-1]
    states = {int(t.key): t.state for t in last.totals}
    assert states == {101: "running", 102: "terminated", 103: "running", 201: "terminated"}


def test_idle_gpu_energy_goes_to_idle_and_unattributed_never_lost(run: dict[str, Any]) -> None:
    node, last = run["node"], run["batches"][-1]
    (dt,) = [d for d in last.device_totals if d.device_id == run["uuids"][1]]
    assert dt.energy_mj == dt.idle_energy_mj + dt.attributed_energy_mj + dt.unattributed_energy_mj
    assert dt.idle_energy_mj / 1000 == pytest.approx(60 * run["t_end"], rel=0.001)
    assert dt.unattributed_energy_mj < 1000  # after pid 201 exits the GPU idles: nothing active to lose
    # while pid 201 ran its whole dynamic energy was attributed to it
    assert dt.attributed_energy_mj / 1000 == pytest.approx(node.truth.process_energy_j(201, run["t_end"]), rel=0.03)


def test_totals_never_go_backwards_over_the_run(run: dict[str, Any]) -> None:
    last_seen: dict[str, int] = {}
    for batch in run["batches"]:
        for t in batch.totals:
            assert t.energy_mj >= last_seen.get(t.key, 0)
            last_seen[t.key] = t.energy_mj
    assert len(last_seen) == 4
