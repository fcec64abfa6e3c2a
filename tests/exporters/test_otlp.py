"""Exporter ``otlp``: hand-built MetricsData with explicit timestamps, against real OTLP receivers on loopback."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2
from pydantic import ValidationError

from exporters.otlp import OtlpConfig, OtlpExporter, factory
from pipeline.clock import Timestamp
from pipeline.components import Registry
from pipeline.records import Batch, DevicePower, DeviceTotals, Totals
from pipeline.telemetry import Telemetry
from tests.helpers.context import make_context

Request = metrics_service_pb2.ExportMetricsServiceRequest
START = Timestamp(monotonic_s=900.0, wall_s=1_767_225_500.0)
GPU = "GPU-aaaa"
CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def at(offset_s: float) -> Timestamp:
    return Timestamp(monotonic_s=1000.0 + offset_s, wall_s=1_767_225_600.0 + offset_s)


def batch(offset_s: float, energy_mj: int, process_mj: int = 0) -> Batch:
    """One tick: a GPU's power, its totals since START, and one process's totals since START."""
    t = at(offset_s)
    device: dict[str, Any] = {"device_id": GPU, "device_index": 0, "device_name": "NVIDIA H100", "vendor": "nvidia"}
    power = DevicePower(
        time=t,
        **device,
        interval_s=5.0,
        power_w=250.5,
        idle_w=60.0,
        active_w=190.5,
        energy_mj=1_252_500,
        idle_energy_mj=300_000,
        active_energy_mj=952_500,
    )
    totals = DeviceTotals(
        time=t,
        **device,
        energy_mj=energy_mj,
        idle_energy_mj=0,
        active_energy_mj=energy_mj,
        attributed_energy_mj=process_mj,
        unattributed_energy_mj=energy_mj - process_mj,
        start=START,
    )
    process = Totals(
        time=t, scope="process", key="4242", device_id=GPU, energy_mj=process_mj, power_w=10.0, start=START
    )
    return Batch(time=t, interval_s=5.0, node="n1").with_records([power, totals, process])


# --- receivers ------------------------------------------------------------------------------------


class Collector(metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP/gRPC metrics receiver that records requests; ``down`` answers UNAVAILABLE, as an outage would."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.metadata: list[dict[str, str]] = []
        self.down = False
        self.attempts = 0
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self._lock:
            self.attempts += 1
        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "collector down")
        with self._lock:
            self.requests.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def wait_for(self, count: int, timeout_s: float = 5.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        raise AssertionError(f"{len(self.requests)} requests arrived, expected {count}")


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    servicer = Collector()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, str], Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = Request()
        request.ParseFromString(body)
        self.received.append((self.path, dict(self.headers), request))
        reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_collector() -> Iterator[tuple[list[tuple[str, dict[str, str], Any]], str]]:
    received: list[tuple[str, dict[str, str], Any]] = []
    handler = type("Handler", (_HttpHandler,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# --- helpers --------------------------------------------------------------------------------------

FAST = {"timeout": 0.5, "retry_initial_interval": 0.05, "retry_max_interval": 0.2, "shutdown_timeout": 2.0}


def make_exporter(endpoint: str, telemetry: Telemetry | None = None, **options: Any) -> OtlpExporter:
    config = OtlpConfig(endpoint=endpoint, **{"insecure": True, **FAST, **options})
    return OtlpExporter(config, make_context("otlp", "exporter", telemetry=telemetry, node_name="node-7"))


def run(exporter: OtlpExporter, *batches: Batch) -> None:
    """Start, export every batch, and shut down (which flushes the queue)."""

    async def go() -> None:
        exporter.start()
        for b in batches:
            await exporter.export(b)
        await exporter.shutdown()

    asyncio.run(go())


def attrs(pairs: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in pairs}


def metrics_of(request: Any) -> dict[str, Any]:
    return {m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def sum_points(request: Any, name: str) -> list[tuple[float, int, int]]:
    """(value, start_time_unix_nano, time_unix_nano) of a Sum's points."""
    return [(p.as_double, p.start_time_unix_nano, p.time_unix_nano) for p in metrics_of(request)[name].sum.data_points]


def dropped(telemetry: Telemetry) -> float:
    value = telemetry.registry.get_sample_value(
        "wattpipe_exporter_dropped_total", {"pipeline": "metrics", "component": "otlp"}
    )
    return value or 0.0


# --- what is sent ---------------------------------------------------------------------------------


def test_grpc_sends_hw_metrics_with_units_attributes_and_resource(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    run(make_exporter(endpoint, headers={"Authorization": "Bearer s3cret"}), batch(0.0, 1_234_567, 1_000))
    (request,) = servicer.wait_for(1)
    metrics = metrics_of(request)

    power = metrics["hw.power"]
    assert power.unit == "W"
    (point,) = power.gauge.data_points
    assert point.as_double == 250.5
    assert point.time_unix_nano == at(0.0).wall_ns
    assert attrs(point.attributes) == {
        "hw.id": GPU,
        "hw.type": "gpu",
        "hw.name": "NVIDIA H100",
        "hw.vendor": "nvidia",
        "wattpipe.gpu.index": 0,
    }

    energy = metrics["hw.energy"]
    assert energy.unit == "J"
    assert energy.sum.is_monotonic
    assert energy.sum.aggregation_temporality == CUMULATIVE
    assert sum_points(request, "hw.energy") == [(1234.567, START.wall_ns, at(0.0).wall_ns)]

    (process,) = metrics["wattpipe.process.gpu.energy"].sum.data_points
    assert process.as_double == 1.0
    assert attrs(process.attributes)["process.pid"] == 4242
    assert attrs(process.attributes)["hw.id"] == GPU

    resource = attrs(request.resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "wattpipe"
    assert resource["service.instance.id"] == "node-7"
    assert resource["k8s.node.name"] == "node-7"
    assert resource["host.name"]
    assert servicer.metadata[0]["authorization"] == "Bearer s3cret"


def test_http_protobuf_posts_to_v1_metrics_gzipped(http_collector: tuple[list[Any], str]) -> None:
    received, endpoint = http_collector
    run(make_exporter(endpoint, protocol="http/protobuf", compression="gzip"), batch(0.0, 5_000))
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        time.sleep(0.01)
    ((path, headers, request),) = received
    assert path == "/v1/metrics"
    assert headers["Content-Encoding"] == "gzip"
    assert sum_points(request, "hw.energy") == [(5.0, START.wall_ns, at(0.0).wall_ns)]


def test_delta_temporality_sends_the_energy_since_the_last_export(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    run(make_exporter(endpoint, temporality="delta"), batch(0.0, 1_000), batch(5.0, 2_501), batch(10.0, 4_000))
    requests = servicer.wait_for(3)
    assert metrics_of(requests[0])["hw.energy"].sum.aggregation_temporality == DELTA
    assert [sum_points(r, "hw.energy")[0] for r in requests] == [
        (1.0, START.wall_ns, at(0.0).wall_ns),  # the first delta runs from the series' start
        (1.501, at(0.0).wall_ns, at(5.0).wall_ns),
        (1.499, at(5.0).wall_ns, at(10.0).wall_ns),
    ]


# --- outages, the queue and shutdown --------------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_first_export_after_an_outage_carries_the_full_totals(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(endpoint, telemetry, queue_size=1)
    servicer.down = True

    async def go() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))  # the sender takes it and retries
        await asyncio.sleep(0.1)
        await exporter.export(batch(5.0, 2_000))  # queued
        await exporter.export(batch(10.0, 3_000))  # queue full: batch(5.0) is dropped
        servicer.down = False
        await exporter.shutdown()

    asyncio.run(go())
    assert dropped(telemetry) == 3  # batch(5.0)'s three records
    values = [sum_points(r, "hw.energy")[0] for r in servicer.wait_for(2)]
    assert values == [(1.0, START.wall_ns, at(0.0).wall_ns), (3.0, START.wall_ns, at(10.0).wall_ns)]


def test_full_queue_drops_the_oldest_batch_and_counts_its_records(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(endpoint, telemetry, queue_size=2)

    async def go() -> None:
        for i in range(3):  # not started: nothing leaves the queue
            await exporter.export(batch(5.0 * i, 1_000 * (i + 1)))
        assert exporter.queued == 2
        assert dropped(telemetry) == 3
        exporter.start()
        await exporter.shutdown()

    asyncio.run(go())
    assert [sum_points(r, "hw.energy")[0][0] for r in servicer.wait_for(2)] == [2.0, 3.0]


def test_shutdown_flushes_the_queue_within_its_timeout(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    exporter = make_exporter(endpoint, queue_size=100)
    began = time.monotonic()
    run(exporter, *(batch(5.0 * i, 1_000 * i) for i in range(20)))
    assert time.monotonic() - began < FAST["shutdown_timeout"]
    assert len(servicer.wait_for(20, timeout_s=0)) == 20


def test_a_batch_is_given_up_after_max_elapsed_time_and_counted(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    servicer.down = True
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(endpoint, telemetry, retry_max_elapsed_time=0.3)

    async def go() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))
        await asyncio.to_thread(wait_until, lambda: dropped(telemetry) == 3)
        await exporter.shutdown()

    asyncio.run(go())
    assert servicer.requests == []


def test_new_batches_do_not_cut_the_backoff_short(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    servicer.down = True
    exporter = make_exporter(
        endpoint, retry_initial_interval=0.4, retry_max_interval=0.4, queue_size=10, shutdown_timeout=0.1
    )

    async def go() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))
        for i in range(1, 6):
            await asyncio.sleep(0.03)
            await exporter.export(batch(5.0 * i, 1_000 * i))
        assert servicer.attempts == 1  # still waiting out the first backoff
        await exporter.shutdown()

    asyncio.run(go())


def test_shutdown_drops_what_it_cannot_send_in_time(collector: tuple[Collector, str]) -> None:
    servicer, endpoint = collector
    servicer.down = True
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(endpoint, telemetry, shutdown_timeout=0.3)
    began = time.monotonic()
    run(exporter, batch(0.0, 1_000), batch(5.0, 2_000))
    assert time.monotonic() - began < 0.3 + FAST["timeout"] + 0.5
    assert dropped(telemetry) == 6


# --- configuration --------------------------------------------------------------------------------


def test_defaults_follow_the_issue() -> None:
    config = OtlpConfig()
    assert (config.protocol, config.resolved_endpoint(), config.timeout) == ("grpc", "localhost:4317", 10.0)
    assert (config.queue_size, config.retry_initial_interval, config.retry_max_interval) == (100, 5.0, 30.0)
    assert config.retry_max_elapsed_time == 300.0
    assert config.temporality == "cumulative"
    http_config = OtlpConfig(protocol="http/protobuf")
    assert http_config.resolved_endpoint() == "http://localhost:4318/v1/metrics"
    assert OtlpConfig(protocol="http/protobuf", endpoint="https://c:4318/").resolved_endpoint() == (
        "https://c:4318/v1/metrics"
    )
    assert OtlpConfig(protocol="http/protobuf", endpoint="https://c/otlp/v1/m").resolved_endpoint() == (
        "https://c/otlp/v1/m"
    )


def test_config_rejects_a_certificate_without_its_key_and_unknown_options() -> None:
    with pytest.raises(ValidationError, match="cert_file and key_file"):
        OtlpConfig(cert_file="/c.pem")
    with pytest.raises(ValidationError):
        OtlpConfig.model_validate({"endpointt": "x"})
    with pytest.raises(ValidationError):
        OtlpConfig.model_validate({"compression": "zstd"})


def test_factory_registers_an_exporter_named_otlp() -> None:
    registry = Registry([factory])
    assert registry.get("exporter", "otlp") is factory
    assert isinstance(factory.create(make_context("otlp", "exporter"), factory.default_config()), OtlpExporter)
