"""Failure drills for the process itself (issue #7): a scrape storm, SIGTERM mid-export, kill -9, process churn.

5. **Scrape storm**: 50 threads scrape a ``wattpipe run`` subprocess's Prometheus ``/metrics`` over
   loopback HTTP while it ticks every 100 ms. Every answer is a 200 with a complete exposition of exactly one
   tick, the ticks keep their schedule, nothing is counted as failed.
6. **SIGTERM during an export**: a ``wattpipe run`` subprocess gets SIGTERM while one exporter is inside a
   slow ``export`` and the OTLP exporter's sender is waiting on a slow collector. It exits 0 within its
   shutdown timeout; the export in flight finishes; the OTLP queue is flushed; the state file is written
   at shutdown and its totals equal the last ones exported.
7. **kill -9 and restart**: ``wattpipe demo`` (the real nvml receiver on a simulated node) with a state file
   and a 500 ms checkpoint interval is SIGKILLed mid-run and started again on the same state file. The
   totals resume exactly from the checkpoint (never lower, never 0), what was lost is the ticks after the
   last checkpoint (at most one checkpoint interval), and the idle baseline learned before the kill is
   used after it, on a GPU that is busy from the restart on (so it could not have been learned again).
8. **Process churn**: 20 new short-lived GPU processes every tick. Exported series and the processes the
   ``energy`` processor holds stay within ``max_terminated`` + running, memory stays flat after a warm-up,
   and per device Σ process + unattributed + idle = the counter's energy.

Drill 8 runs twice, 2,000 ticks × 20 processes (40,000 processes, each living one or two ticks) each time:

- 8a on the simulator (``simulator.scale.churn_scenario``), through the real ``nvml`` receiver, checking the
  bounds every tick and conservation against the simulator's ground truth;
- 8b with a synthetic churning GPU receiver (``tests/helpers/drill_components.py:ChurnGpu``, an exact energy
  counter) through the real ``idle`` → ``attribution`` → ``energy`` → ``prometheus`` chain, checking the bounds
  every tick and that memory stays flat after a warm-up (the simulator's own memory, which holds the whole
  scenario, would blur that measurement).

Waits are conditions with timeouts (never a fixed sleep standing in for an assertion). Only loopback
networking; no GPU.
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import itertools
import json
import logging
import math
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.drill_components import ChurnGpu, SlowOtlpSink, read_ledger, stamp
from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.scale import churn_scenario

ROOT = Path(__file__).resolve().parents[2]
H = "tests.helpers.components"
D = "tests.helpers.drill_components"


# --- shared helpers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``condition`` until it is truthy and return its value; fail after ``timeout_s`` real seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.01)


@dataclass
class Wattpipe:
    """A ``wattpipe`` subprocess; stderr goes to a file, so a chatty process can never block on a pipe."""

    proc: subprocess.Popen[bytes]
    stderr_path: Path

    @classmethod
    def start(cls, tmp: Path, *args: str, name: str = "wattpipe") -> Wattpipe:
        stderr_path = tmp / f"{name}.stderr"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with stderr_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "wattpipe", *args], cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=err
            )
        return cls(proc, stderr_path)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def processes() -> Iterator[list[Wattpipe]]:
    """Every subprocess a drill starts is killed at the end, whatever happened."""
    started: list[Wattpipe] = []
    yield started
    for p in started:
        p.kill()


def assert_quiet(stderr: str) -> None:
    """Nothing went wrong: no line at WARNING or ERROR."""
    noisy = [line for line in stderr.splitlines() if " WARNING " in line or " ERROR " in line]
    assert noisy == [], stderr


def samples_by_name(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def mj(joules: float) -> int:
    return round(joules * 1000)


# --- drill 5: fifty concurrent scrapes while the pipeline ticks ------------------------------------

STORM_THREADS = 50
STORM_DEVICES = 4
STORM_PIDS = 3
STORM_INTERVAL_S = 0.1
STORM_TICKS = 12  # the storm lasts at least this many ticks


def check_exposition(text: str) -> tuple[float, int]:
    """Check one scrape's body is a complete exposition of one tick; return that tick's stamp and the
    devices' total energy in it (mJ)."""
    assert text.endswith("\n"), "the body ends mid-line"
    samples = samples_by_name(text)
    n_processes = STORM_DEVICES * STORM_PIDS
    for name, count in {
        "kepler_node_gpu_joules_total": STORM_DEVICES,
        "kepler_node_gpu_idle_joules_total": STORM_DEVICES,
        "kepler_node_gpu_active_joules_total": STORM_DEVICES,
        "wattpipe_node_gpu_unattributed_joules_total": STORM_DEVICES,
        "kepler_node_gpu_watts": STORM_DEVICES,
        "wattpipe_device_up": STORM_DEVICES,
        "kepler_process_gpu_joules_total": n_processes,
        "kepler_process_gpu_watts": n_processes,
        "kepler_process_gpu_compute_utilization": n_processes,
    }.items():
        assert len(samples.get(name, [])) == count, f"{name}: {len(samples.get(name, []))} series, not {count}"
    # One tick's stamp: every process reports the same utilisation in a tick and a new one every tick.
    stamps = {value for _, value in samples["kepler_process_gpu_compute_utilization"]}
    assert len(stamps) == 1, f"utilisation from several ticks in one response: {sorted(stamps)}"
    # The devices are read at one instant: in one tick their totals are equal.
    totals = {labels["gpu_uuid"]: mj(value) for labels, value in samples["kepler_node_gpu_joules_total"]}
    assert len(set(totals.values())) == 1, f"device totals from several ticks: {totals}"
    # Conservation within the response: a torn one (two ticks' families) would break it.
    for uuid, total in totals.items():
        idle = sum(mj(v) for lab, v in samples["kepler_node_gpu_idle_joules_total"] if lab["gpu_uuid"] == uuid)
        rest = sum(
            mj(v) for lab, v in samples["wattpipe_node_gpu_unattributed_joules_total"] if lab["gpu_uuid"] == uuid
        )
        procs = sum(mj(v) for lab, v in samples["kepler_process_gpu_joules_total"] if lab["gpu_uuid"] == uuid)
        assert idle + rest + procs == total, f"{uuid}: {idle} + {rest} + {procs} != {total} mJ"
        assert procs > 0
    return stamps.pop(), totals.popitem()[1]


@dataclass
class _ScrapeLog:
    stamps: list[float] = field(default_factory=list)
    totals_mj: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _scrape(port: int) -> tuple[int, int | None, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        length = response.getheader("Content-Length")
        return response.status, int(length) if length is not None else None, body
    finally:
        conn.close()


def test_drill5_fifty_concurrent_scrapes_each_get_one_whole_tick_while_ticks_keep_time(
    tmp_path: Path, processes: list[Wattpipe]
) -> None:
    prom_port, telemetry_port = free_port(), free_port()
    ledger = tmp_path / "ledger.jsonl"
    cfg = tmp_path / "storm.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""
            receivers:
              custom/gpus: {{class: "{D}:StampedGpus", devices: {STORM_DEVICES}, pids_per_device: {STORM_PIDS}}}
            processors:
              idle: {{mode: fixed, watts: 50}}
              attribution:
              energy:
            exporters:
              prometheus: {{listen: "127.0.0.1:{prom_port}"}}
              custom/ledger: {{class: "{D}:Ledger", path: "{ledger}"}}
            service:
              node_name: drill-node
              telemetry: {{listen: "127.0.0.1:{telemetry_port}"}}
              pipelines:
                metrics:
                  interval: {int(STORM_INTERVAL_S * 1000)}ms
                  receivers: [custom/gpus]
                  processors: [idle, attribution, energy]
                  exporters: [prometheus, custom/ledger]
            """
        )
    )
    wp = Wattpipe.start(tmp_path, "run", "-c", str(cfg))
    processes.append(wp)

    def whole_tick_served() -> bool:
        assert wp.alive(), wp.stderr
        try:
            status, _, body = _scrape(prom_port)
            return status == 200 and check_exposition(body.decode())[0] > 0
        except (OSError, AssertionError):
            return False

    wait_for(whole_tick_served, 20, "the first complete exposition")

    logs = [_ScrapeLog() for _ in range(STORM_THREADS)]
    barrier = threading.Barrier(STORM_THREADS + 1)
    stop = threading.Event()

    def scraper(log: _ScrapeLog) -> None:
        barrier.wait()
        while not stop.is_set() or len(log.stamps) + len(log.problems) < 2:
            try:
                status, length, body = _scrape(prom_port)
                if status != 200:
                    raise AssertionError(f"status {status}")
                if length != len(body):
                    raise AssertionError(f"Content-Length {length}, body {len(body)} bytes")
                tick_stamp, total_mj = check_exposition(body.decode())
                log.stamps.append(tick_stamp)
                log.totals_mj.append(total_mj)
            except Exception as exc:  # every failure is a finding: counted and shown, never retried away
                log.problems.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=scraper, args=(log,), daemon=True) for log in logs]
    for t in threads:
        t.start()
    barrier.wait()
    storm_from = len(read_ledger(ledger))
    wait_for(lambda: len(read_ledger(ledger)) >= storm_from + STORM_TICKS, 30, f"{STORM_TICKS} ticks during the storm")
    wait_for(lambda: all(len(log.stamps) + len(log.problems) >= 2 for log in logs), 30, "two scrapes per thread")
    stop.set()
    for t in threads:
        t.join(timeout=30)
    storm_to = len(read_ledger(ledger))
    assert not any(t.is_alive() for t in threads)

    problems = [p for log in logs for p in log.problems]
    scrapes = sum(len(log.stamps) for log in logs)
    assert problems == [], f"{len(problems)} of {scrapes + len(problems)} scrapes failed: {problems[:5]}"
    assert scrapes >= 2 * STORM_THREADS
    # The scrapes really spanned several ticks (so one-tick-per-response was tested across tick changes)...
    assert len({s for log in logs for s in log.stamps}) >= 3
    # ...and no scraper ever saw time go backwards.
    for log in logs:
        assert log.stamps == sorted(log.stamps)

    # The ticks kept their 100 ms schedule during the storm: no tick was held up for long, and (a slow tick
    # skips the missed ones rather than bursting) most scheduled ticks ran.
    # (One more tick recorded first: a scrape may have seen the rendering of a tick the ledger was writing.)
    ticks = wait_for(lambda: (t := read_ledger(ledger)) and len(t) > storm_to and t, 10, "one more tick")
    storm = ticks[storm_from - 1 : storm_to]
    gaps = [b["monotonic_s"] - a["monotonic_s"] for a, b in itertools.pairwise(storm)]
    assert len(gaps) >= STORM_TICKS
    assert statistics.median(gaps) < 1.5 * STORM_INTERVAL_S, gaps
    assert max(gaps) < 10 * STORM_INTERVAL_S, gaps
    # Each response was exactly one tick's rendering: its stamp names the tick (the n-th poll's stamp), and its
    # device totals are the ones that tick exported.
    by_stamp = {stamp(t["n"]): t["device_totals"].get("GPU-stamp-0", {}).get("energy_mj") for t in ticks}
    for log in logs:
        for tick_stamp, total_mj in zip(log.stamps, log.totals_mj, strict=True):
            assert by_stamp[tick_stamp] == total_mj, (tick_stamp, total_mj)

    # Nothing was counted as failed, and the process is healthy and ready after the storm.
    own = samples_by_name(_get(telemetry_port, "/metrics"))
    for name in ("wattpipe_receiver_errors_total", "wattpipe_processor_errors_total", "wattpipe_exporter_failed_total"):
        assert all(v == 0 for _, v in own.get(name, [])), own.get(name)
    sent = {lab["component"]: v for lab, v in own["wattpipe_exporter_sent_total"]}
    assert sent["prometheus"] > 0
    assert sent["custom/ledger"] > 0
    wait_for(lambda: _status(telemetry_port, "/readyz") == 200, 10, "/readyz 200 after the storm")

    wp.proc.send_signal(signal.SIGTERM)
    assert wp.wait(15) == 0, wp.stderr
    assert_quiet(wp.stderr)


def _get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


# --- drill 6: SIGTERM while an export is in flight -------------------------------------------------

SIGTERM_INTERVAL_S = 0.2
SIGTERM_SHUTDOWN_TIMEOUT_S = 5.0


def test_drill6_sigterm_during_a_slow_export_finishes_it_flushes_otlp_saves_state_and_exits_0(
    tmp_path: Path, processes: list[Wattpipe]
) -> None:
    ledger, state = tmp_path / "ledger.jsonl", tmp_path / "state.json"
    with SlowOtlpSink(delay_s=0.8) as sink:
        cfg = tmp_path / "sigterm.yaml"
        cfg.write_text(
            textwrap.dedent(
                f"""
                receivers:
                  custom/gpu: {{class: "{H}:CountingGpu", watts: 300}}
                  custom/procs: {{class: "{H}:ProcessLister", pids: [100, 200]}}
                processors:
                  idle: {{mode: fixed, watts: 50}}
                  attribution:
                  energy:
                exporters:
                  custom/slow: {{class: "{D}:Ledger", path: "{ledger}", slow_s: 1.0}}
                  otlp: {{protocol: http/protobuf, endpoint: "{sink.url}", timeout: 5}}
                service:
                  node_name: drill-node
                  shutdown_timeout: {SIGTERM_SHUTDOWN_TIMEOUT_S:g}s
                  state: {{path: "{state}", checkpoint_interval: 1h}}
                  telemetry: {{listen: ""}}
                  pipelines:
                    metrics:
                      interval: {int(SIGTERM_INTERVAL_S * 1000)}ms
                      receivers: [custom/gpu, custom/procs]
                      processors: [idle, attribution, energy]
                      exporters: [custom/slow, otlp]
                """
            )
        )
        wp = Wattpipe.start(tmp_path, "run", "-c", str(cfg))
        processes.append(wp)
        started = Path(f"{ledger}.started")

        def begun() -> int:
            return len(started.read_text().split()) if started.exists() else 0

        # Data flows first: two ticks recorded by the slow exporter and sent to the collector.
        wait_for(lambda: (wp.alive() or pytest.fail(wp.stderr)) and len(read_ledger(ledger)) >= 2, 30, "two ticks")
        wait_for(lambda: len(sink.received()) >= 2, 30, "two OTLP requests")
        # Then the moment: the slow exporter is inside export() and the OTLP sender waits on the collector.
        in_flight = wait_for(
            lambda: (n := begun()) > len(read_ledger(ledger)) and sink.in_flight() and n, 30, "an export in flight"
        )
        signalled_wall, signalled = time.time(), time.monotonic()
        wp.proc.send_signal(signal.SIGTERM)
        code = wp.wait(SIGTERM_SHUTDOWN_TIMEOUT_S + 10)
        exit_s = time.monotonic() - signalled
        stderr = wp.stderr
        requests = sink.received()

    assert code == 0, stderr
    # Within the shutdown bound: the tick in flight (its 1 s export) plus flush and state, not the give-up path.
    assert exit_s < SIGTERM_SHUTDOWN_TIMEOUT_S + SIGTERM_INTERVAL_S, exit_s
    assert stderr.count("SIGTERM received") == 1, stderr
    assert "stopped cleanly" in stderr
    assert_quiet(stderr)

    # The export in flight finished (after the signal), and no export began after it.
    ticks = read_ledger(ledger)
    assert begun() == in_flight == len(ticks) == ticks[-1]["n"]
    assert ticks[-1]["written_wall_s"] > signalled_wall
    assert Path(f"{ledger}.flushed").read_text().split()[0] == str(len(ticks))  # shut down after the last export
    # The OTLP request in flight at the signal was answered, and the queue was flushed: one request per tick.
    assert any(r.received_s < signalled < (r.answered_s or 0) for r in requests)
    assert all(r.answered_s is not None for r in requests)
    assert len(requests) == len(ticks)

    # The state file was written at shutdown (the periodic checkpoint is an hour away), with the totals the
    # last tick exported: nothing measured is lost.
    doc = json.loads(state.read_text())
    assert doc["written_wall_s"] > signalled_wall
    saved = doc["sections"]["metrics/energy"]
    last = ticks[-1]
    (device_id,) = last["device_totals"]
    assert saved["devices"][device_id]["energy_mj"] == last["device_totals"][device_id]["energy_mj"] > 0
    for key in ("idle_energy_mj", "active_energy_mj", "unattributed_energy_mj"):
        assert saved["devices"][device_id][key] == last["device_totals"][device_id][key]
    saved_processes = {f"{p['pid']}@{p['device_id']}": p["energy_mj"] for p in saved["processes"]}
    assert saved_processes == last["process_totals"]
    assert len(saved_processes) == 2
    assert all(v > 0 for v in saved_processes.values())
    # Every millijoule the counter measured after its first reading is in the totals.
    first_counter, last_counter = ticks[0]["device_counters"][device_id], last["device_counters"][device_id]
    assert saved["devices"][device_id]["energy_mj"] == int(last_counter) - int(first_counter)
    # And the collector got the same totals in the last request (the flush), in joules.
    energy = {a["hw.id"]: v for a, v in requests[-1].sums("hw.energy")}
    assert mj(energy[device_id]) == saved["devices"][device_id]["energy_mj"]
    per_pid = {f"{a['process.pid']}@{a['hw.id']}": mj(v) for a, v in requests[-1].sums("wattpipe.process.gpu.energy")}
    assert per_pid == saved_processes


# --- drill 7: kill -9 mid-run, then a restart on the same state file -------------------------------

KILL_INTERVAL_S = 0.1
KILL_CHECKPOINT_S = 0.5


def _scenario(busy_from_s: float) -> str:
    """One H100 (idle 60 W) and one process on it from ``busy_from_s``; the node name fixes the GPU's UUID."""
    return yaml.safe_dump(
        {
            "node": {"name": "drill-node"},
            "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 60, "max_w": 700}],
            "processes": [
                {"pid": 4242, "comm": "python", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.5]], "start_s": busy_from_s}
            ],
        }
    )


def test_drill7_kill_9_then_restart_resumes_totals_from_the_checkpoint_and_keeps_the_idle_baseline(
    tmp_path: Path, processes: list[Wattpipe]
) -> None:
    ledger, state = tmp_path / "ledger.jsonl", tmp_path / "state.json"
    cfg = tmp_path / "crash.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""
            receivers:
              nvml: {{required: true}}
            processors:
              idle:
              attribution:
              energy:
            exporters:
              custom/ledger: {{class: "{D}:Ledger", path: "{ledger}"}}
            service:
              node_name: drill-node
              state: {{path: "{state}", checkpoint_interval: {int(KILL_CHECKPOINT_S * 1000)}ms}}
              telemetry: {{listen: ""}}
              pipelines:
                metrics:
                  interval: {int(KILL_INTERVAL_S * 1000)}ms
                  receivers: [nvml]
                  processors: [idle, attribution, energy]
                  exporters: [custom/ledger]
            """
        )
    )
    # Run 1: the GPU idles for its first 2 s (idle is learned; the demo starts its faces and the pipeline in
    # that time too), then pid 4242 works on it.
    (tmp_path / "before.yaml").write_text(_scenario(busy_from_s=2.0))
    first = Wattpipe.start(tmp_path, "demo", "-c", str(cfg), "--scenario", "before.yaml", name="before")
    processes.append(first)

    def saved() -> dict[str, Any]:
        try:
            sections: dict[str, Any] = json.loads(state.read_text())["sections"]
            return sections
        except (OSError, ValueError, KeyError):
            return {}

    def worked_a_while() -> bool:
        assert first.alive(), first.stderr
        sections = saved()
        learned = sections.get("metrics/idle", {}).get("idle_w", {})
        busy = [p for p in sections.get("metrics/energy", {}).get("processes", []) if p["energy_mj"] > 0]
        # The idle baseline and the process's energy checkpointed, and some ticks exported since it started.
        return len(learned) == 1 and len(busy) == 1 and len(read_ledger(ledger)) >= 35

    wait_for(worked_a_while, 30, "checkpoints with the idle baseline and the process's energy")
    first.proc.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert "stopped cleanly" not in first.stderr  # no clean shutdown ran: what is saved is the last checkpoint

    # What the crash left: the last checkpoint, whole (written atomically), and the ticks exported before it.
    before = read_ledger(ledger)
    checkpoint = saved()
    energy = checkpoint["metrics/energy"]
    (device_id,) = energy["devices"]
    saved_device = energy["devices"][device_id]
    (saved_process,) = energy["processes"]
    learned_idle_w = checkpoint["metrics/idle"]["idle_w"][device_id]
    assert learned_idle_w > 0
    assert first.stderr.count("idle power learned") == 1
    # The checkpoint is one tick's totals, exactly, and not the first tick's.
    at = [
        i
        for i, t in enumerate(before)
        if t["device_totals"].get(device_id, {}).get("energy_mj") == saved_device["energy_mj"]
    ]
    assert len(at) == 1, "the checkpoint matches no exported tick"
    assert at[0] >= 5
    checkpointed, lost = before[at[0]], before[at[0] + 1 :]
    assert checkpointed["process_totals"][f"4242@{device_id}"] == saved_process["energy_mj"] > 0
    # Lost: exactly the energy of the ticks exported after the last checkpoint...
    lost_mj = before[-1]["device_totals"][device_id]["energy_mj"] - saved_device["energy_mj"]
    assert lost_mj == sum(t["device_power"][device_id]["energy_mj"] for t in lost)
    # ...and those span at most one checkpoint interval: each of them but the last ended within
    # checkpoint_interval of the checkpointed tick (later, it would have been checkpointed itself; 0.1 s of
    # slack for the scheduler), and the last one may have been due when the kill came.
    assert all(t["written_wall_s"] - checkpointed["written_wall_s"] < KILL_CHECKPOINT_S + 0.1 for t in lost[:-1])

    # Run 2, on the same state file: the node kept working through the crash (pid 4242 busy from the start),
    # so nothing idle is seen and the baseline can only come from the checkpoint.
    ledger.unlink()
    (tmp_path / "after.yaml").write_text(_scenario(busy_from_s=0.0))
    second = Wattpipe.start(tmp_path, "demo", "-c", str(cfg), "--scenario", "after.yaml", "--ticks", "12", name="after")
    processes.append(second)
    assert second.wait(30) == 0, second.stderr
    stderr = second.stderr
    assert stderr.count("state loaded from") == 1, stderr
    assert stderr.count("energy totals restored: 1 process series, 1 devices") == 1, stderr
    assert stderr.count("idle power restored for 1 device(s)") == 1, stderr
    assert "idle power learned" not in stderr
    assert_quiet(stderr)

    after = read_ledger(ledger)
    assert len(after) == 12
    key = f"4242@{device_id}"
    # The first tick after the restart exports the checkpoint's totals exactly (no reset, nothing lower)...
    assert after[0]["device_totals"][device_id]["energy_mj"] == saved_device["energy_mj"]
    assert after[0]["process_totals"][key] == saved_process["energy_mj"]
    # ...and from there they only grow, by exactly the energy each tick measured.
    devices = [t["device_totals"][device_id]["energy_mj"] for t in after]
    pids = [t["process_totals"][key] for t in after]
    assert devices == sorted(devices)
    assert pids == sorted(pids)
    assert devices[-1] - saved_device["energy_mj"] == sum(t["device_power"][device_id]["energy_mj"] for t in after[1:])
    assert pids[-1] > saved_process["energy_mj"]
    # The learned idle baseline is the one from before the kill, and it is used: every tick has idle energy.
    powers = [t["device_power"][device_id] for t in after[1:]]
    assert powers
    assert all(p["idle_w"] == learned_idle_w and p["idle_energy_mj"] > 0 for p in powers)
    assert json.loads(state.read_text())["sections"]["metrics/idle"]["idle_w"][device_id] == learned_idle_w


# --- drill 8: process churn ------------------------------------------------------------------------

CHURN_PER_TICK = 20
CHURN_MAX_TERMINATED = 100
CHURN_TICKS = 2000  # ticks with churn: 40,000 processes


class TickCounts(NamedTuple):
    """One tick of a churn drill, in a few small ints (so that keeping 2,000 of them is no memory growth)."""

    running: int  # distinct processes the tick's batch listed
    held: int  # process series the energy processor holds after the tick
    joules: int  # kepler_process_gpu_joules_total series in the rendered exposition
    watts: int  # kepler_process_gpu_watts series
    util: int  # kepler_process_gpu_compute_utilization series
    others: int  # every other series (devices)

    @classmethod
    def of(cls, running: int, held: int, body: bytes) -> TickCounts:
        counts: dict[bytes, int] = {}
        for line in body.split(b"\n"):
            if line and not line.startswith(b"#"):
                name = line.split(b"{", 1)[0].split(b" ", 1)[0]
                counts[name] = counts.get(name, 0) + 1
        joules = counts.pop(b"kepler_process_gpu_joules_total", 0)
        watts = counts.pop(b"kepler_process_gpu_watts", 0)
        util = counts.pop(b"kepler_process_gpu_compute_utilization", 0)
        return cls(running, held, joules, watts, util, sum(counts.values()))


def check_bounded(counts: list[TickCounts], max_terminated: int) -> None:
    """Held and exported process series stay within max_terminated + running, every tick."""
    for i, c in enumerate(counts):
        assert c.held <= max_terminated + c.running, (i, c)
        assert c.joules == c.watts == c.held, (i, c)  # every held series is exported, and no other
        assert c.util <= c.running, (i, c)
    # Once churn is under way the device series are a constant number: churn adds no other series.
    assert len({c.others for c in counts[len(counts) // 2 :]}) == 1


def churn_graph(config_text: str, clock: SteppedClock) -> Graph:
    registry = Registry.from_entry_points()
    return build(load_config_text(config_text, "churn.yaml", registry, {}), registry, clock, Telemetry(clock))


@dataclass
class Tally:
    """Energy as each tick's records carried it, summed over the run (pruned processes included)."""

    device_mj: int = 0
    idle_mj: int = 0
    processes_mj: int = 0
    unattributed_mj: int = 0

    def add(self, batch: Batch) -> None:
        self.device_mj += sum(p.energy_mj for p in batch.device_power)
        self.idle_mj += sum(p.idle_energy_mj for p in batch.device_power)
        self.processes_mj += sum(s.energy_mj for s in batch.shares if s.pid is not None)
        self.unattributed_mj += sum(s.energy_mj for s in batch.shares if s.pid is None)


def test_drill8a_simulated_churn_through_the_real_nvml_receiver_stays_bounded_and_conserves_energy() -> None:
    """40,000 processes (20 new per tick for 2,000 ticks, each living one or two ticks) on a simulated H100."""
    ticks = CHURN_TICKS
    scenario = churn_scenario(ticks=ticks, per_tick=CHURN_PER_TICK)
    pids = [p.pid for p in scenario.processes]
    config = textwrap.dedent(
        f"""
        receivers:
          nvml: {{required: true}}
        processors:
          idle:
          attribution:
          energy: {{max_terminated: {CHURN_MAX_TERMINATED // 2}}}
        exporters:
          prometheus: {{listen: "127.0.0.1:0"}}
        service:
          telemetry: {{listen: ""}}
          pipelines:
            metrics: {{interval: 1s, receivers: [nvml], processors: [idle, attribution, energy], exporters: [prometheus]}}
        """
    )
    clock = SteppedClock()
    counts: list[TickCounts] = []
    tally = Tally()
    seen: set[int] = set()
    with simulator.install(scenario, clock) as node:
        graph = churn_graph(config, clock)
        service = Service(graph)
        prometheus = graph.exporters["prometheus"]
        energy = graph.pipelines[0].processors[2][1]

        async def drive() -> Batch:
            await service.start()
            runner = service.runners[0]
            batch = None
            for _ in range(ticks + 8):
                batch = await runner.tick()
                tally.add(batch)
                running = {p.pid for p in batch.gpu_processes}
                seen.update(running)
                body = prometheus.body  # type: ignore[attr-defined]
                counts.append(TickCounts.of(len(running), len(energy.series), body))  # type: ignore[attr-defined]
                clock.advance(1.0)
            await service.shutdown()
            assert batch is not None
            return batch

        last = asyncio.run(drive())
        t_end = last.time.monotonic_s - (clock.monotonic() - node.t_s())  # the last tick, in scenario seconds
        true_device_j = node.truth.device_energy_between_j(0, 0.0, t_end)
        true_processes_j = sum(node.truth.process_energy_j(pid, t_end) for pid in pids)

    assert len(seen) == len(pids) == ticks * CHURN_PER_TICK  # every short-lived process was seen
    assert max(c.running for c in counts) >= 1.5 * CHURN_PER_TICK
    check_bounded(counts, CHURN_MAX_TERMINATED // 2)
    assert max(c.held for c in counts) == CHURN_MAX_TERMINATED // 2 + max(c.running for c in counts[20:-10])
    # Conservation per device, summed over every tick: Σ process + unattributed + idle = the counter.
    (dt,) = last.device_totals
    assert tally.processes_mj + tally.unattributed_mj + tally.idle_mj == tally.device_mj == dt.energy_mj
    assert (dt.attributed_energy_mj, dt.unattributed_energy_mj, dt.idle_energy_mj) == (
        tally.processes_mj,
        tally.unattributed_mj,
        tally.idle_mj,
    )
    # ...and equal to the simulator's truth: the counter's energy, and the processes' dynamic energy all
    # attributed (the idle baseline learned in the first idle seconds is the true 70 W).
    ticks_run = len(counts)
    assert dt.energy_mj / 1000 == pytest.approx(true_device_j, abs=ticks_run * 0.002)
    assert (tally.processes_mj + tally.unattributed_mj) / 1000 == pytest.approx(true_processes_j, abs=ticks_run * 0.002)
    assert tally.processes_mj / 1000 == pytest.approx(true_processes_j, rel=0.01)


CHURN_IDLE_POLLS = 3  # the GPU's first polls list no process, so idle (60 W) is learned
CHURN_WARMUP = 200  # ticks after which memory must stay flat
CHURN_MEMORY_AT = (CHURN_WARMUP, 700, 1200, 1700, CHURN_IDLE_POLLS + CHURN_TICKS)  # ticks run when sampled
CHURN_MAX_BLOCK_GROWTH = 50_000  # Python allocator blocks (a bounded cache's sawtooth is ~20,000)
CHURN_MAX_RSS_GROWTH_KIB = 10 * 1024


@dataclass
class ChurnRun:
    counts: list[TickCounts]
    tally: Tally
    last: Batch
    receiver: ChurnGpu
    blocks: dict[int, int]  # ticks run → sys.getallocatedblocks() after a full collection
    rss_kib: dict[int, int]  # ticks run → resident memory
    warnings: list[str]


def rss_kib() -> int:
    """The process's resident memory now (Linux); elsewhere its peak so far."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def churn() -> ChurnRun:
    """2,000 ticks × 20 new processes through idle → attribution → energy → prometheus, on a stepped clock."""
    config = textwrap.dedent(
        f"""
        receivers:
          custom/churn: {{class: "{D}:ChurnGpu", per_tick: {CHURN_PER_TICK}, idle_polls: {CHURN_IDLE_POLLS}}}
        processors:
          idle:
          attribution:
          energy: {{max_terminated: {CHURN_MAX_TERMINATED}}}
        exporters:
          prometheus: {{listen: "127.0.0.1:0"}}
        service:
          telemetry: {{listen: ""}}
          pipelines:
            metrics:
              interval: 1s
              receivers: [custom/churn]
              processors: [idle, attribution, energy]
              exporters: [prometheus]
        """
    )
    clock = SteppedClock()
    graph = churn_graph(config, clock)
    service = Service(graph)
    receiver = graph.receivers["custom/churn"]
    assert isinstance(receiver, ChurnGpu)
    prometheus = graph.exporters["prometheus"]
    energy = graph.pipelines[0].processors[2][1]
    counts: list[TickCounts] = []
    tally = Tally()
    blocks: dict[int, int] = {}
    rss: dict[int, int] = {}
    warnings = _Warnings()
    logging.getLogger("wattpipe").addHandler(warnings)

    async def drive() -> Batch:
        await service.start()
        runner = service.runners[0]
        batch = None
        for n in range(1, CHURN_IDLE_POLLS + CHURN_TICKS + 1):
            batch = await runner.tick()
            tally.add(batch)
            body = prometheus.body  # type: ignore[attr-defined]
            counts.append(TickCounts.of(len(batch.gpu_processes), len(energy.series), body))  # type: ignore[attr-defined]
            if n in CHURN_MEMORY_AT:
                gc.collect()
                blocks[n] = sys.getallocatedblocks()
                rss[n] = rss_kib()
            clock.advance(1.0)
        await service.shutdown()
        assert batch is not None
        return batch

    try:
        last = asyncio.run(drive())
    finally:
        logging.getLogger("wattpipe").removeHandler(warnings)
    return ChurnRun(counts, tally, last, receiver, blocks, rss, warnings.messages)


def test_drill8b_churn_of_40000_processes_keeps_series_within_max_terminated_plus_running(churn: ChurnRun) -> None:
    assert churn.receiver.pids_seen == CHURN_TICKS * CHURN_PER_TICK == 40_000
    assert len(churn.counts) == CHURN_IDLE_POLLS + CHURN_TICKS  # the pipeline ticked throughout
    check_bounded(churn.counts, CHURN_MAX_TERMINATED)
    # Once 100 processes have exited, exactly max_terminated exited ones are kept (the largest consumers; the
    # 1 min retention alone would keep 1,200) besides the 20 running: bounded, and exits still exported.
    steady = churn.counts[CHURN_IDLE_POLLS + CHURN_MAX_TERMINATED // CHURN_PER_TICK + 1 :]
    assert {c.held for c in steady} == {CHURN_MAX_TERMINATED + CHURN_PER_TICK}
    assert {c.util for c in steady} == {CHURN_PER_TICK}
    assert churn.warnings == []  # churn is not a failure: nothing to warn about


def test_drill8b_churn_loses_no_energy_and_conserves_it_per_device(churn: ChurnRun) -> None:
    tally, receiver = churn.tally, churn.receiver
    (dt,) = churn.last.device_totals
    assert receiver.first_counter_mj is not None
    counter_mj = math.floor(receiver.counter_mj) - math.floor(receiver.first_counter_mj)
    assert dt.energy_mj == tally.device_mj == counter_mj  # every millijoule the counter measured
    assert tally.processes_mj + tally.unattributed_mj + tally.idle_mj == dt.energy_mj
    assert (dt.attributed_energy_mj, dt.unattributed_energy_mj, dt.idle_energy_mj) == (
        tally.processes_mj,
        tally.unattributed_mj,
        tally.idle_mj,
    )
    # Exactly: idle 60 W every second after the first poll, 20 processes × 10 W in every churn tick, all of
    # it attributed to them although almost every one of them has left the exported series since.
    assert tally.idle_mj == 60_000 * (CHURN_IDLE_POLLS + CHURN_TICKS - 1)
    assert tally.processes_mj == CHURN_PER_TICK * 10_000 * CHURN_TICKS
    assert tally.unattributed_mj == 0
    # What is still exported: this tick's 20 (one tick's 200 J) and max_terminated exited ones.
    running = [t.energy_mj for t in churn.last.totals if t.scope == "process" and t.state == "running"]
    exited = [t.energy_mj for t in churn.last.totals if t.scope == "process" and t.state == "terminated"]
    assert (len(running), sum(running)) == (CHURN_PER_TICK, CHURN_PER_TICK * 10_000)
    assert len(exited) == CHURN_MAX_TERMINATED
    assert all(e > 0 for e in exited)


def test_drill8b_churn_memory_stays_flat_after_warm_up(churn: ChurnRun) -> None:
    warm = churn.blocks[CHURN_WARMUP]
    growth = {n: b - warm for n, b in churn.blocks.items()}
    rss_growth = max(churn.rss_kib.values()) - churn.rss_kib[CHURN_WARMUP]
    assert max(growth.values()) <= CHURN_MAX_BLOCK_GROWTH, (growth, rss_growth)
    assert rss_growth <= CHURN_MAX_RSS_GROWTH_KIB, (growth, rss_growth)
