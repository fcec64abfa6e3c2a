"""``unseen: containers`` when things go wrong, end to end: the real procfs receiver (a hand-written /proc and cgroup
v2 tree) feeding the real ``cpu_attribution``, each container's CPU time known exactly. The zone's energy is 1 J
per CPU-second run on the node and /proc/stat says every second was busy (usage ratio 1), so a container's true
energy is 1,000 mJ per CPU-second it ran, and the joules that reach it are its CPU-seconds as the model saw them.
Each test measures what a fault costs against that truth: a failed /proc listing, a listing cut at
max_processes, a container whose processes never live through a scan, a cgroup unreadable for a tick or made
again, a restart from the state file."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.processors.test_cpu_attribution import processor, restarted, totals
from tests.receivers.test_procfs import make_receiver, write_process
from tests.receivers.test_procfs_cgroupcpu import mount, usage
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import CpuZoneSample
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.cpu_attribution import CpuAttributionProcessor
from wattpipe.receivers.procfs import ProcfsReceiver

UID = "a1b2c3d4-e5f6-4789-abcd-ef0123456789"
POD = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"


def cgroup_of(cid: str) -> str:
    return f"{POD}/cri-containerd-{cid}.scope"


BUILD, WEB = "b" * 64, "e" * 64
SHORT = "c" * 64  # a container in the pod none of whose processes is ever listed


@dataclass
class Host:
    """A node whose CPU time is written by hand: processes (pid → container id, CPU s, start tick), each container's
    cgroup usage (its processes' time and its hidden processes', which never live through a scan), /proc/stat
    and one RAPL package zone at 1 J per CPU-second."""

    root: Path
    clock: SteppedClock = field(default_factory=SteppedClock)
    procs: dict[int, tuple[str | None, float, int]] = field(default_factory=dict)
    usage_s: dict[str, float] = field(default_factory=dict)
    truth_s: dict[str, float] = field(default_factory=dict)  # container id → CPU s it ran since it was made
    busy_s: float = 100.0
    energy_uj: int = 0
    max_processes: int = 100
    broken: set[str] = field(default_factory=set)  # containers whose cpu.stat reads nothing (no usage_usec)

    def __post_init__(self) -> None:
        self.proc, self.cgroups = self.root / "proc", mount(self.root / "cgroup")
        self.receiver = self.new_receiver()
        self.boot_wall_s = self.clock.now().wall_s - 1000.0  # /proc/uptime: a process's start time, placed

    def new_receiver(self) -> ProcfsReceiver:
        """A procfs receiver started afresh (the last one's files closed: it keeps stat and cpu.stat files open)."""
        if (old := getattr(self, "receiver", None)) is not None:
            old.table.close()
        _OPEN.append(self)
        receiver = make_receiver(self.proc, self.clock, cgroup_root=str(self.cgroups), max_processes=self.max_processes)
        receiver.asked(frozenset({"process_cpu_time", "container_cpu_time"}))
        return receiver

    def spawn(self, pid: int, cid: str | None, *, new: bool = False) -> None:
        """A process that ran 1 s before: long ago (its first listing a baseline), or ``new``: since the last tick
        (its first listing counts its 1 s)."""
        start = round((self.clock.now().wall_s - 1.0 - self.boot_wall_s) * 100) if new else 100
        self.procs[pid] = (cid, 1.0, start)
        if cid is not None:
            self.usage_s[cid] = self.usage_s.get(cid, 0.0) + 1.0
        if new:
            self.busy_s += 1.0
            self.energy_uj += 1_000_000
            if cid is not None:
                self.truth_s[cid] = self.truth_s.get(cid, 0.0) + 1.0

    def run(self, pid: int, seconds: float) -> None:
        cid, cpu_s, start = self.procs[pid]
        self.procs[pid] = (cid, cpu_s + seconds, start)
        self.busy_s += seconds
        self.energy_uj += round(seconds * 1e6)
        if cid is not None:
            self.usage_s[cid] += seconds
            self.truth_s[cid] = self.truth_s.get(cid, 0.0) + seconds

    def hidden(self, cid: str, seconds: float) -> None:
        """``seconds`` run in ``cid`` by processes that started and ended between two scans."""
        self.usage_s[cid] = self.usage_s.get(cid, 0.0) + seconds
        self.truth_s[cid] = self.truth_s.get(cid, 0.0) + seconds
        self.busy_s += seconds
        self.energy_uj += round(seconds * 1e6)

    def exit(self, pid: int) -> None:
        del self.procs[pid]
        shutil.rmtree(self.proc / str(pid), ignore_errors=True)  # (not written yet: never listed)

    def write(self) -> None:
        for pid, (cid, cpu_s, start) in self.procs.items():
            cgroup = "0::/system.slice/ssh.service\n" if cid is None else f"0::{cgroup_of(cid)}\n"
            write_process(self.proc, pid, "worker", utime=round(cpu_s * 100), start=start, cgroup=cgroup)
        for cid, seconds in self.usage_s.items():
            usage(self.cgroups, cgroup_of(cid), round(seconds * 1e6))
            if cid in self.broken:
                (self.cgroups / cgroup_of(cid).lstrip("/") / "cpu.stat").write_text("")
        (self.proc / "uptime").write_text(f"{self.clock.now().wall_s - self.boot_wall_s:.2f} 0.00\n")
        busy = round(self.busy_s * 100)
        (self.proc / "stat").write_text(f"cpu  {busy} 0 0 0 0 0 0 0 0 0\ncpu0 {busy} 0 0 0 0 0 0 0 0 0\n")

    def tick(self, proc: CpuAttributionProcessor) -> Batch:
        self.write()
        records = asyncio.run(self.receiver.collect())
        now = self.clock.now()
        zone = CpuZoneSample(time=now, zone="package", path="intel-rapl:0", socket=0, energy_uj=self.energy_uj)
        batch = Batch(time=now, interval_s=5.0, node="n").replace(present=self.receiver.provides)
        out = proc.process(batch.with_records([*records, zone]))
        self.clock.advance(5.0)
        return out


_OPEN: list[Host] = []  # the hosts whose receivers keep files open: closed after each test (the open-file limit)


@pytest.fixture(autouse=True)
def _close_receivers() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().receiver.table.close()


def billed_mj(out: Batch) -> dict[str, int]:
    """Each container's attributed energy (mJ): 1,000 per CPU-second the model gave it."""
    return {key: t.energy_mj for (key, _), t in totals(out, "container").items()}


def two_tenants(tmp_path: Path) -> Host:
    """A build container (make, pid 10, 1 s a tick, and its compilers, never listed, 3 s a tick) and a web
    container (nginx, pid 20, 4 s a tick), both listed from the first scan."""
    host = Host(tmp_path)
    host.spawn(10, BUILD)
    host.spawn(20, WEB)
    return host


def busy_tick(host: Host) -> None:
    host.run(10, 1.0)
    host.hidden(BUILD, 3.0)
    host.run(20, 4.0)


def warm(host: Host, proc: CpuAttributionProcessor) -> tuple[dict[str, int], dict[str, float]]:
    """Ticks until both containers' unseen time counts (procfs reads a container's cgroup from its second scan,
    whose reading is a baseline); the energy billed so far and the truth, from which the test's ticks count."""
    out = host.tick(proc)
    for _ in range(3):
        busy_tick(host)
        out = host.tick(proc)
    return billed_mj(out), dict(host.truth_s)


def since(host: Host, out: Batch, start: tuple[dict[str, int], dict[str, float]]) -> dict[str, tuple[int, int]]:
    """Per container: (mJ billed, mJ true) since ``start``."""
    billed, truth = billed_mj(out), host.truth_s
    return {
        cid: (billed.get(cid, 0) - start[0].get(cid, 0), round(1000 * (truth[cid] - start[1].get(cid, 0.0))))
        for cid in truth
    }


def test_the_harness_bills_each_container_its_cpu_seconds_when_nothing_goes_wrong(tmp_path: Path) -> None:
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    for _ in range(5):
        busy_tick(host)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (20_000, 20_000), WEB: (20_000, 20_000)}


def unattributed_mj(out: Batch) -> int:
    return sum(zone.unattributed_energy_mj for zone in out.device_totals)


def test_a_failed_listing_is_unknown_and_the_next_tick_splits_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /proc cannot be listed for a tick. procfs said so, but gave an empty listing (present, no process): every
    # process ended for cpu_attribution, so the next tick's deltas were baselines (its energy unattributed too),
    # its container reads none (the scan forgot every process's cgroup), and the one after a baseline: of 28 J
    # each over 7 ticks, the build container got 17.6, the web one 22.4 (2.4 J of the build's billed to it), 16 J
    # unattributed. Then unknown, the next tick spanning the failed one (deltas and cgroup usage alike) but the
    # failed tick's energy unattributed: 24 J each, 8 J unattributed. Now that energy is held for the next listing
    # (processors/_cpu_hold.py), whose deltas and unseen seconds span both ticks: every joule its container's.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    before = unattributed_mj(host.tick(proc))
    real = os.listdir

    def failing(path: str | bytes) -> list[Any]:
        if os.fsdecode(path) == str(host.proc):
            raise PermissionError(13, "Permission denied")
        return real(path)

    busy_tick(host)
    with monkeypatch.context() as patch:
        patch.setattr(os, "listdir", failing)
        out = host.tick(proc)
    assert "host_processes" not in host.receiver.provides
    for _ in range(6):
        busy_tick(host)
        out = host.tick(proc)
    # 7 ticks of 4 J each, the failed one's split with the next's
    assert since(host, out, start) == {BUILD: (28_000, 28_000), WEB: (28_000, 28_000)}
    assert unattributed_mj(out) - before == 0


def test_a_listing_cut_at_max_processes_bills_no_tenant_for_another(tmp_path: Path) -> None:
    # One tick over max_processes: procfs reads the lowest pids only, and the web container's nginx (pid 20) is left
    # out. Its cgroup, read for the last scan's processes, gave it its 4 s as unseen time that tick; the next tick
    # nginx is listed again, first seen for cpu_attribution (its delta 0: it started long before), and the web
    # cgroup was not read (no process of it in the cut scan) nor the tick after (a baseline): its 4 s of that tick
    # went to the build container (32 J of 28 against 24 J of 28). A container read at the last scan is read while
    # its cgroup can be: the tick after the cut bills nginx's time to its container as unseen time.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    busy_tick(host)
    host.receiver.table.max_processes = 1
    host.tick(proc)
    host.receiver.table.max_processes = 100
    for _ in range(6):
        busy_tick(host)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (28_000, 28_000), WEB: (28_000, 28_000)}
    assert unattributed_mj(out) == 0


def test_a_new_containers_unseen_time_counts_from_its_first_tick(tmp_path: Path) -> None:
    # A container whose first process starts now, beside processes that never live through a scan (2 s a tick).
    # Its cgroup was read from the scan after its first listing, a baseline: its unseen time of the tick it was
    # first listed in and of the next went to the other tenants (it got 11.4 J of its 15 J). Its cgroup is now
    # read in the scan that first lists it (after its processes' stat), and a container first read whose listed
    # processes all started since the last listing is new: all of its usage is since then (as a process's first
    # tick counts from its start), no baseline.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    job = "f" * 64
    busy_tick(host)
    host.spawn(30, job, new=True)  # its 1 s counts, as a process started since the last listing
    host.hidden(job, 2.0)
    host.tick(proc)
    for _ in range(4):
        busy_tick(host)
        host.run(30, 1.0)
        host.hidden(job, 2.0)
        out = host.tick(proc)
    got = since(host, out, start)
    assert got == {BUILD: (20_000, 20_000), WEB: (20_000, 20_000), job: (15_000, 15_000)}


def test_after_a_restart_every_container_counts_from_the_second_tick(tmp_path: Path) -> None:
    # wattpipe restarts: cpu_attribution's totals from the state file, every zone's first reading a baseline (that
    # tick's energy is never measured), and procfs starting over, its first scan reading no cgroup (it knows no
    # process yet) and its second a baseline for every container: the build container's unseen time of the tick
    # after the restart went to the web one (the build container got 21.6 J of 28, the web one 26.4 J). procfs now
    # reads a container's cgroup in the scan that first lists it: each container's unseen time counts from the
    # second tick, as its processes' deltas do.
    host = two_tenants(tmp_path)
    store = StateStore(tmp_path / "state.json", SteppedClock(), "n")
    proc = processor(store, unseen="containers")
    start = warm(host, proc)
    proc = restarted(proc, store, unseen="containers")
    host.receiver = host.new_receiver()
    for _ in range(7):
        busy_tick(host)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (24_000, 28_000), WEB: (24_000, 28_000)}  # the restart tick's 4 J each


def test_a_container_restarted_under_its_id_is_billed_its_new_cgroups_time(tmp_path: Path) -> None:
    # `docker restart`: the container keeps its id, its cgroup is removed and made again (its usage starts over),
    # its new process has a new pid. procfs reads the same path, lower than at the last scan: cpu_attribution took
    # it for a baseline, and the new cgroup's time that tick (its compilers' 3 s) went to the web container (the
    # build container got 25.6 J of 28, the web one 30.4 J; 17.6 J and 38.4 J before f73a9da, which reads its new
    # process in the scan that first lists it). A cgroup read lower than at the last scan was made
    # since: all of its usage is of this tick, and procfs gives the container's usage on from its last reading.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    host.exit(10)
    shutil.rmtree(host.cgroups / cgroup_of(BUILD).lstrip("/"))
    host.usage_s[BUILD] = 0.0
    host.spawn(11, BUILD, new=True)
    host.hidden(BUILD, 3.0)
    host.run(20, 4.0)
    host.tick(proc)
    for _ in range(6):
        host.run(11, 1.0)
        host.hidden(BUILD, 3.0)
        host.run(20, 4.0)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (28_000, 28_000), WEB: (28_000, 28_000)}
    usage_s = {r.container_id: r.usage_s for r in out.container_cpu}
    assert usage_s[BUILD] == 13.0 + 28.0  # (its usage at the last scan before, and 28 s since)


def test_a_container_restarted_under_a_new_id_is_billed_from_its_first_tick(tmp_path: Path) -> None:
    # A restarted Kubernetes container gets a new id (a new cgroup); the old one's cgroup is removed (its seconds
    # since the last scan are lost with it: none here) and its series ends. The new one is read in the scan that
    # first lists its process, whose processes all started since the last listing: new, all of its usage since
    # (a baseline, its unseen time of that tick went to the others: 25.6 J of 28, the web one 30.4 J; 17.6 J and
    # 38.4 J before f73a9da).
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    again = "d" * 64
    host.exit(10)
    shutil.rmtree(host.cgroups / cgroup_of(BUILD).lstrip("/"))
    del host.usage_s[BUILD]
    host.spawn(11, again, new=True)
    host.hidden(again, 3.0)
    host.run(20, 4.0)
    out = host.tick(proc)
    assert totals(out, "container")[(BUILD, "cpu:package")].state == "terminated"
    for _ in range(6):
        host.run(11, 1.0)
        host.hidden(again, 3.0)
        host.run(20, 4.0)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (0, 0), WEB: (28_000, 28_000), again: (28_000, 28_000)}


def test_a_container_whose_cpu_stat_cannot_be_read_for_a_tick_keeps_its_unseen_time(tmp_path: Path) -> None:
    # The build container's cpu.stat reads nothing for a tick: no record (unknown, not 0), so its compilers' 3 s
    # that tick went to the web container, and its next record was a baseline, 3 s more: 23.2 J of 28 against
    # 32.8 J. procfs now says how far back a record's usage goes on unbroken (ContainerCpuTime.since_s), and
    # cpu_attribution keeps the container's last record and its listed processes' deltas over the tick it had
    # none: the next delta spans the failed tick, both ticks' deltas of make taken off (6 s unseen), and nothing
    # is lost. Not exact: the failed tick's 8 J was split without the build's 3 s (make 1.6 J, nginx 6.4 J), and
    # the next tick's 8 J weighs its 6 s against that tick's 5 s of processes (8 × 7/11 = 5.09 J to the build):
    # 26.7 J of 28 against 29.3 J.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    busy_tick(host)
    host.broken.add(BUILD)
    out = host.tick(proc)
    assert BUILD not in {r.container_id for r in out.container_cpu}
    host.broken.clear()
    busy_tick(host)
    out = host.tick(proc)
    (record,) = [r for r in out.container_cpu if r.container_id == BUILD]
    assert record.since_s is not None
    assert record.time.monotonic_s - record.since_s == 25.0  # its first reading's, 5 ticks back: over the failed one
    for _ in range(5):
        busy_tick(host)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (26_691, 28_000), WEB: (29_309, 28_000)}
    assert unattributed_mj(out) == 0


def test_a_container_none_of_whose_processes_is_listed_is_billed_its_time(tmp_path: Path) -> None:
    # A third container in the pod whose processes all start and end between two scans (2 s a tick): procfs never
    # read its cgroup, and its time went to the other tenants: of its 14 J over 7 ticks it got none, the build and
    # web containers 35 J of 28 each. procfs now lists the cgroups below the pods of the containers it reads, and
    # reads a container's it finds there: one that was not there at the last scan's look was made since, so all
    # of its usage is since then (ContainerCpuTime.made_after_s), billed from its first tick.
    host = two_tenants(tmp_path)
    proc = processor(unseen="containers")
    start = warm(host, proc)
    short = "c" * 64
    for _ in range(7):
        busy_tick(host)
        host.hidden(short, 2.0)
        out = host.tick(proc)
    assert since(host, out, start) == {BUILD: (28_000, 28_000), WEB: (28_000, 28_000), short: (14_000, 14_000)}
    assert unattributed_mj(out) == 0
    (record,) = [r for r in out.container_cpu if r.container_id == short]
    assert (record.pod_uid, record.container_runtime) == (UID, "containerd")  # from its path


_FAULT_NAMES = ["none", "none", "listing", "cap", "broken", "broken-web", "remade", "spawn", "exit"]
FAULTS = st.lists(
    st.fixed_dictionaries(
        {
            "run": st.lists(st.tuples(st.sampled_from([10, 20, 30]), st.integers(0, 300)), max_size=3),  # 10 ms ticks
            "hidden": st.lists(st.tuples(st.sampled_from([BUILD, WEB, SHORT]), st.integers(0, 300)), max_size=2),
            # (and the container never listed: unreadable, removed)
            "fault": st.sampled_from([*_FAULT_NAMES, "broken-short", "short-gone"]),
        }
    ),
    min_size=1,
    max_size=8,
)


def _still(fault: str) -> dict[str, Any]:
    return {"run": [], "hidden": [], "fault": fault}


@settings(max_examples=25, deadline=None)
@given(FAULTS)
# cpu.stat unreadable, then its cgroup made again: procfs had forgotten the last reading, its next record went on
# lower (kept now, as the chain is, over the scans a file gives none)
@example([_still("none"), _still("none"), _still("broken"), _still("remade")])
# the build container's cgroup made again (its process gone, read on: its usage taken on from its last reading),
# then unreadable; found again below its pod, read after the stat files: it went on lower, that reading not taken on
@example([_still("none"), _still("none"), _still("none"), _still("remade"), _still("broken"), _still("none")])
# a container never listed, made, unreadable, removed, made again under its id: each first record counted from 0
@example(
    [
        _still("none"),
        {"run": [], "hidden": [(SHORT, 100)], "fault": "none"},
        {"run": [], "hidden": [(SHORT, 100)], "fault": "broken-short"},
        {"run": [], "hidden": [(SHORT, 100)], "fault": "short-gone"},
        {"run": [], "hidden": [(SHORT, 100)], "fault": "none"},
    ]
)
def test_every_zones_energy_is_conserved_every_tick_whatever_goes_wrong(ticks: list[dict[str, Any]]) -> None:
    # procfs and cpu_attribution together under the faults above, in any order (a container's cpu.stat unreadable
    # for a tick or several among them): each tick the zone's energy is idle + attributed + unattributed to the mJ,
    # no total goes down, a container is at least the sum of its processes, and no more is attributed than the zone
    # measured; a container's record is a baseline (since_s its own time) or goes on from its last record's
    # since_s, its usage no lower. A container never listed (its cgroup made, unreadable, removed, made again at
    # any tick) among them: its record says it was made since the last scan only where it was.
    with tempfile.TemporaryDirectory() as root:
        host = two_tenants(Path(root))
        proc = processor(unseen="containers", terminated_retention=1e9, max_terminated=10_000)
        last: dict[tuple[str, str, str, Timestamp | None], int] = {}
        chains: dict[str, tuple[float | None, float]] = {}  # container id → its last record's since_s and usage
        made: set[str] = set()  # the never-listed container, while its cgroup is there
        attributed = 0
        looked_s = None  # the last scan's time whose listing did not fail (it looked below the pod)
        new = None  # the never-listed container, where its cgroup was made since that scan
        for tick in ticks:
            for pid, ticks_run in tick["run"]:
                if pid in host.procs:
                    host.run(pid, ticks_run / 100)
            for cid, ticks_run in tick["hidden"]:
                host.hidden(cid, ticks_run / 100)
            fault = tick["fault"]
            host.broken = {"broken": {BUILD}, "broken-web": {WEB}, "broken-short": {SHORT}}.get(fault, set())
            host.receiver.table.max_processes = 1 if fault == "cap" else 100
            if fault == "remade" and 10 in host.procs:
                host.exit(10)
                shutil.rmtree(host.cgroups / cgroup_of(BUILD).lstrip("/"), ignore_errors=True)
                host.usage_s[BUILD] = 0.0
            elif fault == "spawn" and 30 not in host.procs:
                host.spawn(30, "f" * 64, new=True)
            elif fault == "exit" and 30 in host.procs:
                host.exit(30)
            elif fault == "short-gone" and SHORT in host.usage_s:
                shutil.rmtree(host.cgroups / cgroup_of(SHORT).lstrip("/"), ignore_errors=True)
                del host.usage_s[SHORT]
                made.discard(SHORT)
            if SHORT in host.usage_s and SHORT not in made:
                made.add(SHORT)
                new = SHORT
            with pytest.MonkeyPatch.context() as patch:
                if fault == "listing":
                    patch.setattr(os, "listdir", functools.partial(_failing, proc=host.proc, real=os.listdir))
                out = host.tick(proc)
            for record in out.container_cpu:
                if record.made_after_s is not None:  # (its cgroup made since the last scan that looked)
                    assert (record.container_id, record.made_after_s) == (new, looked_s)
                since_s, usage_s = chains.get(record.container_id, (None, 0.0))
                assert record.since_s in (record.time.monotonic_s, since_s)
                assert record.since_s != since_s or record.usage_s >= usage_s
                chains[record.container_id] = (record.since_s, record.usage_s)
            if fault != "listing":
                looked_s, new = out.time.monotonic_s, None
            for zone in out.device_totals:
                assert zone.idle_energy_mj + zone.attributed_energy_mj + zone.unattributed_energy_mj == zone.energy_mj
                attributed = max(attributed, zone.attributed_energy_mj)
            assert attributed <= host.energy_uj // 1000
            processes = {int(t.key): t.energy_mj for t in out.totals if t.scope == "process" and t.state == "running"}
            containers = {t.key: t.energy_mj for t in out.totals if t.scope == "container"}
            for cid, mj in containers.items():
                pids = [pid for pid, (c, _, _) in host.procs.items() if c == cid]
                assert mj >= sum(processes.get(pid, 0) for pid in pids)
            for t in out.totals:
                key = (t.scope, t.key, t.device_id, t.start)  # (a pid reused: another series)
                assert t.energy_mj >= last.get(key, 0)
                last[key] = t.energy_mj
        host.receiver.table.close()


def _failing(path: str | bytes, proc: Path, real: Any) -> list[Any]:
    if os.fsdecode(path) == str(proc):
        raise PermissionError(13, "Permission denied")
    return real(path)  # type: ignore[no-any-return]
