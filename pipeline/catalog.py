"""Every metric family wattpipe exports and how a Batch becomes their labelled values: one import for both.

Two modules do the work, and this one names what they offer:

- :mod:`pipeline.families` (with :mod:`pipeline.families_saturation` and :mod:`pipeline.families_cpu`) is the table: each :class:`Family` (record, field, instrument, unit, labels)
  named in the Kepler and the OpenTelemetry scheme, each canonical :class:`Attribute` named in both, and
  the Prometheus form of those names;
- :mod:`pipeline.labels` is the label engine: :func:`labelled_columns` (and :func:`points`,
  :func:`labelled_values` over it) turns a Batch into one family's labelled values, the same way for every
  exporter, so the Prometheus and OTLP exporters cannot disagree about what a series is. Its docstring
  states the label rules; :class:`SeriesLabels`, the label mapping it hands out, states the identity
  promise exporters key their caches on; :class:`LabelEngine` owns the caches (each exporter builds its
  own, :data:`DEFAULT_ENGINE` serves calls that pass none).
"""

from __future__ import annotations

from wattpipe.pipeline.families import (
    ATTRIBUTES,
    DEVICE_DERIVED,
    GPU_FAMILIES,
    NODE,
    Attribute,
    Family,
    Instrument,
    Scheme,
    label_name,
    prometheus_label,
    prometheus_name,
)
from wattpipe.pipeline.families_cpu import CPU_FAMILIES
from wattpipe.pipeline.families_saturation import SATURATION_FAMILIES
from wattpipe.pipeline.labels import (
    DEFAULT_ENGINE,
    Columns,
    LabelEngine,
    Point,
    SeriesLabels,
    device_attributes,
    labelled_columns,
    labelled_values,
    points,
    remember_devices,
)

__all__ = [
    "ATTRIBUTES",
    "DEFAULT_ENGINE",
    "DEVICE_DERIVED",
    "FAMILIES",
    "NODE",
    "Attribute",
    "Columns",
    "Family",
    "Instrument",
    "LabelEngine",
    "Point",
    "Scheme",
    "SeriesLabels",
    "device_attributes",
    "label_name",
    "labelled_columns",
    "labelled_values",
    "points",
    "prometheus_label",
    "prometheus_name",
    "remember_devices",
]

FAMILIES: tuple[Family, ...] = (*GPU_FAMILIES, *SATURATION_FAMILIES, *CPU_FAMILIES)
"""Every family, in the order exporters write them and docs/metrics.md lists them."""
