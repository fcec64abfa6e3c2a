"""Review of the rapl receiver off the happy path: zones that come and go, sockets that appear later."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from tests.receivers.test_rapl import RANGE_UJ, make, poll, write_zone
from wattpipe.pipeline.clock import SteppedClock


def test_a_socket_that_appears_after_the_first_discovery_is_read(tmp_path: Path) -> None:
    """intel_rapl registers one package at a time (a CPU hotplug callback per package) and psys after them: a
    discovery between two registrations must not leave the later zones unread for as long as wattpipe runs."""
    clock = SteppedClock()
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000)
    receiver = make(tmp_path, clock)
    assert set(poll(receiver)) == {"intel-rapl:0"}
    write_zone(tmp_path, "intel-rapl:1", "package-1", 5_000)
    write_zone(tmp_path, "intel-rapl:1:0", "dram", 6_000)
    clock.advance(5.0)
    assert set(poll(receiver)) == {"intel-rapl:0", "intel-rapl:1", "intel-rapl:1:0"}


def test_a_zone_missing_from_one_discovery_keeps_its_counter_when_it_is_back(tmp_path: Path) -> None:
    """A zone absent for a few ticks (its directory removed and created again: a driver reload, a package's
    CPUs offlined and back) comes back with its hardware counter still counting: the energy over the gap is
    its counter's delta, wraps included, never a total that falls within one epoch."""
    clock = SteppedClock()
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000)
    write_zone(tmp_path, "intel-rapl:1", "package-1", RANGE_UJ - 100_000_000)
    receiver = make(tmp_path, clock)
    poll(receiver)
    clock.advance(5.0)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 400_000_000)  # wrapped: 100 J + 1 µJ + 400 J
    wrapped = poll(receiver)["intel-rapl:1"]
    shutil.rmtree(tmp_path / "class" / "powercap" / "intel-rapl:1")
    for _ in range(3):  # gone: the tick that finds it gone, and two rediscoveries without it
        clock.advance(5.0)
        assert "intel-rapl:1" not in poll(receiver)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 1_400_000_000)  # 1 kJ more over the gap
    for _ in range(2):  # back: it is read again (at the latest once the tree is read again)
        clock.advance(5.0)
        back = poll(receiver).get("intel-rapl:1")
        if back is not None:
            break
    assert back is not None
    assert back.counter_epoch == wrapped.counter_epoch
    assert back.energy_uj - wrapped.energy_uj == 1_000_000_000


def test_a_zone_gone_from_the_tree_is_said_once_naming_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Its energy stops while the others' goes on: one warning naming the zone, not silence."""
    clock = SteppedClock()
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 5_000)
    receiver = make(tmp_path, clock)
    poll(receiver)
    shutil.rmtree(tmp_path / "class" / "powercap" / "intel-rapl:1")
    with caplog.at_level(logging.WARNING):
        for _ in range(4):
            clock.advance(5.0)
            assert set(poll(receiver)) == {"intel-rapl:0"}
    said = [r.getMessage() for r in caplog.records if "intel-rapl:1" in r.getMessage()]
    assert len(said) == 1
    assert "gone" in said[0]


def test_every_zone_gone_mid_run_is_said_gone_not_never_there(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every zone's directory gone at once (a simulator ``rapl`` fault on every zone, a /sys mount that flaps):
    the warning named the driver "not loaded, or the CPU has none", as on a node that never had RAPL. It names
    the zones gone and says their counters' growth is counted when they are back; and it is."""
    clock = SteppedClock()
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000)
    receiver = make(tmp_path, clock)
    first = poll(receiver)["intel-rapl:0"]
    shutil.rmtree(tmp_path / "class" / "powercap" / "intel-rapl:0")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.advance(5.0)
            assert poll(receiver) == {}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert "intel-rapl:0 gone from" in said[0]
    assert "not loaded" not in said[0]
    write_zone(tmp_path, "intel-rapl:0", "package-0", 2_001_000)
    clock.advance(5.0)
    back = poll(receiver)["intel-rapl:0"]
    assert (back.counter_epoch, back.energy_uj - first.energy_uj) == (first.counter_epoch, 2_000_000)
