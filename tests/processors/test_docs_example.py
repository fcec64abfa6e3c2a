"""The custom processor in docs/configuration.md works as documented."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import PipelineRunner
from wattpipe.pipeline.telemetry import Telemetry

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
H = "tests.helpers.components"


def test_reweight_example_scales_only_the_named_pids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    text = textwrap.dedent(
        f"""
        receivers:
          custom/gpu: {{class: "{H}:CountingGpu", watts: 100}}
          custom/procs: {{class: "{H}:ProcessLister", pids: [4242, 7]}}
        processors:
          custom/split: {{class: "{H}:EvenSplit"}}
          custom/reweight: {{class: "reweight:Reweight", factor: 0.5, pids: [4242]}}
        exporters:
          custom/rec: {{class: "{H}:Recorder"}}
        service:
          pipelines:
            metrics: {{interval: 10s, receivers: [custom/gpu, custom/procs],
                       processors: [custom/split, custom/reweight], exporters: [custom/rec]}}
        """
    )
    clock = SteppedClock()
    registry = Registry.from_entry_points()
    graph = build(load_config_text(text, "t.yaml", registry, {}), registry, clock, Telemetry(clock))
    batch = asyncio.run(PipelineRunner(graph, graph.pipelines[0]).tick())
    by_pid = {s.pid: s.energy_j for s in batch.shares}
    assert by_pid == {4242: pytest.approx(250.0), 7: pytest.approx(500.0)}  # 1000 J split 500/500, then ×0.5
    sys.modules.pop("reweight", None)
