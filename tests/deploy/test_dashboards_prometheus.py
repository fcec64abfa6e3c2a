"""Every dashboard query runs against a real Prometheus scraping two demos, and returns data.

Two ``wattpipe demo`` nodes (1 s ticks) are scraped every second: the default demo (an H100 shared by
time-slicing, an A100 in exclusive-process mode) and ``configs/scenarios/mig-pods.yaml`` (two GPUs in MIG
mode, pods on instances). Once all their pods are attributed, each panel's PromQL, with the variables as
Grafana would fill them (every picker on All, then a namespace, a pod and a GPU picked), must return at
least one series: no panel is silently empty. The pickers' own ``label_values`` queries must list values.
Needs the Debian ``prometheus`` package (.ci/run installs it); outside CI a machine without it skips.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.chart import ROOT
from tests.deploy.dashboards import DASHBOARDS, interpolate, load, targets, variables
from tests.helpers.http_stub import serving

ALL = {"node": ".*", "gpu": ".*", "namespace": ".*", "pod": ".*", "price_per_kwh": "0.30"}
# Families whose right value on the demos may be 0 (every watt attributed; a free span's exact idle).
ZERO_IS_AN_ANSWER = ("unattributed", "uncertainty")
BUILT_INS = {"__range": "2m", "__rate_interval": "1m", "__interval": "15s"}
# A pick per dashboard: one namespace, one pod, one GPU that the demos run.
PICKS = {
    "wattpipe-node.json": {"node": "demo-node", "gpu": "0"},
    "wattpipe-pods.json": {"node": "demo-node", "namespace": "ml", "pod": "trainer-0", "gpu": "0"},
    "wattpipe-mig.json": {"node": "mig-pods-node", "namespace": "ml", "pod": "finetune-3", "gpu": "0"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prometheus() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("prometheus is missing: .ci/run must install the Debian package 'prometheus'")
    pytest.skip("the Debian package 'prometheus' is not installed here (apt-get install prometheus)")


def _demo(port: int, *args: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "WATTPIPE_PROMETHEUS_LISTEN": f"127.0.0.1:{port}",
        "WATTPIPE_TELEMETRY_LISTEN": "",
        "WATTPIPE_INTERVAL": "1s",
        "WATTPIPE_CONSOLE_FORMAT": "json",
    }
    command = [sys.executable, "-m", "wattpipe", "demo", "--duration", "240s", "--log-level", "warning", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = _prometheus()
    tmp = tmp_path_factory.mktemp("dashboards")
    demo_port, mig_port, prom_port = free_port(), free_port(), free_port()
    # The demo's config names the node after the scenario's node.name: the MIG node is mig-pods-node.
    mig = ["--scenario", str(ROOT / "configs" / "scenarios" / "mig-pods.yaml")]
    procs = [_demo(demo_port), _demo(mig_port, *mig)]
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: wattpipe\n    static_configs: [{{targets: ['127.0.0.1:{demo_port}', '127.0.0.1:{mig_port}']}}]\n"
    )
    procs.append(
        subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    url = f"http://127.0.0.1:{prom_port}"
    try:
        _wait_for_every_pod(url)
        yield url
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def query(url: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10)
    response.raise_for_status()  # before its TSDB is open Prometheus answers 503 in plain text
    body = response.json()
    assert body["status"] == "success", f"{promql}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _wait_for_every_pod(url: str) -> None:
    """Until both nodes' pods are all attributed (the demo's batch job starts at 30 s) and MIG instances show."""
    deadline = time.monotonic() + 150
    want = (
        "count(count by (node_name, pod_name) (kepler_pod_gpu_watts)) >= 5 and on () "
        "count(wattpipe_gpu_instance_joules_total) > 0 and on () count(wattpipe_gpu_instance_activity) > 0"
    )
    batch = 'kepler_pod_gpu_watts{pod_name="batch-7"}'
    while time.monotonic() < deadline:
        try:
            if query(url, want) and query(url, batch):
                time.sleep(5)  # a few more scrapes, so increase() over the range has points to work with
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError("timed out waiting for the demos' pods and MIG instances in Prometheus")


def _cases() -> list[tuple[str, str, str]]:
    return [(p.name, title, expr) for p in DASHBOARDS for title, expr in targets(load(p))]


@pytest.mark.parametrize(("dashboard", "title", "expr"), _cases(), ids=lambda v: re.sub(r"\W+", "-", str(v))[:60])
def test_every_panel_query_returns_data_with_all_and_with_a_pick(
    prom: str, dashboard: str, title: str, expr: str
) -> None:
    for values in (ALL, ALL | PICKS[dashboard]):
        promql = interpolate(expr, values | BUILT_INS)
        result = query(prom, promql)
        assert result, f"{dashboard}: panel {title!r} is empty for {values}: {promql}"
        for series in result:
            assert re.fullmatch(r"-?\d+(\.\d+)?(e[-+]?\d+)?", series["value"][1]), (title, series)  # no NaN, no Inf
        if values is ALL and not any(word in expr for word in ZERO_IS_AN_ANSWER):
            assert any(float(s["value"][1]) != 0 for s in result), (
                f"{dashboard}: panel {title!r} is all zeros: {promql}"
            )


@pytest.mark.parametrize("dashboard", [p.name for p in DASHBOARDS])
def test_every_picker_lists_values_and_the_picks_are_among_them(prom: str, dashboard: str) -> None:
    for name, var in variables(load(Path(DASHBOARDS[0].parent / dashboard))).items():
        if var["type"] != "query":
            continue
        selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", var["definition"]).groups()  # type: ignore[union-attr]
        response = httpx.get(
            f"{prom}/api/v1/label/{label}/values", params={"match[]": interpolate(selector, ALL)}, timeout=10
        )
        response.raise_for_status()
        listed = response.json()["data"]
        assert listed, f"{dashboard}: the {name} picker lists nothing"
        pick = PICKS[dashboard].get(name)
        assert pick is None or pick in listed, (name, pick, listed)


def test_waiting_for_the_pods_outlasts_a_prometheus_that_is_not_ready_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prometheus answers 503 "Service Unavailable" (plain text) until its TSDB is open; a slow CI machine hit it.
    answers = [(503, b"Service Unavailable\n", "text/plain")] * 3
    success = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1"]}]}}'

    monkeypatch.setattr(time, "sleep", lambda s: None)
    with serving(lambda path: answers.pop(0) if answers else (200, success, "application/json")) as url:
        _wait_for_every_pod(url)
    assert answers == []  # it asked through the three 503s and stopped at the first answer
