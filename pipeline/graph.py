"""Configuration → built (not started) components wired into pipelines.

Receivers and exporters are built once per ID and shared by the pipelines that list them; processors
are built once per pipeline, since many keep per-pipeline state. Pipelines that share a receiver form
one tick group (:meth:`Graph.tick_groups`): the runtime reads the receiver once per tick for all of them.
Building does no I/O, so ``wattpipe validate`` builds everything and starts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wattpipe.pipeline.clock import Clock
from wattpipe.pipeline.components import (
    ComponentKind,
    CreateContext,
    Exporter,
    Processor,
    Receiver,
    Registry,
)
from wattpipe.pipeline.config import Config, ConfigError, PipelineConfig, parse_component_id
from wattpipe.pipeline.state import StateStore
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.pipeline.yamlsource import format_path

__all__ = ["BuiltPipeline", "Graph", "build", "check_order", "order_problems"]


@dataclass(frozen=True)
class BuiltPipeline:
    name: str
    config: PipelineConfig
    receivers: tuple[tuple[str, Receiver], ...]
    processors: tuple[tuple[str, Processor], ...]
    exporters: tuple[tuple[str, Exporter], ...]


@dataclass(frozen=True)
class Graph:
    config: Config
    telemetry: Telemetry
    receivers: dict[str, Receiver]
    exporters: dict[str, Exporter]
    pipelines: tuple[BuiltPipeline, ...]
    state: StateStore

    def stateful(self) -> list[tuple[str, object]]:
        """(state key, component) for every component, receivers and exporters once, processors per pipeline."""
        out: list[tuple[str, object]] = [*self.receivers.items(), *self.exporters.items()]
        out += [(f"{p.name}/{cid}", proc) for p in self.pipelines for cid, proc in p.processors]
        return out

    def tick_groups(self) -> list[tuple[BuiltPipeline, ...]]:
        """The pipelines, grouped so that any two sharing a receiver (directly or through a third) tick
        together, in config order; a pipeline that shares nothing is a group of its own.

        A receiver reports what happened since its previous read, so two pipelines reading one instance
        on their own would split its data; a group reads it once and gives every member the records.
        The configuration guarantees one interval per group (checked when it is loaded)."""
        groups: list[list[BuiltPipeline]] = []
        for p in self.pipelines:
            mine = {cid for cid, _ in p.receivers}
            joined = [g for g in groups if any(mine & {cid for cid, _ in q.receivers} for q in g)]
            groups = [g for g in groups if all(g is not j for j in joined)]
            groups.append([q for g in joined for q in g] + [p])
        order = {p.name: i for i, p in enumerate(self.pipelines)}
        ordered = [tuple(sorted(g, key=lambda q: order[q.name])) for g in groups]
        return sorted(ordered, key=lambda g: order[g[0].name])


def _fields(obj: object, attr: str) -> frozenset[str]:
    value: frozenset[str] = frozenset(getattr(obj, attr, ()))
    return value


def check_order(
    pipeline: str,
    receivers: list[tuple[str, object]],
    processors: list[tuple[str, object]],
    registry: Registry,
) -> list[str]:
    """Problems with the processors' order: each names the processor to add or move."""
    return [
        f"service.pipelines.{pipeline}.processors[{i}]: {problem}"
        for i, problem in order_problems(receivers, processors, registry)
    ]


def order_problems(
    receivers: list[tuple[str, object]], processors: list[tuple[str, object]], registry: Registry
) -> list[tuple[int, str]]:
    """Problems with the processors' order, each with the index of the processor it is about."""
    problems: list[tuple[int, str]] = []
    available: set[str] = set()
    for _, receiver in receivers:
        available |= _fields(receiver, "provides")
    for i, (pid, processor) in enumerate(processors):
        for need in sorted(_fields(processor, "needs") - available):
            later = [lid for lid, lp in processors[i + 1 :] if need in _fields(lp, "provides")]
            if later:
                problems.append(
                    (
                        i,
                        f"processor '{pid}' needs '{need}', which '{later[0]}' provides later: move '{later[0]}' "
                        f"before '{pid}'",
                    )
                )
                continue
            makers = [f"{f.kind} '{f.type}'" for f in registry.providers_of(need)]
            advice = f"add a {' or '.join(makers)} before it" if makers else "no installed component provides it"
            problems.append((i, f"processor '{pid}' needs '{need}', which nothing before it provides: {advice}"))
        available |= _fields(processor, "provides")
    return problems


def build(config: Config, registry: Registry, clock: Clock, telemetry: Telemetry | None = None) -> Graph:
    """Build every component and check every pipeline; raise ConfigError listing all problems."""
    telemetry = telemetry or Telemetry(clock)
    sconf = config.service.state
    state = StateStore(
        Path(sconf.path) if sconf.path else None, clock, config.service.node_name, sconf.checkpoint_interval
    )
    builder = _Builder(config, registry, clock, telemetry, state)
    receivers = builder.receivers()
    exporters = builder.exporters()
    pipelines = [
        builder.pipeline(pname, pconf, receivers, exporters) for pname, pconf in config.service.pipelines.items()
    ]
    if builder.errors:
        raise ConfigError(builder.errors)
    _ask_receivers(receivers, pipelines)
    for p in pipelines:
        telemetry.register_pipeline(p.name, p.config.interval)
    return Graph(
        config=config,
        telemetry=telemetry,
        receivers=receivers,
        exporters=exporters,
        pipelines=tuple(pipelines),
        state=state,
    )


def _ask_receivers(receivers: Mapping[str, Receiver], pipelines: list[BuiltPipeline]) -> None:
    """Tell each receiver (that listens: ``asked``) what the processors downstream of it want read."""
    for cid, receiver in receivers.items():
        asked = getattr(receiver, "asked", None)
        if asked is None:
            continue
        wants: set[str] = set()
        for p in pipelines:
            if any(rid == cid for rid, _ in p.receivers):
                for _, processor in p.processors:
                    wants |= _fields(processor, "wants")
        asked(frozenset(wants))


class _Builder:
    """Creates components for :func:`build`, collecting every problem (in config order) in ``errors``."""

    def __init__(
        self, config: Config, registry: Registry, clock: Clock, telemetry: Telemetry, state: StateStore
    ) -> None:
        self.config, self.registry, self.clock, self.telemetry, self.state = config, registry, clock, telemetry, state
        self.errors: list[str] = []

    def create(self, kind: ComponentKind, cid: str, pipeline: str | None) -> object | None:
        config = self.config
        factory = self.registry.get(kind, parse_component_id(cid).type)
        assert factory is not None  # load_config resolved every type
        logger = logging.getLogger(f"wattpipe.{kind}.{cid}")
        ctx = CreateContext(
            component_id=cid,
            kind=kind,
            clock=self.clock,
            node_name=config.service.node_name,
            logger=logger,
            telemetry=self.telemetry.for_component(kind, cid, logger),
            state=self.state,
            pipeline=pipeline,
        )
        try:
            return factory.create(ctx, config.components(kind)[cid])
        except ConfigError as exc:
            self.errors.extend(f"{config.where((f'{kind}s', cid))} {kind}s.{cid}: {m}" for m in exc.messages)
        except Exception as exc:  # a plugin's constructor may raise anything; report it against its ID
            self.errors.append(f"{config.where((f'{kind}s', cid))} {kind}s.{cid}: cannot be built: {exc}")
        return None

    def receivers(self) -> dict[str, Receiver]:
        receivers: dict[str, Receiver] = {}
        for cid in self.config.receivers:
            built = self.create("receiver", cid, None)
            if built is not None:
                if isinstance(built, Receiver):
                    receivers[cid] = built
                else:
                    self.errors.append(
                        f"{self.config.where(('receivers', cid))} receivers.{cid}: is not a receiver (it has no async collect())"
                    )
        return receivers

    def exporters(self) -> dict[str, Exporter]:
        exporters: dict[str, Exporter] = {}
        for cid in self.config.exporters:
            built = self.create("exporter", cid, None)
            if built is not None:
                if isinstance(built, Exporter):
                    exporters[cid] = built
                else:
                    self.errors.append(
                        f"{self.config.where(('exporters', cid))} exporters.{cid}: is not an exporter (it has no async export())"
                    )
        return exporters

    def pipeline(
        self, pname: str, pconf: PipelineConfig, receivers: dict[str, Receiver], exporters: dict[str, Exporter]
    ) -> BuiltPipeline:
        """One pipeline: its processors built, and their order checked where every component was built."""
        procs: list[tuple[str, Processor]] = []
        for cid in pconf.processors:
            built = self.create("processor", cid, pname)
            if built is None:
                continue
            if not isinstance(built, Processor):
                self.errors.append(
                    f"{self.config.where(('processors', cid))} processors.{cid}: is not a processor (it needs process(batch), needs and provides)"
                )
                continue
            procs.append((cid, built))
        recv = [(cid, receivers[cid]) for cid in pconf.receivers if cid in receivers]
        if len(procs) == len(pconf.processors) and len(recv) == len(pconf.receivers):
            for i, problem in order_problems(list(recv), list(procs), self.registry):
                path = ("service", "pipelines", pname, "processors", i)
                self.errors.append(f"{self.config.where(path)} {format_path(path)}: {problem}")
        return BuiltPipeline(
            name=pname,
            config=pconf,
            receivers=tuple(recv),
            processors=tuple(procs),
            exporters=tuple((cid, exporters[cid]) for cid in pconf.exporters if cid in exporters),
        )
