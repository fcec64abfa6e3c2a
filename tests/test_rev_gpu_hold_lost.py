"""Review of the GPU side: a GPU lost for good (off the bus until a reboot) while attribution holds its energy
(idle not known yet). Held energy used to be released only in a tick that has the device's DevicePower, which a
lost GPU never has again: up to ``idle_wait`` of measured energy never reached any total.

Now a device that has not answered since ``idle_wait`` after its first held tick is released as the wait's end
releases any hold (all active, by the held ticks' own shares: idle never became known), in late shares (no
watts) with no DevicePower; the energy processor adds them to the device's active energy and to the processes'
series, and the device's held level falls by them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.processors.test_idle_energy import energy
from tests.processors.test_idle_hold import IDLE_W, TICK_S, at, batch, power, processor
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import DeviceSample


def _down(n: int) -> Batch:
    """A tick in which GPU G is down: a down sample, no DevicePower, no process listed."""
    down = DeviceSample(time=at(n), device_id="G", up=False)
    return Batch(time=at(n), interval_s=TICK_S, node="n").replace(devices=(down,), present=frozenset({"gpu_processes"}))


def test_energy_held_for_a_gpu_lost_for_good_is_released_after_idle_wait() -> None:
    proc = processor(idle_wait=30.0)
    out = proc.process(batch(1, power(1, 500_000, None), {10: 0.5, 11: 0.5}))
    assert out.device_power[0].held_energy_mj == 500_000
    released = 0
    for n in range(2, 2 + int(120 / TICK_S)):  # the GPU is down from here on: a down sample, no DevicePower
        out = proc.process(_down(n))
        released += sum(s.energy_mj for s in out.shares)
        if out.shares:
            assert n == 7, "released at idle_wait after the held tick's end, not before"
            assert {(s.pid, s.share, s.power_w) for s in out.shares} == {(10, 0.0, 0.0), (11, 0.0, 0.0)}
    assert released == 500_000


def test_the_energy_processor_counts_it_as_active_of_the_lost_device_and_its_processes() -> None:
    attribution, totals = processor(idle_wait=10.0), energy(SteppedClock())
    totals.process(attribution.process(batch(0, power(0, 300_000, None), {10: 1.0})))
    out = totals.process(attribution.process(_down(1)))
    assert not out.shares
    out = totals.process(attribution.process(_down(2)))  # 10 s after the held tick: released
    (device,) = out.device_totals
    assert (device.energy_mj, device.idle_energy_mj, device.active_energy_mj) == (300_000, 0, 300_000)
    assert (device.attributed_energy_mj, device.unattributed_energy_mj) == (300_000, 0)
    (process,) = [t for t in out.totals if t.scope == "process"]
    assert (process.key, process.energy_mj, process.power_w) == ("10", 300_000, None)  # no watts: not read
    last = totals.devices["G"].last
    assert last is not None
    assert last.held_energy_mj == 0


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2_000_000),
            st.sampled_from(["pending", "known", "down"]),
            st.dictionaries(st.integers(min_value=1, max_value=3), st.floats(min_value=0, max_value=1), max_size=3),
        ),
        max_size=30,
    )
)
def test_every_tick_conserves_through_outages_and_the_totals_add_up(
    ticks: list[tuple[int, str, dict[int, float]]],
) -> None:
    """Per tick: up, Σ shares + idle + (held now − held before) == energy; down, Σ shares == held before −
    held now. Over the run the energy processor's device energy + what is still held == Σ energy, and its
    process totals + unattributed == active."""
    attribution, totals = processor(idle_wait="20s"), energy(SteppedClock())
    held_before = measured = 0
    for n, (mj, state, utils) in enumerate(ticks):
        if state == "down":
            out = totals.process(attribution.process(_down(n)))
            last = totals.devices["G"].last if "G" in totals.devices else None
            held_now = last.held_energy_mj if last is not None else 0
            assert sum(s.energy_mj for s in out.shares) == held_before - held_now
        else:
            out = totals.process(
                attribution.process(batch(n, power(n, mj, IDLE_W if state == "known" else None), utils))
            )
            (q,) = out.device_power
            shares = sum(s.energy_mj for s in out.shares)
            assert shares + q.idle_energy_mj + q.held_energy_mj - held_before == q.energy_mj
            held_now, measured = q.held_energy_mj, measured + mj
        assert all(s.energy_mj >= 0 for s in out.shares)
        held_before = held_now
        for device in out.device_totals:
            assert device.energy_mj + held_now == measured
            assert device.energy_mj == device.idle_energy_mj + device.active_energy_mj
            processes = sum(t.energy_mj for t in out.totals if t.scope == "process")
            assert processes + device.unattributed_energy_mj == device.active_energy_mj
