"""A MIG instance that no record names in a tick whose device energy was split (a repartition removed it):
it got none of that energy, so its watts are 0, not the last value it had (the rev-energy review: an
instance removed by a repartition went on showing its last watts, tick after tick)."""

from __future__ import annotations

from tests.processors.test_idle_energy import energy, power
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import InstanceEnergy


def test_an_instance_gone_from_a_split_device_shows_0_w_not_its_last_watts() -> None:
    clock = SteppedClock()
    proc = energy(clock)

    def tick(instances: list[tuple[int, int]], answered: bool = True) -> dict[str, tuple[int, float | None]]:
        records = tuple(
            InstanceEnergy(time=clock.now(), device_id="G", gpu_instance_id=gi, energy_mj=mj, power_w=mj / 5000)
            for gi, mj in instances
        )
        batch = Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=(power(clock, sum(mj for _, mj in instances)),) if answered else (),
            instance_energy=records,
        )
        out = proc.process(batch)
        clock.advance(5.0)
        return {t.key: (t.energy_mj, t.power_w) for t in out.totals if t.scope == "instance"}

    assert tick([(1, 50_000), (2, 10_000)]) == {"1": (50_000, 10.0), "2": (10_000, 2.0)}
    assert tick([(2, 10_000)]) == {"1": (50_000, 0.0), "2": (20_000, 2.0)}  # instance 1 repartitioned away
    assert tick([], answered=False) == {"1": (50_000, None), "2": (20_000, None)}  # not known: absent
