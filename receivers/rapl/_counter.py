"""One zone's ``energy_uj`` made monotonic: wraps added back, resets moved to a new epoch.

The hardware counter counts up to ``max_energy_range_uj`` and starts again from 0. Between two reads it can
wrap at most once without losing energy (a package at 200 W takes about 20 minutes to go round a
262,143 J range), so a read below the last one is a wrap when the energy it implies (up to the range's end,
then from 0) is plausible for the time that passed: at most ``max_power_w`` on average. Otherwise (no wrap
range known, or a wrap would mean an impossible power) the counter was reset (a driver reload, a CPU
hot-plug): that interval's energy is unknown, the total does not move, and the epoch goes up, telling
consumers never to subtract readings of two epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Step", "ZoneCounter"]

Step = Literal["first", "rise", "wrap", "reset"]


@dataclass(slots=True)
class ZoneCounter:
    """The running total of one zone, in µJ since the receiver first read it (starting at that reading)."""

    max_power_w: float
    total_uj: int = 0
    epoch: int = 0
    last_raw_uj: int | None = None
    last_s: float | None = None
    peak_w: float = 0.0  # the highest mean power over an interval so far (how fast it can go round the range)

    def update(self, raw_uj: int, max_range_uj: int | None, now_s: float) -> Step:
        """Take a reading of the hardware counter at monotonic time ``now_s``; returns what it was."""
        last, last_s = self.last_raw_uj, self.last_s
        self.last_raw_uj, self.last_s = raw_uj, now_s
        if last is None or last_s is None:
            self.total_uj = raw_uj
            return "first"
        elapsed_s = now_s - last_s
        if raw_uj >= last:
            self._add(raw_uj - last, elapsed_s)
            return "rise"
        if max_range_uj is not None and last <= max_range_uj:
            # The counter's values are 0 … max_range_uj: one step past the top is 0 again.
            wrapped_uj = max_range_uj - last + 1 + raw_uj
            if elapsed_s > 0 and wrapped_uj <= self.max_power_w * elapsed_s * 1e6:
                self._add(wrapped_uj, elapsed_s)
                return "wrap"
        self.epoch += 1
        return "reset"

    def _add(self, delta_uj: int, elapsed_s: float) -> None:
        self.total_uj += delta_uj
        if elapsed_s >= 1.0:  # (a shorter interval's mean is the counter's update steps more than power)
            self.peak_w = max(self.peak_w, delta_uj / elapsed_s / 1e6)

    def may_have_lapped(self, elapsed_s: float, max_range_uj: int | None) -> bool:
        """Whether, at its highest power seen, the counter would go round its range in less than ``elapsed_s``
        (an interval after which a second trip round, which no reading can show, may be missing)."""
        return max_range_uj is not None and self.peak_w * elapsed_s * 1e6 > max_range_uj
