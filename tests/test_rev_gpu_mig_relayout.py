"""Review of the GPU side: a MIG GPU repartitioned under GPU-instance ids it had already.

The nvml receiver reads a MIG GPU's layout (each instance's profile and compute slices) when MIG is switched
on, every ``mig_layout_refresh`` (60 s), and at once when a process names an instance the layout lacks. A
repartition hands out GPU-instance ids by placement, so a new instance often has an id the old layout had
(an A100's 3g.20gb at GI 1 where a 4g.20gb was): its processes named a known instance, and its old profile
and slices stood for up to a minute, weighing its activity by the old instance's slices in MIG attribution.
An instance can only be destroyed once no process is on it, so a GPU instance whose processes are all new
since the last tick it had any may have been made again: its layout is read again then (only then: the
layout costs an NVML call per instance).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pynvml
import pytest

from tests.receivers.test_nvml import Harness, _mig_scenario
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import MigInstance


def _repartitioned() -> dict[str, Any]:
    # At 10 s GI 2 (3g, pid 41 on it) is destroyed and made again as a 2g.20gb; pid 43 starts on it.
    data = _mig_scenario(
        faults=[
            {
                "at_s": 10,
                "target": "gpu",
                "gpu": 0,
                "set": {"mig": {"instances": [{"gi": 2, "profile": "2g.20gb"}, {"gi": 9, "profile": "1g.10gb"}]}},
            }
        ]
    )
    data["processes"][0]["end_s"] = 10
    data["processes"].append({"pid": 43, "comm": "z", "gpu": 0, "gi": 2, "util": [[0, 0.7]], "start_s": 10})
    return data


def _layout(h: Harness) -> list[tuple[int, str | None, int | None]]:
    records = list(asyncio.run(h.receiver.collect()))
    return sorted((i.gpu_instance_id, i.profile, i.compute_slices) for i in records if isinstance(i, MigInstance))


def test_an_instance_made_again_under_its_id_is_read_again_at_its_first_process() -> None:
    clock = SteppedClock()
    h = Harness(_repartitioned(), clock)
    try:
        clock.advance(5.0)
        assert _layout(h) == [(2, "3g.40gb", 3), (9, "1g.10gb", 1)]
        clock.advance(10.0)  # 15 s: pid 43 on GI 2, pid 41 gone
        assert _layout(h) == [(2, "2g.20gb", 2), (9, "1g.10gb", 1)], "the old 3g layout stood for GI 2"
    finally:
        h.close()


def test_the_layout_is_not_read_again_while_an_instances_processes_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppedClock()
    data = _mig_scenario()
    # On GI 9 a new job every 10 s, overlapping the last by a tick: always one process that was there before.
    data["processes"][1]["end_s"] = 12
    data["processes"] += [
        {"pid": 50 + k, "comm": "j", "gpu": 0, "gi": 9, "util": [[0, 0.5]], "start_s": 8 + 10 * k, "end_s": 22 + 10 * k}
        for k in range(5)
    ]
    h = Harness(data, clock, mig_layout_refresh=3600.0)
    calls = {"n": 0}
    real = pynvml.nvmlDeviceGetMaxMigDeviceCount

    def counting(*args: Any) -> Any:
        calls["n"] += 1
        return real(*args)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxMigDeviceCount", counting)
    try:
        for _ in range(10):
            clock.advance(5.0)
            h.poll()
        assert calls["n"] == 1  # read once, when MIG was first seen
    finally:
        h.close()
