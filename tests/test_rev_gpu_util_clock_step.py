"""Review of the GPU side: the nvml receiver's utilisation window when the wall clock steps back (an NTP step,
a node whose clock was set by hand, a VM whose clock was corrected).

The driver stamps its utilisation samples with the wall clock (µs), and the receiver asks for the samples
newer than the newest it has used (``lastSeenTimeStamp``) or than its previous read. After the wall clock
stepped back by S seconds, every new sample is stamped *before* those: the driver answered NOT_FOUND tick after
tick, and every process read an observed 0 % for S seconds (a 90 % and a 10 % tenant split 50/50: the 10 % one
billed five times its energy), with a negative ``util_window_s``. The window is the time since the previous
read by the monotonic clock, and where its start by the wall clock lies after now, it starts that long
before now instead.

A driver double below: one entry per busy process, the mean of its samples newer than ``lastSeenTimeStamp``
stamped with its newest (current drivers; INTERFACES.md §1), a sample every 1/6 s stamped with the wall clock
of that moment.
"""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from wattpipe.pipeline.clock import Timestamp
from wattpipe.receivers.nvml._device import DeviceReader
from wattpipe.receivers.nvml._mig import MigLayout

_PERIOD_S = 1 / 6
_BUSY = {1: 90.0, 2: 10.0}  # pid → SM % throughout
_EXITS_AT_S = 1012.5  # pid 3, busy at 50 % until then (monotonic s): when the clock steps


class _SteppingClock:
    """Monotonic time that only moves on; wall time that can be stepped (as NTP or ``date -s`` does)."""

    def __init__(self) -> None:
        self.monotonic_s = 1000.0
        self.offset_s = 1_767_225_600.0 - 1000.0
        self.steps: list[tuple[float, float]] = []  # (monotonic s from which, offset s)

    def step_wall(self, by_s: float) -> None:
        self.offset_s += by_s
        self.steps.append((self.monotonic_s, self.offset_s))

    def wall_at(self, monotonic_s: float, start_offset_s: float) -> float:
        offset = start_offset_s
        for since_s, step_offset in self.steps:
            if monotonic_s >= since_s:
                offset = step_offset
        return monotonic_s + offset

    def now(self) -> Timestamp:
        return Timestamp(monotonic_s=self.monotonic_s, wall_s=self.monotonic_s + self.offset_s)


class _Driver:
    """nvmlDeviceGetProcessUtilization of a GPU whose processes are busy at ``_BUSY`` throughout."""

    def __init__(self, clock: _SteppingClock) -> None:
        self.clock = clock
        self.start_offset_s = clock.offset_s
        self.samples: list[tuple[int, int, float]] = []  # (pid, stamp µs, sm %)
        self.sampled_to_s = clock.monotonic_s

    def __call__(self, handle: Any, last_seen_us: int) -> list[tuple[int, int, float, float]]:
        while self.sampled_to_s + _PERIOD_S <= self.clock.monotonic_s + 1e-9:
            self.sampled_to_s += _PERIOD_S
            stamp_us = int(self.clock.wall_at(self.sampled_to_s, self.start_offset_s) * 1e6)
            self.samples += [(pid, stamp_us, sm) for pid, sm in _BUSY.items()]
            if self.sampled_to_s < _EXITS_AT_S:
                self.samples.append((3, stamp_us, 50.0))
        newer: dict[int, list[tuple[int, float]]] = {}
        for pid, stamp_us, sm in self.samples:
            if stamp_us > last_seen_us:
                newer.setdefault(pid, []).append((stamp_us, sm))
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [(pid, max(ts for ts, _ in got), sum(sm for _, sm in got) / len(got), 0.0) for pid, got in newer.items()]


def _reader(clock: _SteppingClock, monkeypatch: pytest.MonkeyPatch) -> DeviceReader:
    answers = {
        "nvmlDeviceGetPowerUsage": 300_000,
        "nvmlDeviceGetTotalEnergyConsumption": 1_000_000,
        "nvmlDeviceGetComputeMode": pynvml.NVML_COMPUTEMODE_DEFAULT,
        "nvmlDeviceGetMigMode": [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE],
    }
    for name, value in answers.items():
        monkeypatch.setattr(pynvml, name, lambda handle, value=value: value)

    def rates(handle: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", rates)
    return DeviceReader(
        index=0,
        uuid="GPU-00000000-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3",
        handle=object(),
        mig_layout=MigLayout(60.0),
        last_seen_us=int(clock.now().wall_s * 1e6),
        list_processes=lambda handle: [
            (pid, 1 << 30, 0xFFFFFFFF, 0xFFFFFFFF) for pid in (1, 2, 3) if pid != 3 or clock.monotonic_s < _EXITS_AT_S
        ],  # type: ignore[arg-type]
        utilisation_samples=_Driver(clock),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("step_s", [-60.0, -3.0])
def test_after_the_wall_clock_steps_back_utilisation_is_still_each_processs(
    step_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _SteppingClock()
    reader = _reader(clock, monkeypatch)
    seen: list[tuple[float, float, float | None]] = []
    for tick in range(1, 25):
        clock.monotonic_s += 2.0  # the step comes 0.5 s into the tick ending at 14 s
        if tick == 7:
            clock.monotonic_s -= 1.5
            clock.step_wall(step_s)
            clock.monotonic_s += 1.5
        reading = reader.read(clock.now())
        util = {p.pid: p for p in reading.processes}
        # pid 3 exited 0.5 s into the tick ending at 14 s (listed no more, but busy in it): after that tick, its
        # samples from before the step (stamped after now for the next 60 s) are no process running.
        assert set(util) == ({1, 2, 3} if tick <= 7 else {1, 2}), f"tick {tick}"
        seen.append((util[1].sm_util or 0.0, util[2].sm_util or 0.0, util[1].util_window_s))
    for tick, (first, second, window_s) in enumerate(seen[1:], start=2):
        assert window_s == pytest.approx(2.0), f"tick {tick}: a window of {window_s} s"
        if tick == 7:
            continue  # the tick the clock stepped in: its samples before the step may be read again
        assert first == pytest.approx(0.9, abs=0.05), f"tick {tick}: pid 1 at {first:.2f} (busy 90 %)"
        assert second == pytest.approx(0.1, abs=0.05), f"tick {tick}: pid 2 at {second:.2f} (busy 10 %)"
