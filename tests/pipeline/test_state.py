"""The state file: atomic checkpoints, set-aside of bad files, restored across a restart."""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
from pathlib import Path

import pytest

from wattpipe import steps
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import PipelineRunner, Service
from wattpipe.pipeline.state import FORMAT, VERSION, StateStore
from wattpipe.pipeline.telemetry import Telemetry

H = "tests.helpers.components"


def test_sections_round_trip_through_the_file(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = tmp_path / "state.json"
    store = StateStore(path, clock, "n1")
    store.put("metrics/energy", {"totals": {"4242": 12.5}})
    assert store.save()
    again = StateStore(path, clock, "n1")
    again.load()
    assert again.section("metrics/energy") == {"totals": {"4242": 12.5}}
    assert again.section("absent") is None
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["version"], doc["node"]) == (FORMAT, VERSION, "n1")
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left behind


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "unreadable"),
        ('{"format": "something-else", "version": 1, "sections": {}}', "not a wattpipe state file"),
        ('{"format": "wattpipe-state", "version": 99, "sections": {}}', "state format version 99"),
        ('{"format": "wattpipe-state", "version": 1, "sections": {"a": 3}}', "a section is not an object"),
    ],
)
def test_a_bad_file_is_set_aside_and_reported_never_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, why: str
) -> None:
    clock = SteppedClock()
    path = tmp_path / "state.json"
    path.write_text(content)
    store = StateStore(path, clock, "n1")
    store.load()
    assert store.section("a") is None
    assert store.set_aside is not None
    assert store.set_aside.read_text() == content  # kept for a person to look at
    assert not path.exists()
    assert why in caplog.text
    store.put("a", {"x": 1})
    assert store.save()  # and the next checkpoint writes a good file in its place
    assert json.loads(path.read_text())["sections"] == {"a": {"x": 1}}


def test_memory_only_store_writes_nothing(tmp_path: Path) -> None:
    store = StateStore(None, SteppedClock(), "n1")
    store.put("a", {"x": 1})
    assert store.save()
    assert store.section("a") == {"x": 1}
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_is_due_by_interval_on_the_clock() -> None:
    clock = SteppedClock()
    store = StateStore(None, clock, "n1", interval_s=30)
    assert store.due()
    store.save()
    clock.advance(29)
    assert not store.due()
    clock.advance(1)
    assert store.due()


def test_unwritable_location_is_reported_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = StateStore(blocker / "state.json", SteppedClock(), "n1")
    assert store.save() is False
    assert "cannot write a checkpoint" in caplog.text


def config_text(path: Path) -> str:
    return textwrap.dedent(
        f"""
        receivers:
          custom/gpu: {{class: "{H}:CountingGpu"}}
        processors:
          custom/tally: {{class: "{H}:Tally"}}
        exporters:
          custom/rec: {{class: "{H}:Recorder"}}
        service:
          state: {{path: "{path}", checkpoint_interval: 1m}}
          pipelines:
            metrics: {{interval: 10s, receivers: [custom/gpu], processors: [custom/tally], exporters: [custom/rec]}}
        """
    )


def run_service(path: Path, ticks: int, clock: SteppedClock) -> Service:
    registry = Registry.from_entry_points()
    graph = build(load_config_text(config_text(path), "t.yaml", registry, {}), registry, clock, Telemetry(clock))
    service = Service(graph)
    asyncio.run(service.run(max_ticks=ticks))
    return service


def test_state_survives_a_clean_restart_exactly(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    clock = SteppedClock()
    run_service(path, 7, clock)
    assert json.loads(path.read_text())["sections"]["metrics/custom/tally"] == {"count": 7}
    service = run_service(path, 3, clock)
    tally = service.graph.pipelines[0].processors[0][1]
    assert tally.count == 10  # type: ignore[attr-defined]  # nothing lost across the restart


def test_periodic_checkpoints_bound_what_a_crash_can_lose(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    clock = SteppedClock()
    registry = Registry.from_entry_points()
    graph = build(load_config_text(config_text(path), "t.yaml", registry, {}), registry, clock, Telemetry(clock))
    service = Service(graph)
    runner = PipelineRunner(graph, graph.pipelines[0])

    async def crash_after(ticks: int) -> None:
        await service.start()
        for _ in range(ticks):
            await runner.tick()
            clock.advance(10)
        # no shutdown: the process dies here

    asyncio.run(crash_after(14))  # 140 s of ticks, checkpoints every 60 s
    saved = json.loads(path.read_text())["sections"]["metrics/custom/tally"]["count"]
    assert 14 - 6 <= saved <= 14  # at most one checkpoint interval (6 ticks) lost


def test_a_temporary_file_left_by_a_killed_save_is_removed_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = SteppedClock()
    path = tmp_path / "state.json"
    store = StateStore(path, clock, "n1")
    store.put("metrics/energy", {"totals": {"1": 5}})
    assert store.save()
    (tmp_path / ".state.json.k1ll3d9x").write_text('{"format": "wattpipe-st')  # kill -9 mid-write
    (tmp_path / "other.json").write_text("{}")  # not ours
    (tmp_path / ".other.json.abcdefgh").write_text("{}")  # another state file's: not ours either
    again = StateStore(path, clock, "n1")
    with caplog.at_level("INFO"):
        again.load()
    assert again.section("metrics/energy") == {"totals": {"1": 5}}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.json.abcdefgh", "other.json", "state.json"]
    assert "removed .state.json.k1ll3d9x, left by an interrupted save" in caplog.text
    # With no state file at all (killed during the very first save), the leftover still goes.
    (path).unlink()
    (tmp_path / ".state.json.first000").write_text("{")
    StateStore(path, clock, "n1").load()
    assert not (tmp_path / ".state.json.first000").exists()


def test_a_stop_whose_last_checkpoint_fails_does_not_say_it_stopped_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The state file's directory cannot be made (a file is in the way): every checkpoint fails, the last one
    too, so what was measured since start is lost to the next run. The run says so at the end and exits 1,
    instead of "stopped cleanly" and 0 (found in the restart review)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    registry = Registry.from_entry_points()
    clock = SteppedClock()
    text = config_text(blocker / "state.json").replace("  state:", '  telemetry: {listen: ""}\n  state:')
    config = load_config_text(text, "t.yaml", registry, {})
    graph = build(config, registry, clock, Telemetry(clock))
    caplog.set_level(logging.INFO)
    code = asyncio.run(steps.run_service(graph, max_ticks=2))
    assert code == steps.EXIT_RUNTIME
    assert "stopped cleanly" not in caplog.text
    assert f"the state file {blocker / 'state.json'} could not be written" in caplog.text


def test_a_section_that_cannot_be_written_costs_only_its_component(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A NaN in one component's snapshot (JSON has no NaN: the file refuses it) made every checkpoint fail, every
    other component's state included, for as long as the value stayed (the restart-today review's note). The
    checkpoint is written without that section, which is named once."""
    path = tmp_path / "state.json"
    store = StateStore(path, SteppedClock(), "n1")
    store.put("metrics/energy", {"energy_mj": 5})
    store.put("metrics/broken", {"idle_w": float("nan")})
    for _ in range(3):
        assert store.save() is True
    assert json.loads(path.read_text())["sections"] == {"metrics/energy": {"energy_mj": 5}}
    said = [r.getMessage() for r in caplog.records if "metrics/broken" in r.getMessage()]
    assert len(said) == 1, said
    assert "cannot be written" in said[0]
    store.put("metrics/broken", {"idle_w": 1.5})  # a good value again: written again
    assert store.save() is True
    assert json.loads(path.read_text())["sections"]["metrics/broken"] == {"idle_w": 1.5}
