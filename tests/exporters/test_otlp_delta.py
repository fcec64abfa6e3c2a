"""Delta temporality (exporters/_otlp_delta.py): the increase since what was last *sent*, per series."""

from __future__ import annotations

from collections.abc import Mapping

from wattpipe.exporters._otlp_delta import DeltaState
from wattpipe.exporters._otlp_snapshot import AttributeValue, Point

PID: dict[str, AttributeValue] = {"process.pid": 42, "hw.id": "GPU-a", "wattpipe.state": "running"}


def point(raw: float, time_ns: int, start_ns: int = 100, attributes: Mapping[str, AttributeValue] = PID) -> Point:
    return Point({**PID, **attributes}, raw, start_ns, time_ns)


def sent(state: DeltaState, p: Point, metric: str = "e", own: str | None = "process.pid") -> tuple[float, int]:
    pending = state.begin()
    delta = pending.of(metric, p, own)
    pending.commit()
    return delta


def test_the_first_delta_runs_from_the_series_start_and_the_next_from_the_last_point_sent() -> None:
    state = DeltaState()
    assert sent(state, point(1_000, 200)) == (1_000, 100)
    assert sent(state, point(2_500, 300)) == (1_500, 200)


def test_an_attempt_that_was_not_sent_leaves_nothing_behind() -> None:
    state = DeltaState()
    sent(state, point(1_000, 200))
    state.begin().of("e", point(2_000, 300))  # built, failed, never committed
    # The retry (or the next batch) counts from what the collector last received, not from the failed attempt.
    assert sent(state, point(2_500, 400)) == (1_500, 200)


def test_a_terminated_process_goes_on_from_its_running_series() -> None:
    state = DeltaState()
    sent(state, point(1_000, 200))
    assert sent(state, point(1_500, 300, attributes={"wattpipe.state": "terminated"})) == (500, 200)


def test_a_series_that_restarted_starts_over() -> None:
    state = DeltaState()
    sent(state, point(5_000, 200))
    assert sent(state, point(300, 300)) == (300, 100)  # its total fell
    assert sent(state, point(900, 400, start_ns=350)) == (900, 350)  # it began after what was last sent


def test_series_are_told_apart_by_metric_and_attributes() -> None:
    state = DeltaState()
    sent(state, point(1_000, 200), metric="a")
    assert sent(state, point(1_000, 200), metric="b") == (1_000, 100)
    assert sent(state, point(1_000, 200, attributes={"hw.id": "GPU-b"}), metric="a") == (1_000, 100)


def test_memory_is_bounded_by_forgetting_the_series_least_recently_sent() -> None:
    state = DeltaState(max_series=2)
    sent(state, point(1_000, 200, attributes={"hw.id": "GPU-0"}))
    sent(state, point(1_000, 200, attributes={"hw.id": "GPU-1"}))
    sent(state, point(2_000, 300, attributes={"hw.id": "GPU-0"}))  # GPU-0 sent again: GPU-1 is now the oldest
    sent(state, point(1_000, 300, attributes={"hw.id": "GPU-2"}))
    assert len(state) == 2
    assert sent(state, point(3_000, 400, attributes={"hw.id": "GPU-0"})) == (1_000, 300)  # remembered
    assert sent(state, point(3_000, 400, attributes={"hw.id": "GPU-1"})) == (3_000, 100)  # forgotten: from its start


def test_a_series_whose_description_changed_goes_on_from_what_was_sent() -> None:
    # An exec (another command, another container) or a pod named once the k8s cache synced relabels a series
    # that carries its total on: a backend summing deltas must not get that total again as a new series' first.
    state = DeltaState()
    sent(state, point(1_000, 200, attributes={"process.command": "runc:[2:INIT]"}))
    moved = {"process.command": "python3", "container.id": "c7", "k8s.pod.uid": "p7", "k8s.pod.name": "web-0"}
    assert sent(state, point(1_500, 300, attributes=moved)) == (500, 200)


def test_a_consumers_own_key_still_tells_series_apart() -> None:
    state = DeltaState()
    pending = state.begin()
    assert pending.of("c", point(1_000, 200, attributes={"container.id": "a"}), own="container.id") == (1_000, 100)
    assert pending.of("c", point(700, 200, attributes={"container.id": "b"}), own="container.id") == (700, 100)


def test_without_its_key_a_series_is_named_by_its_describing_attributes_too() -> None:
    # Two pods known by name only (no UID yet) on one GPU, their series begun in the same tick.
    state = DeltaState()
    for name, raw in (("a", 1_000), ("b", 300)):
        assert sent(state, point(raw, 200, attributes={"k8s.pod.name": name}), own="k8s.pod.uid") == (raw, 100)
    assert sent(state, point(1_100, 300, attributes={"k8s.pod.name": "a"}), own="k8s.pod.uid") == (100, 200)
    assert sent(state, point(350, 300, attributes={"k8s.pod.name": "b"}), own="k8s.pod.uid") == (50, 200)


def test_processes_that_share_a_pid_are_told_apart_by_their_start() -> None:
    # Within the retention an ended process's series and the new one given its pid are both sent, their
    # attributes alike but for the state: each goes on from its own last point.
    state = DeltaState()
    ended = {"wattpipe.state": "terminated"}
    sent(state, point(1_000, 200, attributes=ended))
    sent(state, point(40, 200, start_ns=150))
    assert sent(state, point(1_000, 300, attributes=ended)) == (0, 200)
    assert sent(state, point(90, 300, start_ns=150)) == (50, 200)


def test_series_not_sent_for_an_hour_while_others_were_are_forgotten_at_a_checkpoint() -> None:
    """A node with churn ends processes all day: each ended series stayed in the state, up to max_series (100,000
    rows, ~16 MB dumped on the event loop at every checkpoint; the revtoday review). A series none of whose
    points was sent for an hour while others' were is no longer exported (terminated_retention is a minute by
    default): it is forgotten when the state is dumped. An outage that sent nothing forgets nothing."""
    hour_ns = 3600 * 10**9
    state = DeltaState()
    sent(state, point(1_000, 200, attributes={"process.pid": 1}))
    sent(state, point(1_000, 300, attributes={"process.pid": 2}))
    assert len(state.dump()) == 2
    # Two hours later (an outage: nothing sent meanwhile), the first request after it: the one series still alive.
    sent(state, point(5_000, 300 + 2 * hour_ns, attributes={"process.pid": 2}))
    rows = state.dump()
    assert [row[2] for row in rows] == [[["hw.id", "GPU-a"], ["process.pid", 2]]]
    assert len(state) == 1
    # The forgotten one back (it cannot, but if it did): it starts over from its own start, as any new series.
    assert sent(state, point(1_500, 400 + 2 * hour_ns, attributes={"process.pid": 1})) == (1_500, 100)


def test_an_outage_forgets_nothing() -> None:
    state = DeltaState()
    sent(state, point(1_000, 200, attributes={"process.pid": 1}))
    sent(state, point(1_000, 300, attributes={"process.pid": 2}))
    state.begin().of("e", point(9_000, 300 + 5 * 3600 * 10**9))  # built during a 5-hour outage, never sent
    assert len(state.dump()) == 2
