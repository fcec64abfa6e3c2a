"""Exporter ``console``: each tick as readable tables, or as JSON lines for piping into jq.

Tables (:mod:`exporters._console_table`) fit the terminal's width, show energy in joules, the wall time
as a date and time, and process, container and pod totals apart; absent values print as "—", never as
0. JSON lines carry one record each: its type, kind, attributes and values (millijoules, as recorded),
with the record's wall time. If the reader goes away (``wattpipe run … | head``), the exporter says so
once and writes no more; the rest of the pipeline goes on.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Literal, TextIO

from pydantic import Field

from wattpipe.exporters._console_table import console_width, render
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.errors import alternatives
from wattpipe.pipeline.records import record_kind

__all__ = ["ConsoleConfig", "ConsoleExporter", "factory"]


class ConsoleConfig(ComponentConfig):
    format: Literal["table", "json"] = "table"
    output: Literal["stdout", "stderr"] = "stdout"
    kinds: list[str] = []
    """Only these Batch fields (e.g. ``[device_power, shares]``); empty: every non-empty field."""
    width: int = Field(default=0, ge=0)
    """Table width in columns; 0: the terminal's width (else $COLUMNS, else 120)."""


class ConsoleExporter:
    def __init__(
        self, config: ConsoleConfig, ctx: CreateContext | None = None, *, stream: TextIO | None = None
    ) -> None:
        unknown = [k for k in config.kinds if k not in Batch.FIELDS]
        if unknown:
            raise ValueError(f"kinds: unknown batch field(s) {', '.join(unknown)}; known: {', '.join(Batch.FIELDS)}")
        self.config = config
        self._stream = stream
        self._log = ctx.logger if ctx is not None else logging.getLogger("wattpipe.exporter.console")
        self._closed = False

    @property
    def stream(self) -> TextIO:
        if self._stream is not None:
            return self._stream
        return sys.stdout if self.config.output == "stdout" else sys.stderr

    def _fields(self, batch: Batch) -> list[str]:
        names = self.config.kinds or list(Batch.FIELDS)
        return [n for n in names if getattr(batch, n, ())]

    async def export(self, batch: Batch) -> None:
        if self._closed:
            return
        try:
            if self.config.format == "json":
                self._json(batch)
            else:
                fields = self._fields(batch)
                render(batch, fields, self.stream, console_width(self.stream, self.config.width))
                if not fields and self.config.kinds and batch.count():  # records, none of the kinds asked for
                    self.stream.write(f"(no {alternatives(self.config.kinds)} this tick)\n")
                self.stream.flush()
        except BrokenPipeError:
            self._closed = True
            _discard_further_writes(self.stream)
            self._log.warning("the %s reader went away (broken pipe): no more console output", self.config.output)

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


def _discard_further_writes(stream: TextIO) -> None:
    """Point a closed pipe's file descriptor at /dev/null, so no later write or flush (the interpreter's
    own at exit) raises again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's StringIO)
        pass


factory = Factory.of(
    ConsoleExporter,
    type="console",
    kind="exporter",
    config_model=ConsoleConfig,
    description="Prints each tick as tables or JSON lines on stdout (for trying things out and debugging).",
    stability="beta",
)
