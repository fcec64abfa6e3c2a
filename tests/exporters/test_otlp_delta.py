"""Delta temporality (exporters/_otlp_delta.py): the increase since what was last *sent*, per series."""

from __future__ import annotations

from collections.abc import Mapping

from wattpipe.exporters._otlp_delta import DeltaState
from wattpipe.exporters._otlp_snapshot import AttributeValue, Point

PID: dict[str, AttributeValue] = {"process.pid": 42, "hw.id": "GPU-a", "wattpipe.state": "running"}


def point(raw: float, time_ns: int, start_ns: int = 100, attributes: Mapping[str, AttributeValue] = PID) -> Point:
    return Point({**PID, **attributes}, raw, start_ns, time_ns)


def sent(state: DeltaState, p: Point, metric: str = "e") -> tuple[float, int]:
    pending = state.begin()
    delta = pending.of(metric, p)
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
