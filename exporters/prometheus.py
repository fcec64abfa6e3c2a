r"""Exporter ``prometheus``: every catalog family on ``/metrics``, rendered once per tick, served from memory.

``export(batch)`` keeps the latest batch of each pipeline that feeds this exporter and renders the text
of their union right away; a scrape only hands out those bytes (gzipped once, on the first scrape that
asks), so scrapes never trigger collection and fifty concurrent ones render nothing. A series that is no
longer in the latest batches is gone from the next rendering: no stale state (how long a terminated
process stays is the ``energy`` processor's retention).

The text format is written here, not by ``prometheus_client``'s registry, which builds a ``Sample`` per series
and formats every label of every series on every tick (5–8× the CPU; docs/benchmarks.md). A series'
``name{labels} `` prefix is formatted once and reused for as long as the series lasts (its labels come from
the catalog's label cache, so the same mapping object arrives tick after tick), each family's ``# HELP`` /
``# TYPE`` lines once per process, and only the values are formatted per tick: Python's ``repr`` below a
million (where it equals Go's format), ``prometheus_client``'s ``floatToGoString`` above. The catalog hands
it a family's labels, values and records as columns (``labelled_columns``), not a ``Point`` per series.
Label names go through ``prometheus_client``'s own escaping; label values are escaped here the way
``prometheus_client`` does it (backslash, newline and double quote as ``\\``, ``\n``, ``\"``; UTF-8
otherwise as is). The bytes are those ``prometheus_client`` writes: the tests render every batch both ways
(``tests/helpers/reference_prometheus.py``, a registry-backed subclass kept in the tests only), compare them,
and hold both to golden files.

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
import itertools
import operator
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.openmetrics.exposition import UNDERSCORES, escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString
from pydantic import Field, field_validator

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.catalog import (
    FAMILIES,
    NODE,
    Columns,
    Family,
    LabelEngine,
    Scheme,
    SeriesLabels,
    label_name,
    labelled_columns,
    prometheus_label,
    prometheus_name,
    remember_devices,
)
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.httpserver import HttpServer, parse_listen
from wattpipe.pipeline.webconfig import WebConfig, load_web_config, serve

__all__ = ["PrometheusConfig", "PrometheusExporter", "factory"]

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


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
    web_config_file: str = ""
    """TLS and basic auth for /metrics, in the Prometheus exporter-toolkit web config format; empty: plain HTTP."""

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


class _FastRenderer:
    """The text format written directly: per tick, only the values are formatted (see the module docstring).

    Every series' prefix (``name{label="value",…} ``) is remembered for the next tick, keyed by the identity
    of the catalog's label mapping it was made from (:class:`~wattpipe.pipeline.series_labels.SeriesLabels`, whose docstring
    states the promise this relies on); each entry holds its mapping, so an identity cannot be
    reused by another mapping meanwhile. Only the series of the last rendering are kept: the
    cache is exactly as large as the exposition, and a series that ends is forgotten a tick later. A family
    whose label mappings are the very ones of the last rendering, in the same order (a steady node), takes
    its prefixes as they were, with no lookup per series.

    It works a family at a time, column by column (``map``/``zip``, which loop in C), not series by series:
    this runs for every series on every tick.
    """

    def __init__(self, exporter: PrometheusExporter) -> None:
        self._exporter = exporter
        self._families: dict[str, _RenderedFamily] = {}

    def render(self) -> bytes:
        exporter = self._exporter
        scheme: Scheme = exporter.config.naming
        drop_terminated = not exporter.config.terminated
        previous, self._families = self._families, {}
        out: list[bytes] = []
        for family, sample_name, parts in exporter._family_values():
            part_labels: list[Sequence[SeriesLabels]] = []
            part_values: list[Sequence[float]] = []
            for labels, values, records in parts:
                if drop_terminated:
                    running = [getattr(record, "state", None) != "terminated" for record in records]
                    labels = list(itertools.compress(labels, running))
                    values = list(itertools.compress(values, running))
                if labels:
                    part_labels.append(labels)
                    part_values.append(values)
            if not part_labels:
                continue
            last = previous.get(sample_name)
            # The very mappings of the last rendering (by identity: two mappings equal as dicts may still
            # order their labels differently, and where two names clash once escaped, the first one wins).
            # A steady family's columns hold the very label list of the last call (labelled_columns hands
            # out the list it keeps, never changed once made): that settles it without an id per series.
            if last is None or not _same_objects(last.labels, part_labels):
                ids = [list(map(id, labels)) for labels in part_labels]
                if last is None or last.ids != ids:
                    last = self._prefixes(sample_name, part_labels, ids, last)
                last.labels = part_labels
            self._families[sample_name] = last
            out.append(_header(family, scheme))
            if last.distinct:  # one part, no two series with one prefix: the lines as they are
                out.append(_lines(last.prefixes[0], part_values[0]).encode("utf-8"))
                continue
            series: dict[str, float] = {}  # prefix → value: the prefix is the label set, so it dedups too
            for prefixes, values in zip(last.prefixes, part_values, strict=True):
                series.update(zip(prefixes, values, strict=True))
            out.append(_lines(list(series), list(series.values())).encode("utf-8"))
        return b"".join(out)

    def _prefixes(
        self,
        sample_name: str,
        part_labels: list[Sequence[SeriesLabels]],
        part_ids: list[list[int]],
        last: _RenderedFamily | None,
    ) -> _RenderedFamily:
        """The family's prefixes for these label mappings: the last rendering's where it had the mapping."""
        known = last.by_id if last is not None else {}
        made = _RenderedFamily(part_ids, [], {})
        for labels, ids in zip(part_labels, part_ids, strict=True):
            entries: list[tuple[SeriesLabels, str] | None] = list(map(known.get, ids))
            if None in entries:
                for i, entry in enumerate(entries):
                    if entry is None:
                        entries[i] = (labels[i], self._prefix(sample_name, labels[i]))
            made.by_id.update(zip(ids, entries, strict=True))  # type: ignore[arg-type]
            made.prefixes.append([entry[1] for entry in entries])  # type: ignore[index]
        made.distinct = len(made.prefixes) == 1 and len(set(made.prefixes[0])) == len(made.prefixes[0])
        return made

    def _prefix(self, sample_name: str, labels: Mapping[str, str]) -> str:
        """What ``generate_latest`` writes before a sample's value (escaping: ``UNDERSCORES``, its default)."""
        merged = _prometheus_labels(labels)
        for name, value in self._exporter._defaults.items():
            merged.setdefault(name, value)
        text = ",".join(
            f'{escape_label_name(name, UNDERSCORES)}="{_escape_label_value(value)}"'
            for name, value in sorted(merged.items())
        )
        name = escape_metric_name(sample_name, UNDERSCORES)
        return f"{name}{{{text}}} " if text else f"{name} "


@dataclass(slots=True)
class _RenderedFamily:
    """One family's prefixes in the last rendering: per part (pipeline), the identities of its label
    mappings in order and their prefixes, and every (mapping, prefix) by the mapping's identity. The entry
    holds the mapping, so no other mapping can be born at its address while the entry exists: a hit by
    identity is always the same mapping, even when the catalog's cache frees mappings in the middle of a
    render, and ``ids`` stay the identities of those mappings."""

    ids: list[list[int]]
    prefixes: list[list[str]]
    by_id: dict[int, tuple[SeriesLabels, str]]
    distinct: bool = False
    """One part whose prefixes are all different: its lines need no dict to drop repeated series (labels
    that differ only in characters Prometheus escapes alike, where the first one wins)."""
    labels: list[Sequence[SeriesLabels]] = field(default_factory=list)
    """The label sequences of the last rendering, per part (held, so their identities stay theirs)."""


def _same_objects(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _lines(prefixes: Sequence[str], values: Sequence[float]) -> str:
    """One line per series, ``prefix`` + value, each ending in a newline."""
    # Values are written as prometheus_client writes them (Go's float format: 1e+06, NaN, +Inf). Finite
    # values below a million print the same as Python's ``repr``: the common case, checked for the whole
    # family at once (a NaN or an infinity makes the sum NaN or infinite).
    total = sum(values)
    if -_INF < total < _INF and max(values) < 1e6:
        texts = list(map(repr, values))
    else:
        texts = list(map(_value_text, values))
    # Joined once, as [prefix, value, "\n", …]: adding each prefix to its value first would copy every line twice.
    pieces = ["\n"] * (3 * len(texts))
    pieces[0::3] = prefixes
    pieces[1::3] = texts
    return "".join(pieces)


def _value_text(value: float) -> str:
    """A value as ``prometheus_client`` writes it: ``repr`` for finite values below a million, else Go's
    float format through ``prometheus_client``'s ``floatToGoString``."""
    if -_INF < value < 1e6:
        return repr(value)
    return _go_float(value)


_INF = float("inf")
_go_float: Callable[[float], str] = floatToGoString  # prometheus_client's, untyped


def _escape_label_value(value: str) -> str:
    """A label value as the text format quotes it: backslash, newline and double quote escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _OneMetric:
    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self._metric


@functools.cache
def _header(family: Family, scheme: Scheme) -> bytes:
    """The family's ``# HELP`` and ``# TYPE`` lines, written by ``prometheus_client`` itself (once per family)."""
    return generate_latest(_OneMetric(_metric(family, scheme)))


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
        node_label = prometheus_label(label_name(NODE.name, config.naming) or NODE.name)
        self._defaults = {node_label: self.node_name, **config.const_labels}
        """What every series carries unless its own labels say otherwise, under Prometheus names."""
        self._labels = LabelEngine()
        """This exporter's own label caches (see pipeline.labels.LabelEngine): rendered under the render lock."""
        self._fast = _FastRenderer(self)
        self._rendered = _Rendered(b"")
        self._render_lock = threading.Lock()
        self._server: HttpServer | None = None
        # Loaded here, not in start(): a bad file (ConfigError) fails `wattpipe validate` and the build.
        self._web: WebConfig | None = load_web_config(config.web_config_file) if config.web_config_file else None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._server is not None:
            return
        try:
            self._server = serve(self.config.listen, self.app, self._web)
        except OSError as exc:
            raise RuntimeError(
                f"exporter {self.component_id}: cannot listen on {self.config.listen}: {exc.strerror or exc}"
            ) from exc
        self._server.start()
        self.log.info("listening on %s: Prometheus metrics at %s/metrics", self._server.bound, self._server.url)

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
            remember_devices(self.devices, batch)
            # Scrapes on other threads see the swap of one reference: the old text or the new, never half.
            self._rendered = _Rendered(self._render_text())

    def _render_text(self) -> bytes:
        """The exposition text of the latest batches (under the render lock)."""
        return self._fast.render()

    def _family_values(
        self,
    ) -> Iterator[tuple[Family, str, list[Columns]]]:
        """Each family to render (after ``per_process``), its sample name, and its labelled columns from
        every batch, in pipeline order; ``terminated`` is left to the caller."""
        config = self.config
        batches = [self.batches[name] for name in sorted(self.batches)]
        for family in FAMILIES:
            if family.kind == "process" and not config.per_process:
                continue
            parts = [
                labelled_columns(family, batch, config.naming, self.devices, engine=self._labels) for batch in batches
            ]
            yield family, prometheus_name(family, config.naming), parts

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


factory = Factory.of(
    PrometheusExporter,
    type="prometheus",
    kind="exporter",
    config_model=PrometheusConfig,
    description="Serves every metric family on /metrics (Kepler or OpenTelemetry names), rendered once per tick.",
    stability="alpha",
)
