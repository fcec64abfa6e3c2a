"""A process series first filed without its start time (no /proc answer for it that tick) is filed under
it once known. Where that process has a series under it already (it ended while the process was off the
GPU), that one was replaced: its energy lost from the process totals (Σ processes < attributed), its counter
restarted (the rev-energy review). Now both stay, each with its own total and start: adding one to the other
would send the later one's first energy twice to a backend summing OTLP deltas (it was exported as a series
of its own)."""

from __future__ import annotations

from tests.processors.test_idle_energy import energy, power, share
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import GpuShare, HostProcess
from wattpipe.processors.energy import EnergyProcessor


def _host(start: int) -> HostProcess:
    return HostProcess(time=Timestamp(0.0, 0.0), pid=7, comm="python", start_time_ticks=start)


def _tick(proc: EnergyProcessor, clock: SteppedClock, shares: list[GpuShare], hosts: list[HostProcess]) -> Batch:
    b = Batch(time=clock.now(), interval_s=5.0, node="n").replace(
        device_power=(power(clock, sum(s.energy_mj for s in shares)),),
        shares=tuple(shares),
        host_processes=tuple(hosts),
    )
    out = proc.process(b)
    clock.advance(5.0)
    return out


def test_a_process_back_on_the_gpu_before_proc_names_it_keeps_both_totals() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    first = _tick(proc, clock, [share(clock, 7, 1000)], [_host(500)])
    _tick(proc, clock, [], [_host(500)])  # off the GPU for a tick: its series ends
    back = _tick(proc, clock, [share(clock, 7, 10)], [])  # back, and /proc had no answer for it this tick
    b = _tick(proc, clock, [share(clock, 7, 10)], [_host(500)])
    starts = [t.start for t in (*first.totals, *back.totals) if t.state == "running"]
    rows = sorted((t.energy_mj, t.state, t.start, dict(t.extra).get("comm")) for t in b.totals)
    assert rows == [(20, "running", starts[1], "python"), (1000, "terminated", starts[0], "python")]
    device = b.device_totals[0]
    assert device.active_energy_mj - device.unattributed_energy_mj == 1020  # Σ process totals = attributed
    # The kernel gives pid 7 to a new process: it is told apart still, though the series has no start in its key.
    b = _tick(proc, clock, [share(clock, 7, 5)], [_host(900)])
    rows = sorted((t.energy_mj, t.state, t.start, dict(t.extra).get("comm")) for t in b.totals)
    assert [r[:2] for r in rows] == [(5, "running"), (20, "terminated"), (1000, "terminated")]
