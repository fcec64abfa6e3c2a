"""Idle power from valid quiet spans: the span guard, and the sliding window of their minimum.

Two estimators use these, each with its own runs and window: ``free`` (no process listed on the device)
and ``quiet`` (processes listed, none of them doing any work). See processors/idle.py for what makes a
span valid and why.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Estimate", "Guard", "IdleWindow", "QuietRun"]

_QUIET_MARKS = 1024  # quiet readings kept per run: min_interval / tick interval of them are needed


@dataclass(frozen=True, slots=True)
class Estimate:
    """An idle power and how uncertain it is (W; None: the estimator cannot say)."""

    power_w: float
    uncertainty_w: float | None = None


@dataclass(frozen=True, slots=True)
class Guard:
    """What makes a quiet span valid: long enough, and its counter agreeing with the power readings."""

    min_interval_s: float
    agreement: float
    agreement_w: float

    def disagreement_w(self, average_w: float, *readings_w: float | None) -> float | None:
        """How far the counter's average is from the farthest power reading: None where that is beyond
        ``agreement`` of a reading or ``agreement_w``, whichever is larger (the span is not valid); 0 where
        the device reads no power (a RAPL zone: ``min_interval`` is then its only guard)."""
        worst_w = 0.0
        for reading_w in readings_w:
            if reading_w is None:
                continue
            off_w = abs(average_w - reading_w)
            if off_w > max(self.agreement_w, self.agreement * reading_w):
                return None
            worst_w = max(worst_w, off_w)
        return worst_w


@dataclass(slots=True)
class _Mark:
    """A quiet reading in a run of them: when, the run's energy up to it, and its power reading."""

    monotonic_s: float
    run_energy_mj: int
    power_w: float | None


class QuietRun:
    """One device's current run of consecutive quiet readings (for one estimator's notion of quiet)."""

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: deque[_Mark] = deque(maxlen=_QUIET_MARKS)

    def clear(self) -> None:
        self._marks.clear()

    def follow(
        self, guard: Guard, now_s: float, power_w: float | None, quiet: bool, continuous: bool, energy_mj: int
    ) -> Estimate | None:
        """Extend the run with this reading; the valid span ending here (its last ``min_interval``), if any.

        The estimate's uncertainty is how far the span's counter average was from its power readings:
        a consistency check between two sensors, not a calibration error (which no software can see).
        """
        marks = self._marks
        if not quiet:
            marks.clear()
            return None
        if not continuous or not marks:
            marks.clear()
            marks.append(_Mark(now_s, 0, power_w))  # a run starts here
            return None
        run_mj = marks[-1].run_energy_mj + energy_mj
        # The span judged: from the latest quiet reading at least min_interval back (the last interval alone
        # when it is long enough); older readings can never be that reading again.
        while len(marks) > 1 and now_s - marks[1].monotonic_s >= guard.min_interval_s:
            marks.popleft()
        start = marks[0]
        marks.append(_Mark(now_s, run_mj, power_w))
        span_s = now_s - start.monotonic_s
        if span_s < guard.min_interval_s:
            return None
        average_w = (run_mj - start.run_energy_mj) / 1000.0 / span_s
        off_w = guard.disagreement_w(average_w, start.power_w, power_w)
        return None if off_w is None else Estimate(average_w, off_w)


@dataclass(slots=True)
class _Bucket:
    number: int
    power_w: float
    uncertainty_w: float | None


class IdleWindow:
    """Per device, the lowest valid quiet power in each ``bucket_s`` of wall time, over ``window_s``.

    Wall time, not monotonic, so the window means the same after a restart (the state file keeps it); the
    caller (processors/_idle_chain.py) gives a wall time that a step of the wall clock within a run does not move.
    """

    def __init__(self, window_s: float, bucket_s: float) -> None:
        self.window_s, self.bucket_s = window_s, bucket_s
        self._buckets: dict[str, deque[_Bucket]] = {}  # device → its buckets, oldest first

    def add(self, device_id: str, wall_s: float, estimate: Estimate) -> None:
        number = math.floor(wall_s / self.bucket_s)
        buckets = self._buckets.setdefault(device_id, deque())
        if buckets and number <= buckets[-1].number:
            # The same bucket, or the wall clock stepped back: the newest bucket takes it (kept longer, never
            # dropped earlier than its own time would be).
            if estimate.power_w < buckets[-1].power_w:
                buckets[-1].power_w, buckets[-1].uncertainty_w = estimate.power_w, estimate.uncertainty_w
        else:
            buckets.append(_Bucket(number, estimate.power_w, estimate.uncertainty_w))

    def prune(self, device_id: str, wall_s: float) -> bool:
        """Drop buckets that ended more than the window ago, but never the last one; True if any went."""
        buckets = self._buckets.get(device_id)
        oldest_end_s = wall_s - self.window_s
        dropped = False
        while buckets and len(buckets) > 1 and (buckets[0].number + 1) * self.bucket_s <= oldest_end_s:
            buckets.popleft()
            dropped = True
        return dropped

    def minimum(self, device_id: str) -> Estimate | None:
        buckets = self._buckets.get(device_id)
        if not buckets:
            return None
        lowest = min(buckets, key=lambda b: b.power_w)
        return Estimate(lowest.power_w, lowest.uncertainty_w)

    def devices(self) -> list[str]:
        return list(self._buckets)

    def dump(self) -> dict[str, list[list[float]]]:
        """Each device's buckets as [start wall s, min W, ± W] (± W left out where unknown; bucket starts, so
        another bucket size can load them)."""
        return {
            device_id: [
                [b.number * self.bucket_s, b.power_w] + ([] if b.uncertainty_w is None else [b.uncertainty_w])
                for b in buckets
            ]
            for device_id, buckets in self._buckets.items()
        }

    def load(self, saved: dict[str, Any]) -> None:
        for device_id, rows in saved.items():
            for row in sorted(([float(v) for v in r] for r in rows), key=lambda r: r[0]):
                self.add(str(device_id), row[0], Estimate(row[1], row[2] if len(row) > 2 else None))
