"""rev8 review: an interval long enough for a zone's counter to have gone round more than once.

Between two reads the receiver can tell one wrap (a reading below the last), not two: a zone unread for longer
than one trip round its range loses each further trip, silently (docs/cpu.md). An AMD package's range is
65.5 kJ: 234 s at 280 W, so a zone missing for 5 minutes (within cpu_attribution's 10-minute gap, whose energy it
splits) or wattpipe frozen that long can lose 65.5 kJ, and nothing said so. The energy stays what the counter
shows (the trips cannot be counted), but a warning names the zone, the interval and what may be missing: at the
zone's highest power seen so far it would have gone round in less than the interval."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from tests.receivers.test_rapl import make, poll, write_zone
from wattpipe.pipeline.clock import SteppedClock

AMD_RANGE_UJ = 65_535_999_984


def _run(tmp_path: Path, caplog: pytest.LogCaptureFixture, away_s: float, watts: float) -> list[str]:
    clock = SteppedClock()
    raw = 1_000_000
    write_zone(tmp_path, "intel-rapl:0", "package-0", raw, AMD_RANGE_UJ)
    receiver = make(tmp_path, clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # 200 W for three ticks
            poll(receiver)
            clock.advance(5.0)
            raw += 1_000_000_000
            write_zone(tmp_path, "intel-rapl:0", "package-0", raw, AMD_RANGE_UJ)
        shutil.rmtree(tmp_path / "class" / "powercap" / "intel-rapl:0")
        poll(receiver)  # gone
        clock.advance(away_s)
        raw = (raw + int(watts * (away_s + 5.0) * 1e6)) % (AMD_RANGE_UJ + 1)
        write_zone(tmp_path, "intel-rapl:0", "package-0", raw, AMD_RANGE_UJ)
        back = poll(receiver)  # the tree changed: read again
    assert "intel-rapl:0" in back
    return [r.getMessage() for r in caplog.records if "round" in r.getMessage()]


def test_a_zone_back_after_longer_than_a_trip_at_its_highest_power_seen_is_said_to_maybe_miss_trips(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (said,) = _run(tmp_path, caplog, away_s=330.0, watts=200.0)  # 67 kJ over 335 s: 1.5 kJ counted, 65.5 kJ not
    assert "intel-rapl:0" in said
    assert "335 s" in said
    assert "65536 J" in said  # each trip it may have gone round more


def test_a_zone_back_within_a_trip_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert _run(tmp_path, caplog, away_s=300.0, watts=150.0) == []  # 305 s × 200 W = 61 kJ: under a trip
