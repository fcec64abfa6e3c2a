"""The Helm chart's topology switches: agent pipeline, opt-in `patch nodes`, the extender Deployment (off by default)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import CHART, render_config, unknown_fields, values
from tests.deploy.gotemplate import render_chart
from wattpipe.cli import main

ON = {"topology": {"enabled": True, "annotateNode": True}, "extender": {"enabled": True}}


def docs(overrides: dict[str, Any]) -> list[dict[str, Any]]:
    out = render_chart(CHART, overrides, namespace="monitoring")
    return [d for name, text in out.items() if name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def one(found: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    (doc,) = [d for d in found if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    return doc


def node_rules(found: list[dict[str, Any]], name_suffix: str = "wattpipe") -> list[list[str]]:
    role = one(found, "ClusterRole", name_suffix)
    return [rule["verbs"] for rule in role["rules"] if rule["resources"] == ["nodes"]]


def test_off_by_default_no_extender_and_no_node_access() -> None:
    found = docs({})
    assert not [d for d in found if d["kind"] == "Deployment"]
    assert node_rules(found) == []
    config = yaml.safe_load(one(found, "ConfigMap")["data"]["config.yaml"])
    assert "gpu_topology" not in config["receivers"]


def test_topology_without_annotation_adds_metrics_only() -> None:
    found = docs({"topology": {"enabled": True}})
    config = yaml.safe_load(one(found, "ConfigMap")["data"]["config.yaml"])
    metrics = config["service"]["pipelines"]["metrics"]
    assert metrics["receivers"][-1] == "gpu_topology"
    assert metrics["processors"][-1] == "gpu_placement"
    assert "node_annotation" not in config["exporters"]
    assert node_rules(found) == []


def test_everything_on_renders_known_fields_and_a_valid_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = docs(ON)
    for doc in found:
        assert unknown_fields(doc) == [], doc["kind"]
    text = one(found, "ConfigMap")["data"]["config.yaml"]
    assert yaml.safe_load(text) == render_config(values(**ON))
    assert yaml.safe_load(text)["service"]["pipelines"]["metrics"]["exporters"] == ["prometheus", "node_annotation"]
    assert node_rules(found) == [["patch"]]
    assert one(found, "DaemonSet")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    path = tmp_path / "config.yaml"
    path.write_text(text)
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    err = io.StringIO()
    assert main(["validate", "-c", str(path)], io.StringIO(), err) == 0, err.getvalue()


def test_extender_deployment_and_service() -> None:
    found = docs(ON)
    deployment = one(found, "Deployment", "-extender")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["extender", "--listen=0.0.0.0:8890"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "extender", "scheme": "HTTP"}
    assert pod["automountServiceAccountToken"] is False
    service = one(found, "Service", "-extender")
    assert service["spec"]["ports"] == [{"name": "extender", "port": 8890, "targetPort": "extender"}]
    assert service["spec"]["selector"]["app.kubernetes.io/name"] == "wattpipe-extender"


def test_extender_node_cache_and_tls() -> None:
    found = docs({**ON, "extender": {"enabled": True, "nodeCache": True, "webConfigSecret": "extender-tls"}})
    pod = one(found, "Deployment", "-extender")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][1:] == [
        "--listen=0.0.0.0:8890",
        "--node-cache",
        "--web-config=/etc/wattpipe/web/web-config.yaml",
    ]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert pod["volumes"] == [{"name": "web", "secret": {"secretName": "extender-tls"}}]
    assert pod["automountServiceAccountToken"] is True
    # Least privilege: the agent patches its node, the extender reads nodes; neither gets the other's right.
    assert node_rules(found) == [["patch"]]
    assert node_rules(found, "-extender") == [["get", "list"]]
    assert one(found, "ClusterRole", "-extender")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}
    ]
    account = pod["serviceAccountName"]
    assert account == one(found, "ServiceAccount", "-extender")["metadata"]["name"]
    assert account != one(found, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    binding = one(found, "ClusterRoleBinding", "-extender")
    assert binding["roleRef"]["name"] == one(found, "ClusterRole", "-extender")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "monitoring"}]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_agent_and_extender_select_only_their_own_pods() -> None:
    # A DaemonSet must not select pods of another workload (Kubernetes' DaemonSet docs), and the agent's
    # Service and ServiceMonitor must not send scrapes to the extender, nor the extender's Service requests
    # to the agents.
    found = docs({**ON, "serviceMonitor": {"enabled": True}})
    agent_pod = one(found, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    extender = one(found, "Deployment", "-extender")
    extender_pod = extender["spec"]["template"]["metadata"]["labels"]
    assert _selects(extender["spec"]["selector"]["matchLabels"], extender_pod)
    assert not _selects(one(found, "DaemonSet")["spec"]["selector"]["matchLabels"], extender_pod)
    agent_service = next(d for d in found if d["kind"] == "Service" and not d["metadata"]["name"].endswith("-extender"))
    assert not _selects(agent_service["spec"]["selector"], extender_pod)
    assert not _selects(one(found, "Service", "-extender")["spec"]["selector"], agent_pod)
    assert _selects(one(found, "Service", "-extender")["spec"]["selector"], extender_pod)
    monitor = one(found, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert _selects(monitor, agent_service["metadata"]["labels"])
    assert not _selects(monitor, one(found, "Service", "-extender")["metadata"]["labels"])
