"""The size rules of issue 16, checked on every product module: no file over 500 lines, no function over 60
lines unless a comment on the line above its ``def`` says why (``# long: <reason>``). Generated modules
(``*_pb2*.py``) are exempt."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("pipeline", "receivers", "processors", "exporters", "simulator", "wattpipe")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def product_modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (root / folder).rglob("*.py") if "_pb2" not in p.name)


def long_functions(path: Path) -> list[str]:
    """``file:line name (N lines)`` for each function over the limit without a ``# long:`` reason above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            reason = lines[first - 2].strip() if first >= 2 else ""
            if length > MAX_FUNCTION_LINES and not reason.startswith("# long:"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_product_file_is_over_500_lines() -> None:
    modules = product_modules()
    assert len(modules) > 50
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in modules}
    assert {name: n for name, n in sizes.items() if n > MAX_FILE_LINES} == {}


def test_no_function_is_over_60_lines_without_a_reason() -> None:
    assert [f for p in product_modules() for f in long_functions(p)] == []


def test_the_function_rule_finds_a_long_function_and_accepts_a_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(70))
    path = ROOT / "tests" / "_house_probe.py"  # under ROOT, so the report names it relative to the checkout
    try:
        path.write_text(f"def long_one() -> None:\n{body}")
        assert long_functions(path) == ["tests/_house_probe.py:1 long_one (71 lines)"]
        path.write_text(f"# long: a table, one line per entry\ndef long_one() -> None:\n{body}")
        assert long_functions(path) == []
    finally:
        path.unlink(missing_ok=True)
