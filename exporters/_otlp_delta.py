"""Delta temporality for the ``otlp`` exporter: each counter point as the increase since what was last *sent*.

The records carry cumulative totals. Taking the delta at send time, against the last value the collector
actually received, means a dropped or given-up batch widens the next delta instead of losing its energy
(docs/otlp.md): the deltas a backend adds up always equal the totals.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Iterable
from typing import Any

from wattpipe.exporters._otlp_snapshot import AttributeValue, Point
from wattpipe.pipeline.catalog import FAMILIES

__all__ = ["DeltaState", "PendingDeltas"]

SeriesKey = tuple[str, int, frozenset[tuple[str, AttributeValue]]]

_DESCRIBING = frozenset(
    {
        "wattpipe.state",
        "process.command",
        "process.executable.path",
        "wattpipe.process.type",
        "container.id",
        "container.runtime",
        "k8s.container.name",
        "k8s.pod.uid",
        "k8s.pod.name",
        "k8s.namespace.name",
        "wattpipe.vm.id",
        "wattpipe.vm.name",
        "wattpipe.vm.hypervisor",
    }
)
"""Attributes that describe a consumer without naming it, and may change while its series goes on: its state
(``running``, then ``terminated``), its pod's names (known once the k8s cache synced), what a process runs and
where (after an exec). A series is named by the rest and its start: under new attributes its deltas go on from
what was last sent (a new series would start over from its whole total, and a backend summing deltas would
count that energy twice). A family's own key (``container.id`` for a container's) always names it; where a
point lacks its key (a pod known by name only, before its UID), all its attributes but the state name it."""
_STATE = frozenset({"wattpipe.state"})
FORGET_AFTER_NS = 3600 * 10**9  # a series none of whose points was sent for an hour while others' were
NEVER_ENDS = frozenset(f.otel for f in FAMILIES if f.kind == "device" and f.instrument == "counter")
"""A device's and a node's counters: they never end, but stop being exported while their device is gone (past
the energy processor's ``terminated_retention``), and go on from their total under the same start when it is back:
not forgotten for their age (a handful per device), or their first delta then was their whole total again."""


class DeltaState:
    """What was last sent per series: (raw value, time_ns). Bounded: past ``max_series`` the series least
    recently sent is forgotten (if it comes back, it starts over from its own start: nothing is counted twice
    by a backend that sees a new start time)."""

    def __init__(self, max_series: int = 100_000) -> None:
        self.max_series = max_series
        self._last_sent: collections.OrderedDict[SeriesKey, tuple[float, int]] = collections.OrderedDict()
        self._lock = threading.Lock()  # the sender thread commits while the service's checkpoint dumps

    def __len__(self) -> int:
        return len(self._last_sent)

    # --- the state file: what was sent goes on across a restart ----------------------------------------------

    def dump(self) -> list[list[Any]]:
        """What was last sent per series, least recently sent first: ``[metric, start_ns, [[name, value], …],
        raw, time_ns]`` rows (JSON). Series whose last point sent is older than ``FORGET_AFTER_NS`` before the
        newest sent are forgotten first: they are no longer exported (an ended series stays for
        ``terminated_retention``, a minute by default), and a node's churn would otherwise fill the state up to
        ``max_series``; but not those of :data:`NEVER_ENDS` (a device back goes on). Measured against what was
        sent, not the clock: an outage forgets nothing."""
        with self._lock:
            last_sent = self._last_sent
            if last_sent:
                newest_ns = next(reversed(last_sent.values()))[1]  # the last committed: the newest sent
                old = itertools.takewhile(lambda item: item[1][1] < newest_ns - FORGET_AFTER_NS, last_sent.items())
                for key in [key for key, _ in old if key[0] not in NEVER_ENDS]:  # (least recently sent first)
                    del last_sent[key]
            items = list(last_sent.items())
        return [
            [metric, start_ns, sorted(map(list, named)), raw, time_ns]
            for (metric, start_ns, named), (raw, time_ns) in items
        ]

    def load(self, rows: Iterable[Any]) -> int:
        """Rows from :meth:`dump` (a restart's); a malformed row is skipped. How many were taken."""
        taken: dict[SeriesKey, tuple[float, int]] = {}
        for row in rows:
            try:
                metric, start_ns, named, raw, time_ns = row
                attributes = frozenset(
                    (str(name), value if isinstance(value, int) else str(value)) for name, value in named
                )
                taken[(str(metric), int(start_ns), attributes)] = (float(raw), int(time_ns))
            except (TypeError, ValueError):
                continue
        self._commit(taken)
        return len(taken)

    def begin(self) -> PendingDeltas:
        """The deltas of one request: committed only once the request was sent."""
        return PendingDeltas(self)

    def _commit(self, updates: dict[SeriesKey, tuple[float, int]]) -> None:
        last_sent = self._last_sent
        with self._lock:
            for key, value in updates.items():
                last_sent[key] = value
                last_sent.move_to_end(key)
            while len(last_sent) > self.max_series:
                last_sent.popitem(last=False)


class PendingDeltas:
    """One request's deltas. A failed attempt simply drops this object: the next attempt starts again from
    what was last sent, so a retry never subtracts the same energy twice."""

    def __init__(self, state: DeltaState) -> None:
        self._state = state
        self._updates: dict[SeriesKey, tuple[float, int]] = {}

    def of(self, metric: str, point: Point, own: str | None = None) -> tuple[float, int]:
        """``point``'s (value, start_ns) as a delta of its series: ``metric``, its start and its naming attributes
        (all but the describing ones, ``own`` among them: the family's key attribute)."""
        attributes = point.attributes
        describing = _DESCRIBING if own is not None and own in attributes else _STATE
        named = frozenset(i for i in attributes.items() if i[0] not in describing or i[0] == own)
        key = (metric, point.start_ns, named)
        last = self._state._last_sent.get(key)
        self._updates[key] = (point.raw, point.time_ns)
        # A series that restarted (its total fell, or it began after what we last sent) starts over.
        if last is not None and last[0] <= point.raw and last[1] >= point.start_ns:
            return point.raw - last[0], last[1]
        return point.raw, point.start_ns

    def commit(self) -> None:
        self._state._commit(self._updates)
