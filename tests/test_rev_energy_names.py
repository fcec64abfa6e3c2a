"""A pod (container) first known by name, whose series a UID (container id) then took over: the series is
that pod's (container's) from then on, not the name's (the rev-energy review).

Before the fix, a name-keyed series was told running by the name alone: after a container restart (a new
id, the same name) or a StatefulSet pod recreated under its name, the old one's series stayed running at
0 W for ever beside the new one's. And a name series whose pod had gone was taken over by the next pod under
that name: the new pod's energy added to the old pod's total.
"""

from __future__ import annotations

from tests.processors.test_group_series import COMPLETE, T0, listed, member, step
from tests.processors.test_idle_energy import energy, share
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import Workload

NEW_CID = "e" * 64


def _states(b: Batch, scope: str) -> dict[str, tuple[int, str]]:
    return {t.key: (t.energy_mj, t.state) for t in b.totals if t.scope == scope}


def test_a_pod_recreated_under_its_name_ends_the_old_pods_series_first_keyed_by_name() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    step(proc, clock, [share(clock, 1, 100)], [member(1, container_id=None, pod_uid=None)])  # not synced yet
    step(proc, clock, [share(clock, 1, 10)], [member(1), listed(), COMPLETE])  # uid-a takes the name's series
    # trainer-0 deleted and recreated (a StatefulSet): the API lists the new pod under the same name.
    new = [listed(uid="uid-new", cid=NEW_CID), COMPLETE]
    step(proc, clock, [share(clock, 2, 7)], [member(2, container_id=NEW_CID, pod_uid="uid-new"), *new])
    b = step(proc, clock, [], new)
    assert _states(b, "pod") == {"ml/trainer-0": (110, "terminated"), "uid-new": (7, "running")}
    assert _states(b, "container") == {"ml/trainer-0/main": (110, "terminated"), NEW_CID: (7, "running")}


def test_a_restarted_container_ends_its_first_series_keyed_by_name() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    step(proc, clock, [share(clock, 1, 100)], [member(1, container_id=None, pod_uid=None)])
    step(proc, clock, [share(clock, 1, 10)], [member(1), listed(), COMPLETE])
    new = [listed(cid=NEW_CID), COMPLETE]  # the same pod; its container restarted under a new id
    step(proc, clock, [share(clock, 2, 7)], [member(2, container_id=NEW_CID), *new])
    b = step(proc, clock, [], new)
    assert _states(b, "container") == {"ml/trainer-0/main": (110, "terminated"), NEW_CID: (7, "running")}
    assert _states(b, "pod") == {"ml/trainer-0": (117, "running")}


def test_a_name_series_whose_pod_has_gone_is_not_taken_by_the_next_pod_under_that_name() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    owner = Workload(
        time=T0, pid=None, container_name="main", pod_name="trainer-0", pod_namespace="ml", listed="allocations"
    )
    complete = Workload(time=T0, pid=None, listed="allocations")
    step(proc, clock, [share(clock, 1, 100)], [member(1, container_id=None, pod_uid=None), owner, complete])
    b = step(proc, clock, [], [complete])  # the kubelet no longer allocates to trainer-0: it is gone
    assert _states(b, "pod") == {"ml/trainer-0": (100, "terminated")}
    new = [member(2, container_id=NEW_CID, pod_uid="uid-new"), listed(uid="uid-new", cid=NEW_CID), COMPLETE]
    b = step(proc, clock, [share(clock, 2, 7)], new)
    assert _states(b, "pod") == {"ml/trainer-0": (100, "terminated"), "uid-new": (7, "running")}
    assert _states(b, "container") == {"ml/trainer-0/main": (100, "terminated"), NEW_CID: (7, "running")}
