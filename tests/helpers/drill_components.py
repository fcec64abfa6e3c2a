"""Test-only components for the failure drills (tests/e2e/test_drill_process.py).

Loaded in configs through ``custom`` (``class: tests.helpers.drill_components:…``), in a ``wattpipe run`` or
``wattpipe demo`` subprocess as well as in-process: they speak the real component contract.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import CreateContext
from wattpipe.pipeline.records import DeviceSample, GpuProcessSample, Record


def stamp(poll: int) -> float:
    """The SM utilisation every process of ``StampedGpus`` reports at its ``poll``-th poll (1-based):
    a per-tick value, so a response that mixed two ticks would show two of them."""
    return (poll % 9000 + 1) / 10_000


class StampedGpus:
    """A receiver for ``devices`` fake GPUs read at one instant: every counter grows by ``watts`` × clock
    time since the first poll (so all devices' totals are equal in any one tick), each GPU runs
    ``pids_per_device`` processes, and every process's SM utilisation is :func:`stamp` of the poll."""

    provides = frozenset({"devices", "gpu_processes"})

    def __init__(
        self, *, devices: int = 4, pids_per_device: int = 3, watts: float = 300.0, context: CreateContext
    ) -> None:
        self.devices = devices
        self.pids_per_device = pids_per_device
        self.watts = watts
        self.clock = context.clock
        self.polls = 0
        self._t0: float | None = None

    async def collect(self) -> Sequence[Record]:
        self.polls += 1
        now = self.clock.now()
        if self._t0 is None:
            self._t0 = now.monotonic_s
        energy_mj = (now.monotonic_s - self._t0) * self.watts * 1000.0
        util = stamp(self.polls)
        out: list[Record] = []
        for d in range(self.devices):
            uuid = f"GPU-stamp-{d}"
            out.append(DeviceSample(time=now, device_id=uuid, device_index=d, power_w=self.watts, energy_mj=energy_mj))
            out.extend(
                GpuProcessSample(time=now, device_id=uuid, pid=1000 * (d + 1) + p, sm_util=util)
                for p in range(self.pids_per_device)
            )
        return out


class ChurnGpu:
    """A receiver for one fake GPU with process churn.

    Its first ``idle_polls`` polls list no process (so the ``idle`` processor can learn the baseline);
    from then on every poll lists ``per_tick`` processes that were never seen before and are never seen
    again (pids counting up from ``first_pid``), each with its own SM utilisation. The energy counter
    integrates the true power exactly: ``idle_w`` plus ``process_w`` per process listed, over the
    interval that ends at the poll (the processes a poll lists are those that ran during that interval).
    """

    provides = frozenset({"devices", "gpu_processes"})

    def __init__(
        self,
        *,
        uuid: str = "GPU-churn-0",
        per_tick: int = 20,
        idle_polls: int = 3,
        idle_w: float = 60.0,
        process_w: float = 10.0,
        first_pid: int = 10_000,
        context: CreateContext,
    ) -> None:
        self.uuid = uuid
        self.per_tick = per_tick
        self.idle_polls = idle_polls
        self.idle_w = idle_w
        self.process_w = process_w
        self.first_pid = first_pid
        self.clock = context.clock
        self.polls = 0
        self.counter_mj = 5_000_000.0  # a counter since driver load: not zero at the first read
        self.first_counter_mj: float | None = None
        self.pids_seen = 0
        self._last_s: float | None = None

    async def collect(self) -> Sequence[Record]:
        now = self.clock.now()
        k = self.polls
        self.polls += 1
        pids = (
            []
            if k < self.idle_polls
            else [self.first_pid + (k - self.idle_polls) * self.per_tick + j for j in range(self.per_tick)]
        )
        if self._last_s is not None:
            self.counter_mj += (self.idle_w + len(pids) * self.process_w) * (now.monotonic_s - self._last_s) * 1000.0
        self._last_s = now.monotonic_s
        if self.first_counter_mj is None:
            self.first_counter_mj = self.counter_mj
        self.pids_seen += len(pids)
        out: list[Record] = [
            DeviceSample(time=now, device_id=self.uuid, device_index=0, power_w=None, energy_mj=self.counter_mj)
        ]
        out.extend(
            GpuProcessSample(time=now, device_id=self.uuid, pid=pid, sm_util=0.01 * (1 + pid % 7)) for pid in pids
        )
        return out


def ledger_line(n: int, batch: Batch) -> dict[str, Any]:
    """What the ``Ledger`` exporter writes for one tick: the energy each record carried, by device."""
    return {
        "n": n,
        "monotonic_s": batch.time.monotonic_s,
        "wall_s": batch.time.wall_s,
        "interval_s": batch.interval_s,
        "device_totals": {
            d.device_id: {
                "energy_mj": d.energy_mj,
                "idle_energy_mj": d.idle_energy_mj,
                "active_energy_mj": d.active_energy_mj,
                "attributed_energy_mj": d.attributed_energy_mj,
                "unattributed_energy_mj": d.unattributed_energy_mj,
            }
            for d in batch.device_totals
        },
        "process_totals": {f"{t.key}@{t.device_id}": t.energy_mj for t in batch.totals if t.scope == "process"},
        "device_power": {
            p.device_id: {"energy_mj": p.energy_mj, "idle_energy_mj": p.idle_energy_mj, "idle_w": p.idle_w}
            for p in batch.device_power
        },
        "device_counters": {d.device_id: d.energy_mj for d in batch.devices},
        "written_wall_s": time.time(),  # when the line was written (real time: the drills compare it to a signal's)
    }


class Ledger:
    """An exporter that writes one JSON line per tick (:func:`ledger_line`) to ``path``.

    With ``slow_s`` each export first says it started (a line in ``<path>.started``), then takes that long
    before it records the batch: an export a signal can arrive in the middle of. At shutdown it writes
    ``<path>.flushed``: how many batches it recorded, and its pid.
    """

    def __init__(self, *, path: str, slow_s: float = 0.0) -> None:
        self.path = Path(path)
        self.started = Path(f"{path}.started")
        self.slow_s = slow_s
        self.count = 0
        self.begun = 0

    async def export(self, batch: Batch) -> None:
        self.begun += 1
        if self.slow_s:
            with self.started.open("a") as fh:
                fh.write(f"{self.begun}\n")
            await asyncio.sleep(self.slow_s)
        self.count += 1
        with self.path.open("a") as fh:
            fh.write(json.dumps(ledger_line(self.count, batch), sort_keys=True) + "\n")

    def shutdown(self) -> None:
        Path(f"{self.path}.flushed").write_text(f"{self.count} {os.getpid()}\n")


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a ``Ledger`` file (a process killed mid-write leaves at most half a line)."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")
    return [json.loads(line) for line in lines[:-1] if line]


@dataclass
class OtlpRequest:
    """One request an :class:`SlowOtlpSink` received: decoded, with when it came and when it was answered."""

    request: Any  # ExportMetricsServiceRequest
    received_s: float  # time.monotonic()
    answered_s: float | None = None

    def sums(self, name: str) -> list[tuple[dict[str, Any], float]]:
        """The data points of the sum metric ``name``: (attributes, value)."""
        out = []
        for rm in self.request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name != name or metric.WhichOneof("data") != "sum":
                        continue
                    for p in metric.sum.data_points:
                        attrs = {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in p.attributes}
                        value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                        out.append((attrs, value))
        return out


class SlowOtlpSink:
    """An OTLP/HTTP metrics endpoint (``POST /v1/metrics``) on loopback that answers every request after
    ``delay_s`` real seconds (sooner when closed), recording each one: a collector the exporter's sender is
    waiting on."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.requests: list[OtlpRequest] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = metrics_service_pb2.ExportMetricsServiceRequest()
                request.ParseFromString(body)
                entry = OtlpRequest(request, time.monotonic())
                with sink._lock:
                    sink.requests.append(entry)
                sink._closing.wait(sink.delay_s)
                answer = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                self.wfile.flush()
                entry.answered_s = time.monotonic()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def in_flight(self) -> bool:
        with self._lock:
            return any(r.answered_s is None for r in self.requests)

    def received(self) -> list[OtlpRequest]:
        with self._lock:
            return list(self.requests)

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> SlowOtlpSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
