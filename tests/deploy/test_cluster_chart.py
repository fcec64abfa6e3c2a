"""The chart's cluster-wide instance (values `cluster`): one Deployment, its RBAC, a config that validates."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.chart import CHART, unknown_fields
from tests.deploy.gotemplate import render_chart
from wattpipe.cli import main


def _objects(overrides: dict[str, Any]) -> list[dict[str, Any]]:
    rendered = render_chart(CHART, overrides, namespace="monitoring")
    return [doc for name, text in rendered.items() if name.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc]


def _named(objects: list[dict[str, Any]], kind: str, suffix: str = "-cluster") -> dict[str, Any]:
    (only,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return only


def test_off_by_default_and_never_in_the_daemonset() -> None:
    objects = _objects({})
    assert not [o for o in objects if o["metadata"]["name"].endswith("-cluster")]
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.yaml"])
    assert "k8s_cluster" not in config["receivers"]
    enabled = _objects({"cluster": {"enabled": True}})
    daemon_config = next(o for o in enabled if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "wattpipe")
    assert "k8s_cluster" not in yaml.safe_load(daemon_config["data"]["config.yaml"])["receivers"]


def test_one_deployment_with_its_rbac_and_service(tmp_path: Path) -> None:
    objects = _objects({"cluster": {"enabled": True, "config": {"requested_allocatable_ratio": False}}})
    deployment = _named(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]
    # Its own labels: the DaemonSet's headless Service must not select it.
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "wattpipe-cluster"
    assert pod["spec"].get("hostPID") is None
    assert pod["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] is True
    role = _named(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]
    binding = _named(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "wattpipe-cluster"
    assert binding["subjects"][0]["name"] == pod["spec"]["serviceAccountName"]
    service = _named(objects, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    for obj in objects:
        assert unknown_fields(obj) == [], obj["kind"]
    config = _named(objects, "ConfigMap")["data"]["config.yaml"]
    assert yaml.safe_load(config)["receivers"] == {"k8s_cluster": {"requested_allocatable_ratio": False}}
    path = tmp_path / "cluster.yaml"
    path.write_text(config)
    err = io.StringIO()
    assert main(["validate", "-c", str(path)], io.StringIO(), err) == 0, err.getvalue()


def test_no_rbac_when_the_chart_makes_none() -> None:
    objects = _objects({"cluster": {"enabled": True}, "rbac": {"create": False}})
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert _named(objects, "Deployment")


def test_dra_switch_adds_the_receiver_and_its_rbac() -> None:
    objects = _objects({"dra": {"enabled": True}})
    role = _named(objects, "ClusterRole", suffix="wattpipe")
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims", "resourceslices"],
        "verbs": ["get", "list", "watch"],
    } in role["rules"]
    config = yaml.safe_load(_named(objects, "ConfigMap", suffix="wattpipe")["data"]["config.yaml"])
    assert "dra" in config["service"]["pipelines"]["metrics"]["receivers"]
    daemonset = _named(objects, "DaemonSet", suffix="wattpipe")
    assert daemonset["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    default_role = _named(_objects({}), "ClusterRole", suffix="wattpipe")
    assert all(rule["apiGroups"] == [""] for rule in default_role["rules"])
