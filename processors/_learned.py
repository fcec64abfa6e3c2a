"""Attribution's learned model: each process's watts per unit of utilisation, fitted from its device's power.

Shares by utilisation assume every process on a GPU draws the same watts per unit of SM utilisation. A
tensor-core trainer and a memory-bound server at the same utilisation do not (tens of percent apart, or
more). Where their loads vary independently over a window of ticks, the device's measured active power
tells them apart:

    active_w(t) ≈ Σ_p  a_p × sm_p(t) + b_p × mem_p(t)

``a_p`` (W per unit of SM utilisation) and ``b_p`` (W per unit of memory utilisation, where the driver
reports any) are fitted by non-negative least squares, each tick weighted by its length (a tick's mean
power over Δt is that much less noisy). A process's weight this tick is then ``a_p × sm_p + b_p × mem_p``:
the fit changes the weights only, so conservation stays exact (the split is still ``apportion``).

Why the fit is refused (and the device falls back to utilisation shares, that tick):

- ``idle_unknown``: active power is power − idle; without idle, idle watts would land in the coefficients.
- ``too_many_processes``: more than ``max_processes`` processes in the window (64 need 65 independent
  ticks and a 64×64 solve per tick): refused before any work, so a crowded GPU costs nothing.
- ``few_ticks``: fewer ticks than ``min_ticks`` or than ``ticks_per_coefficient`` × the unknowns.
- ``collinear``: some utilisation column is nearly a combination of the others (two tenants whose loads
  move together, or both steady): its variance inflation factor is above ``max_vif``.
- ``poor_fit``: the RMS residual is above ``max_residual`` × the mean active power (the model does not
  describe this device: throttling, a wrong idle, a process the listing does not see).
- ``uncertain``: the coefficients' standard errors × this tick's utilisations add up to more than
  ``max_uncertainty`` × the weights (a process seen busy in too few ticks to know its watts).

A tick in which a process became busy is split but not learned from: the driver's one entry per process
is its mean over busy samples, so a start inside the tick reads as busy for all of it, and the tick's
power would not match its utilisations.

The window slides: rows older than ``window`` leave (and a process that left the GPU leaves the fit with
its last row); at most ``max_ticks`` are kept. The normal equations are kept as running sums, so a tick
costs the square of its nonzero utilisations; a fit costs the cube of the unknowns (≤ 2 ×
``max_processes``) and is made at most every ``refit`` once one has passed, sooner for a process busy
without a coefficient, and only as many per tick as ``_FIT_BUDGET`` allows (the rest wait a tick).
"""

from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from wattpipe.pipeline.components import ComponentConfig
from wattpipe.pipeline.config import Duration
from wattpipe.processors._linalg import cholesky, inverse_diagonal, nnls, solve

__all__ = ["Fit", "LearnedConfig", "LearnedModel", "Reason", "Row", "row_of"]

Reason = Literal["learned", "idle_unknown", "too_many_processes", "few_ticks", "collinear", "poor_fit", "uncertain"]
Key = tuple[int, int]  # (pid, 0: SM utilisation | 1: memory utilisation)
_SM, _MEM = 0, 1
_FIT_BUDGET = 2 * 32**3
"""Fits per tick, in cubed unknowns: two of 32 unknowns, any number of small ones. At least one
fit is always made; a device over the budget keeps its last fit (or its fallback) for one more tick."""
_MUL = operator.mul


class LearnedConfig(ComponentConfig):
    """attribution's ``learned:`` options (used with ``model: learned``)."""

    window: Duration = 600.0
    """Fitted over the ticks of this much time (at most ``max_ticks`` of them); a process that left ages out."""
    max_ticks: int = Field(default=600, ge=10, le=10_000)
    """Ticks kept per device (bounded memory: each holds its processes' nonzero utilisations)."""
    max_processes: int = Field(default=16, ge=1, le=64)
    """More processes than this in a device's window: utilisation shares (a fit costs the cube of them)."""
    min_ticks: int = Field(default=10, ge=2)
    """A fit needs at least this many ticks, and ``ticks_per_coefficient`` per unknown."""
    ticks_per_coefficient: float = Field(default=3.0, ge=1)
    max_vif: float = Field(default=1000.0, gt=1)
    """A column's variance inflation factor above this: its loads did not vary independently (``collinear``)."""
    max_residual: float = Field(default=0.1, gt=0)
    """The fit's RMS residual above this share of the mean active power: ``poor_fit``."""
    max_uncertainty: float = Field(default=0.05, gt=0)
    """The coefficients' standard errors × this tick's utilisations above this share of the weights: ``uncertain``."""
    refit: Duration = 10.0
    """Once a fit passes, it is redone at most this often (sooner when a process without a coefficient is busy)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One tick of one device: its end, length (the weight), mean total power and nonzero utilisations."""

    monotonic_s: float
    interval_s: float
    power_w: float
    cols: tuple[tuple[Key, float], ...]


@dataclass(frozen=True, slots=True)
class Fit:
    """A window's fit: coefficients (W per unit of utilisation) and their standard errors, by column; or why
    there is none (``reason`` other than ``learned``; then both are empty)."""

    reason: Reason
    coef: dict[Key, float] = field(default_factory=dict)
    se: dict[Key, float] = field(default_factory=dict)
    fitted_s: float = -math.inf
    idle_w: float | None = None
    memory: bool = False  # memory utilisation has coefficients of its own (else the SM ones carry it)

    def lacks(self, pid: int, sm: float, mem: float) -> bool:
        """Whether a process busy this much has no coefficient to weigh it by."""
        coef = self.coef
        return (sm > 0.0 and (pid, _SM) not in coef) or (self.memory and mem > 0.0 and (pid, _MEM) not in coef)


class _Sums:
    """The weighted normal equations of a window's rows as running sums: Σ w·x·xᵀ (its upper triangle), Σ w·x·P,
    Σ w·x (dense, one slot per column in use: a column's slot is freed with its last row), Σ w·P², Σ w·P, Σ w, and the rows
    using each column. Power enters as the device's total P, not P − idle, so a new idle needs no rebuild:
    Σ w·x·(P − I) = Σ w·x·P − I·Σ w·x."""

    __slots__ = ("free", "gram", "rows_of", "slot", "sw", "swp", "swpp", "xp", "xs")

    def __init__(self) -> None:
        self.slot: dict[Key, int] = {}
        self.free: list[int] = []
        self.gram: list[list[float]] = []
        self.xp: list[float] = []
        self.xs: list[float] = []
        self.rows_of: list[int] = []
        self.sw = self.swp = self.swpp = 0.0

    def add(self, row: Row, sign: int) -> None:
        w, p = row.interval_s * sign, row.power_w
        pairs = sorted((self._slot(key), value) for key, value in row.cols)
        slots = [i for i, _ in pairs]
        values = [value for _, value in pairs]
        gram, xp, xs, rows_of = self.gram, self.xp, self.xs, self.rows_of
        for n, (i, value) in enumerate(pairs):
            # The upper triangle only (slot i <= slot j): the matrix is symmetric, and this is the tick's cost.
            gram_i, wv = gram[i], w * value
            for j, other in zip(slots[n:], values[n:], strict=True):
                gram_i[j] += wv * other
            xp[i] += wv * p
            xs[i] += wv
            rows_of[i] += sign
        self.sw += w
        self.swp += w * p
        self.swpp += w * p * p
        for key, _ in row.cols:
            i = self.slot[key]
            if rows_of[i] == 0:  # its last row left: the column leaves the fit exactly (no rounding left over)
                self._release(key, i)

    def _slot(self, key: Key) -> int:
        i = self.slot.get(key)
        if i is None:
            if self.free:
                i = self.free.pop()
            else:
                i = len(self.gram)
                for gram_row in self.gram:
                    gram_row.append(0.0)
                self.gram.append([0.0] * (i + 1))
                self.xp.append(0.0)
                self.xs.append(0.0)
                self.rows_of.append(0)
            self.slot[key] = i
        return i

    def _release(self, key: Key, i: int) -> None:
        del self.slot[key]
        self.free.append(i)
        self.gram[i] = [0.0] * len(self.gram)
        for gram_row in self.gram:
            gram_row[i] = 0.0
        self.xp[i] = self.xs[i] = 0.0


class _Window:
    """One device's rows over the window, their sums, the last fit, and who was busy in its last tick."""

    __slots__ = ("busy", "fits", "removed", "rows", "sums")

    def __init__(self, max_ticks: int) -> None:
        self.rows: deque[Row] = deque(maxlen=max_ticks)
        self.sums = _Sums()
        self.removed = 0  # rows subtracted since the sums were last rebuilt
        self.fits: tuple[Fit, ...] = (Fit("few_ticks"),)  # the last fits, in order of preference (see _fit)
        self.busy: frozenset[int] = frozenset()

    def add(self, row: Row) -> None:
        if len(self.rows) == self.rows.maxlen:
            self._remove(self.rows[0])
        self.rows.append(row)
        self.sums.add(row, 1)

    def prune(self, oldest_s: float) -> None:
        rows = self.rows
        while rows and rows[0].monotonic_s <= oldest_s:
            self._remove(rows[0])
            rows.popleft()

    def clear(self, reason: Reason) -> None:
        self.rows.clear()
        self.sums = _Sums()
        self.fits = (Fit(reason),)
        self.busy = frozenset()

    def pids(self) -> int:
        return len({pid for pid, _ in self.sums.slot})

    def _remove(self, row: Row) -> None:
        self.sums.add(row, -1)
        self.removed += 1
        if self.removed >= (self.rows.maxlen or 1):
            # Adding and subtracting leaves rounding behind; rebuilt once per window's worth of rows, the sums
            # stay as exact as fresh ones, for one more add per row.
            self.removed = 0
            self.sums = _Sums()
            for kept in self.rows:
                if kept is not row:
                    self.sums.add(kept, 1)


class LearnedModel:
    """The learned model's state: one window per device, and the fitting budget of the current tick."""

    def __init__(self, config: LearnedConfig) -> None:
        self.config = config
        self._windows: dict[str, _Window] = {}
        self._spent = 0

    def begin_tick(self) -> None:
        self._spent = 0

    def crowded(self, device_id: str, processes: int) -> bool:
        """More processes listed than a fit may have: the device's rows are dropped at once (they would block
        a fit until they left the window), before any other work."""
        if processes <= self.config.max_processes:
            return False
        window = self._windows.get(device_id)
        if window is not None and window.rows:
            window.clear("too_many_processes")
        return True

    def weights(
        self, device_id: str, row: Row, idle_w: float | None, busy: dict[int, tuple[float, float]]
    ) -> tuple[dict[int, float] | None, Reason]:
        """Learn from a tick (``busy``: pid → (SM, memory) utilisation over it, for every process listed) and
        weigh its processes by the fit: pid → weight (W), or None and why the fit cannot be used."""
        c = self.config
        window = self._windows.get(device_id)
        if window is None:
            window = self._windows[device_id] = _Window(c.max_ticks)
        window.prune(row.monotonic_s - c.window)
        busy_now = frozenset(pid for (pid, _), _ in row.cols)
        if busy_now <= window.busy:
            window.add(row)  # (else a process became busy inside the tick: see the module's docstring)
        window.busy = busy_now
        if window.pids() > c.max_processes:
            return None, "too_many_processes"
        if idle_w is None:
            return None, "idle_unknown"
        due = _due(window.fits, busy, row.monotonic_s, idle_w, c.refit)
        if due and (self._spent == 0 or self._affordable(window)):
            self._spent += len(window.sums.slot) ** 3
            window.fits = _fit(window, idle_w, row.monotonic_s, c)
        outcome: tuple[dict[int, float] | None, Reason] = (None, "few_ticks")
        for fit in window.fits:
            outcome = _weigh(fit, busy, c.max_uncertainty) if fit.reason == "learned" else (None, fit.reason)
            if outcome[0] is not None:
                break
        return outcome

    def _affordable(self, window: _Window) -> bool:
        return self._spent + len(window.sums.slot) ** 3 <= _FIT_BUDGET


def row_of(monotonic_s: float, interval_s: float, power_w: float, busy: dict[int, tuple[float, float]]) -> Row:
    """A tick as the fit takes it: the nonzero utilisations of each process, SM then memory."""
    cols = tuple(
        ((pid, kind), value)
        for pid, utils in busy.items()
        for kind, value in enumerate(utils)
        if value > 0.0  # (NaN is not either)
    )
    return Row(monotonic_s, interval_s, power_w, cols)


def _due(
    fits: tuple[Fit, ...], busy: dict[int, tuple[float, float]], now_s: float, idle_w: float, refit_s: float
) -> bool:
    """New fits are due when the last ones all failed, or the first that passed is ``refit_s`` old, was made
    with another idle, or has no coefficient for a process busy now."""
    fit = next((fit for fit in fits if fit.reason == "learned"), None)
    if fit is None or now_s - fit.fitted_s >= refit_s or fit.idle_w != idle_w:
        return True
    return any(fit.lacks(pid, sm, mem) for pid, (sm, mem) in busy.items())


def _weigh(
    fit: Fit, busy: dict[int, tuple[float, float]], max_uncertainty: float
) -> tuple[dict[int, float] | None, Reason]:
    """Each process's weight (W) this tick, unless one busy has no coefficient yet, or the standard errors move
    the weights by more than ``max_uncertainty`` of their sum (1σ, added up: a bound on any share's move)."""
    coef, se = fit.coef, fit.se
    weights: dict[int, float] = {}
    spread = 0.0
    for pid, (sm, mem) in busy.items():
        if fit.lacks(pid, sm, mem):
            return None, "few_ticks"  # busy, and in no tick learned from yet
        weights[pid] = coef.get((pid, _SM), 0.0) * sm + coef.get((pid, _MEM), 0.0) * mem
        spread += se.get((pid, _SM), 0.0) * sm + se.get((pid, _MEM), 0.0) * mem
    total = math.fsum(weights.values())
    if total <= 0.0 or spread > max_uncertainty * total:
        return None, "uncertain"
    return weights, "learned"


def _fit(window: _Window, idle_w: float, now_s: float, c: LearnedConfig) -> tuple[Fit, ...]:
    """The window's fits, in order of preference: with a coefficient per memory utilisation too (where any
    process used memory), then by SM utilisation alone. A process's memory utilisation that moves with its SM
    utilisation (the same kernels: most processes on real drivers) cannot be told apart from it, so the
    first fit is collinear or too uncertain; in the second, the SM coefficient carries both (a + b × their
    ratio), right for as long as the ratio holds (the residual says if not)."""
    keys = sorted(window.sums.slot)  # the columns some row in the window uses with a nonzero value
    sm_keys = [key for key in keys if key[1] == _SM]
    if len(sm_keys) == len(keys):
        return (_fit_columns(window, keys, idle_w, now_s, c),)
    return _fit_columns(window, keys, idle_w, now_s, c), _fit_columns(window, sm_keys, idle_w, now_s, c)


def _fit_columns(window: _Window, keys: list[Key], idle_w: float, now_s: float, c: LearnedConfig) -> Fit:
    sums = window.sums
    # A column whose values are so small their squares underflow (a subnormal utilisation) carries nothing.
    keys = [key for key in keys if sums.gram[sums.slot[key]][sums.slot[key]] > 0.0]
    n, k = len(window.rows), len(keys)
    if k == 0 or n < max(c.min_ticks, c.ticks_per_coefficient * k):
        return Fit("few_ticks")
    slots = [sums.slot[key] for key in keys]
    scale = [sums.gram[i][i] ** 0.5 for i in slots]
    # The Gram matrix scaled to a unit diagonal: its inverse's diagonal is each column's variance inflation
    # factor, 1 / (1 − R²) of that column regressed on the others.
    gram = sums.gram  # (its upper triangle: by slot, i <= j)
    unit = [
        [(gram[i][j] if i <= j else gram[j][i]) / (si * sj) for j, sj in zip(slots, scale, strict=True)]
        for i, si in zip(slots, scale, strict=True)
    ]
    lower = cholesky(unit)
    vif = inverse_diagonal(lower) if lower is not None else []
    if lower is None or max(vif) > c.max_vif:
        return Fit("collinear")
    rhs = [(sums.xp[i] - idle_w * sums.xs[i]) / si for i, si in zip(slots, scale, strict=True)]
    z = solve(lower, rhs)
    if min(z) < 0.0:
        z = nnls(unit, rhs)
    # Σ w·r² = Σ w·y² − 2 zᵀc + zᵀCz, with y = P − idle (c: rhs, C: unit).
    yy = sums.swpp - 2.0 * idle_w * sums.swp + idle_w * idle_w * sums.sw
    cz = [sum(map(_MUL, row, z)) for row in unit]
    rss = max(0.0, yy - 2.0 * sum(map(_MUL, z, rhs)) + sum(map(_MUL, z, cz)))
    mean_w = (sums.swp - idle_w * sums.sw) / sums.sw
    if mean_w <= 0.0 or math.sqrt(rss / sums.sw) > c.max_residual * mean_w:
        return Fit("poor_fit")
    # Var(x̂) = s²·(XᵀWX)⁻¹ with weights inverse to each tick's noise variance (a mean over Δt) and
    # s² = Σ w·r² / (n − k). Ticks' residuals are correlated in time: these are lower bounds.
    sigma2 = rss / (n - k)
    coef = {key: z[m] / scale[m] for m, key in enumerate(keys)}
    se = {key: math.sqrt(sigma2 * vif[m]) / scale[m] for m, key in enumerate(keys)}
    return Fit("learned", coef, se, now_s, idle_w, any(kind == _MEM for _, kind in keys))
