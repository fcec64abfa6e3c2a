"""The agent side: gpu_topology receiver + gpu_placement processor on a simulated node, and their metrics."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.helpers.context import make_context
from tests.topology.matrices import kep_v100
from wattpipe.cli import main
from wattpipe.exporters.prometheus import PrometheusConfig, PrometheusExporter
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceAllocation, DeviceSample
from wattpipe.pipeline.records_topology import GpuLink
from wattpipe.processors.topology import PlacementConfig, PlacementProcessor

ROOT = Path(__file__).resolve().parents[2]
T = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)


def kep_batch(**fields: object) -> Batch:
    topology = kep_v100()
    devices = tuple(
        DeviceSample(time=T, device_id=uuid, device_index=index, mig_enabled=False)
        for index, uuid in enumerate(topology.uuids)
    )
    links = tuple(
        GpuLink(time=T, gpu_a=lk.a, gpu_b=lk.b, link=lk.name, pcie=lk.pcie, nvlinks=lk.nvlinks, score=lk.score)
        for lk in topology.links
    )
    batch = Batch(time=T, interval_s=5.0, node="v100-node-1")
    return batch.replace(devices=devices, gpu_links=links, **fields)


def placement(assume_free: bool = False) -> PlacementProcessor:
    return PlacementProcessor(PlacementConfig(assume_free=assume_free), make_context("gpu_placement"))


def allocated(*uuids: str) -> tuple[DeviceAllocation, ...]:
    return tuple(
        DeviceAllocation(
            time=T, device_id=u, resource_name="nvidia.com/gpu", pod_name="p", pod_namespace="ml", container_name="c"
        )
        for u in uuids
    )


def scores(batch: Batch) -> dict[int, tuple[int | None, str | None, int]]:
    return {r.size: (r.score, r.gpus, r.free_gpus) for r in batch.gpu_set_scores}


def test_set_scores_follow_the_free_gpus() -> None:
    out = placement().process(kep_batch(allocations=allocated("GPU-2", "GPU-3")))
    result = scores(out)
    assert sorted(result) == list(range(1, 9))
    assert result[2] == (250, "6,7", 6)  # 2-3 (PIX + NV2) is taken; 6-7 is its twin on the other socket
    assert result[7] == (None, None, 6)
    assert "gpu_set_scores" in out.present


def test_without_allocations_nobody_knows_which_gpus_are_free() -> None:
    assert placement().process(kep_batch()).gpu_set_scores == ()
    everything = scores(placement(assume_free=True).process(kep_batch()))
    assert everything[2] == (250, "2,3", 8)
    assert everything[8][0] is not None


def test_a_gpu_in_mig_mode_is_not_free() -> None:
    batch = kep_batch(allocations=())
    devices = tuple(
        d if d.device_index != 3 else DeviceSample(time=T, device_id="GPU-3", device_index=3, mig_enabled=True)
        for d in batch.devices
    )
    result = scores(placement().process(batch.replace(devices=devices)))
    assert result[1][2] == 7
    assert "3" not in (result[2][1] or "").split(",")


def test_a_missing_gpu_leaves_the_scores_out() -> None:
    batch = kep_batch(allocations=())
    out = placement().process(batch.replace(devices=batch.devices[:-1]))
    assert out.gpu_set_scores == ()


def test_metrics_render_link_set_and_free_families() -> None:
    out = placement().process(kep_batch(allocations=allocated("GPU-2", "GPU-6")))
    exporter = PrometheusExporter(PrometheusConfig(listen="127.0.0.1:0"), make_context("prometheus", "exporter"))
    exporter.render(out)
    text = exporter.body.decode()
    assert 'wattpipe_gpu_link_score{gpu_a="0",gpu_b="1",link="NV1",node_name="n1"} 150.0\n' in text
    assert 'wattpipe_gpu_link_score{gpu_a="0",gpu_b="6",link="SYS",node_name="n1"} 10.0\n' in text
    assert text.count("wattpipe_gpu_link_score{") == 28
    assert 'wattpipe_node_gpu_set_score{node_name="n1",size="4"} 780.0\n' in text  # 2 and 6 taken (1080 free)
    assert 'size="7"' not in text  # 6 free: no set of 7, no series
    assert 'wattpipe_node_gpus_free{node_name="n1"} 6.0\n' in text


def test_simulated_agent_publishes_what_wattpipe_topology_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = str(ROOT / "configs" / "scenarios" / "topo-v100-cube-mesh-busy.yaml")
    out, err = io.StringIO(), io.StringIO()
    args = ["simulate", "--scenario", scenario, "-c", str(ROOT / "tests" / "topology" / "configs" / "agent.yaml")]
    code = main([*args, "--duration", "10s", "--log-level", "error"], out, err)
    assert code == 0, err.getvalue()
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    last_time = max(r["time"] for r in records)
    sets = {
        int(r["attributes"]["size"]): r["values"]
        for r in records
        if r["type"] == "GpuSetScore" and r["time"] == last_time
    }
    links = [r for r in records if r["type"] == "GpuLink" and r["time"] == last_time]
    assert len(links) == 28
    printed = io.StringIO()
    assert main(["topology", "--scenario", scenario, "--json"], printed, io.StringIO()) == 0
    expected = json.loads(printed.getvalue())["best_sets"]
    assert {s["size"]: s["score"] for s in expected} == {size: v["score"] for size, v in sets.items() if "score" in v}
    assert {v["free_gpus"] for v in sets.values()} == {6}
    assert "score" not in sets[7]


def test_receiver_without_nvml_reports_no_pairs_or_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import pynvml

    from wattpipe.receivers.nvml.topology import TopologyConfig, TopologyReceiver

    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    receiver = TopologyReceiver(TopologyConfig(), make_context("gpu_topology", "receiver"))
    asyncio.run(receiver.start())
    assert asyncio.run(receiver.collect()) == ()
    required = TopologyReceiver(TopologyConfig(required=True), make_context("gpu_topology", "receiver"))
    with pytest.raises(RuntimeError, match="NVML is not available and gpu_topology is required"):
        asyncio.run(required.start())


def test_topology_node_flag_reads_whatever_nvml_is_loaded() -> None:
    from wattpipe import simulator
    from wattpipe.pipeline.clock import SteppedClock

    simulator.install(ROOT / "configs" / "scenarios" / "topo-two-socket.yaml", SteppedClock())
    try:
        out = io.StringIO()
        assert main(["topology", "--node", "--json"], out, io.StringIO()) == 0
    finally:
        simulator.uninstall()
    doc = json.loads(out.getvalue())
    assert len(doc["gpus"]) == 4
    assert doc["best_sets"][1] == {"size": 2, "gpus": [0, 1], "score": 1250}  # --node: every GPU counted free


def test_topology_node_flag_asks_the_kubelet_given(tmp_path: Path) -> None:
    from wattpipe import simulator
    from wattpipe.pipeline.clock import SteppedClock

    node = simulator.install(ROOT / "configs" / "scenarios" / "topo-v100-cube-mesh-busy.yaml", SteppedClock())
    try:
        kubelet = simulator.start_kubelet(node, socket_dir=tmp_path / "pod-resources")
        out, err = io.StringIO(), io.StringIO()
        assert main(["topology", "--node", "--podresources", kubelet.endpoint], out, err) == 0, err.getvalue()
    finally:
        simulator.uninstall()
    assert "Free GPUs: 0, 1, 3, 4, 5, 7 (6 of 8)" in out.getvalue()
    err = io.StringIO()
    assert main(["topology", "--podresources", "unix:///x.sock"], io.StringIO(), err) == 2
    assert "--podresources goes with --node" in err.getvalue()
