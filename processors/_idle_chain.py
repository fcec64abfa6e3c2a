"""The idle processor's chain of estimators (``mode: auto``), per device, and which one's value is used.

- ``free``: the lowest valid span with no process listed on the device, over a sliding window;
- ``quiet``: the same for spans in which processes held the device but none did any work (their summed
  utilisation, and the device's own where a source reports it, at most ``quiet_util``);
- ``regression``: the intercept of power = idle + slope × Σ utilisation over a sliding window of ticks
  (processors/_idle_regression.py), the last accepted fit;

and, below them all, a per-model ``prior`` the user configured (in processors/idle.py: it needs no
observation). The first of free, quiet, regression with a value wins: free measures the device's lowest
state; quiet measures the state it is in while contexts are held; the regression extrapolates to that
same state. A configured value (``mode: fixed``) replaces the whole chain.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from wattpipe.pipeline.records import DeviceSample
from wattpipe.processors._idle_regression import Regression, RegressionSettings
from wattpipe.processors._idle_window import Estimate, Guard, IdleWindow, QuietRun

__all__ = ["PRECEDENCE", "ChainSettings", "Estimate", "IdleEstimators", "Source", "Work"]

Source = Literal["configured", "free", "quiet", "regression", "prior"]
Observed = Literal["free", "quiet", "regression"]
PRECEDENCE: tuple[Observed, ...] = ("free", "quiet", "regression")


@dataclass(frozen=True, slots=True)
class Work:
    """What one device did over one tick, as the process sources saw it."""

    known: bool  # a process source looked, and its listing of this device succeeded
    processes: int = 0  # listed on the device
    util: float | None = None  # their summed SM utilisation over the tick; None: some process's is unknown
    device_util: float | None = None  # the device's own (NVML, else dcgm-exporter); None: not reported


@dataclass(frozen=True, slots=True)
class ChainSettings:
    guard: Guard
    window_s: float
    bucket_s: float
    quiet_util: float
    regression: RegressionSettings
    enabled: frozenset[str]

    def free(self, work: Work) -> bool:
        return work.known and work.processes == 0 and not self._device_busy(work)

    def quiet(self, work: Work) -> bool:
        if not work.known or work.processes == 0 or work.util is None:
            return False
        return work.util <= self.quiet_util and not self._device_busy(work)

    def _device_busy(self, work: Work) -> bool:
        # A process the listing cannot see (another pid namespace) still makes the device itself busy.
        return work.device_util is not None and work.device_util > self.quiet_util


@dataclass(slots=True)
class _Runs:
    free: QuietRun = field(default_factory=QuietRun)
    quiet: QuietRun = field(default_factory=QuietRun)


class IdleEstimators:
    """Every device's estimates, and the one in use (the first of PRECEDENCE with a value)."""

    def __init__(self, settings: ChainSettings, log: logging.Logger) -> None:
        self.settings, self.log = settings, log
        self.windows: dict[Observed, IdleWindow] = {
            "free": IdleWindow(settings.window_s, settings.bucket_s),
            "quiet": IdleWindow(settings.window_s, settings.bucket_s),
        }
        self._runs: dict[str, _Runs] = {}
        self._regressions: dict[str, Regression] = {}
        self._estimates: dict[str, dict[Observed, Estimate]] = {}
        self._current: dict[str, tuple[Observed, Estimate]] = {}
        self._wall_anchor_s: float | None = None  # wall − monotonic at this run's first reading (_window_s)

    def current(self, device_id: str) -> tuple[Observed, Estimate] | None:
        return self._current.get(device_id)

    # --- each tick ------------------------------------------------------------------------------

    def begin(self, s: DeviceSample, work: Work) -> None:
        """A first reading (or one after a reset): runs of quiet readings may start here."""
        self._follow(s, work, continuous=False, energy_mj=0)

    def forget_runs(self, device_id: str) -> None:
        runs = self._runs.get(device_id)
        if runs is not None:
            runs.free.clear()
            runs.quiet.clear()

    def observe(
        self,
        s: DeviceSample,
        work: Work,
        interval_s: float,
        energy_mj: int,
        *,
        continuous: bool,
        counter: bool,
        gap: bool,
    ) -> None:
        """One interval of a device, ending at ``s``. ``continuous``: no counter reset in it (else it teaches
        nothing). ``counter``: its energy is the counter's own delta, not power × time, and ``gap``: it spans
        an outage; the regression takes neither (two power readings say little about a tick whose load
        varied; a utilisation averaged over an outage is not that tick's). A quiet span may cross a gap: its
        average can only overstate idle (whatever ran in it added power), and the minimum keeps the lowest."""
        for name, window in self.windows.items():
            if window.prune(s.device_id, self._window_s(s)):
                self._set(s.device_id, name, window.minimum(s.device_id))
        regression = self._regressions.get(s.device_id)
        if regression is not None:
            regression.prune(s.time.monotonic_s)
        self._follow(s, work, continuous=continuous, energy_mj=energy_mj)
        regress = continuous and counter and not gap and "regression" in self.settings.enabled
        if regress and interval_s >= self.settings.guard.min_interval_s:
            self._regress(s, work, energy_mj / 1000.0 / interval_s)
        elif regress and interval_s > 0 and work.known and work.processes > 0:
            self._bound(s.device_id, energy_mj / 1000.0 / interval_s)  # too short a point, still a power seen

    def refit_one(self, monotonic_s: float) -> None:
        """Fit the regression of the device whose fit is the stalest of those due: at most one fit per tick,
        so a tick's cost does not grow with the number of devices. A device whose idle is measured (free or
        quiet: kept for good once seen) is not fitted: its regression could never be the one in use."""
        current, measured = self._current, ("free", "quiet")
        due = [
            (r.fitted_s, device_id)
            for device_id, r in self._regressions.items()
            if r.due(monotonic_s) and current.get(device_id, ("regression",))[0] not in measured
        ]
        if not due:
            return
        _, device_id = min(due)
        fit = self._regressions[device_id].fit(monotonic_s)
        if fit is not None:
            self.log.debug(
                "device %s: idle by regression %.1f ± %.1f W (slope %.0f W, R² %.3f, spread %.2f, %d ticks)",
                *(device_id, fit.idle_w, fit.uncertainty_w, fit.slope_w, fit.r2, fit.spread, fit.points),
            )
            self._set(device_id, "regression", Estimate(fit.idle_w, fit.uncertainty_w))

    def _follow(self, s: DeviceSample, work: Work, continuous: bool, energy_mj: int) -> None:
        runs = self._runs.get(s.device_id)
        if runs is None:
            runs = self._runs[s.device_id] = _Runs()
        settings, now_s = self.settings, s.time.monotonic_s
        if "free" in settings.enabled:
            estimate = runs.free.follow(settings.guard, now_s, s.power_w, settings.free(work), continuous, energy_mj)
            if estimate is not None:
                self._learn("free", s, estimate)
        if "quiet" in settings.enabled:
            estimate = runs.quiet.follow(settings.guard, now_s, s.power_w, settings.quiet(work), continuous, energy_mj)
            if estimate is not None:
                self._learn("quiet", s, estimate)

    def _learn(self, name: Literal["free", "quiet"], s: DeviceSample, estimate: Estimate) -> None:
        self.windows[name].add(s.device_id, self._window_s(s), estimate)
        known = self._estimates.get(s.device_id, {}).get(name)
        if known is None or estimate.power_w < known.power_w:
            self._set(s.device_id, name, estimate)

    def _window_s(self, s: DeviceSample) -> float:
        """When ``s`` was read, for the free and quiet windows: the wall time of this run's first reading plus the
        monotonic time since. The windows are wall time across a restart (the state file keeps them, and
        wattpipe's downtime counts), but within a run a step of the wall clock neither ages their buckets (a
        forward one dropped all but the last) nor keeps them longer (a backward one)."""
        if self._wall_anchor_s is None:
            self._wall_anchor_s = s.time.wall_s - s.time.monotonic_s
        return s.time.monotonic_s + self._wall_anchor_s

    def _regress(self, s: DeviceSample, work: Work, power_w: float) -> None:
        if not (work.known and work.processes > 0 and work.util is not None):
            return  # free ticks are another power state; unknown utilisation is no point at all
        regression = self._regressions.get(s.device_id)
        if regression is None:
            regression = self._regressions[s.device_id] = Regression(self.settings.regression)
        regression.add(s.time.monotonic_s, work.util, power_w)
        self._bound(s.device_id, power_w)

    def _bound(self, device_id: str, power_w: float) -> None:
        """Never above a power the device was seen drawing while held, in a point or in a tick too short to be
        one: that tick's power is a closer bound, for the estimate in use and for the fits to come."""
        regression = self._regressions.get(device_id)
        if regression is not None:
            regression.lowest_w = min(regression.lowest_w, power_w)
        known = self._estimates.get(device_id, {}).get("regression")
        if known is not None and power_w < known.power_w:
            self._set(device_id, "regression", Estimate(power_w, known.uncertainty_w))

    def _set(self, device_id: str, name: Observed, estimate: Estimate | None, *, restored: bool = False) -> None:
        estimates = self._estimates.setdefault(device_id, {})
        if estimate is None:
            estimates.pop(name, None)
        else:
            estimates[name] = estimate
        before = self._current.get(device_id)
        now = next(((n, estimates[n]) for n in PRECEDENCE if n in estimates), None)
        if now is None:
            self._current.pop(device_id, None)
            return
        self._current[device_id] = now
        if restored or (before is not None and before[0] == now[0]):
            return
        source, value = now
        about = source if value.uncertainty_w is None else f"{source}, ± {value.uncertainty_w:.1f} W"
        if before is None:
            self.log.info("device %s: idle power learned: %.1f W (%s)", device_id, value.power_w, about)
        else:
            self.log.info("device %s: idle power now %.1f W (%s; was %s)", device_id, value.power_w, about, before[0])

    # --- the state file ---------------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        current = self._current
        return {
            "idle_w": {d: e.power_w for d, (_, e) in current.items()},
            "idle_source": {d: name for d, (name, _) in current.items()},
            "idle_uncertainty_w": {d: e.uncertainty_w for d, (_, e) in current.items() if e.uncertainty_w is not None},
            "idle_window": self.windows["free"].dump(),
            "quiet_window": self.windows["quiet"].dump(),
            "regression": {
                d: [e["regression"].power_w, e["regression"].uncertainty_w]
                for d, e in self._estimates.items()
                if "regression" in e
            },
        }

    def load(self, saved: dict[str, Any], now_wall_s: float) -> None:
        enabled = self.settings.enabled
        if "free" in enabled:
            self.windows["free"].load(dict(saved.get("idle_window", {})))
            if "idle_source" not in saved:
                # A state file from before issue 15: its idle_w is free power. Before the window (issue 14)
                # it held only that: one sample, taken now.
                for device_id, power_w in dict(saved.get("idle_w", {})).items():
                    if device_id not in saved.get("idle_window", {}):
                        self.windows["free"].add(str(device_id), now_wall_s, Estimate(float(power_w)))
        if "quiet" in enabled:
            self.windows["quiet"].load(dict(saved.get("quiet_window", {})))
        for name, window in self.windows.items():
            for device_id in window.devices():
                self._set(device_id, name, window.minimum(device_id), restored=True)
        if "regression" in enabled:
            for device_id, (power_w, uncertainty_w) in dict(saved.get("regression", {})).items():
                restored = Estimate(float(power_w), None if uncertainty_w is None else float(uncertainty_w))
                if math.isfinite(restored.power_w) and restored.power_w >= 0.0:
                    self._set(str(device_id), "regression", restored, restored=True)
        if self._current:
            self.log.info("idle power restored for %d device(s)", len(self._current))
