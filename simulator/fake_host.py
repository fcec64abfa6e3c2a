"""/proc and /sys as files in a directory, written from the ground truth at the clock's time.

``ProcfsWriter(node, root).refresh()`` makes ``root/proc`` and ``root/sys`` look like a node's at scenario
time ``node.t_s()``: a directory per live process (``stat``, ``comm``, ``cmdline``, ``cgroup``),
``/proc/stat`` and ``/proc/uptime``, and RAPL zones under ``/sys/class/powercap`` whose ``energy_uj``
wraps at ``max_energy_range_uj`` like the MSR-backed counter. Files are replaced atomically, so a
reader never sees half a file. Processes that have ended lose their directory, their ``stat`` emptied first
(a kept file of an ended process reads nothing, as on a kernel's procfs); ``self`` is a link, as there
(dangling: the reader is not one of the simulated processes).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import threading
from pathlib import Path

from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import Process, Scenario

__all__ = ["CLOCK_TICKS_PER_S", "ProcfsWriter", "cgroup_path", "cgroup_text"]

CLOCK_TICKS_PER_S = 100  # USER_HZ on every mainstream Linux build
_NS_PER_TICK = 1_000_000_000 // CLOCK_TICKS_PER_S
_USER_SHARE = 0.9  # the node's CPU time (/proc/stat) splits 90 % user / 10 % system (synthetic); a process's: its own
_CGROUP_V1_CONTROLLERS = (
    "hugetlb", "memory", "cpu,cpuacct", "pids", "devices", "blkio", "cpuset", "freezer", "net_cls,net_prio",
    "perf_event", "rdma", "name=systemd",
)  # fmt: skip
_SCOPE_PREFIX = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}


def cgroup_path(scenario: Scenario, process: Process, at_s: float | None = None) -> str:
    """The cgroup a process lives in (at ``at_s``, after its moves until then; None: where it starts), in the
    real shape for its runtime and the node's cgroup driver."""
    ref, path = (process.container, process.cgroup) if at_s is None else process.placement_at(at_s)
    if path is not None:
        return path
    if ref is None:
        return f"/system.slice/{process.comm}.service"
    pod, container = scenario.container_ref(ref)
    if scenario.node.cgroup_driver == "cgroupfs":
        qos_dir = "" if pod.qos == "guaranteed" else f"/{pod.qos}"
        return f"/kubepods{qos_dir}/pod{pod.uid}/{container.id}"
    # The systemd driver escapes the pod UID's dashes, which are slice-hierarchy separators to systemd.
    uid = pod.uid.replace("-", "_")
    scope = f"{_SCOPE_PREFIX[container.runtime]}-{container.id}.scope"
    if pod.qos == "guaranteed":
        return f"/kubepods.slice/kubepods-pod{uid}.slice/{scope}"
    return f"/kubepods.slice/kubepods-{pod.qos}.slice/kubepods-{pod.qos}-pod{uid}.slice/{scope}"


def _self_and_ancestors(path: str) -> list[str]:
    """``/a/b/c`` → ``/a/b/c``, ``/a/b``, ``/a``, ``/``: the cgroups whose usage a process in ``path`` adds to."""
    parts = [part for part in path.split("/") if part]
    return ["/" + "/".join(parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_text(scenario: Scenario, process: Process, at_s: float | None = None) -> str:
    """``/proc/<pid>/cgroup`` (at ``at_s``): one ``0::`` line under cgroup v2, one line per hierarchy under v1."""
    path = cgroup_path(scenario, process, at_s)
    if scenario.node.cgroup_version == 2:
        return f"0::{path}\n"
    count = len(_CGROUP_V1_CONTROLLERS)
    lines = [f"{count - i}:{name}:{path}" for i, name in enumerate(_CGROUP_V1_CONTROLLERS)]
    return "\n".join([*lines, "0::/"]) + "\n"


def _write(path: Path, text: str) -> None:
    """Replace a file atomically (for files written once)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _overwrite(path: Path, text: str) -> None:
    """Rewrite a counter file in place with one write(): its text only grows (counters rise), so a
    concurrent reader sees the old or the new line, never an empty file; rename() per refresh was the
    cost of a whole refresh at benchmark scale."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _remove_process(directory: Path) -> None:
    """A process ended: its ``stat`` is emptied before its directory goes, so that a reader holding the file
    open reads nothing, as the kernel answers a kept file of an ended process (ESRCH, or an empty read)."""
    with contextlib.suppress(OSError):
        os.truncate(directory / "stat", 0)
    shutil.rmtree(directory, ignore_errors=True)


class ProcfsWriter:
    """Writes a node's /proc and /sys under ``root``; call :meth:`refresh` whenever time has moved."""

    def __init__(self, node: SimulatedNode, root: str | Path, cgroups: bool = False, cpuinfo: bool = False) -> None:
        self.node = node
        self.root = Path(root)
        self.proc = self.root / "proc"
        # A procfs fault holds the tree away (renamed, so a reader lists nothing) and it is written there meanwhile:
        # its processes run on, and it comes back as they are then.
        self._away = self.root / ".proc-away"
        self._into = self.proc  # where /proc is written now
        self.powercap = self.root / "sys" / "class" / "powercap"
        # Opt-in: each cgroup's cpu.stat under root/sys/fs/cgroup, marked a v2 mount (cgroup.controllers), for a
        # procfs receiver's cgroup_root (auto finds it beside root/proc).
        self.cgroup_root = self.root / "sys" / "fs" / "cgroup" if cgroups else None
        # Opt-in: /proc/cpuinfo from the scenario's cpu section, for the receiver's CpuInfo (kepler_node_cpu_info)
        self.cpuinfo = cpuinfo
        self._written: set[int] = set()
        self._written_at: float | None = None
        # Every pipeline of a simulated node refreshes before its tick, on a worker thread, maybe at once.
        self._lock = threading.Lock()

    def refresh(self) -> float:
        """Bring every file up to the clock's time; returns the scenario time written (once per time)."""
        with self._lock:
            t_s = self.node.t_s()
            if t_s != self._written_at:
                self._write(t_s)
                self._written_at = t_s
            return t_s

    def _write(self, t_s: float) -> None:
        self._place_proc(self.node.procfs_gone(t_s))
        self._into.mkdir(parents=True, exist_ok=True)
        if not os.path.islink(self._into / "self"):
            # A link, as a procfs has; to no process: the reader is not simulated, and its own pid may be one of
            # the simulated processes', whose cgroup a reader would take for its own (procfs cgroup_root).
            os.symlink("reader", self._into / "self")
        if self.cpuinfo and not (self._into / "cpuinfo").exists():  # one already there (a test's own) is kept
            _write(self._into / "cpuinfo", self._cpuinfo())
        alive = {pid for pid, plan in self.node.truth.plans.items() if plan.alive(t_s)}
        for pid in self._written - alive:
            _remove_process(self._into / str(pid))
        for pid in sorted(alive):
            self._write_process(pid, t_s, new=pid not in self._written)
        self._written = alive
        self._write_proc_stat(t_s, running=len(alive))
        self._write_rapl(t_s)
        if self.cgroup_root is not None:
            self._write_cgroups(t_s)

    def _place_proc(self, gone: bool) -> None:
        """/proc where a reader looks for it, or away from there while a ``procfs`` fault holds it (``gone``)."""
        self._into = self._away if gone else self.proc
        if gone and self.proc.is_dir():
            os.rename(self.proc, self._away)
        elif not gone and self._away.is_dir():
            os.rename(self._away, self.proc)

    def _write_cgroups(self, t_s: float) -> None:
        """Each cgroup's ``cpu.stat`` as the kernel keeps it: ``usage_usec``, the CPU time of every process it
        or a cgroup below it ever held (exited ones included), so a cgroup whose processes all idle does not
        move, and the root's (``/``, where kernel threads live) moves whenever anything on the node runs."""
        assert self.cgroup_root is not None
        if not (self.cgroup_root / "cgroup.controllers").exists():  # what marks a cgroup v2 mount's root
            self.cgroup_root.mkdir(parents=True, exist_ok=True)
            _write(self.cgroup_root / "cgroup.controllers", "cpuset cpu io memory pids\n")
        usage_s: dict[str, float] = {}
        truth = self.node.truth
        for pid, plan in truth.plans.items():
            # Each cgroup it was in holds the time it ran there: a move leaves the time before with the cgroup it left.
            for from_s, until_s, _ in plan.spec.placements():
                if from_s > t_s:
                    break
                cpu_s = truth.process_cpu_s(pid, min(t_s, until_s)) - truth.process_cpu_s(pid, from_s)
                for path in _self_and_ancestors(cgroup_path(self.node.scenario, plan.spec, from_s)):
                    usage_s[path] = usage_s.get(path, 0.0) + cpu_s
        for path, cpu_s in usage_s.items():
            directory = self.cgroup_root / path.lstrip("/")
            directory.mkdir(parents=True, exist_ok=True)
            _overwrite(directory / "cpu.stat", f"usage_usec {round(cpu_s * 1e6)}\n")

    def _write_process(self, pid: int, t_s: float, new: bool) -> None:
        spec = self.node.truth.plans[pid].spec
        directory = self._into / str(pid)
        if new:
            # A new process appears whole: its directory is filled under a hidden name and renamed into
            # place. Its cgroup changes only when it moves (``moves``); comm and cmdline only when it execs (``init``).
            staging = self._into / f".{pid}.new"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            (staging / "comm").write_text(spec.comm_at(t_s) + "\n")
            (staging / "cmdline").write_text("\0".join(spec.cmdline_at(t_s)) + "\0")
            (staging / "cgroup").write_text(cgroup_text(self.node.scenario, spec, t_s))
            (staging / "stat").write_text(self._stat_line(pid, t_s))
            _remove_process(directory)  # one left by an earlier writer, if any
            os.replace(staging, directory)
            return
        _overwrite(directory / "stat", self._stat_line(pid, t_s))
        if spec.moves:  # a move changes what the file says, maybe to a shorter text: replaced whole
            text = cgroup_text(self.node.scenario, spec, t_s)
            if (directory / "cgroup").read_text() != text:
                _write(directory / "cgroup", text)
        if spec.init is not None:  # runc's init until it execs: what it runs then
            _overwrite(directory / "comm", spec.comm_at(t_s) + "\n")
            _overwrite(directory / "cmdline", "\0".join(spec.cmdline_at(t_s)) + "\0")

    def _stat_line(self, pid: int, t_s: float) -> str:
        spec = self.node.truth.plans[pid].spec
        # The kernel truncates utime and stime to whole ticks apart (fs/proc/array.c do_task_stat): their sum is
        # short of the true time by up to two ticks, and a delta between two readings off by up to ±2 ticks.
        # In whole nanoseconds as the kernel splits them, so that no float rounding takes a tick off either.
        cpu_ns = round(self.node.truth.process_cpu_s(pid, t_s) * 1e9)
        user_ns = round(cpu_ns * spec.user_share)
        utime, stime = user_ns // _NS_PER_TICK, (cpu_ns - user_ns) // _NS_PER_TICK
        start_ticks = round((self.node.scenario.node.uptime_s + spec.start_s) * CLOCK_TICKS_PER_S)
        threads = max(1, math.ceil(spec.cpu_cores))
        state = "R" if spec.cpu_cores > 0 else "S"
        rss_pages = 25_600  # 100 MiB: host memory is not modelled
        fields = [
            str(pid), f"({spec.comm_at(t_s)})", state, str(spec.ppid), str(pid), str(pid), "0", "-1", "4194560",
            "0", "0", "0", "0", str(utime), str(stime), "0", "0", "20", "0", str(threads), "0",
            str(start_ticks), str(rss_pages * 4096 * 4), str(rss_pages),
            *(["0"] * 28),
        ]  # fmt: skip
        return " ".join(fields[:52]) + "\n"

    def _cpuinfo(self) -> str:
        """``/proc/cpuinfo``: the scenario's logical CPUs in contiguous blocks, one per package (x86's keys;
        no hyperthreads modelled: each CPU its own core)."""
        cpu = self.node.scenario.cpu
        packages = [n * cpu.packages // cpu.cores for n in range(cpu.cores)]
        blocks = []
        for n, package in enumerate(packages):
            blocks.append(
                f"processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: wattpipe simulated CPU\n"
                f"physical id\t: {package}\ncore id\t\t: {n - packages.index(package)}\n"
                f"cpu cores\t: {packages.count(package)}\n"
            )
        return "\n".join(blocks) + "\n"

    def _write_proc_stat(self, t_s: float, running: int) -> None:
        cpu = self.node.scenario.cpu
        uptime_s = self.node.scenario.node.uptime_s + t_s
        busy_ticks = self.node.truth.cpu_busy_core_s(t_s) * CLOCK_TICKS_PER_S
        total_ticks = uptime_s * cpu.cores * CLOCK_TICKS_PER_S
        user = math.floor(busy_ticks * _USER_SHARE)
        system = math.floor(busy_ticks) - user
        idle = max(0, math.floor(total_ticks) - user - system)

        def line(label: str, share: float) -> str:
            values = [user * share, 0, system * share, idle * share, 0, 0, 0, 0, 0, 0]
            return f"{label} " + " ".join(str(math.floor(v)) for v in values)

        lines = [line("cpu ", 1.0)]  # the aggregate line has two spaces after "cpu"
        lines += [line(f"cpu{n}", 1.0 / cpu.cores) for n in range(cpu.cores)]
        boot_s = math.floor(self.node.wall_at(t_s) - uptime_s)
        lines += [
            f"btime {boot_s}",
            f"processes {len(self.node.truth.plans)}",
            f"procs_running {running}",
            "procs_blocked 0",
        ]
        _overwrite(self._into / "stat", "\n".join(lines) + "\n")
        idle_s = idle / CLOCK_TICKS_PER_S
        _overwrite(self._into / "uptime", f"{uptime_s:.2f} {idle_s:.2f}\n")

    def _write_rapl(self, t_s: float) -> None:
        cpu = self.node.scenario.cpu
        uptime_s = self.node.scenario.node.uptime_s
        for package in range(cpu.packages):
            # Energy since boot: the host idled for uptime_s before the scenario started.
            package_j = cpu.idle_w / cpu.packages * uptime_s + self.node.truth.cpu_package_energy_j(package, t_s)
            self._write_zone(f"intel-rapl:{package}", f"package-{package}", package_j, t_s)
            if cpu.dram_w > 0 or cpu.dram_w_per_core > 0:
                dram_j = cpu.dram_w * uptime_s + self.node.truth.cpu_dram_energy_j(package, t_s)
                self._write_zone(f"intel-rapl:{package}:0", "dram", dram_j, t_s)

    def _write_zone(self, zone: str, name: str, energy_j: float, t_s: float) -> None:
        directory = self.powercap / zone
        if self.node.rapl_gone(zone, t_s):
            shutil.rmtree(directory, ignore_errors=True)  # back when the fault ends, its counter counted on
            return
        max_range_uj = self.node.scenario.cpu.max_range_uj
        if not directory.is_dir():
            directory.mkdir(parents=True)
            _write(directory / "name", name + "\n")
            _write(directory / "max_energy_range_uj", f"{max_range_uj}\n")
        # The hardware counter wraps to 0 after max_energy_range_uj. It can shrink (a wrap), so the
        # file is replaced atomically rather than rewritten in place.
        _write(directory / "energy_uj", f"{math.floor(energy_j * 1e6) % (max_range_uj + 1)}\n")
