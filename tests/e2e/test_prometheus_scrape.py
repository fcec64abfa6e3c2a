"""A real Prometheus scrapes `wattpipe demo` on loopback; PromQL checks the conservation identity.

Needs the Debian `prometheus` package (prometheus and promtool), which .ci/run installs. Outside CI a
machine without it skips this test, saying why; in CI (CI=true) its absence is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _binaries() -> tuple[str, str]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus and promtool:
        return prometheus, promtool
    if os.environ.get("CI"):
        pytest.fail("prometheus/promtool are missing: .ci/run must install the Debian package 'prometheus'")
    pytest.skip("the Debian package 'prometheus' is not installed here (apt-get install prometheus)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: object, timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()  # type: ignore[operator]
            if last:
                return last
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    prometheus, promtool = _binaries()
    tmp = tmp_path_factory.mktemp("prom")
    exporter_port, prom_port = free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WATTPIPE_PROMETHEUS_LISTEN": f"127.0.0.1:{exporter_port}",
        "WATTPIPE_TELEMETRY_LISTEN": "",
        "WATTPIPE_INTERVAL": "1s",
        "WATTPIPE_CONSOLE_FORMAT": "json",
    }
    demo = subprocess.Popen(
        [sys.executable, "-m", "wattpipe", "demo", "--duration", "120s", "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: wattpipe\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    prom = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield {
            "exporter": f"http://127.0.0.1:{exporter_port}",
            "prom": f"http://127.0.0.1:{prom_port}",
            "promtool": promtool,
        }
    finally:
        for proc in (prom, demo):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def query(stack: dict[str, str], promql: str) -> list[dict]:  # type: ignore[type-arg]
    response = httpx.get(f"{stack['prom']}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def test_promtool_accepts_the_exposition(stack: dict[str, str]) -> None:
    text = wait_for(
        lambda: (
            (t := httpx.get(f"{stack['exporter']}/metrics", timeout=5).text) and "kepler_process_gpu_watts" in t and t
        ),
        60,
        "process series from the demo",
    )
    result = subprocess.run([stack["promtool"], "check", "metrics"], input=str(text), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promql_per_gpu_process_plus_unattributed_watts_equal_active_watts(stack: dict[str, str]) -> None:
    # Wait until Prometheus has scraped process series for both GPUs (the A100's job starts at 30 s).
    wait_for(
        lambda: len(query(stack, "count by (gpu_uuid) (kepler_process_gpu_watts)")) == 2, 90, "two GPUs' processes"
    )
    diff = (
        "sum by (gpu_uuid) (kepler_process_gpu_watts) + on (gpu_uuid) "
        "sum by (gpu_uuid) (wattpipe_node_gpu_unattributed_watts) - on (gpu_uuid) "
        "sum by (gpu_uuid) (kepler_node_gpu_active_watts)"
    )
    result = query(stack, diff)
    assert len(result) == 2
    for series in result:
        assert abs(float(series["value"][1])) < 1e-6, series
    active = query(stack, "kepler_node_gpu_active_watts > 1")
    assert len(active) >= 1  # not a trivial 0 = 0: real work is being attributed
    up = query(stack, "wattpipe_device_up")
    assert sorted(float(s["value"][1]) for s in up) == [1.0, 1.0]
