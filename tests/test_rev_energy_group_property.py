"""Property: container and pod totals, whatever mix of name-only and UID-known records, pods recreated under
their names, containers restarted, lists present or not, the GPU gone and back, and restarts on the state file: Σ pod totals (and Σ container totals) equal
the energy of the processes that had a pod, and no exported series decreases (the rev-energy review)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import DevicePower, GpuShare, Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.energy import EnergyConfig, EnergyProcessor

Proc = tuple[int, int, int, bool, int]  # pid, pod (0/1), generation (UID, container id), UID known, mJ
procs = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 1), st.integers(0, 1), st.booleans(), st.integers(0, 300)),
    max_size=3,
    unique_by=lambda p: p[0],
)
Listing = tuple[str, list[tuple[int, int]]]  # none | api | allocations, the (pod, generation) pairs listed
listings = st.tuples(
    st.sampled_from(["none", "api", "allocations"]),
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), max_size=2, unique_by=lambda p: p[0]),
)


def _member(now: object, pid: int | None, pod: int, gen: int, uid_known: bool, listed: str | None = None) -> Workload:
    return Workload(
        time=now,  # type: ignore[arg-type]
        pid=pid,
        container_id=f"c{pod}-{gen}" if uid_known else None,
        container_name="main",
        pod_uid=f"uid{pod}-{gen}" if uid_known else None,
        pod_name=f"p{pod}",
        pod_namespace="ns",
        listed=listed,  # type: ignore[arg-type]
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(procs, listings, st.booleans(), st.booleans()), min_size=1, max_size=12))
def test_group_totals_add_up_and_never_decrease(ticks: list[tuple[list[Proc], Listing, bool, bool]]) -> None:
    clock = SteppedClock()
    store = StateStore(None, clock, "n")

    def started() -> EnergyProcessor:
        p = EnergyProcessor(
            EnergyConfig(terminated_retention=1e6, max_terminated=10_000, device_gone_after=10.0),
            make_context("energy", "processor", clock, pipeline="metrics", state=store),
        )
        p.start()
        return p

    proc = started()
    last: dict[tuple[str, str, object], int] = {}
    expected = 0
    for events, (source, pods), restart, answered in ticks:
        events = events if answered else []
        if restart:  # wattpipe restarts on its state file
            store.put(proc.ctx.state_key, proc.snapshot())
            proc = started()
        now = clock.now()
        shares = [
            GpuShare(time=now, device_id="G", pid=pid, share=0.5, energy_mj=mj, power_w=mj / 5000)
            for pid, _, _, _, mj in events
        ]
        workloads = [_member(now, pid, pod, gen, known) for pid, pod, gen, known, _ in events]
        if source != "none":
            workloads.append(Workload(time=now, pid=None, listed=source))  # type: ignore[arg-type]
            workloads += [_member(now, None, pod, gen, source == "api", source) for pod, gen in pods]
        total = sum(s.energy_mj for s in shares)
        expected += total
        power = DevicePower(
            time=now, device_id="G", interval_s=5.0, power_w=total / 5000, idle_w=None, active_w=0.0,
            energy_mj=total, idle_energy_mj=0, active_energy_mj=total,
        )  # fmt: skip
        batch = Batch(time=now, interval_s=5.0, node="n").replace(workloads=tuple(workloads))
        if answered:  # else G does not answer (gone after 10 s)
            batch = batch.replace(device_power=(power,), shares=tuple(shares))
        out = proc.process(batch)
        clock.advance(5.0)
        for scope in ("pod", "container"):
            assert sum(t.energy_mj for t in out.totals if t.scope == scope) == expected, scope
        for t in out.totals:
            key = (t.scope, t.key, t.start)
            assert t.energy_mj >= last.get(key, 0), (key, t.energy_mj, last.get(key))
            last[key] = t.energy_mj
