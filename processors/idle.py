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
devices with no counter (pre-Volta GPUs). So is a tick whose counter could not be read (absent at one
end); where the next reading is of the same epoch, its delta since the counter's last reading, less what
the ticks between gave by power × time (never below 0), is that tick's energy (``source="power"``: not
its own delta): the totals stay on the counter.

**Gaps.** An interval longer than ``max_gap`` times the device's usual interval (the median of its last
9 non-gap intervals; the pipeline's interval until there is one) spans an outage: its energy is measured
in full, but ``unattributable="gap"`` makes attribution leave the active part unattributed instead of
billing it to whoever runs in the tick after. A tick whose process listing failed
(``DeviceSample.processes_known`` False) is ``unattributable="processes_unknown"`` the same way.

**Idle power** (``mode: auto``, the default), per device UUID, from a chain of estimators, each named as
the value's source (``DevicePower.idle_source``; processors/_idle_chain.py):

- ``free``: the lowest average power over a *valid quiet span* with no process listed, within the last
  ``window``. A span is quiet when a process source looked at both of its ends and listed no process
  (and the device's own utilisation, where NVML or dcgm-exporter reports it, is at most ``quiet_util``);
  it is valid when it is at least ``min_interval`` long (short ticks add up; the last ``min_interval`` of
  quiet ticks is the span), its counter was continuous, it spans no gap, and the counter's average power
  agrees with the power readings at both ends, within ``agreement`` of each reading or ``agreement_w``,
  whichever is larger (a device that reads no power, like a RAPL zone, is judged by its counter alone).
  The window keeps one minimum per ``bucket`` of wall time (bounded memory and state file; a baseline that
  was too low recovers once it leaves the window); when it empties, the last value stays.
- ``quiet``: the same, over spans in which processes held the device but did no work: their summed SM
  utilisation, and the device's own, at most ``quiet_util`` every tick (a process of unknown utilisation
  is not quiet). Contexts held, so possibly a higher power state than ``free``'s.
- ``regression``: the intercept of power = idle + slope × Σ utilisation, fitted robustly over the ticks of
  the last ``regression.window`` in which processes held the device with known utilisation; accepted only
  with enough points, spread and fit quality (processors/_idle_regression.py), with its standard error as
  the uncertainty, never above the lowest power such a tick showed (one too short to be a point included) nor
  below 0.

The first of free, quiet, regression with a value is used; a ``priors`` entry for the device's model
only fills the gap where none has one. Until then idle is *absent* (not 0) and all energy counts as
active. ``mode: fixed`` takes ``watts`` (every device) or ``devices: {UUID: watts}`` (source ``configured``).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import CreateContext, Factory
from wattpipe.pipeline.records import DevicePower, DeviceSample, DeviceSignals, GpuProcessSample
from wattpipe.processors._idle_chain import Estimate, IdleEstimators, Source, Work
from wattpipe.processors._idle_config import IdleConfig, RegressionConfig

__all__ = ["IdleConfig", "IdleProcessor", "RegressionConfig", "factory", "split_idle"]

# The NVML energy counter updates about every 100 ms: a short interval may hold one update's worth of
# energy more than it lasted, so the plausibility bound allows one update period on top of the interval.
COUNTER_UPDATE_S = 0.1
# A device's highest power reading understates its true peak (readings are sampled or averaged), so a
# counter average is implausible only well above it.
PEAK_MARGIN = 1.5
_USUAL_INTERVALS = 9  # intervals whose median is a device's usual interval
_DEVICE_ID = operator.attrgetter("device_id")
_SM_UTIL = operator.attrgetter("sm_util")


def split_idle(energy_mj: int, idle_w: float | None, interval_s: float) -> tuple[int, int]:
    """(idle mJ, active mJ) of a tick: idle is at most idle_w × interval and never more than the whole."""
    if idle_w is None:
        return 0, energy_mj
    idle_mj = max(0, min(energy_mj, round(idle_w * interval_s * 1000.0)))
    return idle_mj, energy_mj - idle_mj


@dataclass(slots=True)
class _Device:
    """What the processor remembers of one device's counter between ticks."""

    monotonic_s: float = -math.inf
    energy_mj: float | None = None
    power_w: float | None = None
    epoch: int = 0
    seen: bool = False
    max_power_w: float = 0.0
    intervals_s: deque[float] = field(default_factory=lambda: deque(maxlen=_USUAL_INTERVALS))
    # The counter's last reading (kept while a tick cannot read it), its time and epoch, and the energy given
    # out by power × time since: where it is read again, the delta over the whole span corrects the total.
    counter_mj: float | None = None
    counter_s: float = 0.0
    counter_epoch: int = 0
    since_counter_mj: int = 0

    def remember(self, s: DeviceSample) -> None:
        self.monotonic_s, self.energy_mj, self.power_w, self.epoch = (
            s.time.monotonic_s,
            s.energy_mj,
            s.power_w,
            s.counter_epoch,
        )
        self.seen = True
        if s.energy_mj is not None:
            self.counter_mj, self.counter_s, self.counter_epoch = s.energy_mj, s.time.monotonic_s, s.counter_epoch
            self.since_counter_mj = 0
        if s.power_w is not None and s.power_w > self.max_power_w:
            self.max_power_w = s.power_w

    def usual_interval_s(self, pipeline_interval_s: float) -> float:
        if not self.intervals_s:
            return pipeline_interval_s
        ordered = sorted(self.intervals_s)
        return ordered[len(ordered) // 2]


_Measured = tuple[DeviceSample, float, int, bool, bool]
"""A device's tick before its split: the sample, interval s, energy mJ, from the counter, a gap."""


def device_work(batch: Batch) -> dict[str, Work]:
    """Each device's Work this tick; a device no process source could look at is not in it."""
    if "gpu_processes" not in batch.present:
        return {}
    counts, utils = _loads(batch.gpu_processes)
    device_utils = _device_utils(batch.devices, batch.device_signals)
    out: dict[str, Work] = {}
    for s in batch.devices:
        if s.processes_known:
            util = utils.get(s.device_id, 0.0)
            out[s.device_id] = Work(
                True, counts.get(s.device_id, 0), None if math.isnan(util) else util, device_utils.get(s.device_id)
            )
    return out


def _loads(processes: tuple[GpuProcessSample, ...]) -> tuple[dict[str, int], dict[str, float]]:
    """Per device: how many processes are listed, and their summed utilisation (NaN: one is unknown).

    By runs of one device (receivers list a device's processes together; a device in several runs adds
    up): a run's utilisations are summed in C, this runs once per tick over every process on the node."""
    counts: dict[str, int] = {}
    utils: dict[str, float] = {}
    for device_id, run in itertools.groupby(processes, _DEVICE_ID):
        values = list(map(_SM_UTIL, run))
        total = math.nan if None in values else sum(values)
        counts[device_id] = counts.get(device_id, 0) + len(values)
        utils[device_id] = utils.get(device_id, 0.0) + total
    return counts, utils


def _device_utils(devices: tuple[DeviceSample, ...], signals: tuple[DeviceSignals, ...]) -> dict[str, float]:
    """The device's own utilisation: NVML's reading, else dcgm-exporter's DCGM_FI_DEV_GPU_UTIL."""
    out = {s.device_id: s.util for s in devices if s.util is not None}
    for signal in signals:
        if signal.device_id not in out:
            value = dict(signal.fields).get("gpu_util")
            if value is not None:
                out[signal.device_id] = value
    return out


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
        self.estimators = IdleEstimators(config.chain(), ctx.logger)
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
        self.estimators.load(dict(saved), self.ctx.clock.wall())

    def snapshot(self) -> dict[str, Any]:
        # idle_w, idle_source, idle_uncertainty_w: the current values (what readers of the state file use);
        # idle_window (free), quiet_window, regression: what they come from.
        return self.estimators.dump()

    def idle_w(self, device_id: str) -> float | None:
        current = self.idle_estimate(device_id)
        return None if current is None else current[1].power_w

    def idle_estimate(self, device_id: str, model: str | None = None) -> tuple[Source, Estimate] | None:
        """The device's idle power and its source: configured, else the chain's, else its model's prior."""
        if self.config.mode == "fixed":
            watts = self.config.devices.get(device_id, self.config.watts)
            return None if watts is None else ("configured", Estimate(watts))
        current = self.estimators.current(device_id)
        if current is not None:
            return current
        prior_w = self.config.priors.get(model) if model is not None else None
        return None if prior_w is None else ("prior", Estimate(prior_w))

    # --- the tick ----------------------------------------------------------------------------

    def process(self, batch: Batch) -> Batch:
        # Idle can only be learned where a process source looked (and what it saw decides how).
        work = device_work(batch)
        unknown = Work(known=False)
        measured = [
            m for s in batch.devices if (m := self._measure(s, work.get(s.device_id, unknown), batch.interval_s))
        ]
        if self.config.mode == "auto":
            self.estimators.refit_one(batch.time.monotonic_s)  # before the split: a fit counts from its own tick
        out = tuple(self._power(*m) for m in measured)
        return batch.replace(device_power=batch.device_power + out)

    def _measure(self, s: DeviceSample, work: Work, pipeline_interval_s: float) -> _Measured | None:
        """The device's energy since its last reading (and what the estimators learn from it)."""
        if not s.up:
            # A device that is down keeps its last reading: the delta across the outage is real energy,
            # measured when it comes back (marked a gap if the outage was long), so nothing is lost.
            return None
        dev = self._devices.get(s.device_id)
        if dev is None:
            dev = self._devices[s.device_id] = _Device()
        auto = self.config.mode == "auto"
        now_s = s.time.monotonic_s
        if not dev.seen or now_s <= dev.monotonic_s:
            dev.remember(s)
            if auto:
                self.estimators.begin(s, work)
            return None
        interval_s = now_s - dev.monotonic_s
        gap = self._is_gap(dev, interval_s, pipeline_interval_s)
        delta_mj = self._counter_delta(s, dev, interval_s, dev.energy_mj, dev.epoch)
        continuous = delta_mj is not None or s.energy_mj is None or dev.energy_mj is None  # no reset
        bridged = self._bridged(s, dev) if delta_mj is None and dev.energy_mj is None else None
        if bridged is not None:
            # Not this tick's own counter delta (it corrects the ticks before): nothing to learn from, and
            # marked "power" (MIG attribution reads a "counter" tick's start reading from its energy).
            energy_mj: int | None = bridged
            continuous = False
        else:
            energy_mj = delta_mj if delta_mj is not None else _trapezoid_mj(dev.power_w, s.power_w, interval_s)
        given_mj = dev.since_counter_mj + (energy_mj or 0)
        dev.remember(s)
        if s.energy_mj is None:
            dev.since_counter_mj = given_mj
        if energy_mj is None:
            self.estimators.forget_runs(s.device_id)
            return None
        counter = delta_mj is not None
        if auto:
            self.estimators.observe(s, work, interval_s, energy_mj, continuous=continuous, counter=counter, gap=gap)
        return s, interval_s, energy_mj, counter, gap

    def _power(self, s: DeviceSample, interval_s: float, energy_mj: int, counter: bool, gap: bool) -> DevicePower:
        idle = self.idle_estimate(s.device_id, s.device_name)
        idle_w = None if idle is None else idle[1].power_w
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
            idle_source=None if idle is None else idle[0],
            idle_uncertainty_w=None if idle is None else idle[1].uncertainty_w,
            idle_pending=idle is None and self.config.mode == "auto" and bool(self.config.estimators),
        )

    # --- energy: counter continuity and gaps --------------------------------------------------

    def _is_gap(self, dev: _Device, interval_s: float, pipeline_interval_s: float) -> bool:
        if interval_s > self.config.max_gap * dev.usual_interval_s(pipeline_interval_s):
            return True  # not remembered as usual: a second outage would otherwise look normal
        dev.intervals_s.append(interval_s)
        return False

    def _bridged(self, s: DeviceSample, dev: _Device) -> int | None:
        """The counter read again after ticks that could not read it (their energy was power × time): its delta
        since its last reading less what those ticks gave, so the totals stay on the counter (never below 0: where
        those ticks gave more, the totals stay above it by their estimate's error; docs/attribution.md)."""
        if s.energy_mj is None or dev.counter_mj is None or dev.counter_epoch != s.counter_epoch:
            return None
        span_s = s.time.monotonic_s - dev.counter_s
        delta_mj = self._counter_delta(s, dev, span_s, dev.counter_mj, dev.counter_epoch)
        return None if delta_mj is None else max(0, delta_mj - dev.since_counter_mj)

    def _counter_delta(
        self, s: DeviceSample, dev: _Device, interval_s: float, before_mj: float | None, before_epoch: int
    ) -> int | None:
        """The counter's delta in mJ since ``before_mj``; None where there is no counter at one end, or it reset."""
        if s.energy_mj is None or before_mj is None:
            return None
        # Deltas of floored absolute readings telescope: however many ticks, the sum of the deltas is the
        # counter's own difference to the millijoule (rounding each delta would drift).
        delta_mj = math.floor(s.energy_mj) - math.floor(before_mj)
        limit_mj = self._limit_w(s, dev) * (interval_s + COUNTER_UPDATE_S) * 1000.0
        if s.counter_epoch != before_epoch and not (delta_mj >= 0 and s.energy_mj > limit_mj):
            # Re-acquired (maybe a reloaded driver): a counter restarted within this interval holds at most
            # limit_mj, so only a reading above that (and the old one) is the old counter still counting.
            self._reset(s, before_mj, before_epoch, interval_s, "epoch")
            return None
        if delta_mj < 0 and s.energy_counter_max_mj:
            # A counter with a declared range (RAPL) wrapped: at most once per tick, since a wrap takes minutes
            # even at full power.
            delta_mj += math.floor(s.energy_counter_max_mj)
        if delta_mj < 0:
            self._reset(s, before_mj, before_epoch, interval_s, "backwards")
            return None
        # A reload whose new counter is above the old one gives a delta *below* the true energy, so only the
        # epoch catches it; this bound catches counters that jump (a glitch, another origin).
        if delta_mj > limit_mj:
            self._reset(s, before_mj, before_epoch, interval_s, "implausible")
            return None
        return delta_mj

    def _limit_w(self, s: DeviceSample, dev: _Device) -> float:
        """The most power the device's counter can plausibly average: the floor is what no device draws;
        above it, the device's own highest reading (with a margin) decides."""
        peak_w = max(dev.max_power_w, s.power_w or 0.0)
        return max(self.config.counter_max_w, PEAK_MARGIN * peak_w)

    def _reset(self, s: DeviceSample, before_mj: float, before_epoch: int, interval_s: float, reason: str) -> None:
        self.resets.inc(device=s.device_id, reason=reason)
        self.log.warning(
            "device %s: energy counter reset: %s (%.0f → %.0f mJ in %.1f s, epoch %d → %d); this tick's energy "
            "is power × time",
            s.device_id,
            _RESET_WHY[reason],
            before_mj,
            s.energy_mj,
            interval_s,
            before_epoch,
            s.counter_epoch,
        )


def _trapezoid_mj(first_w: float | None, last_w: float | None, interval_s: float) -> int | None:
    """Power × time by the two readings at the ends of the interval (one, if the other is absent)."""
    powers = [p for p in (first_w, last_w) if p is not None]
    if not powers:
        return None
    return round(sum(powers) / len(powers) * interval_s * 1000.0)


factory = Factory.of(
    IdleProcessor,
    type="idle",
    kind="processor",
    config_model=IdleConfig,
    description="Energy per device and tick from the hardware counter, split into idle and active power.",
    stability="alpha",
    provides=frozenset({"device_power"}),
)
