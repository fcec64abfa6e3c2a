"""The idle mode's idle power per RAPL zone: configured per zone type, or learned by regression.

Learned: each zone's power against the node's CPU usage ratio, one point per tick, through the GPU idle
processor's robust line (``processors/_idle_regression.py``: Huber's M-estimator over a sliding window, refit
every ``refit_s``, accepted only with enough points, spread and fit quality); the intercept at a usage ratio
of 0 is the zone's idle power. A CPU's power is close to linear in its busy cores, so the line is identifiable
wherever the load moves a little; until a fit passes, the zone is split by the usage ratio (the seed's model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from wattpipe.processors._idle_regression import Fit, Regression, RegressionSettings

__all__ = ["ZoneIdle", "ZoneIdles"]

# The usage ratio moves by hundredths where the GPU's summed utilisation moves by tenths: a node's load rarely
# swings across its cores, and the fit extrapolates to 0 from there (its uncertainty bounds what that costs).
CPU_REGRESSION = RegressionSettings(window_s=600.0, min_points=10, min_spread=0.003, min_r2=0.8, max_uncertainty_w=2.0)


@dataclass(frozen=True, slots=True)
class ZoneIdle:
    """A zone's idle power for the tick and where it comes from."""

    idle_w: float
    source: Literal["configured", "regression"]
    uncertainty_w: float | None = None


class ZoneIdles:
    """Every zone's idle power in the idle mode (configured values first, else a learned one)."""

    def __init__(self, configured: Mapping[str, float], learn: bool) -> None:
        self.configured = dict(configured)
        self.learn = learn
        self._regressions: dict[str, Regression] = {}
        self._fits: dict[str, Fit] = {}

    def observe(self, path: str, monotonic_s: float, ratio: float, power_w: float) -> None:
        """A tick's point for a zone whose idle is learned."""
        regression = self._regressions.get(path)
        if regression is None:
            regression = self._regressions[path] = Regression(CPU_REGRESSION)
        regression.add(monotonic_s, ratio, power_w)
        regression.prune(monotonic_s)
        if regression.due(monotonic_s):
            fit = regression.fit(monotonic_s)
            if fit is not None:
                self._fits[path] = fit

    def idle(self, zone: str, path: str, zones_of_type: int) -> ZoneIdle | None:
        if zone in self.configured:
            return ZoneIdle(self.configured[zone] / zones_of_type, "configured")
        fit = self._fits.get(path) if self.learn else None
        return None if fit is None else ZoneIdle(fit.idle_w, "regression", fit.uncertainty_w)

    def learns(self, zone: str) -> bool:
        return self.learn and zone not in self.configured
