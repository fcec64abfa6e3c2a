"""Exporter ``otlp``: hand-built MetricsData with explicit timestamps, against real OTLP receivers on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from tests.helpers.context import make_context
from tests.helpers.otlp_receiver import CUMULATIVE, DELTA, OtlpReceiver, attributes, wait_until
from wattpipe.exporters.otlp import OtlpConfig, OtlpExporter, factory
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.records import DevicePower, DeviceTotals, Totals
from wattpipe.pipeline.telemetry import Telemetry

START = Timestamp(monotonic_s=900.0, wall_s=1_767_225_500.0)
GPU = "GPU-aaaa"


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


# --- the receiver ---------------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """One OTLP receiver (gRPC and HTTP on loopback) per test: tests/helpers/otlp_receiver.py."""
    with OtlpReceiver() as r:
        yield r


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


def test_grpc_sends_hw_metrics_with_units_attributes_and_resource(receiver: OtlpReceiver) -> None:
    run(make_exporter(receiver.grpc_endpoint, headers={"Authorization": "Bearer s3cret"}), batch(0.0, 1_234_567, 1_000))
    (received,) = receiver.wait_for_requests(1, "grpc")
    request = received.request
    metrics = metrics_of(request)

    power = metrics["hw.power"]
    assert power.unit == "W"
    (point,) = power.gauge.data_points
    assert point.as_double == 250.5
    assert point.time_unix_nano == at(0.0).wall_ns
    assert attributes(point.attributes) == {
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
    assert attributes(process.attributes)["process.pid"] == 4242
    assert attributes(process.attributes)["hw.id"] == GPU

    resource = attributes(request.resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "wattpipe"
    assert resource["service.instance.id"] == "node-7"
    assert resource["k8s.node.name"] == "node-7"
    assert resource["host.name"]
    assert received.metadata["authorization"] == "Bearer s3cret"


def test_http_protobuf_posts_to_v1_metrics_gzipped(receiver: OtlpReceiver) -> None:
    run(make_exporter(receiver.http_endpoint, protocol="http/protobuf", compression="gzip"), batch(0.0, 5_000))
    (received,) = receiver.wait_for_requests(1, "http")
    assert received.path == "/v1/metrics"
    assert received.metadata["Content-Encoding"] == "gzip"
    assert sum_points(received.request, "hw.energy") == [(5.0, START.wall_ns, at(0.0).wall_ns)]
    assert receiver.count("grpc") == 0


def test_delta_temporality_sends_the_energy_since_the_last_export(receiver: OtlpReceiver) -> None:
    run(
        make_exporter(receiver.grpc_endpoint, temporality="delta"),
        batch(0.0, 1_000),
        batch(5.0, 2_501),
        batch(10.0, 4_000),
    )
    requests = [r.request for r in receiver.wait_for_requests(3, "grpc")]
    assert metrics_of(requests[0])["hw.energy"].sum.aggregation_temporality == DELTA
    assert [sum_points(r, "hw.energy")[0] for r in requests] == [
        (1.0, START.wall_ns, at(0.0).wall_ns),  # the first delta runs from the series' start
        (1.501, at(0.0).wall_ns, at(5.0).wall_ns),
        (1.499, at(5.0).wall_ns, at(10.0).wall_ns),
    ]


def test_delta_goes_on_from_running_to_terminated_without_counting_the_process_twice(receiver: OtlpReceiver) -> None:
    def with_state(b: Batch, state: str) -> Batch:
        records = [dataclasses.replace(r, state=state) if isinstance(r, Totals) else r for r in b.records()]
        return Batch(time=b.time, interval_s=b.interval_s, node=b.node).with_records(records)

    run(
        make_exporter(receiver.grpc_endpoint, temporality="delta"),
        batch(0.0, 5_000, process_mj=1_000),
        with_state(batch(5.0, 6_000, process_mj=1_500), "terminated"),
    )
    requests = [r.request for r in receiver.wait_for_requests(2, "grpc")]
    (running,), (terminated,) = (metrics_of(r)["wattpipe.process.gpu.energy"].sum.data_points for r in requests)
    assert attributes(running.attributes)["wattpipe.state"] == "running"
    assert attributes(terminated.attributes)["wattpipe.state"] == "terminated"
    assert (running.as_double, running.start_time_unix_nano) == (1.0, START.wall_ns)
    # The exited process's series goes on from its last running point: 0.5 J more, not its 1.5 J total again.
    assert (terminated.as_double, terminated.start_time_unix_nano) == (0.5, at(0.0).wall_ns)


# --- outages, the queue and shutdown --------------------------------------------------------------


def energy_values(receiver: OtlpReceiver, count: int) -> list[tuple[float, int, int]]:
    return [sum_points(r.request, "hw.energy")[0] for r in receiver.wait_for_requests(count, "grpc")]


def test_first_export_after_an_outage_carries_the_full_totals(receiver: OtlpReceiver) -> None:
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.grpc_endpoint, telemetry, queue_size=1)
    receiver.down = True

    async def go() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))  # the sender takes it and retries
        await asyncio.to_thread(receiver.wait_for_attempts, 1)
        await exporter.export(batch(5.0, 2_000))  # queued
        await exporter.export(batch(10.0, 3_000))  # queue full: batch(5.0) is dropped
        receiver.down = False
        await exporter.shutdown()

    asyncio.run(go())
    assert dropped(telemetry) == 3  # batch(5.0)'s three records
    values = energy_values(receiver, 2)
    assert values == [(1.0, START.wall_ns, at(0.0).wall_ns), (3.0, START.wall_ns, at(10.0).wall_ns)]


def test_full_queue_drops_the_oldest_batch_and_counts_its_records(receiver: OtlpReceiver) -> None:
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.grpc_endpoint, telemetry, queue_size=2)

    async def go() -> None:
        for i in range(3):  # not started: nothing leaves the queue
            await exporter.export(batch(5.0 * i, 1_000 * (i + 1)))
        assert exporter.queued == 2
        assert dropped(telemetry) == 3
        exporter.start()
        await exporter.shutdown()

    asyncio.run(go())
    assert [v[0] for v in energy_values(receiver, 2)] == [2.0, 3.0]


def test_shutdown_flushes_the_queue_within_its_timeout(receiver: OtlpReceiver) -> None:
    exporter = make_exporter(receiver.grpc_endpoint, queue_size=100)
    began = time.monotonic()
    run(exporter, *(batch(5.0 * i, 1_000 * i) for i in range(20)))
    assert time.monotonic() - began < FAST["shutdown_timeout"]
    assert len(receiver.wait_for_requests(20, "grpc", timeout_s=0)) == 20


def test_a_batch_is_given_up_after_max_elapsed_time_and_counted(receiver: OtlpReceiver) -> None:
    receiver.down = True
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.grpc_endpoint, telemetry, retry_max_elapsed_time=0.3)

    async def go() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))
        await asyncio.to_thread(wait_until, lambda: dropped(telemetry) == 3, 5.0, "the batch to be given up")
        await exporter.shutdown()

    asyncio.run(go())
    assert receiver.requests() == []
    assert receiver.refused("grpc") >= 1


def test_new_batches_do_not_cut_the_backoff_short(receiver: OtlpReceiver) -> None:
    receiver.down = True
    exporter = make_exporter(
        receiver.grpc_endpoint, retry_initial_interval=2.0, retry_max_interval=2.0, queue_size=10, shutdown_timeout=0.1
    )

    async def go() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))
        for i in range(1, 6):
            await asyncio.sleep(0.03)
            await exporter.export(batch(5.0 * i, 1_000 * i))
        assert receiver.attempts() == 1  # still waiting out the first backoff
        await exporter.shutdown()

    asyncio.run(go())


def test_shutdown_drops_what_it_cannot_send_in_time(receiver: OtlpReceiver) -> None:
    receiver.down = True
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.grpc_endpoint, telemetry, shutdown_timeout=0.3)
    began = time.monotonic()
    run(exporter, batch(0.0, 1_000), batch(5.0, 2_000))
    assert time.monotonic() - began < 0.3 + FAST["timeout"] + 0.5
    assert dropped(telemetry) == 6


def test_a_shutdown_cut_short_by_the_service_leaves_no_thread_blocking_the_exit(receiver: OtlpReceiver) -> None:
    # The service gives every component a share of service.shutdown_timeout and cancels what overruns it.
    # Cancelled, the exporter's wait must end there: no pool thread left joining the sender (the interpreter
    # would wait for it at exit, seconds after "stopped cleanly").
    receiver.down = True
    exporter = make_exporter(receiver.grpc_endpoint, shutdown_timeout=5.0, timeout=2.0)

    async def body() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(exporter.shutdown(), timeout=0.2)
        assert time.monotonic() - began < 1.0

    began = time.monotonic()
    asyncio.run(body())  # asyncio.run waits for its pool threads: a join() blocked in one held it ~7 s
    assert time.monotonic() - began < 3.0
    # The collector back, the sender delivers and ends (so no thread of this test logs into the next ones).
    receiver.down = False
    assert exporter.sender.wait_ended(10.0)


# --- what an outage logs and counts ---------------------------------------------------------------


def failed(telemetry: Telemetry) -> float:
    value = telemetry.registry.get_sample_value(
        "wattpipe_exporter_failed_total", {"pipeline": "metrics", "component": "otlp"}
    )
    return value or 0.0


def warnings_and_errors(caplog: pytest.LogCaptureFixture, logger_prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(logger_prefix)]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_outage_is_logged_once_and_every_failed_attempt_is_counted(
    receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    caplog.set_level(logging.DEBUG)
    telemetry = Telemetry(make_context().clock)
    grpc = protocol == "grpc"
    endpoint = receiver.grpc_endpoint if grpc else receiver.http_endpoint
    exporter = make_exporter(
        endpoint, telemetry, protocol=protocol, retry_initial_interval=0.01, retry_max_interval=0.02
    )
    receiver.down = True

    async def go() -> None:
        exporter.start()
        await exporter.export(batch(0.0, 1_000))
        await asyncio.to_thread(receiver.wait_for_attempts, 4)  # the first attempt and three retries
        receiver.down = False
        await asyncio.to_thread(receiver.wait_for_requests, 1)
        await exporter.shutdown()

    asyncio.run(go())
    refused = receiver.refused("grpc" if grpc else "http")
    assert refused >= 4
    # Each failed attempt adds the batch's three records; the receiver saw one more attempt than that: the success.
    assert failed(telemetry) == 3 * refused
    assert dropped(telemetry) == 0
    ours = warnings_and_errors(caplog, "wattpipe.exporter.otlp")
    assert len(ours) == 1, ours  # not one per attempt
    assert ours[0].startswith(f"exporter otlp: cannot send to {exporter.config.resolved_endpoint()}: ")
    # The SDK's own account of the failure is the detail (over HTTP it does not name the status).
    assert ("StatusCode.UNAVAILABLE, error details: collector down" if grpc else "Failed to export metrics") in ours[0]
    assert warnings_and_errors(caplog, "opentelemetry") == []  # its per-attempt lines are not logged as well
    recovered = [r.getMessage() for r in caplog.records if "again, after" in r.getMessage()]
    assert len(recovered) == 1
    assert f"after {refused} failed attempts" in recovered[0]


def test_a_full_queue_is_logged_once_until_it_drains(receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.grpc_endpoint, telemetry, queue_size=2)

    async def go() -> None:
        for i in range(6):  # not started: four batches are dropped, the queue keeps the last two
            await exporter.export(batch(5.0 * i, 1_000 * (i + 1)))
        exporter.start()
        await exporter.shutdown()

    asyncio.run(go())
    assert dropped(telemetry) == 4 * 3
    full = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert len(full) == 1
    assert full[0].startswith("exporter otlp: queue full (2 batches)")
    drained = [r.getMessage() for r in caplog.records if "the queue has drained" in r.getMessage()]
    assert drained == ["exporter otlp: the queue has drained; 4 batches (12 records) were dropped while it was full"]
    assert [v[0] for v in energy_values(receiver, 2)] == [5.0, 6.0]


def test_given_up_batches_are_logged_once_per_outage(receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    receiver.down = True
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.grpc_endpoint, telemetry, retry_max_elapsed_time=0.05, queue_size=10)

    async def go() -> None:
        exporter.start()
        for i in range(4):
            await exporter.export(batch(5.0 * i, 1_000 * (i + 1)))
        await asyncio.to_thread(wait_until, lambda: dropped(telemetry) == 4 * 3, 10.0, "four batches given up")
        receiver.down = False
        await exporter.export(batch(20.0, 5_000))
        await asyncio.to_thread(receiver.wait_for_requests, 1)
        await exporter.shutdown()

    asyncio.run(go())
    gave_up = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage() and r.levelno >= logging.ERROR]
    assert len(gave_up) == 1
    assert "retry_max_elapsed_time (0.05 s) passed" in gave_up[0]
    recovered = [r.getMessage() for r in caplog.records if "again, after" in r.getMessage()]
    assert len(recovered) == 1
    assert recovered[0].endswith("; 4 batches (12 records) were given up meanwhile")
    # Nothing measured was lost: the one batch sent carries the whole total.
    assert energy_values(receiver, 1) == [(5.0, START.wall_ns, at(20.0).wall_ns)]


def test_capture_does_not_take_the_state_snapshot_name(receiver: OtlpReceiver) -> None:
    """The service calls ``snapshot()`` on every component for its durable state: an exporter that has a
    ``snapshot(batch)`` method of its own fails every checkpoint (a TypeError, logged as an error)."""
    exporter = make_exporter(receiver.grpc_endpoint)
    assert getattr(exporter, "snapshot", None) is None
    assert exporter.capture(batch(0.0, 1_000)).records == 3


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
