"""The saturation processor on hand-built records: every signal's arithmetic, absence, attribution, config."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DeviceAllocation, DeviceSignals, MigActivity, MigInstance, Saturation
from wattpipe.processors.saturation import SaturationConfig, SaturationProcessor

GPU = "GPU-00000000-0000-0000-0000-000000000001"
GIB = 1024**3


def _ts(t: float) -> Timestamp:
    return Timestamp(t, 1_700_000_000 + t)


def _batch(t: float, fields: dict[str, float], **more: object) -> Batch:
    signals = DeviceSignals(time=_ts(t), device_id=GPU, fields=tuple(sorted(fields.items())))
    return Batch(time=_ts(t), interval_s=1.0, node="n").with_records([signals]).replace(**more)


def _run(processor: SaturationProcessor, ticks: list[tuple[float, dict[str, float]]], **more: object) -> Batch:
    out = None
    for t, fields in ticks:
        out = processor.process(_batch(t, fields, **more))
    assert out is not None
    return out


def _device(batch: Batch) -> dict[str, float]:
    return {s.signal: s.value for s in batch.saturation if s.pod_name is None and s.gpu_instance_id is None}


def test_power_throttle_ratio_is_counter_delta_over_elapsed_time() -> None:
    # 0.25 s of every second power-capped, for 120 s; the window (60 s) sees a ratio of 0.25.
    ticks = [(float(t), {"power_violation_s": 0.25 * t}) for t in range(121)]
    values = _device(_run(SaturationProcessor(SaturationConfig()), ticks))
    assert values["throttle_power"] == pytest.approx(0.25)
    assert "throttle_thermal" not in values  # its counter is absent: no series, not 0


def test_throttle_ratio_is_clamped_and_survives_a_counter_reset() -> None:
    ticks = [
        (0.0, {"thermal_violation_s": 10.0}),
        (1.0, {"thermal_violation_s": 11.5}),
        (2.0, {"thermal_violation_s": 0.5}),
    ]
    values = _device(_run(SaturationProcessor(SaturationConfig()), ticks))
    # 1.5 s in 1 s is clamped to 1; after the reset, the 0.5 s the counter holds is the increase: (1.5 + 0.5) / 2 → 1.
    assert values["throttle_thermal"] == 1.0
    ticks = [
        (0.0, {"thermal_violation_s": 10.0}),
        (1.0, {"thermal_violation_s": 10.2}),
        (2.0, {"thermal_violation_s": 0.2}),
    ]
    assert _device(_run(SaturationProcessor(SaturationConfig()), ticks))["throttle_thermal"] == pytest.approx(0.2)


def test_clock_event_ratio_counts_observations_with_the_bit() -> None:
    masks = [0x4, 0x4 | 0x1, 0x1, 0x40, 0x0]
    ticks = [(float(t), {"clocks_event_reasons": float(m)}) for t, m in enumerate(masks)]
    values = _device(_run(SaturationProcessor(SaturationConfig()), ticks))
    assert values["clock_event_sw_power_cap"] == pytest.approx(2 / 5)
    assert values["clock_event_hw_thermal"] == pytest.approx(1 / 5)
    assert values["clock_event_hw_slowdown"] == 0.0  # the bitmask was there: 0 is an observation
    assert not any(name.endswith("idle") for name in values)  # gpu_idle is not saturation


def test_memory_used_and_pressure() -> None:
    used = [10, 20, 72, 76, 80]  # of 80 GiB: 0.125 0.25 0.9 0.95 1.0
    ticks = [(float(t), {"fb_used_bytes": u * GIB, "fb_free_bytes": (80 - u) * GIB}) for t, u in enumerate(used)]
    values = _device(_run(SaturationProcessor(SaturationConfig()), ticks))
    assert values["memory_used_avg"] == pytest.approx(sum(used) / 80 / 5)
    assert values["memory_used_max"] == 1.0
    assert values["memory_pressure"] == pytest.approx(3 / 5)  # at or above 0.9


def test_xid_from_dcgm_counts_changes_of_the_last_code() -> None:
    codes = [31, 31, 0, 79, 79, 13]  # the first is history; then 79 and 13 are new
    ticks = [(float(t), {"xid_last": float(c)}) for t, c in enumerate(codes)]
    assert _device(_run(SaturationProcessor(SaturationConfig()), ticks))["xid_count"] == 2.0


def test_xid_from_nvml_event_count_is_exact_and_preferred() -> None:
    ticks = [(float(t), {"xid_count": float(c), "xid_last": 13.0}) for t, c in enumerate([4, 4, 6, 9])]
    assert _device(_run(SaturationProcessor(SaturationConfig()), ticks))["xid_count"] == 5.0


def test_activity_averages_and_maxima_and_rates() -> None:
    ticks = [
        (float(t), {"dram_active": d, "sm_active": s, "sm_occupancy": o, "pcie_tx_bytes_per_s": p})
        for t, (d, s, o, p) in enumerate([(0.2, 0.5, 0.1, 1e9), (0.4, 0.9, 0.3, 3e9)])
    ]
    values = _device(_run(SaturationProcessor(SaturationConfig()), ticks))
    assert values["dram_active_avg"] == pytest.approx(0.3)
    assert values["dram_active_max"] == pytest.approx(0.4)
    assert values["sm_active_avg"] == pytest.approx(0.7)
    assert values["sm_occupancy_max"] == pytest.approx(0.3)
    assert values["pcie_tx_bytes_per_s"] == pytest.approx(2e9)
    assert "nvlink_tx_bytes_per_s" not in values


def test_window_slides_old_observations_out() -> None:
    # Throttled for the first 100 s, then not: a 30 s window at 200 s sees 0.
    ticks = [(float(t), {"power_violation_s": float(min(t, 100))}) for t in range(201)]
    values = _device(_run(SaturationProcessor(SaturationConfig(window=30.0)), ticks))
    assert values["throttle_power"] == 0.0


def test_no_source_means_no_record() -> None:
    batch = SaturationProcessor(SaturationConfig()).process(_batch(0.0, {"power_w": 100.0}))
    assert batch.saturation == ()
    assert "saturation" in batch.present


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.5, float("nan")])
def test_invalid_pressure_threshold_is_rejected_at_config_time(threshold: float) -> None:
    with pytest.raises(ValidationError, match="memory_pressure_threshold"):
        SaturationConfig(memory_pressure_threshold=threshold)


def test_exclusive_and_shared_pods() -> None:
    allocations = (
        DeviceAllocation(
            time=_ts(0),
            device_id=GPU,
            resource_name="nvidia.com/gpu",
            pod_name="a",
            pod_namespace="ns",
            container_name="c",
        ),
    )
    batch = _run(
        SaturationProcessor(SaturationConfig()), [(0.0, {"clocks_event_reasons": 4.0})], allocations=allocations
    )
    pods = [s for s in batch.saturation if s.pod_name is not None]
    assert {(s.pod_name, s.saturation_scope, s.value) for s in pods if s.signal == "clock_event_sw_power_cap"} == {
        ("a", "exclusive", 1.0)
    }
    shared = tuple(
        DeviceAllocation(
            time=_ts(0),
            device_id=GPU,
            resource_name="nvidia.com/gpu.shared",
            pod_name=name,
            pod_namespace="ns",
            container_name="c",
            replica=i,
        )
        for i, name in enumerate(["a", "b"])
    )
    batch = _run(SaturationProcessor(SaturationConfig()), [(0.0, {"clocks_event_reasons": 4.0})], allocations=shared)
    got = {
        (s.pod_name, s.saturation_scope, s.value) for s in batch.saturation if s.signal == "clock_event_sw_power_cap"
    }
    assert got == {(None, "device", 1.0), ("a", "device_shared", 1.0), ("b", "device_shared", 1.0)}


def test_mig_instance_signals_and_the_physical_gpu_bitmask() -> None:
    mig_uuid = "MIG-11111111-2222-3333-4444-555555555555"
    t = _ts(0)
    activity = MigActivity(
        time=t, device_id=GPU, gpu_instance_id=3, fields=(("fb_total_bytes", 10.0 * GIB), ("fb_used_bytes", 9.5 * GIB))
    )
    instance = MigInstance(time=t, device_id=GPU, gpu_instance_id=3, profile="1g.10gb", mig_uuid=mig_uuid)
    allocation = DeviceAllocation(
        time=t,
        device_id=mig_uuid,
        resource_name="nvidia.com/mig-1g.10gb",
        pod_name="p",
        pod_namespace="ns",
        container_name="c",
    )
    batch = _batch(0.0, {"clocks_event_reasons": 0x20}).with_records([activity, instance, allocation])
    out = SaturationProcessor(SaturationConfig()).process(batch)
    rows = {(s.gpu_instance_id, s.pod_name, s.signal): (s.saturation_scope, s.value) for s in out.saturation}
    assert rows[(3, None, "memory_used_max")] == ("instance", pytest.approx(0.95))
    assert rows[(3, None, "memory_pressure")] == ("instance", 1.0)
    assert rows[(3, "p", "memory_used_max")] == ("instance", pytest.approx(0.95))
    assert rows[(3, "p", "clock_event_sw_thermal")] == ("physical_gpu", 1.0)  # the board's, said so
    assert (3, None, "clock_event_sw_thermal") not in rows  # never put on the instance's own series


def test_a_mig_pod_gets_only_the_boards_signals_from_the_whole_gpu() -> None:
    # NVML's memory info and the GPU-level activity describe the whole board, not the pod's instance: a pod in
    # a MIG instance gets only what the hardware has once per GPU (throttles, clock events, XIDs), said so.
    mig_uuid = "MIG-11111111-2222-3333-4444-555555555555"
    t = _ts(0)
    instance = MigInstance(time=t, device_id=GPU, gpu_instance_id=3, profile="1g.10gb", mig_uuid=mig_uuid)
    allocation = DeviceAllocation(
        time=t, device_id=mig_uuid, resource_name="nvidia.com/mig-1g.10gb", pod_name="p", pod_namespace="ns",
        container_name="c",
    )  # fmt: skip
    whole = {"clocks_event_reasons": 0x4, "fb_used_bytes": 76.0 * GIB, "fb_total_bytes": 80.0 * GIB, "sm_active": 0.9}
    out = SaturationProcessor(SaturationConfig()).process(_batch(0.0, whole).with_records([instance, allocation]))
    pod = {s.signal: s.saturation_scope for s in out.saturation if s.pod_name == "p"}
    assert pod["clock_event_sw_power_cap"] == "physical_gpu"
    assert "memory_pressure" not in pod  # the board's 95 % is not the instance's framebuffer
    assert "sm_active_avg" not in pod
    assert _device(out)["memory_pressure"] == 1.0  # still on the GPU's own series


@settings(max_examples=60, deadline=None)
@given(
    fractions=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=40),
    step_s=st.floats(min_value=0.1, max_value=5.0),
)
def test_throttle_ratio_matches_the_time_weighted_truth(fractions: list[float], step_s: float) -> None:
    # Each interval throttled for fraction × step_s; with a window longer than the run the ratio is exact.
    counter, ticks = 0.0, [(0.0, {"board_limit_violation_s": 0.0})]
    for i, f in enumerate(fractions[1:], start=1):
        counter += f * step_s
        ticks.append((i * step_s, {"board_limit_violation_s": counter}))
    value = _device(_run(SaturationProcessor(SaturationConfig(window=1e6)), ticks))["throttle_board_limit"]
    assert value == pytest.approx(sum(fractions[1:]) / (len(fractions) - 1), abs=1e-9)
    assert 0.0 <= value <= 1.0


def test_records_are_saturation_records() -> None:
    out = SaturationProcessor(SaturationConfig()).process(_batch(0.0, {"sm_active": 0.5}))
    assert all(isinstance(s, Saturation) for s in out.saturation)
    assert [s.signal for s in out.saturation] == ["sm_active_avg", "sm_active_max"]


def test_a_device_not_seen_for_a_window_is_forgotten() -> None:
    processor = SaturationProcessor(SaturationConfig(window=30.0))
    processor.process(_batch(0.0, {"sm_active": 0.5}))
    assert (GPU, None, "dcgm") in processor.window._observations
    empty = Batch(time=_ts(31.0), interval_s=1.0, node="n").replace(device_signals=())
    out = processor.process(empty)
    assert out.saturation == ()  # absent this tick: no series, and the old window is not reported
    assert not processor.window._observations  # memory stays bounded
