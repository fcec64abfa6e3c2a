"""The tick, and the service's lifecycle.

Every ``interval`` a pipeline polls all its receivers concurrently (each with a timeout), merges what
arrived into one Batch, runs the processors in config order and hands the finished Batch to every
exporter. A receiver that fails or times out is counted and logged (once per distinct error per
minute) and the tick goes on without it; so does a failing processor or exporter. Pipelines that share a
receiver tick together: it is read once per tick and every one of them gets its records.

A receiver may read after the others of its tick, given what they returned: it names the Batch fields it
reads in ``after_records`` and has ``collect_after(records, unknown)`` (see :class:`Receiver`). Where another
receiver of the tick group provides one of those fields, the others are read first (concurrently), then it
(with every other dependent one, concurrently), handed all their records in their order and ``unknown``: the
fields of its ``after_records`` whose receivers failed or timed out this tick (unknown, not empty). Where none
provides any, it is read with the others through ``collect()``, as any receiver.

Lifecycle (the Collector's): exporters start first, receivers stop first. On stop, the tick in flight
finishes, then receivers stop, processors shut down (saving state) and exporters flush, all within
``service.shutdown_timeout``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import Exporter, Receiver, call_optional
from wattpipe.pipeline.graph import BuiltPipeline, Graph
from wattpipe.pipeline.records import Record
from wattpipe.pipeline.telemetry import RateLimitedLog

__all__ = ["YOUNG_GC_THRESHOLD", "PipelineGroup", "PipelineRunner", "Service", "settle_heap"]

log = logging.getLogger("wattpipe.runtime")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def checkpoint(graph: Graph, started: Sequence[object] | None = None) -> bool:
    """Ask every component with ``snapshot()`` for its state and write the state file. With ``started``, only
    those components: one that did not start has not read its section yet, and its empty state must not
    replace it (a start that failed on a busy port would otherwise write every total away)."""
    only = None if started is None else {id(c) for c in started}
    for key, component in graph.stateful():
        snapshot = getattr(component, "snapshot", None)
        if snapshot is None or (only is not None and id(component) not in only):
            continue
        try:
            graph.state.put(key, snapshot())
        except Exception as exc:  # one component's bad snapshot must not cost the others theirs
            log.error("%s: cannot take a state snapshot: %s", key, _describe(exc))
    return graph.state.save()


@dataclass(frozen=True, slots=True)
class _Read:
    """One receiver as a tick group reads it: once per tick, for every pipeline that lists it."""

    cid: str
    receiver: Receiver
    timeout_s: float
    pipelines: tuple[str, ...]

    @property
    def who(self) -> str:
        return f"pipeline {self.pipelines[0]}" if len(self.pipelines) == 1 else f"pipelines {', '.join(self.pipelines)}"


class PipelineRunner:
    """Runs one pipeline's ticks.

    ``before_tick`` runs at the start of every tick, before the receivers are polled: for the composition
    root to bring a simulated node's files up to the clock's time (nothing else should need it).
    """

    def __init__(self, graph: Graph, pipeline: BuiltPipeline, before_tick: Callable[[], None] | None = None) -> None:
        self.before_tick = before_tick
        self.graph = graph
        self.pipeline = pipeline
        self.clock = graph.telemetry.clock
        self.telemetry = graph.telemetry
        self.ticks = 0
        self.last_batch: Batch | None = None
        self._log = RateLimitedLog(log, self.clock)
        self._last_tick_s: float | None = None
        self._alone = PipelineGroup(graph, [self], before_tick)

    async def tick(self) -> Batch:
        """Run one tick of this pipeline on its own (its receivers read for it alone) and return the batch.

        A :class:`Service` ticks pipelines through their :class:`PipelineGroup` instead, so that a receiver
        shared with another pipeline is read once for both."""
        (batch,) = await self._alone.tick()
        return batch

    async def finish(self, started: Timestamp, polled: Mapping[str, Sequence[Record] | None]) -> Batch:
        """The rest of a tick that started at ``started``: the batch from what this pipeline's receivers
        answered (``polled`` by receiver ID; None: failed or timed out), then processors and exporters."""
        p = self.pipeline
        interval_s = p.config.interval if self._last_tick_s is None else started.monotonic_s - self._last_tick_s
        self._last_tick_s = started.monotonic_s
        results = [polled[cid] for cid, _ in p.receivers]
        batch = Batch(time=started, interval_s=interval_s, node=self.graph.config.service.node_name, pipeline=p.name)
        batch = batch.with_records(itertools.chain.from_iterable(records for records in results if records))
        # A field is present when a receiver that fills it answered (even with nothing): "no process"
        # is then an observation. A receiver that failed leaves its fields absent, not empty.
        answered = [r for (_, r), records in zip(p.receivers, results, strict=True) if records is not None]
        batch = batch.replace(**{f: getattr(batch, f) for r in answered for f in getattr(r, "provides", ())})
        for cid, processor in p.processors:
            try:
                batch = processor.process(batch)
            except Exception as exc:
                self.telemetry.processor_errors.labels(pipeline=p.name, component=cid).inc()
                self._log.log(
                    logging.ERROR,
                    f"{p.name}/{cid}/{_describe(exc)}",
                    f"pipeline {p.name}: processor {cid} failed: {_describe(exc)}; this tick skips it",
                )
        await asyncio.gather(*(self._export(cid, e, batch) for cid, e in p.exporters))
        if self.graph.state.due():
            checkpoint(self.graph)
        self.ticks += 1
        self.last_batch = batch
        self.telemetry.tick_finished(p.name, self.clock.monotonic() - started.monotonic_s)
        return batch

    async def _export(self, cid: str, exporter: Exporter, batch: Batch) -> None:
        labels = {"pipeline": self.pipeline.name, "component": cid}
        try:
            await exporter.export(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.telemetry.exporter_failed.labels(**labels).inc(batch.count())
            self._log.log(
                logging.WARNING,
                f"{self.pipeline.name}/{cid}/{_describe(exc)}",
                f"pipeline {self.pipeline.name}: exporter {cid} failed: {_describe(exc)}",
            )
            return
        self.telemetry.exporter_sent.labels(**labels).inc(batch.count())

    async def run(self, stop: asyncio.Event, max_ticks: int | None = None) -> None:
        """Tick on its own every interval until ``stop`` is set (or ``max_ticks`` ran)."""
        await self._alone.run(stop, max_ticks)


class PipelineGroup:
    """Pipelines that tick together because they share receivers (a pipeline that shares none is a
    group of one).

    Receivers report what happened since their previous read (NVML integrates per-process utilisation
    over it), so two pipelines reading one instance on their own would each get part of the data. A group
    reads every receiver once per tick, concurrently, and gives every pipeline that lists it the same
    records (the OpenTelemetry Collector's fan-out); each pipeline then builds its own batch and runs its
    own processors and exporters. The configuration gives a group one interval.
    """

    def __init__(
        self, graph: Graph, runners: Sequence[PipelineRunner], before_tick: Callable[[], None] | None = None
    ) -> None:
        self.runners = tuple(runners)
        intervals = {r.pipeline.config.interval for r in self.runners}
        if len(intervals) != 1:
            names = ", ".join(r.pipeline.name for r in self.runners)
            raise ValueError(f"pipelines {names} share receivers but not an interval ({sorted(intervals)})")
        self.interval_s = intervals.pop()
        self.before_tick = before_tick
        self.clock = graph.telemetry.clock
        self.telemetry = graph.telemetry
        self.ticks = 0
        self._log = RateLimitedLog(log, self.clock)
        self._reads = _reads(self.runners)
        self._provided: set[str] = set()  # every field a receiver of the group provided, this tick or before

    async def tick(self) -> list[Batch]:
        """Run one tick now: read every receiver once, then finish every pipeline; their batches, in order."""
        if self.before_tick is not None:
            await asyncio.to_thread(self.before_tick)
        started = self.clock.now()
        first, after = _phases(self._reads, self._provided)
        answers = await asyncio.gather(*(self._poll(read) for read in first))
        polled = {read.cid: records for read, records in zip(first, answers, strict=True)}
        if after:
            answers = await asyncio.gather(*(self._poll(read, first, polled, fields) for read, fields in after))
            polled.update((read.cid, records) for (read, _), records in zip(after, answers, strict=True))
        if len(self.runners) == 1:  # the usual case: no task to wrap the one pipeline's rest of the tick in
            batches = [await self.runners[0].finish(started, polled)]
        else:
            batches = list(await asyncio.gather(*(r.finish(started, polled) for r in self.runners)))
        self.ticks += 1
        return batches

    async def _poll(
        self,
        read: _Read,
        before: Sequence[_Read] = (),
        polled: Mapping[str, Sequence[Record] | None] | None = None,
        fields: frozenset[str] = frozenset(),
    ) -> Sequence[Record] | None:
        """The receiver's records, or None if it failed or timed out (so its fields stay absent, not empty).
        Counted for every pipeline that lists it: each of them got these records, or went without. With
        ``polled`` (a receiver that reads after ``before``, for ``fields``): through its ``collect_after``."""
        cid = read.cid
        try:
            if polled is None:
                reading = read.receiver.collect()
            else:
                records_before = [r for b in before if (got := polled[b.cid]) for r in got]
                known = {f for b in before if polled[b.cid] is not None for f in _fields(b.receiver, "provides")}
                reading = read.receiver.collect_after(records_before, fields - known)  # type: ignore[attr-defined]
            records = await asyncio.wait_for(reading, timeout=read.timeout_s)
        except TimeoutError:
            self._failed(read, "timeout", f"did not answer within {read.timeout_s:g}s")
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(read, _describe(exc), f"failed: {_describe(exc)}")
            return None
        for name in read.pipelines:
            self.telemetry.receiver_records.labels(pipeline=name, component=cid).inc(len(records))
        return records

    def _failed(self, read: _Read, key: str, what: str) -> None:
        for name in read.pipelines:
            self.telemetry.receiver_errors.labels(pipeline=name, component=read.cid).inc()
        self._log.log(
            logging.WARNING,
            f"{','.join(read.pipelines)}/{read.cid}/{key}",
            f"{read.who}: receiver {read.cid} {what}; this tick goes on without it",
        )

    async def run(self, stop: asyncio.Event, max_ticks: int | None = None) -> None:
        """Tick every interval until ``stop`` is set (or ``max_ticks`` ran); the tick in flight finishes."""
        interval = self.interval_s
        next_s = self.clock.monotonic()
        while not stop.is_set() and (max_ticks is None or self.ticks < max_ticks):
            if not await self._wait(stop, next_s):
                break
            await self.tick()
            next_s += interval
            now = self.clock.monotonic()
            if now > next_s:
                # Behind (a slow tick): skip the missed ticks instead of bursting to catch up. The next
                # tick's interval_s is measured, so no energy is lost, only resolution.
                missed = int((now - next_s) // interval) + 1
                next_s += missed * interval

    async def _wait(self, stop: asyncio.Event, deadline_s: float) -> bool:
        """Sleep until the deadline on the clock; False if told to stop first."""
        if self.clock.monotonic() >= deadline_s:
            return not stop.is_set()
        sleeper = asyncio.ensure_future(self.clock.sleep_until(deadline_s))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
        return not stop.is_set()


def _fields(component: object, name: str) -> frozenset[str]:
    return frozenset(getattr(component, name, ()))


def _phases(reads: Sequence[_Read], provided: set[str]) -> tuple[list[_Read], list[tuple[_Read, frozenset[str]]]]:
    """The reads of a tick's first phase, and those after it, each with the fields of its ``after_records``
    that a receiver of the first provides (``provided`` gathers them, kept by the group: a receiver that left a
    field out of its ``provides`` for a tick does not turn its dependents back to ``collect()``; that field
    is unknown then). Worked out each tick: a receiver's ``after_records`` may follow what the graph asked
    of it (procfs's ``cpu_time: auto``)."""
    first: list[_Read] = []
    waiting: list[tuple[_Read, frozenset[str]]] = []
    for read in reads:
        wanted = _fields(read.receiver, "after_records")
        if wanted and hasattr(read.receiver, "collect_after"):
            waiting.append((read, wanted))
        else:
            first.append(read)
    if not waiting:
        return first, []
    provided.update(f for read in first for f in _fields(read.receiver, "provides"))
    after = [(read, wanted & provided) for read, wanted in waiting if wanted & provided]
    first += [read for read, wanted in waiting if not wanted & provided]
    return first, after


def _reads(runners: Sequence[PipelineRunner]) -> tuple[_Read, ...]:
    """Each distinct receiver of the runners once, with the pipelines that list it. Its timeout is the
    longest any of them gives it: the group's tick waits for its slowest read anyway, and a shorter one
    would cost a pipeline data its own setting waits for."""
    users: dict[str, list[BuiltPipeline]] = {}
    found: dict[str, Receiver] = {}
    for runner in runners:
        for cid, receiver in runner.pipeline.receivers:
            users.setdefault(cid, []).append(runner.pipeline)
            found[cid] = receiver
    return tuple(
        _Read(
            cid=cid,
            receiver=found[cid],
            timeout_s=max(p.config.effective_receiver_timeout for p in pipes),
            pipelines=tuple(p.name for p in pipes),
        )
        for cid, pipes in users.items()
    )


class Service:
    """All pipelines of a graph, started and stopped in the right order; pipelines that share a receiver
    tick together as one :class:`PipelineGroup`."""

    def __init__(self, graph: Graph, before_tick: Callable[[], None] | None = None) -> None:
        self.graph = graph
        self.runners = [PipelineRunner(graph, p, before_tick) for p in graph.pipelines]
        by_name = {r.pipeline.name: r for r in self.runners}
        self.groups = [
            PipelineGroup(graph, [by_name[p.name] for p in group], before_tick) for group in graph.tick_groups()
        ]
        self.stop_event = asyncio.Event()
        self._started: list[tuple[str, object]] = []
        self.state_saved = True
        """False where the shutdown's checkpoint could not be written (logged): what was measured since the last
        checkpoint written is lost to the next start."""

    def _processors(self) -> list[tuple[str, object]]:
        return [(f"{p.name}/{cid}", proc) for p in self.graph.pipelines for cid, proc in p.processors]

    async def start(self) -> None:
        """State first, then exporters (so the first tick has somewhere to go), processors, receivers."""
        self.graph.state.load()
        order: list[tuple[str, object]] = [
            *[(f"exporter {cid}", e) for cid, e in self.graph.exporters.items()],
            *[(f"processor {name}", p) for name, p in self._processors()],
            *[(f"receiver {cid}", r) for cid, r in self.graph.receivers.items()],
        ]
        keys = {id(component): key for key, component in self.graph.stateful()}
        for name, component in order:
            try:
                try:
                    await call_optional(component, "start")
                except Exception as exc:
                    if not await self._start_afresh(name, component, keys.get(id(component)), exc):
                        raise
            except Exception:
                # Unwind what did start, so a failed start never leaves half a pipeline running.
                await self.shutdown()
                raise
            self._started.append((name, component))
        settle_heap()

    async def _start_afresh(self, name: str, component: object, key: str | None, exc: Exception) -> bool:
        """A component that failed to start with a section in the state file, started again without it: True if
        it started then (its section, one edited by hand or written by another build in the same format, is set
        aside and said so: the file as it was is copied for a person to look at). False: it had no section, or
        it fails without it too (the section is kept: the state file is not why)."""
        state = self.graph.state
        saved = None if key is None else state.section(key)
        if key is None or saved is None:
            return False
        state.drop(key)
        try:
            await call_optional(component, "start")
        except Exception:
            state.put(key, saved)
            return False
        kept = state.keep_copy()
        log.error(
            "state file %s: %s cannot use its section %s (%s); it starts again without it%s",
            state.path,
            name,
            key,
            _describe(exc),
            f" (the file as it was is kept as {kept})" if kept is not None else "",
        )
        return True

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Receivers first, then processors (state), then exporters (flush): the reverse of start."""
        budget = timeout_s if timeout_s is not None else self.graph.config.service.shutdown_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        checkpointed = False
        started = [component for _, component in self._started]
        exporters = list(self.graph.exporters.values())
        for name, component in reversed(self._started):
            if name.startswith("exporter") and not checkpointed and self._started:
                # Receivers are stopped and processors done: nothing more will be measured, so the
                # last checkpoint is complete. Write it before exporters flush (which may be slow).
                self.state_saved = checkpoint(self.graph, started)
                checkpointed = True
            remaining = max(0.1, deadline - loop.time())
            try:
                await asyncio.wait_for(call_optional(component, "shutdown"), timeout=remaining)
            except TimeoutError:
                log.error("%s did not shut down within %.1fs; going on without it", name, remaining)
            except Exception as exc:
                log.error("%s failed to shut down: %s", name, _describe(exc))
        if not checkpointed and self._started:
            self.state_saved = checkpoint(self.graph, started)
        elif checkpointed and (flushed := [c for c in started if c in exporters and hasattr(c, "snapshot")]):
            # An exporter's state (the otlp exporter's last delta sent) moved on while it flushed: saved again,
            # beside the others' sections as the checkpoint before the flush took them (written whole again).
            self.state_saved = checkpoint(self.graph, flushed)
        self._started.clear()

    async def run(self, max_ticks: int | None = None) -> None:
        """Start, tick until stopped (or ``max_ticks`` per pipeline), then shut down cleanly."""
        await self.start()
        try:
            await asyncio.gather(*(g.run(self.stop_event, max_ticks) for g in self.groups))
        finally:
            await self.shutdown()

    def stop(self) -> None:
        self.stop_event.set()


YOUNG_GC_THRESHOLD = 10_000
"""Container allocations (net of frees) between two collections of the garbage collector's youngest
generation, after start-up (Python's default: 700)."""


def settle_heap() -> None:
    """Tune the garbage collector for ticks, once start-up is done.

    Keep what start-up made (modules, config, the catalog, component state) out of the collector's full
    passes: they would walk those ~80,000 long-lived objects for tens of milliseconds every few hundred
    ticks, to free nothing. Reference counting still frees them as usual.

    Collect the youngest generation every :data:`YOUNG_GC_THRESHOLD` allocations instead of every 700: a
    tick makes thousands of short-lived containers (three records per process, tuples, lists) that
    reference counting frees when the next tick replaces them. At 700 the collector walked them several
    times per tick and promoted the survivors into older generations to walk again, which was 4 % of the
    benchmark tick's instructions; they are freed all the same. The few reference cycles wattpipe makes are
    still collected, a little later. A higher threshold set before (``gc.set_threshold``) is kept."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), *older)
