"""Piecewise-constant functions of scenario time with exact integrals.

Everything the simulator reports is one of these (power, a process's utilisation, an instance's
activity) or an integral of one (energy, busy seconds), so every face agrees with the ground truth to
the last bit: no accumulation, no step size, any time can be queried in any order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

__all__ = ["StepFunction"]


class StepFunction:
    """``f(t) = values[k]`` for ``times[k] <= t < times[k+1]``; ``before`` for ``t < times[0]``.

    ``times`` may be shared between functions built on the same breakpoints (it is never mutated).
    """

    __slots__ = ("_cum", "before", "times", "values")

    def __init__(self, times: Sequence[float], values: Sequence[float], before: float = 0.0) -> None:
        if len(times) != len(values) or not times:
            raise ValueError("a step function needs one value per breakpoint, and at least one")
        self.times = times
        self.values = values
        self.before = before
        cum = [0.0] * len(times)
        for k in range(1, len(times)):
            cum[k] = cum[k - 1] + values[k - 1] * (times[k] - times[k - 1])
        self._cum = cum

    def at(self, t: float) -> float:
        k = bisect_right(self.times, t) - 1
        return self.before if k < 0 else self.values[k]

    def integral(self, t: float) -> float:
        """∫ f from ``times[0]`` to ``t`` (negative for ``t`` before the first breakpoint)."""
        k = bisect_right(self.times, t) - 1
        if k < 0:
            return self.before * (t - self.times[0])
        return self._cum[k] + self.values[k] * (t - self.times[k])

    def integral_between(self, t0: float, t1: float) -> float:
        return self.integral(t1) - self.integral(t0)

    def mean(self, t0: float, t1: float) -> float:
        """The mean over ``[t0, t1]``; the value at ``t1`` for an empty window."""
        if t1 <= t0:
            return self.at(t1)
        return (self.integral(t1) - self.integral(t0)) / (t1 - t0)
