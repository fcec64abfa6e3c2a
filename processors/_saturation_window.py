"""The sliding window of saturation observations, and every signal's value over it.

Each signal has a defined denominator:
- ``throttle_*``: Σ counter increase / Σ elapsed time, over the observation pairs in the window where the
  counter was present at both ends, clamped to [0, 1] (the counters and the clock are read at slightly
  different instants, so a fully throttled GPU can read 1.002);
- ``clock_event_*``: observations with the bit set / observations that had the bitmask;
- ``memory_used_avg`` / ``_max``: mean and maximum of used / total framebuffer over the observations that
  had both; ``memory_pressure``: the fraction of those at or above the threshold;
- ``xid_count``: the errors seen in the window (a count, not a ratio);
- ``<gauge>_avg`` / ``_max`` and the byte rates: over the observations that had the field.
A signal no observation in the window could say anything about is absent: no value, never 0.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping

from wattpipe.processors._saturation_signals import AVERAGED, CLOCK_EVENT_BITS, RATES, THROTTLES, Observation, observe

__all__ = ["SaturationWindow", "signal_values"]

_SLACK_S = 1e-3  # a collection dated from mJ counters is placed to within microseconds: not a new sample


def signal_values(observations: Iterable[Observation], pressure_threshold: float) -> dict[str, float]:
    """Every signal that the observations can give, by name."""
    obs = list(observations)
    out: dict[str, float] = {}
    for signal in THROTTLES:
        pairs = [(o.violation_s[signal], o.dt_s) for o in obs if signal in o.violation_s and o.dt_s]
        elapsed = sum(dt for _, dt in pairs if dt is not None)
        if elapsed > 0:
            out[signal] = min(1.0, max(0.0, sum(v for v, _ in pairs) / elapsed))
    masks = [o.clock_reasons for o in obs if o.clock_reasons is not None]
    if masks:
        for signal, bit in CLOCK_EVENT_BITS.items():
            out[signal] = sum(1 for m in masks if m & bit) / len(masks)
    used = [o.memory_used for o in obs if o.memory_used is not None]
    if used:
        out["memory_used_avg"] = sum(used) / len(used)
        out["memory_used_max"] = max(used)
        out["memory_pressure"] = sum(1 for u in used if u >= pressure_threshold) / len(used)
    xids = [o.xid for o in obs if o.xid is not None]
    if xids:
        out["xid_count"] = float(sum(xids))
    for stem, name in AVERAGED.items():
        values = [o.gauges[name] for o in obs if name in o.gauges]
        if values:
            out[f"{stem}_avg"] = sum(values) / len(values)
            out[f"{stem}_max"] = max(values)
    for name in RATES:
        values = [o.gauges[name] for o in obs if name in o.gauges]
        if values:
            out[name] = sum(values) / len(values)
    return out


class SaturationWindow:
    """Per key (a device, or a MIG instance), the observations of the last ``window_s`` seconds.

    Bounded: observations older than the window are dropped at every add, and a key not seen for a whole
    window is forgotten (a GPU removed, a MIG layout changed) by :meth:`forget_stale`.
    """

    def __init__(self, window_s: float, pressure_threshold: float) -> None:
        self.window_s = window_s
        self.pressure_threshold = pressure_threshold
        self._observations: dict[Hashable, deque[Observation]] = {}
        self._last: dict[Hashable, tuple[float, Mapping[str, float]]] = {}
        self._seen: dict[Hashable, float] = {}  # when each key last answered (a repeat too), for forget_stale

    def seen(self, key: Hashable, now_s: float) -> None:
        """The key's source answered at ``now_s``, with new values or a repeat of ones already added."""
        self._seen[key] = now_s

    def add(self, key: Hashable, t_s: float, fields: Mapping[str, float], *, first_is_baseline: bool = False) -> None:
        """Values that describe the data time ``t_s`` (the tick, or a dcgm collection); the window is
        ``(t_s - window_s, t_s]`` of data time: it ends at the key's latest values, not at the tick.

        ``first_is_baseline``: the key's first values only start its counters and are not a sample (a dcgm
        collection describes the interval since the one before, unknown for the first), so that every
        observation held covers a known ``(t_s - dt_s, t_s]`` and the window is exactly their union."""
        last = self._last.get(key)
        if last is not None and t_s <= last[0]:
            return  # not newer than what the key holds: already counted
        self._last[key] = (t_s, dict(fields))
        self._seen[key] = max(t_s, self._seen.get(key, t_s))
        if last is None and first_is_baseline:
            return
        observation = observe(t_s, fields, last)
        held = self._observations.setdefault(key, deque())
        held.append(observation)
        while held and held[0].t_s <= t_s - self.window_s + _SLACK_S:
            held.popleft()

    def values(self, key: Hashable) -> dict[str, float]:
        held = self._observations.get(key)
        return signal_values(held, self.pressure_threshold) if held else {}

    def end_s(self, key: Hashable) -> float | None:
        """The data time the key's window ends at: its latest values' (None: nothing held)."""
        held = self._observations.get(key)
        return held[-1].t_s if held else None

    def span_s(self, key: Hashable) -> float:
        """How much time the key's observations cover (≤ the window): the window a value describes."""
        held = self._observations.get(key)
        if not held:
            return 0.0
        first = held[0]
        return min(self.window_s, held[-1].t_s - first.t_s + (first.dt_s or 0.0))

    def forget_stale(self, now_s: float) -> None:
        """Forget keys whose source has not answered for a whole window (by answer time, not data time)."""
        for key in [k for k, t in self._seen.items() if t <= now_s - self.window_s]:
            self._seen.pop(key, None)
            self._last.pop(key, None)
            self._observations.pop(key, None)
