"""`wattpipe extender` answers kube-scheduler requests (k8s.io/kube-scheduler/extender/v1 JSON) over HTTP.

fixtures/extender_args.json is an ExtenderArgs as kube-scheduler sends it with ``nodeCacheCapable: false`` (the
v1 json names ``pod``, ``nodes``; a full Pod and NodeList), assembled by hand in that shape: no cluster was at
hand to capture one from a running scheduler.
"""

from __future__ import annotations

import copy
import json
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.topology.matrices import kep_v100
from wattpipe.extender import ExtenderError, filter_nodes, gpu_request, make_app, prioritize
from wattpipe.pipeline.httpserver import HttpServer
from wattpipe.pipeline.topology import TopologyError, best_sets
from wattpipe.pipeline.topology_annotation import ANNOTATION, decode, encode
from wattpipe.pipeline.webconfig import load_web_config, serve

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "extender_args.json"


def recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())  # type: ignore[no-any-return]


@pytest.fixture
def extender() -> Iterator[HttpServer]:
    server = HttpServer("127.0.0.1:0", make_app(prefix="/wattpipe"))
    server.start()
    yield server
    server.close()


def test_recorded_filter_request_over_http(extender: HttpServer) -> None:
    response = httpx.post(f"{extender.url}/wattpipe/filter", json=recorded())
    assert response.status_code == 200
    result = response.json()
    assert set(result) == {"nodes", "failedNodes", "error"}  # ExtenderFilterResult's json names
    assert [n["metadata"]["name"] for n in result["nodes"]["items"]] == [
        "v100-node-1",
        "v100-node-2",
        "h100-node-1",
        "cpu-node-9",  # no annotation: unknown, left to the scheduler's own fit check
    ]
    assert result["failedNodes"] == {
        "v100-node-4": f"wattpipe: 2 nvidia.com/gpu requested, 1 free ({ANNOTATION})",
    }
    assert result["error"] == ""


def test_recorded_prioritize_request_over_http(extender: HttpServer) -> None:
    response = httpx.post(f"{extender.url}/wattpipe/prioritize", json=recorded())
    assert response.status_code == 200
    # HostPriorityList: [{"host", "score"}], 0–10. Raw best pairs: H100 NV18 1820, V100 NV2 250, PCIe 50.
    assert response.json() == [
        {"host": "v100-node-1", "score": 2},
        {"host": "v100-node-2", "score": 1},  # the KEP's 50 * 10 / 1800 would truncate this to 0
        {"host": "h100-node-1", "score": 10},
        {"host": "v100-node-4", "score": 0},  # one free GPU: no pair
        {"host": "cpu-node-9", "score": 0},  # unknown
    ]


def test_kep_story_node_1_above_pcie_only_node_2() -> None:
    args = recorded()
    args["nodes"]["items"] = args["nodes"]["items"][:2]
    assert prioritize(args) == [{"host": "v100-node-1", "score": 10}, {"host": "v100-node-2", "score": 1}]


def test_node_names_form_uses_the_lookup() -> None:
    args = recorded()
    annotations = {n["metadata"]["name"]: n["metadata"]["annotations"] for n in args.pop("nodes")["items"]}
    args["nodenames"] = ["v100-node-4", "v100-node-1", "gone"]
    seen: list[list[str]] = []

    def lookup(names: Any) -> dict[str, Any]:
        seen.append(list(names))
        return {name: annotations.get(name) for name in names}

    result = filter_nodes(args, lookup)
    assert result["nodenames"] == ["v100-node-1", "gone"]
    assert set(result["failedNodes"]) == {"v100-node-4"}
    assert prioritize(args, lookup) == [
        {"host": "v100-node-4", "score": 0},
        {"host": "v100-node-1", "score": 10},
        {"host": "gone", "score": 0},
    ]
    assert seen == [["v100-node-4", "v100-node-1", "gone"]] * 2


def test_a_pod_without_gpus_has_no_opinion() -> None:
    args = recorded()
    args["pod"]["spec"]["containers"] = [{"name": "web", "resources": {"limits": {"cpu": "1"}}}]
    assert filter_nodes(args)["failedNodes"] == {}
    assert {p["score"] for p in prioritize(args)} == {0}


def test_gpu_request_sums_containers_and_takes_a_larger_init_container() -> None:
    def pod(containers: list[str | None], init: list[str] | None = None) -> dict[str, Any]:
        def c(n: str | None) -> dict[str, Any]:
            return {"resources": {"limits": {"nvidia.com/gpu": n}} if n else {}}

        return {"spec": {"containers": [c(n) for n in containers], "initContainers": [c(n) for n in init or []]}}

    assert gpu_request(pod(["2", None, "1"])) == 3
    assert gpu_request(pod(["1"], ["4"])) == 4
    assert gpu_request({"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": 2}}}]}}) == 2
    with pytest.raises(ExtenderError, match=r"pod.spec.containers\[0\] nvidia.com/gpu: '1.5'"):
        gpu_request(pod(["1.5"]))


def test_bad_requests_are_400_naming_the_problem(extender: HttpServer) -> None:
    bad = httpx.post(f"{extender.url}/wattpipe/filter", content=b"{not json")
    assert bad.status_code == 400
    assert "/wattpipe/filter" in bad.json()["error"]
    no_nodes = httpx.post(f"{extender.url}/wattpipe/prioritize", json={"pod": {}})
    assert no_nodes.status_code == 400
    assert "'nodes'" in no_nodes.json()["error"]
    assert httpx.get(f"{extender.url}/wattpipe/filter").status_code == 404
    assert httpx.get(f"{extender.url}/healthz").json() == {"status": "ok"}


def test_a_broken_annotation_makes_the_node_unknown() -> None:
    args = recorded()
    args["nodes"]["items"][0]["metadata"]["annotations"][ANNOTATION] = '{"v":1,"n":3,"links":"SYS"}'
    assert prioritize(args)[0] == {"host": "v100-node-1", "score": 0}
    assert "v100-node-1" not in filter_nodes(args)["failedNodes"]


def test_annotation_round_trip_and_errors() -> None:
    topology = kep_v100()
    text = encode(topology, [0, 1, 4], best_sets(topology, [0, 1, 4]))
    node = decode(text)
    assert [(lk.a, lk.b, lk.pcie, lk.nvlinks) for lk in node.topology.links] == [
        (lk.a, lk.b, lk.pcie, lk.nvlinks) for lk in topology.links
    ]
    assert node.free == (0, 1, 4)
    assert node.best == (0, 210, 370)
    assert len(text) < 300
    with pytest.raises(TopologyError, match="node x: 'n' \\(3\\) GPUs do not make the 1 pairs"):
        decode('{"v":1,"n":3,"links":"SYS","free":[],"best":[]}', "node x")
    with pytest.raises(TopologyError, match=r"link 0-1 'NV\+x'"):
        decode('{"v":1,"n":2,"links":"NV+x","free":[],"best":[]}')
    with pytest.raises(TopologyError, match="'free' names a GPU beyond the 2"):
        decode('{"v":1,"n":2,"links":"SYS","free":[2],"best":[]}')


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_extender_over_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=extender",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    config = tmp_path / "web.yaml"
    config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    server = serve("127.0.0.1:0", make_app(), load_web_config(str(config)))
    server.start()
    try:
        assert server.url.startswith("https://")
        verify = ssl.create_default_context(cafile=cert)
        response = httpx.post(f"{server.url}/prioritize", json=recorded(), verify=verify)
        assert response.json()[2] == {"host": "h100-node-1", "score": 10}
    finally:
        server.close()


def test_the_command_serves_until_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "wattpipe", "extender", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = line.split()[2].removesuffix("/filter")
        body = copy.deepcopy(recorded())
        assert httpx.post(f"{url}/filter", json=body).json()["failedNodes"].keys() == {"v100-node-4"}
        process.terminate()
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()


def test_node_cache_without_an_api_server_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from wattpipe.cli import main

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    err = io.StringIO()
    assert main(["extender", "--node-cache", "--listen", "127.0.0.1:0"], io.StringIO(), err) == 2
    assert "no Kubernetes API to look nodes up in" in err.getvalue()
    assert main(["extender", "--listen", "nonsense"], io.StringIO(), err) == 2
    assert "'nonsense' is not host:port" in err.getvalue()


def test_node_names_without_node_cache_say_why_nothing_is_scored(caplog: pytest.LogCaptureFixture) -> None:
    # nodeCacheCapable: true in the scheduler but no --node-cache here: every node is unknown. Say so, each request.
    args = recorded()
    args.pop("nodes")
    args["nodenames"] = ["v100-node-1", "v100-node-4"]
    with caplog.at_level("WARNING", logger="wattpipe.extender"):
        assert prioritize(args) == [{"host": "v100-node-1", "score": 0}, {"host": "v100-node-4", "score": 0}]
        assert filter_nodes(args)["nodenames"] == ["v100-node-1", "v100-node-4"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert all("--node-cache" in w and "nodeCacheCapable" in w for w in warnings)
