"""Kepler's node CPU metrics beside the energy ones (issue 17): ``kepler_node_cpu_usage_ratio`` against the
simulator's truth on configs/scenarios/cpu.yaml, ``kepler_node_cpu_info`` from a /proc/cpuinfo in the simulated
tree, ``kepler_process_cpu_seconds_total`` against each process's true CPU time; a real scrape in both namings."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.context import make_context
from tests.helpers.scrape import Samples, run_and_scrape
from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import NodeCpuTime
from wattpipe.processors.cpu_attribution import CpuAttributionConfig, CpuAttributionProcessor
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.node import SimulatedNode

SCENARIO = Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "cpu.yaml"
PIPELINE = """
receivers:
  procfs: {root: "ROOT/proc"}
  rapl: {root: "ROOT/sys"}
processors:
  cpu_attribution:
exporters:
  prometheus: {listen: "127.0.0.1:0", naming: NAMING}
service:
  telemetry: {listen: ""}
  pipelines:
    metrics: {interval: 5s, receivers: [procfs, rapl], processors: [cpu_attribution], exporters: [prometheus]}
"""
CPUINFO = "".join(
    f"processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Sim Xeon\nphysical id\t: {n // 32}\n"
    f"core id\t\t: {n % 32}\n\n"
    for n in range(64)
)


def run(tmp_path: Path, naming: str, ticks: int = 14) -> tuple[list[Batch], Samples, SimulatedNode]:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(CPUINFO)
    clock = SteppedClock()
    node = simulator.install(SCENARIO, clock)
    writer = ProcfsWriter(node, tmp_path)
    text = textwrap.dedent(PIPELINE).replace("ROOT", str(tmp_path)).replace("NAMING", naming)
    try:  # 0 … 65 s: pid 3002 (61–73 s) starts inside the last tick
        batches, out = run_and_scrape(text, clock, ticks, writer.refresh)
    finally:
        simulator.uninstall()
    return batches, out, node


def test_usage_ratio_is_the_simulators_busy_share_each_tick(tmp_path: Path) -> None:
    batches, metrics, node = run(tmp_path, "kepler")
    cores = node.scenario.cpu.cores
    ratios = [b.node_cpu[0].usage_ratio for b in batches]
    assert ratios[0] is None  # no previous reading: no ratio, and no series
    for tick, ratio in enumerate(ratios[1:], start=1):
        t0, t1 = (tick - 1) * 5.0, tick * 5.0
        truth = (node.truth.cpu_busy_core_s(t1) - node.truth.cpu_busy_core_s(t0)) / ((t1 - t0) * cores)
        assert ratio == pytest.approx(truth, abs=1e-3), tick  # /proc/stat's whole ticks: ≤ 2 in 16,000
    assert min(r for r in ratios[1:] if r is not None) < max(r for r in ratios[1:] if r is not None)  # it moves
    (series,) = metrics["kepler_node_cpu_usage_ratio"]
    assert series == ({"node_name": "cpu-node"}, pytest.approx(ratios[-1], abs=1e-12))
    # The ratio the energy was split by: active = Δ × ratio per zone (to the millijoule's rounding).
    for power in batches[-1].device_power:
        assert power.active_energy_mj == pytest.approx(power.energy_mj * ratios[-1], abs=1)


def test_cpu_info_and_process_cpu_seconds_on_a_kepler_scrape(tmp_path: Path) -> None:
    _, metrics, node = run(tmp_path, "kepler")
    info = metrics["kepler_node_cpu_info"]
    assert len(info) == 64
    assert all(v == 1.0 for _, v in info)
    assert info[33][0] == {
        "processor": "33",
        "vendor_id": "GenuineIntel",
        "model_name": "Sim Xeon",
        "physical_id": "1",
        "core_id": "1",
        "node_name": "cpu-node",
    }
    seconds = {s["pid"]: (s, v) for s, v in metrics["kepler_process_cpu_seconds_total"]}
    t_s = 65.0  # the last tick's reading
    for pid in (900, 2101, 3002, 7001):
        assert seconds[str(pid)][1] == pytest.approx(node.truth.process_cpu_s(pid, t_s), abs=0.011), pid
    vm, _ = seconds["7001"]
    assert vm == {
        "pid": "7001",
        "comm": "qemu-system-x86",
        "type": "vm",
        "vm_id": "6f1c2a4e-9b1d-4c1e-8a53-2b7f0d9e4c11",
        "node_name": "cpu-node",
    } | ({"exe": vm["exe"]} if "exe" in vm else {})
    assert seconds["2101"][0]["type"] == "container"
    assert seconds["900"][0]["type"] == "regular"
    assert "state" not in vm
    assert "zone" not in vm


def test_otel_names(tmp_path: Path) -> None:
    _, metrics, _ = run(tmp_path, "otel", ticks=3)
    ((labels, ratio),) = metrics["system_cpu_utilization"]
    assert 0.0 < ratio < 1.0
    assert labels == {"k8s_node_name": "cpu-node"}
    info = {s["cpu_logical_number"]: s for s, _ in metrics["wattpipe_cpu_info"]}
    assert info["63"]["host_cpu_vendor_id"] == "GenuineIntel"
    assert info["63"]["host_cpu_model_name"] == "Sim Xeon"
    assert (info["63"]["wattpipe_cpu_physical_id"], info["63"]["wattpipe_cpu_core_id"]) == ("1", "31")
    pids = {s["process_pid"]: s for s, _ in metrics["process_cpu_time_seconds_total"]}
    assert pids["7001"]["wattpipe_process_type"] == "vm"


def test_the_ratio_is_set_without_rapl_and_absent_while_proc_stat_stands_still() -> None:
    clock = SteppedClock()
    proc = CpuAttributionProcessor(CpuAttributionConfig(), make_context("cpu_attribution", clock=clock))
    readings = [(1000.0, 250.0), (1040.0, 280.0), (1040.0, 280.0), (1080.0, 280.0), (1120.0, 330.0)]
    ratios = []
    for total_s, active_s in readings:  # a GPU node without RAPL: no cpu_zones, only /proc/stat
        node = NodeCpuTime(time=clock.now(), total_s=total_s, active_s=active_s)
        out = proc.process(Batch(time=clock.now(), interval_s=5.0, node="n").with_records([node]))
        (after,) = out.node_cpu
        assert (after.total_s, after.active_s) == (total_s, active_s)
        ratios.append(after.usage_ratio)
        clock.advance(5.0)
    # first tick: no previous reading; third: /proc/stat did not advance (no ratio, not 0); then 0 and 1.25 → 1
    assert ratios == [None, 0.75, None, 0.0, 1.0]
