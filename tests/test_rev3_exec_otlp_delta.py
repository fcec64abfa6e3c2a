"""rev3 review: an exec relabels a process's CPU series with its total carried on; under OTLP delta temporality
that total is sent again, as the first delta of a new series (its attributes differ)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.processors.test_cpu_attribution import Node, processor, step
from wattpipe.exporters._otlp_delta import DeltaState
from wattpipe.exporters._otlp_snapshot import SnapshotTaker


def test_the_deltas_sent_for_a_process_that_execs_add_up_to_its_energy() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(70, comm="sh")
    proc = processor()
    taker, state = SnapshotTaker(created_ns=0), DeltaState()
    summed_j = 0.0
    for tick in range(4):
        if tick == 2:
            node.procs[70] = replace(node.procs[70], comm="python3")  # exec: another comm, the same pid
        if tick:
            node.half_busy("intel-rapl:0", 10_000)
            node.run(70, 1.0)
        snapshot = taker.take(step(proc, node))
        pending = state.begin()
        for family, points in snapshot.metrics:
            if family.otel == "wattpipe.process.cpu.energy":
                summed_j += sum(pending.of(family.otel, p, "process.pid")[0] for p in points) / family.divisor
        pending.commit()
    assert summed_j == pytest.approx(15.0)  # 3 ticks of 5 J active, all the process's
