"""Review of the GPU side: a GPU whose power reading is not supported (a vGPU guest, some boards) is not
lost. It was marked down every tick (``up`` False, a "failed … marked down" error, re-acquired with backoff)
and its processes were never listed; its energy counter, where it has one, went unread."""

from __future__ import annotations

import logging

import pytest

from tests.receivers.test_nvml import Harness, scenario
from wattpipe.pipeline.clock import SteppedClock


def test_a_gpu_without_a_power_reading_is_up_with_power_absent(caplog: pytest.LogCaptureFixture) -> None:
    clock = SteppedClock()
    fault = {"at_s": 0, "target": "nvml", "gpu": 0, "call": "nvmlDeviceGetPowerUsage", "error": "NOT_SUPPORTED"}
    h = Harness(scenario(faults=[fault]), clock)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                clock.advance(5.0)
                devices, procs = h.poll()
        assert [d.up for d in devices] == [True, True]
        assert devices[0].power_w is None  # absent, not 0
        assert devices[0].energy_mj is not None
        assert devices[1].power_w is not None
        assert {p.pid for p in procs if p.device_id == devices[0].device_id} == {10, 11}
        assert "marked down" not in caplog.text
    finally:
        h.close()
