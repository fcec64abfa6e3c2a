"""Pods end to end on a simulated node: exclusive, time-sliced replicas and MIG, with a kubelet outage.

`wattpipe simulate` serves every face of the node (NVML, dcgm-exporter, kubelet, API server, /proc); the
pipeline's own pod totals (nvml, dcgm, podresources, procfs → idle → attribution → k8s → energy) are
compared with the simulator's ground truth.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest
import yaml

from wattpipe import simulator
from wattpipe.cli import main
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.scenario import parse_scenario

# Processes start after 10 s, so idle power is learned first. Per GPU, processes draw the same power per
# unit of utilisation (per compute slice on the MIG GPU), so the split methods are exact in principle.
SCENARIO: dict[str, Any] = {
    "node": {"name": "pods-node"},
    "gpus": [
        {"model": "NVIDIA A100-SXM4-80GB", "idle_w": 55, "max_w": 400, "compute_mode": "exclusive_process"},
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 72, "max_w": 700},
        {
            "model": "NVIDIA H100 80GB HBM3",
            "idle_w": 70,
            "max_w": 700,
            "mig": {"instances": [{"gi": 1, "profile": "3g.40gb"}, {"gi": 2, "profile": "1g.10gb"}]},
        },
    ],
    "pods": [
        {"name": "batch-7", "namespace": "ml", "containers": [{"name": "job", "devices": [{"gpu": 0}]}]},
        {
            "name": "trainer-0",
            "namespace": "ml",
            "containers": [{"name": "main", "devices": [{"resource": "nvidia.com/gpu.shared", "gpu": 1, "replica": 0}]}],
        },
        {
            "name": "nb-1",
            "namespace": "research",
            "containers": [{"name": "jupyter", "devices": [{"resource": "nvidia.com/gpu.shared", "gpu": 1, "replica": 1}]}],
        },
        {
            "name": "serve-a",
            "namespace": "serving",
            "containers": [{"name": "server", "devices": [{"resource": "nvidia.com/mig-3g.40gb", "gpu": 2, "gi": 1}]}],
        },
        {
            "name": "serve-b",
            "namespace": "serving",
            "containers": [{"name": "server", "devices": [{"resource": "nvidia.com/mig-1g.10gb", "gpu": 2, "gi": 2}]}],
        },
    ],
    "processes": [
        {"pid": 601, "comm": "train.py", "container": "ml/batch-7/job", "gpu": 0, "dynamic_w": 300,
         "util": [[0, 0.9], [47, 0.5]], "start_s": 10},
        {"pid": 401, "comm": "python", "container": "ml/trainer-0/main", "gpu": 1, "dynamic_w": 400,
         "util": [[0, 0.6], [33, 0.3]], "start_s": 12},
        {"pid": 402, "comm": "python", "container": "research/nb-1/jupyter", "gpu": 1, "dynamic_w": 400,
         "util": [[0, 0.2], [71, 0.5]], "start_s": 14},
        {"pid": 501, "comm": "serve", "container": "serving/serve-a/server", "gpu": 2, "gi": 1, "dynamic_w": 150,
         "util": [[0, 0.7]], "start_s": 10},
        {"pid": 502, "comm": "serve", "container": "serving/serve-b/server", "gpu": 2, "gi": 2, "dynamic_w": 50,
         "util": [[0, 1.0]], "start_s": 10},
    ],
    "faults": [{"at_s": 60, "for_s": 20, "target": "kubelet", "kind": "down"}],
}  # fmt: skip

PIPELINE = """
receivers:
  nvml: {required: true}
  dcgm: {endpoint: "${env:WATTPIPE_DCGM_ENDPOINT}"}
  podresources:
    endpoint: "${env:WATTPIPE_PODRESOURCES_ENDPOINT}"
    extra_resources: [nvidia.com/gpu.shared]
  procfs: {root: "${env:WATTPIPE_PROC_ROOT}"}
processors:
  idle:
  attribution:
  k8s:
  energy: {terminated_retention: 1h}
exporters:
  console: {format: json, kinds: [totals]}
service:
  telemetry: {listen: ""}
  pipelines:
    metrics:
      interval: 5s
      receivers: [nvml, dcgm, podresources, procfs]
      processors: [idle, attribution, k8s, energy]
      exporters: [console]
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("pods")
    (tmp / "node.yaml").write_text(yaml.safe_dump(SCENARIO))
    (tmp / "wattpipe.pipeline.yaml").write_text(PIPELINE)
    out, err, logs = io.StringIO(), io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(logs):
        code = main(
            ["simulate", "--scenario", str(tmp / "node.yaml"), "-c", str(tmp / "wattpipe.pipeline.yaml"), "--duration", "150s",
             "--log-level", "warning"],
            out,
            err,
        )  # fmt: skip
    assert code == 0, err.getvalue()
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    # The truth of the same scenario, at the same node time (the run's last tick is at 150 s).
    node = simulator.build(parse_scenario(SCENARIO), SteppedClock())
    return {"lines": lines, "truth": node.truth, "err": err.getvalue(), "logs": logs.getvalue()}


def pod_totals_by_tick(lines: list[dict[str, Any]]) -> dict[float, dict[str, int]]:
    ticks: dict[float, dict[str, int]] = {}
    for r in lines:
        if r["type"] == "Totals" and r["attributes"]["scope"] == "pod":
            name = f"{r['attributes'].get('pod_namespace')}/{r['attributes'].get('pod_name')}"
            per = ticks.setdefault(r["time"], {})
            per[name] = per.get(name, 0) + r["values"]["energy_mj"]  # summed over the pod's GPUs
    return ticks


def test_every_pod_is_named_and_within_3_percent_of_truth(run: dict[str, Any]) -> None:
    ticks = pod_totals_by_tick(run["lines"])
    last = ticks[max(ticks)]
    assert set(last) == {"ml/batch-7", "ml/trainer-0", "research/nb-1", "serving/serve-a", "serving/serve-b"}
    for name, mj in last.items():
        namespace, pod = name.split("/")
        true_j = run["truth"].pod_energy_j(namespace, pod, 150.0)
        assert mj / 1000 == pytest.approx(true_j, rel=0.03), name


def test_a_kubelet_outage_does_not_crash_and_pod_totals_never_go_backwards(run: dict[str, Any]) -> None:
    assert "receiver podresources failed: PodResourcesUnavailable" in run["logs"]  # seen, logged
    ticks = pod_totals_by_tick(run["lines"])
    seen: dict[str, int] = {}
    for t in sorted(ticks):
        for name, mj in ticks[t].items():
            assert mj >= seen.get(name, 0), (t, name)
            seen[name] = mj
    assert len(ticks) >= 28  # every tick produced totals, through the outage
