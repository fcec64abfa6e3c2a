"""The simulated NVML library, driven through pynvml's own wrappers."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.simulator.conftest import two_gpu_data
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.scenario import parse_scenario


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


def _install(data: dict[str, Any], clock: SteppedClock) -> Iterator[simulator.SimulatedNode]:
    node = simulator.install(parse_scenario(data), clock)
    pynvml.nvmlInit()
    try:
        yield node
    finally:
        simulator.uninstall()


@pytest.fixture
def node(clock: SteppedClock) -> Iterator[simulator.SimulatedNode]:
    yield from _install(two_gpu_data(), clock)


def _handle(index: int) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def test_energy_counter_delta_equals_the_true_integral(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    handle = _handle(0)
    clock.advance(3.0)
    before_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    clock.advance(14.5)  # across the capped phase (10–20 s)
    after_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    true_j = node.truth.device_energy_between_j(0, 3.0, 17.5)
    assert true_j == pytest.approx(7 * 350 + 7.5 * 500)
    assert abs((after_mj - before_mj) - true_j * 1000) <= 1  # integer mJ, floored like the driver


def test_energy_counter_counts_from_driver_load(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    # uptime_s = 100 of idle at 100 W before the scenario starts.
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(_handle(0)) == 100 * 100 * 1000
    clock.advance(2.0)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(_handle(0)) == (10_000 + 2 * 350) * 1000


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.floats(min_value=0.001, max_value=20.0), min_size=1, max_size=8))
def test_counter_deltas_over_arbitrary_windows_match_the_truth(steps: list[float]) -> None:
    clock = SteppedClock()
    for node in _install(two_gpu_data(), clock):
        handle = _handle(0)
        last_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        t = 0.0
        for step in steps:
            clock.advance(step)
            now_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            true_mj = node.truth.device_energy_between_j(0, t, node.t_s()) * 1000
            assert abs((now_mj - last_mj) - true_mj) <= 1.0 + 1e-6
            assert now_mj >= last_mj
            last_mj, t = now_mj, node.t_s()


def test_power_is_the_one_second_average_in_milliwatts(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    clock.advance(10.25)  # last second: 0.75 s at 350 W, 0.25 s capped at 500 W
    assert pynvml.nvmlDeviceGetPowerUsage(_handle(0)) == round((0.75 * 350 + 0.25 * 500) * 1000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(_handle(0)) == 500_000


def test_running_processes_follow_the_schedule(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    clock.advance(25)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(_handle(0))
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(100, 1000 * 2**20), (101, 500 * 2**20)]
    assert {(p.gpuInstanceId, p.computeInstanceId) for p in procs} == {(0xFFFFFFFF, 0xFFFFFFFF)}
    clock.advance(10)  # pid 101 ended at 30 s
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(_handle(0))] == [100]


def test_no_processes_is_an_empty_list_not_an_error(clock: SteppedClock) -> None:
    data = two_gpu_data()
    data["processes"] = []
    for _node in _install(data, clock):
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(_handle(0)) == []
        assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(_handle(0)) == []


def test_process_utilisation_samples_respect_last_seen(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    handle = _handle(0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(handle, 0)  # t = 0: nothing sampled yet
    clock.advance(2.0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    assert [(s.pid, s.smUtil) for s in samples] == [(100, 50), (101, 50)]
    start_us = round(node.start_wall_s * 1e6)
    assert all(s.timeStamp == start_us + 2_000_000 for s in samples)  # 12 samples of 1/6 s in 2 s
    last_seen = samples[0].timeStamp
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen)  # nothing newer yet
    clock.advance(9.0)  # t = 11: samples from 2 s to 11 s; util 0.5 until 10 s, 1.0 after
    newer = pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen)
    mean_pct = round(100 * (48 * 0.5 + 6 * 1.0) / 54)
    assert [(s.pid, s.smUtil) for s in newer] == [(100, mean_pct), (101, mean_pct)]
    assert all(s.timeStamp > last_seen for s in newer)


def test_idle_processes_get_no_samples(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    clock.advance(25)  # pid 100's util is 0 from 20 s; pid 101 still at 1.0
    samples = pynvml.nvmlDeviceGetProcessUtilization(_handle(0), round((node.start_wall_s + 21) * 1e6))
    assert [(s.pid, s.smUtil) for s in samples] == [(101, 100)]


def test_driver_sample_buffer_is_bounded(clock: SteppedClock) -> None:
    data = two_gpu_data()
    data["node"]["sample_buffer"] = 6  # three sample periods of two processes
    for _node in _install(data, clock):
        clock.advance(11.0)
        # lastSeen = 0 reads the whole buffer: only the newest 3 periods (all at util 1.0) are left.
        assert [s.smUtil for s in pynvml.nvmlDeviceGetProcessUtilization(_handle(0), 0)] == [100, 100]


def test_mig_devices_resolve_and_report_instance_ids(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    clock.advance(6)
    parent = _handle(1)
    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    found = {}
    for index in range(7):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except pynvml.NVMLError_NotFound:
            continue
        found[pynvml.nvmlDeviceGetGpuInstanceId(mig)] = pynvml.nvmlDeviceGetUUID(mig)
    assert sorted(found) == [1, 2]
    assert all(uuid.startswith("MIG-") for uuid in found.values())
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(found[2])
    assert pynvml.nvmlDeviceGetGpuInstanceId(by_uuid) == 2
    assert pynvml.nvmlDeviceGetName(by_uuid) == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert pynvml.nvmlDeviceIsMigDeviceHandle(by_uuid).value == 1
    parent_again = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(by_uuid)
    assert pynvml.nvmlDeviceGetUUID(parent_again) == pynvml.nvmlDeviceGetUUID(parent)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(by_uuid)] == [200, 201]
    on_parent = pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert {(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in on_parent} == {(200, 2, 0), (201, 2, 0), (300, 1, 0)}
    assert pynvml.nvmlDeviceGetMemoryInfo(by_uuid).total == 5000 * 2**20


def test_mig_calls_answer_not_supported_where_real_gpus_do(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    parent = _handle(1)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    for call in (pynvml.nvmlDeviceGetPowerUsage, pynvml.nvmlDeviceGetTotalEnergyConsumption):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessUtilization(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(parent)
    # The board sensor still answers for the parent: the MIG GPU's whole power.
    clock.advance(3)
    assert pynvml.nvmlDeviceGetPowerUsage(parent) == node.power_reading_mw(1, 3)


def test_pre_volta_and_non_mig_gpus_say_not_supported(clock: SteppedClock) -> None:
    data = {"gpus": [{"model": "Tesla P100-PCIE-16GB", "idle_w": 30, "max_w": 250}]}
    for _node in _install(data, clock):
        handle = _handle(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(handle)
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
        assert pynvml.nvmlDeviceGetPowerUsage(handle) == 30_000
        assert pynvml.nvmlDeviceGetArchitecture(handle) == pynvml.NVML_DEVICE_ARCH_PASCAL


def test_faults_fail_one_call_on_one_gpu_for_a_window(clock: SteppedClock) -> None:
    data = two_gpu_data()
    data["faults"] = [
        {"target": "nvml", "at_s": 5, "for_s": 10, "gpu": 0, "call": "nvmlDeviceGetPowerUsage", "error": "GPU_IS_LOST"},
        {"target": "nvml", "at_s": 20, "gpu": 1, "error": "UNKNOWN"},
    ]
    for _node in _install(data, clock):
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(_handle(1), 0)
        clock.advance(5)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetPowerUsage(_handle(0))
        pynvml.nvmlDeviceGetTotalEnergyConsumption(_handle(0))  # other calls still answer
        pynvml.nvmlDeviceGetPowerUsage(_handle(1))  # and the other GPU
        clock.advance(10)
        assert pynvml.nvmlDeviceGetPowerUsage(_handle(0)) > 0  # the window has ended
        clock.advance(5)
        assert pynvml.nvmlDeviceGetCount() == 2  # a device-wide fault leaves device-less calls alone
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetHandleByIndex(1)
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetComputeRunningProcesses(mig)  # MIG devices fail with their GPU


def test_live_mig_reconfiguration(clock: SteppedClock) -> None:
    data = two_gpu_data()
    data["faults"] = [{"target": "gpu", "at_s": 50, "gpu": 1, "set": {"mig": None, "compute_mode": "prohibited"}}]
    for _node in _install(data, clock):
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(_handle(1), 0)
        clock.advance(50)
        assert pynvml.nvmlDeviceGetMigMode(_handle(1)) == [0, 0]
        assert pynvml.nvmlDeviceGetComputeMode(_handle(1)) == pynvml.NVML_COMPUTEMODE_PROHIBITED
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(_handle(1)) == []
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetUUID(mig)  # the instance is gone, and its handle with it


def test_topology_and_nvlink_come_from_the_scenario(clock: SteppedClock) -> None:
    data = {
        "gpus": [
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700,
             "topology": {"numa": 0, "pcie_switch": 0, "nvlinks": {1: 4, 2: 2}}},
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700,
             "topology": {"numa": 0, "pcie_switch": 0, "nvlinks": {0: 4}}},
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700,
             "topology": {"numa": 1, "pcie_switch": 3, "nvlinks": {0: 2}}},
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700, "topology": {"numa": 0}},
        ]
    }  # fmt: skip
    for node in _install(data, clock):
        h = [_handle(i) for i in range(4)]
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor
        assert level(h[0], h[1]) == pynvml.NVML_TOPOLOGY_SINGLE
        assert level(h[0], h[3]) == pynvml.NVML_TOPOLOGY_NODE
        assert level(h[0], h[2]) == pynvml.NVML_TOPOLOGY_SYSTEM
        states = [pynvml.nvmlDeviceGetNvLinkState(h[0], link) for link in range(18)]
        assert states == [1] * 6 + [0] * 12
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(h[0], 18)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(h[3], 0)  # a PCIe-only card
        remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h[0], 5)
        assert remote.busId == node.scenario.gpus[2].pci_bus_id
        assert pynvml.nvmlDeviceGetP2PStatus(h[0], h[1], pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == 0
        assert pynvml.nvmlDeviceGetP2PStatus(h[0], h[3], pynvml.NVML_P2P_CAPS_INDEX_NVLINK) != 0


def test_calls_before_init_and_after_shutdown_are_uninitialized(node: simulator.SimulatedNode) -> None:
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 2


def test_unsimulated_symbols_are_function_not_found(node: simulator.SimulatedNode) -> None:
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetFanSpeed(_handle(0))


def test_uninstall_restores_pynvml(clock: SteppedClock) -> None:
    previous_lib, previous_cache = pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache
    with simulator.install(parse_scenario(two_gpu_data()), clock) as node:
        assert simulator.installed_node() is node
        with pytest.raises(RuntimeError, match="already installed"):
            simulator.install(parse_scenario(two_gpu_data()), clock)
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 2
    assert simulator.installed_node() is None
    assert pynvml.nvmlLib is previous_lib
    assert pynvml._nvmlGetFunctionPointer_cache is previous_cache
    assert math.isfinite(node.t_s())
