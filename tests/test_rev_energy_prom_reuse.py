"""A pid the kernel reused within ``terminated_retention``, for the same program in the same container on
the same GPU (a job launcher's loop, a node with a small pid_max): the energy processor keeps two series,
told apart by start time, but once both have ended Kepler's label set (pid, device, comm, exe, container_id,
state="terminated") is the same, and the exposition kept one: the later (measured: A's 10 J replaced by B's 2 J
the tick B ended). The terminated series then decreased, which rate()/increase() read as a counter reset,
counting B's energy a second time (it was counted under state="running" already); A's total was no longer
exposed.

Now the later process's series carries ``series_start`` (when it began) from its first record to its last, so
each ended series keeps a label set of its own; the first process's labels are Kepler's, unchanged.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.context import make_context
from tests.helpers.reference_prometheus import exporter_for
from tests.processors.test_idle_energy import energy, power, share
from wattpipe.exporters.prometheus import PrometheusConfig
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import GpuShare, HostProcess

CID = "c" * 64


def test_both_ended_processes_of_a_reused_pid_are_in_the_exposition() -> None:
    clock = SteppedClock()
    proc = energy(clock, terminated_retention=3600.0)
    exporter = exporter_for(
        "fast", PrometheusConfig.model_validate({"listen": "127.0.0.1:0"}), make_context("prometheus", "exporter")
    )

    def tick(shares: list[GpuShare], start: int | None) -> None:
        hosts = () if start is None else (HostProcess(time=Timestamp(0.0, 0.0), pid=7, comm="python",
                                                      start_time_ticks=start, container_id=CID),)  # fmt: skip
        batch = Batch(time=clock.now(), interval_s=5.0, node="n").replace(
            device_power=(power(clock, sum(s.energy_mj for s in shares)),), shares=tuple(shares), host_processes=hosts
        )
        exporter.render(proc.process(batch))
        clock.advance(5.0)

    tick([share(clock, 7, 10_000)], 100)  # process A
    tick([], None)  # A exits
    tick([share(clock, 7, 2_000)], 900)  # process B, given A's pid
    tick([], None)  # B exits
    samples = [
        s
        for family in text_string_to_metric_families(exporter.body.decode())
        for s in family.samples
        if s.name == "kepler_process_gpu_joules_total" and s.labels.get("state") == "terminated"
    ]
    assert sorted(s.value for s in samples) == [2.0, 10.0]
    (first,) = [s for s in samples if "series_start" not in s.labels]
    (second,) = [s for s in samples if "series_start" in s.labels]
    assert (first.value, second.value) == (10.0, 2.0)
    assert second.labels["series_start"] == "2026-01-01T00:00:05Z"  # B's first tick (10 s) less its interval (5 s)
