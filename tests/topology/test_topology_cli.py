"""`wattpipe topology` on the shipped topology scenarios: the matrix, the JSON contract, the KEP's story."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from wattpipe.cli import main
from wattpipe.pipeline.topology import normalise

SCENARIOS = Path(__file__).resolve().parents[2] / "configs" / "scenarios"


def topology(scenario: str, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["topology", "--scenario", str(SCENARIOS / scenario), *extra], out, err)
    return code, out.getvalue(), err.getvalue()


def as_json(scenario: str) -> dict[str, Any]:
    code, out, err = topology(scenario, "--json")
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def pair(doc: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    return next(link for link in doc["links"] if (link["a"], link["b"]) == (a, b))


def best(doc: dict[str, Any], size: int) -> dict[str, Any]:
    return next(s for s in doc["best_sets"] if s["size"] == size)


def test_json_has_exactly_the_contracted_keys() -> None:
    doc = as_json("topo-v100-cube-mesh.yaml")
    assert set(doc) == {"gpus", "links", "best_sets"}
    assert [set(g) for g in doc["gpus"]] == [{"index", "uuid"}] * 8
    assert all(set(link) == {"a", "b", "link", "nvlinks", "score"} for link in doc["links"])
    assert len(doc["links"]) == 28
    assert [s["size"] for s in doc["best_sets"]] == list(range(1, 9))
    assert all(set(s) == {"size", "gpus", "score"} for s in doc["best_sets"])
    assert doc["gpus"][0]["uuid"].startswith("GPU-")


def test_text_matrix_reads_like_nvidia_smi() -> None:
    code, out, _ = topology("topo-v100-cube-mesh.yaml")
    assert code == 0
    rows = out.splitlines()
    assert rows[0].split() == [f"GPU{i}" for i in range(8)]
    assert rows[1].split() == ["GPU0", "X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert rows[8].split() == ["GPU7", "SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"]
    assert "Free GPUs: 0, 1, 2, 3, 4, 5, 6, 7 (8 of 8)" in out
    assert "     2    250  2, 3" in out


def test_kep_story_on_the_simulated_v100_node() -> None:
    doc = as_json("topo-v100-cube-mesh.yaml")
    assert pair(doc, 0, 1)["score"] > pair(doc, 0, 6)["score"]
    assert (pair(doc, 0, 1)["link"], pair(doc, 0, 6)["link"]) == ("NV1", "SYS")
    two = best(doc, 2)
    assert pair(doc, *two["gpus"])["nvlinks"] == 2
    pcie = as_json("topo-pcie-only.yaml")
    assert all(link["nvlinks"] == 0 for link in pcie["links"])
    raw = {"node-1": best(doc, 2)["score"], "node-2": best(pcie, 2)["score"]}
    assert raw == {"node-1": 250, "node-2": 50}
    assert normalise(raw) == {"node-1": 10, "node-2": 1}


def test_nvswitch_board_scores_every_pair_full_nvlink() -> None:
    doc = as_json("topo-h100-nvswitch.yaml")
    assert {(link["link"], link["nvlinks"]) for link in doc["links"]} == {("NV18", 18)}
    assert {link["score"] for link in doc["links"]} == {1820, 1810}  # NODE or SYS beneath the NVLinks
    assert best(doc, 8)["score"] == sum(link["score"] for link in doc["links"])


def test_node_whose_best_gpus_are_taken_scores_lower() -> None:
    free, busy = as_json("topo-v100-cube-mesh.yaml"), as_json("topo-v100-cube-mesh-busy.yaml")
    assert [s["size"] for s in busy["best_sets"]] == list(range(1, 7))  # 2 of 8 taken, no padded sets
    assert all(2 not in s["gpus"] and 6 not in s["gpus"] for s in busy["best_sets"])
    for size in (3, 4):
        assert best(busy, size)["score"] < best(free, size)["score"]
    scores = normalise({"free": best(free, 4)["score"], "busy": best(busy, 4)["score"]})
    assert scores["free"] > scores["busy"]


def test_two_socket_node_prefers_the_bridged_pair() -> None:
    doc = as_json("topo-two-socket.yaml")
    assert pair(doc, 0, 1) == {"a": 0, "b": 1, "link": "NV12", "nvlinks": 12, "score": 1250}
    assert pair(doc, 1, 2)["link"] == "SYS"
    assert best(doc, 2) == {"size": 2, "gpus": [0, 1], "score": 1250}


def test_demo_node_has_no_free_gpu() -> None:
    code, out, _ = topology("demo.yaml")
    assert code == 0
    assert "Free GPUs: none (0 of 2)" in out


def test_missing_scenario_is_a_config_error(tmp_path: Path) -> None:
    code, _, err = topology(str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "nope.yaml" in err


@pytest.mark.parametrize("scenario", ["topo-h100-nvswitch.yaml"])
def test_nvml_names_a_switch_at_every_link_end(scenario: str) -> None:
    # What go-gpuallocator counts: remote PCI ids that are GPUs. On NVSwitch that is none.
    import pynvml

    from wattpipe import simulator
    from wattpipe.pipeline.clock import SteppedClock

    node = simulator.install(SCENARIOS / scenario, SteppedClock())
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        gpu_buses = {gpu.pci_bus_id.upper() for gpu in node.scenario.gpus}
        remote = {pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId.upper() for link in range(18)}
        assert remote.isdisjoint(gpu_buses)
        pynvml.nvmlShutdown()
    finally:
        simulator.uninstall()


def test_every_pcie_level_through_nvml_and_its_score() -> None:
    doc = as_json("topo-pcie-levels.yaml")
    row = [(pair(doc, 0, b)["link"], pair(doc, 0, b)["score"]) for b in range(1, 6)]
    assert row == [("PSB", 60), ("PXB", 40), ("PHB", 30), ("NODE", 20), ("SYS", 10)]
    assert best(doc, 3) == {"size": 3, "gpus": [0, 1, 2], "score": 60 + 40 + 40}


def test_scenario_errors_are_said_once_each_as_demo_says_them(tmp_path: Path) -> None:
    # They were "error: scenario nope.yaml: [Errno 2] No such file or directory: 'nope.yaml'" and, for a bad key,
    # "error: scenario X: X:2 gpus.0.bogus: unknown key" (the path twice).
    code, _, err = topology(str(tmp_path / "nope.yaml"))
    assert code == 2
    assert err == f"error: scenario {tmp_path / 'nope.yaml'}: cannot read it: No such file or directory\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text('node: {name: x}\ngpus: [{model: "NVIDIA H100 80GB HBM3", idle_w: 72, max_w: 700, bogus: 1}]\n')
    code, _, err = topology(str(bad))
    assert code == 2
    assert err == f"error: scenario {bad}:2 gpus.0.bogus: unknown key\n"


def test_node_without_an_nvidia_driver_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from wattpipe import topology as topology_module
    from wattpipe.receivers.nvml._errors import NvmlFailure

    def no_driver() -> None:
        raise NvmlFailure("nvmlInit", 12, "NVML Shared Library Not Found")

    monkeypatch.setattr(topology_module, "_read_nvml", no_driver)
    out, err = io.StringIO(), io.StringIO()
    assert main(["topology", "--node"], out, err) == 1
    assert err.getvalue() == (
        "error: reading the GPU topology from NVML: nvmlInit: NVML Shared Library Not Found "
        "(no NVIDIA driver on this node?)\n"
    )
