"""procfs's ``cpu_time: auto`` (the default): every process's CPU time every tick only where a processor of a
pipeline it feeds asks for it (``cpu_attribution``); otherwise a process is read once, the GPU path's mode."""

from __future__ import annotations

import textwrap

import pytest

from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.telemetry import Telemetry

GPU_ONLY = """
receivers:
  nvml:
  procfs: {root: /proc PROCFS_OPTIONS}
processors:
  idle:
exporters:
  console:
service:
  pipelines:
    metrics: {receivers: [nvml, procfs], processors: [idle], exporters: [console]}
"""
WITH_CPU = """
receivers:
  procfs: {root: /proc PROCFS_OPTIONS}
  rapl: {root: /sys}
processors:
  cpu_attribution:
exporters:
  console:
service:
  pipelines:
    metrics: {receivers: [procfs, rapl], processors: [cpu_attribution], exporters: [console]}
"""


def procfs_cpu_time(text: str, options: str = "") -> bool:
    registry = Registry.from_entry_points()
    clock = SteppedClock()
    config = load_config_text(textwrap.dedent(text.replace("PROCFS_OPTIONS", options)), "t.yaml", registry, {})
    graph = build(config, registry, clock, Telemetry(clock))
    table = graph.receivers["procfs"].table  # type: ignore[attr-defined]
    return bool(table.cpu_time)


@pytest.mark.parametrize(
    ("text", "options", "expected"),
    [
        (GPU_ONLY, "", False),  # nothing asks for CPU time: a process is read once
        (WITH_CPU, "", True),  # cpu_attribution asks for it
        (GPU_ONLY, ", cpu_time: true", True),  # said outright, it is what was said
        (WITH_CPU, ", cpu_time: false", False),
    ],
    ids=["gpu-only-auto", "cpu-auto", "gpu-only-forced-on", "cpu-forced-off"],
)
def test_cpu_time_follows_what_the_pipeline_asks_for(text: str, options: str, expected: bool) -> None:
    assert procfs_cpu_time(text, options) is expected


def test_a_receiver_feeding_two_pipelines_reads_cpu_time_if_either_asks() -> None:
    text = WITH_CPU.replace(
        "    metrics: {receivers: [procfs, rapl], processors: [cpu_attribution], exporters: [console]}",
        "    metrics: {receivers: [procfs, rapl], processors: [cpu_attribution], exporters: [console]}\n"
        "    metrics/gpu: {receivers: [nvml, procfs], processors: [idle], exporters: [console]}",
    ).replace("processors:\n  cpu_attribution:", "processors:\n  cpu_attribution:\n  idle:")
    text = text.replace("receivers:\n  procfs", "receivers:\n  nvml:\n  procfs")
    assert procfs_cpu_time(text) is True
