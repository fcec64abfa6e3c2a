"""The console exporter's tables: one batch as rich tables a person can read in a terminal of any width.

What a person reads differs from what a program reads (the JSON lines): energy in joules (records carry
millijoules), units in the column headers (``energy J``, ``power W``), words that wrap instead of being
cut with "…", the wall time as a date and time, and process, container and pod totals in tables of
their own. Absent values print as "—", never as 0.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.records import Record, Totals, record_kind

__all__ = ["console_width", "header", "render", "tables"]

FALLBACK_WIDTH = 120
"""The width when the output is not a terminal and $COLUMNS does not say one."""

# Value-name suffixes and the unit a person reads; a millijoule value is shown in joules.
_UNITS = (("_mj", " J"), ("_w", " W"), ("_s", " s"))


def console_width(stream: TextIO, configured: int) -> int:
    """``configured`` if set; else the terminal's width; else $COLUMNS; else :data:`FALLBACK_WIDTH`."""
    if configured > 0:
        return configured
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        pass
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return FALLBACK_WIDTH


def wall_time(wall_s: float) -> str:
    """A wall time as a person reads it: ``2026-01-01 00:00:02 UTC`` (milliseconds only when there are any)."""
    moment = datetime.fromtimestamp(wall_s, tz=UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    millis = round((wall_s - int(wall_s)) * 1000)
    return f"{text}.{millis:03d} UTC" if millis and millis < 1000 else f"{text} UTC"


def header(batch: Batch) -> str:
    interval = f"{batch.interval_s:.3g}"  # the nominal tick, not its microseconds of jitter
    return (
        f"── {batch.pipeline} · node {batch.node} · {wall_time(batch.time.wall_s)} · every {interval} s "
        f"· {batch.count()} records"
    )


def column_title(name: str) -> str:
    """``idle_energy_mj`` → ``idle energy J``: spaces let a narrow column wrap the words instead of cutting them."""
    for suffix, unit in _UNITS:
        if name.endswith(suffix):
            return name.removesuffix(suffix).replace("_", " ") + unit
    return name.replace("_", " ")


_HEX = frozenset("0123456789abcdef")
_SHORT_ID = 12
"""Long hexadecimal IDs (container IDs, UUIDs) show their first 12 characters, as ``docker ps`` does."""


def short_id(text: str) -> str:
    body = text.removeprefix("GPU-").removeprefix("MIG-").replace("-", "").lower()
    if len(body) >= 32 and set(body) <= _HEX:
        keep = len(text) - len(text.removeprefix("GPU-").removeprefix("MIG-")) + _SHORT_ID
        return text[:keep] + "…"
    return text


def cell(name: str, value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, dict) and "wall_s" in value:  # a Timestamp (a series' start): when, in UTC
        return datetime.fromtimestamp(value["wall_s"], tz=UTC).strftime("%H:%M:%S")
    if name.endswith("_mj") and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value / 1000:.3f}"
    if isinstance(value, float):
        return f"{value:.3f}"
    return short_id(str(value))


def _groups(name: str, records: Iterable[Record]) -> list[tuple[str, list[Record]]]:
    """The records of one batch field, one group per kind: totals split into process, container, pod…"""
    by_kind: dict[str, list[Record]] = {}
    for record in records:
        by_kind.setdefault(record_kind(record), []).append(record)
    if len(by_kind) == 1 and not any(isinstance(r, Totals) for r in next(iter(by_kind.values()))):
        return [(name, next(iter(by_kind.values())))]
    return [(f"{name} · {kind}", group) for kind, group in by_kind.items()]


def _ordered_keys(dicts: Iterable[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for d in dicts:
        for k in d:
            seen.setdefault(k, None)
    return list(seen)


@dataclass
class _Column:
    heading: str
    cells: list[str]
    numeric: bool

    @property
    def width(self) -> int:
        """Its header and every cell on one line (long IDs are shortened, so that is seldom wide)."""
        return max([len(self.heading)] + [len(c) for c in self.cells])


def _columns(batch: Batch, records: list[Record], totals: bool) -> list[_Column]:
    rows = [(batch.labels(r), r.values()) for r in records]
    # A totals table's scope is in its title.
    attr_names = sorted({k for labels, _ in rows for k in labels} - ({"scope"} if totals else set()))
    value_names = _ordered_keys(v for _, v in rows)
    return [
        _Column(column_title(c), [short_id(labels.get(c, "—")) for labels, _ in rows], False) for c in attr_names
    ] + [_Column(column_title(c), [cell(c, values.get(c)) for _, values in rows], True) for c in value_names]


def _packed(columns: list[_Column], width: int) -> list[list[_Column]]:
    """The columns in as few tables as fit ``width`` with nothing wrapped; each table after the first
    repeats the first column, so its rows can be told apart. (A column wider than ``width`` alone wraps.)"""
    parts: list[list[_Column]] = [[]]
    used = 0
    for column in columns:
        need = column.width + (_SEPARATOR if parts[-1] else 0)
        if len(parts[-1]) > 1 and used + need > width:
            parts.append([columns[0]])
            used = columns[0].width
            need = column.width + _SEPARATOR
        parts[-1].append(column)
        used += need
    return parts


_SEPARATOR = 3
"""Columns between two columns of a table without edges: a space, the rule, a space."""


def tables(batch: Batch, fields: list[str], width: int) -> list[Table]:
    """One table per field and kind, in ``fields`` order; one too wide for ``width`` split in several."""
    out = []
    for name in fields:
        for title, records in _groups(name, getattr(batch, name)):
            columns = _columns(batch, records, totals=title != name)
            for part, group in enumerate(_packed(columns, width)):
                table = Table(
                    title=title if not part else f"{title} (continued)",
                    title_justify="left",
                    show_edge=False,
                    pad_edge=False,
                )
                for column in group:
                    table.add_column(
                        column.heading,
                        justify="right" if column.numeric else "left",
                        overflow="fold",
                        no_wrap=column.numeric,
                    )
                for i in range(len(records)):
                    table.add_row(*[column.cells[i] for column in group])
                out.append(table)
    return out


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """rich's own ends the program (SystemExit); the exporter decides instead."""
        raise BrokenPipeError(errno.EPIPE, "the reader went away")


def render(batch: Batch, fields: list[str], stream: TextIO, width: int) -> None:
    """The header line and the tables, at ``width`` columns, on ``stream``."""
    console = _Console(file=stream, width=width, force_terminal=False, color_system=None, soft_wrap=False)
    console.print(header(batch), overflow="fold")
    for table in tables(batch, fields, width):
        console.print(table)
