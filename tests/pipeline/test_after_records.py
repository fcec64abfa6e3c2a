"""A receiver that reads after the others of its tick (``after_records``/``collect_after``) gets their records,
in their order, and is told which of its fields are unknown this tick (a receiver failed): unknown is not empty."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Sequence

from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import CreateContext, Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.records import GpuProcessSample, HostProcess, Record
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry

H = "tests.helpers.components"
HERE = "tests.pipeline.test_after_records"


class Listing:
    """GPU processes: ``fail_at`` (1-based tick numbers) raise."""

    provides = frozenset({"gpu_processes"})

    def __init__(self, *, pids: Sequence[int] = (), fail_at: Sequence[int] = (), context: CreateContext) -> None:
        self.pids, self.fail_at, self.clock, self.reads = list(pids), set(fail_at), context.clock, 0

    async def collect(self) -> Sequence[Record]:
        self.reads += 1
        await asyncio.sleep(0)
        if self.reads in self.fail_at:
            raise RuntimeError("driver gone")
        now = self.clock.now()
        return [GpuProcessSample(time=now, device_id="GPU-0", pid=pid) for pid in self.pids]


class After:
    """Host processes for the GPU pids it was handed; what it was told, kept."""

    provides = frozenset({"host_processes"})
    after_records = frozenset({"gpu_processes", "devices"})

    def __init__(self, *, context: CreateContext) -> None:
        self.clock = context.clock
        self.seen: list[tuple[list[int], frozenset[str]]] = []
        self.plain = 0

    async def collect(self) -> Sequence[Record]:
        self.plain += 1
        return []

    async def collect_after(self, records: Sequence[Record], unknown: frozenset[str]) -> Sequence[Record]:
        pids = [r.pid for r in records if isinstance(r, GpuProcessSample)]
        self.seen.append((pids, unknown))
        now = self.clock.now()
        return [HostProcess(time=now, pid=pid, comm="p", start_time_ticks=1) for pid in pids]


def make_graph(receivers: str, listed: str) -> Graph:
    text = f"""
    receivers:
    {receivers}
    exporters:
      custom/rec: {{class: "{H}:Recorder"}}
    service:
      pipelines:
        metrics: {{interval: 5s, receivers: [{listed}], exporters: [custom/rec]}}
    """
    registry = Registry.from_entry_points()
    clock = SteppedClock()
    config = load_config_text(textwrap.dedent(text), "test.yaml", registry, {"NODE_NAME": "n"})
    return build(config, registry, clock, Telemetry(clock))


RECEIVERS = f"""
      custom/after: {{class: "{HERE}:After"}}
      custom/a: {{class: "{HERE}:Listing", pids: [7, 3]}}
      custom/b: {{class: "{HERE}:Listing", pids: [5], fail_at: [2]}}
"""


def test_it_reads_after_the_others_with_their_records_in_order_and_the_unknown_fields() -> None:
    graph = make_graph(RECEIVERS, "custom/after, custom/a, custom/b")
    asyncio.run(Service(graph).run(max_ticks=2))
    after = graph.receivers["custom/after"]
    # Every record of the tick's others, in the pipeline's order; "devices" nobody provides: not unknown.
    assert after.seen == [([7, 3, 5], frozenset()), ([7, 3], frozenset())]  # type: ignore[attr-defined]
    assert after.plain == 0  # type: ignore[attr-defined]
    batches = graph.exporters["custom/rec"].batches  # type: ignore[attr-defined]
    assert [sorted(h.pid for h in b.host_processes) for b in batches] == [[3, 5, 7], [3, 7]]


def test_a_field_whose_only_receiver_failed_is_unknown_not_empty() -> None:
    receivers = f"""
      custom/after: {{class: "{HERE}:After"}}
      custom/b: {{class: "{HERE}:Listing", pids: [5], fail_at: [2]}}
"""
    graph = make_graph(receivers, "custom/after, custom/b")
    asyncio.run(Service(graph).run(max_ticks=3))
    after = graph.receivers["custom/after"]
    assert after.seen == [  # type: ignore[attr-defined]
        ([5], frozenset()),
        ([], frozenset({"gpu_processes"})),
        ([5], frozenset()),
    ]


def test_with_no_receiver_of_its_fields_in_the_group_it_is_read_as_any_other() -> None:
    graph = make_graph(f'  custom/after: {{class: "{HERE}:After"}}', "custom/after")
    asyncio.run(Service(graph).run(max_ticks=2))
    after = graph.receivers["custom/after"]
    assert (after.plain, after.seen) == (2, [])  # type: ignore[attr-defined]


class Narrowing(Listing):
    """Answers every tick, but leaves ``gpu_processes`` out of its ``provides`` on the second (its listing failed)."""

    async def collect(self) -> Sequence[Record]:
        records = await super().collect()
        if self.reads == 2:
            self.provides = frozenset()
            return []
        self.provides = Listing.provides
        return records


def test_a_field_its_receiver_left_out_this_tick_is_unknown_and_the_order_stands() -> None:
    receivers = f"""
      custom/after: {{class: "{HERE}:After"}}
      custom/n: {{class: "{HERE}:Narrowing", pids: [5]}}
"""
    graph = make_graph(receivers, "custom/after, custom/n")
    asyncio.run(Service(graph).run(max_ticks=4))
    after = graph.receivers["custom/after"]
    assert after.plain == 0  # type: ignore[attr-defined]
    assert after.seen == [  # type: ignore[attr-defined]
        ([5], frozenset()),
        ([], frozenset({"gpu_processes"})),
        ([5], frozenset()),
        ([5], frozenset()),
    ]
