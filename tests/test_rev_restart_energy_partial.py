"""The energy processor's section read back after a failed start: the runtime starts a component whose section it
cannot use again without it (pipeline/runtime.py ``_start_afresh``), on the same object, so what the failed start
had already restored stays beside totals from 0 (cpu_attribution reads its whole section first: all or nothing; energy now too)."""

from __future__ import annotations

import pytest

from tests.helpers.context import make_context
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.energy import EnergyConfig, EnergyProcessor


def test_a_bad_energy_section_restores_nothing() -> None:
    clock = SteppedClock()
    store = StateStore(None, clock, "n1")
    row = {"energy_mj": 5_000, "start_wall_s": 1.0, "ended_wall_s": None, "attrs": {}}
    store.put(
        "metrics/energy",
        {
            "processes": [{"pid": 7, "device_id": "GPU-a", "start_ticks": 70, **row}],
            "groups": [],
            "instances": [],
            "devices": {"GPU-a": {"energy_mj": 9_000}},  # its other fields missing: a bad row
        },
    )
    proc = EnergyProcessor(EnergyConfig(), make_context("energy", clock=clock, pipeline="metrics", state=store))
    with pytest.raises(KeyError):
        proc.start()
    assert (proc.series, proc.devices) == ({}, {})
