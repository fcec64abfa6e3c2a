"""Review of the GPU side: the nvml receiver's utilisation window after a tick whose process listing failed.

The device sample of such a tick is still delivered (power and counter read), so the idle processor's next
interval starts there; the utilisation of the next tick must cover that same interval, not reach back into
the failed tick (whose energy is left unattributed as ``processes_unknown``)."""

from __future__ import annotations

import pynvml
import pytest

from tests.helpers.nvml_hang import Hang
from tests.receivers.test_nvml import Harness, scenario
from wattpipe.pipeline.clock import SteppedClock


def test_after_a_failed_listing_the_utilisation_covers_only_the_next_tick() -> None:
    clock = SteppedClock()
    fault = {"at_s": 9, "for_s": 2, "target": "nvml", "gpu": 0, "call": "nvmlDeviceGetComputeRunningProcesses",
             "error": "NO_PERMISSION"}  # fmt: skip
    data = scenario(
        processes=[
            # Busy 6–8 s and gone at 8 s: inside the tick (5–10 s) whose listing fails.
            {"pid": 7, "comm": "short", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.0], [6, 1.0]], "end_s": 8},
            {"pid": 8, "comm": "long", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.5]]},
        ],
        faults=[fault],
    )
    h = Harness(data, clock)
    try:
        clock.advance(5.0)
        h.poll()
        clock.advance(5.0)
        devices, procs = h.poll()  # 10 s: the listing fails
        assert [d.processes_known for d in devices] == [False, True]
        clock.advance(5.0)
        devices, procs = h.poll()  # 15 s: the tick is 10–15 s; pid 7 exited at 8 s
        on_gpu0 = {p.pid: p for p in procs if p.device_id == devices[0].device_id}
        assert set(on_gpu0) == {8}, "a process gone before the tick began must get no part of it"
        assert on_gpu0[8].util_window_s == pytest.approx(5.0)
    finally:
        h.close()


def test_a_reading_dropped_for_its_timeout_leaves_its_utilisation_to_the_next_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GPU 0 hangs at 10 s past device_timeout: that reading is dropped (its values absent), so the idle
    # processor's next interval is 5–15 s. The utilisation of the 15 s tick must cover 5–15 s too: the dropped
    # read had consumed 5–10 s, and pid 7 (busy 6–8 s, gone at 8 s) was billed nothing of the energy it used.
    clock = SteppedClock()
    data = scenario(
        processes=[
            {"pid": 7, "comm": "short", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.0], [6, 1.0]], "end_s": 8},
            {"pid": 8, "comm": "long", "gpu": 0, "dynamic_w": 300, "util": [[0, 0.5]]},
        ]
    )
    h = Harness(data, clock, device_timeout=0.05)
    try:
        clock.advance(5.0)
        h.poll()
        lib = pynvml.nvmlLib
        hung = Hang(lib, "nvmlDeviceGetComputeRunningProcesses_v3")
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        pynvml.nvmlLib = hung
        try:
            clock.advance(5.0)
            assert h.poll()[0] == []  # 10 s: both GPUs absent this tick
            hung.release.set()
            for slot in h.receiver.slots:
                assert slot.pending is not None
                slot.pending.result(timeout=5.0)
        finally:
            hung.release.set()
            pynvml.nvmlLib = lib  # (not by monkeypatch: that would put the simulator back after close)
            pynvml._nvmlGetFunctionPointer_cache.clear()
        clock.advance(5.0)
        devices, procs = h.poll()  # 15 s: the first reading since 5 s
        on_gpu0 = {p.pid: p for p in procs if p.device_id == devices[0].device_id}
        assert set(on_gpu0) == {7, 8}
        assert on_gpu0[7].sm_util == pytest.approx(0.3, abs=0.03)  # to its last sample: 3 s of 10
        assert on_gpu0[8].util_window_s == pytest.approx(10.0)
    finally:
        h.close()
