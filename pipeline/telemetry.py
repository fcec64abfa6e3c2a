"""wattpipe's own metrics, /healthz and /readyz, and rate-limited logging.

Self-metrics live in a registry of their own (never prometheus_client's global one), named per
pipeline and component like the Collector's ``otelcol_*`` metrics.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from wattpipe.pipeline.clock import Clock
from wattpipe.pipeline.httpserver import HttpServer, WsgiApp
from wattpipe.pipeline.webconfig import WebConfig, serve

__all__ = ["ComponentTelemetry", "RateLimitedLog", "Telemetry"]


class RateLimitedLog:
    """Logs each distinct message at most once per ``period_s`` of the clock, counting the repeats.

    A receiver that fails every tick would otherwise write a line every few seconds for hours; one line
    per minute, with how many were held back, says the same.
    """

    def __init__(self, logger: logging.Logger, clock: Clock, period_s: float = 60.0, max_keys: int = 1024) -> None:
        if period_s < 0 or max_keys < 1:
            raise ValueError(f"RateLimitedLog needs period_s >= 0 and max_keys >= 1 (got {period_s:g}, {max_keys})")
        self._logger = logger
        self._clock = clock
        self._period_s = period_s
        self._max_keys = max_keys
        self._last: dict[str, tuple[float, int]] = {}  # key -> (monotonic time logged, repeats held back since)
        self._lock = threading.Lock()

    def log(self, level: int, key: str, message: str) -> bool:
        """Log ``message`` unless ``key`` was logged within the period; returns whether it was logged."""
        now = self._clock.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last[0] < self._period_s:
                self._last[key] = (last[0], last[1] + 1)
                return False
            held_back = last[1] if last is not None else 0
            since_s = now - last[0] if last is not None else 0.0
            if len(self._last) >= self._max_keys and key not in self._last:
                # Bounded memory: forget the oldest keys rather than grow with every distinct error
                # (at least one, or a max_keys under 4 would never forget anything).
                for old in sorted(self._last, key=lambda k: self._last[k][0])[: max(1, self._max_keys // 4)]:
                    del self._last[old]
            self._last[key] = (now, 0)
        # The repeats were held back since this key was last logged, which may be longer ago than a period.
        suffix = f" ({held_back} more like this in the last {since_s:.0f}s)" if held_back else ""
        self._logger.log(level, "%s%s", message, suffix)
        return True


@dataclass
class _PipelineHealth:
    interval_s: float
    last_tick_s: float | None = None


@dataclass
class ComponentTelemetry:
    """What one component may count about itself."""

    telemetry: Telemetry
    kind: str
    component: str
    log: RateLimitedLog = field(repr=False)

    def dropped(self, pipeline: str, records: int) -> None:
        """Records an exporter had to throw away (queue full, gave up retrying)."""
        self.telemetry.exporter_dropped.labels(pipeline=pipeline, component=self.component).inc(records)

    @property
    def registry(self) -> CollectorRegistry:
        """For a component's own metrics (name them ``wattpipe_<component type>_…``)."""
        return self.telemetry.registry

    def counter(self, name: str, documentation: str, labels: tuple[str, ...] = ()) -> _BoundCounter:
        """A counter of this component's own, labelled ``component`` and ``labels``: made once per name,
        shared by every component that asks for it (two ``nvml`` receivers count into one family)."""
        return _BoundCounter(self.telemetry.counter(name, documentation, ("component", *labels)), self.component)


class _BoundCounter:
    """A counter family with its ``component`` label filled in."""

    def __init__(self, family: Counter, component: str) -> None:
        self._family = family
        self._component = component

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._family.labels(component=self._component, **labels).inc(amount)

    def value(self, **labels: str) -> float:
        """The count so far (0 for a label set never counted)."""
        for metric in self._family.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels == {"component": self._component, **labels}:
                    return float(sample.value)
        return 0.0


class Telemetry:
    def __init__(self, clock: Clock, logger: logging.Logger | None = None) -> None:
        self.clock = clock
        self.logger = logger or logging.getLogger("wattpipe")
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["pipeline", "component"]
        self.tick_duration = Histogram(
            "wattpipe_tick_duration_seconds",
            "Time from polling the receivers to the last exporter returning, per tick.",
            ["pipeline"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self.receiver_records = Counter(
            "wattpipe_receiver_records", "Records a receiver delivered.", labels, registry=self.registry
        )
        self.receiver_errors = Counter(
            "wattpipe_receiver_errors", "Polls that failed or timed out.", labels, registry=self.registry
        )
        self.processor_errors = Counter(
            "wattpipe_processor_errors",
            "Ticks a processor failed on (the tick went on without it).",
            labels,
            registry=self.registry,
        )
        self.exporter_sent = Counter(
            "wattpipe_exporter_sent", "Records an exporter accepted.", labels, registry=self.registry
        )
        self.exporter_failed = Counter(
            "wattpipe_exporter_failed", "Records an exporter failed to send.", labels, registry=self.registry
        )
        self.exporter_dropped = Counter(
            "wattpipe_exporter_dropped", "Records an exporter dropped.", labels, registry=self.registry
        )
        self._health: dict[str, _PipelineHealth] = {}
        self._server: HttpServer | None = None
        self._counters: dict[str, tuple[Counter, tuple[str, ...]]] = {}
        self._lock = threading.Lock()

    def counter(self, name: str, documentation: str, labels: tuple[str, ...]) -> Counter:
        """The counter family ``name`` (made on first use); asking again with other labels is a bug."""
        with self._lock:
            known = self._counters.get(name)
            if known is None:
                known = self._counters[name] = (Counter(name, documentation, labels, registry=self.registry), labels)
        if known[1] != labels:
            raise ValueError(f"counter {name} has labels {known[1]}, not {labels}")
        return known[0]

    def for_component(self, kind: str, component: str, logger: logging.Logger) -> ComponentTelemetry:
        return ComponentTelemetry(self, kind, component, RateLimitedLog(logger, self.clock))

    # --- health ---------------------------------------------------------------------------

    def register_pipeline(self, name: str, interval_s: float) -> None:
        self._health[name] = _PipelineHealth(interval_s)

    def tick_finished(self, pipeline: str, duration_s: float) -> None:
        self.tick_duration.labels(pipeline=pipeline).observe(duration_s)
        self._health[pipeline].last_tick_s = self.clock.monotonic()

    def ready(self) -> tuple[bool, str]:
        """Ready when every pipeline finished a tick within its last three intervals."""
        now = self.clock.monotonic()
        for name, health in sorted(self._health.items()):
            if health.last_tick_s is None:
                return False, f"pipeline {name}: no tick has finished yet"
            age = now - health.last_tick_s
            if age > 3 * health.interval_s:
                return False, f"pipeline {name}: last tick finished {age:.1f}s ago (interval {health.interval_s:g}s)"
        return True, "ok"

    # --- serving ---------------------------------------------------------------------------

    def app(self) -> WsgiApp:
        def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path == "/metrics":
                body = generate_latest(self.registry)
                start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
                return [body]
            if path == "/healthz":
                start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
                return [b"ok\n"]
            if path == "/readyz":
                ok, why = self.ready()
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [why.encode() + b"\n"]
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics, /healthz or /readyz\n"]

        return app

    def serve(self, listen: str, web: WebConfig | None = None) -> HttpServer:
        """Serve /metrics, /healthz and /readyz on ``listen``, with ``web``'s TLS and basic auth if given."""
        self.close()  # serving twice must not leave the first server's port and thread behind
        self._server = serve(listen, self.app(), web)
        self._server.start()
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
