"""The configuration file: receivers, processors and exporters by ID, wired into pipelines.

The shape is the OpenTelemetry Collector's::

    receivers:  {<type>[/<name>]: {...}}
    processors: {...}
    exporters:  {...}
    service:
      pipelines:
        metrics[/<name>]: {interval: 5s, receivers: [...], processors: [...], exporters: [...]}
      telemetry: {listen: "127.0.0.1:8888", log_level: info}

Loading validates everything (each component's options through its factory's pydantic model) and
collects *every* problem with its file, line and key path before anything is built.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError, field_validator

from wattpipe.pipeline.components import ComponentConfig, ComponentKind, Registry
from wattpipe.pipeline.durations import format_duration, parse_duration  # re-exported, as before
from wattpipe.pipeline.errors import ConfigError, alternatives  # ConfigError: re-exported, as before
from wattpipe.pipeline.yamlsource import KeyPath, SourceError, YamlSource, format_path, load_yaml_text

__all__ = [
    "ComponentId",
    "Config",
    "ConfigError",
    "Duration",
    "PipelineConfig",
    "ServiceConfig",
    "StateConfig",
    "TelemetryConfig",
    "format_duration",
    "load_config",
    "load_config_text",
    "model_at",
    "parse_component_id",
    "parse_duration",
    "suggest",
    "unrelated",
]

KINDS: tuple[tuple[str, ComponentKind], ...] = (
    ("receivers", "receiver"),
    ("processors", "processor"),
    ("exporters", "exporter"),
)


# --- durations -------------------------------------------------------------------------------

Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)]
"""Seconds, written in config as ``500ms``, ``5s``, ``2m``; printed back the same way."""


# --- component IDs ---------------------------------------------------------------------------

_ID_RE = re.compile(r"^([a-z][a-z0-9_]*)(?:/([A-Za-z0-9][A-Za-z0-9_.\-]*))?$")


@dataclass(frozen=True, slots=True, order=True)
class ComponentId:
    type: str
    name: str = ""

    def __str__(self) -> str:
        return f"{self.type}/{self.name}" if self.name else self.type


def parse_component_id(text: str) -> ComponentId:
    match = _ID_RE.match(text)
    if not match:
        raise ValueError(
            f"'{text}' is not a component ID; write type or type/name (type: lowercase letters, digits, _; "
            "name: letters, digits, _ . -)"
        )
    return ComponentId(match.group(1), match.group(2) or "")


# --- the service section ---------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PipelineConfig(_Strict):
    interval: Duration = 5.0
    receivers: list[str] = Field(min_length=1)
    processors: list[str] = Field(default_factory=list)
    exporters: list[str] = Field(min_length=1)
    receiver_timeout: Duration | None = None
    """How long a receiver may take per tick; default: half the interval."""

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("the interval must be longer than 0s")
        return value

    @property
    def effective_receiver_timeout(self) -> float:
        return self.receiver_timeout if self.receiver_timeout is not None else self.interval / 2


class TelemetryConfig(_Strict):
    listen: str = "127.0.0.1:8888"
    """host:port for wattpipe's own /metrics, /healthz and /readyz; empty to turn it off."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    web_config_file: str = ""
    """TLS and basic auth for ``listen``, in the Prometheus exporter-toolkit web config format; empty: plain HTTP."""


class StateConfig(_Strict):
    path: str = ""
    """The state file (idle baselines, energy totals); empty: kept in memory only, lost on restart."""
    checkpoint_interval: Duration = 30.0
    """How often the state file is rewritten; a crash loses at most this much. Always written at shutdown."""


class ServiceConfig(_Strict):
    pipelines: dict[str, PipelineConfig] = Field(min_length=1)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    node_name: str = ""
    """The node's name on every record; default: $NODE_NAME, else the host name."""
    state: StateConfig = Field(default_factory=StateConfig)
    shutdown_timeout: Duration = 10.0
    """How long SIGTERM may take in all: the tick in flight, flushing exporters, saving state."""

    @field_validator("pipelines")
    @classmethod
    def _pipeline_names(cls, value: dict[str, PipelineConfig]) -> dict[str, PipelineConfig]:
        for name in value:
            if not re.fullmatch(r"metrics(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?", name):
                raise ValueError(
                    f"pipeline '{name}': wattpipe has metrics pipelines only: name it metrics or metrics/<name>"
                )
        return value


class _Sections(_Strict):
    receivers: dict[str, Any] = Field(default_factory=dict)
    processors: dict[str, Any] = Field(default_factory=dict)
    exporters: dict[str, Any] = Field(default_factory=dict)


class _TopLevel(_Sections):
    service: ServiceConfig


@dataclass(frozen=True)
class Config:
    """A validated configuration: every component's options parsed, every reference resolved."""

    source_name: str
    receivers: dict[str, ComponentConfig]
    processors: dict[str, ComponentConfig]
    exporters: dict[str, ComponentConfig]
    service: ServiceConfig
    lines: Mapping[KeyPath, int] = dataclass_field(default_factory=dict)
    """The file's line of each key path (``("service", "pipelines", "metrics")``), for messages."""
    env: Mapping[KeyPath, tuple[str, ...]] = dataclass_field(default_factory=dict)
    """The environment variables a value was read from (``${env:…}``), by key path: what to tell a user to set."""

    def where(self, path: KeyPath) -> str:
        """``demo.yaml:12``: the file and the line of ``path`` (or of its nearest ancestor that has one)."""
        while path and path not in self.lines:
            path = path[:-1]
        line = self.lines.get(path)
        return f"{self.source_name}:{line}" if line is not None else self.source_name

    def components(self, kind: ComponentKind) -> dict[str, ComponentConfig]:
        return {"receiver": self.receivers, "processor": self.processors, "exporter": self.exporters}[kind]

    def effective(self) -> dict[str, Any]:
        """The configuration as it runs: defaults filled in, env expanded, durations as text."""

        def dump(items: Mapping[str, ComponentConfig]) -> dict[str, Any]:
            return {cid: cfg.model_dump(mode="json", by_alias=True) for cid, cfg in items.items()}

        return {
            "receivers": dump(self.receivers),
            "processors": dump(self.processors),
            "exporters": dump(self.exporters),
            "service": self.service.model_dump(mode="json"),
        }


def default_node_name(environ: Mapping[str, str]) -> str:
    return environ.get("NODE_NAME") or socket.gethostname()


# --- loading ---------------------------------------------------------------------------------


def load_config(path: str | Path, registry: Registry, environ: Mapping[str, str] | None = None) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read the configuration: {exc.strerror or exc}"]) from None
    return load_config_text(text, p.name, registry, environ)


def load_config_text(text: str, name: str, registry: Registry, environ: Mapping[str, str] | None = None) -> Config:
    try:
        source = load_yaml_text(text, name, environ)
    except SourceError as exc:
        raise ConfigError(exc.messages) from None
    return _validate(source, registry, environ)


def suggest(word: str, options: list[str]) -> str:
    """``; did you mean 'x'?`` when one of ``options`` is close to ``word``; else empty."""
    return _suggest(word, options)


def unrelated(keys: Iterable[object], names: list[str]) -> bool:
    """No key is one of ``names`` nor close to one: another file given by mistake (``-c /etc/passwd``)."""
    return not any(k in names or _suggest(str(k), names) for k in keys)


def model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    """The nested model a pydantic error location points into (None where a union or a value is)."""
    return _model_at(model, loc)


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _pydantic_messages(exc: ValidationError, source: YamlSource, prefix: KeyPath, model: type[BaseModel]) -> list[str]:
    messages = []
    for err in exc.errors():
        loc: KeyPath = tuple(err["loc"])
        path = (*prefix, *loc)
        where = f"{source.where(path)} {format_path(path)}"
        if err["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            options = sorted(_field_names(parent)) if parent is not None else []
            hint = _suggest(str(loc[-1]), options)
            if not hint and options:
                hint = f"; options here: {', '.join(options)}"
            messages.append(f"{where}: unknown option{hint}")
        elif err["type"] == "missing":
            messages.append(f"{where}: required option is missing")
        elif err["type"] == "too_short":
            messages.append(f"{where}: needs at least one entry")
        else:
            got = err.get("input")
            msg = str(err["msg"]).removeprefix("Value error, ")
            plain = isinstance(got, dict | list) or got is None or repr(got) in msg or f"'{got}'" in msg
            shown = "" if plain else f" (got {got!r})"
            names = source.env.get(path, ())  # a value from ${env:…}: the variable to look at, not only the line
            plural = "s" if len(names) > 1 else ""
            read = f" (that line reads the environment variable{plural} {', '.join(names)})" if names else ""
            messages.append(f"{where}: {msg}{shown}{read}")
    return messages


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    """The nested model a location points into, for 'did you mean' suggestions."""
    current: type[BaseModel] = model
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        origin = getattr(annotation, "__origin__", None)
        if origin in (dict, list) and parts:
            parts.pop(0)  # the dict key or list index
            annotation = getattr(annotation, "__args__", (None,))[-1]
        nested = _model_in(annotation)
        if nested is None:
            return None
        current = nested
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():  # Optional[Model]
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _shared_receiver_intervals(pipelines: Mapping[str, PipelineConfig], source: YamlSource) -> list[str]:
    """Pipelines that share a receiver must share an interval.

    Receivers report what happened since their previous read (NVML's per-process utilisation, counter
    deltas), so one instance read by two pipelines would split its data between them. The runtime
    therefore reads a shared receiver once per tick for every pipeline that lists it, which needs one
    tick, hence one interval, for all of them.
    """
    problems: list[str] = []
    items = list(pipelines.items())
    for i, (name, pipe) in enumerate(items):
        for other, earlier in items[:i]:
            shared = [cid for cid in earlier.receivers if cid in pipe.receivers]
            if not shared or earlier.interval == pipe.interval:
                continue
            path: KeyPath = ("service", "pipelines", name, "interval")
            noun = "receivers" if len(shared) > 1 else "receiver"
            names = ", ".join(f"'{cid}'" for cid in sorted(shared))
            problems.append(
                f"{source.where(path)} {format_path(path)}: pipelines '{other}' (interval "
                f"{format_duration(earlier.interval)}) and '{name}' (interval {format_duration(pipe.interval)}) "
                f"share {noun} {names}: a shared receiver is read once per tick for every pipeline that lists it, "
                "so give them the same interval (or give one of them another receiver of the same type)"
            )
    return problems


def _validate(source: YamlSource, registry: Registry, environ: Mapping[str, str] | None) -> Config:
    """Every problem at once: a missing or broken ``service:`` does not hide the components' problems."""
    sections, service, errors = _top_level(source)
    built, component_errors = _component_configs(sections, source, registry)
    errors += component_errors
    if service is not None:
        top = _TopLevel.model_construct(**dict(sections), service=service)
        errors += _pipeline_references(top, source)
        errors += _unused_components(top, source)
        errors += _shared_receiver_intervals(service.pipelines, source)
    if errors or service is None:
        raise ConfigError(errors)
    if not service.node_name:
        service = service.model_copy(
            update={"node_name": default_node_name(environ if environ is not None else os.environ)}
        )
    return Config(
        source_name=source.name,
        receivers=built["receiver"],
        processors=built["processor"],
        exporters=built["exporter"],
        service=service,
        lines=dict(source.lines),
        env=dict(source.env),
    )


_SECTION_NAMES = ["receivers", "processors", "exporters", "service"]


def _top_level(source: YamlSource) -> tuple[_Sections, ServiceConfig | None, list[str]]:
    """The component sections and the service section, each parsed on its own, and the problems with
    either (raises where the file's shape leaves nothing to check)."""
    errors: list[str] = []
    data = source.data
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{source.where(())}: the configuration must be a mapping with receivers, exporters and service"]
        )

    unknown_top = [k for k in data if k not in _SECTION_NAMES]
    if data and unrelated(data, _SECTION_NAMES):  # one line, none of its contents echoed
        raise ConfigError(
            [
                f"{source.name}: not a wattpipe configuration: none of its {len(data)} top-level keys is "
                f"{alternatives(_SECTION_NAMES)}, nor close to one"
            ]
        )
    for key in unknown_top:
        hint = _suggest(key, _SECTION_NAMES)
        errors.append(f"{source.where((key,))} {key}: unknown section{hint}")
    section_data = {k: data.get(k) or {} for k in ("receivers", "processors", "exporters")}
    for name, value in section_data.items():
        if not isinstance(value, dict):  # said here, and the other sections still checked
            errors.append(f"{source.where((name,))} {name}: must be a mapping of component IDs to their options")
            section_data[name] = {}
    try:
        sections = _Sections.model_validate(section_data)
    except ValidationError as exc:
        errors.extend(_pydantic_messages(exc, source, (), _Sections))
        raise ConfigError(errors) from None
    service: ServiceConfig | None = None
    if data.get("service") is None:
        errors.append(
            f"{source.name} service: required section is missing (it lists the pipelines: "
            "service: {pipelines: {metrics: {receivers: [...], exporters: [...]}}})"
        )
    else:
        try:
            service = ServiceConfig.model_validate(data["service"])
        except ValidationError as exc:
            errors.extend(_pydantic_messages(exc, source, ("service",), ServiceConfig))
            service = _pipelines_only(data["service"])  # its references still checked
    return sections, service, errors


def _pipelines_only(raw: object) -> ServiceConfig | None:
    """The pipelines' component lists of a ``service:`` that did not validate, if every list is one of names.

    Only the references are checked on it: every interval is the same placeholder, so none is compared."""
    pipes = raw.get("pipelines") if isinstance(raw, dict) else None
    if not isinstance(pipes, dict) or not all(isinstance(p, dict) for p in pipes.values()):
        return None
    lists: dict[str, PipelineConfig] = {}
    for name, pipe in pipes.items():
        parts = {s: pipe.get(s) or [] for s in ("receivers", "processors", "exporters")}
        if not all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in parts.values()):
            return None  # what a broken list meant is unknown: no reference guessed from it
        receivers, processors, exporters = parts.values()
        lists[str(name)] = PipelineConfig.model_construct(
            interval=0.0, receivers=receivers, processors=processors, exporters=exporters
        )
    return ServiceConfig.model_construct(pipelines=lists)


def _component_configs(
    top: _Sections, source: YamlSource, registry: Registry
) -> tuple[dict[ComponentKind, dict[str, ComponentConfig]], list[str]]:
    """Each defined component's options, validated by its factory's config model; and the problems."""
    errors: list[str] = []
    built: dict[ComponentKind, dict[str, ComponentConfig]] = {"receiver": {}, "processor": {}, "exporter": {}}
    for section, kind in KINDS:
        for cid_text, raw in getattr(top, section).items():
            path: KeyPath = (section, cid_text)
            where = f"{source.where(path)} {format_path(path)}"
            try:
                cid = parse_component_id(cid_text)
            except ValueError as exc:
                errors.append(f"{where}: {exc}")
                continue
            factory = registry.get(kind, cid.type)
            if factory is None:
                known = registry.types(kind)
                hint = _suggest(cid.type, known) or (f"; known {kind} types: {', '.join(known)}" if known else "")
                errors.append(f"{where}: unknown {kind} type '{cid.type}'{hint} (`wattpipe components` lists them)")
                continue
            options = {} if raw is None else raw
            if not isinstance(options, dict):
                errors.append(f"{where}: the options of {cid_text} must be a mapping (or empty)")
                continue
            try:
                built[kind][cid_text] = factory.config_model.model_validate(options)
            except ValidationError as exc:
                errors.extend(_pydantic_messages(exc, source, path, factory.config_model))
    return built, errors


def _pipeline_references(top: _TopLevel, source: YamlSource) -> list[str]:
    """The pipelines' references to components: each defined, none listed twice in one pipeline."""
    errors: list[str] = []
    for pname, pipe in top.service.pipelines.items():
        for section, kind in KINDS:
            ids: list[str] = getattr(pipe, section)
            defined = list(getattr(top, section))
            seen: set[str] = set()
            for i, ref in enumerate(ids):
                path = ("service", "pipelines", pname, section, i)
                where = f"{source.where(path)} {format_path(path)}"
                if ref in seen:
                    errors.append(f"{where}: '{ref}' is listed twice in this pipeline")
                seen.add(ref)
                if ref not in defined and isinstance(source.data.get(section) or {}, dict):  # else said already
                    hint = _suggest(ref, defined)
                    errors.append(f"{where}: {kind} '{ref}' is not defined under {section}:{hint}")
    return errors


def _unused_components(top: _TopLevel, source: YamlSource) -> list[str]:
    """A problem for each defined component that no pipeline lists."""
    used: dict[ComponentKind, set[str]] = {"receiver": set(), "processor": set(), "exporter": set()}
    for pipe in top.service.pipelines.values():
        for section, kind in KINDS:
            used[kind].update(getattr(pipe, section))
    errors: list[str] = []
    for section, kind in KINDS:
        for cid_text in getattr(top, section):
            if cid_text not in used[kind]:
                path = (section, cid_text)
                errors.append(
                    f"{source.where(path)} {format_path(path)}: defined but not used in any pipeline "
                    f"(add it to a pipeline's {section} or remove it)"
                )
    return errors
