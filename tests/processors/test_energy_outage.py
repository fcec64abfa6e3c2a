"""A device that does not answer: its series' watts are absent, their totals kept; one gone for longer than
``device_gone_after`` ends its series, and they and its device totals are dropped after the retention
(issue 14, bug 6)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.processors.test_idle_energy import energy, power, share
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DevicePower, DeviceTotals, GpuShare, InstanceEnergy, Totals, Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.energy import EnergyConfig, EnergyProcessor

T0 = Timestamp(0.0, 0.0)


def member(pid: int, pod: str) -> Workload:
    return Workload(time=T0, pid=pid, container_id=f"c-{pod}", container_name="main", pod_uid=pod, pod_name=pod)


ROSTER = (
    Workload(time=T0, pid=None, container_id="c-a", container_name="main", pod_uid="a", pod_name="a", listed="api"),
    Workload(time=T0, pid=None, container_id="c-b", container_name="main", pod_uid="b", pod_name="b", listed="api"),
    Workload(time=T0, pid=None, listed="api"),
)


def step(proc: EnergyProcessor, clock: SteppedClock, up: list[str], shares: list[GpuShare]) -> Batch:
    """One 5 s tick: the devices in ``up`` answer (500 mJ each, plus their shares); pid 1 (pod a) uses G,
    pid 2 (pod b) uses H; G also has a MIG instance that gets 10 mJ while it answers."""
    powers: list[DevicePower] = []
    for device in up:
        mj = 500 + sum(s.energy_mj for s in shares if s.device_id == device)
        powers.append(power(clock, mj, 500, device=device))
    instances = tuple(
        InstanceEnergy(time=clock.now(), device_id="G", gpu_instance_id=1, energy_mj=10, power_w=0.002)
        for _ in range(1)
        if "G" in up
    )
    out = proc.process(
        Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=tuple(powers),
            shares=tuple(shares),
            instance_energy=instances,
            workloads=(member(1, "a"), member(2, "b"), *ROSTER),
        )
    )
    clock.advance(5.0)
    return out


def on(b: Batch, device: str) -> dict[tuple[str, str], Totals]:
    return {(t.scope, t.key): t for t in b.totals if t.device_id == device}


def device_totals(b: Batch) -> dict[str, DeviceTotals]:
    return {d.device_id: d for d in b.device_totals}


def test_series_of_a_device_that_did_not_answer_have_no_watts_and_keep_their_totals() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, ["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])
    b = step(proc, clock, ["H"], [share(clock, 2, 50, "H")])  # G did not answer
    assert {k: (t.energy_mj, t.state, t.power_w) for k, t in on(b, "G").items()} == {
        ("process", "1"): (100, "running", None),
        ("container", "c-a"): (100, "running", None),
        ("pod", "a"): (100, "running", None),
        ("instance", "1"): (10, "running", None),
    }
    assert {k: t.power_w for k, t in on(b, "H").items()} == {
        ("process", "2"): 0.01,
        ("container", "c-b"): 0.01,
        ("pod", "b"): 0.01,
    }
    b = step(proc, clock, ["G", "H"], [share(clock, 1, 30, "G"), share(clock, 2, 50, "H")])  # G is back
    assert {k: (t.energy_mj, t.state, t.power_w) for k, t in on(b, "G").items()} == {
        ("process", "1"): (130, "running", 0.006),
        ("container", "c-a"): (130, "running", 0.006),
        ("pod", "a"): (130, "running", 0.006),
        ("instance", "1"): (20, "running", 0.002),
    }


def test_a_device_gone_longer_than_device_gone_after_ends_its_series_then_they_and_it_are_dropped() -> None:
    clock = SteppedClock()
    proc = energy(clock, device_gone_after=30.0, terminated_retention=12.0)
    step(proc, clock, ["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])  # t = 0: G seen
    states: dict[int, set[str]] = {}
    exported: dict[int, bool] = {}
    for t_s in range(5, 60, 5):
        b = step(proc, clock, ["H"], [share(clock, 2, 50, "H")])
        states[t_s] = {t.state for t in on(b, "G").values()}
        exported[t_s] = "G" in device_totals(b)
        assert all(t.power_w is None for t in on(b, "G").values())
        assert {t.state for t in on(b, "H").values()} == {"running"}
    assert states == {
        **{t_s: {"running"} for t_s in (5, 10, 15, 20, 25, 30)},
        **{t_s: {"terminated"} for t_s in (35, 40, 45)},  # unseen for more than 30 s: gone
        **{t_s: set() for t_s in (50, 55)},  # 15 s after it ended > 12 s retention: dropped
    }
    assert exported == {t_s: t_s <= 45 for t_s in range(5, 60, 5)}  # as long as its series


def test_a_device_that_comes_back_continues_its_counters() -> None:
    clock = SteppedClock()
    proc = energy(clock, device_gone_after=30.0, terminated_retention=12.0)
    first = step(proc, clock, ["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])
    start = device_totals(first)["G"].start
    for _ in range(7):  # until t = 35: gone, its series terminated
        b = step(proc, clock, ["H"], [])
    assert {t.state for t in on(b, "G").values()} == {"terminated"}
    b = step(proc, clock, ["G", "H"], [share(clock, 1, 30, "G")])  # back within the retention: continued
    assert {k: (t.energy_mj, t.state) for k, t in on(b, "G").items()} == {
        ("process", "1"): (130, "running"),
        ("container", "c-a"): (130, "running"),
        ("pod", "a"): (130, "running"),
        ("instance", "1"): (20, "running"),
    }
    for _ in range(10):  # gone again, for long enough that its series and device totals are dropped
        b = step(proc, clock, ["H"], [])
    assert "G" not in device_totals(b)
    assert on(b, "G") == {}
    b = step(proc, clock, ["G", "H"], [share(clock, 1, 5, "G")])
    g = device_totals(b)["G"]
    # The device's counters go on from where they were, from the same start: no reset for Prometheus to see.
    assert (g.energy_mj, g.attributed_energy_mj, g.start) == (600 + 530 + 505, 135, start)
    assert {k: t.energy_mj for k, t in on(b, "G").items()} == {
        ("process", "1"): 5,  # its series were dropped: they start again
        ("container", "c-a"): 5,
        ("pod", "a"): 5,
        ("instance", "1"): 10,
    }


def test_wattpipe_being_down_is_not_an_outage_of_its_devices(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    proc = energy(clock, store, device_gone_after=30.0)
    step(proc, clock, ["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])
    store.put("metrics/energy", proc.snapshot())
    store.save()
    clock.advance(3600.0)  # wattpipe was down for an hour
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = energy(clock, reloaded, device_gone_after=30.0)
    b = step(again, clock, [], [])  # its first tick: a counter baseline only, no device power yet
    assert {(t.scope, t.energy_mj, t.state, t.power_w) for t in b.totals if t.scope == "process"} == {
        ("process", 100, "running", None),
        ("process", 50, "running", None),
    }
    assert set(device_totals(b)) == {"G", "H"}
    for _ in range(5):  # 25 s more without G: within device_gone_after of the restart
        b = step(again, clock, ["H"], [share(clock, 2, 50, "H")])
    assert on(b, "G")[("process", "1")].state == "running"


def test_container_and_pod_watts_are_absent_in_a_tick_without_workloads() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, ["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])
    # The k8s processor failed this tick: no workloads field at all.
    b = proc.process(
        Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=(power(clock, 600, 500, device="G"),), shares=(share(clock, 1, 100, "G"),)
        )
    )
    assert {(t.key, t.energy_mj, t.power_w) for t in b.totals if t.scope in ("container", "pod")} == {
        ("c-a", 100, None),
        ("a", 100, None),
        ("c-b", 50, None),
        ("b", 50, None),
    }


def test_a_tick_whose_energy_could_not_be_split_ends_nobody_and_knows_nobody_s_watts() -> None:
    """The first tick after a long outage spans it (``unattributable="gap"``): attribution gives the device's
    active energy to nobody, which is not its processes having exited."""
    clock = SteppedClock()
    proc = energy(clock)
    step(proc, clock, ["G", "H"], [share(clock, 1, 100, "G"), share(clock, 2, 50, "H")])
    gap = dataclasses.replace(power(clock, 90_500, 500, device="G"), interval_s=90.0, unattributable="gap")
    b = proc.process(
        Batch(time=clock.now(), interval_s=90.0, node="n").replace(
            device_power=(gap,), shares=(share(clock, None, 90_000, "G"),), workloads=(member(1, "a"), *ROSTER)
        )
    )
    assert {k: (t.energy_mj, t.state, t.power_w) for k, t in on(b, "G").items()} == {
        ("process", "1"): (100, "running", None),
        ("container", "c-a"): (100, "running", None),
        ("pod", "a"): (100, "running", None),
        ("instance", "1"): (10, "running", None),
    }
    (g,) = [d for d in b.device_totals if d.device_id == "G"]
    assert (g.energy_mj, g.unattributed_energy_mj) == (600 + 90_500, 90_000)


def test_device_gone_after_defaults_to_ten_minutes() -> None:
    assert EnergyConfig().device_gone_after == 600.0
