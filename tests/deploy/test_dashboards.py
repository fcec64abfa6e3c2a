"""The Grafana dashboards load with the dashboard schema's required fields, name only wattpipe's Kepler
families and their own variables, and the Helm chart provisions them as a ConfigMap Grafana's sidecar finds."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.deploy.chart import CHART, unknown_fields
from tests.deploy.dashboards import DASHBOARDS, GRAFANA, interpolate, load, targets, variables
from tests.deploy.gotemplate import render_chart
from wattpipe.pipeline.catalog import FAMILIES

KEPLER_NAMES = {f.kepler for f in FAMILIES}
BUILT_INS = {"__range": "1h", "__rate_interval": "1m", "__interval": "30s"}
NAMES = [p.name for p in DASHBOARDS]


def test_there_are_node_pod_and_mig_dashboards_with_unique_uids() -> None:
    assert NAMES == ["wattpipe-mig.json", "wattpipe-node.json", "wattpipe-pods.json"]
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == 3
    assert all(len(uid) <= 40 for uid in uids)  # Grafana's limit on a uid's length


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_has_the_schema_required_fields(name: str) -> None:
    board = load(GRAFANA / name)
    assert isinstance(board["title"], str)
    assert board["title"]
    assert isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 36
    assert isinstance(board["templating"]["list"], list)
    assert board["panels"]
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in board["panels"]:
        assert panel["type"] in {"timeseries", "stat", "bargauge", "table"}, panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


@pytest.mark.parametrize("name", NAMES)
def test_queries_name_only_exported_kepler_families_and_defined_variables(name: str) -> None:
    board = load(GRAFANA / name)
    defined = {n: ".*" for n in variables(board)} | BUILT_INS
    for title, expr in targets(board):
        interpolate(expr, defined)  # raises on an undefined variable
        for metric in re.findall(r"\b((?:kepler|wattpipe)_[a-z_]+)\b", expr):
            assert metric in KEPLER_NAMES, f"{name}: {title}: {metric} is not a family wattpipe exports"
    for var in variables(board).values():
        if var["type"] == "query":
            interpolate(var["definition"], defined)


@pytest.mark.parametrize("name", NAMES)
def test_every_dashboard_has_the_pickers_and_the_price_per_kwh(name: str) -> None:
    found = variables(load(GRAFANA / name))
    assert {"datasource", "node", "gpu", "price_per_kwh"} <= set(found)
    if name != "wattpipe-node.json":
        assert {"namespace", "pod"} <= set(found)
    price = found["price_per_kwh"]
    assert price["type"] == "textbox"
    assert float(price["query"]) > 0
    for picker in ("node", "gpu", "namespace", "pod"):
        if picker in found:
            assert found[picker]["includeAll"] is True
            assert found[picker]["allValue"] == ".*"
            assert found[picker]["multi"] is True


def test_cost_panels_multiply_kwh_by_the_price_variable() -> None:
    costs = [(t, e) for p in DASHBOARDS for t, e in targets(load(p)) if "$price_per_kwh" in e]
    assert len(costs) >= 4
    for title, expr in costs:
        assert "Cost" in title, title
        assert expr.endswith("/ 3600000 * $price_per_kwh"), expr


def test_chart_provisions_the_dashboards_as_a_configmap_with_the_sidecar_label() -> None:
    out = render_chart(CHART, {"grafanaDashboards": {"enabled": True}}, namespace="monitoring")
    doc = yaml.safe_load(out["grafana-dashboards.yaml"])
    assert doc["kind"] == "ConfigMap"
    assert unknown_fields(doc) == []
    assert doc["metadata"]["name"] == "wattpipe-dashboards"
    assert doc["metadata"]["namespace"] == "monitoring"
    assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "wattpipe"
    assert sorted(doc["data"]) == NAMES
    for name, text in doc["data"].items():
        assert json.loads(text) == load(GRAFANA / name), name  # the files themselves, unaltered


def test_chart_dashboards_are_off_by_default_and_take_a_namespace_and_label() -> None:
    assert render_chart(CHART).get("grafana-dashboards.yaml", "").strip() == ""
    values = {"grafanaDashboards": {"enabled": True, "namespace": "grafana", "label": "dash", "labelValue": "yes"}}
    doc = yaml.safe_load(render_chart(CHART, values, namespace="monitoring")["grafana-dashboards.yaml"])
    assert doc["metadata"]["namespace"] == "grafana"
    assert doc["metadata"]["labels"]["dash"] == "yes"
    assert "grafana_dashboard" not in doc["metadata"]["labels"]
