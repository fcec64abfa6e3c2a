"""Review of the GPU side: the nvml receiver's utilisation window after a tick whose process listing failed.

The device sample of such a tick is still delivered (power and counter read), so the idle processor's next
interval starts there; the utilisation of the next tick must cover that same interval, not reach back into
the failed tick (whose energy is left unattributed as ``processes_unknown``)."""

from __future__ import annotations

import pytest

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
        assert [d.processes_known for d in devices][0] is False
        clock.advance(5.0)
        devices, procs = h.poll()  # 15 s: the tick is 10–15 s; pid 7 exited at 8 s
        on_gpu0 = {p.pid: p for p in procs if p.device_id == devices[0].device_id}
        assert set(on_gpu0) == {8}, "a process gone before the tick began must get no part of it"
        assert on_gpu0[8].util_window_s == pytest.approx(5.0)
    finally:
        h.close()
