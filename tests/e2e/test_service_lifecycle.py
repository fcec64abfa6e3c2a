"""End to end: `wattpipe run` in a real process, a receiver dying mid-run, SIGTERM, telemetry over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
H = "tests.helpers.components"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_receiver_dies_mid_run_others_flow_and_sigterm_flushes_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "ticks.jsonl"
    port = free_port()
    cfg = tmp_path / "e2e.yaml"
    cfg.write_text(
        f"""
receivers:
  custom/gpu: {{class: "{H}:CountingGpu", watts: 300}}
  custom/flaky: {{class: "{H}:Flaky", good_polls: 3}}
exporters:
  custom/rec: {{class: "{H}:Recorder", path: "{out}"}}
service:
  node_name: e2e-node
  telemetry: {{listen: "127.0.0.1:{port}", log_level: info}}
  pipelines:
    metrics: {{interval: 100ms, receivers: [custom/gpu, custom/flaky], exporters: [custom/rec]}}
"""
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "wattpipe", "run", "-c", str(cfg)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 8)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/readyz").status_code == 200
        metrics = httpx.get(f"{base}/metrics").text
        errors = [line for line in metrics.splitlines() if line.startswith("wattpipe_receiver_errors_total{")]
        assert any('component="custom/flaky"' in line and not line.endswith(" 0.0") for line in errors)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert code == 0, stderr
    ticks = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [sorted({r["type"] for r in t["records"]}) for t in ticks]
    assert kinds[:3] == [["DeviceSample", "GpuProcessSample"]] * 3
    assert all(k == ["DeviceSample"] for k in kinds[3:])  # the GPU kept flowing after the other receiver died
    energies = [t["records"][0]["values"]["energy_mj"] for t in ticks]
    assert energies == sorted(energies)
    assert energies[-1] > 0
    flushed = (tmp_path / "ticks.jsonl.flushed").read_text().split()
    assert int(flushed[0]) == len(ticks)  # shutdown ran after the last export
    assert stderr.count("receiver custom/flaky failed: ConnectionError: device went away") == 1
    assert "SIGTERM received" in stderr
    assert "stopped cleanly" in stderr
