"""docs/topology.md's KubeSchedulerConfiguration: known fields only, and it reaches the chart's extender."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from tests.deploy.chart import CHART
from tests.deploy.gotemplate import render_chart
from wattpipe.extender import RESOURCE, make_app
from wattpipe.pipeline.httpserver import HttpServer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "extender_args.json"

# kubescheduler.config.k8s.io/v1 Extender, ExtenderTLSConfig and ExtenderManagedResource field names.
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}  # fmt: skip
TLS_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"}


def documented() -> dict[str, Any]:
    text = (ROOT / "docs" / "topology.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "KubeSchedulerConfiguration" in b]
    return yaml.safe_load(block)  # type: ignore[no-any-return]


def test_the_documented_configuration_uses_only_kube_scheduler_fields() -> None:
    config = documented()
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    (extender,) = config["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    assert set(extender.get("tlsConfig") or {}) <= TLS_FIELDS
    assert extender["weight"] >= 1  # the scheduler rejects a prioritizeVerb with weight 0
    assert [r["name"] for r in extender["managedResources"]] == [RESOURCE]
    assert extender["nodeCacheCapable"] is False  # the chart's default: whole Node objects, no --node-cache


def test_the_documented_url_is_the_charts_extender_service() -> None:
    extender = documented()["extenders"][0]
    url = urlsplit(extender["urlPrefix"])
    found = [
        d
        for name, text in render_chart(CHART, {"extender": {"enabled": True}}, namespace="monitoring").items()
        if name.endswith(".yaml")
        for d in yaml.safe_load_all(text)
        if d
    ]
    (service,) = [d for d in found if d["kind"] == "Service" and d["metadata"]["name"].endswith("-extender")]
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]


def test_the_scheduler_reaches_filter_and_prioritize_where_the_configuration_says() -> None:
    # kube-scheduler POSTs to urlPrefix + "/" + verb; the chart runs the extender without --prefix.
    extender = documented()["extenders"][0]
    server = HttpServer("127.0.0.1:0", make_app())
    server.start()
    try:
        base = server.url + urlsplit(extender["urlPrefix"]).path.rstrip("/")
        args = json.loads(FIXTURE.read_text())
        filtered = httpx.post(f"{base}/{extender['filterVerb']}", json=args)
        assert filtered.status_code == 200
        assert set(filtered.json()["failedNodes"]) == {"v100-node-4"}
        ranked = httpx.post(f"{base}/{extender['prioritizeVerb']}", json=args)
        assert ranked.status_code == 200
        assert max(ranked.json(), key=lambda p: p["score"]) == {"host": "h100-node-1", "score": 10}
    finally:
        server.close()
