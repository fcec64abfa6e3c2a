"""Property: whatever the order of exits, pid reuse, /proc answers missing for a tick, late shares and
unanswered ticks, nothing measured is lost from the process totals and no exported series decreases (the
rev-energy review; it found a series filed under its start time replacing that process's earlier one)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DevicePower, GpuProcessSample, GpuShare, HostProcess
from wattpipe.processors.energy import EnergyConfig, EnergyProcessor

PIDS = (1, 2)
Event = tuple[int, int, bool, bool, int]  # pid, generation (start time), /proc answers, late share, mJ
tick_events = st.lists(
    st.tuples(st.sampled_from(PIDS), st.integers(0, 1), st.booleans(), st.booleans(), st.integers(0, 500)),
    max_size=2,
    unique_by=lambda e: e[0],
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.booleans(), tick_events), min_size=1, max_size=12))
def test_process_totals_and_the_remainder_add_up_and_never_decrease(ticks: list[tuple[bool, list[Event]]]) -> None:
    clock = SteppedClock()
    proc = EnergyProcessor(
        EnergyConfig(terminated_retention=1e6, max_terminated=10_000),
        make_context("energy", "processor", clock, pipeline="metrics"),
    )
    proc.start()
    last: dict[tuple[str, str, object], int] = {}
    for answered, events in ticks:
        now = clock.now()
        shares = [
            GpuShare(time=now, device_id="G", pid=pid, share=0.0 if is_late else 0.5, energy_mj=mj,
                     power_w=0.0 if is_late else mj / 5000)
            for pid, _, _, is_late, mj in events
        ]  # fmt: skip
        listed = tuple(GpuProcessSample(time=now, device_id="G", pid=e[0]) for e in events if not e[3])
        hosts = tuple(
            HostProcess(time=Timestamp(0.0, 0.0), pid=pid, comm=f"p{pid}g{gen}", start_time_ticks=100 * gen + pid)
            for pid, gen, answers, is_late, _ in events
            if answers and not is_late
        )
        total = sum(s.energy_mj for s in shares)
        batch = Batch(time=now, interval_s=5.0, node="n")
        if answered:
            power = DevicePower(
                time=now, device_id="G", interval_s=5.0, power_w=total / 5000, idle_w=None, active_w=0.0,
                energy_mj=total, idle_energy_mj=0, active_energy_mj=total,
            )  # fmt: skip
            batch = batch.replace(device_power=(power,), shares=tuple(shares), gpu_processes=listed)
        batch = batch.replace(host_processes=hosts)
        out = proc.process(batch)
        clock.advance(5.0)
        processes = [t for t in out.totals if t.scope == "process"]
        if not out.device_totals:
            continue  # G has not answered yet
        (device,) = out.device_totals
        assert sum(t.energy_mj for t in processes) + device.unattributed_energy_mj == device.active_energy_mj
        for t in processes:
            key = (t.key, t.device_id, t.start)
            assert t.energy_mj >= last.get(key, 0), (key, t.energy_mj, last.get(key))
            last[key] = t.energy_mj
