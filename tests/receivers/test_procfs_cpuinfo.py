"""/proc/cpuinfo → CpuInfo records (Kepler's ``kepler_node_cpu_info``): a fixture's labels, the real machine's,
and how the procfs receiver reads it once and degrades where it is missing or unreadable."""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import re
import sys
from pathlib import Path

import pytest

from tests.receivers.test_procfs import Sim, make_receiver, scenario_data, write_process
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records_cpu import CpuInfo
from wattpipe.receivers.procfs import ProcfsReceiver, parse_cpuinfo

NOW = Timestamp(monotonic_s=10.0, wall_s=1_700_000_000.0)

# Two sockets, one core each with two hyperthreads (trimmed to the keys that matter, plus some that do not).
TWO_SOCKETS = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu vme de
power management:

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t\t: 0

processor\t: 2
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 1
core id\t\t: 0

processor\t: 3
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 1
core id\t\t: 0
"""

# An arm64 kernel: no vendor_id, model name, physical id or core id; a trailing block without a processor.
ARM = """\
processor\t: 0
BogoMIPS\t: 50.00
CPU implementer\t: 0x41
CPU part\t: 0xd0c

processor\t: 1
BogoMIPS\t: 50.00
CPU implementer\t: 0x41

Hardware\t: some board
"""


def labels(cpu: CpuInfo) -> tuple[str | None, ...]:
    return (cpu.processor, cpu.vendor_id, cpu.model_name, cpu.physical_id, cpu.core_id)


def test_each_processor_block_is_one_record_with_keplers_labels() -> None:
    cpus = parse_cpuinfo(TWO_SOCKETS, NOW)
    xeon = "Intel(R) Xeon(R) Platinum 8480+"
    assert [labels(c) for c in cpus] == [
        ("0", "GenuineIntel", xeon, "0", "0"),
        ("1", "GenuineIntel", xeon, "0", "0"),
        ("2", "GenuineIntel", xeon, "1", "0"),
        ("3", "GenuineIntel", xeon, "1", "0"),
    ]
    assert all(c.time == NOW for c in cpus)
    assert cpus[0].attributes() == {
        "processor": "0",
        "vendor_id": "GenuineIntel",
        "model_name": xeon,
        "physical_id": "0",
        "core_id": "0",
    }


def test_keys_an_architecture_does_not_write_are_absent_not_empty() -> None:
    cpus = parse_cpuinfo(ARM, NOW)
    assert [labels(c) for c in cpus] == [("0", None, None, None, None), ("1", None, None, None, None)]
    assert cpus[1].attributes() == {"processor": "1"}  # no empty labels
    (empty,) = parse_cpuinfo("processor : 7\nvendor_id :\nmodel name : \n", NOW)
    assert labels(empty) == ("7", None, None, None, None)


def test_a_file_that_names_no_processor_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match=r"no 'processor : <number>' line in 16 characters"):
        parse_cpuinfo("Hardware : board", NOW)
    with pytest.raises(ValueError, match="no 'processor"):
        parse_cpuinfo("processor : x\n", NOW)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads this machine's /proc")
def test_the_real_machines_cpuinfo_lists_the_cpus_proc_stat_does() -> None:
    cpus = parse_cpuinfo(Path("/proc/cpuinfo").read_text(), NOW)
    # /proc/stat's cpuN lines are the online CPUs too: an independent source for their numbers.
    online = {m.group(1) for m in re.finditer(r"^cpu(\d+) ", Path("/proc/stat").read_text(), re.MULTILINE)}
    assert {c.processor for c in cpus} == online
    assert len(cpus) <= (os.cpu_count() or 0)
    if os.uname().machine in ("x86_64", "i686"):  # x86 kernels write these for every CPU
        assert all(c.vendor_id in ("GenuineIntel", "AuthenticAMD", "HygonGenuine") for c in cpus)
        assert all(c.model_name for c in cpus)


def cpu_info(receiver: ProcfsReceiver) -> list[CpuInfo]:
    return [r for r in asyncio.run(receiver.collect()) if isinstance(r, CpuInfo)]


def test_the_receiver_reads_cpuinfo_once_and_gives_it_every_tick(tmp_path: Path) -> None:
    write_process(tmp_path, 10, "alive")
    (tmp_path / "cpuinfo").write_text(TWO_SOCKETS)
    receiver = make_receiver(tmp_path)
    first = cpu_info(receiver)
    assert [c.processor for c in first] == ["0", "1", "2", "3"]
    assert "cpu_info" in receiver.provides
    (tmp_path / "cpuinfo").write_text(ARM)  # it does not change on a running node: not read again
    receiver.clock.advance(5.0)  # type: ignore[attr-defined]
    second = cpu_info(receiver)
    assert [labels(c) for c in second] == [labels(c) for c in first]
    assert all(map(operator.is_, second, first))  # the very records read at first (OTLP sends them at each tick)


def test_no_cpuinfo_means_no_records_and_cpu_info_absent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_process(tmp_path, 10, "alive")
    receiver = make_receiver(tmp_path)
    with caplog.at_level(logging.DEBUG):
        assert cpu_info(receiver) == []
    assert "cpu_info" not in receiver.provides  # absent, not empty
    assert any(f"no {tmp_path / 'cpuinfo'}: no CPU info" in r.getMessage() for r in caplog.records)
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)


def test_an_unparsable_cpuinfo_is_one_warning_naming_the_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_process(tmp_path, 10, "alive")
    (tmp_path / "cpuinfo").write_text("garbage\n")
    receiver = make_receiver(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert cpu_info(receiver) == []
        assert cpu_info(receiver) == []
    warnings = [r.getMessage() for r in caplog.records if "cpuinfo" in r.getMessage()]
    assert warnings == [
        f"receiver procfs: {tmp_path / 'cpuinfo'}: no 'processor : <number>' line in 8 characters; "
        "no kepler_node_cpu_info"
    ]
    assert "cpu_info" not in receiver.provides


def test_the_simulators_proc_has_a_cpuinfo_of_its_scenarios_cpus(tmp_path: Path) -> None:
    # configs/scenarios/cpu.yaml's shape: 2 packages, 32 logical CPUs, 16 on each.
    data = scenario_data()
    data["cpu"] = {"packages": 2, "cores": 32}
    sim = Sim(tmp_path, data)
    sim.writer.cpuinfo = True  # opt-in
    sim.poll(advance_s=5.0)
    cpus = asyncio.run(sim.receiver.collect())
    info = [c for c in cpus if isinstance(c, CpuInfo)]
    assert [c.processor for c in info] == [str(n) for n in range(32)]
    assert [(c.physical_id, c.core_id) for c in info] == [(str(n // 16), str(n % 16)) for n in range(32)]
    assert {(c.vendor_id, c.model_name) for c in info} == {("GenuineIntel", "wattpipe simulated CPU")}
    assert "cpu_info" in sim.receiver.provides


def test_the_simulator_keeps_a_cpuinfo_already_in_its_proc(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text("processor\t: 0\nmodel name\t: a test's own\n\n")
    sim = Sim(tmp_path, scenario_data())
    sim.writer.cpuinfo = True
    sim.poll(advance_s=5.0)
    info = [c for c in asyncio.run(sim.receiver.collect()) if isinstance(c, CpuInfo)]
    assert [(c.processor, c.model_name) for c in info] == [("0", "a test's own")]
