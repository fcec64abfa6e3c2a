"""The one clock: real time for a node, stepped time for tests and ``wattpipe simulate``.

Every sample carries the monotonic and the wall time at which it was read. Logic never calls
``time.time()``; it asks the clock it was given, so a test can move every part of the system (the
pipeline, the simulator's NVML, its dcgm-exporter, its /proc) by exactly ``advance(5.0)`` at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "RealClock", "SteppedClock", "Timestamp"]


@dataclass(frozen=True, slots=True)
class Timestamp:
    """A point in time, read once from a clock.

    ``monotonic_s`` orders and differences samples (never jumps); ``wall_s`` (Unix seconds) is what is
    exported as the sample's time.
    """

    monotonic_s: float
    wall_s: float

    @property
    def wall_ns(self) -> int:
        return round(self.wall_s * 1e9)

    @property
    def wall_offset_s(self) -> float:
        """Wall time less monotonic time now: turns a monotonic time into wall time and back (saved state)."""
        return self.wall_s - self.monotonic_s


@runtime_checkable
class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def wall(self) -> float:
        """Unix seconds."""
        ...

    def now(self) -> Timestamp: ...

    async def sleep_until(self, monotonic_s: float) -> None:
        """Return once ``monotonic()`` has reached ``monotonic_s``."""
        ...


class RealClock:
    """The host's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def now(self) -> Timestamp:
        return Timestamp(monotonic_s=time.monotonic(), wall_s=time.time())

    async def sleep_until(self, monotonic_s: float) -> None:
        delay = monotonic_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class SteppedClock:
    """A clock that moves only when told to.

    ``sleep_until`` jumps the clock forward to the deadline instead of waiting, so a pipeline driven by
    it runs its ticks back to back: a simulated hour takes as long as its ticks' work. Wall time moves in
    step with monotonic time from ``start_wall_s``.
    """

    def __init__(self, start_wall_s: float = 1_767_225_600.0, start_monotonic_s: float = 1000.0) -> None:
        # Defaults: 2026-01-01T00:00:00Z, and a monotonic origin far from 0 so that code which
        # mistakes "0" for "never" is caught by the tests.
        self._monotonic_s = start_monotonic_s
        self._offset_s = start_wall_s - start_monotonic_s

    def monotonic(self) -> float:
        return self._monotonic_s

    def wall(self) -> float:
        return self._monotonic_s + self._offset_s

    def now(self) -> Timestamp:
        return Timestamp(monotonic_s=self._monotonic_s, wall_s=self._monotonic_s + self._offset_s)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance({seconds}))")
        self._monotonic_s += seconds

    def set(self, monotonic_s: float) -> None:
        """Move to an absolute monotonic time (never backwards)."""
        self.advance(monotonic_s - self._monotonic_s)

    async def sleep_until(self, monotonic_s: float) -> None:
        if monotonic_s > self._monotonic_s:
            self._monotonic_s = monotonic_s
        # Yield once so other tasks (servers, senders) get to run between ticks.
        await asyncio.sleep(0)
