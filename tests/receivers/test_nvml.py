"""The nvml receiver against the simulator's NVML library (pynvml's own wrappers run for real)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.context import make_context
from tests.helpers.nvml_hang import Hang
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DeviceSample, GpuProcessSample, MigInstance, Record
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.receivers.nvml import NvmlConfig, NvmlReceiver
from wattpipe.receivers.nvml._device import integrate_utilisation
from wattpipe.receivers.nvml._mig import compute_slices, profile_from_name
from wattpipe.simulator.scenario import parse_scenario


def scenario(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "node": {"name": "n1"},
        "gpus": [
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700},
            {"model": "NVIDIA H100 80GB HBM3", "idle_w": 80, "max_w": 700},
        ],
        "processes": [
            {"pid": 10, "comm": "a", "gpu": 0, "dynamic_w": 200, "util": [[0, 0.5], [10, 1.0]]},
            {"pid": 11, "comm": "b", "gpu": 0, "dynamic_w": 200, "util": [[0, 0.5], [10, 0.0]]},
            {"pid": 20, "comm": "c", "gpu": 1, "dynamic_w": 300, "util": [[0, 0.8]], "start_s": 2.5},
        ],
    }
    data.update(overrides)
    return data


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


class Harness:
    def __init__(self, data: dict[str, Any], clock: SteppedClock, **options: Any) -> None:
        self.clock = clock
        self.node = simulator.install(parse_scenario(data), clock)
        telemetry = Telemetry(clock)
        ctx = make_context("nvml", "receiver", clock, telemetry=telemetry)
        self.receiver = NvmlReceiver(NvmlConfig(**options), ctx)
        asyncio.run(self.receiver.start())

    def poll(self) -> tuple[list[DeviceSample], list[GpuProcessSample]]:
        records: list[Record] = list(asyncio.run(self.receiver.collect()))
        return (
            [r for r in records if isinstance(r, DeviceSample)],
            [r for r in records if isinstance(r, GpuProcessSample)],
        )

    def close(self) -> None:
        asyncio.run(self.receiver.shutdown())
        simulator.uninstall()


@pytest.fixture
def harness(clock: SteppedClock) -> Iterator[Harness]:
    h = Harness(scenario(), clock)
    yield h
    h.close()


def test_devices_are_enumerated_with_identity_power_and_counter(harness: Harness) -> None:
    harness.clock.advance(5.0)
    devices, _ = harness.poll()
    assert [d.device_index for d in devices] == [0, 1]
    assert all(d.vendor == "nvidia" and d.up and d.device_id.startswith("GPU-") for d in devices)
    assert devices[0].device_name == "NVIDIA H100 80GB HBM3"
    # 1-second average at t=5 on GPU 0: 100 W idle + 0.5·200 + 0.5·200
    assert devices[0].power_w == pytest.approx(300.0)
    assert devices[0].compute_mode == "default"
    assert devices[0].mig_enabled is False


def test_energy_counter_delta_matches_the_truth_integral(harness: Harness) -> None:
    harness.clock.advance(1.0)
    first, _ = harness.poll()
    harness.clock.advance(12.0)
    second, _ = harness.poll()
    for gpu in (0, 1):
        delta_j = (second[gpu].energy_mj - first[gpu].energy_mj) / 1000.0  # type: ignore[operator]
        truth_j = harness.node.truth.device_energy_between_j(gpu, 1.0, 13.0)
        assert delta_j == pytest.approx(truth_j, abs=0.002)  # the counter is integer mJ


def test_utilisation_covers_exactly_the_tick_window(harness: Harness) -> None:
    harness.clock.advance(5.0)
    _, procs = harness.poll()
    util = {p.pid: p.sm_util for p in procs}
    assert util[10] == pytest.approx(0.5, abs=0.02)
    assert util[11] == pytest.approx(0.5, abs=0.02)
    harness.clock.advance(10.0)  # window 5–15 s: pid 10 goes to 1.0 at 10 s, pid 11 to 0 (no samples)
    _, procs = harness.poll()
    util = {p.pid: p.sm_util for p in procs}
    assert util[10] == pytest.approx(0.75, abs=0.03)
    assert util[11] == pytest.approx(0.25, abs=0.01)  # idle after 10 s
    assert [p.util_window_s for p in procs if p.device_id == procs[0].device_id] == [pytest.approx(10.0)] * 2


def test_process_started_mid_tick_counts_as_busy_throughout(harness: Harness) -> None:
    harness.clock.advance(10.0)  # pid 20 runs from 2.5 s at 0.8
    _, procs = harness.poll()
    (p20,) = [p for p in procs if p.pid == 20]
    # One entry per process cannot say when a process *started* being busy: the documented limit.
    assert p20.sm_util == pytest.approx(0.8, abs=0.03)


def test_process_that_exited_mid_tick_is_kept_with_its_part(clock: SteppedClock) -> None:
    data = scenario(processes=[{"pid": 7, "comm": "short", "gpu": 0, "util": [[0, 1.0]], "end_s": 3}])
    h = Harness(data, clock)
    try:
        clock.advance(10.0)
        _, procs = h.poll()
        (p7,) = procs
        assert p7.pid == 7
        assert p7.used_memory_bytes is None  # not in the running list any more
        assert p7.sm_util == pytest.approx(0.30, abs=0.02)  # busy 3 s of 10
    finally:
        h.close()


def test_first_tick_ignores_samples_from_before_start(clock: SteppedClock) -> None:
    h = Harness(scenario(), clock)
    try:
        _, procs = h.poll()  # no time has passed since start: nothing new, observed zero
        assert {p.pid: p.sm_util for p in procs} == {10: 0.0, 11: 0.0}
    finally:
        h.close()


def test_idle_gpu_processes_report_zero_not_absent(clock: SteppedClock) -> None:
    data = scenario(processes=[{"pid": 5, "comm": "idle", "gpu": 0, "util": [[0, 0.0]]}])
    h = Harness(data, clock)
    try:
        clock.advance(5.0)
        _, procs = h.poll()
        assert [(p.pid, p.sm_util) for p in procs] == [(5, 0.0)]
    finally:
        h.close()


def test_gpu_without_energy_counter_reports_it_absent(clock: SteppedClock) -> None:
    data = scenario(gpus=[{"model": "Tesla P100-PCIE-16GB", "idle_w": 30, "max_w": 250, "energy_counter": False}])
    data["processes"] = []
    h = Harness(data, clock)
    try:
        clock.advance(2.0)
        (device,), _ = h.poll()
        assert device.energy_mj is None
        assert device.power_w == pytest.approx(30.0)
    finally:
        h.close()


def test_lost_gpu_is_marked_down_others_flow_and_it_comes_back(clock: SteppedClock) -> None:
    data = scenario(
        faults=[
            {
                "at_s": 5,
                "for_s": 20,
                "target": "nvml",
                "gpu": 1,
                "call": "nvmlDeviceGetPowerUsage",
                "error": "GPU_IS_LOST",
            }
        ]
    )
    h = Harness(data, clock, reinit_backoff=5.0)
    try:
        ups = []
        for _ in range(8):
            clock.advance(5.0)
            devices, _ = h.poll()
            ups.append([d.up for d in devices])
            assert devices[0].power_w is not None  # GPU 0 unaffected throughout
        # t=5..25 lost; retries at 10, 20 (backoff 5 then 10) fail; t=40 retry succeeds
        assert ups[0] == [True, False]
        assert all(u[1] is False for u in ups[1:5])
        assert ups[-1] == [True, True]
        # Counted per failed read: at 5 s, and the re-acquisitions at 10 and 20 s.
        assert h.receiver.failures.value(gpu="1", reason="lost") == 3
        assert h.receiver.failures.value(gpu="0", reason="lost") == 0
        down = [d for d in h.poll()[0] if d.device_index == 1]
        assert down[0].power_w is not None
    finally:
        h.close()


def test_a_gpu_lost_again_after_it_came_back_starts_from_the_first_backoff(clock: SteppedClock) -> None:
    lost = {"target": "nvml", "gpu": 1, "call": "nvmlDeviceGetPowerUsage", "error": "GPU_IS_LOST"}
    h = Harness(scenario(faults=[{**lost, "at_s": 5, "for_s": 7}, {**lost, "at_s": 30, "for_s": 3}]), clock,
                reinit_backoff=5.0)  # fmt: skip
    try:
        ups = []
        for _ in range(7):  # ticks at 5 … 35 s
            clock.advance(5.0)
            ups.append(next(d.up for d in h.poll()[0] if d.device_index == 1))
        # Lost at 5 s; tried at 10 s (backoff 5 s, fails), at 20 s (backoff 10 s): back. Lost again at 30 s:
        # the backoff starts over at 5 s, so it is back at 35 s (not at 50 s, where a doubled 20 s would put it).
        assert ups == [False, False, False, True, True, False, True]
    finally:
        h.close()


def test_mig_processes_carry_instance_ids_and_no_process_utilisation(clock: SteppedClock) -> None:
    data = scenario(
        gpus=[
            {
                "model": "NVIDIA A100-SXM4-40GB",
                "idle_w": 50,
                "max_w": 400,
                "mig": {"instances": [{"gi": 1, "profile": "3g.20gb"}, {"gi": 2, "profile": "1g.5gb"}]},
            }
        ],
        processes=[
            {"pid": 41, "comm": "x", "gpu": 0, "gi": 1, "util": [[0, 0.5]]},
            {"pid": 42, "comm": "y", "gpu": 0, "gi": 2, "util": [[0, 0.5]]},
        ],
    )
    h = Harness(data, clock)
    try:
        clock.advance(5.0)
        (device,), procs = h.poll()
        assert device.mig_enabled is True
        assert sorted((p.pid, p.gpu_instance_id, p.sm_util) for p in procs) == [(41, 1, None), (42, 2, None)]
    finally:
        h.close()


def test_mig_switched_off_is_honoured_on_the_next_tick(clock: SteppedClock) -> None:
    data = scenario(
        gpus=[
            {
                "model": "NVIDIA A100-SXM4-40GB",
                "idle_w": 50,
                "max_w": 400,
                "mig": {"instances": [{"gi": 1, "profile": "7g.40gb"}]},
            }
        ],
        processes=[{"pid": 41, "comm": "x", "gpu": 0, "gi": 1, "util": [[0, 0.5]]}],
        faults=[{"at_s": 10, "target": "gpu", "gpu": 0, "set": {"mig": None}}],
    )
    h = Harness(data, clock)
    try:
        clock.advance(5.0)
        (before,), _ = h.poll()
        clock.advance(10.0)
        (after,), procs = h.poll()
        assert (before.mig_enabled, after.mig_enabled) == (True, False)
        assert [p.gpu_instance_id for p in procs] == [None]  # now a whole GPU: time-slicing shares
    finally:
        h.close()


def test_devices_option_selects_by_uuid_or_index(clock: SteppedClock) -> None:
    h = Harness(scenario(), clock, devices=["1"])
    try:
        devices, procs = h.poll()
        assert [d.device_index for d in devices] == [1]
        assert {p.device_id for p in procs} <= {devices[0].device_id}
    finally:
        h.close()


def test_no_driver_means_no_devices_and_no_crash(clock: SteppedClock, caplog: pytest.LogCaptureFixture) -> None:
    simulator.uninstall()  # the real library is absent on test machines
    telemetry = Telemetry(clock)
    ctx = make_context("nvml", "receiver", clock, telemetry=telemetry)
    receiver = NvmlReceiver(NvmlConfig(), ctx)
    with caplog.at_level(logging.WARNING):
        asyncio.run(receiver.start())
    assert list(asyncio.run(receiver.collect())) == []
    assert any("NVML is not available" in r.message for r in caplog.records)
    required = NvmlReceiver(NvmlConfig(required=True), ctx)
    with pytest.raises(RuntimeError, match="required"):
        asyncio.run(required.start())


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 20), st.floats(-10, 150, allow_nan=False)), min_size=0, max_size=40
    )
)
def test_integrated_utilisation_stays_within_0_and_1(samples: list[tuple[int, int, float]]) -> None:
    util = integrate_utilisation(samples, 0, 20)
    assert 0 not in util  # pid 0 is driver garbage
    assert set(util) == {pid for pid, _, _ in samples if pid > 0}
    for value in util.values():
        assert 0.0 <= value <= 1.0 + 1e-9


@given(st.integers(2, 30), st.integers(1, 30))
def test_per_slot_buffers_count_missing_slots_as_idle(slots: int, busy: int) -> None:
    busy = min(busy, slots)
    # pid 1 busy at 100 % in `busy` of `slots` slots; pid 2 sampled in every slot (so every slot exists)
    samples = [(1, t, 100.0) for t in range(busy)] + [(2, t, 10.0) for t in range(slots)]
    util = integrate_utilisation(samples, -1, slots)
    assert util[1] == pytest.approx(busy / slots)
    assert util[2] == pytest.approx(0.1)


def test_one_entry_per_process_is_scaled_by_when_it_was_last_busy() -> None:
    s = 1_000_000
    util = integrate_utilisation([(1, 9_900_000, 80.0), (2, 5 * s, 60.0)], 0, 10 * s)
    assert util[1] == pytest.approx(0.8)  # its newest sample within the driver's lag of the end: busy to the end
    # Idle after 5 s: half the window, exactly. (A half-second grace after the last sample used to make
    # it 5.5 s: +10 % here, +50 % for a one-second burst in a two-second tick.)
    assert util[2] == pytest.approx(0.6 * 5 / 10)


def _mig_scenario(**extra: Any) -> dict[str, Any]:
    return scenario(
        gpus=[
            {
                "model": "NVIDIA H100 80GB HBM3",
                "idle_w": 75,
                "max_w": 700,
                "mig": {"instances": [{"gi": 2, "profile": "3g.40gb"}, {"gi": 9, "profile": "1g.10gb"}]},
            }
        ],
        processes=[
            {"pid": 41, "comm": "x", "gpu": 0, "gi": 2, "util": [[0, 0.5]]},
            {"pid": 42, "comm": "y", "gpu": 0, "gi": 9, "util": [[0, 0.9]]},
        ],
        **extra,
    )


def test_mig_layout_names_each_instance_with_profile_slices_and_uuid(clock: SteppedClock) -> None:
    h = Harness(_mig_scenario(), clock)
    try:
        clock.advance(5.0)
        records = list(asyncio.run(h.receiver.collect()))
        instances = [r for r in records if isinstance(r, MigInstance)]
        assert [(i.gpu_instance_id, i.profile, i.compute_slices) for i in instances] == [
            (2, "3g.40gb", 3),
            (9, "1g.10gb", 1),
        ]
        uuid = h.node.scenario.gpus[0].uuid
        assert [i.mig_uuid for i in instances] == [simulator.mig_uuid(uuid, 2), simulator.mig_uuid(uuid, 9)]
    finally:
        h.close()


def test_mig_layout_is_not_re_read_every_tick(clock: SteppedClock, monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    h = Harness(_mig_scenario(), clock, mig_layout_refresh=60.0)
    calls = {"n": 0}
    real = pynvml.nvmlDeviceGetMigDeviceHandleByIndex

    def counting(*args: Any) -> Any:
        calls["n"] += 1
        return real(*args)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", counting)
    try:
        for _ in range(6):  # 30 s of ticks: one layout read
            clock.advance(5.0)
            h.poll()
        first = calls["n"]
        assert first > 0
        for _ in range(7):  # to 65 s, 60 s after the first read at 5 s: read once more
            clock.advance(5.0)
            h.poll()
        assert calls["n"] == 2 * first
    finally:
        h.close()


def test_an_unknown_instance_in_the_process_list_rereads_the_layout_at_once(clock: SteppedClock) -> None:
    # At 10 s the GPU is repartitioned: GI 9 goes away, GI 5 (2g) appears with a process on it.
    data = _mig_scenario(
        faults=[
            {
                "at_s": 10,
                "target": "gpu",
                "gpu": 0,
                "set": {"mig": {"instances": [{"gi": 2, "profile": "3g.40gb"}, {"gi": 5, "profile": "2g.20gb"}]}},
            }
        ]
    )
    data["processes"].append({"pid": 43, "comm": "z", "gpu": 0, "gi": 5, "util": [[0, 0.7]], "start_s": 10})
    h = Harness(data, clock, mig_layout_refresh=3600.0)
    try:
        clock.advance(5.0)
        h.poll()
        clock.advance(10.0)
        records = list(asyncio.run(h.receiver.collect()))
        layout = sorted((i.gpu_instance_id, i.profile) for i in records if isinstance(i, MigInstance))
        assert layout == [(2, "3g.40gb"), (5, "2g.20gb")]
    finally:
        h.close()


@pytest.mark.parametrize(
    ("name", "profile", "slices"),
    [
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb", 3),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me", 1),
        ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", "7g.80gb", 7),
        ("NVIDIA H100 80GB HBM3", None, None),
    ],
)
def test_profile_and_slices_from_the_device_name(name: str, profile: str | None, slices: int | None) -> None:
    assert profile_from_name(name) == profile
    assert compute_slices(profile) == slices


# --- the array calls, made through ctypes with a kept buffer (receivers/nvml/_raw.py) ----------------


class CountingLibrary:
    """The installed simulated library, counting calls per symbol."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, collections.Counter[str]()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)

        def counted(*args: Any) -> Any:
            self.calls[name] += 1
            return fn(*args)

        return counted


def busy_processes(n: int, gpu: int = 0, first_pid: int = 1000, start_s: float = 0.0) -> list[dict[str, Any]]:
    return [
        {"pid": first_pid + i, "comm": "w", "gpu": gpu, "util": [[0, 0.01]], "memory_mib": 10 + i, "start_s": start_s}
        for i in range(n)
    ]


def test_process_list_and_samples_take_one_call_per_tick_once_the_buffer_fits(
    clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 processes at once outgrow the first buffer (16); later ticks need one call per array.
    data = scenario(
        gpus=[{"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700}], processes=busy_processes(40)
    )
    h = Harness(data, clock)
    try:
        counting = CountingLibrary(pynvml.nvmlLib)
        monkeypatch.setattr(pynvml, "nvmlLib", counting)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        clock.advance(5.0)
        _, first = h.poll()
        assert sorted(p.pid for p in first) == list(range(1000, 1040))
        assert {p.used_memory_bytes for p in first if p.pid == 1039} == {(10 + 39) * 2**20}
        assert counting.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # too small, grown, again
        assert counting.calls["nvmlDeviceGetProcessUtilization"] == 2
        counting.calls.clear()
        for _ in range(3):
            clock.advance(5.0)
            _, procs = h.poll()
            assert len(procs) == 40
            assert all(p.sm_util == pytest.approx(0.01, abs=0.002) for p in procs)
        assert counting.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 3
        assert counting.calls["nvmlDeviceGetProcessUtilization"] == 3
    finally:
        h.close()


def test_memory_the_driver_cannot_say_is_absent_for_that_process_only(
    clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # usedGpuMemory is all ones where the driver cannot say (WDDM): absent, not 16 EiB.
    h = Harness(
        scenario(gpus=[{"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700}], processes=busy_processes(3)),
        clock,
    )
    try:
        lib = pynvml.nvmlLib

        class Wddm:
            def __getattr__(self, name: str) -> Any:
                fn = getattr(lib, name)
                if name != "nvmlDeviceGetComputeRunningProcesses_v3":
                    return fn

                def unknown_memory_for_1001(handle: Any, count: Any, array: Any) -> int:
                    ret: int = fn(handle, count, array)
                    for entry in array[: count._obj.value]:
                        if entry.pid == 1001:
                            entry.usedGpuMemory = 0xFFFFFFFFFFFFFFFF
                    return ret

                return unknown_memory_for_1001

        monkeypatch.setattr(pynvml, "nvmlLib", Wddm())
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        clock.advance(5.0)
        _, procs = h.poll()
        assert {p.pid: p.used_memory_bytes for p in procs} == {1000: 10 * 2**20, 1001: None, 1002: 12 * 2**20}
    finally:
        h.close()


def test_more_processes_than_the_kept_buffer_are_all_read(clock: SteppedClock) -> None:
    # 3 processes first, then 200 more: the buffer sized for 3 grows within the tick, nobody is missed.
    procs = busy_processes(3) + busy_processes(200, first_pid=5000, start_s=7.0)
    h = Harness(
        scenario(gpus=[{"model": "NVIDIA H100 80GB HBM3", "idle_w": 100, "max_w": 700}], processes=procs), clock
    )
    try:
        clock.advance(5.0)
        assert len(h.poll()[1]) == 3
        clock.advance(5.0)
        _, after = h.poll()
        assert len(after) == 203
        assert len({p.pid for p in after}) == 203
    finally:
        h.close()


def test_a_failing_process_list_is_named_and_absent_and_the_device_still_reports(
    clock: SteppedClock, caplog: pytest.LogCaptureFixture
) -> None:
    fault = {"at_s": 0, "target": "nvml", "call": "nvmlDeviceGetComputeRunningProcesses", "error": "NO_PERMISSION"}
    h = Harness(scenario(faults=[fault]), clock)
    try:
        with caplog.at_level(logging.WARNING):
            clock.advance(5.0)
            devices, procs = h.poll()
        assert [d.power_w is not None for d in devices] == [True, True]
        assert procs == []
        assert "nvmlDeviceGetComputeRunningProcesses: Insufficient Permissions" in caplog.text
    finally:
        h.close()


def test_a_driver_without_the_symbols_reports_no_processes_not_an_error(
    clock: SteppedClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(scenario(), clock)
    try:
        lib = pynvml.nvmlLib

        class OldDriver:
            def __getattr__(self, name: str) -> Any:
                if name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization"):
                    raise AttributeError(name)
                return getattr(lib, name)

        monkeypatch.setattr(pynvml, "nvmlLib", OldDriver())
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        with caplog.at_level(logging.WARNING):
            clock.advance(5.0)
            devices, procs = h.poll()
        assert len(devices) == 2
        assert all(d.up for d in devices)
        assert procs == []
        assert "nvmlDeviceGetComputeRunningProcesses" not in caplog.text  # NotSupported: absent, quietly
    finally:
        h.close()


def test_a_gpu_that_cannot_be_opened_at_start_is_tried_again_with_backoff(
    clock: SteppedClock, caplog: pytest.LogCaptureFixture
) -> None:
    fault = {"at_s": 0, "for_s": 17, "target": "nvml", "gpu": 1, "error": "GPU_IS_LOST"}
    with caplog.at_level(logging.INFO):
        h = Harness(scenario(faults=[fault]), clock, reinit_backoff=5.0)
    try:
        seen = []
        for _ in range(6):  # ticks at 5 … 30 s
            clock.advance(5.0)
            devices, _ = h.poll()
            seen.append([d.device_index for d in devices])
        # Tried at 5 s (fails, next in 10 s), at 15 s (fails, next in 20 s), at 35 s: opened then.
        assert seen == [[0]] * 6
        clock.advance(5.0)
        devices, procs = h.poll()
        assert [d.device_index for d in devices] == [0, 1]
        assert {p.pid for p in procs} == {10, 11, 20}
        assert h.receiver.failures.value(gpu="1", reason="open") == 3  # at start, 5 s and 15 s
        assert [r.getMessage() for r in caplog.records if "GPU 1" in r.getMessage()] == [
            "GPU 1 cannot be opened (nvmlDeviceGetHandleByIndex: GPU is lost): retrying in 5s",
            f"GPU 1 ({devices[1].device_id}) can be opened now: measuring it from this tick",
        ]
    finally:
        h.close()


def test_a_late_gpu_outside_the_devices_option_is_not_adopted(clock: SteppedClock) -> None:
    fault = {"at_s": 0, "for_s": 3, "target": "nvml", "gpu": 1, "error": "GPU_IS_LOST"}
    h = Harness(scenario(faults=[fault]), clock, reinit_backoff=5.0, devices=["0"])
    try:
        for _ in range(3):
            clock.advance(5.0)
            devices, _ = h.poll()
            assert [d.device_index for d in devices] == [0]
        assert h.receiver._unopened == {}  # opened, found not wanted, and forgotten
    finally:
        h.close()


def test_a_gpu_slower_than_device_timeout_is_counted_as_timeout_then_busy(
    clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = Harness(scenario(), clock, device_timeout=0.05)
    hung = Hang(pynvml.nvmlLib, "nvmlDeviceGetPowerUsage")
    release = hung.release
    try:
        monkeypatch.setattr(pynvml, "nvmlLib", hung)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        clock.advance(5.0)
        assert h.poll() == ([], [])  # both GPUs absent this tick, not zero
        clock.advance(5.0)
        assert h.poll() == ([], [])  # still answering the last tick: not asked again
        counts = {(g, r): h.receiver.failures.value(gpu=g, reason=r) for g in "01" for r in ("timeout", "busy")}
        assert counts == {("0", "timeout"): 1, ("0", "busy"): 1, ("1", "timeout"): 1, ("1", "busy"): 1}
        release.set()
        for slot in h.receiver.slots:
            assert slot.pending is not None
            slot.pending.result(timeout=5.0)
        clock.advance(5.0)
        devices, _ = h.poll()
        assert [d.power_w is not None for d in devices] == [True, True]
    finally:
        release.set()
        h.close()


class TickingClock(SteppedClock):
    """Moves 1 ms every time it is read: time passes between the tick's start and each GPU's read."""

    def now(self) -> Timestamp:
        stamp = super().now()
        self.advance(0.001)
        return stamp


def test_each_gpu_is_stamped_when_it_is_read_not_when_the_tick_began() -> None:
    clock = TickingClock()
    h = Harness(scenario(), clock)
    try:
        clock.advance(5.0)
        tick_start = clock.monotonic()
        devices, procs = h.poll()
        stamps = [d.time.monotonic_s for d in devices]
        assert all(s > tick_start for s in stamps)  # read after the tick began (worker threads start later)
        assert len(set(stamps)) == 2  # each GPU its own read time
        for p in procs:  # a GPU's processes carry its read time
            (device,) = [d for d in devices if d.device_id == p.device_id]
            assert p.time == device.time
    finally:
        h.close()


def test_a_failing_process_list_marks_the_device_processes_unknown_not_empty(clock: SteppedClock) -> None:
    # A failed listing is *unknown*: reported as "no process" it let idle learn busy power (issue 14.1).
    fault = {"at_s": 4, "for_s": 3, "target": "nvml", "gpu": 0, "call": "nvmlDeviceGetComputeRunningProcesses",
             "error": "NO_PERMISSION"}  # fmt: skip
    h = Harness(scenario(faults=[fault]), clock)
    try:
        known = []
        for _ in range(3):  # ticks at 5 (failing), 10 and 15 s
            clock.advance(5.0)
            devices, _ = h.poll()
            known.append([d.processes_known for d in devices])
        assert known == [[False, True], [True, True], [True, True]]
    finally:
        h.close()


def test_utilisation_window_is_the_tick_even_after_quiet_ticks(clock: SteppedClock) -> None:
    # A quiet minute (no samples at all), then a tick in which pid 10 is busy for its first second and
    # pid 11 throughout at 0.4: the window is that tick, not everything since the last sample (14.3).
    data = scenario(
        processes=[
            {"pid": 10, "comm": "a", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.0], [60, 1.0], [61, 0.0]]},
            {"pid": 11, "comm": "b", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.0], [60, 0.4]]},
        ]
    )
    h = Harness(data, clock)
    try:
        for _ in range(13):  # ticks at 5 … 65 s
            clock.advance(5.0)
            _, procs = h.poll()
        util = {p.pid: p.sm_util for p in procs}
        assert util[10] == pytest.approx(0.2, abs=0.03)  # busy 1 s of 5
        assert util[11] == pytest.approx(0.4, abs=0.03)
    finally:
        h.close()


def test_a_gpu_that_comes_back_starts_a_new_counter_epoch(clock: SteppedClock) -> None:
    # Its handle was re-acquired: the driver may have reloaded and the counter restarted (14.7).
    lost = {
        "at_s": 5,
        "for_s": 7,
        "target": "nvml",
        "gpu": 1,
        "call": "nvmlDeviceGetPowerUsage",
        "error": "GPU_IS_LOST",
    }
    h = Harness(scenario(faults=[lost]), clock, reinit_backoff=5.0)
    try:
        epochs = []
        for _ in range(4):  # 5 (lost), 10 (retry fails), 15 (waiting), 20 (back)
            clock.advance(5.0)
            epochs.append([(d.up, d.counter_epoch) for d in h.poll()[0]])
        assert [e[0] for e in epochs] == [(True, 0)] * 4
        assert [e[1] for e in epochs] == [(False, 0), (False, 0), (False, 0), (True, 1)]
    finally:
        h.close()


def test_the_drivers_busy_mean_is_kept_beside_the_scaled_utilisation(harness: Harness) -> None:
    # pid 11 is busy at 0.5 until 10 s, then idle: over 5–15 s it weighs 0.25, and its busy mean is 0.5.
    # pid 20 starts at 2.5 s at 0.8: the driver's one entry cannot say when it started, so the busy mean
    # travels with the record for attribution to combine with the start time /proc gives (issue 15.2).
    harness.clock.advance(5.0)
    harness.poll()
    harness.clock.advance(10.0)
    _, procs = harness.poll()
    by_pid = {p.pid: p for p in procs}
    assert by_pid[11].sm_util == pytest.approx(0.25, abs=0.01)
    assert by_pid[11].sm_util_busy == pytest.approx(0.5, abs=0.01)
    assert by_pid[20].sm_util_busy == pytest.approx(0.8, abs=0.01)
