"""The rapl receiver against powercap trees written by hand, and the simulator's RAPL zones."""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.records import CpuZoneSample
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.receivers.rapl import RaplConfig, RaplReceiver, ZoneCounter, discover, zone_kind
from wattpipe.receivers.rapl._zones import read_int
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.scenario import parse_scenario

RANGE_UJ = 262_143_328_850


def write_zone(sys: Path, path: str, name: str | None, energy_uj: int | None, max_uj: int | None = RANGE_UJ) -> None:
    directory = sys / "class" / "powercap" / path
    directory.mkdir(parents=True, exist_ok=True)
    if name is not None:
        (directory / "name").write_text(name + "\n")
    if energy_uj is not None:
        (directory / "energy_uj").write_text(f"{energy_uj}\n")
    if max_uj is not None:
        (directory / "max_energy_range_uj").write_text(f"{max_uj}\n")


def two_socket_tree(sys: Path) -> None:
    """Two packages with core, uncore and dram; a psys zone; an mmio twin of package 0; the control type."""
    (sys / "class" / "powercap" / "intel-rapl").mkdir(parents=True)  # the control type: no counter
    write_zone(sys, "intel-rapl:0", "package-0", 1_000)
    write_zone(sys, "intel-rapl:0:0", "core", 2_000)
    write_zone(sys, "intel-rapl:0:1", "uncore", 3_000)
    write_zone(sys, "intel-rapl:0:2", "dram", 4_000)
    write_zone(sys, "intel-rapl:1", "package-1", 5_000)
    write_zone(sys, "intel-rapl:1:0", "dram", 6_000)
    write_zone(sys, "intel-rapl:2", "psys", 7_000)
    write_zone(sys, "intel-rapl-mmio:0", "package-0", 999)


def make(
    sys: Path, clock: SteppedClock | None = None, telemetry: Telemetry | None = None, **options: Any
) -> RaplReceiver:
    clock = clock or SteppedClock()
    ctx = make_context("rapl", "receiver", clock, telemetry=telemetry or Telemetry(clock))
    return RaplReceiver(RaplConfig(root=str(sys), **options), ctx)


def poll(receiver: RaplReceiver) -> dict[str, CpuZoneSample]:
    records = asyncio.run(receiver.collect())
    assert all(isinstance(r, CpuZoneSample) for r in records)
    return {r.path: r for r in records if isinstance(r, CpuZoneSample)}


def test_every_zone_of_every_socket_by_its_path_and_the_mmio_twin_dropped(tmp_path: Path) -> None:
    two_socket_tree(tmp_path)
    zones = poll(make(tmp_path))
    assert {p: (z.zone, z.socket, z.energy_uj) for p, z in zones.items()} == {
        "intel-rapl:0": ("package", 0, 1_000),
        "intel-rapl:0:0": ("core", 0, 2_000),
        "intel-rapl:0:1": ("uncore", 0, 3_000),
        "intel-rapl:0:2": ("dram", 0, 4_000),
        "intel-rapl:1": ("package", 1, 5_000),
        "intel-rapl:1:0": ("dram", 1, 6_000),
        "intel-rapl:2": ("psys", None, 7_000),
    }
    assert discover(str(tmp_path / "class" / "powercap")).dropped == ["intel-rapl-mmio:0"]
    assert all(z.counter_epoch == 0 for z in zones.values())


def test_an_mmio_zone_with_no_msr_twin_is_kept(tmp_path: Path) -> None:
    write_zone(tmp_path, "intel-rapl-mmio:0", "package-0", 42)
    assert {(z.zone, z.socket, z.energy_uj) for z in poll(make(tmp_path)).values()} == {("package", 0, 42)}


def test_zone_names_map_to_kinds() -> None:
    assert zone_kind("package-3") == ("package", 3)
    assert zone_kind("package-0-die-1") == ("package", 0)
    assert zone_kind("dram") == ("dram", None)
    assert zone_kind("psys") == ("psys", None)


def test_a_wrap_between_two_ticks_loses_nothing(tmp_path: Path) -> None:
    clock = SteppedClock()
    write_zone(tmp_path, "intel-rapl:0", "package-0", RANGE_UJ - 100_000_000, RANGE_UJ)  # 100 J before the top
    receiver = make(tmp_path, clock)
    first = poll(receiver)["intel-rapl:0"].energy_uj
    clock.advance(5.0)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 400_000_000, RANGE_UJ)  # wrapped, then 400 J more
    after = poll(receiver)["intel-rapl:0"]
    # The counter's values are 0 … RANGE_UJ: from 100 J short of the top, 100 J and one µJ reach 0 again.
    assert after.energy_uj - first == 100_000_000 + 1 + 400_000_000
    assert after.counter_epoch == 0


def test_a_counter_that_goes_back_implausibly_is_a_reset_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = SteppedClock()
    telemetry = Telemetry(clock)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 200_000_000_000)
    receiver = make(tmp_path, clock, telemetry)
    before = poll(receiver)["intel-rapl:0"]
    clock.advance(5.0)
    # Back to 1 J: as a wrap it would be ~62 kJ in 5 s (12 kW), more than max_power_w: a reset.
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    with caplog.at_level(logging.WARNING):
        reset = poll(receiver)["intel-rapl:0"]
    assert reset.counter_epoch == 1
    assert reset.energy_uj == before.energy_uj  # that interval's energy is unknown: nothing added
    clock.advance(5.0)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 501_000_000)
    later = poll(receiver)["intel-rapl:0"]
    assert (later.counter_epoch, later.energy_uj - reset.energy_uj) == (1, 500_000_000)
    assert receiver.resets.value(path="intel-rapl:0") == 1
    warnings = [r.getMessage() for r in caplog.records if "counter reset" in r.getMessage()]
    assert len(warnings) == 1
    assert "intel-rapl:0/energy_uj went back from 200000000000 to 1000000" in warnings[0]


def test_going_back_with_no_wrap_range_is_a_reset(tmp_path: Path) -> None:
    clock = SteppedClock()
    write_zone(tmp_path, "intel-rapl:0", "package-0", 5_000_000, max_uj=None)
    receiver = make(tmp_path, clock)
    poll(receiver)
    clock.advance(5.0)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 4_999_000, max_uj=None)
    assert poll(receiver)["intel-rapl:0"].counter_epoch == 1


def test_no_powercap_tree_is_one_clear_line_no_records_and_the_field_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = SteppedClock()
    receiver = make(tmp_path / "nowhere", clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert poll(receiver) == {}
            clock.advance(120.0)  # past the rate-limited log's period: still one line (one episode)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert f"{tmp_path / 'nowhere' / 'class' / 'powercap'} does not exist" in lines[0]
    assert receiver.provides == frozenset()  # the batch then says "no CPU zones known", not "none"
    two_socket_tree(tmp_path / "nowhere")  # the driver appears later: found on the next tick
    assert len(poll(receiver)) == 7
    assert receiver.provides == frozenset({"cpu_zones"})


def test_a_tree_with_no_rapl_zones_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "class" / "powercap" / "dtpm").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        assert poll(make(tmp_path)) == {}
    assert ["no RAPL zones under" in r.getMessage() for r in caplog.records] == [True]


def test_root_only_energy_files_are_one_line_naming_paths_and_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_socket_tree(tmp_path)

    def root_only(path: str) -> int:
        if path.endswith("energy_uj"):
            raise PermissionError(13, "Permission denied", path)
        return read_int(path)

    monkeypatch.setattr("wattpipe.receivers.rapl.read_int", root_only)  # the tests run as root, which chmod cannot stop
    clock = SteppedClock()
    receiver = make(tmp_path, clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert poll(receiver) == {}
            clock.advance(120.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "cannot read energy_uj of intel-rapl:0, intel-rapl:0:0" in lines[0]
    assert "root only since Linux 5.10" in lines[0]
    assert receiver.provides == frozenset()
    described = receiver.describe()
    assert [z["readable"] for z in described["zones"]] == [False] * 7
    assert described["dropped_duplicates"] == ["intel-rapl-mmio:0"]
    # The probe's summary says it too, not "problem": null beside seven unreadable zones.
    assert described["problem"].startswith("no zone's energy_uj under")
    assert "root only since Linux 5.10" in described["problem"]
    assert described["problem"].endswith("no CPU energy")


def test_describe_shows_zones_counters_and_ranges(tmp_path: Path) -> None:
    two_socket_tree(tmp_path)
    described = make(tmp_path).describe()
    assert described["problem"] is None
    assert described["zones"][0] == {
        "path": "intel-rapl:0",
        "name": "package-0",
        "zone": "package",
        "socket": 0,
        "max_energy_range_uj": RANGE_UJ,
        "energy_uj": 1_000,
        "readable": True,
    }


def test_the_simulators_zones_wrap_mid_run_and_lose_nothing(tmp_path: Path) -> None:
    # A small range (500 J), so that each package wraps several times in a minute: energy_uj must follow the truth.
    data = {
        "node": {"name": "n1", "uptime_s": 100.0},
        "cpu": {
            "packages": 2,
            "cores": 8,
            "idle_w": 40.0,
            "w_per_core": 6.0,
            "dram_w": 3.0,
            "max_range_uj": 500_000_000,
        },
        "processes": [{"pid": 100, "comm": "busy", "cpu_cores": 4.0}],
    }
    clock = SteppedClock()
    node = simulator.build(parse_scenario(data), clock)
    writer = ProcfsWriter(node, tmp_path)
    receiver = make(tmp_path / "sys", clock)
    writer.refresh()
    first = poll(receiver)
    for _ in range(12):
        clock.advance(5.0)
        writer.refresh()
        last = poll(receiver)
    t_s = node.t_s()
    for package in (0, 1):
        truth_j = node.truth.cpu_package_energy_j(package, t_s) - node.truth.cpu_package_energy_j(package, 0.0)
        path = f"intel-rapl:{package}"
        measured_j = (last[path].energy_uj - first[path].energy_uj) / 1e6
        assert measured_j == pytest.approx(truth_j, abs=2e-6)  # µJ flooring at both ends
        assert last[path].counter_epoch == 0
        assert math.floor(truth_j * 1e6) > 3 * 500_000_000  # it wrapped three times (about 160 J per tick)
    assert (last["intel-rapl:1:0"].zone, last["intel-rapl:1:0"].socket) == ("dram", 1)


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(min_value=0, max_value=1_000_000),
    steps=st.lists(st.integers(min_value=0, max_value=999_999), min_size=1, max_size=40),
)
def test_any_run_of_rises_and_wraps_is_summed_exactly(start: int, steps: list[int]) -> None:
    range_uj = 1_000_000  # values 0 … range_uj; each step below one full range, at most one wrap per read
    counter = ZoneCounter(max_power_w=1e9)
    counter.update(start % (range_uj + 1), range_uj, 0.0)
    raw, first_total = start % (range_uj + 1), counter.total_uj
    for i, step in enumerate(steps, start=1):
        raw = (raw + step) % (range_uj + 1)
        assert counter.update(raw, range_uj, float(i)) in ("rise", "wrap")
    assert counter.total_uj - first_total == sum(steps)
    assert counter.epoch == 0


def test_the_factory_is_registered_as_rapl() -> None:
    factory = Registry.from_entry_points().get("receiver", "rapl")
    assert factory is not None
    assert factory.provides == frozenset({"cpu_zones"})


def test_this_machines_own_sys(caplog: pytest.LogCaptureFixture) -> None:
    """The receiver on the real /sys: zones with counters where RAPL is there and readable; otherwise the one
    clear line saying which path and why (RAPL is absent on most VMs and CI runners)."""
    receiver = make(Path("/sys"))
    described = receiver.describe()
    with caplog.at_level(logging.WARNING):
        zones = poll(receiver)
    lines = [r.getMessage() for r in caplog.records]
    if not described["zones"]:  # no powercap tree, or no RAPL zones in it
        assert described["problem"] is not None
        assert zones == {}
        assert len(lines) == 1
        assert "/sys/class/powercap" in lines[0]
        assert "no CPU energy" in lines[0]
        assert receiver.provides == frozenset()
    elif not any(z["readable"] for z in described["zones"]):  # energy_uj root-only and we are not root
        assert zones == {}
        assert len(lines) == 1
        assert "cannot read energy_uj of" in lines[0]
    else:
        assert zones
        assert all(z.energy_uj >= 0 for z in zones.values())
        assert {z.zone for z in zones.values()} <= {"package", "core", "uncore", "dram", "psys"}


def test_a_counter_that_goes_back_with_no_time_passed_is_a_reset() -> None:
    counter = ZoneCounter(max_power_w=5000.0)
    assert counter.update(900, 1_000, 10.0) == "first"
    assert counter.update(100, 1_000, 10.0) == "reset"  # a wrap needs time to happen
    assert (counter.total_uj, counter.epoch) == (900, 1)
    assert counter.update(150, 1_000, 11.0) == "rise"
    assert counter.total_uj == 950


def test_an_amd_zen_tree_reads_through_the_same_code(tmp_path: Path) -> None:
    # AMD Zen parts appear under the same intel-rapl control type (the kernel's intel_rapl_msr driver):
    # package-N per socket and a core sub-zone, no dram, and a 32-bit counter in 2^-16 J units, so
    # max_energy_range_uj is ~65.5 kJ: at 280 W it wraps every ~4 minutes, so wraps are routine there.
    amd_range_uj = 65_532_610_987
    clock = SteppedClock()
    for socket in (0, 1):
        write_zone(tmp_path, f"intel-rapl:{socket}", f"package-{socket}", amd_range_uj - 500_000_000, amd_range_uj)
        write_zone(tmp_path, f"intel-rapl:{socket}:0", "core", 1_000_000, amd_range_uj)
    receiver = make(tmp_path, clock)
    first = poll(receiver)
    assert {p: (z.zone, z.socket) for p, z in first.items()} == {
        "intel-rapl:0": ("package", 0),
        "intel-rapl:0:0": ("core", 0),
        "intel-rapl:1": ("package", 1),
        "intel-rapl:1:0": ("core", 1),
    }
    clock.advance(5.0)
    for socket in (0, 1):  # 1,400 J in 5 s: the packages wrap, the cores do not
        write_zone(tmp_path, f"intel-rapl:{socket}", f"package-{socket}", 900_000_000 - 1, amd_range_uj)
        write_zone(tmp_path, f"intel-rapl:{socket}:0", "core", 1_001_000_000, amd_range_uj)
    after = poll(receiver)
    for socket in (0, 1):
        package, core = f"intel-rapl:{socket}", f"intel-rapl:{socket}:0"
        assert after[package].energy_uj - first[package].energy_uj == 1_400_000_000
        assert after[core].energy_uj - first[core].energy_uj == 1_000_000_000
        assert after[package].counter_epoch == after[core].counter_epoch == 0
