"""A review of the state file as an operator meets it: a file in the right format whose section a component
cannot use (hand-edited, truncated by a tool, written by another build), on the CPU scenario's node and with a
minimal pipeline. wattpipe must say which file and which section, and start anyway."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_rev_restart_cpu import CONFIG, Node
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry

H = "tests.helpers.components"


def tally_service(path: Path, clock: SteppedClock) -> Service:
    text = textwrap.dedent(
        f"""
        receivers:
          custom/gpu: {{class: "{H}:CountingGpu"}}
        processors:
          custom/tally: {{class: "{H}:Tally"}}
        exporters:
          custom/rec: {{class: "{H}:Recorder"}}
        service:
          telemetry: {{listen: ""}}
          state: {{path: "{path}", checkpoint_interval: 1m}}
          pipelines:
            metrics: {{interval: 10s, receivers: [custom/gpu], processors: [custom/tally], exporters: [custom/rec]}}
        """
    )
    registry = Registry.from_entry_points()
    graph = build(load_config_text(text, "t.yaml", registry, {}), registry, clock, Telemetry(clock))
    return Service(graph)


def test_a_section_a_component_cannot_read_is_named_set_aside_and_the_component_starts_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.json"
    clock = SteppedClock()
    asyncio.run(tally_service(path, clock).run(max_ticks=3))
    document = json.loads(path.read_text())
    document["sections"]["metrics/custom/tally"] = {"count": "three"}  # edited by hand: not a number
    path.write_text(json.dumps(document))
    caplog.set_level(logging.INFO)

    service = tally_service(path, clock)
    asyncio.run(service.run(max_ticks=2))  # starts: never a reason not to

    tally = service.graph.pipelines[0].processors[0][1]
    assert tally.count == 2  # type: ignore[attr-defined]  # afresh
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert str(path) in errors[0]
    assert "metrics/custom/tally" in errors[0]
    assert "ValueError" in errors[0]
    kept = list(tmp_path.glob("state.json.bad-*"))
    assert len(kept) == 1  # the file as it was, for a person to look at
    assert json.loads(kept[0].read_text())["sections"]["metrics/custom/tally"] == {"count": "three"}
    assert json.loads(path.read_text())["sections"]["metrics/custom/tally"] == {"count": 2}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    try:
        yield Node(tmp_path)
    finally:
        simulator.uninstall()


def test_a_cpu_attribution_section_missing_a_key_does_not_stop_wattpipe(node: Node) -> None:
    """Found with ``wattpipe demo`` on configs/scenarios/cpu.yaml: a zone row without ``start_wall_s`` stopped it
    at start with ``KeyError: 'start_wall_s'`` (exit 1), naming neither the file nor the section."""
    node.run(4)
    path = node.tmp / "state.json"
    document = json.loads(path.read_text())
    document["sections"]["metrics/cpu_attribution"]["zones"] = {"intel-rapl:0": {"zone": "package"}}
    path.write_text(json.dumps(document))
    batches = node.run(3)
    assert any(r.device_type == "cpu" for r in batches[-1].device_totals)
    energy = {r.device_id: r.energy_mj for r in batches[-1].device_totals if r.device_type == "gpu"}
    assert energy  # the other processors' sections were used


def test_a_start_that_fails_on_a_busy_port_keeps_the_totals_in_the_state_file(node: Node) -> None:
    """A port another program holds stops the run (exit 1, docs/configuration.md). It must not cost the totals:
    the processors had not started (read their sections), and the checkpoint at the failed start's shutdown
    wrote their empty state over the file."""
    first = node.run(4)
    path = node.tmp / "state.json"
    saved = json.loads(path.read_text())["sections"]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        node.config = CONFIG.replace(
            'exporters:\n  custom/rec: {class: "tests.helpers.components:Recorder"}\n',
            'exporters:\n  custom/rec: {class: "tests.helpers.components:Recorder"}\n'
            f'  prometheus: {{listen: "127.0.0.1:{port}"}}\n',
        ).replace("exporters: [custom/rec]", "exporters: [custom/rec, prometheus]")
        with pytest.raises(RuntimeError, match="cannot listen"):
            node.run(1)
    assert json.loads(path.read_text())["sections"] == saved
    node.config = CONFIG
    again = node.run(1)
    before = {r.device_id: r.energy_mj for r in first[-1].device_totals}
    assert {r.device_id: r.energy_mj for r in again[0].device_totals} == before


def test_a_bad_cpu_attribution_section_is_used_all_or_nothing(node: Node) -> None:
    node.run(6)
    path = node.tmp / "state.json"
    document = json.loads(path.read_text())
    document["sections"]["metrics/cpu_attribution"]["zones"]["intel-rapl:0"].pop("start_wall_s")
    path.write_text(json.dumps(document))
    (batch,) = node.run(1)
    zones = sum(r.attributed_energy_mj for r in batch.device_totals if r.device_type == "cpu")
    processes = sum(r.energy_mj for r in batch.totals if r.scope == "process" and r.device_id.startswith("cpu:"))
    assert processes <= zones
