"""Render the Helm chart without helm: Go text/template and the Sprig functions deploy/helm/wattpipe uses.

Supported: ``{{ }}`` with ``{{-``/``-}}`` trimming and ``{{/* */}}`` comments; ``if``/``else if``/``else``,
``with`` and ``range`` (lists, maps in sorted key order, ``$v :=`` and ``$k, $v :=``) with ``end``;
top-level ``define`` and ``include``; pipelines, parenthesised pipelines, ``$var :=``/``$var =`` with Go's
scoping, fields on ``.``, ``$`` and variables, string/number/bool/nil literals; and the functions in
``_FUNCS``. Anything else (another function or keyword, ``(x).Field``, ``.Capabilities``, a missing
``.Files`` file) raises ``TemplateError`` with the file and line, so a template that outgrows the renderer
fails its tests instead of rendering wrongly.

Output matches helm's for this chart, except that ``toYaml`` is PyYAML's (the same documents, sorted keys
like helm's, but its own quoting) and so are ``sha256sum`` values taken of it.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    """A construct the renderer does not support, or a template that fails as it would in helm."""


class _Struct(dict[str, Any]):
    """A Go struct (``.Release``, ``.Chart``, the root): unlike a map, an unknown field is an error."""


_SPACE = " \t\r\n"
_TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\\n]|\\.)*") | (?P<raw>`[^`]*`) | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<var>\$\w*(?:\.[A-Za-z_]\w*)*) | (?P<field>(?:\.[A-Za-z_]\w*)+|\.)
    | (?P<ident>[A-Za-z_]\w*) | (?P<punct>:=|=|\||\(|\)|,)""",
    re.X,
)
_NOTHING = object()  # no value piped into a command yet


@dataclass
class _Tok:
    kind: str
    text: str
    glued: bool  # no space before it


@dataclass
class _Action:
    toks: list[_Tok]
    where: str


@dataclass
class _Op:
    kind: str  # lit | func | field (on dot) | var | pipe (parenthesised)
    value: Any


@dataclass
class _Pipe:  # also the node of an action that prints its value (unless it declares a variable)
    cmds: list[list[_Op]]
    where: str = ""
    decl: list[str] = field(default_factory=list)
    assign: bool = False  # `$x = ...` rather than `$x := ...`


@dataclass
class _Var:
    name: str
    value: Any


@dataclass
class _Block:
    kind: str  # if | with | range
    pipe: _Pipe
    body: list[_Node]
    alt: list[_Node]  # the else branch; `else if` is an `if` block alone in it


_Node = str | _Pipe | _Block


def _lex(src: str, name: str) -> list[str | _Action]:
    items: list[str | _Action] = []
    pos, trim = 0, False
    while True:
        start = src.find("{{", pos)
        text = src[pos:] if start < 0 else src[pos:start]
        text = text.lstrip(_SPACE) if trim else text
        if start < 0:
            return [*items, text]
        i = start + 2
        if src[i : i + 1] == "-" and src[i + 1 : i + 2] in tuple(_SPACE):
            text, i = text.rstrip(_SPACE), i + 2
        where = f"{name}:{src.count(chr(10), 0, start) + 1}"
        comment = src.startswith("/*", i)
        if comment:
            i = src.find("*/", i) + 2
            if i == 1:
                raise TemplateError(f"{where}: unclosed comment")
        items.append(text)
        toks: list[_Tok] = []
        while True:
            j = i
            while j < len(src) and src[j] in _SPACE:
                j += 1
            if src.startswith("-}}", j) and j > i:
                pos, trim = j + 3, True
                break
            if src.startswith("}}", j):
                pos, trim = j + 2, False
                break
            m = _TOKEN.match(src, j)
            if comment or m is None:
                raise TemplateError(f"{where}: cannot read {src[j : j + 20]!r}")
            toks.append(_Tok(m.lastgroup or "", m.group(), j == i))
            i = m.end()
        if not comment:
            items.append(_Action(toks, where))


class _Parser:
    def __init__(self, items: list[str | _Action], defines: dict[str, list[_Node]]) -> None:
        self.items, self.i, self.defines = items, 0, defines
        self.stop: _Action | None = None  # the `else`/`end` that ended the last list

    def parse_list(self, top: bool) -> list[_Node]:
        nodes: list[_Node] = []
        while self.i < len(self.items):
            item = self.items[self.i]
            self.i += 1
            if isinstance(item, str):
                nodes += [item] if item else []
                continue
            word = item.toks[0].text if item.toks and item.toks[0].kind == "ident" else ""
            if word in ("end", "else") and not top:
                self.stop = item
                return nodes
            if word in ("if", "with", "range"):
                nodes.append(self.block(word, item))
            elif word == "define" and top and len(item.toks) == 2 and item.toks[1].kind == "str":
                name = ast.literal_eval(item.toks[1].text)
                if name in self.defines:
                    raise TemplateError(f"{item.where}: template {name!r} defined twice")
                self.defines[name] = self.parse_list(False)
                self.expect_end()
            elif word in ("end", "else", "define", "template", "block", "break", "continue"):
                raise TemplateError(f"{item.where}: unsupported or misplaced {{{{ {word} }}}}")
            else:
                nodes.append(_parse_pipe(item.toks, item.where))
        if not top:
            raise TemplateError("unexpected end of template: an {{ end }} is missing")
        return nodes

    def expect_end(self) -> None:
        assert self.stop is not None
        if [t.text for t in self.stop.toks] != ["end"]:
            raise TemplateError(f"{self.stop.where}: expected {{{{ end }}}}")

    def block(self, word: str, item: _Action) -> _Block:
        pipe = _parse_pipe(item.toks[1:], item.where, range_vars=word == "range")
        body, alt = self.parse_list(False), list[_Node]()
        assert self.stop is not None
        stop = self.stop
        if stop.toks[0].text == "else" and len(stop.toks) > 1:
            if stop.toks[1].text != "if" or word != "if":
                raise TemplateError(f"{stop.where}: only `else if` may follow else")
            alt = [self.block("if", _Action(stop.toks[1:], stop.where))]  # its {{ end }} ends the chain
        elif stop.toks[0].text == "else":
            alt = self.parse_list(False)
            self.expect_end()
        else:
            self.expect_end()
        return _Block(word, pipe, body, alt)


def _parse_pipe(toks: list[_Tok], where: str, range_vars: bool = False) -> _Pipe:
    texts = [t.text for t in toks[:4]]
    plain = [t.kind == "var" and "." not in t.text for t in toks[:3]]
    pipe = _Pipe([], where)
    if len(texts) > 2 and plain[0] and texts[1] in (":=", "="):
        pipe.decl, pipe.assign, toks = [texts[0]], texts[1] == "=", toks[2:]
    elif range_vars and len(texts) > 3 and plain[0] and texts[1] == "," and plain[2] and texts[3] == ":=":
        pipe.decl, toks = [texts[0], texts[2]], toks[4:]
    pipe.cmds, end = _parse_cmds(toks, 0, where)
    if end != len(toks):
        raise TemplateError(f"{where}: unexpected ')'")
    return pipe


def _parse_cmds(toks: list[_Tok], i: int, where: str) -> tuple[list[list[_Op]], int]:
    """Commands separated by `|`, up to the end or to an unmatched `)` (its index is returned)."""
    cmds: list[list[_Op]] = [[]]
    while i < len(toks) and toks[i].text != ")":
        tok = toks[i]
        if tok.text == "|" and cmds[-1]:
            cmds.append([])
        elif tok.text == "(":
            inner, i = _parse_cmds(toks, i + 1, where)
            if i == len(toks):
                raise TemplateError(f"{where}: unclosed '('")
            if i + 1 < len(toks) and toks[i + 1].glued and toks[i + 1].kind in ("field", "var"):
                raise TemplateError(f"{where}: unsupported field of a parenthesised pipeline")
            cmds[-1].append(_Op("pipe", inner))
        else:
            cmds[-1].append(_operand(tok, where))
        i += 1
    if not cmds[-1]:
        raise TemplateError(f"{where}: missing command")
    return cmds, i


def _operand(tok: _Tok, where: str) -> _Op:
    literals = {"true": True, "false": False, "nil": None}
    if tok.kind == "str":
        return _Op("lit", ast.literal_eval(tok.text))
    if tok.kind == "raw":
        return _Op("lit", tok.text[1:-1])
    if tok.kind == "num":
        return _Op("lit", float(tok.text) if "." in tok.text else int(tok.text))
    if tok.kind == "ident" and tok.text in literals:
        return _Op("lit", literals[tok.text])
    if tok.kind == "ident" and (tok.text in _FUNCS or tok.text == "include"):
        return _Op("func", tok.text)
    if tok.kind == "ident":
        raise TemplateError(f'{where}: function "{tok.text}" not supported by tests/deploy/gotemplate.py')
    if tok.kind == "field":
        return _Op("field", tok.text[1:].split(".") if tok.text != "." else [])
    if tok.kind == "var":
        name, *chain = tok.text.split(".")
        return _Op("var", (name, chain))
    raise TemplateError(f"{where}: unexpected {tok.text!r}")


class _Renderer:
    def __init__(self, defines: dict[str, list[_Node]]) -> None:
        self.defines = defines

    def run(self, nodes: list[_Node], dot: Any) -> str:
        out: list[str] = []
        self.walk(nodes, dot, [_Var("$", dot)], out)
        return "".join(out)

    def walk(self, nodes: list[_Node], dot: Any, scope: list[_Var], out: list[str]) -> None:
        for node in nodes:
            mark = len(scope)
            if isinstance(node, str):
                out.append(node)
            elif isinstance(node, _Pipe):
                value = self.pipe(node, dot, scope)
                out += [] if node.decl else [_go_str(value)]
            elif node.kind == "range":
                self.range(node, dot, scope, out)
            else:
                value = self.pipe(node.pipe, dot, scope)
                if _truth(value):
                    self.walk(node.body, value if node.kind == "with" else dot, scope, out)
                else:
                    self.walk(node.alt, dot, scope, out)
                del scope[mark:]

    def range(self, node: _Block, dot: Any, scope: list[_Var], out: list[str]) -> None:
        value = self.pipe(node.pipe, dot, scope, bind=False)
        if isinstance(value, dict):
            pairs = [(key, value[key]) for key in sorted(value)]
        elif isinstance(value, list):
            pairs = list(enumerate(value))
        elif value is None:
            pairs = []
        else:
            raise TemplateError(f"{node.pipe.where}: range can't iterate over {value!r}")
        for key, elem in pairs:
            mark = len(scope)
            if len(node.pipe.decl) == 1:  # `$v := list`: the element
                scope.append(_Var(node.pipe.decl[0], elem))
            elif node.pipe.decl:  # `$k, $v := list`: the index or key, and the element
                scope += [_Var(node.pipe.decl[0], key), _Var(node.pipe.decl[1], elem)]
            self.walk(node.body, elem, scope, out)
            del scope[mark:]
        if not pairs:
            self.walk(node.alt, dot, scope, out)

    def pipe(self, pipe: _Pipe, dot: Any, scope: list[_Var], bind: bool = True) -> Any:
        try:
            value = self.commands(pipe.cmds, dot, scope)
            if bind and pipe.decl and not pipe.assign:
                scope.append(_Var(pipe.decl[0], value))
            elif bind and pipe.decl:
                _lookup(scope, pipe.decl[0]).value = value
            return value
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, yaml.YAMLError) as exc:
            raise TemplateError(f"{pipe.where}: {exc}") from None

    def commands(self, cmds: list[list[_Op]], dot: Any, scope: list[_Var]) -> Any:
        value: Any = _NOTHING
        for cmd in cmds:
            value = self.command(cmd, dot, scope, value)
        return value

    def command(self, cmd: list[_Op], dot: Any, scope: list[_Var], piped: Any) -> Any:
        args = [self.operand(op, dot, scope) for op in cmd[1:]] + ([] if piped is _NOTHING else [piped])
        if cmd[0].kind == "func":
            return self.include(*args) if cmd[0].value == "include" else _FUNCS[cmd[0].value](*args)
        value = self.operand(cmd[0], dot, scope)
        if args and not callable(value):
            raise TemplateError(f"can't give arguments to the non-function {value!r}")
        return value(*args) if args else value

    def operand(self, op: _Op, dot: Any, scope: list[_Var]) -> Any:
        if op.kind == "lit":
            return op.value
        if op.kind == "func":  # a function named as an argument is called without arguments
            return self.command([op], dot, scope, _NOTHING)
        if op.kind == "pipe":
            return self.commands(op.value, dot, scope)
        if op.kind == "var":
            return _fields(_lookup(scope, op.value[0]).value, op.value[1])
        return _fields(dot, op.value)

    def include(self, name: str, data: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f"no template {name!r}")
        return self.run(self.defines[name], data)


def _lookup(scope: list[_Var], name: str) -> _Var:
    for var in reversed(scope):
        if var.name == name:
            return var
    raise TemplateError(f"undefined variable {name}")


def _fields(value: Any, names: list[str]) -> Any:
    for name in names:
        if isinstance(value, _Struct) and name not in value:
            raise TemplateError(f"can't evaluate field {name}")
        if value is None:
            raise TemplateError(f"nil pointer evaluating .{name}")
        if not isinstance(value, dict):
            raise TemplateError(f"can't evaluate field {name} in {type(value).__name__}")
        value = value.get(name)  # a map's missing key: helm prints it as ""
    return value


def _truth(value: Any) -> bool:
    return value is not None and value is not False and value != 0 and value not in ("", [], {})


def _go_str(value: Any) -> str:
    """fmt.Sprint, as helm prints a value (a missing one as ""); numbers are float64, as in helm's values."""
    if value is None or value is _NOTHING:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _go_float(float(value))
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + " ".join(_go_str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_str(value[k])}" for k in sorted(value)) + "]"
    raise TemplateError(f"cannot print {type(value).__name__}")


def _go_float(number: float) -> str:
    """Go's %v of a float64: the shortest digits, in exponent form from 1e+06 up or below 1e-04."""
    decimal = Decimal(repr(number)).normalize()
    sign, digits, exp = decimal.as_tuple()
    if not isinstance(exp, int):
        raise TemplateError(f"cannot print {number}")
    power = len(digits) + exp - 1
    if number == 0 or -4 <= power < 6:
        return format(decimal, "f")
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"


def _go_quote(text: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r"}
    escapes |= {"\t": "\\t", "\v": "\\v"}
    out = [escapes.get(c) or (c if c.isprintable() else f"\\u{ord(c):04x}") for c in text]
    return '"' + "".join(out) + '"'


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TemplateError(f"expected a string, got {value!r}")
    return value


def _eq(first: Any, *others: Any) -> bool:
    def kind(v: Any) -> str:
        return "bool" if isinstance(v, bool) else "number" if isinstance(v, int | float) else type(v).__name__

    for other in others:
        if kind(first) != kind(other) or kind(first) not in ("bool", "number", "str"):
            raise TemplateError(f"incompatible types for comparison: {first!r} and {other!r}")
    return any(first == other for other in others)


def _printf(fmt: str, *args: Any) -> str:
    """Go's Sprintf for the verbs %s (strings), %d (integers), %v, %q and %%."""
    pending = list(args)

    def verb(m: re.Match[str]) -> str:
        if m.group(1) == "%":
            return "%"
        if m.group(1) not in ("s", "d", "v", "q") or not pending:
            raise TemplateError(f"printf {fmt!r}: unsupported verb %{m.group(1)} or too few arguments")
        value = pending.pop(0)
        if m.group(1) == "d" and (isinstance(value, bool) or not isinstance(value, int)):
            raise TemplateError(f"printf %d of {value!r}")
        if m.group(1) == "q":
            return _go_quote(_str(value))
        return _str(value) if m.group(1) == "s" else _go_str(value)

    out = re.sub(r"%(.?)", verb, _str(fmt), flags=re.S)
    if pending:
        raise TemplateError(f"printf {fmt!r}: too many arguments")
    return out


def _from_yaml(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(_str(text)) or {}
    if not isinstance(doc, dict):
        raise TemplateError(f"fromYaml: not a mapping: {text[:40]!r}")
    return doc


def _to_yaml(value: Any) -> str:
    text = yaml.safe_dump(value, sort_keys=True, width=float("inf"), allow_unicode=True)
    return text.removesuffix("\n...\n").removesuffix("\n")


def _indent(spaces: int, text: str) -> str:
    return " " * spaces + _str(text).replace("\n", "\n" + " " * spaces)


def _trunc(length: int, text: str) -> str:
    """Sprig's trunc: the first ``length`` characters, or with a negative length the last ``-length``."""
    if length < 0:
        return _str(text)[max(len(text) + length, 0) :]
    return _str(text)[:length]


def _set(mapping: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    mapping[_str(key)] = value
    return mapping


def _unset(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    mapping.pop(_str(key), None)
    return mapping


_FUNCS: dict[str, Callable[..., Any]] = {
    "and": lambda *values: next((v for v in values if not _truth(v)), values[-1]),
    "append": lambda items, value: [*items, value],
    "contains": lambda sub, text: _str(sub) in _str(text),
    "default": lambda fallback, *given: given[0] if given and _truth(given[0]) else fallback,
    "dict": lambda *kv: {_go_str(kv[i]): (kv[i + 1] if i + 1 < len(kv) else "") for i in range(0, len(kv), 2)},
    "eq": _eq,
    "fromYaml": _from_yaml,
    "hasKey": lambda mapping, key: _str(key) in mapping,
    "list": lambda *items: list(items),
    "nindent": lambda spaces, text: "\n" + _indent(spaces, text),
    "not": lambda value: not _truth(value),
    "or": lambda *values: next((v for v in values if _truth(v)), values[-1]),
    "printf": _printf,
    "quote": lambda *values: " ".join(_go_quote(_go_str(v)) for v in values if v is not None),
    "replace": lambda old, new, text: _str(text).replace(_str(old), _str(new)),
    "set": _set,
    "sha256sum": lambda text: hashlib.sha256(_str(text).encode()).hexdigest(),
    "toYaml": _to_yaml,
    "trim": lambda text: _str(text).strip(),
    "trimSuffix": lambda suffix, text: _str(text).removesuffix(_str(suffix)),
    "trunc": _trunc,
    "unset": _unset,
    "without": lambda items, *omit: [v for v in items if v not in omit],
}


def merge_values(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` deep-merged into ``base`` as helm merges ``-f`` files: maps merge, a null removes a key."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render_string(text: str, dot: Any, name: str = "inline") -> str:
    """One template's output for data ``dot`` (its defines are available to its own ``include``)."""
    defines: dict[str, list[_Node]] = {}
    return _Renderer(defines).run(_Parser(_lex(text, name), defines).parse_list(True), dot)


_CHART_FIELDS = "APIVersion Name Home Sources Version Description Keywords Maintainers Icon AppVersion Deprecated"
_CHART_FIELDS += " Annotations KubeVersion Dependencies Type"


def render_chart(
    chart_dir: Path | str,
    values_overrides: dict[str, Any] | None = None,
    release_name: str = "wattpipe",
    namespace: str = "monitoring",
) -> dict[str, str]:
    """Each template's output (by its path under templates/, partials ``_*`` left out), as ``helm template``."""
    chart = Path(chart_dir)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    chart_struct = _Struct.fromkeys(_CHART_FIELDS.split(), "")  # a field Chart.yaml leaves out is ""
    for key, value in meta.items():
        go_name = "APIVersion" if key == "apiVersion" else key[0].upper() + key[1:]
        if go_name in chart_struct:  # helm ignores the keys its Metadata does not have
            chart_struct[go_name] = value
    release = _Struct(Name=release_name, Namespace=namespace, Service="Helm", IsInstall=True, IsUpgrade=False)
    release["Revision"] = 1

    def get(path: str) -> str:
        file = chart / path
        if not file.is_file() or path.startswith("templates/") or path in ("Chart.yaml", "values.yaml"):
            raise TemplateError(f".Files.Get {path!r}: no such file in the chart")
        return file.read_text()

    values = merge_values(yaml.safe_load((chart / "values.yaml").read_text()) or {}, values_overrides or {})
    defines: dict[str, list[_Node]] = {}
    parsed = {
        str(path.relative_to(chart / "templates")): _Parser(_lex(path.read_text(), path.name), defines).parse_list(True)
        for path in sorted((chart / "templates").rglob("*"))
        if path.is_file()
    }
    renderer = _Renderer(defines)
    out: dict[str, str] = {}
    for name, nodes in parsed.items():
        if not Path(name).name.startswith("_"):
            template = _Struct(Name=f"{meta['name']}/templates/{name}", BasePath=f"{meta['name']}/templates")
            root = _Struct(
                Values=values, Release=release, Chart=chart_struct, Files=_Struct(Get=get), Template=template
            )
            out[name] = renderer.run(nodes, root)
    return out
