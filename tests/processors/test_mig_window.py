"""MIG: a tick's energy is held until dcgm-exporter's sample covering it arrives, then split by that sample.

Hand-built ticks of one MIG GPU "G" with a 3g instance (GI 1) and a 1g instance (GI 2), 5 s apart, and
dcgm-exporter collecting every 30 s. Unless a test says otherwise the instances' latest activity is
stale (GI 1 busy, GI 2 idle), so a split by it would give everything to GI 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import (
    DevicePower,
    DeviceSample,
    DeviceSignals,
    GpuProcessSample,
    MigActivity,
    MigInstance,
)
from wattpipe.processors._mig_window import Collection, Hold
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor

LAYOUT = {1: "3g.40gb", 2: "1g.10gb"}
STALE = {1: 1.0, 2: 0.0}
TICK_MJ = 10_000  # active energy of every tick: 2 W over 5 s
COUNTER0 = 5_000_000.0  # NVML's energy counter at t = 0 (mJ); no idle, so it moves by TICK_MJ a tick


@dataclass
class Collected:
    """A new dcgm-exporter collection, seen by the scrape at this tick."""

    activity: dict[int, float]
    after_s: float
    dcgm_counter_mj: float | None = None  # the board counter DCGM printed with it


@dataclass
class Node:
    """Builds the batches of consecutive ticks and runs them through one attribution processor."""

    options: dict[str, object] = field(default_factory=dict)
    t_s: float = 0.0
    held: int = 0

    def __post_init__(self) -> None:
        config = AttributionConfig.model_validate(self.options)
        self.proc = AttributionProcessor(config, make_context("attribution", "processor", SteppedClock()))

    def tick(
        self,
        procs: Sequence[tuple[int, int | None]],
        activity: dict[int, float] | None = None,
        collected: Collected | None = None,
        *,
        mig: bool = True,
        active_mj: int = TICK_MJ,
    ) -> Batch:
        self.t_s += 5.0
        out = self.proc.process(_batch(self.t_s, procs, STALE if activity is None else activity, collected, mig))
        (power,) = out.device_power
        shares = sum(s.energy_mj for s in out.shares)
        # Per tick: Σ shares + the change of the held energy == the tick's active energy, exactly.
        assert shares + power.held_energy_mj - self.held == power.active_energy_mj == active_mj
        assert all(s.energy_mj >= 0 for s in out.shares)
        self.held = power.held_energy_mj
        return out


def _batch(
    t_s: float,
    procs: Sequence[tuple[int, int | None]],
    activity: dict[int, float],
    collected: Collected | None,
    mig: bool,
) -> Batch:
    time = Timestamp(monotonic_s=t_s, wall_s=1_767_225_600.0 + t_s)
    counter = COUNTER0 + t_s / 5.0 * TICK_MJ
    power = DevicePower(
        time=time, device_id="G", interval_s=5.0, power_w=2.0, idle_w=0.0, active_w=2.0,
        energy_mj=TICK_MJ, idle_energy_mj=0, active_energy_mj=TICK_MJ,
    )  # fmt: skip
    new = collected.activity if collected else activity
    batch = Batch(
        time=time,
        interval_s=5.0,
        node="n",
        devices=(DeviceSample(time=time, device_id="G", mig_enabled=mig, energy_mj=counter),),
        device_power=(power,),
        gpu_processes=tuple(GpuProcessSample(time=time, device_id="G", pid=p, gpu_instance_id=gi) for p, gi in procs),
        mig_instances=tuple(
            MigInstance(time=time, device_id="G", gpu_instance_id=gi, profile=prof, compute_slices=int(prof[0]))
            for gi, prof in LAYOUT.items()
        ),
        mig_activity=tuple(
            MigActivity(
                time=time,
                device_id="G",
                gpu_instance_id=gi,
                gr_engine_active=a,
                window_s=30.0,
                collected_after_s=collected.after_s if collected else None,
                collected_by_s=t_s if collected else None,
            )
            for gi, a in new.items()
        ),
    )
    if collected is not None and collected.dcgm_counter_mj is not None:
        signals = DeviceSignals(time=time, device_id="G", fields=(("energy_j", collected.dcgm_counter_mj / 1000),))
        batch = batch.replace(device_signals=(signals,))
    return batch


def _energy(batch: Batch) -> dict[int | None, int]:
    return {s.pid: s.energy_mj for s in batch.shares}


def _counter_at(t_s: float) -> float:
    return COUNTER0 + t_s / 5.0 * TICK_MJ


def test_energy_is_held_until_the_window_covering_it_arrives_then_split_by_it() -> None:
    node = Node()
    both = [(10, 1), (20, 2)]
    for t_s in (5, 10, 15, 20, 25):
        out = node.tick(both)
        assert _energy(out) == {None: 0, 10: 0, 20: 0}, t_s  # held: nothing is billed yet
        # Watts are this tick's split by the latest activity: the best estimate of now.
        assert {s.pid: s.power_w for s in out.shares} == {None: 0.0, 10: 2.0, 20: 0.0}
        assert out.device_power[0].held_energy_mj == t_s / 5 * TICK_MJ
    # At 30 s the collection of (0 s, 30 s] arrives: GI 1 at 0.25 × 3 slices, GI 2 at 1.0 × 1 slice.
    out = node.tick(both, collected=Collected({1: 0.25, 2: 1.0}, after_s=25.0, dcgm_counter_mj=_counter_at(30)))
    assert _energy(out) == {None: 0, 10: 25_714, 20: 34_286}  # 60 J × 0.75 / 1.75 and × 1 / 1.75
    assert out.device_power[0].held_energy_mj == 0
    assert {i.gpu_instance_id: i.energy_mj for i in out.instance_energy} == {1: 25_714, 2: 34_286}
    assert {s.pid: s.mode for s in out.shares} == {None: "mig", 10: "mig", 20: "mig"}


def test_a_tick_straddling_two_collections_is_cut_where_dcgm_counter_falls() -> None:
    node = Node()
    both = [(10, 1), (20, 2)]
    node.tick(both)  # (0, 5]
    # Seen at 10 s, collected when the counter had moved 40 % into the tick (5, 10]: at 7 s.
    at_7 = _counter_at(5) + 0.4 * TICK_MJ
    out = node.tick(both, collected=Collected({1: 1.0, 2: 0.0}, after_s=5.0, dcgm_counter_mj=at_7))
    assert _energy(out) == {None: 0, 10: 14_000, 20: 0}
    assert node.held == 6_000  # (7, 10] waits for the next collection
    out = node.tick(both, collected=Collected({1: 0.0, 2: 1.0}, after_s=10.0, dcgm_counter_mj=_counter_at(15)))
    assert _energy(out) == {None: 0, 10: 0, 20: 16_000}  # (7 s, 15 s]: the rest of that tick and this one
    assert node.held == 0


def test_without_dcgm_counter_a_collection_is_placed_midway_between_the_two_scrapes() -> None:
    node = Node()
    both = [(10, 1), (20, 2)]
    node.tick(both)
    out = node.tick(both, collected=Collected({1: 1.0, 2: 0.0}, after_s=5.0))  # between 5 s and 10 s: 7.5 s
    assert _energy(out) == {None: 0, 10: 15_000, 20: 0}
    assert node.held == 5_000


def test_a_tick_no_window_covers_within_max_wait_is_released_by_its_own_split() -> None:
    node = Node({"mig_max_wait": "10s"})
    both = [(10, 1), (20, 2)]
    assert [_energy(node.tick(both)) for _ in range(4)] == [
        {None: 0, 10: 0, 20: 0},
        {None: 0, 10: 0, 20: 0},
        {None: 0, 10: TICK_MJ, 20: 0},  # at 15 s the tick ending at 5 s has waited 10 s: by its split
        {None: 0, 10: TICK_MJ, 20: 0},
    ]
    assert node.held == 2 * TICK_MJ  # at most max_wait of energy is ever held


def test_a_process_that_exited_while_held_gets_that_energy_with_no_watts() -> None:
    node = Node()
    node.tick([(10, 1), (11, 1), (20, 2)])
    node.tick([(10, 1), (11, 1), (20, 2)])
    out = node.tick([(10, 1), (20, 2)], collected=Collected({1: 1.0, 2: 0.0}, after_s=10.0))  # placed at 12.5 s
    shares = {s.pid: (s.energy_mj, s.power_w, s.gpu_instance_id) for s in out.shares}
    # (0 s, 12.5 s] of GI 1: the two ticks it shared with 11 equally, half of this one to 10 alone.
    assert shares == {None: (0, 0.0, None), 10: (15_000, 2.0, 1), 20: (0, 0.0, 2), 11: (10_000, 0.0, 1)}


def test_an_instance_part_goes_to_the_ticks_its_processes_ran_in() -> None:
    # GI 2's 1g job ran in the first tick only: the window's GI 2 energy is all its, none unattributed.
    node = Node()
    node.tick([(10, 1), (20, 2)])
    node.tick([(10, 1)])
    out = node.tick([(10, 1)], collected=Collected({1: 1 / 3, 2: 1.0}, after_s=10.0, dcgm_counter_mj=_counter_at(15)))
    assert _energy(out) == {None: 0, 10: 15_000, 20: 15_000}


def test_a_tick_without_processes_is_held_too_while_energy_is_held() -> None:
    node = Node()
    node.tick([(10, 1)])
    out = node.tick([])  # everyone left; the tick still waits for its window
    assert [(s.pid, s.energy_mj, s.mode) for s in out.shares] == [(None, 0, "none")]
    out = node.tick([], collected=Collected({1: 1 / 3, 2: 1.0}, after_s=10.0, dcgm_counter_mj=_counter_at(15)))
    # GI 1's half goes to the process it had in the window; GI 2 had none at all: unattributed.
    assert _energy(out) == {None: 15_000, 10: 15_000}
    assert {i.gpu_instance_id: i.energy_mj for i in out.instance_energy} == {1: 15_000, 2: 15_000}


def test_mig_switched_off_releases_what_was_held_into_the_next_split() -> None:
    node = Node()
    node.tick([(10, 1), (20, 2)])
    out = node.tick([(10, None), (20, None)], mig=False)  # 0.5 : 0.5 time-sliced (no utilisation known)
    assert _energy(out) == {None: 0, 10: TICK_MJ + TICK_MJ // 2, 20: TICK_MJ // 2}
    assert node.held == 0


def test_without_dated_samples_nothing_is_held() -> None:
    node = Node()
    batch = _batch(5.0, [(10, 1), (20, 2)], {1: 1 / 3, 2: 1.0}, None, mig=True)
    undated = batch.replace(mig_activity=tuple(dataclasses.replace(a, window_s=None) for a in batch.mig_activity))
    out = node.proc.process(undated)
    assert _energy(out) == {None: 0, 10: 5_000, 20: 5_000}
    assert out.device_power is undated.device_power  # nothing held, nothing rewritten


def test_mig_max_wait_0_splits_every_tick_at_once() -> None:
    node = Node({"mig_max_wait": "0s"})
    assert _energy(node.tick([(10, 1), (20, 2)])) == {None: 0, 10: TICK_MJ, 20: 0}


@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**7),  # the tick's active energy
            st.lists(st.sampled_from([1, 2, 3]), max_size=3),  # its processes' instances
            st.none() | st.tuples(st.floats(0.1, 40), st.dictionaries(st.sampled_from([1, 2, 3]), st.floats(0, 1))),
        ),
        max_size=40,
    ),
    st.floats(1, 60),
)
def test_every_held_millijoule_is_released_exactly_once(
    ticks: list[tuple[int, list[int], tuple[float, dict[int, float]] | None]], max_wait_s: float
) -> None:
    hold = Hold(max_wait_s)
    active = released = 0
    for n, (mj, instances, collected) in enumerate(ticks):
        members: dict[int | None, list[int]] = {gi: [100 * gi + k] for k, gi in enumerate(instances)}
        parts: dict[int | None, int] = dict(zip((1, 2, 3), [mj // 3, mj // 3, mj - 2 * (mj // 3)], strict=True))
        hold.add((5.0 * n, 5.0 * n + 5), None, parts, members, wait=n % 7 != 3)
        active += mj
        if collected is not None:
            window_s, weights = collected
            hold.settle(Collection(5.0 * n, 5.0 * n + 5, window_s, weights))
        hold.release_due(5.0 * n + 5)
        out = hold.take()
        assert all(v >= 0 for v in out.by_group.values())
        by_pid, _, unattributed = out.processes()
        assert sum(by_pid.values()) + unattributed == sum(out.by_group.values())
        released += sum(out.by_group.values())
        assert released + hold.held_mj == active
    hold.release_all()
    assert released + sum(hold.take().by_group.values()) == active
    assert hold.held_mj == 0


@pytest.mark.parametrize("wait_s", [0.0, 35.0])
def test_held_energy_never_outlives_max_wait(wait_s: float) -> None:
    hold = Hold(wait_s)
    for n in range(20):
        hold.add((5.0 * n, 5.0 * n + 5), None, {1: TICK_MJ}, {1: [10]}, wait=True)
        hold.release_due(5.0 * n + 5)
        assert hold.held_mj <= (wait_s // 5) * TICK_MJ
