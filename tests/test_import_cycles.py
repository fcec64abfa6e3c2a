"""No import cycles inside pipeline/, exporters/ or wattpipe/ (issue 16).

Every ``import`` statement counts, wherever it is: at the top, under ``if TYPE_CHECKING:`` or inside a
function. A cycle through a deferred import still ties the modules together (neither can be understood,
moved or tested without the other); it only hides the tie from Python until the wrong module is imported
first.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("pipeline", "exporters", "wattpipe")


def module_names(folder: Path, package: str) -> dict[str, Path]:
    """Every module under ``folder`` by its dotted name (a package by its ``__init__``)."""
    names: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names every import statement in ``tree`` names (``from a import b``: ``a.b`` and ``a``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up ``level - 1`` more
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of the same folder it imports."""
    modules = module_names(folder, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = imported(tree, name, path.name == "__init__.py")
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(f"{t}.")}
    return graph


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_import_cycles_inside_the_folder(folder: str) -> None:
    package = "wattpipe" if folder == "wattpipe" else f"wattpipe.{folder}"  # the names modules import it by
    graph = import_graph(ROOT / folder, package)
    assert len(graph) > 2, f"{folder}: too few modules found; is the walk looking in the right place?"
    assert any(graph.values()), f"{folder}: no imports between its modules seen; are the names right?"
    assert cycles(graph) == []


def test_a_cycle_is_found_in_a_synthetic_graph() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a", "p.d"}, "p.d": set(), "p.e": {"p.d"}}
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert cycles({**graph, "p.c": {"p.d"}}) == []


def test_a_deliberate_cycle_through_a_type_checking_or_deferred_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("from pkg.components import Registry\nclass ConfigError(Exception): ...\n")
    (package / "components.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import telemetry\nclass Registry: ...\n"
    )
    (package / "telemetry.py").write_text("def f() -> None:\n    from .config import ConfigError\n")
    (package / "clock.py").write_text("from . import config\n")  # imports into the cycle, not part of it
    graph = import_graph(package, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.clock": {"pkg.config"},
        "pkg.components": {"pkg.telemetry"},
        "pkg.config": {"pkg.components"},
        "pkg.telemetry": {"pkg.config"},
    }
    assert cycles(graph) == [["pkg.components", "pkg.config", "pkg.telemetry"]]
    (package / "telemetry.py").write_text("def f() -> None:\n    from pkg.errors import ConfigError\n")
    assert cycles(import_graph(package, "pkg")) == []
