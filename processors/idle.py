"""Processor ``idle``: each device's energy per tick from its hardware counter, split into idle and active.

**Energy** comes from the counter's delta between this tick's and the previous tick's readings of the
same device (each reading carries its own time); a counter that declares its range
(``energy_counter_max_mj``, as RAPL's does) wraps around it. A device's first reading only sets the
baseline: its first DevicePower comes one tick later (nothing is known about the time before it).

**Counter resets.** A delta is not energy when the counter's continuity broke: the receiver says so by a
new ``counter_epoch`` (it re-acquired the GPU after an outage or a driver reload) and the new reading
is not beyond what a counter restarted within the interval could hold (a GPU that merely fell off the
bus keeps its counter, far above that: its delta stays energy), or the delta is implausible: negative without a declared range, or more than ``counter_max_w`` (or 1.5 × the highest
power the device ever read, if higher) could have drawn over the interval plus one counter update
(~100 ms). Each reset is logged once and counted (``wattpipe_idle_counter_resets{device,reason}``), and
that tick's energy is power × time, the trapezoid of the two power readings (``source="power"``), as for
devices with no counter (pre-Volta GPUs).

**Gaps.** An interval longer than ``max_gap`` times the device's usual interval (the median of its last
9 non-gap intervals; the pipeline's interval until there is one) spans an outage: its energy is measured
in full, but ``unattributable="gap"`` makes attribution leave the active part unattributed instead of
billing it to whoever runs in the tick after. A tick whose process listing failed
(``DeviceSample.processes_known`` False) is ``unattributable="processes_unknown"`` the same way.

**Idle power** (``mode: auto``, the default), per device UUID: the lowest average power over a *valid
quiet span* seen within the last ``window``. A span is quiet when a process source looked at both of its
ends and listed no process at all on the device (processes idling at 0 % utilisation still hold
contexts and draw more than idle: not quiet); it is valid when it is at least ``min_interval`` long
(short ticks add up; the last ``min_interval`` of quiet ticks is the span), its counter was continuous,
and the counter's average power agrees with the power readings at both ends, within ``agreement`` of
each reading or ``agreement_w``, whichever is larger (a counter that did not update, or a transition,
disagrees; a device that reads no power, like a RAPL zone, is judged by its counter alone). The window keeps one minimum per ``bucket`` of wall time, so memory and the state file stay
bounded and a baseline that was too low recovers once it leaves the window; when the window empties
(busy for longer than it), the last value stays. Until one is seen, idle is *absent* (not 0) and all
energy counts as active. ``mode: fixed`` takes ``watts`` (every device) or ``devices: {UUID: watts}``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.config import Duration
from pipeline.records import Batch, DevicePower, DeviceSample

__all__ = ["IdleConfig", "IdleProcessor", "factory", "split_idle"]

# The NVML energy counter updates about every 100 ms: a short interval may hold one update's worth of
# energy more than it lasted, so the plausibility bound allows one update period on top of the interval.
COUNTER_UPDATE_S = 0.1
# A device's highest power reading understates its true peak (readings are sampled or averaged), so a
# counter average is implausible only well above it.
PEAK_MARGIN = 1.5
_USUAL_INTERVALS = 9  # intervals whose median is a device's usual interval
_QUIET_MARKS = 1024  # quiet readings kept per device: min_interval / tick interval of them are needed
_MAX_BUCKETS = 10_000


class IdleConfig(ComponentConfig):
    mode: Literal["auto", "fixed"] = "auto"
    watts: float | None = Field(default=None, ge=0)
    """fixed: idle watts of every device (unless ``devices`` names it)."""
    devices: dict[str, float] = Field(default_factory=dict)
    """fixed: idle watts by device UUID."""
    min_interval: Duration = 1.0
    """auto: the shortest quiet span idle is learned from (the counter updates every ~100 ms)."""
    agreement: float = Field(default=0.1, gt=0, le=1)
    """auto: how far (a fraction of each power reading) the counter's average may be from the readings."""
    agreement_w: float = Field(default=5.0, ge=0)
    """auto: ... or this many watts, whichever is larger (sensor noise on small devices)."""
    window: Duration = 3600.0
    """auto: idle is the lowest valid quiet power within this much time."""
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
        if any(w < 0 for w in self.devices.values()):
            raise ValueError("idle watts cannot be negative")
        if not 0 < self.bucket <= self.window:
            raise ValueError("bucket must be longer than 0s and no longer than window")
        if self.window / self.bucket > _MAX_BUCKETS:
            raise ValueError(f"window / bucket must be at most {_MAX_BUCKETS} buckets (bounded state)")
        return self


def split_idle(energy_mj: int, idle_w: float | None, interval_s: float) -> tuple[int, int]:
    """(idle mJ, active mJ) of a tick: idle is at most idle_w × interval and never more than the whole."""
    if idle_w is None:
        return 0, energy_mj
    idle_mj = max(0, min(energy_mj, round(idle_w * interval_s * 1000.0)))
    return idle_mj, energy_mj - idle_mj


class IdleWindow:
    """Per device, the lowest valid quiet power in each ``bucket_s`` of wall time, over ``window_s``.

    Wall time, not monotonic, so the window means the same after a restart (the state file keeps it).
    """

    def __init__(self, window_s: float, bucket_s: float) -> None:
        self.window_s, self.bucket_s = window_s, bucket_s
        self._buckets: dict[str, deque[list[float]]] = {}  # device → [bucket number, min W], oldest first

    def add(self, device_id: str, wall_s: float, power_w: float) -> None:
        number = math.floor(wall_s / self.bucket_s)
        buckets = self._buckets.setdefault(device_id, deque())
        if buckets and number <= buckets[-1][0]:
            # The same bucket, or the wall clock stepped back: the newest bucket takes it (kept longer, never
            # dropped earlier than its own time would be).
            buckets[-1][1] = min(buckets[-1][1], power_w)
        else:
            buckets.append([number, power_w])

    def prune(self, device_id: str, wall_s: float) -> bool:
        """Drop buckets that ended more than the window ago, but never the last one; True if any went."""
        buckets = self._buckets.get(device_id)
        oldest_end_s = wall_s - self.window_s
        dropped = False
        while buckets and len(buckets) > 1 and (buckets[0][0] + 1) * self.bucket_s <= oldest_end_s:
            buckets.popleft()
            dropped = True
        return dropped

    def minimum(self, device_id: str) -> float | None:
        buckets = self._buckets.get(device_id)
        return min(b[1] for b in buckets) if buckets else None

    def dump(self) -> dict[str, list[list[float]]]:
        """Each device's buckets as [start wall s, min W] (bucket starts, so another bucket size can load them)."""
        return {d: [[n * self.bucket_s, w] for n, w in b] for d, b in self._buckets.items()}

    def load(self, saved: dict[str, Any]) -> None:
        for device_id, rows in saved.items():
            for start_s, power_w in sorted((float(s), float(w)) for s, w in rows):
                self.add(str(device_id), start_s, power_w)


@dataclass(slots=True)
class _Mark:
    """A quiet reading in a run of them: when, the run's energy up to it, and its power reading."""

    monotonic_s: float
    run_energy_mj: int
    power_w: float | None


@dataclass(slots=True)
class _Device:
    """What the processor remembers of one device between ticks."""

    monotonic_s: float = -math.inf
    energy_mj: float | None = None
    power_w: float | None = None
    epoch: int = 0
    seen: bool = False
    max_power_w: float = 0.0
    intervals_s: deque[float] = field(default_factory=lambda: deque(maxlen=_USUAL_INTERVALS))
    quiet: deque[_Mark] = field(default_factory=lambda: deque(maxlen=_QUIET_MARKS))

    def remember(self, s: DeviceSample) -> None:
        self.monotonic_s, self.energy_mj, self.power_w, self.epoch = (
            s.time.monotonic_s,
            s.energy_mj,
            s.power_w,
            s.counter_epoch,
        )
        self.seen = True
        if s.power_w is not None and s.power_w > self.max_power_w:
            self.max_power_w = s.power_w

    def usual_interval_s(self, pipeline_interval_s: float) -> float:
        if not self.intervals_s:
            return pipeline_interval_s
        ordered = sorted(self.intervals_s)
        return ordered[len(ordered) // 2]


_RESET_WHY = {
    "epoch": "the receiver re-acquired the device (driver reload?)",
    "backwards": "it went backwards (driver reload?)",
    "implausible": "its delta implies more power than the device can draw",
}


class IdleProcessor:
    needs = frozenset({"devices"})
    provides = frozenset({"device_power"})

    def __init__(self, config: IdleConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx
        self.log = ctx.logger
        self._devices: dict[str, _Device] = {}
        self.window = IdleWindow(config.window, config.bucket)
        self.learned_idle_w: dict[str, float] = {}  # the window's minimum, per device
        self.resets = ctx.telemetry.counter(
            "wattpipe_idle_counter_resets",
            "Energy counter deltas not used as energy, by device and reason: epoch (the receiver re-acquired "
            "the device), backwards (a negative delta without a declared range), implausible (more power than "
            "the device can draw). That tick's energy is power × time.",
            ("device", "reason"),
        )

    # --- state -------------------------------------------------------------------------------

    def start(self) -> None:
        saved = self.ctx.state.section(self.ctx.state_key)
        if not saved or self.config.mode != "auto":
            return
        windows = dict(saved.get("idle_window", {}))
        self.window.load(windows)
        # A state file from before the window holds one value per device: one sample, taken now.
        now_wall_s = self.ctx.clock.wall()
        for device_id, power_w in dict(saved.get("idle_w", {})).items():
            if device_id not in windows:
                self.window.add(str(device_id), now_wall_s, float(power_w))
        for device_id in self.window.dump():
            self._refresh(device_id)
        if self.learned_idle_w:
            self.log.info("idle power restored for %d device(s)", len(self.learned_idle_w))

    def snapshot(self) -> dict[str, Any]:
        # idle_w: the current value (what readers of the state file use); idle_window: what it comes from.
        return {"idle_w": dict(self.learned_idle_w), "idle_window": self.window.dump()}

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
            quiet = knows_processes and sample.processes_known and sample.device_id not in busy
            power = self._tick(sample, quiet, batch.interval_s)
            if power is not None:
                out.append(power)
        return batch.replace(device_power=batch.device_power + tuple(out))

    def _tick(self, s: DeviceSample, quiet: bool, pipeline_interval_s: float) -> DevicePower | None:
        if not s.up:
            # A device that is down keeps its last reading: the delta across the outage is real energy,
            # measured when it comes back (marked a gap if the outage was long), so nothing is lost.
            return None
        dev = self._devices.get(s.device_id)
        if dev is None:
            dev = self._devices[s.device_id] = _Device()
        now_s = s.time.monotonic_s
        if not dev.seen or now_s <= dev.monotonic_s:
            dev.remember(s)
            self._follow_quiet(dev, s, quiet, continuous=False, energy_mj=0)
            return None
        interval_s = now_s - dev.monotonic_s
        gap = self._is_gap(dev, interval_s, pipeline_interval_s)
        delta_mj = self._counter_delta(s, dev, interval_s)
        continuous = delta_mj is not None or s.energy_mj is None or dev.energy_mj is None  # no reset
        energy_mj = delta_mj if delta_mj is not None else _trapezoid_mj(dev.power_w, s.power_w, interval_s)
        dev.remember(s)
        if energy_mj is None:
            dev.quiet.clear()
            return None
        if self.config.mode == "auto":
            if self.window.prune(s.device_id, s.time.wall_s):
                self._refresh(s.device_id)
            self._follow_quiet(dev, s, quiet, continuous, energy_mj)
        return self._power(s, interval_s, energy_mj, delta_mj is not None, gap)

    def _power(self, s: DeviceSample, interval_s: float, energy_mj: int, counter: bool, gap: bool) -> DevicePower:
        idle_w = self.idle_w(s.device_id)
        idle_mj, active_mj = split_idle(energy_mj, idle_w, interval_s)
        return DevicePower(
            time=s.time,
            device_id=s.device_id,
            device_type=s.device_type,
            device_index=s.device_index,
            device_name=s.device_name,
            vendor=s.vendor,
            interval_s=interval_s,
            power_w=energy_mj / 1000.0 / interval_s,
            idle_w=idle_w,
            active_w=active_mj / 1000.0 / interval_s,
            energy_mj=energy_mj,
            idle_energy_mj=idle_mj,
            active_energy_mj=active_mj,
            source="counter" if counter else "power",
            unattributable="gap" if gap else None if s.processes_known else "processes_unknown",
        )

    # --- energy: counter continuity and gaps --------------------------------------------------

    def _is_gap(self, dev: _Device, interval_s: float, pipeline_interval_s: float) -> bool:
        if interval_s > self.config.max_gap * dev.usual_interval_s(pipeline_interval_s):
            return True  # not remembered as usual: a second outage would otherwise look normal
        dev.intervals_s.append(interval_s)
        return False

    def _counter_delta(self, s: DeviceSample, dev: _Device, interval_s: float) -> int | None:
        """The counter's delta in mJ; None where there is no counter at one end, or it reset."""
        if s.energy_mj is None or dev.energy_mj is None:
            return None
        # Deltas of floored absolute readings telescope: however many ticks, the sum of the deltas is the
        # counter's own difference to the millijoule (rounding each delta would drift).
        delta_mj = math.floor(s.energy_mj) - math.floor(dev.energy_mj)
        limit_mj = self._limit_w(s, dev) * (interval_s + COUNTER_UPDATE_S) * 1000.0
        if s.counter_epoch != dev.epoch and not (delta_mj >= 0 and s.energy_mj > limit_mj):
            # Re-acquired (maybe a reloaded driver): a counter restarted within this interval holds at most
            # limit_mj, so only a reading above that (and the old one) is the old counter still counting.
            self._reset(s, dev, interval_s, "epoch")
            return None
        if delta_mj < 0 and s.energy_counter_max_mj:
            # A counter with a declared range (RAPL) wrapped: at most once per tick, since a wrap takes minutes
            # even at full power.
            delta_mj += math.floor(s.energy_counter_max_mj)
        if delta_mj < 0:
            self._reset(s, dev, interval_s, "backwards")
            return None
        # A reload whose new counter is above the old one gives a delta *below* the true energy, so only the
        # epoch catches it; this bound catches counters that jump (a glitch, another origin).
        if delta_mj > limit_mj:
            self._reset(s, dev, interval_s, "implausible")
            return None
        return delta_mj

    def _limit_w(self, s: DeviceSample, dev: _Device) -> float:
        """The most power the device's counter can plausibly average: the floor is what no device draws;
        above it, the device's own highest reading (with a margin) decides."""
        peak_w = max(dev.max_power_w, s.power_w or 0.0)
        return max(self.config.counter_max_w, PEAK_MARGIN * peak_w)

    def _reset(self, s: DeviceSample, dev: _Device, interval_s: float, reason: str) -> None:
        self.resets.inc(device=s.device_id, reason=reason)
        self.log.warning(
            "device %s: energy counter reset: %s (%.0f → %.0f mJ in %.1f s, epoch %d → %d); this tick's energy "
            "is power × time",
            s.device_id,
            _RESET_WHY[reason],
            dev.energy_mj,
            s.energy_mj,
            interval_s,
            dev.epoch,
            s.counter_epoch,
        )

    # --- idle: valid quiet spans into the window ------------------------------------------------

    def _follow_quiet(self, dev: _Device, s: DeviceSample, quiet: bool, continuous: bool, energy_mj: int) -> None:
        """Extend the device's run of quiet readings with ``s``; learn from its last ``min_interval``."""
        marks = dev.quiet
        if not quiet:
            marks.clear()
            return
        now_s = s.time.monotonic_s
        if not continuous or not marks:
            marks.clear()
            marks.append(_Mark(now_s, 0, s.power_w))  # a run starts here
            return
        run_mj = marks[-1].run_energy_mj + energy_mj
        # The span judged: from the latest quiet reading at least min_interval back (the last interval alone
        # when it is long enough); older readings can never be that reading again.
        while len(marks) > 1 and now_s - marks[1].monotonic_s >= self.config.min_interval:
            marks.popleft()
        start = marks[0]
        span_s = now_s - start.monotonic_s
        if span_s >= self.config.min_interval:
            average_w = (run_mj - start.run_energy_mj) / 1000.0 / span_s
            if self._agrees(average_w, start.power_w, s.power_w):
                self._learn(s.device_id, s.time.wall_s, average_w)
        marks.append(_Mark(now_s, run_mj, s.power_w))

    def _agrees(self, average_w: float, *readings_w: float | None) -> bool:
        """Whether the counter's average agrees with every power reading there is. A device that reads no
        power at all (a RAPL zone) has only its counter to go by: min_interval is then its only guard."""
        tolerance_w, fraction = self.config.agreement_w, self.config.agreement
        return all(abs(average_w - r) <= max(tolerance_w, fraction * r) for r in readings_w if r is not None)

    def _learn(self, device_id: str, wall_s: float, average_w: float) -> None:
        self.window.add(device_id, wall_s, average_w)
        known = self.learned_idle_w.get(device_id)
        if known is None:
            self.log.log(logging.INFO, "device %s: idle power learned: %.1f W", device_id, average_w)
        if known is None or average_w < known:
            self.learned_idle_w[device_id] = average_w

    def _refresh(self, device_id: str) -> None:
        value = self.window.minimum(device_id)
        if value is not None and value != self.learned_idle_w.get(device_id):
            self.log.debug("device %s: idle power now %.1f W (the window moved)", device_id, value)
            self.learned_idle_w[device_id] = value


def _trapezoid_mj(first_w: float | None, last_w: float | None, interval_s: float) -> int | None:
    """Power × time by the two readings at the ends of the interval (one, if the other is absent)."""
    powers = [p for p in (first_w, last_w) if p is not None]
    if not powers:
        return None
    return round(sum(powers) / len(powers) * interval_s * 1000.0)


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
