"""Review of the GPU side: an energy counter that one tick cannot read (a transient failure, the reading
absent) and the next tick reads again. That tick's energy is power × time (nothing better is known then),
but the tick after had the counter at both ends of the two ticks and still used power × time: the
device's totals then drifted from its counter for good (a burst between two power readings was lost)."""

from __future__ import annotations

import pytest

from tests.processors.test_idle_energy import Gpu, batch, idle
from wattpipe.pipeline.clock import SteppedClock


def test_a_counter_read_again_after_one_unreadable_tick_keeps_the_totals_on_the_counter() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    start_mj = gpu.counter_mj
    proc.process(batch(clock, [gpu.sample()], [1]))
    gpu.run(100.0, 5.0)
    powers = list(proc.process(batch(clock, [gpu.sample()], [1])).device_power)
    gpu.run(100.0, 5.0)
    powers += proc.process(batch(clock, [gpu.sample(counter=False)], [1])).device_power
    assert powers[-1].source == "power"  # the counter could not be read: 100 W × 5 s
    gpu.run(300.0, 5.0)  # a burst the power readings at the ends do not show
    gpu.power_w = 100.0
    powers += proc.process(batch(clock, [gpu.sample()], [1])).device_power
    assert sum(p.energy_mj for p in powers) == gpu.counter_mj - start_mj  # 500 + 500 + 1,500 J
    assert powers[-1].energy_mj == 1_500_000
    assert powers[-1].source == "power"  # not this tick's own delta (MIG reads a counter tick's start from it)


def test_a_counter_that_reset_while_unreadable_is_not_bridged() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, [gpu.sample()], [1]))
    gpu.run(100.0, 5.0)
    proc.process(batch(clock, [gpu.sample(counter=False)], [1]))
    gpu.run(100.0, 5.0)
    gpu.counter_mj = 1_000.0  # reloaded meanwhile: the counter is below its last reading
    (p,) = proc.process(batch(clock, [gpu.sample()], [1])).device_power
    assert (p.source, p.energy_mj) == ("power", pytest.approx(500_000))
