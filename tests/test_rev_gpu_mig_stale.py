"""Review of the GPU side: dcgm-exporter that answers but collects no more (a hung collection: it serves its
last answer again and again). Its activity is as old as its last collection, yet it was used as this tick's,
in mode ``mig``, for as long as the repeats went on: a process on an instance idle at that moment got no
energy for hours. A collection overdue past twice its interval counts as silence (``mig_held`` for
``activity_hold``, then slices)."""

from __future__ import annotations

from tests.processors.test_mig_window import Collected, Node, _counter_at


def test_a_dcgm_exporter_repeating_one_collection_is_not_fresh_activity_for_ever() -> None:
    node = Node()
    both = [(10, 1), (20, 2)]
    node.tick(both, collected=Collected({1: 1.0, 2: 0.0}, after_s=0.0, dcgm_counter_mj=_counter_at(5)))
    modes = []
    for _ in range(40):  # 5 s … 205 s: the same answer every scrape, never a new collection
        out = node.tick(both, activity={1: 1.0, 2: 0.0})
        modes.append(out.shares[0].mode)
    assert modes[0] == "mig"
    watts = {s.pid: s.power_w for s in out.shares}
    assert modes[-1] == "mig_slices"
    assert watts == {None: 0.0, 10: 1.5, 20: 0.5}  # by compute slices: 3g and 1g


def test_collections_that_keep_coming_stay_mig() -> None:
    node = Node()
    both = [(10, 1), (20, 2)]
    modes = []
    for n in range(40):
        t_s = 5.0 * (n + 1)
        collected = Collected({1: 1.0, 2: 0.0}, after_s=t_s - 5.0) if n % 6 == 5 else None
        modes.append(node.tick(both, activity={1: 1.0, 2: 0.0}, collected=collected).shares[0].mode)
    assert set(modes) == {"mig"}
