"""Review of the energy processor: a process that exited while its GPU's energy was held, past
``terminated_retention`` and within ``late_energy_wait``, gets its late energy in the tick that releases the
last of the hold. That tick the device holds nothing any more, so its ended series were pruned by
``terminated_retention`` before the tick's totals were made: the late energy was added to a series that was
never exported again (its exported total lacked it, and no unattributed total had it either)."""

from __future__ import annotations

from tests.processors.test_idle_energy import energy
from tests.processors.test_idle_hold import IDLE_W, at, batch, power, processor
from wattpipe.pipeline.clock import SteppedClock


def test_the_release_of_the_last_held_energy_is_exported_on_the_series_of_a_process_that_exited() -> None:
    clock = SteppedClock()
    attribution, totals = processor(idle_wait="90s"), energy(clock)
    totals.process(attribution.process(batch(0, power(0, 500_000, None), {10: 0.5, 11: 0.5})))
    for n in range(1, 18):  # 11 has exited (its series ends at 5 s); the GPU's idle is not known for 85 s
        clock.set(at(n).monotonic_s)
        out = totals.process(attribution.process(batch(n, power(n, 500_000, None), {10: 1.0})))
        assert out.device_power[0].held_energy_mj == 500_000 * (n + 1)
    clock.set(at(18).monotonic_s)
    out = totals.process(attribution.process(batch(18, power(18, 500_000, IDLE_W), {10: 1.0})))  # idle known
    assert out.device_power[0].held_energy_mj == 0
    processes = {t.key: (t.energy_mj, t.state) for t in out.totals if t.scope == "process"}
    assert processes["11"] == (75_000, "terminated")  # half of tick 0's 150 J above idle, 85 s after it ended
    (device,) = out.device_totals
    assert sum(e for e, _ in processes.values()) + device.unattributed_energy_mj == device.active_energy_mj
