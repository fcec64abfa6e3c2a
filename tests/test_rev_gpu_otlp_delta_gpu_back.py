"""Review of the GPU side: OTLP delta temporality for a GPU that comes back after more than an hour away.

The energy processor keeps a gone GPU's totals, unexported once ``terminated_retention`` has passed since it was
found gone, and goes on from them, under the same start, when it answers again (tests/processors/
test_energy_outage.py: no reset for Prometheus to see). The OTLP exporter's delta state forgets, at each
checkpoint, every series none of whose points was sent for an hour while others' were (meant for ended
series, which never come back). A GPU back after that (an hour off the bus, then reset) was an unknown series
to it: its first delta was its whole total from its start, so a backend summing the deltas counted all the
energy the GPU had used before it left twice. A device's and a node's series (no ``wattpipe.state``: they never
end) are not forgotten for their age; the consumers' still are.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource

from tests.processors.test_energy_outage import device_totals, step
from tests.processors.test_idle_energy import energy, share
from wattpipe.exporters._otlp_delta import DeltaState
from wattpipe.exporters._otlp_encode import Encoder
from wattpipe.exporters._otlp_snapshot import SnapshotTaker
from wattpipe.pipeline.clock import SteppedClock

_CHECKPOINT_TICKS = 12  # a checkpoint every minute of 5 s ticks


def _delta_sum(requests: list[object], metric: str, gpu: str) -> float:
    total = 0.0
    for data in requests:
        for rm in data.resource_metrics:  # type: ignore[attr-defined]
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        total += sum(p.value for p in m.data.data_points if p.attributes.get("hw.id") == gpu)
    return total


def test_the_deltas_of_a_gpu_back_after_an_hour_add_up_to_its_total_once() -> None:
    clock = SteppedClock()
    proc = energy(clock, device_gone_after=30.0, terminated_retention=12.0)
    taker = SnapshotTaker(created_ns=clock.now().wall_ns)
    delta = DeltaState()
    encoder = Encoder(Resource.create({}), delta)
    requests: list[object] = []
    ticks = 0

    def send(up: list[str], shares: list[object]) -> None:
        nonlocal ticks
        batch = step(proc, clock, up, shares)  # type: ignore[arg-type]
        data, commit = encoder.encode(taker.take(batch))
        commit()
        requests.append(data)
        ticks += 1
        if ticks % _CHECKPOINT_TICKS == 0:
            delta.dump()  # what a checkpoint does with it

    for _ in range(10):
        send(["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])
    for _ in range(2 * 3600 // 5):  # G off the bus for two hours: H goes on
        send(["H"], [share(clock, 2, 50, "H")])
    for _ in range(10):
        send(["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])
    g_total_j = proc.devices["G"].energy_mj / 1000.0
    batch_totals = device_totals(step(proc, clock, ["H"], [share(clock, 2, 50, "H")]))
    assert batch_totals["G"].energy_mj / 1000.0 == g_total_j
    sent_j = _delta_sum(requests, "hw.energy", "G")
    assert sent_j == pytest.approx(g_total_j, abs=1e-6), (
        f"Σ deltas {sent_j} J, the GPU's total {g_total_j} J (before it left: 6 J)"
    )
