"""A review of wattpipe restarted on its state file, on a simulated node with a GPU and RAPL zones
(configs/scenarios/cpu.yaml): the real nvml, procfs and rapl receivers, the GPU chain and cpu_attribution, a
Service started, ticked, shut down (SIGTERM's path) or dropped without its last checkpoint (SIGKILL's), and a
new Service built on the same state file while the node runs on."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.records import DeviceTotals, Totals
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.fake_host import ProcfsWriter

SCENARIO = Path(__file__).resolve().parents[1] / "configs" / "scenarios" / "cpu.yaml"
CONFIG = """
receivers:
  nvml: {required: true}
  procfs: {root: "ROOT/proc"}
  rapl: {root: "ROOT/sys"}
processors:
  idle:
  attribution:
  energy:
  cpu_attribution:
exporters:
  custom/rec: {class: "tests.helpers.components:Recorder"}
service:
  node_name: cpu-node
  telemetry: {listen: ""}
  state: {path: "STATE", checkpoint_interval: 20s}
  pipelines:
    metrics: {interval: 5s, receivers: [nvml, procfs, rapl], processors: [idle, attribution, energy, cpu_attribution],
              exporters: [custom/rec]}
"""


@dataclass
class Node:
    """The simulated node, running on across wattpipe's restarts."""

    tmp: Path
    config: str = CONFIG
    clock: SteppedClock = field(default_factory=SteppedClock)
    batches: list[list[Batch]] = field(default_factory=list)  # per run

    def __post_init__(self) -> None:
        self.node = simulator.install(SCENARIO, self.clock)
        self.writer = ProcfsWriter(self.node, self.tmp)

    def service(self) -> Service:
        registry = Registry.from_entry_points()
        text = (
            textwrap.dedent(self.config).replace("ROOT", str(self.tmp)).replace("STATE", str(self.tmp / "state.json"))
        )
        graph = build(load_config_text(text, "restart.yaml", registry, {}), registry, self.clock, Telemetry(self.clock))
        return Service(graph, before_tick=self.refresh)

    def refresh(self) -> None:
        self.writer.refresh()

    def run(self, ticks: int, *, clean: bool = True, then_down_s: float = 5.0) -> list[Batch]:
        """A wattpipe run of ``ticks`` ticks 5 s apart, stopped cleanly (SIGTERM) or killed (no last checkpoint,
        nothing flushed); then ``then_down_s`` of node time before the next start."""
        service = self.service()
        out: list[Batch] = []

        async def go() -> None:
            await service.start()
            for i in range(ticks):
                (batch,) = await service.groups[0].tick()
                out.append(batch)
                if i < ticks - 1:
                    self.clock.advance(5.0)
            if clean:
                await service.shutdown()
            else:
                for _, component in service.graph.receivers.items():  # the driver's handle goes with the process
                    shutdown = getattr(component, "shutdown", None)
                    if shutdown is not None:
                        result = shutdown()
                        if asyncio.iscoroutine(result):
                            await result

        asyncio.run(go())
        self.batches.append(out)
        self.clock.advance(then_down_s)
        return out


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    try:
        yield Node(tmp_path)
    finally:
        simulator.uninstall()


Key = tuple[object, ...]
Row = Totals | DeviceTotals


def _key(r: Row) -> Key:
    if isinstance(r, DeviceTotals):
        return ("device", r.device_id)
    return (r.scope, r.key, r.device_id)


def start_s(r: Row) -> float | None:
    return None if r.start is None else r.start.wall_s


def rows(batch: Batch) -> dict[Key, Row]:
    out: dict[Key, Row] = {_key(r): r for r in batch.totals}
    out.update((_key(r), r) for r in batch.device_totals)
    return out


def restored_ok(before: Batch, after: Batch, clean: bool, checkpointed: Batch) -> list[str]:
    """What is wrong with ``after`` (a restart's first batch) against the run before it: ``before`` (its last
    batch) and ``checkpointed`` (the batch its last checkpoint holds)."""
    problems = []
    old, new = rows(before), rows(after)
    for key, was in old.items():
        now = new.get(key)
        state = getattr(was, "state", "running")
        if now is None:
            if state == "running":
                problems.append(f"{key}: running before the restart, absent after it")
            continue
        floor = rows(checkpointed).get(key)
        expected = was.energy_mj if clean else (floor.energy_mj if floor is not None else 0)
        if now.energy_mj != expected:
            problems.append(f"{key}: {was.energy_mj} mJ before, {now.energy_mj} after (expected {expected})")
        if start_s(now) != start_s(was):
            problems.append(f"{key}: start {start_s(was)} before, {start_s(now)} after")
        if state == "terminated" and getattr(now, "state", None) != "terminated":
            problems.append(f"{key}: terminated before the restart, {getattr(now, 'state', None)} after")
        if isinstance(now, Totals) and now.state == "running" and now.power_w is not None:
            problems.append(f"{key}: {now.power_w} W on the restart's first tick (a baseline: not known)")
    return problems


def within_run(run: list[Batch]) -> list[str]:
    """Totals that fell or restarted inside a run, and CPU ticks that are not conserved per zone type."""
    problems = []
    for a, b in itertools.pairwise(run):
        old, new = rows(a), rows(b)
        for key, now in new.items():
            was = old.get(key)
            if was is not None and (now.energy_mj < was.energy_mj or start_s(now) != start_s(was)):
                problems.append(f"{key} at {b.time.wall_s}: {was.energy_mj} → {now.energy_mj} mJ")
        # Σ processes' CPU energy this tick == Σ zones' attributed energy this tick, per zone type
        zones_before = {r.device_id: r.attributed_energy_mj for r in a.device_totals}
        for zone in ("package", "dram"):
            attributed = sum(
                r.attributed_energy_mj - zones_before.get(r.device_id, 0)
                for r in b.device_totals
                if r.device_name == zone
            )
            billed = sum(
                r.energy_mj - (old[_key(r)].energy_mj if _key(r) in old else 0)
                for r in b.totals
                if r.scope == "process" and r.device_id == f"cpu:{zone}"
            )
            if attributed != billed:
                problems.append(f"{zone} at {b.time.wall_s}: {attributed} mJ attributed, {billed} billed")
    return problems


def test_cpu_and_gpu_totals_go_on_across_clean_and_killed_restarts(node: Node) -> None:
    # 0–45 s clean stop; 52–87 s killed (last checkpoint at 72 s); 90–160 s clean (3002 exits in it, the
    # packages wrap near 150 s); 172–217 s.
    plan = [(10, True, 7.0), (8, False, 3.0), (15, True, 12.0), (10, True, 1.0)]
    runs = [node.run(n, clean=c, then_down_s=d) for n, c, d in plan]
    problems = [p for run in runs for p in within_run(run)]
    for (_, clean, _), before, after in zip(plan[:-1], runs[:-1], runs[1:], strict=True):
        checkpointed = before[-1] if clean else before[4]  # killed: the checkpoint at 72 s (20 s after 52)
        problems += restored_ok(before[-1], after[0], clean, checkpointed)
    assert not problems, "\n".join(problems)


def test_a_restart_bills_no_process_its_cpu_time_before_it(node: Node) -> None:
    """After a restart a process's first share is one tick's CPU time, not its lifetime's: its watts on the
    restart's second tick (its first delta) are its watts before."""
    first = node.run(10, then_down_s=30.0)
    second = node.run(4)
    before = {(r.key, r.device_id): r.power_w for r in first[-1].totals if r.scope == "process"}
    after = {(r.key, r.device_id): r.power_w for r in second[1].totals if r.scope == "process"}
    for key, watts in before.items():
        if key[1].startswith("cpu:") and watts:
            assert after[key] == pytest.approx(watts, rel=0.25), key


def test_a_clean_stop_loses_no_gpu_energy_held_for_idle(node: Node) -> None:
    # The GPU is busy from the start, its idle unknown until the load changes at 120 s (a regression fit near
    # 140 s); a run without a restart releases the held energy after idle_wait (90 s) or once idle is known.
    runs = [node.run(10, then_down_s=5.0), node.run(24)]  # 0–45 s, stopped cleanly; 50–165 s
    measured = sum(p.energy_mj for run in runs for b in run for p in b.device_power if p.device_type == "gpu")
    (device,) = [r for r in runs[-1][-1].device_totals if r.device_type == "gpu"]
    assert device.energy_mj == measured  # was 14.04 kJ short, run 1's whole energy (attribution saved no hold)


def test_a_killed_run_restores_the_hold_of_its_last_checkpoint_with_the_totals(node: Node) -> None:
    """Killed (no last checkpoint): the held ticks and the totals both come back as the checkpoint at 40 s had
    them, so what was held then is counted once, and what the run measured after it is lost (as any total's)."""
    runs = [node.run(10, clean=False, then_down_s=5.0), node.run(24)]  # checkpoints at 20 s and 40 s; 50–165 s
    kept = [b for b in runs[0] if b.time.wall_s - runs[0][0].time.wall_s <= 40.0]
    measured = sum(
        p.energy_mj for run in (kept, runs[1]) for b in run for p in b.device_power if p.device_type == "gpu"
    )
    (device,) = [r for r in runs[-1][-1].device_totals if r.device_type == "gpu"]
    assert device.energy_mj == measured


def test_an_attribution_section_from_another_component_is_named_and_the_rest_restored(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.run(5)
    path = node.tmp / "state.json"
    document = json.loads(path.read_text())
    sections = document["sections"]
    held = sum(len(ticks) for ticks in sections["metrics/attribution"]["idle_hold"].values())
    assert held == 4  # the GPU's idle is not known yet: its ticks are held
    sections["metrics/attribution"] = sections["metrics/energy"]  # a foreign section (hand-edited)
    path.write_text(json.dumps(document))
    caplog.set_level(logging.ERROR)
    batches = node.run(3)
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "metrics/attribution" in error
    assert "not an attribution section" in error
    (device,) = [r for r in batches[-1].device_totals if r.device_type == "gpu"]
    (before,) = [r for r in node.batches[0][-1].device_totals if r.device_type == "gpu"]
    assert start_s(device) == start_s(before)  # the energy processor's section was used


def test_a_restart_keeps_the_cpu_idle_learned_in_mode_idle(node: Node) -> None:
    node.config = CONFIG.replace("  cpu_attribution:\n", "  cpu_attribution: {mode: idle}\n")
    first = node.run(20)  # the package zones' idle is learned (a regression fit) by 75 s
    assert {p.idle_source for p in first[-1].device_power if p.device_type == "cpu"} == {"regression"}
    second = node.run(3)
    assert {p.idle_source for p in second[1].device_power if p.device_type == "cpu"} == {"regression"}


def test_a_series_that_ended_before_a_clean_stop_comes_back_terminated(node: Node) -> None:
    first = node.run(17)  # 0–80 s: pid 3002 (61–73 s) ended at the 75 s tick
    second = node.run(3)  # 85–95 s: within terminated_retention (60 s) of its end
    ended = {_key(r): r for r in first[-1].totals if r.key == "3002"}
    assert ended
    assert {r.state for r in ended.values()} == {"terminated"}
    for batch in second:
        again = {_key(r): r for r in batch.totals if r.key == "3002"}
        assert again.keys() == ended.keys()
        for key, r in again.items():
            assert (r.state, r.energy_mj, start_s(r)) == ("terminated", ended[key].energy_mj, start_s(ended[key]))
            assert r.power_w in (None, 0.0)
    assert not restored_ok(first[-1], second[0], True, first[-1])
