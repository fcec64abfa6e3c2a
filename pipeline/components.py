"""The component contract: three small protocols, a factory per type, and the registry.

A receiver turns I/O into records (``async collect()``), a processor turns a Batch into a Batch
(``process(batch)``), an exporter sends a finished Batch somewhere (``async export(batch)``). Any of
them may have ``async start()`` and ``async shutdown()``. That is the whole contract.

Built-in components register exactly as third-party ones do: an entry point in the group
``wattpipe.components`` naming a :class:`Factory` (or a list of them). The engine never imports a
component module by name.
"""

from __future__ import annotations

import builtins
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Clock
from wattpipe.pipeline.records import Record

if TYPE_CHECKING:
    from wattpipe.pipeline.state import StateStore
    from wattpipe.pipeline.telemetry import ComponentTelemetry

__all__ = [
    "ENTRY_POINT_GROUP",
    "Component",
    "ComponentClass",
    "ComponentConfig",
    "ComponentKind",
    "CreateContext",
    "Exporter",
    "Factory",
    "Processor",
    "Receiver",
    "Registry",
    "RegistryError",
    "Stability",
    "call_optional",
]

ENTRY_POINT_GROUP = "wattpipe.components"

ComponentKind = Literal["receiver", "processor", "exporter"]
Stability = Literal["development", "alpha", "beta", "stable"]


class ComponentConfig(BaseModel):
    """Base for every component's options: unknown keys are errors, defaults for everything sensible."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@runtime_checkable
class Receiver(Protocol):
    """Reads one source. ``provides``: the Batch fields its records fill.

    Optional: ``after_records``, Batch fields (``"gpu_processes"``) this receiver reads after, with
    ``async collect_after(records, unknown)``. Where another receiver of its tick group provides one of them,
    the runtime reads the others first and then calls ``collect_after`` instead of ``collect`` with every record
    they returned this tick (in their order) and ``unknown``: those of the fields whose receivers failed or timed
    out this tick (unknown, not empty: none of their records came). Where none provides any, ``collect()``.
    """

    provides: frozenset[str]

    async def collect(self) -> Sequence[Record]: ...


@runtime_checkable
class Processor(Protocol):
    """Pure logic over a Batch; ``needs`` must be filled by a receiver or an earlier processor.

    Optional: ``wants``, details its receivers read only on request (``process_cpu_time``: every process's
    CPU time every tick). The graph hands each receiver the union of the ``wants`` of the processors of the
    pipelines it feeds through its optional ``asked(wants)``, once, after building and before ``start``.
    """

    needs: frozenset[str]
    provides: frozenset[str]

    def process(self, batch: Batch) -> Batch: ...


@runtime_checkable
class Exporter(Protocol):
    async def export(self, batch: Batch) -> None: ...


Component = Receiver | Processor | Exporter


async def call_optional(component: object, method: str) -> None:
    """Call ``component.<method>()`` if it has one, awaiting it if it is a coroutine function."""
    fn = getattr(component, method, None)
    if fn is None:
        return
    result = fn()
    if inspect.isawaitable(result):
        await result


@dataclass(frozen=True, slots=True)
class CreateContext:
    """What a factory may use to build a component. Creating must not start anything (no I/O)."""

    component_id: str
    kind: ComponentKind
    clock: Clock
    node_name: str
    logger: logging.Logger
    telemetry: ComponentTelemetry
    state: StateStore
    """Durable state: read your section (``state.section(ctx.state_key)``) in ``start()``; return what to
    keep from an optional ``snapshot() -> dict`` method, which the service calls at every checkpoint."""
    pipeline: str | None = None  # set for processors, which are built once per pipeline

    @property
    def state_key(self) -> str:
        return f"{self.pipeline}/{self.component_id}" if self.pipeline else self.component_id


_C_contra = TypeVar("_C_contra", bound=ComponentConfig, contravariant=True)
_C = TypeVar("_C", bound=ComponentConfig)


class ComponentClass(Protocol[_C_contra]):
    """A component class that is its own constructor: ``cls(config, ctx)``."""

    def __call__(self, config: _C_contra, ctx: CreateContext, /) -> object: ...


@dataclass(frozen=True, slots=True)
class Factory:
    """How to make one component type: its options model and a constructor.

    ``provides`` is a hint for the order check's advice ("add an `idle` processor"); the check itself
    reads ``needs``/``provides`` from the built component, since they may depend on its options.
    """

    type: str
    kind: ComponentKind
    config_model: builtins.type[ComponentConfig]
    create: Callable[[CreateContext, ComponentConfig], object]
    description: str
    stability: Stability = "development"
    provides: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(
        cls,
        component: ComponentClass[_C],
        *,
        type: str,
        kind: ComponentKind,
        config_model: builtins.type[_C],
        description: str,
        stability: Stability = "development",
        provides: frozenset[str] = frozenset(),
    ) -> Factory:
        """The factory of a component class built as ``component(config, ctx)``. Use ``create=`` directly
        for anything else (the custom processor's import-path classes, for one)."""

        def create(ctx: CreateContext, config: ComponentConfig) -> object:
            if not isinstance(config, config_model):
                raise TypeError(
                    f"{kind} '{type}': expected {config_model.__name__}, got {builtins.type(config).__name__}"
                )
            return component(config, ctx)

        return cls(
            type=type,
            kind=kind,
            config_model=config_model,
            create=create,
            description=description,
            stability=stability,
            provides=provides,
        )

    def default_config(self) -> ComponentConfig:
        return self.config_model()


class RegistryError(Exception):
    pass


class Registry:
    """Factories by (kind, type). Build one per process (or per test); there is no global registry."""

    def __init__(self, factories: Iterable[Factory] = ()) -> None:
        self._factories: dict[tuple[ComponentKind, str], Factory] = {}
        self._origin: dict[tuple[ComponentKind, str], str] = {}
        self.load_errors: list[str] = []
        for f in factories:
            self.add(f)

    def add(self, factory: Factory, origin: str = "code") -> None:
        key = (factory.kind, factory.type)
        if key in self._factories:
            raise RegistryError(
                f"{factory.kind} type '{factory.type}' is registered twice: by {self._origin[key]} and {origin}"
            )
        self._factories[key] = factory
        self._origin[key] = origin

    @classmethod
    def from_entry_points(cls, group: str = ENTRY_POINT_GROUP) -> Registry:
        """Every factory installed under ``group``. A broken plugin is reported, not fatal to the rest."""
        registry = cls()
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            origin = f"entry point '{ep.name}' ({ep.value})"
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken third-party plugin must not take the others down
                registry.load_errors.append(f"{origin}: cannot be loaded: {exc}")
                continue
            factories = loaded if isinstance(loaded, list | tuple) else [loaded]
            for f in factories:
                if not isinstance(f, Factory):
                    registry.load_errors.append(f"{origin}: is not a wattpipe Factory (got {type(f).__name__})")
                    continue
                try:
                    registry.add(f, origin)
                except RegistryError as exc:
                    registry.load_errors.append(str(exc))
        return registry

    def get(self, kind: ComponentKind, type_name: str) -> Factory | None:
        return self._factories.get((kind, type_name))

    def types(self, kind: ComponentKind) -> list[str]:
        return sorted(t for (k, t) in self._factories if k == kind)

    def all(self) -> list[Factory]:
        return [self._factories[k] for k in sorted(self._factories)]

    def providers_of(self, field_name: str) -> list[Factory]:
        return [f for f in self.all() if field_name in f.provides]
