"""The simulated Kubernetes API server, called through the real ``kubernetes`` client and plain httpx."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3
from kubernetes import client, config, watch

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.k8sapi import K8sApiOptions, K8sApiServer, container_id, start_k8s_api
from wattpipe.simulator.scenario import Container, hashed_uuid, parse_scenario

NODE = "kube-node"
ON_NODE = f"spec.nodeName={NODE}"
SERVER_ID = "ab" * 32
SERVER_UID = "11111111-2222-3333-4444-555555555555"


def _data(faults: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One pod per runtime; trainer-0 runs 0–30 s, job-7 from 20 s, idle-0 has no processes."""
    return {
        "node": {"name": NODE},
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700}],
        "pods": [
            {"name": "trainer-0", "namespace": "ml",
             "containers": [{"name": "main", "devices": [{"gpu": 0}, {"gpu": 0, "replica": 1}]}]},
            {"name": "server-1", "namespace": "infer", "uid": SERVER_UID, "qos": "guaranteed",
             "containers": [{"name": "server", "id": SERVER_ID, "runtime": "cri-o"}]},
            {"name": "job-7", "namespace": "legacy", "qos": "besteffort",
             "containers": [{"name": "run", "runtime": "docker"}]},
            {"name": "idle-0", "namespace": "ml", "containers": [{"name": "main"}]},
        ],
        "processes": [
            {"pid": 100, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "end_s": 30},
            {"pid": 200, "comm": "server", "container": "infer/server-1/server"},
            {"pid": 300, "comm": "run", "container": "legacy/job-7/run", "start_s": 20},
        ],
        "faults": faults or [],
    }  # fmt: skip


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def node(clock: SteppedClock) -> Iterator[simulator.SimulatedNode]:
    with simulator.build(parse_scenario(_data()), clock) as built:
        yield built


def _v1(api: K8sApiServer, tmp_path: Path) -> client.CoreV1Api:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def _names(pods: Any) -> list[str]:
    return [f"{pod.metadata.namespace}/{pod.metadata.name}" for pod in pods.items]


def test_pods_on_the_node_carry_the_scenarios_identity(node: simulator.SimulatedNode, tmp_path: Path) -> None:
    v1 = _v1(start_k8s_api(node), tmp_path)
    pods = v1.list_pod_for_all_namespaces(field_selector=ON_NODE)
    # etcd key order: namespace, then name.
    assert _names(pods) == ["infer/server-1", "legacy/job-7", "ml/idle-0", "ml/trainer-0"]
    assert pods.metadata.resource_version == "1004"  # four pods created, one resourceVersion each
    by_name = {pod.metadata.name: pod for pod in pods.items}
    server = by_name["server-1"]
    assert server.metadata.uid == SERVER_UID
    assert server.metadata.labels == {"app": "server"}
    assert server.spec.node_name == NODE
    assert server.status.phase == "Running"
    assert server.status.qos_class == "Guaranteed"
    [status] = server.status.container_statuses
    assert (status.name, status.container_id, status.ready, status.restart_count) == (
        "server",
        f"cri-o://{SERVER_ID}",
        True,
        0,
    )
    assert status.image == "registry.sim.local/infer/server:v1"
    trainer = by_name["trainer-0"]
    scenario_trainer = node.scenario.pods[0]
    assert trainer.metadata.uid == scenario_trainer.uid == hashed_uuid("pod", "ml", "trainer-0")
    assert trainer.status.container_statuses[0].container_id == f"containerd://{scenario_trainer.containers[0].id}"
    assert trainer.status.qos_class == "Burstable"
    assert trainer.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
    job = by_name["job-7"]
    assert job.status.container_statuses[0].container_id.startswith("docker://")
    assert job.status.qos_class == "BestEffort"
    assert job.metadata.creation_timestamp.timestamp() == pytest.approx(node.wall_at(0), abs=1)


def test_container_id_names_the_runtime() -> None:
    assert container_id(Container(name="c", id="0" * 64, runtime="cri-o")) == "cri-o://" + "0" * 64
    assert container_id(Container(name="c", id="f" * 64)) == "containerd://" + "f" * 64


def test_field_selectors_pick_the_node_and_namespace(node: simulator.SimulatedNode, tmp_path: Path) -> None:
    v1 = _v1(start_k8s_api(node), tmp_path)
    assert v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=other-node").items == []
    assert v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName!={NODE}").items == []
    assert len(v1.list_pod_for_all_namespaces().items) == 4  # no selector: every pod, as a real server allows
    assert _names(v1.list_pod_for_all_namespaces(field_selector=f"{ON_NODE},metadata.namespace=ml")) == [
        "ml/idle-0",
        "ml/trainer-0",
    ]
    assert _names(v1.list_namespaced_pod("infer", field_selector="metadata.name==server-1")) == ["infer/server-1"]
    with pytest.raises(client.ApiException) as err:
        v1.list_pod_for_all_namespaces(field_selector="spec.schedulerName=x")
    assert err.value.status == 400
    assert "field label not supported: spec.schedulerName" in err.value.body


def test_label_selectors_are_equality_and_existence(clock: SteppedClock, tmp_path: Path) -> None:
    labels = {"ml/trainer-0": {"app": "trainer", "team": "vision"}, "ml/idle-0": {"team": "nlp"}}
    annotations = {"ml/idle-0": {"owner": "nlp-team"}}
    with simulator.build(parse_scenario(_data()), clock) as node:
        v1 = _v1(start_k8s_api(node, K8sApiOptions(labels=labels, annotations=annotations)), tmp_path)
        idle = v1.read_namespaced_pod("idle-0", "ml")
        assert (idle.metadata.labels, idle.metadata.annotations) == ({"team": "nlp"}, {"owner": "nlp-team"})
        assert v1.read_namespaced_pod("server-1", "infer").metadata.annotations is None  # empty maps are omitted
        assert _names(v1.list_pod_for_all_namespaces(label_selector="app=trainer")) == ["ml/trainer-0"]
        assert _names(v1.list_pod_for_all_namespaces(label_selector="team,team!=nlp")) == ["ml/trainer-0"]
        assert _names(v1.list_pod_for_all_namespaces(label_selector="!team")) == ["infer/server-1", "legacy/job-7"]
        assert _names(v1.list_namespaced_pod("ml", label_selector="team==nlp")) == ["ml/idle-0"]
        with pytest.raises(client.ApiException) as err:
            v1.list_pod_for_all_namespaces(label_selector="team in (nlp,vision)")
        assert err.value.status == 400


def test_get_one_pod_and_a_missing_one(node: simulator.SimulatedNode, tmp_path: Path) -> None:
    v1 = _v1(start_k8s_api(node), tmp_path)
    pod = v1.read_namespaced_pod("server-1", "infer")
    assert (pod.metadata.name, pod.metadata.uid, pod.metadata.resource_version) == ("server-1", SERVER_UID, "1002")
    with pytest.raises(client.ApiException) as err:
        v1.read_namespaced_pod("server-1", "ml")
    assert err.value.status == 404
    assert '"reason":"NotFound"' in err.value.body
    assert 'pods \\"server-1\\" not found' in err.value.body


def test_limit_and_continue_page_one_snapshot(clock: SteppedClock, tmp_path: Path) -> None:
    with simulator.build(parse_scenario(_data()), clock) as node:
        v1 = _v1(start_k8s_api(node, K8sApiOptions(pod_lifetimes="processes")), tmp_path)
        first = v1.list_pod_for_all_namespaces(limit=2)
        assert _names(first) == ["infer/server-1", "ml/idle-0"]  # job-7 starts at 20 s
        assert first.metadata.remaining_item_count == 1
        clock.advance(31.0)  # job-7 appears, trainer-0 goes: the next page still reads the first snapshot
        rest = v1.list_pod_for_all_namespaces(limit=2, _continue=first.metadata._continue)
        assert _names(rest) == ["ml/trainer-0"]
        assert rest.metadata._continue is None
        assert rest.metadata.resource_version == first.metadata.resource_version == "1003"
        assert _names(v1.list_pod_for_all_namespaces()) == ["infer/server-1", "legacy/job-7", "ml/idle-0"]


def test_watch_sends_the_state_then_changes_in_scenario_time(clock: SteppedClock, tmp_path: Path) -> None:
    with simulator.build(parse_scenario(_data()), clock) as node:
        v1 = _v1(start_k8s_api(node, K8sApiOptions(pod_lifetimes="processes")), tmp_path)
        seen: list[tuple[str, str, str]] = []
        stream = watch.Watch().stream(
            v1.list_pod_for_all_namespaces, field_selector=ON_NODE, timeout_seconds=40, _request_timeout=10
        )
        for event in stream:
            pod = event["object"]
            seen.append((event["type"], pod.metadata.name, pod.metadata.resource_version))
            if len(seen) == 3:
                clock.advance(31.0)  # job-7 starts at 20 s, trainer-0 ends at 30 s
            if len(seen) == 5:
                clock.advance(10.0)  # past timeout_seconds on the node's clock: the stream ends cleanly
        assert seen == [
            ("ADDED", "server-1", "1002"),
            ("ADDED", "idle-0", "1003"),
            ("ADDED", "trainer-0", "1001"),
            ("ADDED", "job-7", "1004"),
            ("DELETED", "trainer-0", "1005"),
        ]
        gone = v1.list_pod_for_all_namespaces(field_selector=ON_NODE)
        assert "ml/trainer-0" not in _names(gone)
        assert gone.metadata.resource_version == "1005"
        with pytest.raises(client.ApiException) as err:
            v1.read_namespaced_pod("trainer-0", "ml")
        assert err.value.status == 404


def test_deleted_event_carries_the_final_state(clock: SteppedClock, tmp_path: Path) -> None:
    with simulator.build(parse_scenario(_data()), clock) as node:
        v1 = _v1(start_k8s_api(node, K8sApiOptions(pod_lifetimes="processes")), tmp_path)
        listed = v1.list_namespaced_pod("ml")
        clock.advance(35.0)
        events = []
        for event in watch.Watch().stream(
            v1.list_namespaced_pod,
            "ml",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=10,
            _request_timeout=10,
        ):
            events.append(event)
            clock.advance(10.0)  # ends the watch on the node's clock
        # From the list's resourceVersion: only what happened since, in the namespace asked for.
        assert [(e["type"], e["object"].metadata.name) for e in events] == [("DELETED", "trainer-0")]
        pod = events[0]["object"]
        assert pod.status.phase == "Succeeded"
        assert pod.metadata.deletion_timestamp.timestamp() == pytest.approx(node.wall_at(30.0), abs=1)
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0
        assert pod.status.container_statuses[0].ready is False


def test_static_pods_watch_ends_with_a_bookmark(
    node: simulator.SimulatedNode, clock: SteppedClock, tmp_path: Path
) -> None:
    v1 = _v1(start_k8s_api(node), tmp_path)
    events = []
    for event in watch.Watch().stream(
        v1.list_pod_for_all_namespaces,
        field_selector=ON_NODE,
        timeout_seconds=5,
        allow_watch_bookmarks=True,
        _request_timeout=10,
    ):
        metadata = event["raw_object"]["metadata"]
        events.append((event["type"], metadata.get("name"), metadata["resourceVersion"]))
        clock.advance(2.0)  # static pods: nothing changes, and at 5 s the stream ends
    # The synthetic ADDED events carry each pod's own version; the bookmark carries the list's.
    assert events == [
        ("ADDED", "server-1", "1002"),
        ("ADDED", "job-7", "1003"),
        ("ADDED", "idle-0", "1004"),
        ("ADDED", "trainer-0", "1001"),
        ("BOOKMARK", None, "1004"),
    ]


def test_watch_ends_in_real_seconds_while_the_clock_stands_still(node: simulator.SimulatedNode) -> None:
    api = start_k8s_api(node)
    params = {"watch": "true", "fieldSelector": ON_NODE, "timeoutSeconds": "0.3"}
    started = time.monotonic()
    with httpx.stream("GET", f"{api.url}/api/v1/namespaces/infer/pods", params=params, timeout=5) as answer:
        assert answer.headers["transfer-encoding"] == "chunked"
        assert answer.headers["content-type"] == "application/json"
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    assert time.monotonic() - started >= 0.3
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "server-1")]
    assert lines[0]["object"] == api.pod_objects()[0]


def test_slow_fault_delays_answers_in_real_seconds(clock: SteppedClock) -> None:
    faults = [{"at_s": 0, "for_s": 5, "target": "k8sapi", "kind": "slow", "delay_s": 0.2}]
    with simulator.build(parse_scenario(_data(faults)), clock) as node:
        api = start_k8s_api(node)
        started = time.monotonic()
        answer = httpx.get(f"{api.url}/api/v1/namespaces/ml/pods/idle-0", timeout=5)
        assert time.monotonic() - started >= 0.2
        assert (answer.status_code, answer.json()["metadata"]["uid"]) == (200, hashed_uuid("pod", "ml", "idle-0"))
        clock.advance(5.0)
        started = time.monotonic()
        assert httpx.get(f"{api.url}/api/v1/pods", params={"limit": "x"}, timeout=5).status_code == 400
        assert time.monotonic() - started < 0.2


def test_watch_from_a_compacted_version_is_gone(clock: SteppedClock, tmp_path: Path) -> None:
    with simulator.build(parse_scenario(_data()), clock) as node:
        v1 = _v1(start_k8s_api(node, K8sApiOptions(pod_lifetimes="processes", history_events=1)), tmp_path)
        clock.advance(31.0)  # two events since 1003; only the last is kept
        with pytest.raises(client.ApiException) as err:
            list(watch.Watch().stream(v1.list_pod_for_all_namespaces, resource_version="1003", timeout_seconds=1))
        assert err.value.status == 410
        assert "too old resource version: 1003 (1004)" in str(err.value)


def test_down_fault_answers_503_then_recovers(clock: SteppedClock, tmp_path: Path) -> None:
    faults = [{"at_s": 10, "for_s": 5, "target": "k8sapi", "kind": "down"}]
    with simulator.build(parse_scenario(_data(faults)), clock) as node:
        api = start_k8s_api(node)
        v1 = _v1(api, tmp_path)
        clock.advance(11.0)
        with pytest.raises(client.ApiException) as err:
            v1.list_pod_for_all_namespaces(field_selector=ON_NODE)
        assert err.value.status == 503
        answer = httpx.get(f"{api.url}/api/v1/namespaces/ml/pods/trainer-0", timeout=5)
        assert (answer.status_code, answer.json()["reason"]) == (503, "ServiceUnavailable")
        clock.advance(4.0)  # the window is [10 s, 15 s)
        assert len(v1.list_pod_for_all_namespaces(field_selector=ON_NODE).items) == 4
        assert api.requests == {"list": 2, "get": 1}


def test_down_fault_cuts_an_open_watch(clock: SteppedClock, tmp_path: Path) -> None:
    faults = [{"at_s": 10, "target": "k8sapi", "kind": "down"}]
    with simulator.build(parse_scenario(_data(faults)), clock) as node:
        v1 = _v1(start_k8s_api(node), tmp_path)
        names = []
        stream = watch.Watch().stream(
            v1.list_pod_for_all_namespaces, field_selector=ON_NODE, timeout_seconds=30, _request_timeout=10
        )

        def read_then_break_the_server() -> None:
            for event in stream:
                names.append(event["object"].metadata.name)
                if len(names) == 4:
                    clock.advance(10.0)  # into the down fault

        with pytest.raises(urllib3.exceptions.ProtocolError):  # the chunked body ends without its last chunk
            read_then_break_the_server()
        assert names == ["server-1", "job-7", "idle-0", "trainer-0"]


def test_plain_http_answers_json(node: simulator.SimulatedNode) -> None:
    with start_k8s_api(node) as api:
        answer = httpx.get(f"{api.url}/api/v1/pods", params={"fieldSelector": ON_NODE}, timeout=5)
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        body = answer.json()
        assert (body["kind"], body["apiVersion"], body["metadata"]) == ("PodList", "v1", {"resourceVersion": "1004"})
        assert body["items"] == api.pod_objects()
        server = next(item for item in body["items"] if item["metadata"]["name"] == "server-1")
        assert server["status"]["containerStatuses"][0]["containerID"] == f"cri-o://{SERVER_ID}"
        assert server["kind"] == "Pod"
        missing = httpx.get(f"{api.url}/api/v1/nodes", timeout=5)
        assert (missing.status_code, missing.json()["kind"], missing.json()["code"]) == (404, "Status", 404)


def test_kubeconfig_loads_into_a_client_configuration(node: simulator.SimulatedNode, tmp_path: Path) -> None:
    api = start_k8s_api(node)
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(api.write_kubeconfig(tmp_path / "kc")), client_configuration=configuration)
    assert configuration.host == api.url
    assert api.url.startswith("http://127.0.0.1:")
    assert _names(client.CoreV1Api(client.ApiClient(configuration)).list_namespaced_pod("infer")) == ["infer/server-1"]


def test_server_stops_when_the_node_closes(clock: SteppedClock) -> None:
    node = simulator.build(parse_scenario(_data()), clock)
    api = start_k8s_api(node)
    assert httpx.get(f"{api.url}/api/v1/pods", timeout=5).status_code == 200
    node.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{api.url}/api/v1/pods", timeout=5)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="pod_lifetimes"):
        K8sApiOptions(pod_lifetimes="forever")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="history_events"):
        K8sApiOptions(history_events=-1)
