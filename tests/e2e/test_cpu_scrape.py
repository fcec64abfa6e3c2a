"""The CPU families on a real scrape (issue 17): configs/scenarios/cpu.yaml's node, the real rapl and procfs
receivers reading its /sys and /proc, GPU and CPU attribution in one pipeline, the Prometheus exporter on
loopback in both namings. CPU series come out under Kepler's CPU names and labels, and never under a GPU name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.scrape import Samples, run_and_scrape
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.fake_host import ProcfsWriter

SCENARIO = Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "cpu.yaml"
PIPELINE = """
receivers:
  nvml: {required: true}
  procfs: {root: "ROOT/proc"}
  rapl: {root: "ROOT/sys"}
processors:
  idle:
  attribution:
  energy:
  cpu_attribution:
exporters:
  prometheus: {listen: "127.0.0.1:0", naming: NAMING}
service:
  telemetry: {listen: ""}
  pipelines:
    metrics: {interval: 5s, receivers: [nvml, procfs, rapl], processors: [idle, attribution, energy, cpu_attribution],
              exporters: [prometheus]}
"""


def scrape(tmp_path: Path, naming: str) -> Samples:
    clock = SteppedClock()
    node = simulator.install(SCENARIO, clock)
    writer = ProcfsWriter(node, tmp_path)
    text = textwrap.dedent(PIPELINE).replace("ROOT", str(tmp_path)).replace("NAMING", naming)
    try:
        _, out = run_and_scrape(text, clock, 14, writer.refresh)  # 0 … 65 s: pid 3002 (61–73 s) is running at the end
    finally:
        simulator.uninstall()
    return out


def test_kepler_cpu_names_and_labels(tmp_path: Path) -> None:
    metrics = scrape(tmp_path, "kepler")
    zones = {(s["zone"], s["path"]) for s, _ in metrics["kepler_node_cpu_joules_total"]}
    assert zones == {("package", "intel-rapl:0"), ("package", "intel-rapl:1"), ("dram", "intel-rapl:0:0"), ("dram", "intel-rapl:1:0")}  # fmt: skip
    for name in ("kepler_node_cpu_watts", "kepler_node_cpu_active_watts", "kepler_node_cpu_idle_watts",
                 "kepler_node_cpu_active_joules_total", "kepler_node_cpu_idle_joules_total"):  # fmt: skip
        assert len(metrics[name]) == 4, name
    vm = [(s, v) for s, v in metrics["kepler_process_cpu_joules_total"] if s["pid"] == "7001"]
    assert {s["zone"] for s, _ in vm} == {"package", "dram"}
    labels = next(s for s, _ in vm if s["zone"] == "package")
    assert labels["vm_id"] == "6f1c2a4e-9b1d-4c1e-8a53-2b7f0d9e4c11"
    assert (labels["type"], labels["comm"], labels["state"], labels["node_name"]) == ("vm", "qemu-system-x86", "running", "cpu-node")  # fmt: skip
    assert all(v > 0 for _, v in vm)
    vms = {(s["vm_id"], s["vm_name"], s["hypervisor"], s["zone"]) for s, _ in metrics["kepler_vm_cpu_joules_total"]}
    vm_id = "6f1c2a4e-9b1d-4c1e-8a53-2b7f0d9e4c11"
    assert vms == {(vm_id, "db-vm", "kvm", "package"), (vm_id, "db-vm", "kvm", "dram")}
    vm_j = {s["zone"]: v for s, v in metrics["kepler_vm_cpu_joules_total"]}
    assert vm_j == {s["zone"]: v for s, v in vm}  # the VM is the sum of its (one) process
    assert "wattpipe_gpu_instance_joules_total" not in metrics  # no MIG here, and VMs are not MIG instances
    containers = {s["container_id"] for s, _ in metrics["kepler_container_cpu_joules_total"]}
    assert len(containers) == 3  # nginx, app, worker
    assert {s["zone"] for s, _ in metrics["kepler_pod_cpu_watts"]} == {"package", "dram"}
    # The GPU families carry GPU series only: pid 2201 (on the GPU and the CPU) is in both, apart.
    assert {s["gpu_uuid"][:4] for s, _ in metrics["kepler_process_gpu_joules_total"]} == {"GPU-"}
    assert any(s["pid"] == "2201" for s, _ in metrics["kepler_process_cpu_joules_total"])


@pytest.mark.parametrize("naming", ["otel"])
def test_otel_names(tmp_path: Path, naming: str) -> None:
    metrics = scrape(tmp_path, naming)
    assert {s["wattpipe_cpu_zone"] for s, _ in metrics["wattpipe_cpu_energy_joules_total"]} == {"package", "dram"}
    assert any(s["process_pid"] == "7001" for s, _ in metrics["wattpipe_process_cpu_energy_joules_total"])


def test_a_process_read_as_runcs_init_is_labelled_by_what_it_execd(tmp_path: Path) -> None:
    # pid 3001 is runc:[2:INIT] at the 40 s tick and spark from 43 s: its series carry spark, none runc's.
    metrics = scrape(tmp_path, "kepler")
    for family in ("kepler_process_cpu_joules_total", "kepler_process_cpu_seconds_total"):
        comms = {s["comm"] for s, _ in metrics[family] if s["pid"] == "3001"}
        assert comms == {"spark"}, family
    assert not [s for name, series in metrics.items() for s, _ in series if s.get("comm") == "runc:[2:INIT]"]
