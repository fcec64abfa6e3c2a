"""Review of the GPU side: a MIG instance that has processes but that dcgm-exporter does not report.

dcgm-exporter lists the instances it watches; one made after it started (MIG reconfigured mid-run) is
missing from its rows until it is restarted, and a field DCGM leaves blank is dropped (absent). Such an
instance's activity is *unknown*, yet the split weighed it as 0 beside the reported ones: its processes
got nothing and its energy went to the other instances' processes.

Now it is weighed as the reported instances are on average: its compute slices × their activity per slice
(Σ activity × slices / Σ slices), in the tick's own split and in a dcgm-exporter window's (processors/
_mig_shares.py ``with_unreported``); with no instance reported the split is by slices, the same rule.
A guess, but a bounded one, and the one the split makes when nothing at all is reported."""

from __future__ import annotations

import dataclasses

import pytest

from tests.processors.test_mig_window import TICK_MJ, Collected, Node, _batch, _counter_at, _energy


def _undated(activity: dict[int, float]) -> dict[int | None, int]:
    node = Node()
    batch = _batch(5.0, [(10, 1), (20, 2)], activity, None, mig=True)
    batch = batch.replace(mig_activity=tuple(dataclasses.replace(a, window_s=None) for a in batch.mig_activity))
    return _energy(node.proc.process(batch))


def test_reported_instances_split_by_activity_times_slices() -> None:
    assert _undated({1: 1 / 3, 2: 1.0}) == {None: 0, 10: 5_000, 20: 5_000}


def test_an_unreported_instance_with_processes_is_not_billed_to_the_others() -> None:
    energy = _undated({1: 0.5})  # GI 2 (pid 20) exists in NVML's layout, absent from dcgm-exporter's rows
    assert energy[10] < TICK_MJ, "GI 1's process was billed GI 2's unknown part too"
    # GI 1 (3g) at 0.5: 0.5 per slice; GI 2 (1g) weighed at 0.5 × 1 slice: 1.5 : 0.5.
    assert energy == {None: 0, 10: 7_500, 20: 2_500}


def test_an_unreported_instance_with_processes_gets_its_part_of_a_window_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = Node()
    both = [(10, 1), (20, 2)]
    billed = {10: 0, 20: 0}
    for n in range(1, 7):  # dcgm-exporter's rows have GI 1 alone, at 1/3; the collection of (0, 30 s] at 30 s
        collected = Collected({1: 1 / 3}, after_s=25.0, dcgm_counter_mj=_counter_at(30)) if n == 6 else None
        out = node.tick(both, {1: 1 / 3}, collected)
        for pid in billed:
            billed[pid] += _energy(out)[pid]
    assert node.held == 0
    # 1/3 per slice: GI 1 (3g) weighs 1, GI 2 (1g) 1/3: 45 J and 15 J of the window's 60 J.
    assert billed == {10: 45_000, 20: 15_000}
    assert "instance 2 has processes but dcgm-exporter reports no activity" in caplog.text


def test_with_no_instance_reported_the_split_is_by_slices_as_before() -> None:
    assert _undated({}) == {None: 0, 10: 7_500, 20: 2_500}


def test_an_instance_with_no_process_and_no_activity_weighs_nothing_as_before() -> None:
    node = Node()
    batch = _batch(5.0, [(10, 1)], {1: 0.5}, None, mig=True)
    batch = batch.replace(mig_activity=tuple(dataclasses.replace(a, window_s=None) for a in batch.mig_activity))
    assert _energy(node.proc.process(batch)) == {None: 0, 10: TICK_MJ}
