"""Failure drills for the data sources (issue #7): a GPU lost, dcgm-exporter failing, the kubelet socket gone.

Each drill runs the real pipeline in-process on a simulated node (real receivers: nvml, dcgm over loopback
HTTP, podresources over the kubelet's gRPC unix socket, procfs over a simulated /proc), ticking it by hand
on a stepped clock so the scenario's faults start and end between ticks. Per drill it asserts:

- the pipeline keeps running: every tick produced a batch, on schedule, and no tick waited past the
  receiver timeout on a failing source;
- the data the failure does not touch keeps flowing every tick;
- the failure is counted and logged once (not every tick), and the source's data flows again after it;
- no energy already measured is lost: totals never go backwards, stay exported, and equal the
  simulator's ground truth.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.records import DeviceTotals, Totals
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.dcgm_server import DcgmExporterOptions
from wattpipe.simulator.scenario import parse_scenario

H = "tests.helpers.components"
INTERVAL = 5.0
# The most a tick may take in real seconds when a source hangs: the pipeline's receiver timeout (1 s at
# most in every drill) plus slack for a loaded machine. A tick that waited for the hung source would take
# its whole delay (5 s and more in these drills).
TICK_WALL_LIMIT_S = 1.0 + 1.5


# --- the harness ---------------------------------------------------------------------------------


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Tick:
    """What one tick produced, and what could be observed right after it."""

    t_s: float  # scenario time of the tick
    batch: Batch
    wall_s: float  # real seconds the tick took
    ready: bool  # /readyz's verdict right after it
    errors: dict[str, float]  # wattpipe_receiver_errors_total by receiver, after the tick
    exposition: list[tuple[str, dict[str, str], float]]  # the prometheus exporter's /metrics after it
    logs: list[logging.LogRecord]  # logged while the tick ran
    probe: dict[str, Any] = field(default_factory=dict)

    def series(self, name: str, **labels: str) -> list[float]:
        return [v for n, lab, v in self.exposition if n == name and all(lab.get(k) == x for k, x in labels.items())]

    def device_total(self, uuid: str) -> DeviceTotals:
        """The device's totals, which must be in this tick's batch."""
        found = [d for d in self.batch.device_totals if d.device_id == uuid]
        assert len(found) == 1, (self.t_s, uuid)
        return found[0]

    def total(self, scope: str, key: str, uuid: str | None = None) -> Totals:
        """The one total of ``scope`` and ``key`` (on ``uuid``), which must be in this tick's batch."""
        found = [t for t in self.batch.totals if t.scope == scope and t.key == key and uuid in (None, t.device_id)]
        assert len(found) == 1, (self.t_s, scope, key, uuid)
        return found[0]


@dataclass
class Run:
    node: simulator.SimulatedNode
    uuids: list[str]
    start_logs: list[logging.LogRecord]  # logged while the service started
    ticks: list[Tick]
    extra: dict[str, Any] = field(default_factory=dict)

    def at(self, t_s: float) -> Tick:
        (tick,) = [t for t in self.ticks if t.t_s == pytest.approx(t_s)]
        return tick

    def logs(self, *words: str) -> list[tuple[float, str]]:
        """(tick time, message) of every line logged during the ticks that contains all ``words``."""
        return [(t.t_s, r.getMessage()) for t in self.ticks for r in t.logs if all(w in r.getMessage() for w in words)]


Faces = Callable[[simulator.SimulatedNode, Path], tuple[dict[str, str], Callable[[], None] | None]]


def drill(
    data: dict[str, Any],
    pipeline: str,
    ticks: int,
    faces: Faces,
    *,
    before: Callable[[float], None] | None = None,
    probe: Callable[[Graph], dict[str, Any]] | None = None,
) -> Run:
    """Run ``pipeline`` on the node ``data`` describes for ``ticks`` ticks, one every INTERVAL from t = 0.

    ``faces`` starts the node's faces and returns the config's environment and a refresh run before each
    tick (in the runtime's ``before_tick``); ``before(t_s)`` runs before the tick at ``t_s``, after the
    clock moved; ``probe(graph)`` after it, for receiver state worth asserting on.
    """
    clock = SteppedClock()
    scenario = parse_scenario(data)
    capture = _Capture()
    logger = logging.getLogger("wattpipe")
    level = logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory(prefix="drill-") as tmp, simulator.install(scenario, clock) as node:
            env, refresh = faces(node, Path(tmp))
            registry = Registry.from_entry_points()
            config = load_config_text(textwrap.dedent(pipeline), "drill.yaml", registry, env)
            graph = build(config, registry, clock, Telemetry(clock))
            service = Service(graph, before_tick=refresh)
            (runner,) = service.runners
            prometheus = graph.exporters["prometheus"]
            receivers = list(graph.receivers)

            async def go() -> Run:
                await service.start()
                run = Run(node, [g.uuid for g in scenario.gpus], list(capture.records), [])
                try:
                    for i in range(ticks):
                        if i:
                            clock.advance(INTERVAL)
                        if before is not None:
                            before(node.t_s())
                        logged = len(capture.records)
                        started = time.perf_counter()
                        batch = await runner.tick()
                        wall_s = time.perf_counter() - started
                        errors = {
                            cid: graph.telemetry.registry.get_sample_value(
                                "wattpipe_receiver_errors_total", {"pipeline": "metrics", "component": cid}
                            )
                            or 0.0
                            for cid in receivers
                        }
                        body = prometheus.body.decode()  # type: ignore[attr-defined]
                        exposition = [
                            (s.name, dict(s.labels), s.value)
                            for family in text_string_to_metric_families(body)
                            for s in family.samples
                        ]
                        run.ticks.append(
                            Tick(
                                t_s=node.t_s(),
                                batch=batch,
                                wall_s=wall_s,
                                ready=graph.telemetry.ready()[0],
                                errors=errors,
                                exposition=exposition,
                                logs=capture.records[logged:],
                                probe=probe(graph) if probe is not None else {},
                            )
                        )
                finally:
                    await service.shutdown()
                return run

            return asyncio.run(go())
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)


def nvml_only(node: simulator.SimulatedNode, tmp: Path) -> tuple[dict[str, str], Callable[[], None] | None]:
    return {}, None


# --- what every drill asserts --------------------------------------------------------------------


def assert_on_schedule(run: Run, ticks: int) -> None:
    """Every tick produced a batch at its time, measured over one interval, with the pipeline ready."""
    assert len(run.ticks) == ticks
    t0 = run.ticks[0].batch.time
    for i, tick in enumerate(run.ticks):
        assert tick.t_s == pytest.approx(i * INTERVAL)
        assert tick.batch.time.monotonic_s - t0.monotonic_s == pytest.approx(i * INTERVAL)
        assert tick.batch.time.wall_s - t0.wall_s == pytest.approx(i * INTERVAL)
        if i:
            assert tick.batch.interval_s == pytest.approx(INTERVAL)
        assert tick.ready, tick.t_s
        assert tick.wall_s < TICK_WALL_LIMIT_S, (tick.t_s, tick.wall_s)


def assert_conserved(run: Run) -> None:
    """Per device and tick: Σ shares + idle == the counter's delta, to the millijoule."""
    for tick in run.ticks:
        for power in tick.batch.device_power:
            shares = [s.energy_mj for s in tick.batch.shares if s.device_id == power.device_id]
            assert sum(shares) + power.idle_energy_mj == power.energy_mj, (tick.t_s, power.device_id)


def assert_totals_never_go_backwards(run: Run) -> None:
    """Every total (process, container, pod, instance, device) only grows, and once seen stays exported."""
    seen: dict[tuple[str, str, str], int] = {}
    for tick in run.ticks:
        now: dict[tuple[str, str, str], int] = {}
        for t in tick.batch.totals:
            now[(t.scope, t.key, t.device_id)] = now.get((t.scope, t.key, t.device_id), 0) + t.energy_mj
        for d in tick.batch.device_totals:
            now[("device", d.device_id, d.device_id)] = d.energy_mj
        for key, mj in seen.items():
            assert key in now, (tick.t_s, key)  # still exported
            assert now[key] >= mj, (tick.t_s, key, mj, now[key])
        seen.update(now)


def assert_device_totals_are_true(run: Run, gpu: int, ticks: list[Tick]) -> None:
    """The device's total equals the true energy since the first tick (integer-mJ counter reads)."""
    uuid = run.uuids[gpu]
    for tick in ticks:
        total = tick.device_total(uuid)
        true_j = run.node.truth.device_energy_between_j(gpu, 0.0, tick.t_s)
        assert total.energy_mj / 1000 == pytest.approx(true_j, abs=0.002), (gpu, tick.t_s)
        assert total.energy_mj == total.idle_energy_mj + total.attributed_energy_mj + total.unattributed_energy_mj


# --- drill 1: one GPU lost mid-run ----------------------------------------------------------------

LOST_AT, BACK_AT, GONE_AT = 30.0, 60.0, 90.0
LOST_TICKS = 25  # 0 … 120 s

LOST_SCENARIO: dict[str, Any] = {
    "node": {"name": "drill-lost"},
    "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700},
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 60, "max_w": 700},
        {"model": "NVIDIA A100-SXM4-80GB", "idle_w": 55, "max_w": 400},
    ],
    # Constant loads on the GPUs that get lost, so the energy used while lost splits exactly when back.
    "processes": [
        {"pid": 101, "comm": "a", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.6]]},
        {"pid": 102, "comm": "b", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.3], [47, 0.5]]},
        {"pid": 201, "comm": "c", "gpu": 1, "dynamic_w": 400, "util": [[0, 0.5]]},
        {"pid": 202, "comm": "d", "gpu": 1, "dynamic_w": 400, "util": [[0, 0.25]]},
        {"pid": 301, "comm": "e", "gpu": 2, "dynamic_w": 300, "util": [[0, 0.7]]},
    ],
    "faults": [
        # GPU 1 falls off the bus for 30 s, then answers again; GPU 2 is lost for good at 90 s.
        {"at_s": LOST_AT, "for_s": BACK_AT - LOST_AT, "target": "nvml", "gpu": 1, "error": "GPU_IS_LOST"},
        {"at_s": GONE_AT, "target": "nvml", "gpu": 2, "error": "GPU_IS_LOST"},
    ],
}

LOST_PIPELINE = f"""
receivers:
  nvml: {{required: true, reinit_backoff: 5s, reinit_backoff_max: 10s}}
processors:
  idle: {{mode: fixed, devices: {{GPU0: 70, GPU1: 60, GPU2: 55}}}}
  attribution:
  energy: {{terminated_retention: 1h}}
exporters:
  custom/rec: {{class: "{H}:Recorder"}}
  prometheus: {{listen: "127.0.0.1:0"}}
service:
  telemetry: {{listen: ""}}
  pipelines:
    metrics:
      interval: 5s
      receiver_timeout: 1s
      receivers: [nvml]
      processors: [idle, attribution, energy]
      exporters: [custom/rec, prometheus]
"""


@pytest.fixture(scope="module")
def lost() -> Run:
    uuids = [g.uuid for g in parse_scenario(LOST_SCENARIO).gpus]
    text = LOST_PIPELINE
    for i, uuid in enumerate(uuids):
        text = text.replace(f"GPU{i}", uuid)
    return drill(LOST_SCENARIO, text, LOST_TICKS, nvml_only)


def up(tick: Tick, uuid: str) -> float:
    (value,) = tick.series("wattpipe_device_up", gpu_uuid=uuid)
    return value


def test_lost_gpu_pipeline_ticks_on_schedule_and_the_receiver_never_fails(lost: Run) -> None:
    assert_on_schedule(lost, LOST_TICKS)
    # A lost GPU degrades the receiver, it does not fail it: the tick always has the nvml receiver's data.
    assert all(t.errors["nvml"] == 0 for t in lost.ticks)
    assert all("devices" in t.batch.present for t in lost.ticks)


def test_lost_gpu_is_marked_down_while_lost_and_up_again_when_back(lost: Run) -> None:
    gpu0, gpu1, gpu2 = lost.uuids
    for tick in lost.ticks:
        assert up(tick, gpu0) == 1.0, tick.t_s
        assert up(tick, gpu2) == (0.0 if tick.t_s >= GONE_AT else 1.0), tick.t_s
        if tick.t_s < LOST_AT:
            assert up(tick, gpu1) == 1.0, tick.t_s
        elif tick.t_s < BACK_AT:
            assert up(tick, gpu1) == 0.0, tick.t_s  # every tick of the outage says so
    # Back within one retry (backoff at most 10 s) after the GPU answers again, and up from then on.
    back = [t.t_s for t in lost.ticks if t.t_s >= BACK_AT and up(t, gpu1) == 1.0]
    assert back, "GPU 1 never came back"
    assert back[0] <= BACK_AT + 10.0 + INTERVAL
    assert back == [t.t_s for t in lost.ticks if t.t_s >= back[0]]
    # Counted: the ticks with up = 0 are the outage, tick for tick.
    down_ticks = [t.t_s for t in lost.ticks if up(t, gpu1) == 0.0]
    assert down_ticks == [t.t_s for t in lost.ticks if LOST_AT <= t.t_s < back[0]]
    assert len(down_ticks) >= (BACK_AT - LOST_AT) / INTERVAL


def test_lost_gpu_is_logged_once_when_lost_and_once_when_back(lost: Run) -> None:
    gpu0, gpu1, gpu2 = lost.uuids
    assert [t for t, _ in lost.logs(f"GPU 1 ({gpu1}) lost")] == [LOST_AT]
    assert len(lost.logs(f"GPU 1 ({gpu1}) is back")) == 1
    assert [t for t, _ in lost.logs(f"GPU 2 ({gpu2}) lost")] == [GONE_AT]
    assert lost.logs(f"GPU 2 ({gpu2}) is back") == []
    # Nothing else was said about the receiver or its GPUs: no line per tick.
    nvml_lines = [r for t in lost.ticks for r in t.logs if r.name == "wattpipe.receiver.nvml"]
    assert len(nvml_lines) == 3
    assert lost.logs(gpu0) == []


def test_other_gpus_keep_flowing_every_tick(lost: Run) -> None:
    gpu0, gpu1, gpu2 = lost.uuids
    for tick in lost.ticks[1:]:
        flowing = {gpu0} | ({gpu2} if tick.t_s < GONE_AT else set())
        powered = {p.device_id for p in tick.batch.device_power}
        assert flowing <= powered, tick.t_s
        for uuid in flowing:
            assert tick.series("kepler_node_gpu_watts", gpu_uuid=uuid)[0] > 0, tick.t_s
        shares = {s.pid: s.energy_mj for s in tick.batch.shares if s.device_id == gpu0}
        assert shares[101] > 0, tick.t_s
        assert shares[102] > 0, tick.t_s
        if LOST_AT <= tick.t_s < BACK_AT:
            assert gpu1 not in powered  # nothing invented for the lost GPU
            assert not any(s.device_id == gpu1 for s in tick.batch.shares)
    assert_conserved(lost)


def test_no_energy_measured_on_the_lost_gpu_is_lost(lost: Run) -> None:
    gpu0, gpu1, gpu2 = lost.uuids
    assert_totals_never_go_backwards(lost)
    # The GPU that kept answering: its total equals the truth at every tick.
    assert_device_totals_are_true(lost, 0, lost.ticks[1:])
    # While GPU 1 was lost its totals stayed exported, frozen at what was measured before.
    before = lost.at(LOST_AT - INTERVAL)
    frozen = before.device_total(gpu1)
    outage = [t for t in lost.ticks if LOST_AT <= t.t_s < BACK_AT]
    for tick in outage:
        assert tick.device_total(gpu1).energy_mj == frozen.energy_mj, tick.t_s
        (joules,) = tick.series("kepler_node_gpu_joules_total", gpu_uuid=gpu1)
        assert joules == pytest.approx(frozen.energy_mj / 1000)
        for pid in (201, 202):
            total = tick.total("process", str(pid), gpu1)
            assert total.state == "running", (tick.t_s, pid)
            assert total.energy_mj == before.total("process", str(pid), gpu1).energy_mj, (tick.t_s, pid)
            assert tick.series("kepler_process_gpu_joules_total", pid=str(pid), gpu_uuid=gpu1), (tick.t_s, pid)
    # Back: the counter's delta across the outage is counted, so the device total is the truth again.
    # Who used the GPU while it was not read is not known: the outage is a gap, its active energy stays
    # unattributed (issue 14.7; it used to go to whoever was listed when the GPU came back), and each
    # process has its true energy outside the gap.
    back = next(t for t in lost.ticks if t.t_s >= BACK_AT and up(t, gpu1) == 1.0)
    assert_device_totals_are_true(lost, 1, [t for t in lost.ticks if 0 < t.t_s < LOST_AT or t.t_s >= back.t_s])
    (gap,) = [p for p in back.batch.device_power if p.device_id == gpu1]
    assert gap.unattributable == "gap"
    (remainder,) = [s for s in back.batch.shares if s.device_id == gpu1]
    assert (remainder.pid, remainder.energy_mj) == (None, gap.active_energy_mj)
    end = lost.ticks[-1]
    truth = lost.node.truth.process_energy_j
    for pid in (201, 202):
        outside_gap_j = truth(pid, end.t_s) - (truth(pid, back.t_s) - truth(pid, back.t_s - gap.interval_s))
        assert end.total("process", str(pid), gpu1).energy_j == pytest.approx(outside_gap_j, rel=0.015), pid
    # The GPU lost for good keeps what it measured up to its last answer, process and device alike.
    last_good = lost.at(GONE_AT - INTERVAL)
    assert_device_totals_are_true(lost, 2, [last_good])
    for tick in lost.ticks:
        if tick.t_s >= GONE_AT:
            assert tick.device_total(gpu2).energy_mj == last_good.device_total(gpu2).energy_mj
            assert tick.total("process", "301", gpu2).energy_mj == last_good.total("process", "301", gpu2).energy_mj
    true_301 = lost.node.truth.process_energy_j(301, last_good.t_s)
    assert end.total("process", "301", gpu2).energy_j == pytest.approx(true_301, rel=0.015)
    for pid in (101, 102):
        true_j = lost.node.truth.process_energy_j(pid, end.t_s)
        assert end.total("process", str(pid), gpu0).energy_j == pytest.approx(true_j, rel=0.015), pid


# A GPU that is lost when wattpipe starts, and answers again 12 s later.
LOST_AT_START_TICKS = 8  # 0 … 35 s
LOST_AT_START = {
    **LOST_SCENARIO,
    "faults": [{"at_s": 0, "for_s": 12, "target": "nvml", "gpu": 1, "error": "GPU_IS_LOST"}],
}


@pytest.fixture(scope="module")
def lost_at_start() -> Run:
    uuids = [g.uuid for g in parse_scenario(LOST_AT_START).gpus]
    text = LOST_PIPELINE
    for i, uuid in enumerate(uuids):
        text = text.replace(f"GPU{i}", uuid)
    return drill(LOST_AT_START, text, LOST_AT_START_TICKS, nvml_only)


def test_gpu_lost_at_start_the_others_flow_and_it_is_logged_once(lost_at_start: Run) -> None:
    gpu0, _, gpu2 = lost_at_start.uuids
    assert_on_schedule(lost_at_start, LOST_AT_START_TICKS)
    said = [r.getMessage() for r in lost_at_start.start_logs if "GPU 1" in r.getMessage()]
    assert said == ["GPU 1 cannot be opened (nvmlDeviceGetHandleByIndex: GPU is lost): retrying in 5s"]
    for tick in lost_at_start.ticks[1:]:
        assert {gpu0, gpu2} <= {p.device_id for p in tick.batch.device_power}, tick.t_s
    assert_device_totals_are_true(lost_at_start, 0, lost_at_start.ticks[1:])
    assert_totals_never_go_backwards(lost_at_start)


def test_gpu_lost_at_start_is_picked_up_when_it_answers_again(lost_at_start: Run) -> None:
    gpu1 = lost_at_start.uuids[1]
    # Answering again from 12 s: picked up within one retry (backoff at most 10 s), measured from then on.
    back = [t for t in lost_at_start.ticks if gpu1 in {p.device_id for p in t.batch.device_power}]
    assert back
    assert back[0].t_s <= 12 + 10 + INTERVAL
    assert up(lost_at_start.ticks[-1], gpu1) == 1.0
    # Retried quietly (5 s, then 10 s later), and its return said once.
    assert [m for _, m in lost_at_start.logs("GPU 1")] == [
        f"GPU 1 ({gpu1}) can be opened now: measuring it from this tick"
    ]
    # Measured from its first full interval: its total is the counter's delta since it was opened.
    first, end = back[0], lost_at_start.ticks[-1]
    assert end.device_total(gpu1).energy_mj > first.device_total(gpu1).energy_mj > 0


# --- drill 2: dcgm-exporter down, slow, garbage, oversized ------------------------------------------

DCGM_TICKS = 29  # 0 … 140 s
DCGM_TIMEOUT_S = 0.25
OVERSIZED_BYTES = 100_000_000
MAX_BYTES = 16 * 1024 * 1024  # the dcgm receiver's default max_bytes
DCGM_WINDOWS: dict[str, tuple[float, float]] = {  # kind → [from, until) in scenario seconds
    "down": (20.0, 40.0),
    "slow": (50.0, 65.0),
    "garbage": (75.0, 90.0),
    "oversized": (100.0, 115.0),
}
DCGM_WORDS = {  # what the one log line of each kind says
    "down": "unreachable (RemoteProtocolError",
    "slow": f"no complete answer within {DCGM_TIMEOUT_S:g}s",
    "garbage": "the answer is not UTF-8 text",
    "oversized": f"the answer is larger than max_bytes ({MAX_BYTES} bytes); refused, not parsed",
}

MIG_GPU: dict[str, Any] = {
    "model": "NVIDIA H100 80GB HBM3",
    "idle_w": 75,
    "max_w": 700,
    "mig": {
        "instances": [
            {"gi": 1, "profile": "3g.40gb"},
            {"gi": 2, "profile": "2g.20gb"},
            {"gi": 3, "profile": "1g.10gb"},
            {"gi": 4, "profile": "1g.10gb"},
        ]
    },
}
# A process's power per unit of activity is proportional to its instance's slices (what activity × slices
# assumes), and loads are constant, so the activity held through an outage is still the true one.
MIG_PROCESSES: list[dict[str, Any]] = [
    {"pid": 11, "comm": "a", "gpu": 0, "gi": 1, "dynamic_w": 150, "util": [[0, 0.8]]},
    {"pid": 21, "comm": "b", "gpu": 0, "gi": 2, "dynamic_w": 100, "util": [[0, 0.5]]},
    {"pid": 31, "comm": "c", "gpu": 0, "gi": 3, "dynamic_w": 50, "util": [[0, 0.3]]},
    {"pid": 32, "comm": "d", "gpu": 0, "gi": 3, "dynamic_w": 50, "util": [[0, 0.3]]},
    {"pid": 41, "comm": "e", "gpu": 0, "gi": 4, "dynamic_w": 50, "util": [[0, 1.0]]},
]
DCGM_SCENARIO: dict[str, Any] = {
    "node": {"name": "drill-dcgm"},
    "gpus": [MIG_GPU, {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}],
    "processes": [
        *MIG_PROCESSES,
        {"pid": 51, "comm": "f", "gpu": 1, "dynamic_w": 400, "util": [[0, 0.6], [72, 0.2]]},
        {"pid": 52, "comm": "g", "gpu": 1, "dynamic_w": 400, "util": [[0, 0.3]]},
    ],
    "faults": [
        {"at_s": 20, "for_s": 20, "target": "dcgm", "kind": "down"},
        {"at_s": 50, "for_s": 15, "target": "dcgm", "kind": "slow", "delay_s": 5.0},
        {"at_s": 75, "for_s": 15, "target": "dcgm", "kind": "garbage"},
        {"at_s": 100, "for_s": 15, "target": "dcgm", "kind": "oversized", "size_bytes": OVERSIZED_BYTES},
    ],
}


def dcgm_pipeline(dcgm_timeout: str, receiver_timeout: str) -> str:
    return f"""
    receivers:
      nvml: {{required: true}}
      dcgm: {{endpoint: "${{env:DCGM_URL}}", timeout: {dcgm_timeout}}}
    processors:
      idle: {{mode: fixed, devices: {{GPU0: 75, GPU1: 70}}}}
      attribution: {{activity_hold: 60s}}
      energy:
    exporters:
      custom/rec: {{class: "{H}:Recorder"}}
      prometheus: {{listen: "127.0.0.1:0"}}
    service:
      telemetry: {{listen: ""}}
      pipelines:
        metrics:
          interval: 5s
          receiver_timeout: {receiver_timeout}
          receivers: [nvml, dcgm]
          processors: [idle, attribution, energy]
          exporters: [custom/rec, prometheus]
    """


def dcgm_drill(data: dict[str, Any], ticks: int, dcgm_timeout: str, receiver_timeout: str) -> Run:
    uuids = [g.uuid for g in parse_scenario(data).gpus]
    text = dcgm_pipeline(dcgm_timeout, receiver_timeout).replace("GPU0", uuids[0]).replace("GPU1", uuids[1])
    exporters: list[simulator.DcgmExporter] = []

    def faces(node: simulator.SimulatedNode, tmp: Path) -> tuple[dict[str, str], Callable[[], None] | None]:
        # The exporter collects once per tick interval, so each tick's activity covers the tick.
        exporters.append(simulator.start_dcgm_exporter(node, DcgmExporterOptions(collect_interval_s=INTERVAL)))
        return {"DCGM_URL": exporters[0].url}, None

    def probe(graph: Graph) -> dict[str, Any]:
        return {"failures": graph.receivers["dcgm"].failures}  # type: ignore[attr-defined]

    run = drill(data, text, ticks, faces, probe=probe)
    # The exporter counts an answer once it is over: at once for most, at the next write for one the
    # receiver hung up on; a slow one only after its delay, which nobody waits for.
    exporter = exporters[0]
    slow = sum(1 for t in run.ticks if _slow(run, t.t_s))
    deadline = time.monotonic() + 30
    while sum(exporter.requests.values()) - exporter.requests["slow"] < ticks - slow and time.monotonic() < deadline:
        time.sleep(0.02)
    answered = {kind: n for kind, n in exporter.requests.items() if kind != "slow"}
    # What the good answers weighed, to tell the bytes of the faulty ones from theirs.
    good = [t for t in run.ticks if run.node.service_fault("dcgm", t.t_s) is None]
    metrics_bytes = sum(len(exporter.metrics_text(t.t_s).encode()) for t in good)
    run.extra.update(requests=answered, body_bytes_sent=exporter.body_bytes_sent, metrics_bytes=metrics_bytes)
    return run


def _slow(run: Run, t_s: float) -> bool:
    fault = run.node.service_fault("dcgm", t_s)
    return fault is not None and fault.kind == "slow"


def failing_kind(t_s: float) -> str | None:
    return next((kind for kind, (a, b) in DCGM_WINDOWS.items() if a <= t_s < b), None)


@pytest.fixture(scope="module")
def dcgm() -> Run:
    return dcgm_drill(DCGM_SCENARIO, DCGM_TICKS, dcgm_timeout=f"{DCGM_TIMEOUT_S * 1000:g}ms", receiver_timeout="1s")


def test_dcgm_faults_pipeline_ticks_on_schedule(dcgm: Run) -> None:
    assert_on_schedule(dcgm, DCGM_TICKS)  # the slow answer (5 s) held no tick beyond the receiver's 0.25 s
    slow = [t.wall_s for t in dcgm.ticks if failing_kind(t.t_s) == "slow"]
    assert len(slow) == 3
    assert min(slow) >= DCGM_TIMEOUT_S * 0.9  # those ticks did wait for dcgm's own timeout


def test_dcgm_faults_nvml_data_keeps_flowing_every_tick(dcgm: Run) -> None:
    mig, plain = dcgm.uuids
    for tick in dcgm.ticks[1:]:
        assert {p.device_id for p in tick.batch.device_power} == {mig, plain}, tick.t_s
        shares = {(s.device_id, s.pid): s.energy_mj for s in tick.batch.shares}
        for pid in (11, 21, 31, 32, 41):
            assert shares[(mig, pid)] > 0, (tick.t_s, pid)
        for pid in (51, 52):
            assert shares[(plain, pid)] > 0, (tick.t_s, pid)
        assert tick.errors["nvml"] == 0
    assert_conserved(dcgm)


def test_dcgm_data_is_absent_exactly_while_it_fails_and_flows_again_after(dcgm: Run) -> None:
    mig, plain = dcgm.uuids
    truth = dcgm.node.truth
    for tick in dcgm.ticks:
        answered = "mig_activity" in tick.batch.present
        assert answered == (failing_kind(tick.t_s) is None), tick.t_s
        assert ("device_signals" in tick.batch.present) == answered
        if not answered:
            assert tick.batch.mig_activity == ()
            assert tick.batch.device_signals == ()
            continue
        activity = {a.gpu_instance_id: a.gr_engine_active for a in tick.batch.mig_activity}
        assert sorted(activity) == [1, 2, 3, 4], tick.t_s
        if tick.t_s > 0:
            for gi, value in activity.items():
                assert value == pytest.approx(truth.activity(0, gi, tick.t_s - INTERVAL, tick.t_s), abs=1e-6)
        assert {s.device_id for s in tick.batch.device_signals} == {mig, plain}
    # Attribution followed: activity while dcgm answers, the held activity while it does not.
    modes = {t.t_s: {s.mode for s in t.batch.shares if s.device_id == mig} for t in dcgm.ticks[1:]}
    for t_s, mode in modes.items():
        assert mode == ({"mig"} if failing_kind(t_s) is None else {"mig_held"}), t_s
    # The exporter saw every scrape and answered each as the scenario said.
    assert dcgm.extra["requests"] == {"metrics": 16, "down": 4, "garbage": 3, "oversized": 3}  # and 3 slow


def test_dcgm_failures_are_counted_every_tick_and_logged_once_per_kind(dcgm: Run) -> None:
    failed = 0
    in_a_row = 0
    for tick in dcgm.ticks:
        kind = failing_kind(tick.t_s)
        failed += kind is not None
        in_a_row = in_a_row + 1 if kind is not None else 0
        assert tick.errors["dcgm"] == failed, tick.t_s  # wattpipe_receiver_errors_total, tick for tick
        assert tick.probe["failures"] == in_a_row, tick.t_s  # the receiver's own count, reset on success
    assert failed == 13
    lines = dcgm.logs("receiver dcgm failed")
    assert len(lines) == 4  # one per kind, not one per failed tick
    for kind, (start, _) in DCGM_WINDOWS.items():
        assert [t for t, message in lines if DCGM_WORDS[kind] in message] == [start], kind
    # Besides, attribution says when it switches to the held activity and back: once per transition.
    held = [t for t, _ in dcgm.logs("(MIG): dcgm-exporter is not answering: holding")]
    assert held == [start for start, _ in DCGM_WINDOWS.values()]
    resumed = [t for t, _ in dcgm.logs("(MIG): shares by each instance's activity")]
    assert resumed == [INTERVAL] + [end for _, end in DCGM_WINDOWS.values()]
    assert sum(len(t.logs) for t in dcgm.ticks) == len(lines) + len(held) + len(resumed)  # nothing else


def test_dcgm_oversized_answer_is_refused_without_reading_it(dcgm: Run) -> None:
    # 3 answers of 100 MB promised; the receiver refused each on its Content-Length and hung up, so only
    # what the sockets buffered got out (under a MiB each on Linux), and no tick waited for more.
    assert dcgm.extra["requests"]["oversized"] == 3
    oversized = [t for t in dcgm.ticks if failing_kind(t.t_s) == "oversized"]
    assert len(oversized) == 3
    assert all(t.wall_s < TICK_WALL_LIMIT_S for t in oversized)
    faulty_bytes = dcgm.extra["body_bytes_sent"] - dcgm.extra["metrics_bytes"]  # oversized, and 3 tiny garbage
    assert 0 < faulty_bytes < MAX_BYTES  # all three together: not even one max_bytes, let alone 300 MB


def test_dcgm_faults_lose_no_energy(dcgm: Run) -> None:
    assert_totals_never_go_backwards(dcgm)
    for gpu in (0, 1):
        assert_device_totals_are_true(dcgm, gpu, dcgm.ticks[1:])
    end = dcgm.ticks[-1]
    mig, plain = dcgm.uuids
    for gi in (1, 2, 3, 4):
        true_j = sum(dcgm.node.truth.process_energy_j(p["pid"], end.t_s) for p in MIG_PROCESSES if p["gi"] == gi)
        total = end.total("instance", str(gi), mig)
        assert total.energy_j == pytest.approx(true_j, rel=0.03), gi
    for pid, uuid in ((11, mig), (21, mig), (31, mig), (32, mig), (41, mig), (51, plain), (52, plain)):
        true_j = dcgm.node.truth.process_energy_j(pid, end.t_s)
        assert end.total("process", str(pid), uuid).energy_j == pytest.approx(true_j, rel=0.03), pid


def test_dcgm_slower_than_the_pipeline_timeout_is_cut_off_counted_and_logged_once() -> None:
    # dcgm's own timeout (2 s) is misconfigured above the pipeline's receiver timeout (0.5 s): the runtime
    # cancels the scrape. That is a failed scrape for the receiver too (it counts toward rediscovery).
    data = {**DCGM_SCENARIO, "faults": [{"at_s": 10, "for_s": 15, "target": "dcgm", "kind": "slow", "delay_s": 5.0}]}
    run = dcgm_drill(data, 8, dcgm_timeout="2s", receiver_timeout="500ms")
    assert_on_schedule(run, 8)
    slow = [t for t in run.ticks if 10 <= t.t_s < 25]
    assert [t.t_s for t in slow] == [10, 15, 20]
    assert all(t.wall_s >= 0.45 for t in slow)  # waited the pipeline's timeout, no more (see assert_on_schedule)
    assert [t.errors["dcgm"] for t in run.ticks] == [0, 0, 1, 2, 3, 3, 3, 3]
    assert [t.probe["failures"] for t in run.ticks] == [0, 0, 1, 2, 3, 0, 0, 0]
    assert [t for t, _ in run.logs("receiver dcgm did not answer within 0.5s")] == [10.0]
    assert [t.t_s for t in run.ticks if "mig_activity" in t.batch.present] == [0, 5, 25, 30, 35]
    assert_totals_never_go_backwards(run)
    for gpu in (0, 1):
        assert_device_totals_are_true(run, gpu, run.ticks[1:])


# --- drill 3: the kubelet's pod-resources socket absent, appearing, removed and recreated, slow ------

KUBELET_TICKS = 25  # 0 … 120 s
APPEAR_AT = 25.0  # the socket is absent at start and appears (the kubelet starts) before this tick
DOWN_AT, UP_AT = 70.0, 95.0  # then the kubelet goes away (socket removed) and comes back (a new socket)
SLOW_AT = 105.0  # and for one tick answers after 3 s, past the receiver's 0.8 s timeout

KUBELET_SCENARIO: dict[str, Any] = {
    "node": {"name": "drill-kubelet"},
    "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700},
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 60, "max_w": 700},
    ],
    "pods": [
        {"name": "train-0", "namespace": "ml", "containers": [{"name": "main", "devices": [{"gpu": 0}]}]},
        {"name": "infer-0", "namespace": "serving", "containers": [{"name": "server", "devices": [{"gpu": 1}]}]},
    ],
    "processes": [
        {"pid": 601, "comm": "train", "container": "ml/train-0/main", "gpu": 0, "dynamic_w": 400,
         "util": [[0, 0.7]], "cpu_cores": 1.0},
        # A host process sharing GPU 0 with the pod: never the pod's, whatever the kubelet says.
        {"pid": 900, "comm": "probe", "gpu": 0, "dynamic_w": 400, "util": [[0, 0.2]]},
        {"pid": 701, "comm": "serve", "container": "serving/infer-0/server", "gpu": 1, "dynamic_w": 300,
         "util": [[0, 0.4], [82, 0.8]]},
    ],
    "faults": [
        {"at_s": DOWN_AT, "for_s": UP_AT - DOWN_AT, "target": "kubelet", "kind": "down"},
        {"at_s": SLOW_AT, "for_s": INTERVAL, "target": "kubelet", "kind": "slow", "delay_s": 3.0},
    ],
}  # fmt: skip

KUBELET_PIPELINE = f"""
receivers:
  nvml: {{required: true}}
  podresources: {{endpoint: "${{env:KUBELET_ENDPOINT}}", timeout: 800ms}}
  procfs: {{root: "${{env:PROC_ROOT}}"}}
processors:
  idle: {{mode: fixed, devices: {{GPU0: 70, GPU1: 60}}}}
  attribution:
  k8s: {{api: "off"}}  # pod names from the kubelet's allocations alone: what this drill takes away
  energy: {{terminated_retention: 1h}}
exporters:
  custom/rec: {{class: "{H}:Recorder"}}
  prometheus: {{listen: "127.0.0.1:0"}}
service:
  telemetry: {{listen: ""}}
  pipelines:
    metrics:
      interval: 5s
      receiver_timeout: 1s
      receivers: [nvml, podresources, procfs]
      processors: [idle, attribution, k8s, energy]
      exporters: [custom/rec, prometheus]
"""


@pytest.fixture(scope="module")
def kubelet() -> Run:
    scenario = parse_scenario(KUBELET_SCENARIO)
    text = KUBELET_PIPELINE.replace("GPU0", scenario.gpus[0].uuid).replace("GPU1", scenario.gpus[1].uuid)
    servers: list[simulator.KubeletServer] = []

    def faces(node: simulator.SimulatedNode, tmp: Path) -> tuple[dict[str, str], Callable[[], None] | None]:
        writer = simulator.ProcfsWriter(node, tmp)
        # Built, not started: its socket's path is known, the socket is not there. No poll thread: the
        # socket follows the scenario's faults when the tick refreshes it, so every tick sees the truth.
        server = simulator.KubeletServer(node, poll_interval_s=None)  # stops when the node closes
        servers.append(server)

        def refresh() -> None:
            writer.refresh()
            server.refresh()

        return {"KUBELET_ENDPOINT": server.endpoint, "PROC_ROOT": str(tmp / "proc")}, refresh

    def before(t_s: float) -> None:
        if t_s == APPEAR_AT:
            servers[0].start()

    def probe(graph: Graph) -> dict[str, Any]:
        return {"dials": graph.receivers["podresources"].client.dials}  # type: ignore[attr-defined]

    run = drill(KUBELET_SCENARIO, text, KUBELET_TICKS, faces, before=before, probe=probe)
    run.extra["pods"] = {p.uid: f"{p.namespace}/{p.name}" for p in scenario.pods}
    run.extra["socket"] = str(servers[0].socket_path)
    return run


def socket_there(t_s: float) -> bool:
    return t_s >= APPEAR_AT and not DOWN_AT <= t_s < UP_AT


def kubelet_answers(t_s: float) -> bool:
    return socket_there(t_s) and t_s != SLOW_AT


def pod_totals(tick: Tick) -> dict[str, Totals]:
    return {t.key: t for t in tick.batch.totals if t.scope == "pod"}


def test_kubelet_absent_pipeline_starts_and_ticks_on_schedule(kubelet: Run) -> None:
    assert_on_schedule(kubelet, KUBELET_TICKS)
    # Started fine without the socket, saying so once, clearly.
    said = [r.getMessage() for r in kubelet.start_logs if "no kubelet socket" in r.getMessage()]
    assert said == [
        f"receiver podresources: no kubelet socket at {kubelet.extra['socket']} yet: no allocations until it "
        "appears (is the kubelet running, and is its pod-resources directory mounted?)"
    ]


def test_kubelet_failures_are_counted_every_tick_and_logged_once_per_outage(kubelet: Run) -> None:
    failed = 0
    for tick in kubelet.ticks:
        failed += not kubelet_answers(tick.t_s)
        assert tick.errors["podresources"] == failed, tick.t_s
        assert tick.errors["nvml"] == tick.errors["procfs"] == 0
        assert ("allocations" in tick.batch.present) == kubelet_answers(tick.t_s), tick.t_s
    assert failed == 11
    absent = kubelet.logs("receiver podresources failed: PodResourcesUnavailable: no kubelet socket at")
    # Once for the absence at start and once for the outage (a minute later, so not folded into the first).
    assert [t for t, _ in absent] == [0.0, DOWN_AT]
    assert "(4 more like this in the last 70s)" in absent[1][1]
    slow = kubelet.logs("receiver podresources failed: PodResourcesUnavailable:", "did not answer in time")
    assert [t for t, _ in slow] == [SLOW_AT]
    assert len(kubelet.logs("podresources")) == 3  # no line per tick
    assert kubelet.at(SLOW_AT).wall_s >= 0.75  # waited for the receiver's timeout (and no more: on schedule)


def test_pods_are_named_once_the_socket_appears_and_keep_their_names_through_the_outage(kubelet: Run) -> None:
    pods = kubelet.extra["pods"]
    for tick in kubelet.ticks[1:]:
        totals = pod_totals(tick)
        assert set(totals) == set(pods), tick.t_s  # keyed by the cgroup's pod UID: there from the first tick
        for uid, total in totals.items():
            names = dict(total.extra)
            named = f"{names.get('pod_namespace')}/{names.get('pod_name')}"
            if tick.t_s < APPEAR_AT:
                assert "pod_name" not in names, tick.t_s  # nothing invented while the kubelet is absent
            else:
                assert named == pods[uid], tick.t_s  # named from the first tick with the socket, kept after
                (joules,) = tick.series("kepler_pod_gpu_joules_total", pod_id=uid)
                assert joules == pytest.approx(total.energy_j)
    # The host process on the pod's GPU never became the pod's.
    for tick in kubelet.ticks:
        assert not any(w.pid == 900 and w.pod_name for w in tick.batch.workloads), tick.t_s


def test_podresources_reconnects_by_itself_when_the_socket_is_recreated(kubelet: Run) -> None:
    allocations = {
        t.t_s: sorted((a.pod_namespace, a.pod_name, a.device_id) for a in t.batch.allocations) for t in kubelet.ticks
    }
    expected = sorted([("ml", "train-0", kubelet.uuids[0]), ("serving", "infer-0", kubelet.uuids[1])])
    assert allocations[APPEAR_AT] == expected  # at once when it appears
    assert allocations[UP_AT] == expected  # and at once when the new socket is bound, with no restart
    dials = {t.t_s: t.probe["dials"] for t in kubelet.ticks}
    assert dials[APPEAR_AT - INTERVAL] == 0
    assert dials[APPEAR_AT] == 1
    assert dials[DOWN_AT - INTERVAL] == 1  # one channel while the socket stayed the same
    assert dials[UP_AT] == 2  # redialled once, for the new socket
    assert dials[SLOW_AT] == 2
    assert allocations[SLOW_AT + INTERVAL] == expected  # after a call that timed out: a fresh channel
    assert dials[kubelet.ticks[-1].t_s] == 3


def test_kubelet_outage_loses_no_energy_and_process_device_totals_keep_flowing(kubelet: Run) -> None:
    assert_totals_never_go_backwards(kubelet)
    assert_conserved(kubelet)
    for gpu in (0, 1):
        assert_device_totals_are_true(kubelet, gpu, kubelet.ticks[1:])
    for previous, tick in zip(kubelet.ticks[1:], kubelet.ticks[2:], strict=False):
        # Every tick, with or without the kubelet, every process and pod total grew.
        for key in ("601", "900", "701"):
            assert tick.total("process", key).energy_mj > previous.total("process", key).energy_mj
        for uid, total in pod_totals(tick).items():
            assert total.energy_mj > pod_totals(previous)[uid].energy_mj, (tick.t_s, uid)
    end = kubelet.ticks[-1]
    truth = kubelet.node.truth
    for uid, name in kubelet.extra["pods"].items():
        namespace, pod = name.split("/")
        assert pod_totals(end)[uid].energy_j == pytest.approx(truth.pod_energy_j(namespace, pod, end.t_s), rel=0.015)
    for pid in (601, 900, 701):
        assert end.total("process", str(pid)).energy_j == pytest.approx(truth.process_energy_j(pid, end.t_s), rel=0.015)
