"""pipeline.topology: go-gpuallocator's link table, the best free set of each size, node normalisation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.topology.matrices import kep_v100, pcie_only
from wattpipe.pipeline.topology import (
    EXACT_LIMIT,
    PCIE_SCORES,
    GpuTopology,
    Link,
    TopologyError,
    best_set,
    best_sets,
    normalise,
    set_score,
)


@st.composite
def topologies(draw: st.DrawFn, min_gpus: int = 2, max_gpus: int = EXACT_LIMIT) -> GpuTopology:
    count = draw(st.integers(min_gpus, max_gpus))
    links = [
        Link(a, b, draw(st.sampled_from(sorted(PCIE_SCORES))), draw(st.integers(0, 18)))
        for a, b in itertools.combinations(range(count), 2)
    ]
    return GpuTopology([f"GPU-{i}" for i in range(count)], links)


def test_link_scores_follow_go_gpuallocators_table() -> None:
    assert [Link(0, 1, level).score for level in ("PSB", "PIX", "PXB", "PHB", "NODE", "SYS")] == [
        60,
        50,
        40,
        30,
        20,
        10,
    ]
    assert Link(0, 1, "NODE", 2).score == 220
    assert Link(0, 1, "NODE", 2).name == "NV2"
    assert Link(0, 1, "SYS").name == "SYS"
    assert Link(0, 1, "NODE", 18).score == 1820


def test_bad_links_are_named() -> None:
    with pytest.raises(TopologyError, match="link 0-1: unknown PCIe level 'QPI'"):
        Link(0, 1, "QPI")
    with pytest.raises(TopologyError, match="link 2-3: 19 NVLinks"):
        Link(2, 3, "SYS", 19)
    with pytest.raises(TopologyError, match=r"missing pairs \['0-2', '1-2'\]"):
        GpuTopology(["a", "b", "c"], [Link(0, 1, "SYS")])


def test_kep_story_nv0_nv1_above_nv0_nv6() -> None:
    topology = kep_v100()
    assert topology.link(0, 1).name == "NV1"  # the KEP's story says two; its matrix says one
    assert topology.link(0, 6).name == "SYS"
    assert set_score(topology, [0, 1]) == 150 > set_score(topology, [0, 6]) == 10


def test_two_gpu_request_gets_a_pair_with_two_nvlinks() -> None:
    topology = kep_v100()
    chosen = best_set(topology, range(8), 2)
    assert chosen is not None
    assert topology.link(*chosen.gpus).nvlinks == 2
    # NV2 behind one PCIe switch (PIX 50 + 200) beats NV2 across the switch (NODE 20 + 200).
    assert chosen.gpus == (2, 3)
    assert chosen.score == 250


def test_best_sets_of_every_size_and_no_padding() -> None:
    topology = kep_v100()
    sets = best_sets(topology, [0, 1, 2])
    assert [(s.size, s.gpus) for s in sets] == [(1, (0,)), (2, (1, 2)), (3, (0, 1, 2))]
    assert sets[1].score == 220
    assert sets[2].score == 150 + 120 + 220
    assert best_set(topology, [0, 1, 2], 4) is None


def test_taken_best_gpus_lower_the_node_score() -> None:
    topology = kep_v100()
    free = best_set(topology, range(8), 4)
    taken = best_set(topology, [0, 1, 3, 4, 5, 7], 4)  # GPUs 2 and 6 allocated: both quads broken
    assert free is not None
    assert taken is not None
    assert free.score > taken.score


def test_nvlink_node_above_pcie_only_node() -> None:
    raw = {
        "node-1": best_set(kep_v100(), range(8), 2).score,  # type: ignore[union-attr]
        "node-2": best_set(pcie_only(), range(8), 2).score,  # type: ignore[union-attr]
    }
    assert normalise(raw) == {"node-1": 10, "node-2": 1}


def test_heuristic_above_the_exact_limit_returns_a_real_set() -> None:
    # Two KEP boards side by side, joined by SYS: 16 GPUs, heuristic search.
    left = kep_v100()
    links = [Link(a, b, "SYS") for a in range(16) for b in range(a + 1, 16) if a // 8 != b // 8]
    links += [Link(lk.a + off, lk.b + off, lk.pcie, lk.nvlinks) for lk in left.links for off in (0, 8)]
    topology = GpuTopology([f"GPU-{i}" for i in range(16)], links)
    chosen = best_set(topology, range(16), 4)
    assert chosen is not None
    assert not chosen.exact
    exact = best_set(left, range(8), 4)
    assert exact is not None
    assert chosen.score == exact.score == set_score(topology, chosen.gpus)


def test_normalise_reserves_zero_for_unknown_and_ties_get_ten() -> None:
    assert normalise({"a": 30, "b": 30, "c": None}) == {"a": 10, "b": 10, "c": 0}
    assert normalise({"a": None}) == {"a": 0}
    # The KEP's 100 * raw / (k(k-1)/2 * 1800) would give the CrossCPU-only pair 0; here it still ranks.
    assert normalise({"sys": 10, "nv1": 110, "nv2": 210}) == {"sys": 1, "nv1": 6, "nv2": 10}


@settings(max_examples=60, deadline=None)
@given(topologies(), st.data())
def test_chosen_set_is_never_worse_than_any_other(topology: GpuTopology, data: st.DataObject) -> None:
    free = data.draw(st.sets(st.integers(0, len(topology) - 1), min_size=1))
    size = data.draw(st.integers(1, len(free)))
    chosen = best_set(topology, free, size)
    assert chosen is not None
    assert len(chosen.gpus) == size
    assert set(chosen.gpus) <= free
    assert chosen.score == set_score(topology, chosen.gpus)
    assert all(chosen.score >= set_score(topology, other) for other in itertools.combinations(sorted(free), size))


@settings(max_examples=60, deadline=None)
@given(topologies(), st.data())
def test_scores_are_monotone_in_links(topology: GpuTopology, data: st.DataObject) -> None:
    pair = data.draw(st.sampled_from(topology.links))
    if pair.nvlinks == 18:
        return
    more = [Link(lk.a, lk.b, lk.pcie, lk.nvlinks + 1) if lk == pair else lk for lk in topology.links]
    richer = GpuTopology(topology.uuids, more)
    everything = range(len(topology))
    for size in range(1, len(topology) + 1):
        for combo in itertools.combinations(everything, size):
            gain = set_score(richer, combo) - set_score(topology, combo)
            assert gain == (100 if {pair.a, pair.b} <= set(combo) else 0)
        before, after = best_set(topology, everything, size), best_set(richer, everything, size)
        assert before is not None
        assert after is not None
        assert after.score >= before.score


@settings(max_examples=200)
@given(st.dictionaries(st.text(min_size=1, max_size=4), st.one_of(st.none(), st.integers(0, 40000)), min_size=1))
def test_normalisation_keeps_order(raw: dict[str, int | None]) -> None:
    scores = normalise(raw)
    assert set(scores) == set(raw)
    for a, b in itertools.permutations(raw, 2):
        ra, rb = raw[a], raw[b]
        if ra is not None and rb is not None and ra > rb:
            assert scores[a] >= scores[b]
        if ra is not None:
            assert 1 <= scores[a] <= 10
        else:
            assert scores[a] == 0
    known = [v for v in raw.values() if v is not None]
    if known:
        assert max(scores[n] for n, v in raw.items() if v == max(known)) == 10


@settings(max_examples=30, deadline=None)
@given(topologies(min_gpus=9, max_gpus=12), st.integers(2, 6))
def test_heuristic_gives_a_valid_set_with_its_true_score(topology: GpuTopology, size: int) -> None:
    chosen = best_set(topology, range(len(topology)), size)
    assert chosen is not None
    assert not chosen.exact
    assert len(set(chosen.gpus)) == size
    assert chosen.score == set_score(topology, chosen.gpus)
