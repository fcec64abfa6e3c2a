"""A process series first filed without its start time (no /proc answer for it that tick) is filed under
it once known; a series of that very process already there (it ended while the process was off the GPU)
goes on, with the new energy added: it was overwritten, its energy lost from the totals (the rev-energy
review)."""

from __future__ import annotations

from tests.processors.test_idle_energy import energy, power, share
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import GpuShare, HostProcess
from wattpipe.processors.energy import EnergyProcessor

HOST = HostProcess(time=Timestamp(0.0, 0.0), pid=7, comm="python", start_time_ticks=500)


def _tick(proc: EnergyProcessor, clock: SteppedClock, shares: list[GpuShare], hosts: list[HostProcess]) -> Batch:
    b = Batch(time=clock.now(), interval_s=5.0, node="n").replace(
        device_power=(power(clock, sum(s.energy_mj for s in shares)),),
        shares=tuple(shares),
        host_processes=tuple(hosts),
    )
    out = proc.process(b)
    clock.advance(5.0)
    return out


def test_a_process_back_on_the_gpu_before_proc_names_it_keeps_its_total_and_start() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    first = _tick(proc, clock, [share(clock, 7, 1000)], [HOST])
    start = next(t.start for t in first.totals if t.scope == "process")
    _tick(proc, clock, [], [HOST])  # off the GPU for a tick: its series ends
    _tick(proc, clock, [share(clock, 7, 10)], [])  # back, and /proc had no answer for it this tick
    b = _tick(proc, clock, [share(clock, 7, 10)], [HOST])
    rows = [(t.key, t.energy_mj, t.state, t.start, dict(t.extra).get("comm")) for t in b.totals]
    assert rows == [("7", 1020, "running", start, "python")]
    device = b.device_totals[0]
    assert device.active_energy_mj - device.unattributed_energy_mj == 1020  # Σ process totals = attributed
