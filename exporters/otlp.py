"""Exporter ``otlp``: every catalog family, under its OpenTelemetry name, pushed to an OTLP endpoint.

``export(batch)`` only snapshots the batch's points (values, attributes, timestamps) and puts the
snapshot on a bounded queue; a background thread builds ``MetricsData`` by hand and hands it to the
OpenTelemetry SDK's ``OTLPMetricExporter`` (gRPC or HTTP/protobuf). By hand, because the SDK's observable
instruments stamp every point with collection time and never forget an attribute set: here every point
carries the time its value was read and, for counters, the time its series began.

Why a collector outage costs resolution, not joules: energy is exported as cumulative totals, so the first
export after recovery carries everything since each series began. The queue (``queue_size`` batches)
drops its oldest batch when full; those drops are counted in ``wattpipe_exporter_dropped_total``. With
``temporality: delta`` the delta is taken at send time against what was last *sent* for the series, so a
dropped batch widens the next delta instead of losing its energy (see docs/otlp.md).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from pydantic import Field, model_validator

from pipeline.catalog import FAMILIES, Family, device_attributes, points
from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.records import Batch

__all__ = ["OtlpConfig", "OtlpExporter", "factory"]

_MAX_DEVICES = 1024
_MAX_DELTA_SERIES = 100_000  # series remembered for delta temporality, least recently sent evicted first
_INT_ATTRIBUTES = frozenset({"process.pid", "wattpipe.gpu.index", "wattpipe.gpu.instance.id"})
"""Attributes OpenTelemetry types as integers (the catalog renders every attribute as text)."""
_SCOPE = InstrumentationScope("wattpipe")

AttributeValue = str | int


class OtlpConfig(ComponentConfig):
    endpoint: str | None = None
    """Where to send: ``host:port`` for gRPC (default ``localhost:4317``), a URL for HTTP (default
    ``http://localhost:4318/v1/metrics``; a URL without a path gets ``/v1/metrics``)."""
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request (``${env:…}`` in the config file keeps secrets out of it)."""
    insecure: bool = False
    """gRPC only: plaintext instead of TLS (for HTTP the URL's scheme decides)."""
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    compression: Literal["none", "gzip"] = "none"
    timeout: float = Field(default=10.0, gt=0)
    """Seconds per send attempt (the SDK exporter may retry transient errors inside it)."""
    temporality: Literal["cumulative", "delta"] = "cumulative"
    service_instance_id: str | None = None
    """``service.instance.id``; the node name by default, so series stay one across restarts."""
    queue_size: int = Field(default=100, ge=1)
    """Batches waiting for the sender; when full the oldest is dropped (and counted)."""
    retry_initial_interval: float = Field(default=5.0, gt=0)
    retry_max_interval: float = Field(default=30.0, gt=0)
    retry_max_elapsed_time: float = Field(default=300.0, gt=0)
    """Seconds after a batch's first failed attempt at which it is given up (and counted as dropped)."""
    shutdown_timeout: float = Field(default=5.0, gt=0)
    """Seconds ``shutdown`` spends sending what is queued before dropping the rest."""

    @model_validator(mode="after")
    def _check(self) -> OtlpConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate needs its key)")
        if self.retry_max_interval < self.retry_initial_interval:
            raise ValueError("retry_max_interval must be at least retry_initial_interval")
        return self

    def resolved_endpoint(self) -> str:
        if self.protocol == "grpc":
            return self.endpoint or "localhost:4317"
        url = (self.endpoint or "http://localhost:4318").rstrip("/")
        head, sep, path = url.partition("://")
        return url if sep and "/" in path else f"{head}{sep}{path}/v1/metrics"


# --- what the queue holds ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Point:
    attributes: Mapping[str, AttributeValue]
    raw: float
    """The record field's value, before the family's divisor (integer mJ for energy: exact deltas)."""
    start_ns: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class _Snapshot:
    pipeline: str
    records: int
    metrics: tuple[tuple[Family, tuple[_Point, ...]], ...]


class _Sender(Protocol):
    def export(self, metrics_data: MetricsData, timeout_millis: float = ...) -> MetricExportResult: ...

    def shutdown(self, timeout_millis: float = ...) -> None: ...


def _attribute(name: str, value: str) -> AttributeValue:
    return int(value) if name in _INT_ATTRIBUTES and value.lstrip("-").isdigit() else value


class OtlpExporter:
    def __init__(self, config: OtlpConfig, ctx: CreateContext) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.log = ctx.logger
        self._telemetry = ctx.telemetry
        self._created_ns = ctx.clock.now().wall_ns
        """Start time of a counter whose record does not know its own (the exporter's start, per the spec)."""
        self.resource = Resource.create(
            {
                "service.name": "wattpipe",
                "service.instance.id": config.service_instance_id or ctx.node_name,
                "host.name": socket.gethostname(),
                "k8s.node.name": ctx.node_name,
            }
        )
        self.devices: dict[str, dict[str, str]] = {}
        self._queue: collections.deque[_Snapshot] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._deadline = float("inf")  # time.monotonic() by which shutdown gives up
        self._thread: threading.Thread | None = None
        self._sender: _Sender | None = None
        self._last_sent: collections.OrderedDict[tuple[str, frozenset[tuple[str, AttributeValue]]], tuple[float, int]]
        self._last_sent = collections.OrderedDict()  # delta: series → (raw value, time_ns) last sent

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._sender = self._sender or _make_sender(self.config)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"wattpipe-{self.component_id}", daemon=True)
        self._thread.start()
        self.log.info("sending OTLP (%s) to %s", self.config.protocol, self.config.resolved_endpoint())

    async def shutdown(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic() + self.config.shutdown_timeout
            self._cond.notify_all()
        # An attempt in flight at the deadline may run for up to one `timeout` more.
        await asyncio.to_thread(thread.join, self.config.shutdown_timeout + self.config.timeout)
        self._thread = None
        if self._sender is not None:
            self._sender.shutdown(timeout_millis=1000)
            self._sender = None

    # --- the tick --------------------------------------------------------------------------------

    async def export(self, batch: Batch) -> None:
        self.enqueue(self.snapshot(batch))

    def snapshot(self, batch: Batch) -> _Snapshot:
        """``batch``'s points as the sender needs them, detached from the catalog's shared label mappings."""
        self._remember_devices(batch)
        metrics: list[tuple[Family, tuple[_Point, ...]]] = []
        for family in FAMILIES:
            out: list[_Point] = []
            for point in points(family, batch, "otel", self.devices):
                record = point.record
                attributes = {name: _attribute(name, value) for name, value in point.labels.items()}
                raw = point.value * family.divisor if family.value is None else getattr(record, family.value)
                time_ns = record.time.wall_ns
                start = getattr(record, "start", None)
                start_ns = min(start.wall_ns if start is not None else self._created_ns, time_ns)
                out.append(_Point(attributes, float(raw), start_ns, time_ns))
            if out:
                metrics.append((family, tuple(out)))
        return _Snapshot(batch.pipeline, batch.count(), tuple(metrics))

    def enqueue(self, snapshot: _Snapshot) -> None:
        """Queue ``snapshot`` for the sender, dropping (and counting) the oldest batch if the queue is full."""
        with self._cond:
            if len(self._queue) >= self.config.queue_size:
                dropped = self._queue.popleft()
                self._telemetry.dropped(dropped.pipeline, dropped.records)
                self.log.warning("queue full (%d batches): dropped the oldest", self.config.queue_size)
            self._queue.append(snapshot)
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def _remember_devices(self, batch: Batch) -> None:
        current = device_attributes(batch)
        if len(self.devices) + len(current) > _MAX_DEVICES:
            self.devices.clear()
        for device_id, attrs in current.items():
            self.devices.setdefault(device_id, {}).update(attrs)

    # --- the sender thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                snapshot = self._queue.popleft()
                late = self._stopping and time.monotonic() >= self._deadline
            if late:  # shutdown's time is up: what is left is dropped without another attempt
                self._telemetry.dropped(snapshot.pipeline, snapshot.records)
                continue
            if not self._send(snapshot):
                self._telemetry.dropped(snapshot.pipeline, snapshot.records)

    def _send(self, snapshot: _Snapshot) -> bool:
        """Send with backoff until it succeeds, ``retry_max_elapsed_time`` passes, or shutdown's deadline."""
        config = self.config
        assert self._sender is not None
        # Network timing, not measurement: real monotonic time, not the pipeline's (possibly stepped) clock.
        give_up = time.monotonic() + config.retry_max_elapsed_time
        delay = config.retry_initial_interval
        while True:
            data, commit = self._metrics_data(snapshot)
            try:
                result = self._sender.export(data, timeout_millis=config.timeout * 1000)
            except Exception as exc:  # the SDK reports failures as a result; anything else is a failure too
                self.log.warning("export raised: %s", exc)
                result = MetricExportResult.FAILURE
            if result is MetricExportResult.SUCCESS:
                commit()
                return True
            if not self._back_off(delay, give_up):
                self.log.error("gave up sending a batch of %d records", snapshot.records)
                return False
            delay = min(delay * 1.5, config.retry_max_interval)

    def _back_off(self, delay: float, give_up: float) -> bool:
        """Wait ``delay`` seconds before the next attempt; False if the batch is to be given up instead.

        New batches notify the condition too: they must not cut the wait short. Shutdown does, once, so
        that what is queued gets one more attempt right away; later waits end at shutdown's deadline.
        """
        with self._cond:
            stopping = self._stopping
            now = time.monotonic()
            if now >= min(give_up, self._deadline):
                return False
            until = min(now + delay, give_up, self._deadline)
            self.log.warning("export failed; retrying in %.1f s", until - now)
            while (now := time.monotonic()) < until and self._stopping == stopping:
                self._cond.wait(until - now)
            return True

    def _metrics_data(self, snapshot: _Snapshot) -> tuple[MetricsData, _Commit]:
        delta = self.config.temporality == "delta"
        temporality = AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE
        updates: dict[tuple[str, frozenset[tuple[str, AttributeValue]]], tuple[float, int]] = {}
        metrics: list[Metric] = []
        for family, family_points in snapshot.metrics:
            data_points: list[NumberDataPoint] = []
            for p in family_points:
                value, start_ns = p.raw, p.start_ns
                if family.instrument == "counter" and delta:
                    key = (family.otel, frozenset(p.attributes.items()))
                    last = self._last_sent.get(key)
                    # A series that restarted (its total fell, or it began after what we last sent) starts over.
                    if last is not None and last[0] <= p.raw and last[1] >= p.start_ns:
                        value, start_ns = p.raw - last[0], last[1]
                    updates[key] = (p.raw, p.time_ns)
                if family.instrument != "counter":
                    start_ns = 0  # gauges carry no start time
                data_points.append(
                    NumberDataPoint(
                        attributes=dict(p.attributes),
                        start_time_unix_nano=start_ns,
                        time_unix_nano=p.time_ns,
                        value=value / family.divisor if family.divisor != 1 else value,
                    )
                )
            data: Sum | Gauge = (
                Sum(data_points=data_points, aggregation_temporality=temporality, is_monotonic=True)
                if family.instrument == "counter"
                else Gauge(data_points=data_points)
            )
            metrics.append(Metric(name=family.otel, description=family.help, unit=family.unit, data=data))
        scope = ScopeMetrics(scope=_SCOPE, metrics=metrics, schema_url="")
        resource_metrics = ResourceMetrics(resource=self.resource, scope_metrics=[scope], schema_url="")

        def commit() -> None:
            for key, value in updates.items():
                self._last_sent[key] = value
                self._last_sent.move_to_end(key)
            while len(self._last_sent) > _MAX_DELTA_SERIES:
                self._last_sent.popitem(last=False)

        return MetricsData(resource_metrics=[resource_metrics]), commit


class _Commit(Protocol):
    def __call__(self) -> None: ...


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _make_sender(config: OtlpConfig) -> _Sender:
    endpoint = config.resolved_endpoint()
    if config.protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        credentials = None
        if not config.insecure and (config.ca_file or config.cert_file):
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(config.ca_file),
                private_key=_read(config.key_file),
                certificate_chain=_read(config.cert_file),
            )
        return GrpcExporter(
            endpoint=endpoint,
            insecure=config.insecure,
            credentials=credentials,
            headers={k.lower(): v for k, v in config.headers.items()},  # gRPC metadata keys are lowercase
            timeout=config.timeout,
            compression=grpc.Compression.Gzip if config.compression == "gzip" else grpc.Compression.NoCompression,
        )
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter(
        endpoint=endpoint,
        certificate_file=config.ca_file,
        client_key_file=config.key_file,
        client_certificate_file=config.cert_file,
        headers=config.headers,
        timeout=config.timeout,
        compression=Compression.Gzip if config.compression == "gzip" else Compression.NoCompression,
    )


def _create(ctx: CreateContext, config: ComponentConfig) -> OtlpExporter:
    assert isinstance(config, OtlpConfig)
    return OtlpExporter(config, ctx)


factory = Factory(
    type="otlp",
    kind="exporter",
    config_model=OtlpConfig,
    create=_create,
    description="Pushes every metric family (OpenTelemetry names, explicit timestamps) over OTLP gRPC or HTTP.",
    stability="development",
)
