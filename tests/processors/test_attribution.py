"""Attribution math: exact apportionment, sharing modes, the explicit remainder."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.clock import SteppedClock, Timestamp
from pipeline.records import Batch, DevicePower, DeviceSample, GpuProcessSample
from processors.attribution import AttributionProcessor, apportion
from tests.helpers.context import make_context

T = Timestamp(monotonic_s=1005.0, wall_s=1_767_225_605.0)
weights_st = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=64)


@given(st.integers(min_value=0, max_value=10**12), weights_st)
def test_apportion_is_exact_and_never_negative(total: int, weights: list[float]) -> None:
    parts = apportion(total, weights)
    assert sum(parts) == total
    assert all(p >= 0 for p in parts)


@given(st.integers(min_value=0, max_value=10**9), weights_st)
def test_apportion_is_within_one_millijoule_of_the_exact_share(total: int, weights: list[float]) -> None:
    parts = apportion(total, weights)
    weight_sum = math.fsum(weights)
    for part, w in zip(parts, weights, strict=True):
        exact = total * w / weight_sum if weight_sum > 0 else total / len(weights)
        assert abs(part - exact) < 1.0 + 1e-6 * max(1.0, exact)


@given(st.integers(min_value=0, max_value=10**9), weights_st)
def test_apportion_keeps_order_more_weight_never_gets_less(total: int, weights: list[float]) -> None:
    parts = apportion(total, weights)
    for i in range(len(weights)):
        for j in range(len(weights)):
            if weights[i] > weights[j]:
                assert parts[i] >= parts[j]


def test_apportion_splits_equally_when_every_weight_is_zero() -> None:
    assert apportion(10, [0, 0, 0]) == [4, 3, 3]
    assert apportion(7, []) == []
    with pytest.raises(ValueError, match="negative"):
        apportion(-1, [1.0])


def _power(device: str, active_mj: int, idle_mj: int = 0, interval_s: float = 5.0) -> DevicePower:
    return DevicePower(
        time=T,
        device_id=device,
        interval_s=interval_s,
        power_w=(active_mj + idle_mj) / 1000 / interval_s,
        idle_w=None,
        active_w=active_mj / 1000 / interval_s,
        energy_mj=active_mj + idle_mj,
        idle_energy_mj=idle_mj,
        active_energy_mj=active_mj,
    )


def _run(powers: list[DevicePower], procs: list[GpuProcessSample], devices: list[DeviceSample] | None = None) -> Batch:
    clock = SteppedClock()
    processor = AttributionProcessor(make_context("attribution", "processor", clock))
    batch = Batch(time=T, interval_s=5.0, node="n").replace(
        device_power=tuple(powers), gpu_processes=tuple(procs), devices=tuple(devices or ())
    )
    return processor.process(batch)


def test_time_slicing_splits_by_integrated_utilisation() -> None:
    batch = _run(
        [_power("G", 1_000_000)],
        [
            GpuProcessSample(time=T, device_id="G", pid=1, sm_util=0.6),
            GpuProcessSample(time=T, device_id="G", pid=2, sm_util=0.2),
        ],
    )
    assert [(s.pid, s.energy_mj, s.mode) for s in batch.shares if s.pid is not None] == [
        (1, 750_000, "time_slicing"),
        (2, 250_000, "time_slicing"),
    ]
    assert [s.power_w for s in batch.shares if s.pid is not None] == [pytest.approx(150.0), pytest.approx(50.0)]


def test_all_idle_processes_split_equally_and_no_process_is_unattributed() -> None:
    batch = _run(
        [_power("A", 900), _power("B", 500)],
        [GpuProcessSample(time=T, device_id="A", pid=p, sm_util=0.0) for p in (1, 2, 3)],
    )
    a = [(s.pid, s.energy_mj) for s in batch.shares if s.device_id == "A" and s.pid is not None]
    b = [(s.pid, s.energy_mj, s.mode) for s in batch.shares if s.device_id == "B"]
    assert a == [(1, 300), (2, 300), (3, 300)]
    assert b == [(None, 500, "none")]  # the remainder is explicit, never dropped


def test_exclusive_compute_mode_gives_the_single_process_everything() -> None:
    device = DeviceSample(time=T, device_id="G", compute_mode="exclusive_process")
    batch = _run([_power("G", 1234)], [GpuProcessSample(time=T, device_id="G", pid=9, sm_util=0.0)], [device])
    assert [(s.pid, s.energy_mj, s.share, s.mode) for s in batch.shares if s.pid is not None] == [
        (9, 1234, 1.0, "exclusive")
    ]


def test_mig_splits_equally_for_now_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    device = DeviceSample(time=T, device_id="G", mig_enabled=True)
    procs = [GpuProcessSample(time=T, device_id="G", pid=p, gpu_instance_id=p, sm_util=None) for p in (1, 2)]
    clock = SteppedClock()
    processor = AttributionProcessor(make_context("attribution", "processor", clock))
    batch = Batch(time=T, interval_s=5.0, node="n").replace(
        device_power=(_power("G", 1001),), gpu_processes=tuple(procs), devices=(device,)
    )
    for _ in range(3):
        out = processor.process(batch)
    assert [(s.pid, s.energy_mj, s.mode, s.gpu_instance_id) for s in out.shares if s.pid is not None] == [
        (1, 501, "mig", 1),
        (2, 500, "mig", 2),
    ]
    assert caplog.text.count("is in MIG mode") == 1


def test_unknown_utilisation_for_some_process_means_equal_split() -> None:
    batch = _run(
        [_power("G", 100)],
        [
            GpuProcessSample(time=T, device_id="G", pid=1, sm_util=0.9),
            GpuProcessSample(time=T, device_id="G", pid=2, sm_util=None),
        ],
    )
    assert [s.energy_mj for s in batch.shares if s.pid is not None] == [50, 50]


def test_a_pid_listed_twice_counts_once() -> None:
    batch = _run(
        [_power("G", 100)],
        [GpuProcessSample(time=T, device_id="G", pid=1, sm_util=0.5)] * 2
        + [GpuProcessSample(time=T, device_id="G", pid=2, sm_util=0.5)],
    )
    assert [(s.pid, s.energy_mj) for s in batch.shares if s.pid is not None] == [(1, 50), (2, 50)]


@given(
    st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=6),
    st.lists(st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), max_size=20), min_size=6, max_size=6),
)
def test_conservation_per_device_per_tick_is_exact(actives: list[int], utils: list[list[float]]) -> None:
    powers = [_power(f"G{i}", a, idle_mj=i * 7) for i, a in enumerate(actives)]
    procs = [
        GpuProcessSample(time=T, device_id=f"G{i}", pid=100 * i + j + 1, sm_util=u)
        for i in range(len(actives))
        for j, u in enumerate(utils[i])
    ]
    batch = _run(powers, procs)
    for power in powers:
        shares = [s for s in batch.shares if s.device_id == power.device_id]
        assert sum(s.energy_mj for s in shares) + power.idle_energy_mj == power.energy_mj
        assert all(s.energy_mj >= 0 for s in shares)


def test_the_remainder_is_explicit_every_tick_zero_when_processes_carried_it_all() -> None:
    batch = _run([_power("G", 999)], [GpuProcessSample(time=T, device_id="G", pid=1, sm_util=0.3)])
    (remainder,) = [s for s in batch.shares if s.pid is None]
    assert (remainder.energy_mj, remainder.power_w, remainder.mode) == (0, 0.0, "exclusive")
