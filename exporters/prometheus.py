"""Exporter ``prometheus``: every catalog family on ``/metrics``, rendered once per tick, served from memory.

``export(batch)`` keeps the latest batch of each pipeline that feeds this exporter and renders the text
of their union right away (a ``prometheus_client`` custom collector on a private registry); a scrape
only hands out those bytes (gzipped once, on the first scrape that asks), so scrapes never trigger
collection and fifty concurrent ones render nothing. A series that is no longer in the latest batches is gone from the next rendering: no
stale state (how long a terminated process stays is the ``energy`` processor's retention).

Names follow ``naming`` (see docs/metrics.md): ``kepler`` (Kepler's names and labels) or ``otel`` (the
OpenTelemetry names, with ``.`` → ``_``, the unit's word and ``_total`` appended, as Prometheus does for
OpenTelemetry metrics). Every series carries the node (``node_name`` / ``k8s_node_name``) and
``const_labels``; a record's own labels take precedence over both. Cardinality: ``per_process: false``
drops the per-process families, ``terminated: false`` the series of processes that have exited.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.samples import Sample
from pydantic import Field, field_validator

from pipeline.catalog import (
    FAMILIES,
    NODE,
    Family,
    Scheme,
    device_attributes,
    label_name,
    points,
    prometheus_label,
    prometheus_name,
)
from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.httpserver import HttpServer, parse_listen
from pipeline.records import Batch

__all__ = ["PrometheusConfig", "PrometheusExporter", "factory"]

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MAX_DEVICES = 1024  # remembered device_id → index entries; a node has a handful of GPUs


class PrometheusConfig(ComponentConfig):
    listen: str = "0.0.0.0:28282"
    """host:port to serve /metrics on (Kepler's port by default)."""
    naming: Literal["kepler", "otel"] = "kepler"
    """Metric and label names: Kepler's, or OpenTelemetry's made Prometheus-safe (hw_power_watts)."""
    const_labels: dict[str, str] = Field(default_factory=dict)
    """Labels added to every series (a series' own label of the same name wins)."""
    per_process: bool = True
    """Export the per-process families; false keeps cardinality to devices, containers and pods."""
    terminated: bool = True
    """Export series of processes (containers, pods) that have exited, while the energy processor keeps them."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("const_labels")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _LABEL_NAME.match(k) or k.startswith("__")]
        if bad:
            raise ValueError(
                f"not Prometheus label names: {', '.join(map(repr, bad))} (letters, digits and _, not starting "
                "with a digit or __)"
            )
        return value


class _Rendered:
    """One tick's exposition text, and its gzip form, made on the first scrape that asks for it."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self._gzipped: bytes | None = None
        self._lock = threading.Lock()

    def gzipped(self) -> bytes:
        with self._lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=6, mtime=0)
            return self._gzipped


class _Collector:
    """Builds the metric families from the exporter's latest batches, when the exporter renders."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        exporter = self._exporter
        config = exporter.config
        scheme: Scheme = config.naming
        node_label = prometheus_label(label_name(NODE.name, scheme) or NODE.name)
        defaults = {node_label: exporter.node_name, **config.const_labels}
        batches = [exporter.batches[name] for name in sorted(exporter.batches)]
        for family in FAMILIES:
            if family.kind == "process" and not config.per_process:
                continue
            metric = _metric(family, scheme)
            sample_name = prometheus_name(family, scheme)
            series: dict[tuple[tuple[str, str], ...], Sample] = {}
            for batch in batches:  # in pipeline order: where two pipelines give one series, the last wins
                for point in points(family, batch, scheme, exporter.devices):
                    if not config.terminated and getattr(point.record, "state", None) == "terminated":
                        continue
                    labels = _prometheus_labels(point.labels)
                    for name, value in defaults.items():
                        labels.setdefault(name, value)
                    series[tuple(sorted(labels.items()))] = Sample(sample_name, labels, point.value, None, None)
            if series:
                metric.samples.extend(series.values())
                yield metric


def _metric(family: Family, scheme: Scheme) -> Metric:
    name = prometheus_name(family, scheme)
    if family.instrument == "counter":
        return CounterMetricFamily(name, family.help)  # strips _total from the family name; samples keep it
    if family.instrument == "info":
        return InfoMetricFamily(name.removesuffix("_info"), family.help)
    return GaugeMetricFamily(name, family.help)


_label = functools.lru_cache(maxsize=4096)(prometheus_label)  # the same few names, on every series


def _prometheus_labels(labels: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in labels.items():
        out.setdefault(_label(name), value)
    return out


class PrometheusExporter:
    def __init__(self, config: PrometheusConfig, ctx: CreateContext) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.node_name = ctx.node_name
        self.log = ctx.logger
        self.batches: dict[str, Batch] = {}
        self.devices: dict[str, dict[str, str]] = {}
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(self))
        self._rendered = _Rendered(b"")
        self._render_lock = threading.Lock()
        self._server: HttpServer | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._server is not None:
            return
        try:
            self._server = HttpServer(self.config.listen, self.app)
        except OSError as exc:
            raise RuntimeError(
                f"exporter {self.component_id}: cannot listen on {self.config.listen}: {exc.strerror or exc}"
            ) from exc
        self._server.start()
        self.log.info("serving Prometheus metrics on %s/metrics", self._server.url)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    @property
    def url(self) -> str:
        """Where /metrics is served (after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError(f"exporter {self.component_id} is not started")
        return self._server.url

    # --- the tick ------------------------------------------------------------------------------

    async def export(self, batch: Batch) -> None:
        # Rendering thousands of series takes a while in Python: off the event loop, so the other
        # pipelines' ticks are not held up by it.
        await asyncio.to_thread(self.render, batch)

    def render(self, batch: Batch) -> None:
        """Take ``batch`` as its pipeline's latest and render the exposition text of all of them."""
        with self._render_lock:  # two pipelines may export at once
            self.batches[batch.pipeline] = batch
            self._remember_devices(batch)
            # Scrapes on other threads see the swap of one reference: the old text or the new, never half.
            self._rendered = _Rendered(generate_latest(self._registry))

    def _remember_devices(self, batch: Batch) -> None:
        # An attributed series' gpu label comes from the device records; remembering them keeps the label
        # (and so the series) stable through a tick in which the device was not read.
        current = device_attributes(batch)
        if len(self.devices) + len(current) > _MAX_DEVICES:
            self.devices.clear()
        for device_id, attrs in current.items():
            self.devices.setdefault(device_id, {}).update(attrs)

    @property
    def body(self) -> bytes:
        """The exposition text of the last tick (what /metrics serves)."""
        return self._rendered.body

    # --- serving -------------------------------------------------------------------------------

    def app(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO") or "/"
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"only GET and HEAD\n"]
        if path == "/metrics":
            rendered = self._rendered
            headers = [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)]
            body = rendered.body
            if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
                body = rendered.gzipped()
                headers.append(("Content-Encoding", "gzip"))
        elif path == "/":
            headers = [("Content-Type", "text/html; charset=utf-8")]
            body = b'<html><body><h1>wattpipe</h1><p><a href="/metrics">/metrics</a></p></body></html>\n'
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [b""] if method == "HEAD" else [body]


def _create(ctx: CreateContext, config: ComponentConfig) -> PrometheusExporter:
    assert isinstance(config, PrometheusConfig)
    return PrometheusExporter(config, ctx)


factory = Factory(
    type="prometheus",
    kind="exporter",
    config_model=PrometheusConfig,
    create=_create,
    description="Serves every metric family on /metrics (Kepler or OpenTelemetry names), rendered once per tick.",
    stability="alpha",
)
