"""idle (issue 14): what idle may be learned from, the sliding window, counter resets and long gaps."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuProcessSample
from wattpipe.pipeline.state import StateStore
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.processors._idle_window import Estimate
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.idle import IdleConfig, IdleProcessor

UUID = "GPU-a"
HOUR_S = 3600.0


class Gpu:
    """A hand-driven GPU: ``run`` integrates a steady power into the counter and reads that power at the end."""

    def __init__(self, clock: SteppedClock, power_w: float = 70.0, counter_mj: float = 5_000_000.0) -> None:
        self.clock, self.power_w, self.counter_mj = clock, power_w, counter_mj
        self.epoch = 0
        self.processes_known = True

    def run(self, watts: float, seconds: float, *, reading_w: float | None = None) -> None:
        self.counter_mj += watts * seconds * 1000
        self.power_w = watts if reading_w is None else reading_w
        self.clock.advance(seconds)

    def sample(self, *, up: bool = True) -> DeviceSample:
        return DeviceSample(
            time=self.clock.now(),
            device_id=UUID,
            up=up,
            power_w=self.power_w if up else None,
            energy_mj=self.counter_mj if up else None,
            processes_known=self.processes_known,
            counter_epoch=self.epoch,
        )


def batch(clock: SteppedClock, gpu: Gpu, pids: tuple[int, ...] = (), *, up: bool = True) -> Batch:
    procs = tuple(GpuProcessSample(time=clock.now(), device_id=UUID, pid=p, sm_util=0.0) for p in pids)
    return Batch(time=clock.now(), interval_s=5.0, node="n").replace(devices=(gpu.sample(up=up),), gpu_processes=procs)


def idle(
    clock: SteppedClock, state: StateStore | None = None, telemetry: Telemetry | None = None, **options: object
) -> IdleProcessor:
    ctx = make_context("idle", "processor", clock, pipeline="metrics", state=state, telemetry=telemetry)
    p = IdleProcessor(IdleConfig(**options), ctx)
    p.start()
    return p


def tick(proc: IdleProcessor, clock: SteppedClock, gpu: Gpu, pids: tuple[int, ...] = ()) -> DevicePower:
    (power,) = proc.process(batch(clock, gpu, pids)).device_power
    assert power.idle_energy_mj + power.active_energy_mj == power.energy_mj
    return power


def quiet(proc: IdleProcessor, clock: SteppedClock, gpu: Gpu, watts: float, seconds: float = 5.0) -> DevicePower:
    gpu.run(watts, seconds)
    return tick(proc, clock, gpu)


# --- (1) a failed process listing ---------------------------------------------------------------


def test_a_failed_process_listing_teaches_no_idle_and_its_active_energy_is_unattributable() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock, power_w=370.0)
    proc = idle(clock)
    gpu.processes_known = False  # the driver could not list the processes: busy at 370 W, nobody listed
    proc.process(batch(clock, gpu))
    p = quiet(proc, clock, gpu, 370.0)
    assert proc.idle_w(UUID) is None  # not 370 W learned as idle
    assert (p.unattributable, p.idle_energy_mj, p.active_energy_mj) == ("processes_unknown", 0, 1_850_000)


def test_a_failed_listing_still_splits_off_the_known_idle() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, gpu))
    quiet(proc, clock, gpu, 70.0)
    gpu.run(370.0, 5.0, reading_w=370.0)
    gpu.processes_known = False
    p = tick(proc, clock, gpu)
    assert proc.idle_w(UUID) == p.idle_w == pytest.approx(70.0)
    assert (p.unattributable, p.idle_energy_mj, p.active_energy_mj) == ("processes_unknown", 350_000, 1_500_000)
    # Attribution then leaves that active energy to nobody rather than to whoever is listed next.
    (share,) = (
        AttributionProcessor(AttributionConfig(), make_context("attribution"))
        .process(Batch(time=clock.now(), interval_s=5.0, node="n").replace(device_power=(p,)))
        .shares
    )
    assert (share.pid, share.energy_mj, share.mode) == (None, 1_500_000, "processes_unknown")


def test_processes_at_zero_utilisation_are_quiet_not_free() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock, power_w=90.0)
    proc = idle(clock)
    proc.process(batch(clock, gpu, (7,)))
    gpu.run(90.0, 5.0)
    p = tick(proc, clock, gpu, (7,))  # listed, 0 % SM: a context held (maybe a higher power state than free)
    assert (p.idle_w, p.idle_source, p.idle_uncertainty_w) == (90.0, "quiet", 0.0)  # issue 15 (None before)
    assert proc.idle_estimate(UUID) == ("quiet", Estimate(90.0, 0.0))
    gpu.run(70.0, 5.0)
    assert tick(proc, clock, gpu).idle_source == "quiet"  # the process left: free from here on
    gpu.run(70.0, 5.0)
    p = tick(proc, clock, gpu)  # nobody listed: free, which comes first
    assert (p.idle_w, p.idle_source, p.idle_uncertainty_w) == (70.0, "free", 0.0)
    only_free = idle(clock, estimators=["free"])  # the behaviour before issue 15
    only_free.process(batch(clock, gpu, (7,)))
    gpu.run(90.0, 5.0)
    assert tick(only_free, clock, gpu, (7,)).idle_w is None


# --- (2) the guard: long enough, counter and readings agreeing, a sliding window ------------------


def test_a_short_interval_with_an_unchanged_counter_teaches_nothing() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, gpu))
    clock.advance(0.05)  # 50 ms: the counter (updated every ~100 ms) has not moved
    p = tick(proc, clock, gpu)
    assert (p.energy_mj, proc.idle_w(UUID), p.idle_w) == (0, None, None)  # not 0 W


def test_an_interval_whose_counter_disagrees_with_the_power_readings_teaches_nothing() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, gpu))
    gpu.run(20.0, 5.0, reading_w=70.0)  # the counter says 20 W, the sensor 70 W at both ends
    tick(proc, clock, gpu)
    assert proc.idle_w(UUID) is None
    gpu.run(66.0, 5.0, reading_w=70.0)  # within the 10 % tolerance of the readings: learned
    tick(proc, clock, gpu)
    assert proc.idle_w(UUID) == pytest.approx(66.0)


def test_a_device_that_reads_no_power_is_judged_by_its_counter_alone() -> None:
    clock = SteppedClock()
    proc = idle(clock)
    counter_mj = 1_000_000.0

    def rapl() -> Batch:
        sample = DeviceSample(time=clock.now(), device_id="cpu-0", device_type="cpu", energy_mj=counter_mj)
        return Batch(time=clock.now(), interval_s=1.0, node="n").replace(devices=(sample,), gpu_processes=())

    proc.process(rapl())
    clock.advance(0.5)
    counter_mj += 20_000.0
    proc.process(rapl())
    assert proc.idle_w("cpu-0") is None  # 0.5 s: too short even so
    clock.advance(0.5)
    counter_mj += 20_000.0
    (p,) = proc.process(rapl()).device_power
    assert proc.idle_w("cpu-0") == p.idle_w == pytest.approx(40.0)


def test_short_ticks_add_up_to_a_learning_interval() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock, power_w=60.0)
    proc = idle(clock)
    proc.process(batch(clock, gpu))
    for _ in range(7):
        quiet(proc, clock, gpu, 60.0, 0.125)
    assert proc.idle_w(UUID) is None  # 0.875 s of 125 ms ticks: not yet min_interval
    quiet(proc, clock, gpu, 60.0, 0.125)
    assert proc.idle_w(UUID) == pytest.approx(60.0)


def test_a_baseline_that_was_too_low_recovers_when_it_leaves_the_window() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock, power_w=40.0)
    proc = idle(clock)
    proc.process(batch(clock, gpu))
    quiet(proc, clock, gpu, 40.0)  # a genuinely low interval (a deep power state, say)
    for _ in range(int(HOUR_S / 5) - 1):
        quiet(proc, clock, gpu, 70.0)
    assert proc.idle_w(UUID) == pytest.approx(40.0)  # 1 h later: still in the window (bucketed by the minute)
    for _ in range(13):
        quiet(proc, clock, gpu, 70.0)
    assert proc.idle_w(UUID) == pytest.approx(70.0)  # out of it: the only-falling minimum would keep 40 W


def test_a_window_emptied_by_busy_hours_keeps_the_last_idle() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, gpu))
    quiet(proc, clock, gpu, 70.0)
    for _ in range(3 * int(HOUR_S / 5)):
        gpu.run(400.0, 5.0)
        p = tick(proc, clock, gpu, (7,))
    assert proc.idle_w(UUID) == pytest.approx(70.0)
    assert p.idle_energy_mj == 350_000


def test_the_window_is_bounded_and_survives_a_restart(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    gpu = Gpu(clock, power_w=60.0)
    proc = idle(clock, store)
    proc.process(batch(clock, gpu))
    quiet(proc, clock, gpu, 60.0)
    for _ in range(int(2 * HOUR_S / 5)):
        quiet(proc, clock, gpu, 75.0)  # the 60 W leaves the window; 75 W in every minute bucket
    quiet(proc, clock, gpu, 65.0)  # from 75 W: its start disagrees with it, not learned
    quiet(proc, clock, gpu, 65.0)
    saved = proc.snapshot()
    assert saved["idle_w"] == {UUID: pytest.approx(65.0)}  # the current value, as before (readers rely on it)
    assert 60 <= len(saved["idle_window"][UUID]) <= 61  # one minimum per minute of the hour, not per tick
    store.put("metrics/idle", saved)
    store.save()
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = idle(clock, reloaded)
    assert again.idle_w(UUID) == pytest.approx(65.0)
    again.process(batch(clock, gpu))
    for _ in range(int(HOUR_S / 5) + 12):
        quiet(again, clock, gpu, 75.0)
    assert again.idle_w(UUID) == pytest.approx(75.0)  # the restored 65 W left the window like any other


def test_an_old_state_file_value_counts_as_one_sample_at_restore(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    store.put("metrics/idle", {"idle_w": {UUID: 10.0}})  # before issue 14: one value, only ever falling
    store.save()
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    gpu = Gpu(clock)
    proc = idle(clock, reloaded)
    assert proc.idle_w(UUID) == 10.0
    proc.process(batch(clock, gpu))
    for _ in range(int(HOUR_S / 5) + 13):
        quiet(proc, clock, gpu, 70.0)
    assert proc.idle_w(UUID) == pytest.approx(70.0)


def test_the_guard_settings_are_validated() -> None:
    cfg = IdleConfig(min_interval="2s", window="30m", bucket="30s", max_gap=4)
    assert (cfg.min_interval, cfg.window, cfg.bucket, cfg.max_gap) == (2.0, 1800.0, 30.0, 4.0)
    with pytest.raises(ValueError, match="bucket"):
        IdleConfig(window="1m", bucket="5m")
    with pytest.raises(ValueError, match="max_gap"):
        IdleConfig(max_gap=0.5)


_STEP = st.tuples(
    st.floats(0.01, 600.0),  # seconds
    st.floats(0.0, 800.0),  # average watts (the counter)
    st.floats(0.0, 800.0),  # the power reading at the end
    st.booleans(),  # no process listed at the end
)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 800.0), st.lists(_STEP, min_size=1, max_size=60))
def test_idle_is_never_above_a_valid_quiet_interval_in_its_window_nor_below_zero(
    first_reading_w: float, steps: list[tuple[float, float, float, bool]]
) -> None:
    clock = SteppedClock()
    gpu = Gpu(clock, power_w=first_reading_w)
    proc = idle(clock, window="10m", bucket="1m")
    config = proc.config
    proc.process(batch(clock, gpu))
    was_quiet, valid = True, []  # (end time, watts) of every valid quiet interval so far
    for seconds, watts, reading_w, now_quiet in steps:
        start_reading_w = gpu.power_w
        gpu.run(watts, seconds, reading_w=reading_w)
        proc.process(batch(clock, gpu, () if now_quiet else (1,)))
        # Clearly valid (by a margin over the counter's 1 mJ floor and the clock's float steps): learned for sure.
        agrees = all(
            abs(watts - r) <= max(config.agreement_w, config.agreement * r) - 0.01 for r in (start_reading_w, reading_w)
        )
        if was_quiet and now_quiet and seconds >= config.min_interval + 1e-6 and agrees:
            valid.append((clock.monotonic(), watts))
        was_quiet = now_quiet
        learned = proc.idle_w(UUID)
        in_window = [w for end_s, w in valid if clock.monotonic() - end_s < config.window]
        if learned is not None:
            assert learned >= 0.0
            assert all(learned <= w + 1e-3 for w in in_window)  # + the counter's 1 mJ floor over >= 1 s
        else:
            assert not valid


# --- (7) counter resets and gaps ------------------------------------------------------------------


def test_a_new_counter_epoch_is_a_reset_even_where_the_counter_went_up(caplog: pytest.LogCaptureFixture) -> None:
    clock = SteppedClock()
    gpu = Gpu(clock, counter_mj=1_000.0)  # a counter that had just started
    telemetry = Telemetry(clock)
    proc = idle(clock, telemetry=telemetry)
    proc.process(batch(clock, gpu, (1,)))
    gpu.run(100.0, 5.0)
    gpu.counter_mj, gpu.epoch = 600_000.0, 1  # reloaded: 600 J since then, above the old 501 J
    p = tick(proc, clock, gpu, (1,))
    assert (p.source, p.energy_mj) == ("power", 425_000)  # trapezoid of 70 W and 100 W over 5 s
    assert _resets(telemetry, "epoch") == 1.0
    assert caplog.text.count("energy counter reset") == 1
    gpu.run(100.0, 5.0)
    assert tick(proc, clock, gpu, (1,)).source == "counter"  # continuity within the new epoch


def test_a_new_epoch_whose_counter_is_beyond_any_restart_continues_the_old_counter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A GPU off the bus for a minute comes back through a new handle (a new epoch), but its counter kept
    # counting: 252 kJ before (an hour at 70 W since the driver loaded), 252 kJ + the minute after. A
    # counter restarted within the minute could hold at most 2 kW × 60.1 s = 120 kJ, so this one cannot
    # have restarted: the delta is energy (its power × time stand-in was 14 % off on a simulated outage).
    clock = SteppedClock()
    gpu = Gpu(clock, counter_mj=252_000_000.0)
    telemetry = Telemetry(clock)
    proc = idle(clock, telemetry=telemetry)
    proc.process(batch(clock, gpu, (1,)))
    gpu.run(250.0, 60.0, reading_w=100.0)  # the readings at the ends miss what happened in between
    gpu.epoch = 1
    p = tick(proc, clock, gpu, (1,))
    assert (p.source, p.energy_mj) == ("counter", 15_000_000)
    assert _resets(telemetry, "epoch") == 0.0
    assert "energy counter reset" not in caplog.text


def test_a_counter_jump_implying_more_than_the_device_can_draw_is_a_reset(caplog: pytest.LogCaptureFixture) -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    telemetry = Telemetry(clock)
    proc = idle(clock, telemetry=telemetry)
    proc.process(batch(clock, gpu, (1,)))
    gpu.run(300.0, 5.0)
    gpu.counter_mj += 10_000_000.0  # +10 kJ in 5 s: 2.3 kW, above any single device
    with caplog.at_level(logging.WARNING):
        p = tick(proc, clock, gpu, (1,))
    assert (p.source, p.energy_mj) == ("power", 925_000)  # trapezoid of 70 W and 300 W
    assert _resets(telemetry, "implausible") == 1.0
    assert f"device {UUID}: energy counter reset" in caplog.text


def test_a_plausible_burst_between_idle_readings_is_energy_not_a_reset() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    telemetry = Telemetry(clock)
    proc = idle(clock, telemetry=telemetry)
    proc.process(batch(clock, gpu, (1,)))
    gpu.run(650.0, 5.0, reading_w=70.0)  # busy between two idle readings: 9× the readings, but real
    p = tick(proc, clock, gpu, (1,))
    assert (p.source, p.energy_mj) == ("counter", 3_250_000)
    assert _resets(telemetry, "implausible") == 0.0


def test_a_backwards_counter_is_counted_as_a_reset() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    telemetry = Telemetry(clock)
    proc = idle(clock, telemetry=telemetry)
    proc.process(batch(clock, gpu, (1,)))
    gpu.run(100.0, 5.0)
    gpu.counter_mj = 10.0
    assert tick(proc, clock, gpu, (1,)).source == "power"
    assert _resets(telemetry, "backwards") == 1.0


def test_a_reset_interval_teaches_no_idle() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, gpu))
    gpu.run(70.0, 5.0)
    gpu.counter_mj, gpu.epoch = 0.0, 1
    tick(proc, clock, gpu)
    assert proc.idle_w(UUID) is None


def test_an_interval_much_longer_than_usual_is_a_gap_and_conserves_its_energy() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock, power_w=300.0)
    proc = idle(clock, mode="fixed", watts=70.0)
    proc.process(batch(clock, gpu, (1,)))
    for _ in range(4):
        gpu.run(300.0, 5.0)
        assert tick(proc, clock, gpu, (1,)).unattributable is None
    gpu.run(300.0, 10.0)  # one tick missed: 2× the usual, still billed
    assert tick(proc, clock, gpu, (1,)).unattributable is None
    gpu.run(300.0, 5.0)
    assert proc.process(batch(clock, gpu, up=False)).device_power == ()  # lost for a minute
    gpu.run(300.0, 55.0)
    p = tick(proc, clock, gpu, (2,))
    assert (p.unattributable, p.source, p.energy_mj) == ("gap", "counter", 18_000_000)
    assert (p.idle_energy_mj, p.active_energy_mj) == (4_200_000, 13_800_000)
    gpu.run(300.0, 5.0)
    assert tick(proc, clock, gpu, (2,)).unattributable is None  # the gap did not become the usual


def _resets(telemetry: Telemetry, reason: str) -> float:
    counter = telemetry.for_component("processor", "idle", logging.getLogger("t")).counter(
        "wattpipe_idle_counter_resets", "", ("device", "reason")
    )
    return counter.value(device=UUID, reason=reason)
