"""The driver-reload fault: calls fail for a while, the energy counter restarts from 0, the truth runs on."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from tests.simulator.conftest import two_gpu_data
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator._faults import NvmlFault
from wattpipe.simulator.scenario import ScenarioError, parse_scenario


def _reload(**fault: Any) -> dict[str, Any]:
    data = two_gpu_data()
    data["faults"] = [{"target": "nvml", "kind": "reload", **fault}]
    return data


def test_a_reload_fails_every_call_then_the_counter_counts_from_zero() -> None:
    clock = SteppedClock()
    node = simulator.install(parse_scenario(_reload(at_s=30, for_s=4, gpu=0)), clock)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        clock.advance(29)
        before_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        assert before_mj == node.energy_counter_mj(0, 29) > 100 * 100 * 1000  # idle × uptime and more
        clock.advance(1)
        for call in (pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetTotalEnergyConsumption):
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                call(handle)
        assert pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(1)) > 0  # GPU 1 is untouched
        clock.advance(10)  # back at 34 s: 6 s of energy since
        after_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        true_j = node.truth.device_energy_j(0, 40) - node.truth.device_energy_j(0, 34)
        assert after_mj == pytest.approx(true_j * 1000, abs=1)
        assert after_mj < before_mj
    finally:
        simulator.uninstall()


def test_a_reload_leaves_the_ground_truth_alone() -> None:
    plain = simulator.build(parse_scenario(two_gpu_data()), SteppedClock())
    reloaded = simulator.build(parse_scenario(_reload(at_s=5)), SteppedClock())
    for t_s in (4.0, 6.0, 12.0, 40.0):
        assert reloaded.truth.device_energy_j(0, t_s) == plain.truth.device_energy_j(0, t_s)
        assert reloaded.truth.process_energy_j(100, t_s) == plain.truth.process_energy_j(100, t_s)
    assert reloaded.energy_counter_mj(1, 7.0) == 0  # every GPU (gpu omitted), still reloading at 7 s
    assert reloaded.energy_counter_mj(1, 12.0) == pytest.approx(
        (reloaded.truth.device_energy_j(1, 12.0) - reloaded.truth.device_energy_j(1, 10.0)) * 1000, abs=1
    )


def test_reload_defaults_and_errors_name_the_key() -> None:
    (fault,) = parse_scenario(_reload(at_s=120, gpu=1)).faults
    assert isinstance(fault, NvmlFault)
    assert (fault.kind, fault.error, fault.for_s, fault.code) == ("reload", "GPU_IS_LOST", 5.0, 15)
    (fault,) = parse_scenario(_reload(at_s=1, error="uninitialized", for_s=2)).faults
    assert isinstance(fault, NvmlFault)
    assert (fault.error, fault.until_s) == ("UNINITIALIZED", 3.0)
    with pytest.raises(ScenarioError, match=r"faults\.0\.nvml.*call: a reload fails every call"):
        parse_scenario(_reload(at_s=1, call="nvmlDeviceGetPowerUsage"))
    with pytest.raises(ScenarioError, match=r"faults\.0\.nvml\.kind"):
        parse_scenario(_reload(at_s=1, kind="unplug"))
    with pytest.raises(ScenarioError, match=r"faults\.0\.gpu: no GPU 7"):
        parse_scenario(_reload(at_s=1, gpu=7))
    data = two_gpu_data()
    data["faults"] = [{"target": "nvml", "at_s": 1, "gpu": 0}]
    with pytest.raises(ScenarioError, match=r"error: name the NVML error"):
        parse_scenario(data)
