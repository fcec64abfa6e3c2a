"""Attribution's idle hold (processors/_idle_hold.py): while a device's idle is not known yet but may be
learned, each tick's energy is held with its split; once idle is known, released with its idle part off."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuProcessSample
from wattpipe.processors._idle_hold import HeldTick, release
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.idle import split_idle

TICK_S = 5.0
IDLE_W = 70.0


def at(n: int) -> Timestamp:
    return Timestamp(monotonic_s=1000.0 + TICK_S * n, wall_s=1_767_225_600.0 + TICK_S * n)


def power(n: int, energy_mj: int, idle_w: float | None, *, pending: bool = True, **kw: object) -> DevicePower:
    idle_mj, active_mj = split_idle(energy_mj, idle_w, TICK_S)
    return DevicePower(
        time=at(n),
        device_id="G",
        interval_s=TICK_S,
        power_w=energy_mj / 1000 / TICK_S,
        idle_w=idle_w,
        active_w=active_mj / 1000 / TICK_S,
        energy_mj=energy_mj,
        idle_energy_mj=idle_mj,
        active_energy_mj=active_mj,
        idle_pending=idle_w is None and pending,
        **kw,  # type: ignore[arg-type]
    )


def procs(n: int, utils: dict[int, float]) -> tuple[GpuProcessSample, ...]:
    return tuple(GpuProcessSample(time=at(n), device_id="G", pid=pid, sm_util=u) for pid, u in utils.items())


def batch(n: int, p: DevicePower, utils: dict[int, float], *, mig: bool = False) -> Batch:
    device = DeviceSample(time=at(n), device_id="G", mig_enabled=mig)
    return Batch(time=at(n), interval_s=TICK_S, node="n").replace(
        device_power=(p,), gpu_processes=procs(n, utils), devices=(device,), present=frozenset({"gpu_processes"})
    )


def processor(**config: object) -> AttributionProcessor:
    return AttributionProcessor(
        AttributionConfig.model_validate(config), make_context("attribution", "processor", SteppedClock())
    )


def by_pid(out: Batch) -> dict[int | None, int]:
    return {s.pid: s.energy_mj for s in out.shares}


ticks_st = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10**7),
        st.floats(min_value=0.1, max_value=60.0),
        st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=0, max_size=5),
    ),
    min_size=0,
    max_size=20,
)


@given(ticks_st, st.one_of(st.none(), st.floats(min_value=0.0, max_value=1000.0)))
def test_release_is_exact_and_idle_is_never_more_than_a_tick_had(
    ticks: list[tuple[int, float, list[float]]], idle_w: float | None
) -> None:
    held = [
        HeldTick(
            float(i), interval_s, mj, tuple(range(len(ws))), tuple(w / sum(ws) if sum(ws) else 1 / len(ws) for w in ws)
        )
        for i, (mj, interval_s, ws) in enumerate(ticks)
    ]
    out = release(held, idle_w)
    assert out.idle_mj + out.active_mj == sum(t.energy_mj for t in held)
    expected_idle = sum(split_idle(t.energy_mj, idle_w, t.interval_s)[0] for t in held)
    assert out.idle_mj == expected_idle
    assert all(mj >= 0 for mj in (out.by_process or {}).values())
    assert out.unattributed_mj >= 0


def test_ticks_before_idle_is_known_are_held_then_released_without_their_idle() -> None:
    attribution = processor()
    # 3 ticks at 100 W (70 idle + Xorg's 30): held, watts still there.
    for n in range(3):
        out = attribution.process(batch(n, power(n, 500_000, None), {1200: 0.02}))
        (p,) = out.device_power
        assert (p.idle_energy_mj, p.active_energy_mj, p.held_energy_mj) == (0, 0, 500_000 * (n + 1))
        assert by_pid(out) == {None: 0, 1200: 0}
        assert [s.power_w for s in out.shares if s.pid == 1200] == [pytest.approx(100.0)]
    # Idle known: all three released, 350 J idle each; this tick's own as usual.
    out = attribution.process(batch(3, power(3, 500_000, IDLE_W), {1200: 0.02}))
    (p,) = out.device_power
    assert (p.idle_energy_mj, p.active_energy_mj, p.held_energy_mj) == (4 * 350_000, 4 * 150_000, 0)
    assert by_pid(out) == {None: 0, 1200: 4 * 150_000}
    assert p.idle_energy_mj + p.active_energy_mj - 3 * 500_000 == p.energy_mj  # the held level fell by 1500 J


def test_released_energy_follows_each_tick_own_split_exited_processes_too() -> None:
    attribution = processor()
    attribution.process(batch(0, power(0, 1_350_000, None), {1: 0.5, 2: 0.5}))  # 200 W active: 100 each
    out = attribution.process(batch(1, power(1, 850_000, IDLE_W), {1: 0.5}))  # pid 2 has exited
    assert by_pid(out) == {None: 0, 1: 500_000 + 500_000, 2: 500_000}
    late = next(s for s in out.shares if s.pid == 2)
    assert (late.share, late.power_w) == (0.0, 0.0)  # a late share: no watts, not running


def test_idle_wait_bounds_the_hold_then_it_is_all_active_and_nothing_more_is_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attribution = processor(idle_wait="10s")
    levels = []
    with caplog.at_level(logging.WARNING):
        for n in range(4):
            out = attribution.process(batch(n, power(n, 500_000, None), {7: 0.5}))
            levels.append((out.device_power[0].held_energy_mj, by_pid(out)[7]))
    assert levels == [(500_000, 0), (1_000_000, 0), (0, 1_500_000), (0, 500_000)]
    assert sum("idle power still not known" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("why", "p", "utils", "mig"),
    [
        ("mode fixed (or no estimator): idle not pending", power(0, 500_000, None, pending=False), {1: 0.5}, False),
        ("free", power(0, 500_000, None), {}, False),
        ("unattributable", power(0, 500_000, None, unattributable="gap"), {1: 0.5}, False),
        ("MIG has its own hold", power(0, 500_000, None), {1: 0.5}, True),
        ("idle_wait 0", power(0, 500_000, None), {1: 0.5}, False),
    ],
)
def test_nothing_is_held(why: str, p: DevicePower, utils: dict[int, float], mig: bool) -> None:
    attribution = processor(idle_wait=0) if why == "idle_wait 0" else processor()
    out = attribution.process(batch(0, p, utils, mig=mig))
    assert out.device_power[0].held_energy_mj == 0, why
    assert sum(s.energy_mj for s in out.shares) == 500_000, why


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=5_000_000),
            st.booleans(),  # idle known this tick
            st.dictionaries(st.integers(min_value=1, max_value=4), st.floats(min_value=0, max_value=1), max_size=3),
            st.booleans(),  # unattributable
        ),
        max_size=30,
    )
)
def test_every_tick_conserves_and_the_run_adds_up(ticks: list[tuple[int, bool, dict[int, float], bool]]) -> None:
    attribution = processor(idle_wait="60s")
    held_before = total_shares = total_idle = total_energy = 0
    for n, (mj, known, utils, gap) in enumerate(ticks):
        p = power(n, mj, IDLE_W if known else None, unattributable="gap" if gap else None)
        out = attribution.process(batch(n, p, utils))
        (q,) = out.device_power
        shares = sum(s.energy_mj for s in out.shares)
        assert shares + q.idle_energy_mj + q.held_energy_mj - held_before == q.energy_mj
        assert shares == q.active_energy_mj
        assert min(q.idle_energy_mj, q.active_energy_mj, q.held_energy_mj) >= 0
        held_before = q.held_energy_mj
        total_shares, total_idle, total_energy = total_shares + shares, total_idle + q.idle_energy_mj, total_energy + mj
    assert total_shares + total_idle + held_before == total_energy
