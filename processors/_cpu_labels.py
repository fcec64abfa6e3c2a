"""How ``cpu_attribution``'s series are labelled: each series' attributes and the labels its Totals records
carry (set through :func:`label` only), the k8s names a series keeps while they are not known again, and the
``series_start`` that tells a reused pid's series apart."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Mapping

from wattpipe.processors._energy_series import SERIES_START, Series, series_start_value

__all__ = ["PROCESS_PLACE", "label", "names_kept", "tell_reused_apart"]

# The k8s names a series is labelled with, and what says where a process is (the same there: the same names).
_NAMES = ("pod_name", "pod_namespace", "container_name")
PROCESS_PLACE = ("container_id", "pod_uid")
_PID_ZONE = operator.itemgetter(0, 2)  # of a process series' key (pid, start time, zone type)


def names_kept(old: Mapping[str, str], new: dict[str, str], place: tuple[str, ...]) -> dict[str, str]:
    """``new``, with the k8s names ``old`` has where ``new`` has none (the k8s processor does not name the pod
    yet: its cache not synced after a restart) and the series is in the same place (``place``'s attributes
    alike): a series keeps its pod's names until they are known again, as the energy processor's groups keep
    theirs (a series whose labels change is another series to Prometheus)."""
    if any(name in new for name in _NAMES) or not any(name in old for name in _NAMES):
        return new
    if any(old.get(name) != new.get(name) for name in place):
        return new  # another container or pod now (an exec): not its names
    return {**new, **{name: old[name] for name in _NAMES if name in old}}


def label(series: Series, attrs: dict[str, str]) -> None:
    """Give a series its attributes, and the labels its Totals records carry (sorted, as ``to_totals`` makes
    them), made once here: a series' attributes are only ever replaced, by a new dict, through this. A series
    that tells a reused pid apart (``SERIES_START``) keeps that for good."""
    if (began := series.attrs.get(SERIES_START)) is not None and SERIES_START not in attrs:
        attrs = {**attrs, SERIES_START: began}
    series.attrs = attrs
    items = tuple(attrs.items())
    series.extra = (items, tuple(sorted(items)))


def tell_reused_apart(processes: Mapping[tuple[int, int, str], Series]) -> None:
    """Of the process series of one pid in one zone type (keys: pid, start time, zone type; the kernel reused
    the pid within the retention), each but the earliest-started carries ``SERIES_START`` (see there), from the
    tick it began."""
    keys = processes.keys()
    per_pid = Counter(map(_PID_ZONE, keys))
    if len(per_pid) == len(keys):
        return  # (every tick but a reused pid's)
    first: set[tuple[int, str]] = set()
    for key in sorted(k for k in keys if per_pid[_PID_ZONE(k)] > 1):  # by start time within a pid
        if _PID_ZONE(key) not in first:
            first.add(_PID_ZONE(key))
        elif SERIES_START not in (series := processes[key]).attrs:
            label(series, {**series.attrs, SERIES_START: series_start_value(series.start_wall_s)})
