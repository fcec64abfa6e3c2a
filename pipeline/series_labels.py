"""The label mapping the label engine hands out for a series, and the identity promise exporters key caches on."""

from __future__ import annotations

__all__ = ["SeriesLabels", "label_text"]


class SeriesLabels(dict[str, str]):
    """One series' labels (under the scheme's names, node not included), as the label engine hands them out.

    The identity promise, which exporters build their caches on: for as long as a series is rendered tick
    after tick with its labels unchanged (the same record identity, extras, label-source fields, label
    actions and device attributes), :func:`labelled_columns` hands out *the same* ``SeriesLabels`` object
    for it; when any of its labels changes, a new object. So an exporter may key what it derives from a
    series' labels (a formatted Prometheus prefix, typed OTLP attributes) by ``id()`` of this object, as long
    as its cache entry holds the object too (so the address cannot be reused by another one meanwhile). A
    series that stops being rendered may come back with a new object (its entry in the engine's bounded cache
    is dropped within two renewals): a cache miss, never a wrong hit. ``tests/pipeline/test_catalog.py``
    states the promise.

    Never modified once made (it is shared by every exporter and every tick): treat it as read-only.
    """

    __slots__ = ("series",)
    series: str
    """The label set, sorted and written out: equal for records that collapse onto one series (a string,
    because a string keeps its hash: the points of a family are collapsed by it on every tick)."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__(labels)
        self.series = repr(sorted(labels.items()))


def label_text(value: object) -> str:
    """A record field's value as a label value (``true``/``false`` for a bool)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
