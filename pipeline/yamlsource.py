"""YAML → plain Python values, remembering the line of every key and expanding ``${env:…}``.

PyYAML's safe loader forgets where things were and silently keeps the last of two duplicate keys.
Walking the composed node tree ourselves gives both: a ``{key path: line}`` map for error messages
(``demo.yaml:12 receivers.dcgm.endpont: …``) and a hard error on duplicates.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = ["EnvError", "KeyPath", "SourceError", "YamlSource", "expand_env", "load_yaml_text"]

KeyPath = tuple[str | int, ...]

# ${env:NAME} or ${env:NAME:-default}; "$$" is a literal "$".
_ENV_RE = re.compile(r"\$\$|\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-((?:[^}\\]|\\.)*))?\}")
_ANY_REF_RE = re.compile(r"\$\{([^}]*)\}")


class SourceError(Exception):
    """A problem with the file itself (syntax, duplicate keys, env references), with where it is."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


class EnvError(ValueError):
    pass


def expand_env(text: str, environ: Mapping[str, str]) -> str:
    """Expand ``${env:VAR}`` and ``${env:VAR:-default}``; a missing variable without default is an error."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default.replace("\\}", "}")
        raise EnvError(f"environment variable {name} is not set and has no default (write ${{env:{name}:-…}})")

    expanded = _ENV_RE.sub(sub, text)
    # Anything else that looks like a reference is a typo we should not pass on silently.
    for leftover in _ANY_REF_RE.finditer(_ENV_RE.sub("", text)):
        raise EnvError(
            f"'${{{leftover.group(1)}}}' is not a valid reference; use ${{env:NAME}} or ${{env:NAME:-default}}"
        )
    return expanded


@dataclass
class YamlSource:
    """A parsed YAML document with the line (1-based) of every key path."""

    name: str
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)
    env: dict[KeyPath, tuple[str, ...]] = field(default_factory=dict)
    """The environment variables each value's ``${env:…}`` references read, by key path."""

    def line_of(self, path: KeyPath) -> int | None:
        """The line of ``path``, or of its nearest ancestor that has one."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def where(self, path: KeyPath) -> str:
        line = self.line_of(path)
        return f"{self.name}:{line}" if line is not None else self.name


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_yaml_text(
    text: str, name: str, environ: Mapping[str, str] | None = None, *, expand: bool = True
) -> YamlSource:
    """``text`` parsed, with the line of every key; ``${env:…}`` expanded unless ``expand`` is false
    (a scenario file takes its values as written)."""
    env = (os.environ if environ is None else environ) if expand else None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or str(exc)
        # Where the parser noticed is often a line after the mistake: "could not find expected ':'" on the line
        # after a key without its colon, an unclosed "{" at the next key. Its context names the line it began at.
        context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and context_mark is not None:
            problem = f"{problem} ({context} at line {context_mark.line + 1})"
        raise SourceError([f"{where}: not valid YAML: {problem}"]) from None
    source = YamlSource(name=name, data=None)
    errors: list[str] = []
    source.data = {} if node is None else _convert(node, (), source, env, errors)
    if errors:
        raise SourceError(errors)
    return source


def _convert(
    node: yaml.Node, path: KeyPath, source: YamlSource, env: Mapping[str, str] | None, errors: list[str]
) -> Any:
    source.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.SafeLoader(" ").construct_object(key_node)  # scalars only: anchors are not needed
            if isinstance(key, dict | list):
                errors.append(
                    f"{source.name}:{key_node.start_mark.line + 1} {format_path(path)}: a key must be a scalar"
                )
                continue
            key = str(key) if not isinstance(key, str) else key
            if key in out:
                errors.append(
                    f"{source.name}:{key_node.start_mark.line + 1} {format_path((*path, key))}: duplicate key "
                    f"(first at line {source.lines[(*path, key)]})"
                )
                continue
            source.lines[(*path, key)] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, (*path, key), source, env, errors)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), source, env, errors) for i, item in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    raw = node.value
    if env is not None and isinstance(raw, str) and "$" in raw and node.tag == "tag:yaml.org,2002:str":
        names = tuple(m.group(1) for m in _ENV_RE.finditer(raw) if m.group(1))
        if names:
            source.env[path] = names
        try:
            expanded = expand_env(raw, env)
        except EnvError as exc:
            errors.append(f"{source.name}:{node.start_mark.line + 1} {format_path(path)}: {exc}")
            return None
        # An unquoted value that is one whole reference takes the type its text has (a port stays an
        # int), as in the OpenTelemetry Collector; a quoted one or a larger string stays a string.
        if node.style is None and expanded and _ENV_RE.fullmatch(raw.strip()) and raw.strip() != "$$":
            try:
                typed = yaml.safe_load(expanded)
            except yaml.YAMLError:
                return expanded
            return typed if isinstance(typed, str | int | float | bool) or typed is None else expanded
        return expanded
    return yaml.SafeLoader(" ").construct_object(node)
