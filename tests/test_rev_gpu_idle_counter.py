"""Review of the GPU side: the idle processor's energy over any sequence of readings of one counter that
never resets (same epoch, never backwards), with ticks that cannot read it, outages (the device down),
irregular and long intervals: the energies sum to the counter's own difference, to the millijoule."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.processors.test_idle_energy import batch, idle
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import DeviceSample

_step = st.tuples(
    st.floats(0.5, 120.0),  # seconds since the last reading
    st.floats(0.0, 700.0),  # the watts over it
    st.sampled_from(["read", "read", "read", "unreadable", "down"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, min_size=1, max_size=30))
def test_energy_sums_to_the_counter_whatever_the_readings_in_between(steps: list[tuple[float, float, str]]) -> None:
    clock = SteppedClock()
    proc = idle(clock)
    counter_mj = 7_000_000.123

    def sample(state: str) -> DeviceSample:
        return DeviceSample(
            time=clock.now(),
            device_id="G",
            power_w=0.0 if state != "down" else None,  # readings that see nothing: power × time gives 0
            energy_mj=counter_mj if state == "read" else None,
            up=state != "down",
        )

    proc.process(batch(clock, [sample("read")], [1]))
    first_mj = counter_mj
    total = 0
    for seconds, watts, state in [*steps, (5.0, 100.0, "read")]:  # the last reading is of the counter
        clock.advance(seconds)
        counter_mj += watts * seconds * 1000.0
        out = proc.process(batch(clock, [sample(state)], [1]))
        assert all(p.energy_mj >= 0 for p in out.device_power)
        total += sum(p.energy_mj for p in out.device_power)
    assert total == math.floor(counter_mj) - math.floor(first_mj)
