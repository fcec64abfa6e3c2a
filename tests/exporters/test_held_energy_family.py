"""A GPU whose energy attribution holds (idle not known yet, or a MIG GPU waiting for dcgm-exporter) shows its
watts at once but its joules only once released (processors/_idle_hold.py): ``kepler_node_gpu_joules_total``
counts energy as ``idle + active``, so for up to ``idle_wait`` it lags the counter. A person watching the demo
saw a GPU at 312 W with 0 J and nothing saying why. ``wattpipe_node_gpu_held_joules`` says how much is held:
measured by the counter, not yet split; ``joules_total + held`` is the counter's energy at every tick."""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.context import make_context
from tests.helpers.reference_prometheus import exporter_for
from tests.processors.test_idle_energy import energy, power, share
from wattpipe.exporters.prometheus import PrometheusConfig
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock


def samples(body: bytes, name: str) -> dict[str, float]:
    return {
        s.labels["gpu_uuid"]: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == name
    }


def test_the_held_level_is_exported_and_joules_total_plus_it_is_the_counters_energy() -> None:
    clock = SteppedClock()
    proc = energy(clock)
    exporter = exporter_for(
        "fast", PrometheusConfig.model_validate({"listen": "127.0.0.1:0"}), make_context("prometheus", "exporter")
    )
    counter_mj = 0
    ticks = [
        (1_500_000, 1_500_000, 0),  # held: the tick's whole energy (nothing idle or active yet)
        (1_600_000, 3_100_000, 0),  # held again: the level is both ticks'
        (1_400_000, 0, 3_000_000),  # idle known: both held ticks released with this one (idle + active)
    ]
    seen = []
    for tick_mj, held_mj, released_mj in ticks:
        counter_mj += tick_mj
        split_mj = 0 if held_mj else tick_mj + 3_100_000
        record = dataclasses.replace(
            power(clock, split_mj, idle_mj=released_mj // 3 if split_mj else 0), held_energy_mj=held_mj
        )
        shares = [share(clock, 7, split_mj - record.idle_energy_mj)] if split_mj else []
        batch = Batch(time=clock.now(), interval_s=5.0, node="n").replace(device_power=(record,), shares=tuple(shares))
        exporter.render(proc.process(batch))
        clock.advance(5.0)
        held = samples(exporter.body, "wattpipe_node_gpu_held_joules")
        total = samples(exporter.body, "kepler_node_gpu_joules_total")
        seen.append((held["G"], total["G"]))
        assert total["G"] + held["G"] == counter_mj / 1000
    assert seen == [(1500.0, 0.0), (3100.0, 0.0), (0.0, 4500.0)]
