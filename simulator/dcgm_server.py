"""A dcgm-exporter on 127.0.0.1 serving the simulated node's ``/metrics``.

Like the real exporter, values are collected every ``collect_interval_s`` (``dcgm-exporter -c``; 30 s
by default, as the real one) on the node's clock, and a scrape between collections sees the last
collection: gauges read at that instant, ratios (activity, utilisation) the mean over the interval
that ended there. Collections are at ``collect_offset_s`` + k·interval of scenario time; a real
exporter's phase against the scraper's ticks is arbitrary. Without explicit options both come from the
scenario's ``dcgm:`` section.

Faults from the scenario (``target: dcgm``) apply per request at the clock's time: ``down`` closes the
connection without an answer, ``slow`` answers after ``delay_s`` real seconds, ``garbage`` answers 200
with bytes that are not exposition text, ``oversized`` answers 200 with ``size_bytes`` of series.

For assertions, ``requests`` counts the ``GET /metrics`` answered so far by what they were answered with
(``"metrics"``, or the fault's kind; counted once the answer is over) and ``body_bytes_sent`` the body
bytes that got out: a scraper that refuses an oversized answer and hangs up is seen to have been sent
only what the sockets buffered, not ``size_bytes``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

from wattpipe.simulator._dcgm_text import DEFAULT_FIELDS, FIELDS, Row, render
from wattpipe.simulator._faults import DcgmFault
from wattpipe.simulator._loopback import LoopbackHttp
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import Container, Pod

__all__ = ["DcgmExporter", "DcgmExporterOptions", "start_dcgm_exporter"]

_GARBAGE = b"\x00\x1f\x8b<html><body>502 Bad Gateway</body></html>\xff\xfe{not: prometheus}\n"


@dataclass(frozen=True, slots=True)
class DcgmExporterOptions:
    """How the simulated exporter is configured (its command-line flags and version)."""

    # "3.x": ``Hostname``, no ``pci_bus_id``, pod labels "" on unallocated devices.
    # "4.x": ``hostname``, ``pci_bus_id``, pod labels absent on unallocated devices.
    vintage: Literal["3.x", "4.x"] = "4.x"
    collect_interval_s: float = 30.0
    collect_offset_s: float = 0.0  # collections at offset + k·interval of scenario time
    fields: tuple[str, ...] = DEFAULT_FIELDS
    extra_fields: tuple[str, ...] = ()  # e.g. ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_POWER_VIOLATION")
    pod_labels: bool = True  # the exporter's Kubernetes mode (pod-resources mapping)
    pod_uid_label: bool = False
    uuid_label: Literal["UUID", "uuid"] = "UUID"  # "uuid" with the exporter's -o flag
    hostname: str | None = None  # None: the scenario's node name
    port: int = 0  # 0: an ephemeral port
    fields_all: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if self.collect_interval_s <= 0:
            raise ValueError("collect_interval_s must be positive")
        if not 0 <= self.collect_offset_s < self.collect_interval_s:
            raise ValueError("collect_offset_s must be at least 0 and less than collect_interval_s")
        chosen = tuple(dict.fromkeys(self.fields + self.extra_fields))
        unknown = [name for name in chosen if name not in FIELDS]
        if unknown:
            raise ValueError(f"unknown dcgm fields {unknown}; known: {sorted(FIELDS)}")
        object.__setattr__(self, "fields_all", chosen)


class DcgmExporter:
    """A running exporter. Stop it with :meth:`close` (or by closing its node)."""

    def __init__(self, node: SimulatedNode, options: DcgmExporterOptions | None = None) -> None:
        self.node = node
        spec = node.scenario.dcgm
        self.options = options or DcgmExporterOptions(
            collect_interval_s=spec.collect_interval_s,
            collect_offset_s=spec.collect_offset_s,
            extra_fields=tuple(spec.extra_fields),
        )
        self._allocations = _allocations(node)
        self.requests: Counter[str] = Counter()  # GET /metrics answered (to the end) with: "metrics" or a fault's kind
        self.body_bytes_sent = 0  # body bytes written, over all answers
        self._count_lock = threading.Lock()
        self._http = LoopbackHttp(self.options.port, _handler(self), "sim-dcgm-exporter")

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def collection_time_s(self, t_s: float) -> float:
        """The scenario time of the last collection at or before ``t_s``."""
        interval, offset = self.options.collect_interval_s, self.options.collect_offset_s
        return offset + math.floor((t_s - offset) / interval + 1e-9) * interval

    def metrics_text(self, t_s: float | None = None) -> str:
        """What ``/metrics`` answers at scenario time ``t_s`` (default: now), faults aside."""
        collected_s = self.collection_time_s(self.node.t_s() if t_s is None else t_s)
        rows = self._rows(collected_s)
        return render(self.node, rows, self.options.fields_all, self._labels)

    def _rows(self, collected_s: float) -> list[Row]:
        t0_s = collected_s - self.options.collect_interval_s
        rows = []
        for gpu in range(len(self.node.scenario.gpus)):
            mig = self.node.truth.gpu_state(gpu, collected_s).mig
            if mig is None:
                rows.append(Row(gpu, None, None, t0_s, collected_s))
                continue
            for instance in sorted(mig.instances, key=lambda inst: inst.gi):
                rows.append(Row(gpu, instance.gi, instance.profile, t0_s, collected_s))
        return rows

    def _labels(self, row: Row) -> list[tuple[str, str]]:
        options = self.options
        gpu = self.node.scenario.gpus[row.gpu]
        labels = [("gpu", str(row.gpu)), (options.uuid_label, gpu.uuid)]
        if options.vintage == "4.x":
            labels.append(("pci_bus_id", gpu.pci_bus_id))
        labels += [("device", f"nvidia{row.gpu}"), ("modelName", gpu.model)]
        if row.gi is not None:
            labels += [("GPU_I_PROFILE", row.profile or ""), ("GPU_I_ID", str(row.gi))]
        hostname = options.hostname or self.node.scenario.node.name
        labels.append(("Hostname" if options.vintage == "3.x" else "hostname", hostname))
        labels.append(("DCGM_FI_DRIVER_VERSION", self.node.scenario.node.driver_version))
        if not options.pod_labels:
            return labels
        allocation = self._allocations.get((row.gpu, row.gi))
        if allocation is None and options.vintage == "4.x":
            return labels
        pod, container = allocation if allocation else (None, None)
        labels += [
            ("container", container.name if container else ""),
            ("namespace", pod.namespace if pod else ""),
            ("pod", pod.name if pod else ""),
        ]
        if options.pod_uid_label:
            labels.append(("pod_uid", pod.uid if pod else ""))
        return labels

    def _count(self, answer: str | None = None, body_bytes: int = 0) -> None:
        with self._count_lock:  # one handler thread per request
            if answer is not None:
                self.requests[answer] += 1
            self.body_bytes_sent += body_bytes

    def close(self) -> None:
        self._http.stop()

    def __enter__(self) -> DcgmExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _allocations(node: SimulatedNode) -> dict[tuple[int, int | None], tuple[Pod, Container]]:
    """Device → pod and container. On a shared device the exporter keeps only the last pod it sees."""
    allocations: dict[tuple[int, int | None], tuple[Pod, Container]] = {}
    for pod in node.scenario.pods:
        for container in pod.containers:
            for device in container.devices:
                allocations[(device.gpu, device.gi)] = (pod, container)
    return allocations


def _handler(exporter: DcgmExporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self._answer(404, b"404 page not found\n")
                return
            fault = exporter.node.service_fault("dcgm", exporter.node.t_s())
            try:
                self._metrics(fault if isinstance(fault, DcgmFault) else None)
            finally:  # counted once the answer is over, so a count says its bytes are all in body_bytes_sent
                exporter._count(fault.kind if isinstance(fault, DcgmFault) else "metrics")

        def _metrics(self, fault: DcgmFault | None) -> None:
            if fault is not None and fault.kind == "down":
                self.close_connection = True  # nothing written: the client sees the peer hang up
                return
            if fault is not None and fault.kind == "slow":
                time.sleep(fault.delay_s)  # network latency, not simulated time
            if fault is not None and fault.kind == "garbage":
                self._answer(200, _GARBAGE)
            elif fault is not None and fault.kind == "oversized":
                self._oversized(fault.size_bytes)
            else:
                self._answer(200, exporter.metrics_text().encode())

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._send(body)

        def _oversized(self, size_bytes: int) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(size_bytes))
            self.end_headers()
            sent, series = 0, 0
            while sent < size_bytes:
                chunk = "".join(
                    f'DCGM_FI_DEV_XID_ERRORS{{gpu="{series + i}",UUID="GPU-flood",device="nvidia0"}} 0\n'
                    for i in range(1000)
                ).encode()[: size_bytes - sent]
                if not self._send(chunk):
                    return
                sent, series = sent + len(chunk), series + 1000

        def _send(self, data: bytes) -> bool:
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                return False  # the scraper gave up; so do we
            exporter._count(body_bytes=len(data))
            return True

        def log_message(self, format: str, *args: Any) -> None:
            return  # no access log on stderr

    return Handler


def start_dcgm_exporter(node: SimulatedNode, options: DcgmExporterOptions | None = None) -> DcgmExporter:
    """Start an exporter for ``node`` on 127.0.0.1; it stops when the node closes."""
    exporter = DcgmExporter(node, options)
    node.on_close(exporter.close)
    return exporter
