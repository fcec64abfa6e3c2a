from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.simulator.conftest import SCENARIOS, two_gpu_data
from wattpipe.simulator.scenario import ScenarioError, load_scenario, parse_scenario


def test_example_scenarios_load() -> None:
    timesliced = load_scenario(SCENARIOS / "timesliced.yaml")
    mig = load_scenario(SCENARIOS / "mig.yaml")
    assert [g.model for g in timesliced.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert timesliced.gpus[0].mig is None
    assert mig.gpus[0].mig is not None
    assert sorted(i.slices for i in mig.gpus[0].mig.instances) == [1, 1, 2, 3]


def test_defaults_are_deterministic_and_well_formed(two_gpu: object) -> None:
    first = parse_scenario(two_gpu_data())
    second = parse_scenario(two_gpu_data())
    assert [g.uuid for g in first.gpus] == [g.uuid for g in second.gpus]
    assert first.gpus[0].uuid != first.gpus[1].uuid
    for gpu in first.gpus:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", gpu.uuid)
    container = first.pods[0].containers[0]
    assert re.fullmatch(r"[0-9a-f]{64}", container.id)
    assert container.id == second.pods[0].containers[0].id
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", first.pods[0].uid)


def test_a_different_node_name_gives_different_uuids() -> None:
    data = two_gpu_data()
    data["node"]["name"] = "other-node"
    assert parse_scenario(data).gpus[0].uuid != parse_scenario(two_gpu_data()).gpus[0].uuid


def test_architecture_decides_energy_counter_and_memory() -> None:
    data = {"gpus": [{"model": "Tesla P100-PCIE-16GB", "idle_w": 30, "max_w": 250},
                     {"model": "Tesla V100-SXM2-32GB", "idle_w": 40, "max_w": 300},
                     {"model": "Tesla P100-PCIE-16GB", "idle_w": 30, "max_w": 250, "energy_counter": True}]}  # fmt: skip
    gpus = parse_scenario(data).gpus
    assert [g.energy_counter for g in gpus] == [False, True, True]
    assert gpus[1].memory_mib == 32_000


def test_unknown_key_is_named_with_its_path() -> None:
    data = two_gpu_data()
    data["gpus"][1]["idle_watts"] = 3
    with pytest.raises(ScenarioError, match=r"gpus\.1\.idle_watts: unknown key; did you mean .idle_w.\?"):
        parse_scenario(data)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["processes"][0].update(gpu=7), r"processes\.0 \(pid 100\)\.gpu: no GPU 7"),
        (lambda d: d["processes"][2].update(gi=5), r"GPU 1 has no GPU instance 5"),
        (lambda d: d["processes"][2].pop("gi"), r"GPU 1 is in MIG mode at start_s"),
        (lambda d: d["processes"][1].update(pid=100), r"duplicate pid"),
        (lambda d: d["processes"][0].update(container="ml/nope/main"), r"no container 'ml/nope/main'"),
        (lambda d: d["processes"][0].update(util=[[5, 0.5], [1, 0.2]]), r"strictly increasing"),
        (lambda d: d["gpus"][0].update(mig={"instances": []}) or d["gpus"][0].update(model="Tesla T4"),
         r"cannot do MIG"),
        (lambda d: d["gpus"][1]["mig"]["instances"].append({"gi": 3, "profile": "4g.20gb"}), r"instances use 8 compute slices"),
        (lambda d: d["pods"][1]["containers"][0]["devices"][0].update(resource="nvidia.com/mig-2g.10gb"),
         r"does not match the instance's 'nvidia.com/mig-1g.5gb'"),
        (lambda d: d.update(faults=[{"target": "nvml", "at_s": 1, "call": "nvmlDeviceFly", "error": "UNKNOWN"}]),
         r"faults\.0\.nvml\.call"),
        (lambda d: d.update(faults=[{"target": "dcgm", "at_s": 1, "kind": "melted"}]), r"faults\.0\.dcgm\.kind"),
        (lambda d: d.update(faults=[{"target": "gpu", "at_s": 1, "gpu": 0, "set": {}}]), r"name at least one"),
    ],
)  # fmt: skip
def test_invalid_scenarios_are_refused_with_the_reason(change: object, message: str) -> None:
    data = two_gpu_data()
    change(data)  # type: ignore[operator]
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data)


def test_nvml_fault_accepts_python_wrapper_names_and_error_spellings() -> None:
    data = two_gpu_data()
    data["faults"] = [{"target": "nvml", "at_s": 1, "gpu": 0, "call": "nvmlDeviceGetComputeRunningProcesses",
                       "error": "nvml_error_gpu_is_lost"}]  # fmt: skip
    fault = parse_scenario(data).faults[0]
    assert fault.call == "nvmlDeviceGetComputeRunningProcesses_v3"  # type: ignore[union-attr]
    assert fault.code == 15  # type: ignore[union-attr]


def test_mig_reconfiguration_is_visible_by_time() -> None:
    data = two_gpu_data()
    data["faults"] = [{"target": "gpu", "at_s": 90, "gpu": 1, "set": {"mig": None}}]
    scenario = parse_scenario(data)
    assert scenario.mig_at(1, 89.9) is not None
    assert scenario.mig_at(1, 90) is None


def test_load_reports_yaml_errors_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("gpus: [\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml:\d+: not valid YAML"):
        load_scenario(path)


def test_public_surface_is_explicit() -> None:
    from wattpipe import simulator

    assert sorted(simulator.__all__) == sorted(
        ["KUBELET_RATE_LIMIT", "KubeletServer", "RateLimit", "start_kubelet",
         "K8sApiOptions", "K8sApiServer", "container_id", "start_k8s_api",
         "DcgmExporter", "DcgmExporterOptions", "GpuState", "GroundTruth", "ProcessPlan", "ProcfsWriter",
         "Scenario", "ScenarioError", "SimulatedNode", "SimulatedNvmlLibrary", "build", "cgroup_path", "install",
         "installed_node", "load_scenario", "mig_uuid", "parse_scenario", "scale_scenario", "start_dcgm_exporter",
         "uninstall"]
    )  # fmt: skip
    assert all(hasattr(simulator, name) for name in simulator.__all__)


def test_simulator_imports_no_pipeline_components() -> None:
    source = "\n".join(p.read_text() for p in (Path(__file__).parents[2] / "simulator").glob("*.py"))
    for package in ("receivers", "processors", "exporters", "cli", "steps", "simulated"):
        assert not re.search(rf"^\s*(from|import) wattpipe\.{package}\b", source, re.MULTILINE), package
        assert not re.search(rf"^\s*from wattpipe import .*\b{package}\b", source, re.MULTILINE), package


def test_a_file_that_is_no_scenario_is_one_line_that_does_not_echo_it(tmp_path: Path) -> None:
    # `wattpipe demo --scenario /etc/shadow` printed each of its lines back ("shadow:1 root:…: unknown key").
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:secret-ish:\ndaemon:x:1:1::\nbin:x:2:2::\n")
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    assert raised.value.messages == [
        f"{path}: not a scenario: none of its 3 top-level keys is one a scenario has (node, gpus, pods, processes, …)"
    ]


def test_a_scenario_with_a_misspelt_key_still_gets_its_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("gpu: []\n")
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    assert any("gpu: unknown key; did you mean 'gpus'?" in m for m in raised.value.messages), raised.value.messages
