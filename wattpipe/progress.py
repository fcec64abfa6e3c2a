"""``wattpipe simulate``'s progress bar: node time done of the total, ticks per second, time left.

Shown on a terminal only, and only at log level info or debug (``--log-level warning`` keeps the terminal
to warnings and the summary). Log lines printed while it runs go above the bar, not through it. Whatever
the terminal, the run ends with one line saying how much node time took how long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.file_proxy import FileProxy
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

__all__ = ["SimulationProgress", "clock_text"]


def clock_text(seconds: float) -> str:
    """``3725`` → ``1:02:05``; under an hour ``12:05``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class SimulationProgress:
    """Call :meth:`tick` once per tick inside ``with``; ``node_s`` says how much node time has passed."""

    def __init__(self, total_s: float, node_s: Callable[[], float], err: TextIO, show: bool) -> None:
        self.total_s = total_s
        self.node_s = node_s
        self.err = err
        self.ticks = 0
        self._started = time.monotonic()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._handlers: list[tuple[logging.StreamHandler[TextIO], TextIO]] = []
        self._proxy: FileProxy | None = None
        if show:
            console = Console(file=err)
            if console.is_terminal:
                self._progress = Progress(
                    TextColumn("simulating"),
                    BarColumn(),
                    TextColumn("{task.fields[node]} of node time"),
                    TextColumn("· {task.fields[rate]} ticks/s ·"),
                    TimeRemainingColumn(),
                    TextColumn("left"),
                    console=console,
                    transient=True,
                )

    def __enter__(self) -> SimulationProgress:
        self._started = time.monotonic()
        if self._progress is not None:
            self._task = self._progress.add_task("simulate", total=self.total_s, node=self._node_text(), rate="—")
            self._progress.start()
            # Log lines go above the bar, through the progress console, instead of over it.
            self._proxy = FileProxy(self._progress.console, self.err)
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is self.err:
                    self._handlers.append((handler, handler.stream))
                    handler.setStream(self._proxy)
        return self

    def tick(self) -> None:
        self.ticks += 1
        if self._progress is None or self._task is None:
            return
        elapsed = time.monotonic() - self._started
        rate = f"{self.ticks / elapsed:.0f}" if elapsed > 0 else "—"
        self._progress.update(self._task, completed=min(self.node_s(), self.total_s), node=self._node_text(), rate=rate)

    def _node_text(self) -> str:
        return f"{clock_text(self.node_s())} / {clock_text(self.total_s)}"

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._proxy is not None:
            self._proxy.flush()
        for handler, stream in self._handlers:
            handler.setStream(stream)
        if self._progress is not None:
            self._progress.stop()

    def summary(self) -> str:
        """``simulated 1:00:00 of node time in 1801 ticks, 12.3 s (146 ticks/s)``."""
        elapsed = time.monotonic() - self._started
        rate = f" ({self.ticks / elapsed:.0f} ticks/s)" if elapsed > 0 else ""
        return f"simulated {clock_text(self.node_s())} of node time in {self.ticks} ticks, {elapsed:.1f} s{rate}"
