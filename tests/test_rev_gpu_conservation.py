"""Review of the GPU side: conservation through attribution's two holds (idle not known yet; MIG waiting for
dcgm-exporter's window) and the transitions between them, for any sequence of ticks: per tick
Σ shares + idle + (held now − held before) == energy, and no share is negative."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuProcessSample, MigActivity, MigInstance
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.idle import split_idle

TICK_S = 5.0
LAYOUT = {1: "3g.40gb", 2: "1g.10gb"}

_tick = st.fixed_dictionaries(
    {
        "energy_mj": st.integers(0, 2_000_000),
        "mig": st.booleans(),
        "idle": st.sampled_from(["known", "pending", "absent"]),
        "unattributable": st.sampled_from([None, None, None, "gap", "processes_unknown"]),
        "procs": st.lists(st.tuples(st.integers(1, 6), st.sampled_from([1, 2, None])), max_size=4),
        "activity": st.none() | st.dictionaries(st.sampled_from([1, 2]), st.floats(0, 1)),
        "collected": st.booleans(),
    }
)


def _batch(n: int, t: dict[str, object]) -> Batch:
    time = Timestamp(monotonic_s=1000.0 + TICK_S * n, wall_s=1_767_225_600.0 + TICK_S * n)
    energy = int(t["energy_mj"])  # type: ignore[call-overload]
    idle_w = 50.0 if t["idle"] == "known" else None
    idle_mj, active_mj = split_idle(energy, idle_w, TICK_S)
    power = DevicePower(
        time=time, device_id="G", interval_s=TICK_S, power_w=energy / 1000 / TICK_S, idle_w=idle_w,
        active_w=active_mj / 1000 / TICK_S, energy_mj=energy, idle_energy_mj=idle_mj, active_energy_mj=active_mj,
        idle_pending=t["idle"] == "pending", unattributable=t["unattributable"],  # type: ignore[arg-type]
    )  # fmt: skip
    mig = bool(t["mig"])
    procs = t["procs"]
    assert isinstance(procs, list)
    activity = t["activity"]
    batch = Batch(time=time, interval_s=TICK_S, node="n").replace(
        devices=(DeviceSample(time=time, device_id="G", mig_enabled=mig, energy_mj=1e9 + 1e6 * n),),
        device_power=(power,),
        gpu_processes=tuple(
            GpuProcessSample(time=time, device_id="G", pid=p, gpu_instance_id=gi if mig else None, sm_util=0.5)
            for p, gi in procs
        ),
        present=frozenset({"gpu_processes"}),
    )
    if mig:
        batch = batch.replace(
            mig_instances=tuple(
                MigInstance(time=time, device_id="G", gpu_instance_id=gi, profile=prof, compute_slices=int(prof[0]))
                for gi, prof in LAYOUT.items()
            )
        )
        if isinstance(activity, dict):
            batch = batch.replace(
                mig_activity=tuple(
                    MigActivity(
                        time=time,
                        device_id="G",
                        gpu_instance_id=gi,
                        gr_engine_active=a,
                        window_s=30.0,
                        collected_after_s=time.monotonic_s - TICK_S if t["collected"] else None,
                        collected_by_s=time.monotonic_s if t["collected"] else None,
                    )
                    for gi, a in activity.items()
                )
            )
    return batch


@settings(max_examples=300, deadline=None)
@given(st.lists(_tick, min_size=1, max_size=40), st.sampled_from([0.0, 12.0, 90.0]))
def test_every_millijoule_is_shared_idle_or_held_whatever_the_sequence(
    ticks: list[dict[str, object]], wait: float
) -> None:
    proc = AttributionProcessor(
        AttributionConfig.model_validate({"idle_wait": wait, "mig_max_wait": 20.0}),
        make_context("attribution", "processor", SteppedClock()),
    )
    held = 0
    total_in = total_out = 0
    for n, t in enumerate(ticks):
        out = proc.process(_batch(n, t))
        (power,) = out.device_power
        shares = sum(s.energy_mj for s in out.shares)
        assert all(s.energy_mj >= 0 for s in out.shares), n
        assert shares + power.idle_energy_mj + power.held_energy_mj - held == power.energy_mj, n
        held = power.held_energy_mj
        total_in += power.energy_mj
        total_out += shares + power.idle_energy_mj
    assert total_out + held == total_in
