"""rev8 review: a tick whose process listing failed (the procfs receiver timed out: its timeout is half the
interval, and a scan on a loaded node with a CPU-limited wattpipe can take that long).

That tick's active energy is left unattributed (``processes_unknown``), while the next listing's CPU-time deltas
span both ticks (the last good listing is kept): the next tick's energy is split by two ticks' CPU time. A
process that ran in the failed tick only gets a share of the next tick's energy, and nobody gets the failed
tick's. Below, A runs 5 s in the failed tick (50 J active), B 5 s in the next (10 J active): A 5 J, B 5 J, 50 J
unattributed. Both ticks' active energy (60 J) is known, and so are the CPU times over both (A 5 s, B 5 s): split
together, as a zone's gap is (processors/_cpu_gap.py), A 30 J and B 30 J, nothing unattributed.

Not fixed here (tried): a fix treats the zones of a tick without a listing (or without /proc/stat) as not read,
so that the gap machinery splits their energy with the next listing's deltas (``_absent``/``_split`` given the
batch without its zones, for one tick after a good one: a listing down for good must not hold the zones' energy
back). It passes this test, but it changes what the ``processes_unknown`` ticks say (no DevicePower that tick:
docs/attribution.md, tests/processors/test_cpu_attribution.py's two tests of that tick, the unseen property that
expects a zone record every tick, the end-to-end property whose last tick may be held) and, with ``unseen:
containers``, a gap counts no unseen time (the two ticks' unseen share would go to the listed processes, where
now the next tick bills it): the gap's merge would have to carry the containers' unseen seconds first."""

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
