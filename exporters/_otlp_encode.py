"""A queued :class:`~exporters._otlp_snapshot.Snapshot` as OTLP ``MetricsData``, built by hand.

By hand, because the SDK's observable instruments stamp every point with collection time and never forget an
attribute set: here every point carries the time its value was read and, for counters, the time its series
began (docs/otlp.md).
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from wattpipe.exporters._otlp_delta import DeltaState, PendingDeltas
from wattpipe.exporters._otlp_snapshot import Point, Snapshot
from wattpipe.pipeline.catalog import ATTRIBUTES, Family

__all__ = ["Encoder"]

_SCOPE = InstrumentationScope("wattpipe")
_OTEL_NAME = {a.name: a.otel for a in ATTRIBUTES}


class Encoder:
    """Builds each request; with a :class:`DeltaState`, counters are sent as deltas (``temporality: delta``)."""

    def __init__(self, resource: Resource, delta: DeltaState | None = None) -> None:
        self.resource = resource
        self.delta = delta

    def encode(self, snapshot: Snapshot) -> tuple[MetricsData, Callable[[], None]]:
        """The request for ``snapshot``, and what to call once it was sent (delta: remember what was sent)."""
        pending = self.delta.begin() if self.delta is not None else None
        metrics = [self._metric(family, points, pending) for family, points in snapshot.metrics]
        scope = ScopeMetrics(scope=_SCOPE, metrics=metrics, schema_url="")
        resource_metrics = ResourceMetrics(resource=self.resource, scope_metrics=[scope], schema_url="")
        return MetricsData(resource_metrics=[resource_metrics]), (pending.commit if pending else _nothing)

    @staticmethod
    def _metric(family: Family, points: tuple[Point, ...], pending: PendingDeltas | None) -> Metric:
        counter = family.instrument == "counter"
        # A consumer family's key (process.pid, container.id, k8s.pod.uid, wattpipe.vm.id) names its series.
        own = _OTEL_NAME.get(family.labels[0]) if family.kind != "device" and family.labels else None
        data_points: list[NumberDataPoint] = []
        for p in points:
            value, start_ns = (
                pending.of(family.otel, p, own) if counter and pending is not None else (p.raw, p.start_ns)
            )
            data_points.append(
                NumberDataPoint(
                    attributes=dict(p.attributes),
                    start_time_unix_nano=start_ns if counter else 0,  # gauges carry no start time
                    time_unix_nano=p.time_ns,
                    value=value / family.divisor if family.divisor != 1 else value,
                )
            )
        data: Sum | Gauge
        if counter:
            temporality = AggregationTemporality.CUMULATIVE if pending is None else AggregationTemporality.DELTA
            data = Sum(data_points=data_points, aggregation_temporality=temporality, is_monotonic=True)
        else:
            data = Gauge(data_points=data_points)
        return Metric(name=family.otel, description=family.help, unit=family.unit, data=data)


def _nothing() -> None:
    """Cumulative temporality remembers nothing of what was sent."""
