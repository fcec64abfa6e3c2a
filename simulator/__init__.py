"""A GPU node in software: one ground truth, served through every real interface.

    clock = SteppedClock()
    with simulator.install("configs/scenarios/mig.yaml", clock) as node:
        pynvml.nvmlInit()                      # pynvml's own code, talking to the simulated driver
        exporter = start_dcgm_exporter(node)   # a dcgm-exporter on 127.0.0.1
        clock.advance(5.0)                     # every face moves together
        node.truth.device_energy_j(0, node.t_s())

See docs/simulator.md for the scenario schema and each face's behaviour.
"""

from __future__ import annotations

from pathlib import Path

from wattpipe.pipeline.clock import Clock
from wattpipe.simulator.dcgm_server import DcgmExporter, DcgmExporterOptions, start_dcgm_exporter
from wattpipe.simulator.fake_host import ProcfsWriter, cgroup_path
from wattpipe.simulator.fake_nvml import SimulatedNvmlLibrary, install_nvml, installed_node, mig_uuid, uninstall_nvml
from wattpipe.simulator.k8sapi import K8sApiOptions, K8sApiServer, container_id, start_k8s_api
from wattpipe.simulator.kubelet import KUBELET_RATE_LIMIT, KubeletServer, RateLimit, start_kubelet
from wattpipe.simulator.node import SimulatedNode, build
from wattpipe.simulator.scale import scale_scenario
from wattpipe.simulator.scenario import Scenario, ScenarioError, load_scenario, parse_scenario
from wattpipe.simulator.truth import GpuState, GroundTruth, ProcessPlan

__all__ = [
    "KUBELET_RATE_LIMIT",
    "DcgmExporter",
    "DcgmExporterOptions",
    "GpuState",
    "GroundTruth",
    "K8sApiOptions",
    "K8sApiServer",
    "KubeletServer",
    "ProcessPlan",
    "ProcfsWriter",
    "RateLimit",
    "Scenario",
    "ScenarioError",
    "SimulatedNode",
    "SimulatedNvmlLibrary",
    "build",
    "cgroup_path",
    "container_id",
    "install",
    "installed_node",
    "load_scenario",
    "mig_uuid",
    "parse_scenario",
    "scale_scenario",
    "start_dcgm_exporter",
    "start_k8s_api",
    "start_kubelet",
    "uninstall",
]


def install(scenario: Scenario | str | Path, clock: Clock) -> SimulatedNode:
    """Build a node and install its NVML library as ``pynvml.nvmlLib``.

    Scenario time 0 is now. Closing the node (or leaving its ``with`` block) uninstalls it too.
    """
    node = build(scenario, clock)
    install_nvml(node)

    def uninstall_if_still_ours() -> None:
        if installed_node() is node:
            uninstall_nvml()

    node.on_close(uninstall_if_still_ours)
    return node


def uninstall() -> None:
    """Restore pynvml's previous library and close the installed node's faces (no-op if none)."""
    node = uninstall_nvml()
    if node is not None:
        node.close()
