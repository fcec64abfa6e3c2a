"""Durable state for processors that remember (idle baselines, energy totals, series start times).

One JSON file per wattpipe process, one section per processor (keyed ``<pipeline>/<component id>``).
Writes are atomic: a temporary file in the same directory, fsync, rename over the old one, fsync the
directory; so a crash leaves either the previous checkpoint or the new one, never half of either. A
file that is corrupt, or written by something else, is reported and set aside (renamed), never a
reason not to start.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from wattpipe.pipeline.clock import Clock

__all__ = ["FORMAT", "VERSION", "StateStore"]

FORMAT = "wattpipe-state"
VERSION = 1

log = logging.getLogger("wattpipe.state")

JsonObject = dict[str, Any]


class StateStore:
    """Sections of JSON-able state, loaded once at start and checkpointed every ``interval_s``.

    With ``path=None`` the store lives in memory only: components work the same, nothing survives a
    restart.
    """

    def __init__(self, path: Path | None, clock: Clock, node_name: str, interval_s: float = 30.0) -> None:
        self.path = path
        self.clock = clock
        self.node_name = node_name
        self.interval_s = interval_s
        self._sections: dict[str, JsonObject] = {}
        self._last_save_s: float | None = None
        self.loaded_from: Path | None = None
        self.set_aside: Path | None = None
        # Sections left out of the checkpoints (said once) while JSON cannot hold them.
        self._unwritable: set[str] = set()

    # --- reading ---------------------------------------------------------------------------

    def load(self) -> None:
        """Read the file if there is one. Never raises for bad content: it is set aside instead."""
        if self.path is None:
            return
        self._remove_leftovers()
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            problem = self._validate(data)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            problem = f"unreadable ({exc})"
        if problem is not None:
            self._set_aside(problem)
            return
        self._sections = dict(data["sections"])
        self.loaded_from = self.path
        if data.get("node") not in (None, self.node_name):
            # A moved volume or a renamed node: the totals are still this process's history.
            log.warning(
                "state file %s was written by node %s, not %s; using it", self.path, data["node"], self.node_name
            )
        log.info("state loaded from %s (%d sections)", self.path, len(self._sections))

    def _remove_leftovers(self) -> None:
        """A process killed in the middle of a save leaves its temporary file (the state file itself is
        whole: the rename never happened). Nothing else writes those names, and no save runs yet."""
        assert self.path is not None
        try:
            leftovers = list(self.path.parent.glob(f".{self.path.name}.*"))
        except OSError:
            return
        for leftover in leftovers:
            try:
                leftover.unlink()
                log.info("state file %s: removed %s, left by an interrupted save", self.path, leftover.name)
            except OSError as exc:
                log.warning("state file %s: cannot remove %s (%s)", self.path, leftover, exc)

    @staticmethod
    def _validate(data: object) -> str | None:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return "not a wattpipe state file"
        if data.get("version") != VERSION:
            return f"state format version {data.get('version')!r}, this wattpipe reads {VERSION}"
        if not isinstance(data.get("sections"), dict):
            return "it has no sections"
        if not all(isinstance(v, dict) for v in data["sections"].values()):
            return "a section is not an object"
        return None

    def _set_aside(self, problem: str) -> None:
        assert self.path is not None
        stamp = int(self.clock.wall())
        target = self.path.with_name(f"{self.path.name}.bad-{stamp}")
        try:
            self.path.replace(target)
            self.set_aside = target
            log.error("state file %s: %s; moved it to %s and starting afresh", self.path, problem, target)
        except OSError as exc:
            log.error("state file %s: %s, and it cannot be moved aside (%s); starting afresh", self.path, problem, exc)

    def drop(self, key: str) -> None:
        """Forget a section (the next checkpoint writes what its component keeps now)."""
        self._sections.pop(key, None)

    def keep_copy(self) -> Path | None:
        """A copy of the file as it was loaded, as ``<name>.bad-<unix time>``, for a person to look at (a section
        of it could not be used); None where there is none or it could not be copied (logged)."""
        if self.loaded_from is None:
            return None
        target = self.loaded_from.with_name(f"{self.loaded_from.name}.bad-{int(self.clock.wall())}")
        try:
            if not target.exists():  # (two sections in one second: the first copy is the file as it was)
                shutil.copy2(self.loaded_from, target)
        except OSError as exc:
            log.error("state file %s: cannot keep a copy as %s (%s)", self.loaded_from, target, exc)
            return None
        return target

    def section(self, key: str) -> JsonObject | None:
        """What a component saved last time, or None."""
        return self._sections.get(key)

    # --- writing ---------------------------------------------------------------------------

    def put(self, key: str, value: JsonObject) -> None:
        self._sections[key] = value

    def due(self) -> bool:
        now = self.clock.monotonic()
        return self._last_save_s is None or now - self._last_save_s >= self.interval_s

    def save(self) -> bool:
        """Write a checkpoint now; False (and logged) if it could not be written."""
        self._last_save_s = self.clock.monotonic()
        if self.path is None:
            return True
        text = self._text()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.error("state file %s: cannot write a checkpoint: %s", self.path, exc)
            return False
        return True

    def _text(self) -> str:
        """The checkpoint as JSON. A section JSON cannot hold (a NaN, an infinity, an object of no JSON type) is
        left out, named once while it stays so: it costs its component alone its state, not every component's."""
        document = {
            "format": FORMAT,
            "version": VERSION,
            "node": self.node_name,
            "written_wall_s": self.clock.wall(),
            "sections": self._sections,
        }
        try:
            text = json.dumps(document, separators=(",", ":"), allow_nan=False)
        except (ValueError, TypeError):  # (each section on its own, only then: a big state is dumped once)
            document["sections"] = {k: v for k, v in self._sections.items() if self._writable(k, v)}
            return json.dumps(document, separators=(",", ":"), allow_nan=False)
        self._unwritable.clear()
        return text

    def _writable(self, key: str, value: JsonObject) -> bool:
        try:
            json.dumps(value, allow_nan=False)
        except (ValueError, TypeError) as exc:
            if key not in self._unwritable:
                self._unwritable.add(key)
                log.error(
                    "state file %s: section %s cannot be written (%s); checkpoints go on without it, so a restart "
                    "starts that component afresh",
                    self.path,
                    key,
                    exc,
                )
            return False
        self._unwritable.discard(key)
        return True
