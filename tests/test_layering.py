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

ALLOWED: Mapping[str, frozenset[str]] = {
    "pipeline": frozenset({"pipeline"}),
    "receivers": frozenset({"pipeline", "receivers"}),
    "processors": frozenset({"pipeline", "processors"}),
    "exporters": frozenset({"pipeline", "exporters"}),
    "simulator": frozenset({"pipeline", "simulator"}),
    "wattpipe": frozenset({"pipeline", "receivers", "processors", "exporters", "simulator", "wattpipe"}),
}
"""Layer → the layers its modules may import (third-party and standard-library imports are not checked)."""


def violations(root: Path, allowed: Mapping[str, frozenset[str]] = ALLOWED) -> list[str]:
    """``module -> imported`` for every import of a layer that ``allowed`` does not permit, sorted."""
    found: set[str] = set()
    for layer in allowed:
        for name, path in module_names(root / layer, layer).items():
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            bad = {
                target
                for target in imported(tree, name, path.name == "__init__.py")
                if target.split(".")[0] in allowed and target.split(".")[0] not in allowed[layer]
            }
            # ``from a.b import c`` names ``a.b`` and ``a.b.c``: report the statement's module, once.
            found.update(f"{name} -> {t}" for t in bad if not any(t.startswith(f"{u}.") for u in bad))
    return sorted(found)


def test_every_layer_imports_only_what_the_architecture_allows() -> None:
    for layer in ALLOWED:
        assert len(module_names(ROOT / layer, layer)) > 1, f"{layer}: no modules found; wrong place?"
    assert violations(ROOT) == []


def test_a_deliberately_wrong_import_is_found_wherever_it_hides(tmp_path: Path) -> None:
    files = {
        "pipeline/__init__.py": "",
        "pipeline/records.py": "import dataclasses\n",
        "receivers/__init__.py": "",
        "receivers/podresources.py": "from pipeline.records import Batch\ndef resolve() -> None: ...\n",
        "processors/__init__.py": "",
        "processors/k8s.py": "from pipeline import records\nfrom . import k8s_cache\n",
        "processors/k8s_cache.py": "",
        "exporters/__init__.py": "",
        "simulator/__init__.py": "",
        "wattpipe/__init__.py": "import processors.k8s\nimport receivers\nimport simulator\n",
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
    assert wrong("processors/k8s.py", "from receivers.podresources import resolve\n") == [
        "processors.k8s -> receivers.podresources"
    ]
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import exporters\n"
    assert wrong("processors/k8s.py", typed) == ["processors.k8s -> exporters"]
    deferred = "def f() -> None:\n    from simulator import x\n"
    assert wrong("receivers/podresources.py", deferred) == ["receivers.podresources -> simulator"]
    # The engine reaching up, and a component importing the composition root:
    assert wrong("pipeline/records.py", "from processors import k8s\n") == ["pipeline.records -> processors"]
    assert wrong("exporters/__init__.py", "import wattpipe\n") == ["exporters -> wattpipe"]
    # A relative import that climbs out of its package is resolved before it is judged:
    assert wrong("processors/k8s.py", "from ..receivers import podresources\n") != []
