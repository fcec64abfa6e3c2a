"""Attribution math: exact apportionment, sharing modes, the explicit remainder."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuProcessSample, HostProcess, MigActivity, MigInstance
from wattpipe.processors._mig_shares import split_mig
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor, apportion
from wattpipe.processors.attribution_math import since_start

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
    processor = AttributionProcessor(AttributionConfig(), make_context("attribution", "processor", clock))
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


def test_mig_without_activity_or_layout_splits_equally_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    device = DeviceSample(time=T, device_id="G", mig_enabled=True)
    procs = [GpuProcessSample(time=T, device_id="G", pid=p, gpu_instance_id=p, sm_util=None) for p in (1, 2)]
    clock = SteppedClock()
    processor = AttributionProcessor(AttributionConfig(), make_context("attribution", "processor", clock))
    batch = Batch(time=T, interval_s=5.0, node="n").replace(
        device_power=(_power("G", 1001),), gpu_processes=tuple(procs), devices=(device,)
    )
    for _ in range(3):
        out = processor.process(batch)
    assert [(s.pid, s.energy_mj, s.mode, s.gpu_instance_id) for s in out.shares if s.pid is not None] == [
        (1, 501, "mig_equal", 1),
        (2, 500, "mig_equal", 2),
    ]
    assert caplog.text.count("no instance activity or layout") == 1


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


def test_the_first_record_of_a_pid_listed_twice_is_the_one_used_and_interleaved_devices_are_grouped() -> None:
    # Two receivers may list one device's processes apart (G, H, G): each device gets all of its own.
    batch = _run(
        [_power("G", 100), _power("H", 90)],
        [
            GpuProcessSample(time=T, device_id="G", pid=1, sm_util=0.75),
            GpuProcessSample(time=T, device_id="H", pid=7, sm_util=0.5),
            GpuProcessSample(time=T, device_id="G", pid=1, sm_util=0.0),  # the same pid again: ignored
            GpuProcessSample(time=T, device_id="G", pid=2, sm_util=0.25),
            GpuProcessSample(time=T, device_id="H", pid=8, sm_util=0.25),
        ],
    )
    split = {(s.device_id, s.pid): s.energy_mj for s in batch.shares if s.pid is not None}
    assert split == {("G", 1): 75, ("G", 2): 25, ("H", 7): 60, ("H", 8): 30}


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


# --- MIG shares ---------------------------------------------------------------------------------


def _mig_batch(
    t: Timestamp,
    active_mj: int,
    procs: list[tuple[int, int]],
    layout: dict[int, str],
    activity: dict[int, float | None],
) -> Batch:
    return Batch(time=t, interval_s=5.0, node="n").replace(
        devices=(DeviceSample(time=t, device_id="G", mig_enabled=True),),
        device_power=(
            DevicePower(
                time=t, device_id="G", interval_s=5.0, power_w=active_mj / 5000, idle_w=None,
                active_w=active_mj / 5000, energy_mj=active_mj, idle_energy_mj=0, active_energy_mj=active_mj,
            ),
        ),
        gpu_processes=tuple(GpuProcessSample(time=t, device_id="G", pid=p, gpu_instance_id=gi) for p, gi in procs),
        mig_instances=tuple(
            MigInstance(time=t, device_id="G", gpu_instance_id=gi, profile=prof, compute_slices=int(prof[0]))
            for gi, prof in layout.items()
        ),
        mig_activity=tuple(
            MigActivity(time=t, device_id="G", gpu_instance_id=gi, gr_engine_active=a) for gi, a in activity.items()
        ),
    )  # fmt: skip


LAYOUT = {1: "3g.40gb", 2: "1g.10gb", 3: "2g.20gb"}


def _processor(**options: object) -> AttributionProcessor:
    return AttributionProcessor(AttributionConfig(**options), make_context("attribution", "processor", SteppedClock()))


def test_mig_instances_weigh_activity_by_compute_slices_then_split_equally_inside() -> None:
    # 3g at 0.5 → 1.5; 1g at 1.0 → 1.0; 2g idle → 0. Instance 1 has two processes, instance 2 one.
    batch = _mig_batch(T, 2_500_000, [(10, 1), (11, 1), (20, 2)], LAYOUT, {1: 0.5, 2: 1.0, 3: 0.0})
    out = _processor().process(batch)
    by_pid = {s.pid: (s.energy_mj, s.gpu_instance_id, s.mode) for s in out.shares}
    assert by_pid == {
        None: (0, None, "mig"),
        10: (750_000, 1, "mig"),
        11: (750_000, 1, "mig"),
        20: (1_000_000, 2, "mig"),
    }


def test_an_active_instance_without_a_visible_process_keeps_its_part_in_the_remainder() -> None:
    batch = _mig_batch(T, 1_000_000, [(20, 2)], LAYOUT, {1: 1.0, 2: 1.0})  # 3g busy, nobody seen on it
    out = _processor().process(batch)
    assert {s.pid: s.energy_mj for s in out.shares} == {None: 750_000, 20: 250_000}


def test_sm_active_stands_in_when_gr_engine_active_is_missing() -> None:
    batch = _mig_batch(T, 400, [(10, 1), (20, 2)], LAYOUT, {})
    batch = batch.replace(
        mig_activity=(
            MigActivity(time=T, device_id="G", gpu_instance_id=1, sm_active=1.0),
            MigActivity(time=T, device_id="G", gpu_instance_id=2, sm_active=1.0),
        )
    )
    out = _processor().process(batch)
    assert {s.pid: s.energy_mj for s in out.shares} == {None: 0, 10: 300, 20: 100}


def test_dcgm_outage_holds_the_last_activity_then_falls_back_to_slices(caplog: pytest.LogCaptureFixture) -> None:
    proc = _processor(activity_hold=60.0)
    t0 = T
    proc.process(_mig_batch(t0, 1000, [(10, 1), (20, 2)], LAYOUT, {1: 0.2, 2: 1.0}))  # weights 0.6 : 1.0
    held = proc.process(
        _mig_batch(Timestamp(t0.monotonic_s + 30, t0.wall_s + 30), 1600, [(10, 1), (20, 2)], LAYOUT, {})
    )
    assert {s.pid: (s.energy_mj, s.mode) for s in held.shares} == {
        None: (0, "mig_held"),
        10: (600, "mig_held"),
        20: (1000, "mig_held"),
    }
    late = proc.process(
        _mig_batch(Timestamp(t0.monotonic_s + 90, t0.wall_s + 90), 1600, [(10, 1), (20, 2)], LAYOUT, {})
    )
    assert {s.pid: (s.energy_mj, s.mode) for s in late.shares} == {
        None: (0, "mig_slices"),
        10: (1200, "mig_slices"),  # 3 slices : 1 slice
        20: (400, "mig_slices"),
    }
    back = proc.process(
        _mig_batch(Timestamp(t0.monotonic_s + 95, t0.wall_s + 95), 1600, [(10, 1), (20, 2)], LAYOUT, {1: 1.0, 2: 1.0})
    )
    assert {s.mode for s in back.shares} == {"mig"}
    assert "holding each instance's last activity" in caplog.text
    assert "splitting by compute slices" in caplog.text


@given(
    st.integers(0, 10**9),
    st.lists(st.tuples(st.integers(1, 500), st.sampled_from([1, 2, 3, None])), max_size=12, unique_by=lambda t: t[0]),
    st.dictionaries(st.sampled_from([1, 2, 3, 4]), st.floats(0, 1, allow_nan=False), max_size=4),
)
def test_mig_split_is_exact(active: int, procs: list[tuple[int, int | None]], activity: dict[int, float]) -> None:
    slices = {1: 3, 2: 1, 3: 2}
    split = split_mig(active, procs, slices, {gi: a * slices.get(gi, 1) for gi, a in activity.items()})
    assert sum(split.by_pid.values()) + split.unattributed_mj == active
    assert all(v >= 0 for v in split.by_pid.values())
    assert split.unattributed_mj >= 0


@pytest.mark.parametrize("reason", ["gap", "processes_unknown"])
def test_an_unattributable_tick_bills_nobody_and_keeps_its_energy_visible(
    reason: Literal["gap", "processes_unknown"],
) -> None:
    # Who used the GPU over a long outage, or while its process list failed, is not known: the active
    # energy stays unattributed (explicit, with the reason as its mode) instead of going to whoever is
    # listed now (14.1, 14.7).
    power = dataclasses.replace(_power("G", 1_000_000, idle_mj=350_000), unattributable=reason)
    procs = [GpuProcessSample(time=T, device_id="G", pid=p, sm_util=0.5) for p in (1, 2)]
    batch = _run([power], procs)
    assert [(s.pid, s.energy_mj, s.mode) for s in batch.shares] == [(None, 1_000_000, reason)]


def test_a_process_that_started_mid_window_is_weighed_from_its_start() -> None:
    # Window 100–102 s; busy at 0.8 from its start at 101.5 s to the end: 0.8 × 0.25, not 0.8.
    assert since_start(0.8, 0.8, 101.5, 100.0, 2.0) == pytest.approx(0.2)
    # Started before the window, or no start time, no busy mean, no window: unchanged.
    assert since_start(0.8, 0.8, 99.0, 100.0, 2.0) == 0.8
    assert since_start(0.8, None, 101.5, 100.0, 2.0) == 0.8
    assert since_start(0.8, 0.8, None, 100.0, 2.0) == 0.8
    assert since_start(0.8, 0.8, 101.5, 100.0, None) == 0.8


@given(
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=-10, max_value=10),
    st.floats(min_value=0.01, max_value=10),
)
def test_weighing_from_the_start_never_adds_and_never_goes_negative(
    coverage: float, busy: float, start_offset_s: float, window_s: float
) -> None:
    weight = busy * coverage
    out = since_start(weight, busy, 1000.0 + start_offset_s, 1000.0, window_s)
    assert 0.0 <= out <= weight


def test_a_process_that_started_mid_tick_is_weighed_from_its_start_not_the_ticks() -> None:
    # Issue 15.2: both busy at 0.8 until the end of a 2 s tick, but pid 2 started 1 s in (procfs says so):
    # it used half what pid 1 did. Without the start time the driver's one entry made them equal.
    window = dict(util_window_s=2.0, sm_util=0.8, sm_util_busy=0.8)
    procs = [GpuProcessSample(time=T, device_id="G", pid=p, **window) for p in (1, 2)]  # type: ignore[arg-type]
    hosts = (
        HostProcess(time=T, pid=1, start_wall_s=T.wall_s - 3600.0),
        HostProcess(time=T, pid=2, start_wall_s=T.wall_s - 1.0),
    )
    clock = SteppedClock()
    processor = AttributionProcessor(AttributionConfig(), make_context("attribution", "processor", clock))
    batch = Batch(time=T, interval_s=2.0, node="n").replace(
        device_power=(_power("G", 900_000, interval_s=2.0),), gpu_processes=tuple(procs), host_processes=hosts
    )
    out = processor.process(batch)
    assert [(s.pid, s.energy_mj) for s in out.shares if s.pid is not None] == [(1, 600_000), (2, 300_000)]
    assert sum(s.energy_mj for s in out.shares) == 900_000
