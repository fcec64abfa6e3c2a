"""Idle power by regression: power = idle + slope × Σ utilisation, over a sliding window of ticks.

Why one slope on the device's summed utilisation, not one per process: the intercept is all the idle
processor wants, and per-process slopes are not identifiable in practice (64 processes need 65 ticks of
independently varying loads, and tenants' loads are mostly steady or move together). Σ utilisation
with one slope is exact when the tenants draw the same watts per unit of utilisation, and unbiased
when the mix does not change with the total; where it does (a tensor-core job busy exactly when a
memory-bound one is not), the intercept is biased and the fit's spread of residuals says so.

Why Huber's M-estimator (iteratively reweighted least squares, k = 1.345, the scale from the median
absolute deviation of the residuals): ticks whose power and utilisation do not line up (a load
change inside a tick that the per-process utilisation averages differently from the counter, a
throttled tick at the power limit) are outliers in *power*; Huber down-weights them and keeps the
efficiency of least squares on the rest. It is not robust to outliers in utilisation (leverage), but
summed SM utilisation is bounded (0 to ~1 per device), so leverage is too.

The cost: each tick adds one point (O(1)); a fit is O(points × iterations) and is made only when
asked (the processor refits at most one device per tick, each at most every ``refit_s``).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["Fit", "Regression", "RegressionSettings", "fit_line"]

HUBER_K = 1.345  # 95 % of least squares' efficiency under normal noise
MAD_TO_SIGMA = 1.4826  # the median absolute deviation of normal noise × this = its standard deviation
_MAX_ITERATIONS = 30
# The residuals' scale is never taken below the readings' own resolution (NVML reads mW, the counter mJ):
# on an exact line (a simulator) the scale is ~0, and a zero cut would weigh every point at nothing.
SCALE_FLOOR_W = 1e-3
CONVERGED_W = 1e-3  # W and W per unit of utilisation: far below what the intercept is reported to


@dataclass(frozen=True, slots=True)
class RegressionSettings:
    window_s: float = 600.0
    min_points: int = 10
    min_spread: float = 0.1
    min_r2: float = 0.8
    max_uncertainty_w: float = 2.0
    refit_s: float = 30.0
    max_points: int = 240


@dataclass(frozen=True, slots=True)
class Fit:
    """A robust line through (Σ utilisation, W): ``idle_w`` (the intercept) ± ``uncertainty_w`` (its
    standard error, 1σ, from the residuals' robust scale); ``spread`` is the weighted standard deviation
    of the utilisation, ``r2`` the weighted share of the power's variance the line explains."""

    idle_w: float
    slope_w: float
    uncertainty_w: float
    r2: float
    spread: float
    points: int


def fit_line(xs: list[float], ys: list[float], start: tuple[float, float] | None = None) -> Fit | None:
    """Huber's robust line through the points, from ``start`` (idle W, slope W) if given (the last fit:
    a window that moved by a few points converges in one or two steps), else from least squares. None
    where the line is undefined (no spread in x)."""
    line = start or _weighted_line(xs, ys, [1.0] * len(xs))
    if line is None:
        return None
    weights: list[float] = []
    for _ in range(_MAX_ITERATIONS):
        idle_w, slope_w = line
        residuals = _residuals(xs, ys, idle_w, slope_w)
        cut_w = HUBER_K * max(_robust_scale(residuals), SCALE_FLOOR_W)
        weights = [1.0 if abs(r) <= cut_w else cut_w / abs(r) for r in residuals]
        line = _weighted_line(xs, ys, weights)
        if line is None:
            return None
        if abs(line[0] - idle_w) < CONVERGED_W and abs(line[1] - slope_w) < CONVERGED_W:
            break
    return _summary(xs, ys, weights, *line)


def _spread(xs: list[float]) -> float:
    """The standard deviation of ``xs`` (unweighted)."""
    mean = sum(xs) / len(xs)
    return math.sqrt(max(0.0, sum(x * x for x in xs) / len(xs) - mean * mean))


def _residuals(xs: list[float], ys: list[float], idle_w: float, slope_w: float) -> list[float]:
    return [y - idle_w - slope_w * x for x, y in zip(xs, ys, strict=True)]


def _weighted_line(xs: list[float], ys: list[float], weights: list[float]) -> tuple[float, float] | None:
    total = sum(weights)
    if total <= 0.0:
        return None
    mean_x = sum(map(operator.mul, weights, xs)) / total
    mean_y = sum(map(operator.mul, weights, ys)) / total
    dxs = [x - mean_x for x in xs]
    wdxs = list(map(operator.mul, weights, dxs))
    sxx = sum(map(operator.mul, wdxs, dxs))
    if sxx <= 1e-12 * total:
        return None
    slope = sum(map(operator.mul, wdxs, ys)) / sxx  # Σ w·dx·(y − ȳ) = Σ w·dx·y, as Σ w·dx = 0
    return mean_y - slope * mean_x, slope


def _robust_scale(residuals: list[float]) -> float:
    centre = statistics.median(residuals)
    return MAD_TO_SIGMA * statistics.median([abs(r - centre) for r in residuals])


def _summary(xs: list[float], ys: list[float], weights: list[float], idle_w: float, slope_w: float) -> Fit:
    total = sum(weights)
    mean_x = sum(map(operator.mul, weights, xs)) / total
    mean_y = sum(map(operator.mul, weights, ys)) / total
    dxs = [x - mean_x for x in xs]
    dys = [y - mean_y for y in ys]
    residuals = _residuals(xs, ys, idle_w, slope_w)
    sxx = sum(map(operator.mul, map(operator.mul, weights, dxs), dxs))
    syy = sum(map(operator.mul, map(operator.mul, weights, dys), dys))
    sse = sum(map(operator.mul, map(operator.mul, weights, residuals), residuals))
    # The intercept's standard error, with the weights' sum as the number of points (down-weighted points
    # count less: conservative). Ticks' residuals are correlated in time, so this is a lower bound.
    uncertainty_w = _robust_scale(residuals) * math.sqrt(1.0 / total + mean_x * mean_x / sxx)
    r2 = 1.0 - sse / syy if syy > 0.0 else 0.0
    return Fit(idle_w, slope_w, uncertainty_w, r2, math.sqrt(sxx / total), len(xs))


class Regression:
    """One device's regression points over the window: (monotonic s, Σ utilisation, average W) per tick."""

    __slots__ = ("_line", "_points", "accepted", "dirty", "fitted_s", "lowest_w", "settings")

    def __init__(self, settings: RegressionSettings) -> None:
        self.settings = settings
        self._points: deque[tuple[float, float, float]] = deque(maxlen=settings.max_points)
        self.lowest_w = math.inf  # the lowest power of any point since the processor started
        self.fitted_s = -math.inf  # when the last fit was made
        self.dirty = False  # points came or went since then
        self.accepted = False  # a fit has passed since the processor started
        self._line: tuple[float, float] | None = None  # the last fit's (idle W, slope), accepted or not

    def __len__(self) -> int:
        return len(self._points)

    def add(self, monotonic_s: float, util: float, power_w: float) -> None:
        self._points.append((monotonic_s, util, power_w))
        self.lowest_w = min(self.lowest_w, power_w)
        self.dirty = True

    def prune(self, monotonic_s: float) -> None:
        points, oldest_s = self._points, monotonic_s - self.settings.window_s
        while points and points[0][0] <= oldest_s:
            points.popleft()
            self.dirty = True

    def due(self, monotonic_s: float) -> bool:
        """Whether to fit now: every ``refit_s``; and at every new tick from ``min_points`` ticks on until a
        fit first passes or twice that many came (until then the device's idle energy goes to its processes,
        so every tick sooner is energy billed right)."""
        if not self.dirty:
            return False
        if not self.accepted and self.settings.min_points <= len(self._points) < 2 * self.settings.min_points:
            return True  # the start: a window that never passes (a steady load) is then fitted like any other
        return monotonic_s - self.fitted_s >= self.settings.refit_s

    def fit(self, monotonic_s: float) -> Fit | None:
        """The window's fit, if it passes every test (else None): enough points, spread and fit quality,
        a rising line, an intercept no more uncertain than allowed, at or above 0. The intercept is then
        capped at the lowest power seen: no device draws less than its idle power."""
        self.fitted_s, self.dirty = monotonic_s, False
        s = self.settings
        if len(self._points) < s.min_points:
            return None
        _, xs, ys = (list(column) for column in zip(*self._points, strict=True))
        if _spread(xs) < s.min_spread:
            return None  # a steady load: not worth a robust fit (it costs ~50× this test)
        fit = fit_line(xs, ys, self._line)
        self._line = (fit.idle_w, fit.slope_w) if fit is not None else None
        if fit is None or fit.spread < s.min_spread or fit.r2 < s.min_r2:
            return None
        if fit.slope_w <= 0.0 or fit.idle_w < 0.0 or fit.uncertainty_w > s.max_uncertainty_w:
            return None
        self.accepted = True
        return dataclasses.replace(fit, idle_w=self.lowest_w) if fit.idle_w > self.lowest_w else fit
