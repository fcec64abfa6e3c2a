"""Processor ``idle``: each device's energy per tick from its hardware counter, split into idle and active.

Energy comes from the counter's delta between this tick's and the previous tick's readings of the same
device (each reading carries its own time); a counter that declares its range (``energy_counter_max_mj``,
as RAPL's does) wraps around it. Where there is no counter (pre-Volta GPUs), or it went backwards
(driver reload), energy is power × time for that tick, by the trapezoid of the two power
readings, and the record says ``source="power"``. A device's first reading only sets the baseline:
its first DevicePower comes one tick later (nothing is known about the time before it).

Idle power (``mode: auto``, the default): per device UUID, the lowest average power seen over a tick in
which the device had no process and no utilisation. It only goes down, and it is kept in the state
file, so a restart under load does not lose it. Until one is seen, idle is *absent* (not 0) and all
energy counts as active. ``mode: fixed`` takes ``watts`` (every device) or ``devices: {UUID: watts}``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.records import Batch, DevicePower, DeviceSample

__all__ = ["IdleConfig", "IdleProcessor", "factory", "split_idle"]


class IdleConfig(ComponentConfig):
    mode: Literal["auto", "fixed"] = "auto"
    watts: float | None = Field(default=None, ge=0)
    """fixed: idle watts of every device (unless ``devices`` names it)."""
    devices: dict[str, float] = Field(default_factory=dict)
    """fixed: idle watts by device UUID."""

    @model_validator(mode="after")
    def _fixed_needs_watts(self) -> IdleConfig:
        if self.mode == "fixed" and self.watts is None and not self.devices:
            raise ValueError("mode fixed needs watts (all devices) or devices ({UUID: watts})")
        if self.mode == "auto" and (self.watts is not None or self.devices):
            raise ValueError("watts and devices are for mode fixed; mode auto learns idle power by itself")
        if any(w < 0 for w in self.devices.values()):
            raise ValueError("idle watts cannot be negative")
        return self


def split_idle(energy_mj: int, idle_w: float | None, interval_s: float) -> tuple[int, int]:
    """(idle mJ, active mJ) of a tick: idle is at most idle_w × interval and never more than the whole."""
    if idle_w is None:
        return 0, energy_mj
    idle_mj = max(0, min(energy_mj, round(idle_w * interval_s * 1000.0)))
    return idle_mj, energy_mj - idle_mj


@dataclass
class _Last:
    monotonic_s: float
    energy_mj: float | None
    power_w: float | None


class IdleProcessor:
    needs = frozenset({"devices"})
    provides = frozenset({"device_power"})

    def __init__(self, config: IdleConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx
        self.log = ctx.logger
        self._last: dict[str, _Last] = {}
        self.learned_idle_w: dict[str, float] = {}

    # --- state -------------------------------------------------------------------------------

    def start(self) -> None:
        saved = self.ctx.state.section(self.ctx.state_key)
        if saved and self.config.mode == "auto":
            self.learned_idle_w = {str(k): float(v) for k, v in dict(saved.get("idle_w", {})).items()}
            if self.learned_idle_w:
                self.log.info("idle power restored for %d device(s)", len(self.learned_idle_w))

    def snapshot(self) -> dict[str, Any]:
        return {"idle_w": dict(self.learned_idle_w)}

    def idle_w(self, device_id: str) -> float | None:
        if self.config.mode == "fixed":
            return self.config.devices.get(device_id, self.config.watts)
        return self.learned_idle_w.get(device_id)

    # --- the tick ----------------------------------------------------------------------------

    def process(self, batch: Batch) -> Batch:
        # Idle can only be learned where a process source looked and found nobody on the device.
        knows_processes = "gpu_processes" in batch.present
        busy = {p.device_id for p in batch.gpu_processes}
        out: list[DevicePower] = []
        for sample in batch.devices:
            power = self._tick(sample, not knows_processes or sample.device_id in busy)
            if power is not None:
                out.append(power)
        return batch.replace(device_power=batch.device_power + tuple(out))

    def _tick(self, s: DeviceSample, has_process: bool) -> DevicePower | None:
        if not s.up:
            # A device that is down keeps its last reading: the delta across the outage is real energy,
            # measured when it comes back, so nothing is lost.
            return None
        now = s.time.monotonic_s
        last = self._last.get(s.device_id)
        self._last[s.device_id] = _Last(now, s.energy_mj, s.power_w)
        if last is None or now <= last.monotonic_s:
            return None
        interval_s = now - last.monotonic_s
        energy_mj, source = self._energy(s, last, interval_s)
        if energy_mj is None:
            return None
        if self.config.mode == "auto" and not has_process:
            self._learn(s.device_id, energy_mj / 1000.0 / interval_s)
        idle_w = self.idle_w(s.device_id)
        idle_mj, active_mj = split_idle(energy_mj, idle_w, interval_s)
        power_w = energy_mj / 1000.0 / interval_s
        return DevicePower(
            time=s.time,
            device_id=s.device_id,
            device_type=s.device_type,
            device_index=s.device_index,
            device_name=s.device_name,
            vendor=s.vendor,
            interval_s=interval_s,
            power_w=power_w,
            idle_w=idle_w,
            active_w=active_mj / 1000.0 / interval_s,
            energy_mj=energy_mj,
            idle_energy_mj=idle_mj,
            active_energy_mj=active_mj,
            source=source,
        )

    def _energy(
        self, s: DeviceSample, last: _Last, interval_s: float
    ) -> tuple[int | None, Literal["counter", "power"]]:
        if s.energy_mj is not None and last.energy_mj is not None:
            # Deltas of floored absolute readings telescope: however many ticks, the sum of the deltas is
            # the counter's own difference to the millijoule (rounding each delta would drift).
            delta = math.floor(s.energy_mj) - math.floor(last.energy_mj)
            if delta < 0 and s.energy_counter_max_mj:
                # A counter with a declared range (RAPL) wrapped: at most once per tick, since a wrap takes
                # minutes even at full power.
                delta += math.floor(s.energy_counter_max_mj)
            if delta >= 0:
                return delta, "counter"
            self.log.warning(
                "device %s: energy counter went backwards (%.0f → %.0f mJ; driver reloaded?): "
                "this tick uses power × time",
                s.device_id,
                last.energy_mj,
                s.energy_mj,
            )
        powers = [p for p in (last.power_w, s.power_w) if p is not None]
        if not powers:
            return None, "power"
        return round(sum(powers) / len(powers) * interval_s * 1000.0), "power"

    def _learn(self, device_id: str, average_w: float) -> None:
        known = self.learned_idle_w.get(device_id)
        if known is None or average_w < known:
            self.learned_idle_w[device_id] = average_w
            if known is None:
                self.log.log(logging.INFO, "device %s: idle power learned: %.1f W", device_id, average_w)


def _create(ctx: CreateContext, config: ComponentConfig) -> IdleProcessor:
    assert isinstance(config, IdleConfig)
    return IdleProcessor(config, ctx)


factory = Factory(
    type="idle",
    kind="processor",
    config_model=IdleConfig,
    create=_create,
    description="Energy per device and tick from the hardware counter, split into idle and active power.",
    stability="alpha",
    provides=frozenset({"device_power"}),
)
