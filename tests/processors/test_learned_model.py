"""attribution's ``model: learned``: each process's watts per unit of utilisation, fitted from device power."""

from __future__ import annotations

import asyncio
import math
import random
import textwrap
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.helpers.context import make_context
from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.catalog import FAMILIES, points
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.records import DevicePower, GpuProcessSample, GpuShare
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.processors._linalg import nnls
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.simulator.scenario import parse_scenario

IDLE_W = 70.0
TICK_S = 2.0


class Device:
    """Feeds one device's ticks through an attribution processor: power from per-process coefficients."""

    def __init__(self, **learned: Any) -> None:
        config = AttributionConfig(model="learned", learned=learned)
        self.processor = AttributionProcessor(config, make_context("attribution", "processor", SteppedClock()))
        self.t_s = 1000.0

    def tick(
        self,
        utils: dict[int, float],
        coef_w: dict[int, float],
        mem: dict[int, tuple[float, float]] | None = None,
        idle_w: float | None = IDLE_W,
        noise_w: float = 0.0,
    ) -> list[GpuShare]:
        """One tick: ``utils`` pid → SM utilisation, ``coef_w`` pid → W per unit of it, ``mem`` pid →
        (memory utilisation, W per unit of it); the device draws idle + Σ of those (+ ``noise_w``)."""
        self.t_s += TICK_S
        mem = mem or {}
        active_w = sum(coef_w[p] * u for p, u in utils.items()) + sum(m * w for m, w in mem.values()) + noise_w
        energy_mj = round((IDLE_W + active_w) * TICK_S * 1000)
        idle_mj = min(energy_mj, round(IDLE_W * TICK_S * 1000)) if idle_w is not None else 0
        return self.process(energy_mj, idle_mj, idle_w, utils, {p: m for p, (m, _) in mem.items()})

    def process(
        self, energy_mj: int, idle_mj: int, idle_w: float | None, utils: dict[int, float], mem: dict[int, float]
    ) -> list[GpuShare]:
        t = Timestamp(monotonic_s=self.t_s, wall_s=1.7e9 + self.t_s)
        power = DevicePower(
            time=t,
            device_id="G",
            interval_s=TICK_S,
            power_w=energy_mj / 1000 / TICK_S,
            idle_w=idle_w,
            active_w=(energy_mj - idle_mj) / 1000 / TICK_S,
            energy_mj=energy_mj,
            idle_energy_mj=idle_mj,
            active_energy_mj=energy_mj - idle_mj,
        )
        procs = tuple(
            GpuProcessSample(time=t, device_id="G", pid=p, sm_util=u, mem_util=mem.get(p, 0.0))
            for p, u in utils.items()
        )
        batch = Batch(time=t, interval_s=TICK_S, node="n").replace(device_power=(power,), gpu_processes=procs)
        return list(self.processor.process(batch).shares)


def _by_pid(shares: Sequence[GpuShare]) -> dict[int, GpuShare]:
    return {s.pid: s for s in shares if s.pid is not None}


def _model(shares: Sequence[GpuShare]) -> set[str | None]:
    return {s.model for s in shares}


def _varied(rng: random.Random, pids: Sequence[int]) -> dict[int, float]:
    """Independent loads that fit one time-sliced GPU (they add up to at most 1)."""
    raw = [rng.uniform(0.05, 1.0) for _ in pids]
    total = max(1.0, sum(raw))
    return {p: r / total for p, r in zip(pids, raw, strict=True)}


def test_tenants_with_unequal_watts_per_utilisation_are_split_by_their_watts() -> None:
    device, rng = Device(), random.Random(1)
    coef = {1: 600.0, 2: 300.0}  # 2× apart
    for _ in range(30):
        device.tick(_varied(rng, [1, 2]), coef)
    shares = _by_pid(device.tick({1: 0.3, 2: 0.3}, coef))
    # Same utilisation, the trainer drew twice the watts: 2/3 of the active energy, not a half.
    assert shares[1].energy_mj == pytest.approx(2 * shares[2].energy_mj, abs=2)
    assert shares[1].power_w == pytest.approx(180.0, rel=1e-4)
    assert {shares[1].model, shares[2].model} == {"learned"}


def test_memory_utilisation_has_its_own_watts() -> None:
    device, rng = Device(), random.Random(2)
    sm = {1: 400.0, 2: 400.0}
    for _ in range(40):
        utils = _varied(rng, [1, 2])
        device.tick(utils, sm, mem={2: (rng.uniform(0, 0.8), 250.0)})
    # The same SM utilisation; pid 2 also keeps the memory busy half the time: 125 W more.
    shares = _by_pid(device.tick({1: 0.4, 2: 0.4}, sm, mem={2: (0.5, 250.0)}))
    assert shares[1].power_w == pytest.approx(160.0, rel=1e-3)
    assert shares[2].power_w == pytest.approx(285.0, rel=1e-3)


def test_memory_that_moves_with_sm_is_carried_by_the_sm_watts() -> None:
    # Most processes' memory utilisation follows their SM utilisation (the same kernels): no fit can tell the
    # two apart (here only the driver's whole percents do), so the SM coefficient carries both.
    device, rng = Device(), random.Random(8)
    sm = {1: 500.0, 2: 200.0}
    for _ in range(40):
        utils = {p: round(u, 2) for p, u in _varied(rng, [1, 2]).items()}
        mem = {1: (round(utils[1] * 0.5, 2), 100.0), 2: (round(utils[2] * 0.8, 2), 50.0)}
        shares = device.tick(utils, sm, mem=mem)
    assert _model(shares) == {"learned"}
    by_pid = _by_pid(device.tick({1: 0.3, 2: 0.3}, sm, mem={1: (0.15, 100.0), 2: (0.24, 50.0)}))
    assert by_pid[1].power_w == pytest.approx(0.3 * 500 + 0.15 * 100, rel=0.01)
    assert by_pid[2].power_w == pytest.approx(0.3 * 200 + 0.24 * 50, rel=0.01)


def test_before_enough_ticks_the_split_is_by_utilisation_and_says_so() -> None:
    device, rng = Device(), random.Random(3)
    coef = {1: 600.0, 2: 300.0}
    shares = device.tick({1: 0.3, 2: 0.3}, coef)
    assert _model(shares) == {"utilisation"}  # the remainder too: one label set per device and tick
    by_pid = _by_pid(shares)
    assert by_pid[1].energy_mj == by_pid[2].energy_mj
    for _ in range(4):
        assert _model(device.tick(_varied(rng, [1, 2]), coef)) == {"utilisation"}


def test_loads_that_never_vary_independently_are_not_identifiable() -> None:
    device = Device()
    coef = {1: 600.0, 2: 300.0}
    for k in range(40):
        level = 0.2 + 0.6 * (k % 7) / 7  # both move, but always together
        shares = device.tick({1: level / 2, 2: level / 2}, coef)
    assert _model(shares) == {"utilisation"}
    assert device.processor._reasons["G"] == "collinear"


def test_without_idle_power_the_fit_is_not_used() -> None:
    device, rng = Device(), random.Random(4)
    for _ in range(30):
        shares = device.tick(_varied(rng, [1, 2]), {1: 600.0, 2: 300.0}, idle_w=None)
    assert _model(shares) == {"utilisation"}
    assert device.processor._reasons["G"] == "idle_unknown"


def test_power_the_utilisations_do_not_explain_is_a_poor_fit() -> None:
    device, rng = Device(), random.Random(5)
    for _ in range(40):
        shares = device.tick(_varied(rng, [1, 2]), {1: 300.0, 2: 300.0}, noise_w=rng.uniform(-150, 150))
    assert _model(shares) == {"utilisation"}
    assert device.processor._reasons["G"] in ("poor_fit", "uncertain")


def test_a_crowded_gpu_falls_back_at_once_and_a_process_that_left_ages_out() -> None:
    device, rng = Device(max_processes=2, window=60.0), random.Random(6)
    coef = {1: 600.0, 2: 300.0, 3: 100.0}
    for _ in range(20):
        device.tick(_varied(rng, [1, 2]), coef)
    assert _model(device.tick(_varied(rng, [1, 2]), coef)) == {"learned"}
    shares = device.tick(_varied(rng, [1, 2, 3]), coef)  # three listed: over max_processes
    assert _model(shares) == {"utilisation"}
    assert device.processor._reasons["G"] == "too_many_processes"
    # Once pid 3 is gone, its rows (cleared with the crowded tick) no longer count: learned again within
    # as many ticks as a first fit needs, not after the window.
    outcomes = [_model(device.tick(_varied(rng, [1, 2]), coef)) for _ in range(15)]
    assert outcomes[-1] == {"learned"}


def test_a_departed_process_leaves_the_fit_with_its_last_row() -> None:
    device, rng = Device(max_processes=2, window=60.0), random.Random(7)
    coef = {1: 600.0, 2: 300.0, 3: 100.0}
    for _ in range(20):
        device.tick(_varied(rng, [1, 3]), coef)
    # pid 3 left, pid 2 came: three processes in the window until pid 3's rows are older than 60 s.
    reasons = []
    for _ in range(40):
        device.tick(_varied(rng, [1, 2]), coef)
        reasons.append(device.processor._reasons["G"])
    # (pid 2's first tick is not learned from: it became busy inside it; from its second, three pids.)
    assert reasons[:2] == ["few_ticks", "too_many_processes"]
    assert reasons[-1] == "learned"
    assert reasons.index("learned") >= 60 / TICK_S - 1


def test_the_model_is_a_label_of_the_attribution_mode_family() -> None:
    device, rng = Device(), random.Random(9)
    coef = {1: 600.0, 2: 300.0}
    family = next(f for f in FAMILIES if f.kepler == "wattpipe_attribution_mode")
    labels = []
    for _ in range(20):
        shares = device.tick(_varied(rng, [1, 2]), coef)
        batch = Batch(time=shares[0].time, interval_s=TICK_S, node="n").replace(shares=tuple(shares))
        (point,) = points(family, batch, "kepler")  # one series per device and tick: the remainder agrees
        labels.append(dict(point.labels))
    assert labels[0] == {"gpu_uuid": "G", "mode": "time_slicing", "model": "utilisation"}
    assert labels[-1] == {"gpu_uuid": "G", "mode": "time_slicing", "model": "learned"}
    assert dict(next(iter(points(family, batch, "otel"))).labels)["wattpipe.attribution.model"] == "learned"


def test_default_model_is_utilisation_and_shares_say_nothing_about_it() -> None:
    config = AttributionConfig()
    assert config.model == "utilisation"
    processor = AttributionProcessor(config, make_context("attribution", "processor", SteppedClock()))
    assert processor._learned is None


def test_learned_options_are_validated() -> None:
    assert AttributionConfig.model_validate({"model": "learned", "learned": {"window": "5m"}}).learned.window == 300
    with pytest.raises(ValidationError):
        AttributionConfig.model_validate({"model": "learned", "learned": {"windw": "5m"}})
    with pytest.raises(ValidationError):
        AttributionConfig.model_validate({"model": "kepler"})


# --- properties -------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(0.0, 1.0), min_size=0, max_size=5),  # utilisations of pids 1..n
            st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5),  # memory utilisations
            st.integers(0, 3_000_000),  # energy over the tick, mJ
            st.integers(0, 400_000),  # idle part, mJ
        ),
        min_size=1,
        max_size=60,
    )
)
def test_conservation_is_exact_and_shares_never_negative_with_learned_weights(
    ticks: list[tuple[list[float], list[float], int, int]],
) -> None:
    device = Device(min_ticks=2, max_vif=1e6, max_residual=10.0, max_uncertainty=10.0)
    for utils, mems, energy_mj, idle_mj in ticks:
        idle_mj = min(idle_mj, energy_mj)
        sm = {pid: u for pid, u in enumerate(utils, start=1)}
        shares = device.process(energy_mj, idle_mj, IDLE_W, sm, dict(enumerate(mems, start=1)))
        assert sum(s.energy_mj for s in shares) == energy_mj - idle_mj
        assert all(s.energy_mj >= 0 for s in shares)
        assert all(math.isfinite(s.power_w) for s in shares)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda k: st.tuples(
            st.lists(st.lists(st.floats(-1.0, 1.0), min_size=k, max_size=k), min_size=k, max_size=12),
            st.lists(st.floats(-10.0, 10.0), min_size=12, max_size=12),
        )
    )
)
def test_nnls_meets_the_optimality_conditions(problem: tuple[list[list[float]], list[float]]) -> None:
    a, y = problem
    k = len(a[0])
    y = y[: len(a)]
    gram = [[math.fsum(row[i] * row[j] for row in a) + (1e-3 if i == j else 0.0) for j in range(k)] for i in range(k)]
    rhs = [math.fsum(row[i] * v for row, v in zip(a, y, strict=True)) for i in range(k)]
    x = nnls(gram, rhs)
    gradient = [rhs[i] - math.fsum(gram[i][j] * x[j] for j in range(k)) for i in range(k)]
    scale = 1e-6 * max(1.0, *map(abs, rhs))
    for xi, gi in zip(x, gradient, strict=True):
        assert xi >= 0.0
        assert gi <= scale  # no direction of descent left open
        if xi > 0.0:
            assert abs(gi) <= scale  # and none along the free unknowns


# --- the acceptance, on the simulator -------------------------------------------------------


def _steps(rng: random.Random, until_s: float, low: float, high: float) -> list[list[float]]:
    """A utilisation schedule that changes every 7–23 s (odd times, so changes fall inside ticks)."""
    t, out = 0.0, []
    while t < until_s:
        out.append([round(t, 1), round(rng.uniform(low, high), 2)])
        t += rng.uniform(7.0, 23.0)
    return out


SCENARIO_S = 420.0
PIPELINE = """
receivers:
  nvml: {required: true}
processors:
  idle:
  attribution: {model: learned}
  energy: {terminated_retention: 1h}
exporters:
  custom/rec: {class: "tests.helpers.components:Recorder"}
service:
  telemetry: {listen: ""}
  pipelines:
    metrics: {interval: 2s, receivers: [nvml], processors: [idle, attribution, energy], exporters: [custom/rec]}
"""


@pytest.fixture(scope="module")
def unequal_run() -> dict[str, Any]:
    rng = random.Random(15)
    data = {
        "node": {"name": "learned"},
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}],
        "processes": [
            # 2× apart per unit of utilisation; independent loads that change at odd times.
            {
                "pid": 11,
                "comm": "trainer",
                "gpu": 0,
                "dynamic_w": 500,
                "start_s": 6.3,
                "util": _steps(rng, SCENARIO_S, 0.2, 0.6),
            },
            {
                "pid": 12,
                "comm": "server",
                "gpu": 0,
                "dynamic_w": 250,
                "start_s": 9.7,
                "util": _steps(rng, SCENARIO_S, 0.1, 0.4),
            },
        ],
    }
    clock = SteppedClock()
    with simulator.install(parse_scenario(data), clock) as node:
        registry = Registry.from_entry_points()
        config = load_config_text(textwrap.dedent(PIPELINE), "learned.yaml", registry, {})
        graph = build(config, registry, clock, Telemetry(clock))
        asyncio.run(Service(graph).run(max_ticks=int(SCENARIO_S / 2) + 1))
        batches = graph.exporters["custom/rec"].batches  # type: ignore[attr-defined]
        return {"node": node, "batches": batches, "t0_wall": node.wall_at(0.0)}


def test_unequal_tenants_are_within_5_percent_once_their_loads_have_varied_for_5_minutes(
    unequal_run: dict[str, Any],
) -> None:
    node, batches = unequal_run["node"], unequal_run["batches"]
    start = next(i for i, b in enumerate(batches) if b.time.wall_s - unequal_run["t0_wall"] >= 300.0)
    t0, t1 = (batches[i].time.wall_s - unequal_run["t0_wall"] for i in (start, -1))
    for pid in (11, 12):
        attributed_j = sum(s.energy_mj for b in batches[start + 1 :] for s in b.shares if s.pid == pid) / 1000
        true_j = node.truth.process_energy_j(pid, t1) - node.truth.process_energy_j(pid, t0)
        assert attributed_j == pytest.approx(true_j, rel=0.05), pid
    assert {s.model for b in batches[start + 1 :] for s in b.shares} == {"learned"}


def test_conservation_holds_on_every_tick_of_the_simulated_run(unequal_run: dict[str, Any]) -> None:
    for batch in unequal_run["batches"]:
        for power in batch.device_power:
            shares = [s for s in batch.shares if s.device_id == power.device_id]
            assert sum(s.energy_mj for s in shares) + power.idle_energy_mj == power.energy_mj
