"""idle's free and quiet windows (processors/_idle_window.py) after the wall clock steps: their buckets age by the
time that passed (monotonic), not by the wall clock. A forward step (NTP, a VM resumed) used to drop every bucket
but the last, so the learned idle rose to a later, higher minimum; a backward one kept them longer than ``window``."""

from __future__ import annotations

import pytest

from tests.processors.test_idle_estimators import Gpu, batch, idle, idle_of, tick
from wattpipe.pipeline.clock import SteppedClock

HOUR_S = 3600.0


def quiet_minutes(clock: SteppedClock, gpu: Gpu, *watts: float) -> object:
    """An idle processor that saw the GPU quiet (contexts held at 0 %) a minute at each of ``watts``, in order."""
    proc = idle(clock, window="10m", bucket="1m")
    proc.process(batch(clock, {gpu: [0.0]}))  # the baseline reading
    for w in watts:
        for _ in range(12):  # one bucket each
            gpu.run(w, 5.0)
            p = tick(proc, clock, gpu, [0.0])
    assert idle_of(p)[:2] == (pytest.approx(min(watts)), "quiet")
    return proc


def test_a_forward_wall_step_keeps_the_window_s_minimum() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = quiet_minutes(clock, gpu, 66.0, 75.0)  # two minutes: 66 W, then 75 W (a warmer power state)
    clock._offset_s += HOUR_S  # the wall clock steps forward an hour; 5 s pass
    gpu.run(75.0, 5.0)
    p = tick(proc, clock, gpu, [0.0])  # type: ignore[arg-type]
    assert idle_of(p)[:2] == (pytest.approx(66.0), "quiet")  # was 75 W: the 66 W minute dropped as an hour old


def test_a_backward_wall_step_does_not_keep_the_window_longer() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = quiet_minutes(clock, gpu, 66.0, 75.0)
    clock._offset_s -= HOUR_S  # the wall clock steps back an hour
    for _ in range(12 * 10):  # ten more minutes quiet at 75 W: the 66 W minute is past the window
        gpu.run(75.0, 5.0)
        p = tick(proc, clock, gpu, [0.0])  # type: ignore[arg-type]
    assert idle_of(p)[:2] == (pytest.approx(75.0), "quiet")  # was 66 W, kept an hour longer
