"""The nvml receiver's saturation fields (``saturation: true``) against the simulator, through the processor."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from tests.helpers.context import make_context
from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import DeviceSignals
from wattpipe.processors.saturation import SaturationConfig, SaturationProcessor
from wattpipe.receivers.nvml import NvmlConfig, NvmlReceiver
from wattpipe.simulator.saturation_truth import true_signal

SCENARIO = Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "saturation.yaml"


def _run(
    saturation: bool, seconds: int = 120, window_s: float = 60.0, scenario: Path = SCENARIO
) -> tuple[Batch, NvmlReceiver, simulator.SimulatedNode]:
    clock = SteppedClock()
    node = simulator.install(scenario, clock)
    receiver = NvmlReceiver(NvmlConfig(saturation=saturation), make_context("nvml", "receiver", clock))
    processor = SaturationProcessor(SaturationConfig(window=window_s))
    try:
        asyncio.run(receiver.start())
        batch = None
        for _ in range(0, seconds, 5):
            clock.advance(5.0)
            records = asyncio.run(receiver.collect())
            batch = processor.process(Batch(time=clock.now(), interval_s=5.0, node="n").with_records(records))
        assert batch is not None
        return batch, receiver, node
    finally:
        asyncio.run(receiver.shutdown())
        simulator.uninstall()


@pytest.fixture(scope="module")
def measured() -> tuple[Batch, NvmlReceiver, simulator.SimulatedNode]:
    return _run(True)


def test_nvml_fields_are_device_signals_of_source_nvml(
    measured: tuple[Batch, NvmlReceiver, simulator.SimulatedNode],
) -> None:
    batch, receiver, _ = measured
    assert "device_signals" in receiver.provides
    assert {s.source for s in batch.device_signals} == {"nvml"}
    fields = dict(batch.device_signals[0].fields)
    assert set(fields) >= {"power_violation_s", "thermal_violation_s", "clocks_event_reasons", "fb_used_bytes"}


def test_nvml_signals_match_truth_within_0_01(measured: tuple[Batch, NvmlReceiver, simulator.SimulatedNode]) -> None:
    batch, _, node = measured
    uuids = [g.uuid for g in node.scenario.gpus]
    t1 = 120.0
    checked = 0
    for s in batch.saturation:
        if s.pod_name is not None or s.gpu_instance_id is not None:
            continue
        truth = true_signal(node, uuids.index(s.device_id), None, s.signal, t1 - s.window_s, t1)
        assert truth is not None, s.signal
        assert abs(s.value - truth) <= 0.01, (s.device_id, s.signal, s.value, truth)
        checked += 1
    values = {(s.device_id, s.signal): s.value for s in batch.saturation if s.pod_name is None}
    assert values[(uuids[0], "throttle_power")] == pytest.approx(1.0)
    assert values[(uuids[1], "throttle_thermal")] == pytest.approx(1.0)
    assert values[(uuids[1], "clock_event_sw_thermal")] == 1.0
    assert values[(uuids[2], "memory_pressure")] == 1.0
    assert values[(uuids[0], "xid_count")] == 0.0  # registered, none raised: an observed 0
    assert (uuids[0], "dram_active_avg") not in values  # a DCGM profiling field: absent without dcgm
    assert checked >= 40


def test_nvml_ratios_are_within_0_01_of_truth_across_a_throttle_onset() -> None:
    # NVML is read at the tick, so unlike dcgm-exporter's collections it has no lag: at 75 s the window
    # (15, 75] holds GPU 1's thermal throttling from 20 s for 55 of its 60 s, and every ratio matches truth.
    batch, _, node = _run(True, seconds=75)
    uuids = [g.uuid for g in node.scenario.gpus]
    values = {}
    for s in batch.saturation:
        if s.pod_name is None and s.gpu_instance_id is None:
            truth = true_signal(node, uuids.index(s.device_id), None, s.signal, 75.0 - s.window_s, 75.0)
            assert truth is not None, s.signal
            assert abs(s.value - truth) <= 0.01, (s.device_id, s.signal, s.value, truth)
            values[(s.device_id, s.signal)] = s.value
    assert values[(uuids[1], "throttle_thermal")] == pytest.approx(55 / 60)
    assert values[(uuids[1], "clock_event_sw_thermal")] == pytest.approx(11 / 12)


def _with_faults(tmp_path: Path, faults: Sequence[Mapping[str, object]]) -> Path:
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["faults"] = faults
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def test_a_driver_before_the_rename_gives_the_bitmask_through_clocks_throttle_reasons(tmp_path: Path) -> None:
    # nvmlDeviceGetCurrentClocksEventReasons is missing from drivers before the rename: the old name is asked.
    missing = {
        "at_s": 0,
        "target": "nvml",
        "call": "nvmlDeviceGetCurrentClocksEventReasons",
        "error": "FUNCTION_NOT_FOUND",
    }
    batch, _, node = _run(True, scenario=_with_faults(tmp_path, [missing]))
    values = {(s.device_id, s.signal): s.value for s in batch.saturation if s.pod_name is None}
    assert values[(node.scenario.gpus[0].uuid, "clock_event_sw_power_cap")] == 1.0
    assert values[(node.scenario.gpus[1].uuid, "clock_event_sw_thermal")] == 1.0
    assert values[(node.scenario.gpus[1].uuid, "clock_event_sw_power_cap")] == 0.0


def test_a_gpu_without_clock_event_reasons_has_no_clock_event_series(tmp_path: Path) -> None:
    unsupported = [
        {"at_s": 0, "target": "nvml", "gpu": 0, "call": call, "error": "NOT_SUPPORTED"}
        for call in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    ]
    batch, _, node = _run(True, scenario=_with_faults(tmp_path, unsupported))
    gpu0, gpu1 = node.scenario.gpus[0].uuid, node.scenario.gpus[1].uuid
    signals = {(s.device_id, s.signal) for s in batch.saturation if s.pod_name is None}
    assert not {name for uuid, name in signals if uuid == gpu0 and name.startswith("clock_event_")}
    assert (gpu0, "throttle_power") in signals  # the other calls still answer: absent is per field, never 0
    assert (gpu1, "clock_event_sw_thermal") in signals


def test_saturation_off_reads_nothing() -> None:
    batch, receiver, _ = _run(False, seconds=10)
    assert "device_signals" not in receiver.provides
    assert not [r for r in batch.device_signals if isinstance(r, DeviceSignals)]
    assert batch.saturation == ()


def test_xid_count_from_nvml_events_is_exact() -> None:
    # 13 at 200 s, 13 again at 230 s, 79 at 250 s: three, though two share a code (dcgm's field sees two).
    batch, _, node = _run(True, seconds=300, window_s=1000.0)
    gpu1 = node.scenario.gpus[1].uuid
    values = {(s.device_id, s.signal): s.value for s in batch.saturation if s.pod_name is None}
    assert values[(gpu1, "xid_count")] == 3.0
    batch, _, node = _run(True, seconds=300, window_s=60.0)
    values = {(s.device_id, s.signal): s.value for s in batch.saturation if s.pod_name is None}
    assert values[(gpu1, "xid_count")] == 1.0  # only 79 in (240, 300]
