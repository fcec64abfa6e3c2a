"""Exporter ``console``: each tick as readable tables, or as JSON lines for piping into jq.

Tables show one row per record and one column per attribute or value; absent values print as "—",
never as 0. JSON lines carry one record each: its type, kind, attributes and values, with the record's
wall time.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from rich.console import Console
from rich.table import Table

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.records import Record, record_kind

__all__ = ["ConsoleConfig", "ConsoleExporter", "factory"]


class ConsoleConfig(ComponentConfig):
    format: Literal["table", "json"] = "table"
    output: Literal["stdout", "stderr"] = "stdout"
    kinds: list[str] = []
    """Only these Batch fields (e.g. ``[device_power, shares]``); empty: every non-empty field."""


class ConsoleExporter:
    def __init__(
        self, config: ConsoleConfig, ctx: CreateContext | None = None, *, stream: TextIO | None = None
    ) -> None:
        unknown = [k for k in config.kinds if k not in Batch.FIELDS]
        if unknown:
            raise ValueError(f"kinds: unknown batch field(s) {', '.join(unknown)}; known: {', '.join(Batch.FIELDS)}")
        self.config = config
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        if self._stream is not None:
            return self._stream
        return sys.stdout if self.config.output == "stdout" else sys.stderr

    def _fields(self, batch: Batch) -> list[str]:
        names = self.config.kinds or list(Batch.FIELDS)
        return [n for n in names if getattr(batch, n, ())]

    async def export(self, batch: Batch) -> None:
        if self.config.format == "json":
            self._json(batch)
        else:
            self._table(batch)

    def _json(self, batch: Batch) -> None:
        lines = []
        for name in self._fields(batch):
            for record in getattr(batch, name):
                lines.append(
                    json.dumps(
                        {
                            "time": record.time.wall_s,
                            "node": batch.node,
                            "pipeline": batch.pipeline,
                            "field": name,
                            "type": type(record).__name__,
                            "kind": record_kind(record),
                            "attributes": batch.labels(record),
                            "values": record.values(),
                        },
                        sort_keys=True,
                    )
                )
        if lines:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()

    def _table(self, batch: Batch) -> None:
        console = Console(file=self.stream, width=160, force_terminal=False, color_system=None)
        console.print(
            f"── {batch.pipeline} · node {batch.node} · wall {batch.time.wall_s:.3f} · interval {batch.interval_s:.3f}s "
            f"· {batch.count()} records"
        )
        for name in self._fields(batch):
            records: tuple[Record, ...] = getattr(batch, name)
            rows = [(batch.labels(r), r.values()) for r in records]
            attr_cols = sorted({k for labels, _ in rows for k in labels})
            value_cols = [k for k in _ordered_keys(v for _, v in rows)]
            table = Table(title=name, title_justify="left", show_edge=False, pad_edge=False)
            for col in attr_cols + value_cols:
                table.add_column(col, justify="right" if col in value_cols else "left")
            for labels, values in rows:
                table.add_row(*[labels.get(c, "—") for c in attr_cols], *[_cell(values.get(c)) for c in value_cols])
            console.print(table)
        self.stream.flush()


def _ordered_keys(dicts: Any) -> list[str]:
    seen: dict[str, None] = {}
    for d in dicts:
        for k in d:
            seen.setdefault(k, None)
    return list(seen)


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict) and "wall_s" in value:  # a Timestamp (a series' start): show when, in UTC
        return datetime.fromtimestamp(value["wall_s"], tz=UTC).strftime("%H:%M:%S")
    return str(value)


factory = Factory.of(
    ConsoleExporter,
    type="console",
    kind="exporter",
    config_model=ConsoleConfig,
    description="Prints each tick as tables or JSON lines on stdout (for trying things out and debugging).",
    stability="beta",
)
