"""rev8 review: a zone whose ``max_energy_range_uj`` could not be read when the tree was read.

The range is read once, at discovery (the first tick, and whenever the zone directories change). Unreadable
then (a read error, a half-written hand-made tree, a value of 0), the zone had no range for as long as wattpipe
ran, so every wrap of its counter was taken for a reset: that interval's energy lost and a new epoch each time
(an AMD package's 65.5 kJ range at 200 W wraps every ~5.5 minutes: a 5 s tick's 1 kJ lost per wrap, 1.5 % of
its energy). Where a reading goes back, the range is read again: a readable one tells the wrap."""

from __future__ import annotations

from pathlib import Path

from tests.receivers.test_rapl import make, poll, write_zone
from wattpipe.pipeline.clock import SteppedClock

AMD_RANGE_UJ = 65_535_999_984


def test_a_range_unreadable_at_discovery_and_readable_at_the_wrap_tells_the_wrap(tmp_path: Path) -> None:
    clock = SteppedClock()
    zone = tmp_path / "class" / "powercap" / "intel-rapl:0"
    write_zone(tmp_path, "intel-rapl:0", "package-0", AMD_RANGE_UJ - 400_000_000, max_uj=None)
    (zone / "max_energy_range_uj").write_text("\n")  # not a number when the tree is read
    receiver = make(tmp_path, clock)
    first = poll(receiver)["intel-rapl:0"]
    (zone / "max_energy_range_uj").write_text(f"{AMD_RANGE_UJ}\n")
    clock.advance(5.0)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 599_999_999, max_uj=None)  # 1 kJ over the tick, wrapped
    wrapped = poll(receiver)["intel-rapl:0"]
    assert (wrapped.counter_epoch, wrapped.energy_uj - first.energy_uj) == (0, 1_000_000_000)  # was epoch 1, +0 J
    assert receiver.resets.value(path="intel-rapl:0") == 0


def test_a_range_still_unreadable_at_the_wrap_is_a_reset_as_before(tmp_path: Path) -> None:
    clock = SteppedClock()
    write_zone(tmp_path, "intel-rapl:0", "package-0", AMD_RANGE_UJ - 400_000_000, max_uj=0)  # 0: no range
    receiver = make(tmp_path, clock)
    first = poll(receiver)["intel-rapl:0"]
    clock.advance(5.0)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 599_999_999, max_uj=0)
    reset = poll(receiver)["intel-rapl:0"]
    assert (reset.counter_epoch, reset.energy_uj) == (1, first.energy_uj)
