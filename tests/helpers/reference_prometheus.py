"""The reference Prometheus renderer, for tests only: ``prometheus_client``'s own registry.

:class:`ReferencePrometheusExporter` is the ``prometheus`` exporter with its text made by a custom collector
on a private ``CollectorRegistry``, rendered by ``generate_latest``: a ``Sample`` per series, every label
formatted on every tick. It is slow and obviously right; the tests hold the exporter's own renderer to the
same bytes (``tests/exporters/test_prometheus.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from wattpipe.exporters.prometheus import PrometheusConfig, PrometheusExporter, _metric, _prometheus_labels
from wattpipe.pipeline.catalog import Point
from wattpipe.pipeline.components import CreateContext


class _Collector:
    """The metric families of the exporter's latest batches, built when the registry renders."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        exporter = self._exporter
        for family, sample_name, parts in exporter._family_values():
            metric = _metric(family, exporter.config.naming)
            series: dict[tuple[tuple[str, str], ...], Sample] = {}
            # In pipeline order: where two pipelines give one series, the last wins.
            points = (Point(*row) for columns in parts for row in zip(*columns, strict=True))
            for point in points:
                if not exporter.config.terminated and getattr(point.record, "state", None) == "terminated":
                    continue
                labels = _prometheus_labels(point.labels)
                for name, value in exporter._defaults.items():
                    labels.setdefault(name, value)
                series[tuple(sorted(labels.items()))] = Sample(sample_name, labels, point.value, None, None)
            if series:
                metric.samples.extend(series.values())
                yield metric


class ReferencePrometheusExporter(PrometheusExporter):
    def __init__(self, config: PrometheusConfig, ctx: CreateContext) -> None:
        super().__init__(config, ctx)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(self))

    def _render_text(self) -> bytes:
        return generate_latest(self._registry)


def exporter_for(renderer: str, config: PrometheusConfig, ctx: CreateContext) -> PrometheusExporter:
    """``"fast"``: the exporter as shipped; ``"prometheus_client"``: the reference."""
    return (PrometheusExporter if renderer == "fast" else ReferencePrometheusExporter)(config, ctx)
