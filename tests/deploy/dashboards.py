"""The Grafana dashboards in deploy/grafana/: loading them, their queries, and Grafana's variable interpolation."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.deploy.chart import DEPLOY

GRAFANA = DEPLOY / "grafana"
DASHBOARDS = sorted(GRAFANA.glob("*.json"))
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def targets(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def interpolate(expr: str, values: dict[str, str]) -> str:
    """``expr`` with ``$name`` and ``${name}`` replaced as Grafana does; a name not in ``values`` is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"${name} is not a variable of the dashboard (nor a Grafana built-in given here)")
        return values[name]

    return _VARIABLE.sub(one, expr)
