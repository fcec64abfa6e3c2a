"""A benchmark-sized node builds and answers a whole tick's worth of calls through every face.

How fast is measured by benchmarks/simulator_scale.py (timings never gate unit tests)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pynvml

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.dcgm_server import DcgmExporterOptions, start_dcgm_exporter
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.scale import scale_scenario


def _nvml_tick(count: int, last_seen_us: int) -> int:
    """One receiver tick: per GPU power, energy, processes, utilisation samples, MIG devices."""
    calls = 0
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetPowerUsage(handle)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        calls += 4
        if pynvml.nvmlDeviceGetMaxMigDeviceCount(handle):
            for slot in range(7):
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                pynvml.nvmlDeviceGetGpuInstanceId(mig)
                calls += 2
            continue
        with contextlib.suppress(pynvml.NVMLError_NotFound):
            calls += len(pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us))
    return calls


def test_benchmark_sized_node_serves_a_full_tick_on_every_face(tmp_path: Path) -> None:
    scenario = scale_scenario(mig_gpus=8, timesliced_gpus=8, processes_per_gpu=64, host_processes=2000)
    clock = SteppedClock()
    with simulator.install(scenario, clock) as node:
        assert len(scenario.processes) == 8 * 7 + 8 * 64 + 2000
        pynvml.nvmlInit()
        exporter = start_dcgm_exporter(node, DcgmExporterOptions(collect_interval_s=1))
        writer = ProcfsWriter(node, tmp_path)
        clock.advance(700)  # every process has started
        writer.refresh()
        last_seen_us = round(clock.wall() * 1e6)
        clock.advance(1.0)
        calls = _nvml_tick(len(scenario.gpus), last_seen_us)
        text = exporter.metrics_text()
        writer.refresh()
        # 16 GPUs × 4 calls, 8 MIG GPUs × 7 instances × 2 calls, then one sample per busy time-sliced process
        busy = sum(
            1
            for gpu in range(8, 16)
            for plan in node.truth.running(gpu, node.t_s())
            if node.truth.process_util(plan.pid, node.t_s() - 1.0, node.t_s()) > 0
        )
        assert busy > 0
        assert calls == 16 * 4 + 8 * 7 * 2 + busy
        assert text.count("DCGM_FI_DEV_POWER_USAGE{") == 8 * 7 + 8
        assert len([p for p in tmp_path.joinpath("proc").iterdir() if p.name.isdigit()]) == len(scenario.processes)
