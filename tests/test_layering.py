"""The import rule of docs/ARCHITECTURE.md, checked on every module (issue 16).

``pipeline/`` imports nothing above it; ``receivers/``, ``processors/``, ``exporters/`` and ``simulator/``
import ``pipeline/`` and themselves, never one another; ``wattpipe/`` (the composition root) may import
everything and nothing imports it. Every ``import`` counts, as in ``test_import_cycles.py``: at the top,
under ``if TYPE_CHECKING:`` or inside a function.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from tests.test_import_cycles import imported, module_names

ROOT = Path(__file__).resolve().parents[1]

LAYERS = ("pipeline", "receivers", "processors", "exporters", "simulator")

ALLOWED: Mapping[str, frozenset[str]] = {
    "pipeline": frozenset({"pipeline"}),
    "receivers": frozenset({"pipeline", "receivers"}),
    "processors": frozenset({"pipeline", "processors"}),
    "exporters": frozenset({"pipeline", "exporters"}),
    "simulator": frozenset({"pipeline", "simulator"}),
    "wattpipe": frozenset({*LAYERS, "wattpipe"}),
}
"""Layer → the layers its modules may import (third-party and standard-library imports are not checked)."""


def layer_of(dotted: str) -> str | None:
    """The layer a dotted name belongs to: ``wattpipe.receivers.nvml`` → ``receivers``, ``wattpipe.cli`` →
    ``wattpipe``; ``None`` for the bare package ``wattpipe`` and anything outside it. A layer's folder
    imported by its bare top-level name (``pipeline.records``) is ``"bare"``: that name only resolves in a
    checkout, and there it would load a second copy of the module beside ``wattpipe.pipeline.records``."""
    parts = dotted.split(".")
    if parts[0] in LAYERS:
        return "bare"
    if parts[0] != "wattpipe" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in LAYERS else "wattpipe"


def layer_modules(root: Path) -> dict[str, tuple[str, Path]]:
    """Every module of every layer by its installed dotted name, with its layer and file."""
    found: dict[str, tuple[str, Path]] = {}
    for layer in ALLOWED:
        package = "wattpipe" if layer == "wattpipe" else f"wattpipe.{layer}"
        found.update({name: (layer, path) for name, path in module_names(root / layer, package).items()})
    return found


def violations(root: Path, allowed: Mapping[str, frozenset[str]] = ALLOWED) -> list[str]:
    """``module -> imported`` for every import of a layer that ``allowed`` does not permit, sorted."""
    found: set[str] = set()
    for name, (layer, path) in layer_modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bad = set()
        for target in imported(tree, name, path.name == "__init__.py"):
            target_layer = layer_of(target)
            if target_layer is not None and target_layer not in allowed[layer]:
                bad.add(target)
        # ``from a.b import c`` names ``a.b`` and ``a.b.c``: report the statement's module, once.
        found.update(f"{name} -> {t}" for t in bad if not any(t.startswith(f"{u}.") for u in bad))
    return sorted(found)


def test_every_layer_imports_only_what_the_architecture_allows() -> None:
    modules = layer_modules(ROOT)
    for layer in ALLOWED:
        assert sum(1 for lay, _ in modules.values() if lay == layer) > 1, f"{layer}: no modules found; wrong place?"
    assert violations(ROOT) == []


def test_a_deliberately_wrong_import_is_found_wherever_it_hides(tmp_path: Path) -> None:
    files = {
        "pipeline/__init__.py": "",
        "pipeline/records.py": "import dataclasses\n",
        "receivers/__init__.py": "",
        "receivers/podresources.py": "from wattpipe.pipeline.records import Batch\ndef resolve() -> None: ...\n",
        "processors/__init__.py": "",
        "processors/k8s.py": "from wattpipe.pipeline import records\nfrom . import k8s_cache\n",
        "processors/k8s_cache.py": "",
        "exporters/__init__.py": "",
        "simulator/__init__.py": "",
        "wattpipe/__init__.py": "",
        "wattpipe/cli.py": "import wattpipe.processors.k8s\nfrom wattpipe import receivers, simulator\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert violations(tmp_path) == []

    def wrong(name: str, text: str) -> list[str]:
        (tmp_path / name).write_text(text)
        try:
            return violations(tmp_path)
        finally:
            (tmp_path / name).write_text(files[name])

    # A processor taking a receiver's function, at the top, under TYPE_CHECKING or inside a function:
    assert wrong("processors/k8s.py", "from wattpipe.receivers.podresources import resolve\n") == [
        "wattpipe.processors.k8s -> wattpipe.receivers.podresources"
    ]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from wattpipe import exporters\n"
    assert wrong("processors/k8s.py", typed) == ["wattpipe.processors.k8s -> wattpipe.exporters"]
    deferred = "def f() -> None:\n    from wattpipe.simulator import x\n"
    assert wrong("receivers/podresources.py", deferred) == ["wattpipe.receivers.podresources -> wattpipe.simulator"]
    # The engine reaching up, and a component importing the composition root:
    engine_up = "from wattpipe.processors import k8s\n"
    assert wrong("pipeline/records.py", engine_up) == ["wattpipe.pipeline.records -> wattpipe.processors"]
    assert wrong("exporters/__init__.py", "from wattpipe import cli\n") == ["wattpipe.exporters -> wattpipe.cli"]
    # A relative import that climbs out of its package is resolved before it is judged:
    assert wrong("processors/k8s.py", "from ..receivers import podresources\n") == [
        "wattpipe.processors.k8s -> wattpipe.receivers"
    ]
    # A layer by its bare folder name, which would load a second copy of the module, even from the root:
    assert wrong("wattpipe/cli.py", "from pipeline.records import Batch\n") == ["wattpipe.cli -> pipeline.records"]
