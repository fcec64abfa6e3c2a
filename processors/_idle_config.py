"""The idle processor's options (processors/idle.py says what they do; docs/configuration.md lists them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from wattpipe.pipeline.components import ComponentConfig
from wattpipe.pipeline.config import Duration
from wattpipe.processors._idle_chain import ChainSettings
from wattpipe.processors._idle_regression import RegressionSettings
from wattpipe.processors._idle_window import Guard

__all__ = ["Estimator", "IdleConfig", "RegressionConfig"]

Estimator = Literal["free", "quiet", "regression"]
_MAX_BUCKETS = 10_000


def _all_estimators() -> list[Estimator]:
    return ["free", "quiet", "regression"]


class RegressionConfig(ComponentConfig):
    """auto: the ``regression`` estimator (power = idle + slope × Σ utilisation)."""

    window: Duration = 600.0
    """Fitted over the ticks of this much time (at most ``max_points`` of them)."""
    max_points: int = Field(default=240, ge=10, le=2000)
    """Ticks kept per device: bounds a fit's cost, which grows with the points it is fitted over."""
    min_points: int = Field(default=10, ge=3)
    """A fit needs at least this many ticks."""
    min_spread: float = Field(default=0.1, gt=0)
    """...and the summed utilisation's (weighted) standard deviation at least this (0–1 units)."""
    min_r2: float = Field(default=0.8, ge=0, le=1)
    """...and the line must explain at least this share of the power's variance."""
    max_uncertainty_w: float = Field(default=2.0, gt=0)
    """...and the intercept's standard error must be at most this many watts."""
    refit: Duration = 30.0
    """A device's fit is redone at most this often (and at most one device's per tick)."""

    def settings(self) -> RegressionSettings:
        return RegressionSettings(
            self.window,
            self.min_points,
            self.min_spread,
            self.min_r2,
            self.max_uncertainty_w,
            self.refit,
            self.max_points,
        )


class IdleConfig(ComponentConfig):
    mode: Literal["auto", "fixed"] = "auto"
    watts: float | None = Field(default=None, ge=0)
    """fixed: idle watts of every device (unless ``devices`` names it)."""
    devices: dict[str, float] = Field(default_factory=dict)
    """fixed: idle watts by device UUID."""
    estimators: list[Estimator] = Field(default_factory=_all_estimators)
    """auto: the estimators to run (their precedence is fixed: free, quiet, regression)."""
    priors: dict[str, float] = Field(default_factory=dict)
    """auto: idle watts by device model name, used only while no estimator has a value (source prior)."""
    quiet_util: float = Field(default=0.005, ge=0, le=1)
    """auto: a tick is quiet when the processes' summed utilisation (and the device's) is at most this."""
    regression: RegressionConfig = Field(default_factory=RegressionConfig)
    min_interval: Duration = 1.0
    """auto: the shortest quiet span idle is learned from (the counter updates every ~100 ms)."""
    agreement: float = Field(default=0.1, gt=0, le=1)
    """auto: how far (a fraction of each power reading) the counter's average may be from the readings."""
    agreement_w: float = Field(default=5.0, ge=0)
    """auto: ... or this many watts, whichever is larger (sensor noise on small devices)."""
    window: Duration = 3600.0
    """auto: free and quiet idle are the lowest valid span within this much time."""
    bucket: Duration = 60.0
    """auto: the window keeps one minimum per bucket of this length."""
    max_gap: float = Field(default=3.0, ge=1)
    """An interval longer than this many of the device's usual intervals is a gap (a number, not a duration)."""
    counter_max_w: float = Field(default=2000.0, gt=0)
    """A counter delta implying more average power than this (or 1.5 × the device's highest reading) is a reset."""

    @field_validator("max_gap", mode="before")
    @classmethod
    def _gap_is_a_count(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("max_gap counts the device's usual intervals (e.g. 3), it is not a duration")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> IdleConfig:
        if self.mode == "fixed" and self.watts is None and not self.devices:
            raise ValueError("mode fixed needs watts (all devices) or devices ({UUID: watts})")
        if self.mode == "auto" and (self.watts is not None or self.devices):
            raise ValueError("watts and devices are for mode fixed; mode auto learns idle power by itself")
        if self.mode == "fixed" and self.priors:
            raise ValueError("priors are for mode auto (they fill in until idle is learned); fixed uses watts")
        if any(w < 0 for w in (*self.devices.values(), *self.priors.values())):
            raise ValueError("idle watts cannot be negative")
        if len(set(self.estimators)) < len(self.estimators):
            raise ValueError("estimators: each at most once")
        if not 0 < self.bucket <= self.window:
            raise ValueError("bucket must be longer than 0s and no longer than window")
        if self.window / self.bucket > _MAX_BUCKETS:
            raise ValueError(f"window / bucket must be at most {_MAX_BUCKETS} buckets (bounded state)")
        return self

    def chain(self) -> ChainSettings:
        return ChainSettings(
            guard=Guard(self.min_interval, self.agreement, self.agreement_w),
            window_s=self.window,
            bucket_s=self.bucket,
            quiet_util=self.quiet_util,
            regression=self.regression.settings(),
            enabled=frozenset(self.estimators),
        )
