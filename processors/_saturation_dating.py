"""When a dcgm-exporter collection happened, for dating its values in the saturation window's data time.

The dcgm receiver knows a collection only to within a scrape: it happened in ``(after, by]`` (the scrape
that first saw it, and the one before). dcgm-exporter prints the board's energy counter with every
collection, the same counter NVML reads at every tick (``DeviceSample.energy_mj``): the collection is placed
where DCGM's reading falls between two ticks' NVML readings, by linear interpolation within that tick (exact
when the power is steady within the tick), as ``_mig_window`` places MIG collections. Without an NVML
reading that brackets it (no nvml receiver, no energy counter), the collection is dated ``by``: late by up
to one scrape interval (docs/saturation.md, known limits).
"""

from __future__ import annotations

import itertools
from collections import deque

__all__ = ["CollectionDating"]

_RECENT = 16  # ticks kept per GPU: a collection is seen within a scrape or two of happening


class CollectionDating:
    """Per GPU, NVML's recent energy counter readings, and where a DCGM reading falls among them."""

    def __init__(self) -> None:
        self._readings: dict[str, deque[tuple[float, float]]] = {}  # uuid → (monotonic s, counter mJ)

    def reading(self, uuid: str, t_s: float, counter_mj: float) -> None:
        held = self._readings.setdefault(uuid, deque(maxlen=_RECENT))
        if not held or t_s > held[-1][0]:
            held.append((t_s, counter_mj))

    def forget(self, uuids: set[str]) -> None:
        """Keep only these GPUs (the ones this tick read): memory bounded by the GPUs present."""
        for uuid in [u for u in self._readings if u not in uuids]:
            del self._readings[uuid]

    def place(self, uuid: str, after_s: float, by_s: float, energy_j: float | None) -> float:
        """When a collection first seen in ``(after_s, by_s]`` happened, from its energy counter reading."""
        held = self._readings.get(uuid)
        if energy_j is None or not held:
            return by_s
        counter_mj = float(round(energy_j * 1000.0))  # both count whole mJ
        readings = list(held)
        for (t0, low), (t1, high) in itertools.pairwise(readings):
            if low < counter_mj <= high:
                at = t0 + (counter_mj - low) / (high - low) * (t1 - t0)
                return min(by_s, max(after_s, at))
        return by_s
