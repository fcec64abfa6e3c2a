"""A GPU gone (unanswered past ``device_gone_after``) ends its container and pod series; back, while the
pod still exists and its processes pause, those series run again (0 W), with their totals and start: they
stayed terminated, were dropped ``terminated_retention`` later although their pod existed, and the pod's
next energy started a new series from 0 (the rev-energy review)."""

from __future__ import annotations

from tests.processors.test_group_series import COMPLETE, listed, member, step
from tests.processors.test_idle_energy import energy, share
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock


def test_a_pod_whose_gpu_came_back_runs_again_while_it_exists() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=10.0, device_gone_after=20.0)
    first = step(proc, clock, [share(clock, 1, 100)], [member(1), listed(), COMPLETE])
    start = {t.scope: t.start for t in first.totals}
    for _ in range(6):  # G unanswered for 30 s: gone
        b = proc.process(Batch(time=clock.now(), interval_s=5.0, node="n").replace(workloads=(listed(), COMPLETE)))
        clock.advance(5.0)
    assert {(t.scope, t.state) for t in b.totals} >= {("pod", "terminated"), ("container", "terminated")}
    for _ in range(4):  # G back; the pod exists, its process paused: past the retention
        b = step(proc, clock, [], [listed(), COMPLETE])
    groups = {t.scope: (t.energy_mj, t.state, t.power_w, t.start) for t in b.totals if t.scope != "process"}
    assert groups == {
        "container": (100, "running", 0.0, start["container"]),
        "pod": (100, "running", 0.0, start["pod"]),
    }
    b = step(proc, clock, [], [COMPLETE])  # and it ends when the pod is gone
    assert {t.state for t in b.totals if t.scope != "process"} == {"terminated"}


def test_a_pod_first_known_by_name_whose_uid_comes_with_its_gpu_back_stays_one_series() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=60.0, device_gone_after=20.0)
    step(proc, clock, [share(clock, 1, 100)], [member(1, container_id=None, pod_uid=None)])  # before the API synced
    for _ in range(6):  # G gone; meanwhile the API synced
        proc.process(Batch(time=clock.now(), interval_s=5.0, node="n").replace(workloads=(listed(), COMPLETE)))
        clock.advance(5.0)
    b = step(proc, clock, [share(clock, 1, 10)], [member(1), listed(), COMPLETE])  # back: its UID known now
    b = step(proc, clock, [], [listed(), COMPLETE])
    groups = sorted((t.scope, t.key, t.energy_mj, t.state) for t in b.totals if t.scope != "process")
    assert groups == [("container", "ml/trainer-0/main", 110, "running"), ("pod", "ml/trainer-0", 110, "running")]
