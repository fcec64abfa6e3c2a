"""Review of the GPU side: whatever fails when (the process listing, the GPU itself), each tick's utilisation
window is the interval since the GPU's previous delivered reading: the interval the idle processor takes that
tick's energy over, so utilisation and energy describe the same time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.receivers.test_nvml import Harness, scenario
from wattpipe.pipeline.clock import SteppedClock

_fault = st.tuples(
    st.integers(0, 12).map(lambda n: 5.0 * n - 1.0),  # starts just before a tick
    st.sampled_from([2.0, 7.0, 12.0]),
    st.sampled_from(
        [("nvmlDeviceGetComputeRunningProcesses", "NO_PERMISSION"), ("nvmlDeviceGetPowerUsage", "GPU_IS_LOST")]
    ),
)


@settings(max_examples=25, deadline=None)
@given(st.lists(_fault, max_size=3))
def test_the_utilisation_window_is_the_interval_since_the_last_delivered_reading(
    faults: list[tuple[float, float, tuple[str, str]]],
) -> None:
    clock = SteppedClock()
    data = scenario(
        faults=[
            {"at_s": max(at, 0.0), "for_s": length, "target": "nvml", "gpu": 0, "call": call, "error": error}
            for at, length, (call, error) in faults
        ]
    )
    h = Harness(data, clock, reinit_backoff=5.0)
    try:
        last_wall: float | None = None
        for _ in range(14):
            clock.advance(5.0)
            devices, procs = h.poll()
            gpu0 = [d for d in devices if d.device_index == 0]
            if not gpu0 or not gpu0[0].up:
                continue
            (d,) = gpu0
            windows = {p.util_window_s for p in procs if p.device_id == d.device_id}
            if last_wall is not None and d.processes_known:
                assert windows == {d.time.wall_s - last_wall}
            last_wall = d.time.wall_s
    finally:
        h.close()
