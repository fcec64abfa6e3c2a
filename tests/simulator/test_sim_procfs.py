"""/proc and /sys written by the simulator, read back with plain file reads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.simulator.conftest import SCENARIOS, two_gpu_data
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.fake_host import CLOCK_TICKS_PER_S, ProcfsWriter, cgroup_path
from wattpipe.simulator.scale import scale_scenario
from wattpipe.simulator.scenario import Scenario, load_scenario, parse_scenario


def _stat_fields(root: Path, pid: int) -> list[str]:
    text = (root / "proc" / str(pid) / "stat").read_text()
    comm_end = text.rindex(")")
    return [text[: text.index(" ")], text[text.index("(") : comm_end + 1], *text[comm_end + 2 :].split()]


def test_process_files_track_cpu_time_and_identity(tmp_path: Path, two_gpu: Scenario) -> None:
    clock = SteppedClock()
    node = simulator.build(two_gpu, clock)
    writer = ProcfsWriter(node, tmp_path)
    clock.advance(12.5)
    writer.refresh()
    fields = _stat_fields(tmp_path, 101)
    assert len(fields) == 52
    assert fields[1] == "(python)"
    utime, stime, starttime = int(fields[13]), int(fields[14]), int(fields[21])
    # 0.5 cores for 12.5 s: 625 ticks, 90 % user; each truncated apart (test_sim_procfs_rough.py), one short
    assert (utime, stime) == (562, 62)
    assert utime + stime == int(0.5 * 12.5 * CLOCK_TICKS_PER_S) - 1
    assert starttime == 100 * CLOCK_TICKS_PER_S  # started at scenario start, uptime_s = 100
    assert (tmp_path / "proc" / "101" / "comm").read_text() == "python\n"
    assert (tmp_path / "proc" / "101" / "cmdline").read_bytes() == b"python\0"


def test_ended_processes_disappear(tmp_path: Path, two_gpu: Scenario) -> None:
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(two_gpu, clock), tmp_path)
    writer.refresh()
    assert (tmp_path / "proc" / "101").is_dir()
    clock.advance(31)  # pid 101 ends at 30 s
    writer.refresh()
    assert not (tmp_path / "proc" / "101").exists()
    assert (tmp_path / "proc" / "100").is_dir()


def test_cgroup_paths_have_each_runtimes_real_shape() -> None:
    scenario = load_scenario(SCENARIOS / "timesliced.yaml")
    by_pid = {p.pid: p for p in scenario.processes}
    trainer = scenario.pods[0]
    uid_ = trainer.uid.replace("-", "_")
    assert cgroup_path(scenario, by_pid[4242]) == (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/"
        f"cri-containerd-{trainer.containers[0].id}.scope"
    )
    inference = scenario.pods[1]  # guaranteed QoS, CRI-O
    assert cgroup_path(scenario, by_pid[5100]) == (
        f"/kubepods.slice/kubepods-pod{inference.uid.replace('-', '_')}.slice/crio-{inference.containers[0].id}.scope"
    )
    assert cgroup_path(scenario, by_pid[812]) == "/system.slice/sshd.service"


def test_cgroupfs_driver_and_cgroup_v1(tmp_path: Path) -> None:
    data = two_gpu_data()
    data["node"].update(cgroup_driver="cgroupfs", cgroup_version=1)
    data["pods"][0]["containers"][0]["runtime"] = "docker"
    scenario = parse_scenario(data)
    pod = scenario.pods[0]
    expected = f"/kubepods/burstable/pod{pod.uid}/{pod.containers[0].id}"
    writer = ProcfsWriter(simulator.build(scenario, SteppedClock()), tmp_path)
    writer.refresh()
    lines = (tmp_path / "proc" / "100" / "cgroup").read_text().splitlines()
    assert f"11:memory:{expected}" in lines
    assert lines[-1] == "0::/"
    assert all(line.endswith(expected) for line in lines[:-1])


def _energy_uj(root: Path, zone: str) -> int:
    return int((root / "sys" / "class" / "powercap" / zone / "energy_uj").read_text())


def test_rapl_energy_follows_cpu_load_and_wraps(tmp_path: Path, two_gpu: Scenario) -> None:
    clock = SteppedClock()
    node = simulator.build(two_gpu, clock)
    writer = ProcfsWriter(node, tmp_path)
    max_uj = two_gpu.cpu.max_range_uj  # 1,000 J: wraps every ~50 s at this node's package power
    zone = tmp_path / "sys" / "class" / "powercap" / "intel-rapl:1"
    writer.refresh()
    assert (zone / "name").read_text() == "package-1\n"
    assert int((zone / "max_energy_range_uj").read_text()) == max_uj
    previous = _energy_uj(tmp_path, "intel-rapl:1")
    total_uj = 0
    for _ in range(12):
        before = node.t_s()
        clock.advance(7.0)
        writer.refresh()
        now = _energy_uj(tmp_path, "intel-rapl:1")
        assert 0 <= now <= max_uj
        delta = now - previous if now >= previous else now + max_uj + 1 - previous  # one wrap at most
        true_uj = (node.truth.cpu_package_energy_j(1, node.t_s()) - node.truth.cpu_package_energy_j(1, before)) * 1e6
        assert delta == pytest.approx(true_uj, abs=1)
        total_uj += delta
        previous = now
    assert total_uj > max_uj  # it did wrap


def test_proc_stat_counts_busy_and_idle_ticks(tmp_path: Path, two_gpu: Scenario) -> None:
    clock = SteppedClock()
    node = simulator.build(two_gpu, clock)
    writer = ProcfsWriter(node, tmp_path)
    clock.advance(40)
    writer.refresh()
    first = (tmp_path / "proc" / "stat").read_text().splitlines()[0].split()
    assert first[0] == "cpu"
    user, system, idle = int(first[1]), int(first[3]), int(first[4])
    busy_ticks = (1.75 * 30 + 1.25 * 10) * CLOCK_TICKS_PER_S
    assert user + system == int(busy_ticks)
    assert user + system + idle == (100 + 40) * 8 * CLOCK_TICKS_PER_S  # uptime × cores


def test_pipelines_refreshing_at_once_write_each_time_once(tmp_path: Path, two_gpu: Scenario) -> None:
    # Every pipeline of a simulated node refreshes /proc before its tick, on a worker thread.
    clock = SteppedClock()
    node = simulator.build(two_gpu, clock)
    writer = ProcfsWriter(node, tmp_path)
    writes: list[float] = []
    real_write = writer._write

    def counted(t_s: float) -> None:
        writes.append(t_s)
        real_write(t_s)

    writer._write = counted  # type: ignore[method-assign]
    clock.advance(5.0)
    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(lambda _: writer.refresh(), range(8))) == {5.0}
    clock.advance(5.0)
    writer.refresh()
    assert writes == [5.0, 10.0]
    assert int(_stat_fields(tmp_path, 101)[13]) + int(_stat_fields(tmp_path, 101)[14]) == int(
        0.5 * 10 * CLOCK_TICKS_PER_S
    )


def test_cgroup_usage_counts_descendants_and_kernel_threads_live_in_the_root(tmp_path: Path) -> None:
    """As the kernel keeps cpu.stat: a cgroup's usage_usec is its own processes' and its descendants' CPU time,
    so the root's is every process's; scale_scenario's kernel threads sit in the root cgroup, and the host
    process count stays what was asked."""
    scenario = scale_scenario(mig_gpus=0, timesliced_gpus=0, host_processes=20, kernel_threads=10)
    assert len(scenario.processes) == 20
    kworkers = [p for p in scenario.processes if p.comm.startswith("kworker/")]
    assert len(kworkers) == 10
    assert {p.cgroup for p in kworkers} == {"/"}
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(scenario, clock), tmp_path, cgroups=True)
    clock.advance(100.0)
    writer.refresh()
    cgroups = tmp_path / "sys" / "fs" / "cgroup"

    def usage_usec(path: str) -> int:
        return int((cgroups / path.lstrip("/") / "cpu.stat").read_text().split()[1])

    truth = {p.pid: writer.node.truth.process_cpu_s(p.pid, 100.0) for p in scenario.processes}
    services = {p.pid for p in scenario.processes if p.cgroup is None}
    assert usage_usec("/system.slice") == pytest.approx(sum(truth[pid] for pid in services) * 1e6, abs=10)
    assert usage_usec("/") == pytest.approx(sum(truth.values()) * 1e6, abs=10)
    assert usage_usec("/") > usage_usec("/system.slice") > 0  # one kernel thread in ten wakes
    assert (cgroups / "cgroup.controllers").is_file()


def test_a_process_is_its_runtimes_init_until_it_execs(tmp_path: Path) -> None:
    """``init``: a container's process is runc's (``runc:[2:INIT]``, ``runc init``) from its start until its
    runtime starts it at ``exec_s``; then exec gives it its own comm and cmdline, the same pid and start time."""
    data = two_gpu_data()
    data["processes"][0]["init"] = {"exec_s": 4.0}
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(parse_scenario(data), clock), tmp_path)
    writer.refresh()
    directory = tmp_path / "proc" / "100"
    before = _stat_fields(tmp_path, 100)
    assert (before[1], (directory / "comm").read_text()) == ("(runc:[2:INIT])", "runc:[2:INIT]\n")
    assert (directory / "cmdline").read_bytes() == b"runc\0init\0"
    clock.advance(5.0)
    writer.refresh()
    after = _stat_fields(tmp_path, 100)
    assert (after[1], (directory / "comm").read_text()) == ("(python)", "python\n")
    assert (directory / "cmdline").read_bytes() == b"python\0"
    assert after[21] == before[21]  # the same start time: the same process


def test_an_init_that_execs_outside_the_processs_life_is_refused() -> None:
    data = two_gpu_data()
    data["processes"][1]["init"] = {"exec_s": 40.0}  # pid 101 ends at 30 s
    with pytest.raises(ValueError, match="exec_s"):
        parse_scenario(data)


def test_a_procfs_fault_takes_proc_away_and_brings_it_back_as_the_processes_are_then(
    tmp_path: Path, two_gpu: Scenario
) -> None:
    faulty = two_gpu.model_copy(
        update={
            "faults": [
                *two_gpu.faults,
                *parse_scenario({"faults": [{"at_s": 10, "for_s": 5, "target": "procfs"}]}).faults,
            ]
        }
    )
    clock = SteppedClock()
    node = simulator.build(faulty, clock)
    writer = ProcfsWriter(node, tmp_path)
    clock.advance(5.0)
    writer.refresh()
    before = int(_stat_fields(tmp_path, 101)[13]) + int(_stat_fields(tmp_path, 101)[14])
    clock.advance(6.0)  # 11 s: inside the fault
    writer.refresh()
    assert not (tmp_path / "proc").exists()  # a reader lists nothing and reads no /proc/stat
    clock.advance(5.0)  # 16 s: back
    writer.refresh()
    after = int(_stat_fields(tmp_path, 101)[13]) + int(_stat_fields(tmp_path, 101)[14])
    assert after - before == pytest.approx(0.5 * 11.0 * CLOCK_TICKS_PER_S, abs=2)  # it ran on meanwhile
    assert (tmp_path / "proc" / "stat").is_file()
