"""The procfs receiver against the simulator's /proc tree, and against hand-written process directories."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.context import make_context
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.records import HostProcess, NodeCpuTime
from wattpipe.pipeline.records_cpu import ContainerCpuTime, CpuInfo
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.receivers.procfs import ProcfsConfig, ProcfsReceiver, factory, parse_stat
from wattpipe.receivers.procfs._proc import Scan
from wattpipe.simulator.fake_host import ProcfsWriter
from wattpipe.simulator.scenario import Scenario, parse_scenario

UPTIME_S = 1000.0
TICKS = 100  # the simulator writes USER_HZ = 100


def scenario_data(driver: str = "systemd", version: int = 2) -> dict[str, Any]:
    return {
        "node": {"name": "n1", "uptime_s": UPTIME_S, "cgroup_driver": driver, "cgroup_version": version},
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}],
        "pods": [
            {
                "name": "trainer",
                "namespace": "ml",
                "qos": "burstable",
                "containers": [{"name": "main", "runtime": "containerd", "devices": [{"gpu": 0}]}],
            },
            {"name": "server", "qos": "guaranteed", "containers": [{"name": "s", "runtime": "cri-o"}]},
            {"name": "batch", "qos": "besteffort", "containers": [{"name": "b", "runtime": "docker"}]},
        ],
        "processes": [
            {"pid": 4242, "comm": "python", "container": "ml/trainer/main", "gpu": 0, "cpu_cores": 1.5},
            {"pid": 5100, "comm": "tritonserver", "container": "default/server/s", "cpu_cores": 2.0, "start_s": 5},
            {"pid": 6000, "comm": "worker", "container": "default/batch/b", "cpu_cores": 0.5, "end_s": 20},
            {"pid": 812, "comm": "sshd", "cpu_cores": 0.25},
        ],
    }


class Sim:
    """A simulated node's /proc under tmp_path and a procfs receiver reading it."""

    def __init__(self, tmp_path: Path, data: dict[str, Any]) -> None:
        self.clock = SteppedClock()
        self.node = simulator.build(parse_scenario(data), self.clock)
        self.scenario: Scenario = self.node.scenario
        self.writer = ProcfsWriter(self.node, tmp_path)
        self.receiver = make_receiver(tmp_path / "proc", self.clock)

    def poll(self, advance_s: float = 0.0) -> dict[int, HostProcess]:
        self.clock.advance(advance_s)
        self.writer.refresh()
        return poll(self.receiver)

    def expected_identity(self, pid: int) -> tuple[str | None, str | None]:
        spec = next(p for p in self.scenario.processes if p.pid == pid)
        if spec.container is None:
            return None, None
        pod, container = self.scenario.container_ref(spec.container)
        return container.id, pod.uid


def make_receiver(root: Path, clock: SteppedClock | None = None, **options: Any) -> ProcfsReceiver:
    clock = clock or SteppedClock()
    ctx = make_context("procfs", "receiver", clock, telemetry=Telemetry(clock))
    return ProcfsReceiver(ProcfsConfig(root=str(root), **options), ctx, ticks_per_s=TICKS)


def poll(receiver: ProcfsReceiver) -> dict[int, HostProcess]:
    records = asyncio.run(receiver.collect())
    # The processes, then the node's CPU time where /proc/stat could be read (test_procfs_cpu.py), then the
    # node's CPUs where /proc/cpuinfo could be (test_procfs_cpuinfo.py).
    others = (NodeCpuTime, CpuInfo, ContainerCpuTime)  # and containers' CPU time (test_procfs_containercpu.py)
    assert all(isinstance(r, HostProcess) for r in records if not isinstance(r, others))
    return {r.pid: r for r in records if isinstance(r, HostProcess)}


def cpu_s(process: HostProcess) -> float:
    assert process.cpu_time_s is not None
    return process.cpu_time_s


def stat_line(pid: int, comm: str, *, utime: int = 0, stime: int = 0, start: int = 0) -> str:
    fields = [str(pid), f"({comm})", "S", "1", str(pid), str(pid), "0", "-1", "4194560", *(["0"] * 4)]
    fields += [str(utime), str(stime), "0", "0", "20", "0", "1", "0", str(start), "1000", "10", *(["0"] * 28)]
    return " ".join(fields) + "\n"


def write_process(
    root: Path, pid: int, comm: str, *, start: int = 100, utime: int = 0, cgroup: str = "0::/\n", exe: str | None = None
) -> Path:
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stat").write_text(stat_line(pid, comm, utime=utime, start=start))
    (directory / "comm").write_text(comm + "\n")
    (directory / "cgroup").write_text(cgroup)
    if exe is not None:
        (directory / "exe").symlink_to(exe)
    return directory


# --- against the simulator ----------------------------------------------------------------------


def test_each_process_has_its_comm_start_time_and_cpu_time(tmp_path: Path) -> None:
    sim = Sim(tmp_path, scenario_data())
    procs = sim.poll(advance_s=10.0)
    assert sorted(procs) == [812, 4242, 5100, 6000]
    assert {pid: p.comm for pid, p in procs.items()} == {
        812: "sshd",
        4242: "python",
        5100: "tritonserver",
        6000: "worker",
    }
    # starttime counts ticks since boot: (uptime + start_s) · 100.
    assert procs[4242].start_time_ticks == UPTIME_S * TICKS
    assert procs[5100].start_time_ticks == (UPTIME_S + 5) * TICKS
    # CPU time = cpu_cores × seconds alive.
    assert procs[4242].cpu_time_s == pytest.approx(15.0)
    assert procs[5100].cpu_time_s == pytest.approx(10.0)
    assert procs[812].cpu_time_s == pytest.approx(2.5)
    assert all(p.exe is None for p in procs.values())  # the simulator writes no exe link
    assert all(p.time == sim.clock.now() for p in procs.values())


def test_cpu_time_grows_with_the_clock(tmp_path: Path) -> None:
    sim = Sim(tmp_path, scenario_data())
    first = sim.poll(advance_s=10.0)
    second = sim.poll(advance_s=4.0)
    assert cpu_s(second[4242]) - cpu_s(first[4242]) == pytest.approx(1.5 * 4)
    assert cpu_s(second[5100]) - cpu_s(first[5100]) == pytest.approx(2.0 * 4)
    assert second[4242].start_time_ticks == first[4242].start_time_ticks


@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
@pytest.mark.parametrize("version", [2, 1])
def test_container_and_pod_come_from_the_cgroup(tmp_path: Path, driver: str, version: int) -> None:
    sim = Sim(tmp_path, scenario_data(driver, version))
    procs = sim.poll(advance_s=10.0)
    for pid in (4242, 5100, 6000):
        container_id, pod_uid = sim.expected_identity(pid)
        assert container_id is not None
        assert len(container_id) == 64
        assert (procs[pid].container_id, procs[pid].pod_uid) == (container_id, pod_uid)
    assert (procs[812].container_id, procs[812].pod_uid) == (None, None)


def test_processes_come_and_go_and_the_cache_follows(tmp_path: Path) -> None:
    sim = Sim(tmp_path, scenario_data())
    assert sorted(sim.poll()) == [812, 4242, 6000]  # 5100 starts at 5 s
    assert sorted(sim.poll(advance_s=10.0)) == [812, 4242, 5100, 6000]
    assert sorted(sim.poll(advance_s=15.0)) == [812, 4242, 5100]  # 6000 ended at 20 s
    assert sim.receiver.table.cached() == 3


def test_a_missing_root_is_one_warning_and_no_records(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    receiver = make_receiver(tmp_path / "host" / "proc")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert poll(receiver) == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "receiver procfs: cannot list" in warnings[0].getMessage()
    assert str(tmp_path / "host" / "proc") in warnings[0].getMessage()


def test_a_root_that_is_a_file_is_a_warning_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "proc").write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        assert poll(make_receiver(tmp_path / "proc")) == {}
    assert any("cannot list" in r.getMessage() for r in caplog.records)


# --- hand-written trees -------------------------------------------------------------------------

CID = "c0ffee" + "0" * 58
UID = "0f1e2d3c-4b5a-4987-8a6b-5c4d3e2f1a0b"


def test_identity_is_read_once_per_pid_and_start_time(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    cgroup = f"0::/kubepods/burstable/pod{UID}/{CID}\n"
    directory = write_process(proc, 300, "trainer", start=5_000, cgroup=cgroup, exe="/usr/bin/python3")
    receiver = make_receiver(proc)
    first = poll(receiver)[300]
    assert (first.comm, first.exe, first.container_id, first.pod_uid) == ("trainer", "/usr/bin/python3", CID, UID)

    # Same process (same start time and comm), CPU time moved on: identity comes from the cache.
    (directory / "cgroup").write_text("0::/system.slice/elsewhere.service\n")  # not read again
    (directory / "stat").write_text(stat_line(300, "trainer", utime=250, start=5_000))
    again = poll(receiver)[300]
    assert (again.comm, again.container_id, again.cpu_time_s) == ("trainer", CID, 2.5)

    # It renamed itself (prctl: its comm changed, its exe did not): its identity stands, its first comm too.
    (directory / "stat").write_text(stat_line(300, "renamed", utime=260, start=5_000))
    renamed = poll(receiver)[300]
    assert (renamed.comm, renamed.container_id, renamed.cpu_time_s) == ("trainer", CID, 2.6)
    # It exec'd (another exe): what it runs is read again (test_procfs_cpu.py).
    directory.joinpath("exe").unlink()
    directory.joinpath("exe").symlink_to("/usr/bin/bash")
    (directory / "stat").write_text(stat_line(300, "bash", utime=270, start=5_000))
    assert (poll(receiver)[300].comm, poll(receiver)[300].container_id) == ("bash", None)

    # The pid is reused by a new process (a later start time): everything is read afresh.
    directory.joinpath("exe").unlink()
    (directory / "cgroup").write_text("0::/system.slice/cron.service\n")
    (directory / "stat").write_text(stat_line(300, "renamed", utime=7, start=9_000))
    reused = poll(receiver)[300]
    assert (reused.comm, reused.exe, reused.start_time_ticks) == ("renamed", None, 9_000)
    assert (reused.container_id, reused.pod_uid, reused.cpu_time_s) == (None, None, 0.07)


def test_stat_with_spaces_and_parentheses_in_comm(tmp_path: Path) -> None:
    comm = "a) (b c) R 1 2"  # a hostile name that imitates the fields after it
    line = stat_line(77, comm, utime=30, stime=0, start=12_345)
    parsed = parse_stat(line)
    assert (parsed.comm, parsed.utime_ticks, parsed.start_time_ticks) == (comm, 30, 12_345)

    proc = tmp_path / "proc"
    write_process(proc, 77, comm, start=12_345, utime=30)
    record = poll(make_receiver(proc))[77]
    assert (record.comm, record.start_time_ticks, record.cpu_time_s) == (comm, 12_345, 0.3)


def test_the_simulators_stat_line_parses() -> None:
    # Field 22 (starttime) and 14/15 (utime, stime) as the kernel documents them (proc(5)).
    line = "4242 (python) R 1 4242 4242 0 -1 4194560 0 0 0 0 1350 150 0 0 20 0 2 0 360000 419430400 25600\n"
    assert parse_stat(line) == parse_stat(line.rstrip("\n"))
    assert (parse_stat(line).utime_ticks, parse_stat(line).stime_ticks, parse_stat(line).start_time_ticks) == (
        1350,
        150,
        360000,
    )


@pytest.mark.parametrize("text", ["", "12 python S 1", "12 (python) S 1 2 3", "12 (p) S " + "x " * 30])
def test_malformed_stat_lines_are_refused(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies by what is wrong
        parse_stat(text)


def test_a_process_that_vanishes_mid_read_is_skipped_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    write_process(proc, 10, "alive")
    half = write_process(proc, 11, "dying")
    (half / "cgroup").unlink()  # it exited between the stat read and the cgroup read
    (proc / "cpuinfo").write_text("processor : 0\n")  # a missing one is a debug line: this test wants none
    receiver = make_receiver(proc)
    # And pid 12 was listed, then exited before its stat was read.
    listed = receiver.table._pids
    monkeypatch.setattr(receiver.table, "_pids", lambda: [*listed(), 12])
    with caplog.at_level(logging.DEBUG, logger="wattpipe"):
        assert sorted(poll(receiver)) == [10]
    assert [r for r in caplog.records if r.name.startswith("wattpipe")] == []
    assert receiver.table.cached() == 1


def test_a_pid_reused_while_its_identity_is_read_is_not_cached_under_the_old_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    directory = write_process(proc, 10, "old", start=100)
    receiver = make_receiver(proc)
    table = receiver.table
    original = table._read_identity

    def swap_then_read(d: str, stat: Any, comm: str) -> Any:
        # Between the first stat read and the identity reads, pid 10 ends and a new process takes it.
        (directory / "stat").write_text(stat_line(10, "new", start=200))
        (directory / "comm").write_text("new\n")
        return original(d, stat, comm)

    with monkeypatch.context() as patch:
        patch.setattr(table, "_read_identity", swap_then_read)
        assert poll(receiver) == {}
    assert poll(receiver)[10].comm == "new"
    assert (directory / "comm").read_text() == "new\n"


def test_malformed_stat_is_a_warning_and_the_rest_still_flow(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = tmp_path / "proc"
    write_process(proc, 10, "good")
    bad = write_process(proc, 11, "bad")
    (bad / "stat").write_text("11 (bad) R\n")
    with caplog.at_level(logging.WARNING):
        assert sorted(poll(make_receiver(proc))) == [10]
    assert any("11/stat cannot be parsed" in r.getMessage() for r in caplog.records)


def test_non_process_entries_are_ignored(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_process(proc, 10, "p")
    (proc / "self").mkdir()
    (proc / "stat").write_text("cpu  1 2 3\n")
    (proc / ".11.new").mkdir()  # the simulator's staging directory
    assert sorted(poll(make_receiver(proc))) == [10]


def test_max_processes_bounds_a_scan_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = tmp_path / "proc"
    for pid in (30, 10, 20, 40):
        write_process(proc, pid, f"p{pid}")
    receiver = make_receiver(proc, max_processes=2)
    with caplog.at_level(logging.WARNING):
        assert sorted(poll(receiver)) == [10, 20]
    assert any("more than max_processes (2)" in r.getMessage() for r in caplog.records)


def test_a_scan_still_running_is_not_joined_by_a_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    write_process(proc, 10, "p")
    receiver = make_receiver(proc)
    release = threading.Event()
    real_scan = receiver.table.scan

    def hung_scan(now: Timestamp) -> Scan:
        release.wait(5.0)
        return real_scan(now)

    monkeypatch.setattr(receiver.table, "scan", hung_scan)

    async def two_ticks() -> list[int]:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(receiver.collect(), timeout=0.05)
        second = await receiver.collect()
        release.set()
        return [r.pid for r in second if isinstance(r, HostProcess)]

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(two_ticks()) == []
    assert any("still running" in r.getMessage() for r in caplog.records)
    assert receiver.provides == frozenset()  # that tick's processes are unknown, not "none": absent
    receiver._executor.shutdown(wait=True)


def test_this_hosts_own_proc(tmp_path: Path) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc on this system")
    clock = SteppedClock()
    ctx = make_context("procfs", "receiver", clock, telemetry=Telemetry(clock))
    receiver = ProcfsReceiver(ProcfsConfig(), ctx)  # SC_CLK_TCK from the system
    me = poll(receiver)[os.getpid()]
    assert me.comm
    assert me.start_time_ticks is not None
    assert me.start_time_ticks > 0
    assert me.cpu_time_s is not None
    assert me.cpu_time_s > 0
    assert me.exe is not None
    assert os.path.samefile(me.exe, f"/proc/{os.getpid()}/exe")
    asyncio.run(receiver.shutdown())


# --- the factory --------------------------------------------------------------------------------


def test_factory_defaults_and_registration() -> None:
    config = factory.default_config()
    assert isinstance(config, ProcfsConfig)
    assert (config.root, config.max_processes) == ("/proc", 10_000)
    assert (factory.type, factory.kind, factory.stability) == ("procfs", "receiver", "alpha")
    assert factory.provides == frozenset({"host_processes", "node_cpu", "cpu_info", "container_cpu"})
    receiver = factory.create(make_context("procfs", "receiver"), config)
    assert isinstance(receiver, ProcfsReceiver)
    assert receiver.provides == factory.provides
    assert Registry.from_entry_points().get("receiver", "procfs") is factory


def test_start_time_is_placed_on_the_wall_clock_from_uptime(tmp_path: Path) -> None:
    # A process that starts inside a tick is weighed from its start (issue 15.2): that needs the start in
    # Unix seconds, to the 10 ms /proc/uptime gives (btime is whole seconds).
    data = scenario_data()
    data["processes"][1]["start_s"] = 5.37
    sim = Sim(tmp_path, data)
    procs = sim.poll(advance_s=10.0)
    assert procs[5100].start_wall_s == pytest.approx(sim.node.wall_at(5.37), abs=0.02)
    assert procs[4242].start_wall_s == pytest.approx(sim.node.wall_at(0.0), abs=0.02)


def test_without_uptime_start_times_are_absent_not_guessed(tmp_path: Path) -> None:
    sim = Sim(tmp_path, scenario_data())
    sim.writer.refresh()
    (tmp_path / "proc" / "uptime").unlink()
    sim.clock.advance(1.0)
    scan = sim.receiver.table.scan(sim.clock.now())
    assert scan.records
    assert all(isinstance(r, HostProcess) and r.start_wall_s is None for r in scan.records)


def test_a_stat_emptied_while_the_identity_is_read_is_a_process_gone_silently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The kernel (and the simulator) answer an ended process's stat with nothing: between the first stat read
    # and the identity's check of it, pid 10 ends. Gone, not malformed.
    proc = tmp_path / "proc"
    directory = write_process(proc, 10, "ending")
    (proc / "cpuinfo").write_text("processor : 0\n")
    receiver = make_receiver(proc)
    table = receiver.table
    original = table._read_identity

    def end_then_read(d: str, stat: Any, comm: str) -> Any:
        (directory / "stat").write_text("")
        return original(d, stat, comm)

    monkeypatch.setattr(table, "_read_identity", end_then_read)
    with caplog.at_level(logging.DEBUG, logger="wattpipe"):
        assert poll(receiver) == {}
    assert [r.getMessage() for r in caplog.records if r.name.startswith("wattpipe")] == []
