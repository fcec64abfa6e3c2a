"""idle: counter deltas and the idle baseline; energy: monotonic totals across exit, outage and restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuProcessSample, GpuShare, HostProcess, Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.energy import EnergyConfig, EnergyProcessor
from wattpipe.processors.idle import IdleConfig, IdleProcessor, split_idle


class Gpu:
    """A hand-driven GPU: the counter integrates the power we say, over the clock."""

    def __init__(self, clock: SteppedClock, uuid: str = "GPU-a", counter_mj: float = 5_000_000.0) -> None:
        self.clock, self.uuid, self.counter_mj, self.power_w = clock, uuid, counter_mj, 0.0

    def run(self, watts: float, seconds: float) -> None:
        self.power_w = watts
        self.counter_mj += watts * seconds * 1000
        self.clock.advance(seconds)

    def sample(self, *, counter: bool = True, up: bool = True) -> DeviceSample:
        return DeviceSample(
            time=self.clock.now(),
            device_id=self.uuid,
            power_w=self.power_w if up else None,
            energy_mj=self.counter_mj if counter and up else None,
            up=up,
        )


def batch(clock: SteppedClock, devices: list[DeviceSample], pids: list[int] | None = None) -> Batch:
    b = Batch(time=clock.now(), interval_s=5.0, node="n").replace(devices=tuple(devices))
    if pids is not None:
        b = b.replace(
            gpu_processes=tuple(
                GpuProcessSample(time=clock.now(), device_id=d.device_id, pid=p) for d in devices for p in pids
            )
        )
    return b


def idle(clock: SteppedClock, state: StateStore | None = None, **options: object) -> IdleProcessor:
    p = IdleProcessor(IdleConfig(**options), make_context("idle", "processor", clock, pipeline="metrics", state=state))
    p.start()
    return p


def test_first_reading_sets_the_baseline_then_counter_deltas_give_energy() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    assert proc.process(batch(clock, [gpu.sample()], [1])).device_power == ()
    gpu.run(300.0, 5.0)
    (p,) = proc.process(batch(clock, [gpu.sample()], [1])).device_power
    assert (p.energy_mj, p.source, p.interval_s) == (1_500_000, "counter", 5.0)
    assert p.idle_w is None  # not yet known: absent, and all energy is active
    assert (p.idle_energy_mj, p.active_energy_mj, p.power_w) == (0, 1_500_000, pytest.approx(300.0))


def test_idle_is_learned_only_with_no_process_and_is_the_lowest_seen() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    gpu.power_w = 80.0  # the readings at both ends of a learning interval must agree with its counter
    proc = idle(clock)
    proc.process(batch(clock, [gpu.sample()], []))
    gpu.run(80.0, 5.0)
    (p,) = proc.process(batch(clock, [gpu.sample()], [])).device_power
    assert p.idle_w == pytest.approx(80.0)
    gpu.run(60.0, 5.0)  # busy at a lower power: not idle, so not learned
    proc.process(batch(clock, [gpu.sample()], [7]))
    assert proc.idle_w("GPU-a") == pytest.approx(80.0)
    gpu.run(70.0, 5.0)  # quiet now, but busy at the start of the interval: not learned either
    proc.process(batch(clock, [gpu.sample()], []))
    assert proc.idle_w("GPU-a") == pytest.approx(80.0)
    for watts in (70.0, 90.0, 90.0):
        gpu.run(watts, 5.0)
        proc.process(batch(clock, [gpu.sample()], []))
    assert proc.idle_w("GPU-a") == pytest.approx(70.0)
    gpu.run(300.0, 5.0)
    (p,) = proc.process(batch(clock, [gpu.sample()], [7])).device_power
    assert (p.idle_energy_mj, p.active_energy_mj) == (350_000, 1_150_000)


def test_idle_is_not_learned_without_a_process_source() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, [gpu.sample()]))
    gpu.run(500.0, 5.0)
    proc.process(batch(clock, [gpu.sample()]))  # no gpu_processes field at all: cannot know it was idle
    assert proc.idle_w("GPU-a") is None


def test_learned_idle_survives_a_restart_through_the_state_file(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    gpu = Gpu(clock)
    gpu.power_w = 65.0
    proc = idle(clock, store)
    proc.process(batch(clock, [gpu.sample()], []))
    gpu.run(65.0, 5.0)
    proc.process(batch(clock, [gpu.sample()], []))
    store.put("metrics/idle", proc.snapshot())
    store.save()
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = idle(clock, reloaded)
    assert again.idle_w("GPU-a") == pytest.approx(65.0)


def test_fixed_idle_per_device_and_default() -> None:
    clock = SteppedClock()
    proc = idle(clock, mode="fixed", watts=50.0, devices={"GPU-b": 20.0})
    assert (proc.idle_w("GPU-a"), proc.idle_w("GPU-b")) == (50.0, 20.0)
    with pytest.raises(ValueError, match="needs watts"):
        IdleConfig(mode="fixed")
    with pytest.raises(ValueError, match="for mode fixed"):
        IdleConfig(watts=10)


def test_no_counter_uses_power_times_time_and_says_so() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    gpu.power_w = 100.0
    proc.process(batch(clock, [gpu.sample(counter=False)], [1]))
    gpu.run(200.0, 10.0)
    (p,) = proc.process(batch(clock, [gpu.sample(counter=False)], [1])).device_power
    assert (p.source, p.energy_mj) == ("power", 1_500_000)  # trapezoid of 100 W and 200 W over 10 s


def test_counter_going_backwards_falls_back_to_power_for_that_tick(caplog: pytest.LogCaptureFixture) -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, [gpu.sample()], [1]))
    gpu.run(100.0, 5.0)
    gpu.counter_mj = 10.0  # driver reloaded
    (p,) = proc.process(batch(clock, [gpu.sample()], [1])).device_power
    assert (p.source, p.energy_mj) == ("power", 250_000)  # trapezoid of 0 W and 100 W over 5 s
    assert "went backwards" in caplog.text


def test_energy_across_a_device_outage_is_measured_when_it_returns() -> None:
    clock = SteppedClock()
    gpu = Gpu(clock)
    proc = idle(clock)
    proc.process(batch(clock, [gpu.sample()], [1]))
    gpu.run(100.0, 5.0)
    assert proc.process(batch(clock, [gpu.sample(up=False)], [])).device_power == ()
    gpu.run(100.0, 5.0)
    (p,) = proc.process(batch(clock, [gpu.sample()], [1])).device_power
    assert (p.energy_mj, p.interval_s) == (1_000_000, 10.0)  # nothing lost


@given(st.integers(0, 10**9), st.floats(0, 2000, allow_nan=False), st.floats(0.001, 3600, allow_nan=False))
def test_idle_and_active_add_up_exactly(energy_mj: int, idle_w: float, interval_s: float) -> None:
    idle_mj, active_mj = split_idle(energy_mj, idle_w, interval_s)
    assert idle_mj + active_mj == energy_mj
    assert idle_mj >= 0
    assert active_mj >= 0


# --- energy ---------------------------------------------------------------------------------


def share(clock: SteppedClock, pid: int | None, mj: int, device: str = "G") -> GpuShare:
    return GpuShare(time=clock.now(), device_id=device, pid=pid, share=1.0, energy_mj=mj, power_w=mj / 5000)


def power(clock: SteppedClock, mj: int, idle_mj: int = 0, device: str = "G") -> DevicePower:
    return DevicePower(
        time=clock.now(), device_id=device, interval_s=5.0, power_w=mj / 5000, idle_w=None, active_w=0.0,
        energy_mj=mj, idle_energy_mj=idle_mj, active_energy_mj=mj - idle_mj,
    )  # fmt: skip


def energy(clock: SteppedClock, state: StateStore | None = None, **options: object) -> EnergyProcessor:
    p = EnergyProcessor(
        EnergyConfig(**options), make_context("energy", "processor", clock, pipeline="metrics", state=state)
    )
    p.start()
    return p


def tick(proc: EnergyProcessor, clock: SteppedClock, powers: list[DevicePower], shares: list[GpuShare]) -> Batch:
    out = proc.process(
        Batch(time=clock.now(), interval_s=5.0, node="n").replace(device_power=tuple(powers), shares=tuple(shares))
    )
    clock.advance(5.0)
    return out


def totals_by_pid(b: Batch) -> dict[str, tuple[int, str]]:
    return {t.key: (t.energy_mj, t.state) for t in b.totals}


def test_totals_grow_and_exited_processes_stay_terminated_for_the_retention() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=12.0)
    tick(proc, clock, [power(clock, 300, 100)], [share(clock, 1, 100), share(clock, 2, 100)])
    b = tick(proc, clock, [power(clock, 300, 100)], [share(clock, 1, 200)])
    assert totals_by_pid(b) == {"1": (300, "running"), "2": (100, "terminated")}
    (dt,) = b.device_totals
    assert (dt.energy_mj, dt.idle_energy_mj, dt.attributed_energy_mj, dt.unattributed_energy_mj) == (600, 200, 400, 0)
    b = tick(proc, clock, [power(clock, 300, 100)], [share(clock, 1, 200)])
    assert totals_by_pid(b)["2"] == (100, "terminated")  # 5 s after exit: kept
    b = tick(proc, clock, [power(clock, 300, 100)], [share(clock, 1, 200)])
    assert "2" in totals_by_pid(b)  # 10 s
    b = tick(proc, clock, [power(clock, 300, 100)], [share(clock, 1, 200)])
    assert "2" not in totals_by_pid(b)  # 15 s > 12 s retention: dropped


def test_an_outage_of_the_device_ends_nobody() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    tick(proc, clock, [power(clock, 100)], [share(clock, 1, 100)])
    b = tick(proc, clock, [], [])  # the device was not read this tick
    assert totals_by_pid(b) == {"1": (100, "running")}


def test_unattributed_energy_is_kept_in_device_totals() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    b = tick(proc, clock, [power(clock, 500, 100)], [share(clock, None, 400)])
    (dt,) = b.device_totals
    assert (dt.unattributed_energy_mj, dt.attributed_energy_mj) == (400, 0)
    assert dt.energy_mj == dt.idle_energy_mj + dt.attributed_energy_mj + dt.unattributed_energy_mj


def test_max_terminated_keeps_the_biggest_consumers() -> None:
    clock = SteppedClock()
    proc = energy(clock, max_terminated=2)
    tick(proc, clock, [power(clock, 600)], [share(clock, p, p * 100) for p in (1, 2, 3)])
    b = tick(proc, clock, [power(clock, 0)], [])
    assert totals_by_pid(b) == {"2": (200, "terminated"), "3": (300, "terminated")}


def test_totals_survive_a_restart_and_keep_growing(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    proc = energy(clock, store)
    tick(proc, clock, [power(clock, 1000, 200)], [share(clock, 42, 800)])
    store.put("metrics/energy", proc.snapshot())
    store.save()
    clock.advance(30.0)  # wattpipe was down for a while
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = energy(clock, reloaded)
    b = tick(again, clock, [power(clock, 1000, 200)], [share(clock, 42, 800)])
    (total,) = b.totals
    assert (total.energy_mj, total.state) == (1600, "running")
    assert total.start is not None
    assert total.start.wall_s == pytest.approx(clock.wall() - 5.0 - 30.0 - 5.0)  # the series' true start
    (dt,) = b.device_totals
    assert dt.energy_mj == 2000


@given(st.lists(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 10**6)), max_size=5), min_size=1, max_size=20))
def test_totals_never_go_backwards(ticks: list[list[tuple[int, int]]]) -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    seen: dict[str, int] = {}
    for shares in ticks:
        by_pid: dict[int, int] = {}
        for pid, mj in shares:
            by_pid[pid] = mj
        b = tick(proc, clock, [power(clock, sum(by_pid.values()))], [share(clock, p, mj) for p, mj in by_pid.items()])
        for t in b.totals:
            assert t.energy_mj >= seen.get(t.key, 0)
            seen[t.key] = t.energy_mj


@given(
    st.integers(1000, 10**7),
    st.floats(0, 10**6, allow_nan=False),
    st.lists(st.floats(0, 10**5, allow_nan=False), min_size=1, max_size=30),
)
def test_a_wrapping_counter_loses_nothing_and_deltas_telescope(
    range_mj: int, start_mj: float, steps: list[float]
) -> None:
    """RAPL-like counters wrap at a declared range; the summed deltas equal the true energy to the mJ."""
    steps = [min(step, range_mj - 1) for step in steps]  # at most one wrap per tick
    clock = SteppedClock()
    proc = idle(clock)
    reading = start_mj % range_mj
    total_true = 0.0
    got = 0

    def sample() -> DeviceSample:
        return DeviceSample(time=clock.now(), device_id="cpu", energy_mj=reading, energy_counter_max_mj=float(range_mj))

    proc.process(batch(clock, [sample()], [1]))
    for step in steps:
        clock.advance(1.0)
        reading = (reading + step) % range_mj
        total_true += step
        (p,) = proc.process(batch(clock, [sample()], [1])).device_power
        assert p.source == "counter"
        got += p.energy_mj
    assert abs(got - total_true) <= 1.0 + 1e-6 * total_true  # floors of the first and last reading


def host(clock: SteppedClock, pid: int, start: int, comm: str, container: str | None = None) -> HostProcess:
    return HostProcess(time=clock.now(), pid=pid, comm=comm, start_time_ticks=start, container_id=container)


def tick_with_hosts(
    proc: EnergyProcessor, clock: SteppedClock, shares: list[GpuShare], hosts: list[HostProcess]
) -> Batch:
    total = sum(s.energy_mj for s in shares)
    out = proc.process(
        Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=(power(clock, total),), shares=tuple(shares), host_processes=tuple(hosts)
        )
    )
    clock.advance(5.0)
    return out


def test_process_series_carry_procfs_identity() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    b = tick_with_hosts(proc, clock, [share(clock, 7, 100)], [host(clock, 7, 1234, "python", "c" * 64)])
    (t,) = b.totals
    assert dict(t.extra) == {"comm": "python", "container_id": "c" * 64}


def test_a_reused_pid_ends_the_old_series_and_starts_a_new_one() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    tick_with_hosts(proc, clock, [share(clock, 7, 100)], [host(clock, 7, 1000, "old")])
    tick_with_hosts(proc, clock, [share(clock, 7, 100)], [host(clock, 7, 1000, "old")])
    b = tick_with_hosts(proc, clock, [share(clock, 7, 40)], [host(clock, 7, 5555, "new")])
    rows = sorted((dict(t.extra)["comm"], t.energy_mj, t.state) for t in b.totals)
    assert rows == [("new", 40, "running"), ("old", 200, "terminated")]


def test_a_series_keeps_its_energy_when_its_start_time_becomes_known(tmp_path: Path) -> None:
    clock = SteppedClock()
    proc = energy(clock)
    tick_with_hosts(proc, clock, [share(clock, 7, 100)], [])  # procfs not answering yet
    b = tick_with_hosts(proc, clock, [share(clock, 7, 50)], [host(clock, 7, 42, "python")])
    (t,) = b.totals
    assert (t.energy_mj, t.state, dict(t.extra)) == (150, "running", {"comm": "python"})
    store = StateStore(tmp_path / "s.json", clock, "n")
    store.put("metrics/energy", proc.snapshot())
    store.save()
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = energy(clock, reloaded)
    b = tick_with_hosts(again, clock, [share(clock, 7, 10)], [host(clock, 7, 42, "python")])
    (t,) = b.totals
    assert (t.energy_mj, dict(t.extra)) == (160, {"comm": "python"})  # same process after a restart: continued


def workload(pid: int, container: str, pod_uid: str, name: str = "trainer-0") -> Workload:
    return Workload(
        time=Timestamp(0.0, 0.0), pid=pid, container_id=container, container_name="main", pod_uid=pod_uid,
        pod_name=name, pod_namespace="ml",
    )  # fmt: skip


def tick_k8s(proc: EnergyProcessor, clock: SteppedClock, shares: list[GpuShare], workloads: list[Workload]) -> Batch:
    total = sum(s.energy_mj for s in shares)
    out = proc.process(
        Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=(power(clock, total),), shares=tuple(shares), workloads=tuple(workloads)
        )
    )
    clock.advance(5.0)
    return out


def by_scope(b: Batch, scope: str) -> dict[str, tuple[int, str]]:
    return {t.key: (t.energy_mj, t.state) for t in b.totals if t.scope == scope}


def test_container_and_pod_totals_keep_growing_when_a_member_process_exits() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    ws = [workload(1, "c1", "uid-a"), workload(2, "c1", "uid-a"), workload(3, "c2", "uid-a")]
    tick_k8s(proc, clock, [share(clock, 1, 100), share(clock, 2, 50), share(clock, 3, 10)], ws)
    b = tick_k8s(proc, clock, [share(clock, 2, 50), share(clock, 3, 10)], ws)  # pid 1 exited
    assert by_scope(b, "container") == {"c1": (200, "running"), "c2": (20, "running")}
    assert by_scope(b, "pod") == {"uid-a": (220, "running")}
    assert by_scope(b, "process")["1"] == (100, "terminated")
    b = tick_k8s(proc, clock, [share(clock, 3, 10)], ws)  # none of container c1's processes is left
    # Its pod may still exist (no k8s processor here lists the pods): running at 0 W. test_group_series has the rest.
    assert by_scope(b, "container") == {"c1": (200, "running"), "c2": (30, "running")}
    assert by_scope(b, "pod") == {"uid-a": (230, "running")}
    (c1,) = [t for t in b.totals if t.scope == "container" and t.key == "c1"]
    assert dict(c1.extra) == {
        "container_name": "main",
        "pod_uid": "uid-a",
        "pod_name": "trainer-0",
        "pod_namespace": "ml",
    }


def test_without_a_kubernetes_processor_there_are_no_container_or_pod_series() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    b = tick(proc, clock, [power(clock, 100)], [share(clock, 1, 100)])
    assert {t.scope for t in b.totals} == {"process"}


def test_container_and_pod_totals_survive_a_restart(tmp_path: Path) -> None:
    clock = SteppedClock()
    store = StateStore(tmp_path / "s.json", clock, "n")
    proc = energy(clock, store)
    tick_k8s(proc, clock, [share(clock, 1, 70)], [workload(1, "c1", "uid-a")])
    store.put("metrics/energy", proc.snapshot())
    store.save()
    reloaded = StateStore(tmp_path / "s.json", clock, "n")
    reloaded.load()
    again = energy(clock, reloaded)
    b = tick_k8s(again, clock, [share(clock, 1, 30)], [workload(1, "c1", "uid-a")])
    assert by_scope(b, "container") == {"c1": (100, "running")}
    assert by_scope(b, "pod") == {"uid-a": (100, "running")}


def test_degraded_mode_splits_a_device_equally_among_the_containers_that_own_it() -> None:
    clock = SteppedClock()
    proc = energy(clock)

    def owner(pod: str) -> Workload:
        return Workload(
            time=clock.now(), pid=None, pod_name=pod, pod_namespace="ml", container_name="main",
            extra=(("degraded", "no_host_pid"), ("device_id", "G")),
        )  # fmt: skip

    b = tick_k8s(proc, clock, [share(clock, 101, 70), share(clock, 102, 31)], [owner("a-0"), owner("b-0")])
    assert by_scope(b, "container") == {"ml/a-0/main": (51, "running"), "ml/b-0/main": (50, "running")}
    assert by_scope(b, "pod") == {"ml/a-0": (51, "running"), "ml/b-0": (50, "running")}


def test_container_series_carry_the_runtime_procfs_read_from_the_cgroup() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    w = workload(1, "c" * 64, "uid-a")
    h = HostProcess(
        time=clock.now(), pid=1, comm="python", start_time_ticks=5, container_id="c" * 64, container_runtime="cri-o"
    )
    b = proc.process(
        Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=(power(clock, 40),), shares=(share(clock, 1, 40),), workloads=(w,), host_processes=(h,)
        )
    )
    (container,) = [t for t in b.totals if t.scope == "container"]
    assert dict(container.extra)["runtime"] == "cri-o"
    (pod,) = [t for t in b.totals if t.scope == "pod"]
    assert "runtime" not in dict(pod.extra)
