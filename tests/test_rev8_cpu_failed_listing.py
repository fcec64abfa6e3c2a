"""rev8 review: a tick whose process listing failed (the procfs receiver timed out: its timeout is half the
interval, and a scan on a loaded node with a CPU-limited wattpipe can take that long).

That tick's active energy was left unattributed (``processes_unknown``), while the next listing's CPU-time deltas
span both ticks (the last good listing is kept): the next tick's energy was split by two ticks' CPU time. A
process that ran in the failed tick only got a share of the next tick's energy, and nobody got the failed
tick's. Below, A runs 5 s in the failed tick (50 J active), B 5 s in the next (10 J active): A 5 J, B 5 J, 50 J
unattributed. Both ticks' active energy (60 J) is known, and so are the CPU times over both (A 5 s, B 5 s): split
together, as a zone's gap is (processors/_cpu_gap.py), A 30 J and B 30 J, nothing unattributed.

Fixed (processors/_cpu_hold.py): the failed tick's zones are read, their idle/active split known, so each
zone's active energy is held (``DevicePower.held_energy_mj``) and split with the next listing's tick by its deltas,
which span both. Not as a zone gap (tried first: the zones treated as unread that tick): that dropped the tick's
``DevicePower`` (the node's power is known, only the processes' is not), held the zones back for as long as the
listing failed, and a gap counts no unseen container time, where the next tick's split does."""

from __future__ import annotations

from tests.processors.test_cpu_attribution import Node, processor, step, totals


def test_the_energy_of_a_tick_whose_listing_failed_is_split_with_the_next_listings_deltas() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(1, comm="a")
    node.spawn(2, comm="b")
    proc = processor()
    step(proc, node)
    node.listed = False
    node.half_busy("intel-rapl:0", 100_000)  # 50 J active
    node.run(1, 5.0)
    step(proc, node)
    node.listed = True
    node.half_busy("intel-rapl:0", 20_000)  # 10 J active
    node.run(2, 5.0)
    out = step(proc, node)
    shares = {key: t.energy_mj for (key, _), t in totals(out, "process").items()}
    assert shares == {"1": 30_000, "2": 30_000}  # was {"1": 5_000, "2": 5_000}
    assert proc.zone_totals["intel-rapl:0"].unattributed_mj == 0  # was 50,000
