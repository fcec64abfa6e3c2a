"""Per-process power per unit of SM and of memory utilisation (issue 15.3): the truth and the NVML face."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from tests.helpers.context import make_context
from tests.simulator.conftest import SCENARIOS
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import GpuProcessSample
from wattpipe.receivers.nvml import NvmlConfig, NvmlReceiver
from wattpipe.simulator.scenario import ScenarioError, parse_scenario
from wattpipe.simulator.truth import GroundTruth


def _data() -> dict[str, Any]:
    return {
        "node": {"name": "power-model"},
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}],
        "processes": [
            # 300 W per unit of SM utilisation, 100 W per unit of memory utilisation.
            {
                "pid": 10,
                "comm": "trainer",
                "gpu": 0,
                "dynamic_w": 300,
                "util": [[0, 0.5]],
                "mem_w": 100,
                "mem_util": [[0, 0.4], [10, 0.8]],
            },
            {"pid": 11, "comm": "server", "gpu": 0, "dynamic_w": 200, "util": [[0, 0.25]]},
            # Busy on memory only (a copy engine's worth of traffic, no kernels).
            {"pid": 12, "comm": "copier", "gpu": 0, "mem_w": 50, "mem_util": [[0, 0.0], [20, 0.3]], "start_s": 15},
        ],
    }


def test_power_adds_sm_and_memory_watts_per_unit_of_utilisation() -> None:
    truth = GroundTruth(parse_scenario(_data()))
    assert truth.device_power_w(0, 5.0) == pytest.approx(70 + 300 * 0.5 + 100 * 0.4 + 200 * 0.25)
    assert truth.device_power_w(0, 12.0) == pytest.approx(70 + 300 * 0.5 + 100 * 0.8 + 200 * 0.25)
    assert truth.process_power_w(10, 12.0) == pytest.approx(230.0)
    # pid 12's SM coefficient defaults to the headroom (630 W), but it never runs a kernel.
    assert truth.process_power_w(12, 25.0) == pytest.approx(50 * 0.3)
    assert truth.process_energy_j(10, 20.0) == pytest.approx(10 * 190 + 10 * 230)
    assert truth.process_mem_util(10, 0.0, 20.0) == pytest.approx(0.6)


def test_the_cap_scales_memory_power_with_the_rest() -> None:
    data = _data()
    data["gpus"][0]["max_w"] = 270  # 200 W of headroom; at 12 s the processes want 280 W
    truth = GroundTruth(parse_scenario(data))
    scale = 200 / 280
    assert truth.device_power_w(0, 12.0) == pytest.approx(270.0)
    assert truth.process_power_w(10, 12.0) == pytest.approx(230 * scale)
    assert truth.process_power_w(11, 12.0) == pytest.approx(50 * scale)


@pytest.mark.parametrize(
    ("mem_util", "message"),
    [([[0, 1.5]], "0 <= fraction <= 1"), ([[5, 0.1], [5, 0.2]], "strictly increasing")],
)
def test_memory_utilisation_schedules_are_validated(mem_util: list[list[float]], message: str) -> None:
    data = _data()
    data["processes"][0]["mem_util"] = mem_util
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data)


def test_without_memory_keys_power_is_what_it_always_was() -> None:
    # Every shipped scenario's numbers stay: idle + Σ util × dynamic_w wherever the cap does not bite.
    scenario = simulator.load_scenario(SCENARIOS / "unequal-tenants.yaml")
    truth = GroundTruth(scenario)
    for t in (7.0, 50.0, 100.0, 175.0, 240.0):
        for gpu, spec in enumerate(scenario.gpus):
            plans = truth.running(gpu, t)
            expected = spec.idle_w + sum(p.util.at(t) * p.dynamic_w for p in plans)
            assert truth.device_power_w(gpu, t) == pytest.approx(expected)
            assert all(p.mem_w == 0.0 for p in plans)


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def node(clock: SteppedClock) -> Iterator[simulator.SimulatedNode]:
    with simulator.install(parse_scenario(_data()), clock) as node:
        pynvml.nvmlInit()
        yield node
        pynvml.nvmlShutdown()


def test_process_samples_report_memory_utilisation(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock.advance(6.0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert [(s.pid, s.smUtil, s.memUtil) for s in samples] == [(10, 50, 40), (11, 25, 0)]
    since = samples[0].timeStamp
    clock.advance(6.0)  # t = 12: 36 periods since, pid 10's memory at 0.4 then (from 10 s) 0.8
    newer = {s.pid: (s.smUtil, s.memUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(handle, since)}
    assert newer[10] == (50, round(100 * (24 * 0.4 + 12 * 0.8) / 36))
    clock.advance(14.0)  # t = 26: pid 12 has been busy on memory alone since 20 s
    since = round((node.start_wall_s + 24.0) * 1e6)
    newer = {s.pid: (s.smUtil, s.memUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(handle, since)}
    assert newer[12] == (0, 30)  # sampled: it used the GPU's memory in each of its periods


def test_the_nvml_receiver_reports_each_process_memory_utilisation(clock: SteppedClock) -> None:
    with simulator.install(parse_scenario(_data()), clock):
        receiver = NvmlReceiver(NvmlConfig(), make_context("nvml", "receiver", clock))
        asyncio.run(receiver.start())
        try:
            asyncio.run(receiver.collect())  # the first read sets the window's start
            clock.advance(10.0)
            asyncio.run(receiver.collect())
            clock.advance(4.0)  # the window 10 → 14 s: pid 10's memory utilisation is 0.8 from 10 s
            procs = {r.pid: r for r in asyncio.run(receiver.collect()) if isinstance(r, GpuProcessSample)}
        finally:
            asyncio.run(receiver.shutdown())
    assert procs[10].mem_util == pytest.approx(0.8, abs=0.01)
    assert procs[10].sm_util == pytest.approx(0.5, abs=0.01)
    assert procs[11].mem_util == 0.0  # observed: sampled, with no memory traffic
