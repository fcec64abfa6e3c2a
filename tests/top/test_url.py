"""``wattpipe top --url`` against a real wattpipe serving OpenTelemetry names, and its errors."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.http_stub import serving
from wattpipe import top as top_module

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def top(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "170"}
    return subprocess.run(
        [sys.executable, "-m", "wattpipe.top", *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )


@pytest.fixture(scope="module")
def otel_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``wattpipe demo`` with the Prometheus exporter set to ``naming: otel``; its /metrics URL."""
    config = tmp_path_factory.mktemp("top") / "demo-otel.yaml"
    text = (ROOT / "configs" / "demo.yaml").read_text()
    assert "\n  prometheus:\n" in text
    config.write_text(text.replace("\n  prometheus:\n", "\n  prometheus:\n    naming: otel\n"))
    port = free_port()
    env = {
        **os.environ,
        "WATTPIPE_PROMETHEUS_LISTEN": f"127.0.0.1:{port}",
        "WATTPIPE_TELEMETRY_LISTEN": "",
        "WATTPIPE_INTERVAL": "1s",
        "WATTPIPE_CONSOLE_FORMAT": "json",
    }
    demo = subprocess.Popen(
        [sys.executable, "-m", "wattpipe", "demo", "-c", str(config), "--duration", "120s", "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        demo.terminate()
        demo.wait(timeout=10)


def test_top_once_reads_otel_names_from_a_running_wattpipe(otel_demo: str) -> None:
    deadline = time.monotonic() + 90
    out = ""
    while time.monotonic() < deadline:  # until the A100's batch job (30 s in) is attributed
        done = top("--url", otel_demo, "--once")
        out = done.stdout
        if done.returncode == 0 and "ml/batch-7" in out:
            break
        time.sleep(1)
    assert "ml/batch-7" in out, out
    assert f"wattpipe top  {otel_demo}" in out
    assert "names: otel" in out
    assert "node demo-node" in out
    lines = out.splitlines()
    gpu1 = next(ln for ln in lines if ln.startswith("GPU 1 NVIDIA A100-SXM4-80GB"))
    assert "exclusive_process" in gpu1
    assert "(free)" in gpu1
    assert any(ln.strip().startswith("6001 train.py") for ln in lines)
    # The CPU side read through OTel names: the package zone's row after the GPUs, the batch job under it too.
    cpu = next(i for i, ln in enumerate(lines) if ln.startswith("CPU package intel-rapl:0"))
    assert lines.index(gpu1) < cpu
    assert "by CPU time" in lines[cpu]
    assert any(ln.strip().startswith("6001 train.py") for ln in lines[cpu + 1 :])


def test_an_unreachable_url_is_named_in_the_error_and_exits_1() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    done = top("--url", url, "--once")
    assert done.returncode == 1
    assert f"cannot read {url}" in done.stdout + done.stderr


def test_a_non_positive_refresh_is_refused_with_exit_2() -> None:
    done = top("--every", "0")
    assert done.returncode == 2
    assert "--every 0" in done.stderr


@pytest.fixture
def local_wattpipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A loopback server answering with a recorded exposition, standing in for a wattpipe on the default port."""
    from tests.top.test_model import KEPLER

    with serving(lambda path: (200, KEPLER.encode(), "text/plain; version=0.0.4")) as base:
        url = f"{base}/metrics"
        monkeypatch.setattr(top_module, "LOCAL_URL", url)
        yield url


def test_without_url_top_reads_the_local_wattpipe_when_one_answers(
    local_wattpipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(url=None, demo=False, scenario=None, every=1.0, sort="joules", once=True)
    assert top_module.main(args) == 0
    out = capsys.readouterr().out
    assert f"wattpipe top  {local_wattpipe}  node n1" in out  # no demo started: the local URL, as is
    assert "sorted by joules" in out
    assert "ml/trainer-0" in out


def test_nothing_on_the_default_port_means_top_starts_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = f"http://127.0.0.1:{free_port()}/metrics"
    monkeypatch.setattr(top_module, "LOCAL_URL", closed)
    assert top_module._answers(closed) is False
    started: list[list[str]] = []

    class FakeDemo:
        returncode = 0

        def __init__(self, command: list[str], **kwargs: object) -> None:
            started.append(command)

        def poll(self) -> int | None:
            return None

        def terminate(self) -> None:
            pass

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakeDemo)  # what top.py calls, as subprocess.Popen
    args = argparse.Namespace(url=None, demo=False, scenario="s.yaml", every=1.0, sort="watts", once=True)
    with top_module._source(args) as source:
        assert source.url != closed
        assert source.demo is not None
    assert started == [[sys.executable, "-m", "wattpipe", "demo", "--log-level", "warning", "--scenario", "s.yaml"]]


def test_url_with_demo_options_is_refused_with_exit_2() -> None:
    done = top("--url", "http://127.0.0.1:1/metrics", "--scenario", "configs/scenarios/mig.yaml")
    assert done.returncode == 2
    assert "--url reads a running wattpipe" in done.stderr


def test_into_a_pipe_top_prints_one_screen_and_exits(local_wattpipe: str) -> None:
    done = top("--url", local_wattpipe)  # stdout is a pipe here: no --once needed
    assert done.returncode == 0
    assert done.stdout.count("wattpipe top") == 1
    assert "\x1b[?1049h" not in done.stdout  # no alternate screen
    assert "4242 python" in done.stdout


def test_once_with_the_demo_waits_for_a_tick_that_attributes_something() -> None:
    """The demo's first tick has GPU power but no process yet: one screen of it would show no pod at all."""
    done = top("--demo", "--once")
    assert done.returncode == 0, done.stderr
    assert "ml/trainer-0" in done.stdout
    assert "4242 python" in done.stdout


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("http://node:28282", "http://node:28282/metrics"),
        ("http://node:28282/", "http://node:28282/metrics"),
        ("node:28282", "http://node:28282/metrics"),
        ("node:28282/metrics", "http://node:28282/metrics"),
        ("https://node:9443/custom/path", "https://node:9443/custom/path"),
        ("http://node:28282/metrics?x=1", "http://node:28282/metrics?x=1"),
    ],
)
def test_a_url_without_scheme_or_path_reads_metrics_over_http(given: str, read: str) -> None:
    assert top_module.metrics_url(given) == read


def test_top_reads_a_running_wattpipe_given_as_host_and_port(otel_demo: str) -> None:
    host_port = otel_demo.removeprefix("http://").removesuffix("/metrics")
    done = top("--url", host_port, "--once")
    assert done.returncode == 0, done.stderr
    assert f"wattpipe top  {otel_demo}  node demo-node" in done.stdout


@pytest.mark.parametrize("given", [":::bad", "http://[::1", "http://", "ftp://node/metrics", "not a url", "node:99999"])
def test_a_url_that_cannot_be_one_is_refused_with_exit_2_naming_it(given: str) -> None:
    # ":::bad" and "http://[::1" once ended in an httpx / urllib traceback; "not a url" in a DNS lookup.
    done = top("--url", given, "--once")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: --url {given}: ")
    assert "e.g. http://node:28282/metrics or node:28282" in done.stderr


def test_one_screen_into_a_pipe_lists_no_keys_it_cannot_take(local_wattpipe: str) -> None:
    # The key line ("w sort by watts … q quit") once ended every --once screen and every pipe: keys nobody can press.
    done = top("--url", local_wattpipe)
    assert done.returncode == 0, done.stderr
    assert "4242 python" in done.stdout
    assert "keys:" not in done.stdout
    assert "q quit" not in done.stdout


def test_an_http_error_is_one_line_with_its_status() -> None:
    # A 404 printed httpx's two lines, the second "For more information check: https://developer.mozilla.org/…".
    with serving(lambda path: (404, b"not here", "text/plain")) as base:
        url = f"{base}/nope"
        done = top("--url", url, "--once")
    assert done.returncode == 1
    assert done.stderr == f"error: cannot read {url}: HTTP 404 Not Found\n"


def test_wattpipes_own_telemetry_port_is_told_apart_from_its_energy_series() -> None:
    # `top --url node:8888` (wattpipe's telemetry, not its exporter) said "is this a wattpipe /metrics?": it is one.
    telemetry = (
        "# TYPE wattpipe_tick_duration_seconds histogram\n"
        'wattpipe_tick_duration_seconds_bucket{le="+Inf",pipeline="metrics"} 3.0\n'
        'wattpipe_tick_duration_seconds_count{pipeline="metrics"} 3.0\n'
        'wattpipe_tick_duration_seconds_sum{pipeline="metrics"} 0.01\n'
    )
    with serving(lambda path: (200, telemetry.encode(), "text/plain; version=0.0.4")) as base:
        done = top("--url", base, "--once")
    assert done.returncode == 0, done.stderr
    assert "wattpipe's own telemetry (service.telemetry.listen), not its energy series" in done.stdout
    assert "the prometheus exporter's listen (:28282 by default)" in done.stdout
    assert "is this a wattpipe /metrics?" not in done.stdout
