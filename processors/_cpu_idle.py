"""The idle mode's idle power per RAPL zone: configured per zone type, or learned by regression.

Learned: each zone's power against the node's CPU usage ratio, one point per tick, through the GPU idle
processor's robust line (``processors/_idle_regression.py``: Huber's M-estimator over a sliding window, refit
every ``refit_s``, accepted only with enough points, spread and fit quality); the intercept at a usage ratio
of 0 is the zone's idle power. A CPU's power is close to linear in its busy cores, so the line is identifiable
wherever the load moves a little; until a fit passes, the zone is split by the usage ratio (the seed's model).

Across a restart (the state file), as the GPU idle processor keeps its regression's last accepted estimate: each
zone's last accepted fit (its idle W and uncertainty, with its zone type and the node that learned it), used until
a new fit passes. Not the points: a fit needs them only until it passes, and they are on the monotonic clock of
the process that took them. A fit saved by another node (the same paths name other CPUs there), one whose path now
reads another zone type, or a malformed row, is reported and not used.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from wattpipe.processors._idle_regression import Regression, RegressionSettings

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

    def __init__(self, configured: Mapping[str, float], learn: bool, log: logging.Logger | None = None) -> None:
        self.configured = dict(configured)
        self.learn = learn
        self.log = log or logging.getLogger(__name__)
        self._regressions: dict[str, Regression] = {}
        self._fits: dict[str, tuple[str, ZoneIdle]] = {}  # path → its zone type, its last accepted fit's idle

    def observe(self, zone: str, path: str, monotonic_s: float, ratio: float, power_w: float) -> None:
        """A tick's point for a zone whose idle is learned."""
        regression = self._regressions.get(path)
        if regression is None:
            regression = self._regressions[path] = Regression(CPU_REGRESSION)
        regression.add(monotonic_s, ratio, power_w)
        regression.prune(monotonic_s)
        if regression.due(monotonic_s):
            fit = regression.fit(monotonic_s)
            if fit is not None:
                self._fits[path] = (zone, ZoneIdle(fit.idle_w, "regression", fit.uncertainty_w))

    def idle(self, zone: str, path: str, zones_of_type: int) -> ZoneIdle | None:
        if zone in self.configured:
            return ZoneIdle(self.configured[zone] / zones_of_type, "configured")
        found = self._fits.get(path) if self.learn else None
        if found is None:
            return None
        if found[0] != zone:  # restored, for a zone of another type at this path
            del self._fits[path]
            self.log.warning(
                "zone %s: the idle power learned before the restart (%.1f W) is a %s zone's, and this is a %s zone: "
                "not used (split by the usage ratio until a fit passes)",
                *(path, found[1].idle_w, found[0], zone),
            )
            return None
        return found[1]

    def learns(self, zone: str) -> bool:
        return self.learn and zone not in self.configured

    # --- the state file ---------------------------------------------------------------------------

    def dump(self, node: str) -> dict[str, Any]:
        """The learned fits, for :meth:`load` after a restart (JSON: a fit that is not finite is not saved)."""
        zones = {
            path: {"zone": zone, "idle_w": idle.idle_w, "uncertainty_w": idle.uncertainty_w}
            for path, (zone, idle) in sorted(self._fits.items())
            if _finite(idle.idle_w) and (idle.uncertainty_w is None or _finite(idle.uncertainty_w))
        }
        return {"node": node, "zones": zones}

    def load(self, saved: object, node: str) -> None:
        """The fits :meth:`dump` saved, where they are this node's; a row that is not one is reported and left out
        (the other rows and the rest of the state are used)."""
        if saved is None:
            return
        if not isinstance(saved, Mapping) or not isinstance(saved.get("zones"), Mapping):
            self.log.warning("state file: the learned zone idles are not an object with zones; not used")
            return
        if saved.get("node") != node:
            self.log.warning(
                "state file: the learned zone idles are node %r's, this is node %r: not used (learned again)",
                *(saved.get("node"), node),
            )
            return
        bad: list[str] = []
        for path, row in saved["zones"].items():
            restored = _restored(row)
            if restored is None:
                bad.append(str(path))
            else:
                self._fits[str(path)] = restored
        if bad:
            self.log.warning(
                "state file: the learned idle of zone(s) %s is not a zone type with a finite idle_w >= 0 W and "
                "uncertainty_w: not used (learned again)",
                ", ".join(bad),
            )
        if self._fits:
            self.log.info("learned idle power restored for %d zone(s)", len(self._fits))


def _finite(value: object) -> TypeGuard[float]:
    """A number (not a bool), finite and not below 0."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _restored(row: object) -> tuple[str, ZoneIdle] | None:
    """A saved fit (:meth:`ZoneIdles.dump`'s row), or None where it is not one."""
    if not isinstance(row, Mapping) or not isinstance(row.get("zone"), str):
        return None
    idle_w, uncertainty_w = row.get("idle_w"), row.get("uncertainty_w")
    if not _finite(idle_w) or not (uncertainty_w is None or _finite(uncertainty_w)):
        return None
    return row["zone"], ZoneIdle(float(idle_w), "regression", None if uncertainty_w is None else float(uncertainty_w))
