from __future__ import annotations

import bisect
import functools
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.simulator.conftest import two_gpu_data
from wattpipe.simulator.scenario import Scenario, parse_scenario
from wattpipe.simulator.truth import GroundTruth


def test_device_energy_is_the_exact_integral_including_the_cap(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    # 0–10 s: 100 + 0.5·200 + 0.5·300 = 350 W; 10–20 s: raw 600 W capped at 500 W;
    # 20–30 s: 100 + 300 = 400 W; then idle 100 W.
    assert truth.device_power_w(0, 5) == 350
    assert truth.device_power_w(0, 15) == 500
    assert truth.device_power_w(0, 25) == 400
    assert truth.device_power_w(0, 35) == 100
    assert truth.device_energy_j(0, 40) == pytest.approx(3500 + 5000 + 4000 + 1000)
    assert truth.device_capped_s(0, 40) == pytest.approx(10)


def test_capping_scales_every_process_by_the_same_factor(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    # Headroom 400 W over a raw 500 W: factor 0.8 for both.
    assert truth.process_power_w(100, 15) == pytest.approx(200 * 0.8)
    assert truth.process_power_w(101, 15) == pytest.approx(300 * 0.8)
    assert truth.process_energy_j(100, 40) == pytest.approx(1000 + 1600)
    assert truth.process_energy_j(101, 40) == pytest.approx(1500 + 2400 + 3000)


def test_before_the_start_a_gpu_idles(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    assert truth.device_energy_j(0, -10) == pytest.approx(-1000)
    # The 1 s average at t = 0.5 mixes half a second of idle with half a second at 350 W.
    assert truth.device_average_power_w(0, 0.5) == pytest.approx(0.5 * 100 + 0.5 * 350)


def test_container_and_pod_energy_roll_up_their_processes(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    expected = truth.process_energy_j(100, 50) + truth.process_energy_j(101, 50)
    assert truth.container_energy_j("ml/trainer-0/main", 50) == pytest.approx(expected)
    assert truth.pod_energy_j("ml", "trainer-0", 50) == pytest.approx(expected)
    assert truth.pod_energy_j("ml", "embed-0", 50) == pytest.approx(
        truth.process_energy_j(200, 50) + truth.process_energy_j(201, 50)
    )


def test_mig_instance_activity_is_normalised_to_the_instance_and_capped(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    # gi 2 (1g): pid 200 at 0.6 from 0 s, pid 201 at 0.6 from 5 s → 0.6, then min(1, 1.2) = 1.
    assert truth.activity(1, 2, 0, 10) == pytest.approx((0.6 * 5 + 1.0 * 5) / 10)
    assert truth.activity(1, 1, 0, 10) == pytest.approx(0.25)
    # The whole MIG GPU weighs instances by compute slices (1 and 3 of 7).
    assert truth.activity(1, None, 6, 8) == pytest.approx(1.0 * 1 / 7 + 0.25 * 3 / 7)
    # A MIG process's default dynamic power is its slices' share of the headroom: (400 − 50)·3/7.
    assert truth.plans[300].dynamic_w == pytest.approx(350 * 3 / 7)


def test_running_processes_and_memory_follow_lifetimes(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    assert [p.pid for p in truth.running(0, 25)] == [100, 101]
    assert [p.pid for p in truth.running(0, 30)] == [100]
    assert [p.pid for p in truth.running(1, 1, gi=2)] == [200]
    assert truth.memory_used_mib(0, 25) == 1500
    assert truth.memory_used_mib(0, 30) == 1000
    assert truth.memory_used_mib(1, 6, gi=2) == 2000


def test_live_mig_reconfiguration_ends_the_processes_it_displaces() -> None:
    data = two_gpu_data()
    data["faults"] = [{"target": "gpu", "at_s": 50, "gpu": 1, "set": {"mig": None, "max_w": 300}}]
    truth = GroundTruth(parse_scenario(data))
    assert truth.plans[200].end_s == 50
    assert truth.running(1, 60) == ()
    assert truth.process_energy_j(200, 100) == pytest.approx(truth.process_energy_j(200, 50))
    assert truth.gpu_state(1, 49).mig is not None
    assert truth.gpu_state(1, 50).mig is None
    assert truth.gpu_state(1, 50).max_w == 300
    assert truth.device_power_w(1, 60) == 50


def test_cpu_energy_follows_busy_cores(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    # Busy cores: 1.0 + 0.5 + 0.25 until pid 101 ends at 30 s, then 1.25.
    assert truth.cpu_busy_cores(10) == pytest.approx(1.75)
    busy_core_s = 1.75 * 30 + 1.25 * 10
    per_package = (40 * 40 + 10 * busy_core_s) / 2
    assert truth.cpu_package_energy_j(0, 40) == pytest.approx(per_package)
    assert truth.process_cpu_s(101, 100) == pytest.approx(0.5 * 30)


# --- properties over arbitrary scenarios --------------------------------------------------------

_fraction = st.floats(min_value=0, max_value=1, allow_nan=False)


@st.composite
def _scenarios(draw: st.DrawFn) -> dict[str, Any]:
    idle_w = draw(st.floats(min_value=10, max_value=200))
    max_w = idle_w + draw(st.floats(min_value=1, max_value=600))
    processes = []
    for pid in range(100, 100 + draw(st.integers(min_value=1, max_value=6))):
        times = sorted(draw(st.sets(st.integers(min_value=0, max_value=200), min_size=1, max_size=5)))
        start_s = draw(st.integers(min_value=0, max_value=150))
        end_s = draw(st.one_of(st.none(), st.integers(min_value=start_s + 1, max_value=300)))
        processes.append(
            {"pid": pid, "comm": "p", "gpu": 0, "dynamic_w": draw(st.floats(min_value=0, max_value=500)),
             "util": [[t, draw(_fraction)] for t in times], "start_s": start_s, "end_s": end_s}
        )  # fmt: skip
    gpu = {"model": "NVIDIA H100 80GB HBM3", "idle_w": idle_w, "max_w": max_w}
    return {"gpus": [gpu], "processes": processes}


_window = st.tuples(st.floats(min_value=-5, max_value=320), st.floats(min_value=0, max_value=100))


@settings(max_examples=150, deadline=None)
@given(data=_scenarios(), window=_window)
def test_device_energy_is_idle_plus_the_processes_dynamic_energy(
    data: dict[str, Any], window: tuple[float, float]
) -> None:
    truth = GroundTruth(parse_scenario(data))
    t0, width = window
    t1 = t0 + width
    idle_w = data["gpus"][0]["idle_w"]
    dynamic_j = sum(truth.process_energy_j(p, t1) - truth.process_energy_j(p, t0) for p in truth.plans)
    idle_j = idle_w * (t1 - t0)
    assert truth.device_energy_between_j(0, t0, t1) == pytest.approx(idle_j + dynamic_j, rel=1e-9, abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(data=_scenarios(), t=st.floats(min_value=0, max_value=320))
def test_power_never_exceeds_the_cap_and_uncapped_power_is_the_plain_sum(data: dict[str, Any], t: float) -> None:
    truth = GroundTruth(parse_scenario(data))
    gpu = data["gpus"][0]
    raw_w = sum(truth.plans[p["pid"]].util.at(t) * p["dynamic_w"] for p in data["processes"])
    power_w = truth.device_power_w(0, t)
    assert power_w <= gpu["max_w"] + 1e-9
    assert power_w == pytest.approx(min(gpu["max_w"], gpu["idle_w"] + raw_w))
    if raw_w > 0 and gpu["idle_w"] + raw_w > gpu["max_w"]:
        factor = (gpu["max_w"] - gpu["idle_w"]) / raw_w
        for p in data["processes"]:
            expected = truth.plans[p["pid"]].util.at(t) * p["dynamic_w"] * factor
            assert truth.process_power_w(p["pid"], t) == pytest.approx(expected)


@settings(max_examples=100, deadline=None)
@given(data=_scenarios(), window=_window, split=_fraction)
def test_energy_is_additive_over_adjacent_windows(
    data: dict[str, Any], window: tuple[float, float], split: float
) -> None:
    truth = GroundTruth(parse_scenario(data))
    t0, width = window
    mid, t1 = t0 + width * split, t0 + width
    whole = truth.device_energy_between_j(0, t0, t1)
    parts = truth.device_energy_between_j(0, t0, mid) + truth.device_energy_between_j(0, mid, t1)
    assert whole == pytest.approx(parts, rel=1e-9, abs=1e-6)
    assert math.isfinite(whole)


def test_time_sliced_gpu_activity_is_the_capped_sum_of_utilisations(two_gpu: Scenario) -> None:
    truth = GroundTruth(two_gpu)
    # 0–10 s: 0.5 + 0.5 = 1.0; 10–20 s: min(1, 2.0) = 1; 20–30 s: 1.0 (pid 101 alone); then 0.
    assert truth.activity(0, None, 0, 30) == pytest.approx(1.0)
    assert truth.activity(0, None, 25, 35) == pytest.approx(0.5)
    assert truth.process_util(100, 5, 15) == pytest.approx(0.75)


# --- process churn: tens of thousands of short-lived processes against a brute-force reference ---------

CHURN_TICKS = 2000
CHURN_PER_TICK = 20
CHURN_TICK_S = 5.0
CHURN_IDLE_W, CHURN_MAX_W = 70.0, 570.0  # 30-odd live processes of 10–60 W: often over the 500 W headroom


class _ChurnReference:
    """A churn scenario (20 processes of 1–2 ticks each per 5 s tick, with utilisation changes inside their
    lives) and its truth computed directly from the scenario, independently of simulator/truth.py: at any
    instant, scan the processes that can be alive then, apply the power formula of docs/simulator.md."""

    def __init__(self) -> None:
        rng = random.Random(8)
        processes: list[dict[str, Any]] = []
        # Times on a 0.5 s grid, so that starts, ends and changes of different processes often coincide.
        for k in range(CHURN_TICKS):
            for j in range(CHURN_PER_TICK):
                start_s = k * CHURN_TICK_S + rng.randrange(10) / 2
                end_s = start_s + rng.choice([1, 2]) * CHURN_TICK_S - rng.randrange(2) / 2
                util = [[0, rng.random()]]  # before the start: folds into the value at the start
                changes = {
                    start_s + rng.randrange(1, 2 * round(end_s - start_s) + 2) / 2 for _ in range(rng.randint(0, 2))
                }
                for at_s in sorted(changes):
                    util.append([at_s, rng.choice([0.0, 1.0, rng.random()])])
                processes.append(
                    {"pid": 10_000 + len(processes), "comm": f"job{j}", "gpu": 0, "start_s": start_s, "end_s": end_s,
                     "dynamic_w": rng.uniform(10, 60), "util": util, "memory_mib": rng.choice([0, 256, 1000.5])}
                )  # fmt: skip
        self.data = {
            "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": CHURN_IDLE_W, "max_w": CHURN_MAX_W}],
            "processes": processes,
        }
        self.processes = processes
        self.max_life_s = max(p["end_s"] - p["start_s"] for p in processes)
        assert self.max_life_s <= 2 * CHURN_TICK_S
        self.order = sorted(range(len(processes)), key=lambda i: processes[i]["start_s"])
        self.starts = [processes[i]["start_s"] for i in self.order]
        self.by_pid = {p["pid"]: p for p in processes}
        points = {0.0}
        for p in processes:
            points.update((p["start_s"], p["end_s"]), (at_s for at_s, _ in p["util"]))
        self.breakpoints = sorted(points)  # a superset of where anything changes
        # Power is constant between breakpoints: its value at each one, and the exact integral up to it.
        at_breakpoints = [self.at(t) for t in self.breakpoints]
        self.power = [power_w for power_w, _, _ in at_breakpoints]
        self.scale = [scale for _, scale, _ in at_breakpoints]
        self.energy = [0.0]
        for k in range(1, len(self.breakpoints)):
            dt = self.breakpoints[k] - self.breakpoints[k - 1]
            self.energy.append(self.energy[-1] + self.power[k - 1] * dt)

    def overlapping(self, t0: float, t1: float) -> list[dict[str, Any]]:
        """Processes with start < t1 and end > t0, in scenario order (a window of the start-sorted list)."""
        lo = bisect.bisect_left(self.starts, min(t0, t1) - self.max_life_s)
        hi = bisect.bisect_left(self.starts, t1)
        found = sorted(self.order[lo:hi])
        return [self.processes[i] for i in found if self.processes[i]["end_s"] > t0]

    def running(self, t: float) -> list[dict[str, Any]]:
        return [p for p in self.overlapping(t, math.nextafter(t, math.inf)) if p["start_s"] <= t < p["end_s"]]

    @staticmethod
    def util(p: dict[str, Any], t: float) -> float:
        if not p["start_s"] <= t < p["end_s"]:
            return 0.0
        return max(((at_s, u) for at_s, u in p["util"] if at_s <= t), default=(0.0, 0.0))[1]

    def at(self, t: float) -> tuple[float, float, list[dict[str, Any]]]:
        """(device power, cap scale, running processes) at ``t``."""
        if t < 0:
            return CHURN_IDLE_W, 1.0, []
        running = self.running(t)
        raw_w = sum(self.util(p, t) * p["dynamic_w"] for p in running)
        headroom_w = CHURN_MAX_W - CHURN_IDLE_W
        scale = headroom_w / raw_w if raw_w > headroom_w else 1.0
        return CHURN_IDLE_W + raw_w * scale, scale, running

    def device_energy_j(self, t: float) -> float:
        if t < 0:
            return CHURN_IDLE_W * t
        k = bisect.bisect_right(self.breakpoints, t) - 1
        return self.energy[k] + self.power[k] * (t - self.breakpoints[k])

    def process_power_w(self, pid: int, t: float) -> float:
        p = self.by_pid[pid]
        k = bisect.bisect_right(self.breakpoints, t) - 1
        return 0.0 if k < 0 else self.util(p, t) * p["dynamic_w"] * self.scale[k]

    def process_energy_j(self, pid: int, t: float) -> float:
        p = self.by_pid[pid]
        first = bisect.bisect_left(self.breakpoints, p["start_s"])
        last = bisect.bisect_left(self.breakpoints, min(t, p["end_s"]))
        total = 0.0
        for k in range(first, last):
            b0, b1 = self.breakpoints[k], min(t, self.breakpoints[k + 1])
            total += self.util(p, b0) * p["dynamic_w"] * self.scale[k] * (b1 - b0)
        return total


@functools.cache
def _churn() -> tuple[_ChurnReference, GroundTruth]:
    reference = _ChurnReference()
    return reference, GroundTruth(parse_scenario(reference.data))


def _churn_times() -> st.SearchStrategy[float]:
    horizon_s = (CHURN_TICKS + 3) * CHURN_TICK_S
    reference, _ = _churn()
    return st.one_of(
        st.floats(min_value=-10, max_value=horizon_s, allow_nan=False),
        st.sampled_from(reference.breakpoints),  # exactly on a start, an end or a utilisation change
    )


def test_a_churn_of_40000_processes_builds_and_the_cap_is_exercised() -> None:
    reference, truth = _churn()
    assert len(truth.plans) == CHURN_TICKS * CHURN_PER_TICK == 40_000
    capped = sum(scale < 1.0 for scale in reference.scale)
    assert 0.1 < capped / len(reference.scale) < 0.9  # both capped and uncapped stretches
    end_s = (CHURN_TICKS + 3) * CHURN_TICK_S
    assert truth.device_energy_j(0, end_s) == pytest.approx(reference.device_energy_j(end_s), rel=1e-9)
    assert truth.running(0, end_s) == ()


@settings(max_examples=300, deadline=None)
@given(t=st.deferred(_churn_times), width=st.floats(min_value=0, max_value=12), data=st.data())
def test_churn_answers_equal_a_brute_force_reference(t: float, width: float, data: st.DataObject) -> None:
    reference, truth = _churn()
    power_w, _, running = reference.at(t)
    assert truth.device_power_w(0, t) == pytest.approx(power_w, rel=1e-9)
    assert truth.device_energy_j(0, t) == pytest.approx(reference.device_energy_j(t), rel=1e-9, abs=1e-6)
    assert [p.pid for p in truth.running(0, t)] == [p["pid"] for p in running]
    assert truth.memory_used_mib(0, t) == pytest.approx(sum(p["memory_mib"] for p in running), rel=1e-9)
    util = sum(reference.util(p, t) for p in running)
    assert truth.activity(0, None, t, t) == pytest.approx(min(1.0, util), rel=1e-9)
    t0 = t - width
    assert [p.pid for p in truth.running_between(0, t0, t)] == [p["pid"] for p in reference.overlapping(t0, t)]
    # A process alive near t (when there is one), and any process at all.
    near = reference.overlapping(t - 15, t + 5)
    pids = [p["pid"] for p in near] or [10_000]
    for pid in (data.draw(st.sampled_from(pids)), data.draw(st.sampled_from(sorted(reference.by_pid)))):
        assert truth.process_power_w(pid, t) == pytest.approx(reference.process_power_w(pid, t), rel=1e-9)
        expected_j = reference.process_energy_j(pid, t)
        assert truth.process_energy_j(pid, t) == pytest.approx(expected_j, rel=1e-9, abs=1e-9)
