"""What the procfs receiver adds for CPU attribution: node CPU time, VM identity, and the cheap mode that
reads a process once (``cpu_time: false``)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.receivers.test_procfs import TICKS, Sim, make_receiver, poll, scenario_data, stat_line, write_process
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import HostProcess, NodeCpuTime
from wattpipe.receivers.procfs import ProcfsReceiver, _proc
from wattpipe.receivers.procfs._stat import parse_proc_stat
from wattpipe.receivers.procfs._statfiles import StatFiles
from wattpipe.receivers.procfs._vm import looks_like_qemu, parse_qemu_cmdline

T = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)
LIBVIRT = [
    "/usr/bin/qemu-system-x86_64",
    "-name",
    "guest=web-01,debug-threads=on",
    "-S",
    "-machine",
    "pc-q35-8.2,usb=off,dump-guest-core=off",
    "-accel",
    "kvm",
    "-uuid",
    "6f0e2a8c-9a7d-4d5e-8f3b-2c1d0e9f8a7b",
    "-smp",
    "4",
]


def node_cpu(receiver: ProcfsReceiver) -> NodeCpuTime | None:
    records = asyncio.run(receiver.collect())
    found = [r for r in records if isinstance(r, NodeCpuTime)]
    assert len(found) <= 1
    return found[0] if found else None


# --- /proc/stat ----------------------------------------------------------------------------------


def test_proc_stat_total_and_active_in_seconds() -> None:
    text = (
        "cpu  1000 50 300 8000 200 10 20 5 400 0\n"  # user nice system idle iowait irq softirq steal guest guest_nice
        "cpu0 500 25 150 4000 100 5 10 3 200 0\n"
        "cpu1 500 25 150 4000 100 5 10 2 200 0\n"
        "intr 12345 0 0\nctxt 999\nbtime 1700000000\n"
    )
    cpu = parse_proc_stat(text, 100, T)
    # total = user..steal (guest is inside user already); active = total - idle - iowait
    assert cpu.total_s == pytest.approx(95.85)
    assert cpu.active_s == pytest.approx(95.85 - 80.0 - 2.0)
    assert cpu.cpu_count == 2
    assert cpu.attributes() == {}


def test_proc_stat_with_no_cpu_line_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="no aggregate 'cpu' line"):
        parse_proc_stat("intr 1\n", 100, T)
    with pytest.raises(ValueError, match="non-number"):
        parse_proc_stat("cpu  1 2 x 4\n", 100, T)


def test_node_cpu_time_follows_the_simulators_truth(tmp_path: Path) -> None:
    sim = Sim(tmp_path, scenario_data())
    sim.writer.refresh()
    first = node_cpu(sim.receiver)
    sim.clock.advance(10.0)
    sim.writer.refresh()
    second = node_cpu(sim.receiver)
    assert first is not None
    assert second is not None
    cores = sim.scenario.cpu.cores
    assert second.total_s - first.total_s == pytest.approx(10.0 * cores, abs=2 / TICKS)
    truth_s = sim.node.truth.cpu_busy_core_s(10.0) - sim.node.truth.cpu_busy_core_s(0.0)
    assert second.active_s - first.active_s == pytest.approx(truth_s, abs=2 / TICKS)
    assert second.cpu_count == cores
    assert sim.receiver.provides == frozenset({"host_processes", "node_cpu"})


def test_an_unparsable_proc_stat_is_a_warning_and_node_cpu_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_process(tmp_path, 10, "alive")
    (tmp_path / "stat").write_text("garbage\n")
    receiver = make_receiver(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert node_cpu(receiver) is None
    assert any(
        "stat cannot be parsed (no aggregate 'cpu' line); no node CPU time" in r.getMessage() for r in caplog.records
    )
    assert receiver.provides == frozenset({"host_processes"})  # absent, not empty


# --- VMs -----------------------------------------------------------------------------------------


def test_a_libvirt_qemu_is_a_kvm_vm_with_its_uuid_and_guest_name() -> None:
    vm = parse_qemu_cmdline("\0".join(LIBVIRT) + "\0")
    assert vm is not None
    assert (vm.vm_id, vm.vm_name, vm.hypervisor) == ("6f0e2a8c-9a7d-4d5e-8f3b-2c1d0e9f8a7b", "web-01", "kvm")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["qemu-system-aarch64", "-name", "plain", "-uuid", "u-1"], ("u-1", "plain", "qemu")),  # emulated: no KVM
        (["qemu-kvm", "--name", "a,,b,process=x"], (None, "a,b", "kvm")),  # ",," is a comma; no -uuid
        (["qemu-system-x86_64", "-enable-kvm", "-uuid", "u-2"], ("u-2", None, "kvm")),
        (["qemu-system-x86_64", "-machine", "q35,accel=kvm", "-name", "guest=g"], (None, "g", "kvm")),
    ],
)
def test_qemu_command_line_forms(args: list[str], expected: tuple[str | None, str | None, str]) -> None:
    vm = parse_qemu_cmdline("\0".join(args))
    assert vm is not None
    assert (vm.vm_id, vm.vm_name, vm.hypervisor) == expected


def test_what_is_not_a_vm() -> None:
    assert parse_qemu_cmdline("") is None  # a kernel thread
    assert parse_qemu_cmdline("python\0-uuid\0x\0") is None
    assert looks_like_qemu("qemu-system-x86", None)
    assert looks_like_qemu("worker", "/usr/libexec/qemu-kvm")
    assert not looks_like_qemu("kvm-pit/1234", None)  # a KVM kernel thread, not a VM
    assert not looks_like_qemu("python", "/usr/bin/python3")


def test_the_receiver_names_a_qemu_processs_vm_and_reads_no_cmdline_of_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vm_dir = write_process(tmp_path, 300, "qemu-system-x86")
    (vm_dir / "cmdline").write_text("\0".join(LIBVIRT) + "\0")
    other = write_process(tmp_path, 301, "python")
    (other / "cmdline").write_text("python\0-uuid\0nope\0")
    reads: list[str] = []
    real = _proc._read

    def counting(path: str) -> str:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(_proc, "_read", counting)
    procs = poll(make_receiver(tmp_path))
    assert (procs[300].vm_id, procs[300].vm_name, procs[300].hypervisor) == (
        "6f0e2a8c-9a7d-4d5e-8f3b-2c1d0e9f8a7b",
        "web-01",
        "kvm",
    )
    assert (procs[301].vm_id, procs[301].vm_name, procs[301].hypervisor) == (None, None, None)
    assert [p for p in reads if p.endswith("cmdline")] == [f"{tmp_path}/300/cmdline"]


def test_a_simulated_qemu_process_is_a_vm(tmp_path: Path) -> None:
    data = scenario_data()
    data["processes"].append({"pid": 7000, "comm": "qemu-system-x86", "cmdline": LIBVIRT, "cpu_cores": 2.0})
    procs = Sim(tmp_path, data).poll(advance_s=5.0)
    assert (procs[7000].vm_id, procs[7000].vm_name, procs[7000].hypervisor) == (
        "6f0e2a8c-9a7d-4d5e-8f3b-2c1d0e9f8a7b",
        "web-01",
        "kvm",
    )
    assert procs[7000].cpu_time_s == pytest.approx(10.0, abs=0.02)


# --- cpu_time: false -----------------------------------------------------------------------------


def test_cpu_time_off_reads_a_known_process_never_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for pid in (10, 11, 12):
        write_process(tmp_path, pid, f"p{pid}", utime=100)
    reads: list[str] = []
    real = _proc._read

    def counting(path: str) -> str:
        reads.append(path.removeprefix(f"{tmp_path}/"))
        return real(path)

    monkeypatch.setattr(_proc, "_read", counting)
    read_stat = StatFiles.read

    def counting_stat(files: StatFiles, pid: int) -> bytes:
        reads.append(f"{pid}/stat")
        return read_stat(files, pid)

    monkeypatch.setattr(StatFiles, "read", counting_stat)
    receiver = make_receiver(tmp_path, cpu_time=False)
    first = poll(receiver)
    assert sorted(first) == [10, 11, 12]
    assert all(p.cpu_time_s is None for p in first.values())  # absent: not read per tick
    reads.clear()
    write_process(tmp_path, 13, "p13")
    (tmp_path / "11" / "stat").unlink()
    (tmp_path / "11" / "comm").unlink()
    (tmp_path / "11" / "cgroup").unlink()
    (tmp_path / "11").rmdir()  # pid 11 ended
    second = poll(receiver)
    assert sorted(second) == [10, 12, 13]
    assert second[10] is first[10]  # the very record: nothing read again
    # Only the new process's files (stat twice: the identity is checked against its start time; its comm is
    # the stat line's), the node's /proc/stat and uptime.
    assert sorted(reads) == ["13/cgroup", "13/stat", "13/stat", "stat", "uptime"]


def test_cpu_time_off_gives_the_gpu_path_the_same_identities(tmp_path: Path) -> None:
    data = scenario_data()
    on, off = Sim(tmp_path / "on", data), Sim(tmp_path / "off", data)
    off.receiver = make_receiver(tmp_path / "off" / "proc", off.clock, cpu_time=False)
    for advance_s in (0.0, 5.0, 5.0, 10.0):  # worker (pid 6000) ends at 20 s, tritonserver starts at 5 s
        a, b = on.poll(advance_s), off.poll(advance_s)
        assert sorted(a) == sorted(b)
        for pid in a:
            assert a[pid].cpu_time_s is not None
            assert b[pid].cpu_time_s is None
            assert _gpu_view(a[pid]) == _gpu_view(b[pid])


def _gpu_view(p: HostProcess) -> tuple[Any, ...]:
    return (p.pid, p.comm, p.exe, p.start_time_ticks, p.container_id, p.container_runtime, p.pod_uid, p.start_wall_s)


# --- this machine's own /proc --------------------------------------------------------------------


def test_the_real_proc_has_node_cpu_time_and_this_process() -> None:
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # spend some CPU, so that this process has some to show
        pass
    receiver = make_receiver(Path("/proc"), SteppedClock())
    receiver.table.clock_ticks_per_s = os.sysconf("SC_CLK_TCK")
    records = asyncio.run(receiver.collect())
    receiver.table.close()  # the stat files it kept open
    cpu = [r for r in records if isinstance(r, NodeCpuTime)]
    assert len(cpu) == 1
    assert 0 < cpu[0].active_s < cpu[0].total_s
    assert cpu[0].cpu_count == os.cpu_count()
    me = [r for r in records if isinstance(r, HostProcess) and r.pid == os.getpid()]
    assert len(me) == 1
    assert me[0].cpu_time_s is not None
    assert me[0].cpu_time_s > 0
    assert me[0].comm is not None


def test_cpu_time_off_tries_an_unreadable_process_again_and_keeps_the_lowest_pids(tmp_path: Path) -> None:
    for pid in (20, 30, 40):
        write_process(tmp_path, pid, f"p{pid}")
    (tmp_path / "30" / "stat").write_text("garbage")
    receiver = make_receiver(tmp_path, cpu_time=False, max_processes=3)
    assert sorted(poll(receiver)) == [20, 40]
    write_process(tmp_path, 30, "p30")  # readable now: read on the next scan, though the listing is the same
    assert sorted(poll(receiver)) == [20, 30, 40]
    write_process(tmp_path, 10, "p10")  # four processes, three allowed: the lowest pids, as with cpu_time on
    assert sorted(poll(receiver)) == [10, 20, 30]
    assert sorted(poll(make_receiver(tmp_path, max_processes=3))) == [10, 20, 30]


def test_cpu_time_off_over_max_processes_still_reads_only_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for pid in (10, 20, 30):
        write_process(tmp_path, pid, f"p{pid}")
    receiver = make_receiver(tmp_path, cpu_time=False, max_processes=2)
    first = poll(receiver)
    assert sorted(first) == [10, 20]
    write_process(tmp_path, 40, "p40")  # a new one, over the limit: the scan is whole again, but reads nothing known
    reads: list[str] = []
    real = StatFiles.read

    def counting(files: StatFiles, pid: int) -> bytes:
        reads.append(str(pid))
        return real(files, pid)

    monkeypatch.setattr(StatFiles, "read", counting)
    second = poll(receiver)
    assert sorted(second) == [10, 20]
    assert second[10] is first[10]
    assert reads == []


def test_a_process_whose_stat_did_not_change_keeps_its_record(tmp_path: Path) -> None:
    """Not a byte of a sleeping process's stat changes between two reads: its last record is handed on (the
    very object: no parse, no new record); one whose stat changed, or a pid taken by a new process, is read."""
    write_process(tmp_path, 10, "asleep", utime=100, start=100)
    write_process(tmp_path, 11, "busy", utime=100, start=100)
    receiver = make_receiver(tmp_path, cgroup_root="")  # every stat read every tick
    poll(receiver)  # first seen: its identity read (the line is remembered from its next read on)
    first = poll(receiver)
    second = poll(receiver)
    assert second[10] is first[10]
    assert second[11] is first[11]
    write_process(tmp_path, 11, "busy", utime=250, start=100)
    third = poll(receiver)
    assert third[10] is first[10]
    assert third[11] is not second[11]
    assert third[11].cpu_time_s == 2.5
    write_process(tmp_path, 10, "asleep", utime=100, start=777)  # the pid reused, the same CPU time by chance
    fourth = poll(receiver)
    assert fourth[10].start_time_ticks == 777
    assert fourth[10] is not first[10]


CONTAINER = "a" * 64
SHIM = "0::/system.slice/containerd.service\n"
POD = "0f3e2d1c-aaaa-bbbb-cccc-1234567890ab"
IN_POD = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n"


def _exec(root: Path, pid: int, comm: str, exe: str, *, utime: int, cgroup: str) -> None:
    """What execve does to a process's files: a new comm and exe; the same pid and start time."""
    (root / str(pid) / "exe").unlink()
    write_process(root, pid, comm, utime=utime, start=100, cgroup=cgroup, exe=exe)


def test_a_process_that_execs_is_described_by_what_it_runs_now(tmp_path: Path) -> None:
    """A container's first process is ``runc:[2:INIT]`` (exe runc) until its runtime starts it, which can be
    seconds (create, then start): a scan then reads it as runc. exec keeps its pid and start time but changes
    comm and exe (and here its cgroup, as a runtime that moves it late would): its records follow."""
    write_process(tmp_path, 10, "runc:[2:INIT]", utime=0, start=100, cgroup=SHIM, exe="/usr/bin/runc")
    receiver = make_receiver(tmp_path, cgroup_root="")
    for _ in range(2):  # read, then again with its stat file kept open
        assert (poll(receiver)[10].comm, poll(receiver)[10].container_id) == ("runc:[2:INIT]", None)
    _exec(tmp_path, 10, "python3", "/usr/bin/python3", utime=300, cgroup=IN_POD)
    after = poll(receiver)[10]
    assert (after.comm, after.exe, after.container_id, after.pod_uid) == ("python3", "/usr/bin/python3", CONTAINER, POD)
    assert after.cpu_time_s == 3.0
    assert poll(receiver)[10].comm == "python3"


def test_a_kernel_thread_whose_comm_changes_is_not_read_again(tmp_path: Path) -> None:
    """A workqueue worker's comm names the work it does now (``kworker/1:2-events``, then ``-mm_percpu_wq``):
    a kernel thread never execs, so its identity stands (no reads, no new labels for each piece of work)."""
    kthread = stat_line(7, "kworker/1:2-events", utime=5, start=3).replace(" 4194560 ", f" {0x04208040} ")
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text(kthread)
    (tmp_path / "7" / "cgroup").write_text("0::/\n")
    receiver = make_receiver(tmp_path, cgroup_root="")
    assert poll(receiver)[7].comm == "kworker/1:2-events"
    (tmp_path / "7" / "cgroup").unlink()  # read again, it would make the process unreadable
    (tmp_path / "7" / "stat").write_text(kthread.replace("-events)", "-mm_percpu_wq)").replace(" 5 ", " 9 ", 1))
    after = poll(receiver)[7]
    assert (after.comm, after.cpu_time_s) == ("kworker/1:2-events", 0.09)
