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

An outage is logged once when it begins and once when it ends (and a full queue once until it drains),
never per attempt: every failed attempt is counted in ``wattpipe_exporter_failed_total`` instead, and the
SDK exporter's own per-attempt log lines, for the exports made here, become the detail of that one line.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

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

from exporters._otlp_config import OtlpConfig  # defined there (the SDK glue needs it too), exported here
from exporters._otlp_sdk import SDK_LOGS, Sender, failure_detail, make_sender, uses_tls
from pipeline.catalog import FAMILIES, Family, labelled_values, remember_devices
from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.records import Batch

__all__ = ["OtlpConfig", "OtlpExporter", "factory"]

_MAX_DELTA_SERIES = 100_000  # series remembered for delta temporality, least recently sent evicted first
_INT_ATTRIBUTES = frozenset({"process.pid", "wattpipe.gpu.index", "wattpipe.gpu.instance.id"})
"""Attributes OpenTelemetry types as integers (the catalog renders every attribute as text)."""
_NOT_IDENTITY = frozenset({"wattpipe.state"})
"""Attributes that change during a series' life: for deltas, a process's ``terminated`` series goes on from its
``running`` one (a new series would start over from the process's start, and a backend summing deltas by
process would count its energy twice)."""
_SCOPE = InstrumentationScope("wattpipe")
AttributeValue = str | int


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
        self._attributes: dict[int, tuple[Mapping[str, str], Mapping[str, AttributeValue]]] = {}
        self._queue: collections.deque[_Snapshot] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._deadline = float("inf")  # time.monotonic() by which shutdown gives up
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()  # the sender thread has returned
        self._finished: Callable[[], object] | None = None  # and tells shutdown's waiter so
        self._sender: Sender | None = None
        self._last_sent: collections.OrderedDict[tuple[str, frozenset[tuple[str, AttributeValue]]], tuple[float, int]]
        self._last_sent = collections.OrderedDict()  # delta: series → (raw value, time_ns) last sent
        # What is logged once per episode, not per attempt or per tick (see _failed, _recovered, enqueue).
        self._failing_since: float | None = None  # sender thread: time.monotonic() of an outage's first failure
        self._failures = 0  # sender thread: failed attempts in this outage
        self._given_up = (0, 0)  # sender thread: (batches, records) given up in this outage
        self._overflow: tuple[int, int] | None = None  # under _cond: (batches, records) dropped since the queue filled

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._sender = self._sender or make_sender(self.config)
        SDK_LOGS.install()
        unused = [name for name in ("ca_file", "cert_file", "key_file") if getattr(self.config, name)]
        if unused and not uses_tls(self.config):
            self.log.warning(
                "exporter %s: %s is not used: %s sends in plaintext (%s)",
                self.component_id,
                ", ".join(unused),
                self.config.resolved_endpoint(),
                "insecure: true" if self.config.protocol == "grpc" else "an http:// URL",
            )
        self._stopping = False
        self._ended.clear()
        self._finished = None
        self._thread = threading.Thread(target=self._run_then_tell, name=f"wattpipe-{self.component_id}", daemon=True)
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
        # An attempt in flight at the deadline may run for up to one `timeout` more. Waited for on the event
        # loop, not by a pool thread blocked in join(): when the service's own shutdown budget runs out it
        # cancels this wait and the process exits at once (the sender is a daemon thread), instead of the
        # interpreter's exit waiting on a pool thread that is still joining.
        loop = asyncio.get_running_loop()
        finished = asyncio.Event()
        self._finished = lambda: loop.call_soon_threadsafe(finished.set)
        # The thread sets _ended before it reads _finished: either it calls us, or we see it ended.
        if not self._ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self.config.shutdown_timeout + self.config.timeout)
        if self._ended.is_set():
            thread.join()  # it has returned from its work: only its last lines are left to run
        self._thread = None
        if self._sender is not None:
            self._sender.shutdown(timeout_millis=1000)
            self._sender = None

    # --- the tick --------------------------------------------------------------------------------

    async def export(self, batch: Batch) -> None:
        self.enqueue(self.capture(batch))

    # Not named ``snapshot``: the service calls a component's ``snapshot()`` for its durable state.
    def capture(self, batch: Batch) -> _Snapshot:
        """``batch``'s points as the sender needs them, detached from the catalog's shared label mappings."""
        remember_devices(self.devices, batch)
        metrics: list[tuple[Family, tuple[_Point, ...]]] = []
        # A series' attributes, typed for OTLP, made once while it lasts: keyed by the identity of the catalog's
        # label mapping (held in the entry, so the identity cannot be reused), only this tick's kept.
        known, self._attributes = self._attributes, {}
        for family in FAMILIES:
            out: list[_Point] = []
            for labels, value, record in labelled_values(family, batch, "otel", self.devices):
                entry = known.get(id(labels))
                if entry is None or entry[0] is not labels:
                    entry = (labels, {name: _attribute(name, text) for name, text in labels.items()})
                self._attributes[id(labels)] = entry
                attributes = entry[1]
                raw = value * family.divisor if family.value is None else getattr(record, family.value)
                time_ns = record.time.wall_ns
                start = getattr(record, "start", None)
                start_ns = min(start.wall_ns if start is not None else self._created_ns, time_ns)
                out.append(_Point(attributes, float(raw), start_ns, time_ns))
            if out:
                metrics.append((family, tuple(out)))
        return _Snapshot(batch.pipeline, batch.count(), tuple(metrics))

    def enqueue(self, snapshot: _Snapshot) -> None:
        """Queue ``snapshot`` for the sender, dropping (and counting) the oldest batch if the queue is full.

        Logged when the queue first overflows, not on every drop; the sender says how many were dropped
        once it has caught up (emptied the queue).
        """
        first = False
        with self._cond:
            if len(self._queue) >= self.config.queue_size:
                dropped = self._queue.popleft()
                self._telemetry.dropped(dropped.pipeline, dropped.records)
                first = self._overflow is None
                batches, records = self._overflow or (0, 0)
                self._overflow = (batches + 1, records + dropped.records)
            self._queue.append(snapshot)
            self._cond.notify_all()
        if first:
            self._telemetry.log.log(
                logging.WARNING,
                f"{self.component_id}/queue-full",
                f"exporter {self.component_id}: queue full ({self.config.queue_size} batches): dropping the oldest "
                "batch for each new one until the sender catches up (counted in wattpipe_exporter_dropped_total)",
            )

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    # --- the sender thread -----------------------------------------------------------------------

    def _run_then_tell(self) -> None:
        try:
            self._run()
        finally:
            self._ended.set()
            finished = self._finished
            if finished is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    finished()

    def _run(self) -> None:
        late_batches = late_records = 0
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    break
                snapshot = self._queue.popleft()
                late = self._stopping and time.monotonic() >= self._deadline
                overflow = self._overflow if not self._queue else None
                if overflow is not None:
                    self._overflow = None  # caught up: a later overflow is news again
            if overflow is not None:
                self._telemetry.log.log(
                    logging.INFO,
                    f"{self.component_id}/queue-drained",
                    f"exporter {self.component_id}: the queue has drained; {overflow[0]} batches ({overflow[1]} "
                    "records) were dropped while it was full",
                )
            if late:  # shutdown's time is up: what is left is dropped without another attempt
                self._telemetry.dropped(snapshot.pipeline, snapshot.records)
                late_batches, late_records = late_batches + 1, late_records + snapshot.records
                continue
            if not self._send(snapshot):
                self._telemetry.dropped(snapshot.pipeline, snapshot.records)
        if late_batches:
            self.log.warning(
                "exporter %s: shutdown_timeout (%g s) passed: dropped %d unsent batches (%d records)",
                self.component_id,
                self.config.shutdown_timeout,
                late_batches,
                late_records,
            )

    def _send(self, snapshot: _Snapshot) -> bool:
        """Send with backoff until it succeeds, ``retry_max_elapsed_time`` passes, or shutdown's deadline."""
        config = self.config
        assert self._sender is not None
        # Network timing, not measurement: real monotonic time, not the pipeline's (possibly stepped) clock.
        give_up = time.monotonic() + config.retry_max_elapsed_time
        delay = config.retry_initial_interval
        while True:
            data, commit = self._metrics_data(snapshot)
            error = ""
            with SDK_LOGS.capture() as sdk_lines:
                try:
                    result = self._sender.export(data, timeout_millis=config.timeout * 1000)
                except Exception as exc:  # the SDK reports failures as a result; anything else is a failure too
                    error = f"{type(exc).__name__}: {exc}"
                    result = MetricExportResult.FAILURE
            if result is MetricExportResult.SUCCESS:
                commit()
                self._recovered()
                return True
            self._failed(snapshot, error or failure_detail(self._sender, sdk_lines))
            del data, commit  # rebuilt for the next attempt: an outage holds the queue, not a request per exporter too
            if not self._back_off(delay, give_up):
                self._give_up(snapshot)
                return False
            delay = min(delay * 1.5, config.retry_max_interval)

    # --- what an outage logs: once when it starts, once when it ends ------------------------------

    def _failed(self, snapshot: _Snapshot, detail: str) -> None:
        """Count a failed attempt (in records, like every exporter count); log it if it starts an outage."""
        self._telemetry.telemetry.exporter_failed.labels(
            pipeline=snapshot.pipeline, component=self._telemetry.component
        ).inc(snapshot.records)
        self._failures += 1
        if self._failing_since is not None:
            self.log.debug("exporter %s: attempt %d failed: %s", self.component_id, self._failures, detail)
            return
        self._failing_since = time.monotonic()
        self._telemetry.log.log(
            logging.WARNING,
            f"{self.component_id}/failing",
            f"exporter {self.component_id}: cannot send to {self.config.resolved_endpoint()}: {detail}; retrying "
            f"with backoff and queueing up to {self.config.queue_size} batches (failed attempts are counted in "
            "wattpipe_exporter_failed_total; logged again when sending works)",
        )

    def _recovered(self) -> None:
        if self._failing_since is None:
            return
        elapsed = time.monotonic() - self._failing_since
        batches, records = self._given_up
        lost = f"; {batches} batches ({records} records) were given up meanwhile" if batches else ""
        self._telemetry.log.log(
            logging.INFO,
            f"{self.component_id}/recovered",
            f"exporter {self.component_id}: sending to {self.config.resolved_endpoint()} again, after "
            f"{self._failures} failed attempts over {elapsed:.1f} s{lost}",
        )
        self._failing_since, self._failures, self._given_up = None, 0, (0, 0)

    def _give_up(self, snapshot: _Snapshot) -> None:
        batches, records = self._given_up
        self._given_up = (batches + 1, records + snapshot.records)
        with self._cond:
            why = (
                f"shutdown_timeout ({self.config.shutdown_timeout:g} s) passed"
                if self._stopping and time.monotonic() >= self._deadline
                else f"retry_max_elapsed_time ({self.config.retry_max_elapsed_time:g} s) passed"
            )
        if batches:  # the outage's first give-up was logged; the rest are counted, and summed up at recovery
            self.log.debug("exporter %s: gave up a batch of %d records: %s", self.component_id, snapshot.records, why)
            return
        self._telemetry.log.log(
            logging.ERROR,
            f"{self.component_id}/gave-up",
            f"exporter {self.component_id}: gave up a batch of {snapshot.records} records: {why} (batches given up "
            "are counted in wattpipe_exporter_dropped_total; cumulative totals carry their energy in the next "
            "batch sent)",
        )

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
            self.log.debug("exporter %s: retrying in %.2f s", self.component_id, until - now)
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
                    key = (family.otel, frozenset(i for i in p.attributes.items() if i[0] not in _NOT_IDENTITY))
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
