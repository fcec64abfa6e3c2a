"""``unseen: containers`` and a process that moved between cgroups without an exec, its delta delivered late: procfs
hands a process's record on unread while the cgroup it was read in idles (receivers/procfs/_proc.py, ``cgroup_root``),
so one that left that cgroup runs unread, its time its new container's unseen time, until a full read (every
``FULL_READ_EVERY``-th scan) reads it where it is, its delta then spanning every scan it was not read in. Those
seconds were billed once, as unseen time: its delta is weighed less them (processors/_cpu_unseen.py)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.processors.test_cpu_attribution import processor, step, totals
from tests.processors.test_cpu_attribution_unseen import CgroupNode, build_node, energy
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import HostProcess
from wattpipe.pipeline.records_cpu import ContainerCpuTime


def tick(node: CgroupNode) -> None:
    """build_node's tick (make 1 s, ci's compilers 3 s, nginx 4 s) with 9 of the node's 10 s active: 9,000 mJ
    active of 10,000, 1,000 mJ per CPU-second where 9 s are weighed."""
    node.spend("intel-rapl:0", 10_000)
    node.total_s += 10.0
    node.active_s += 9.0
    node.run(10, 1.0)
    node.run(20, 4.0)
    node.use("ci", 4.0)
    node.use("nginx", 4.0)


def test_a_moved_processs_late_delta_is_not_billed_again_to_the_container_it_is_in() -> None:
    # cpu-moves.yaml's rsync in miniature: pid 40, a host process alone in its service's cgroup, 1 s a tick, is
    # adopted into the toolbox (container tb). The service's cgroup idles from then on, so procfs hands rsync's
    # record on unread: for three ticks its second is tb's unseen time. The full read then reads it in tb, its
    # delta 4 s: 3 billed already as tb's unseen time, and this tick's.
    node = build_node()
    node.cgroups["tb"] = ("debug", 0.0)
    node.spawn(40, comm="rsync")
    proc = processor(unseen="containers")
    step(proc, node)
    tick(node)
    node.run(40, 1.0)  # on the host: read, its own
    out = step(proc, node)
    assert energy(out, "process", "40") == 1_000
    for _ in range(3):  # in tb, its record handed on unread
        tick(node)
        node.use("tb", 1.0)
        out = step(proc, node)
        assert energy(out, "process", "40") == 1_000  # no delta: no share
    assert energy(out, "container", "tb") == 3_000
    before = {scope: energy(out, *scope) for scope in (("process", "20"), ("container", "ci"))}
    tick(node)
    node.run(40, 4.0)
    node.procs[40] = replace(node.procs[40], container_id="tb", pod_uid="debug")  # the full read: where it is
    node.use("tb", 1.0)
    out = step(proc, node)
    # 9,000 mJ over make 1, ci's compilers 3, nginx 4 and rsync 1 (its 3 s before were billed as tb's unseen time)
    assert energy(out, "process", "20") - before["process", "20"] == 4_000
    assert energy(out, "container", "ci") - before["container", "ci"] == 4_000
    assert energy(out, "container", "tb") == 3_000 + 1_000  # 4 s in tb: 4,000 mJ, not 3,000 and 3 × 9,000 / 12
    assert energy(out, "pod", "debug") == 4_000
    assert out.device_totals[0].attributed_energy_mj == 9_000 * 5
    tick(node)
    node.run(40, 1.0)
    node.use("tb", 1.0)
    out = step(proc, node)
    assert energy(out, "container", "tb") == 5_000  # read each tick from now on: its own delta again


def test_a_process_that_moves_in_from_a_busy_container_keeps_its_time_spent_there() -> None:
    # pid 30, read every tick in ci (busy), moves into tb (billed unseen time the ticks before) and execs: its
    # identity is read again, and its 2 s this tick (1 in ci, 1 in tb) are weighed as its own. Its record was read
    # at the last listing, so none of its delta can be unseen time tb was billed: nothing taken back.
    node = build_node()
    node.cgroups["tb"] = ("debug", 0.0)
    node.spawn(30, comm="worker", container_id="ci", pod_uid="build")
    proc = processor(unseen="containers")
    step(proc, node)
    for _ in range(3):
        tick(node)
        node.run(30, 1.0)
        node.use("ci", 1.0)
        node.use("tb", 1.0)  # tb's own short-lived processes: unseen time
        out = step(proc, node)
    assert energy(out, "container", "tb") == 3 * 900  # 1 s of 10 a tick
    before = energy(out, "process", "20")
    tick(node)
    node.run(30, 2.0)
    node.use("ci", 1.0)
    node.use("tb", 1.0)
    node.procs[30] = replace(node.procs[30], container_id="tb", pod_uid="debug", comm="convert")
    out = step(proc, node)
    # 9,000 mJ over make 1, ci's unseen 2 (its compilers' 3 less the worker's 2 taken from both containers: its
    # time was in one or both, and ci's usage holds 1 s of it), nginx 4 and the worker 2: 1,000 mJ a second
    assert energy(out, "process", "30") == 3 * 900 + 2_000
    assert energy(out, "process", "20") - before == 4_000
    assert energy(out, "container", "tb") == 3 * 900 + 2_000


# --- the property: nothing weighed twice, processes moving unread --------------------------------------


UNREAD = st.lists(
    st.fixed_dictionaries(
        {
            # (process, seconds run) per process that runs; it runs in its container (the one it moved to)
            "run": st.lists(st.tuples(st.integers(0, 5), st.floats(0.0, 3.0)), max_size=6),
            # (process, container): it moves there at the tick's start, and is read there only at a full read
            "move": st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c", None])), max_size=2),
            "full": st.booleans(),  # a full read: every process read where it is
            "exit": st.lists(st.tuples(st.integers(0, 5), st.floats(0.0, 2.0)), max_size=1),  # and its last s
            "hidden": st.lists(st.floats(0.0, 2.0), min_size=3, max_size=3),  # per container a, b, c
        }
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=100, deadline=None)
@given(UNREAD)
@example(  # cpu-moves.yaml's rsync: a host process moves into c, unread for three ticks, then read
    [
        {"run": [(5, 1.0)], "move": [(5, "c")], "full": False, "exit": [], "hidden": [0.0, 0.0, 0.0]},
        {"run": [(5, 1.0)], "move": [], "full": False, "exit": [], "hidden": [0.0, 0.0, 0.0]},
        {"run": [(5, 1.0)], "move": [], "full": False, "exit": [], "hidden": [0.0, 0.0, 0.0]},
        {"run": [(5, 1.0)], "move": [], "full": True, "exit": [], "hidden": [0.0, 0.0, 0.0]},
    ]
)
def test_no_cpu_second_is_weighed_twice_when_a_moved_process_is_read_late(ticks: list[dict]) -> None:  # type: ignore[type-arg]
    # procfs's view: a process that moved is handed on unread (its last record, its old container, its time then)
    # until a full read; the others are read every tick. The truth: each container's cgroup usage grows by what
    # its processes ran in it, hidden and exited time too; a host process (None) by nothing. Weighed: the deltas
    # (less what was taken back) and the containers' unseen seconds: up to each tick, at most what the cgroups and
    # the host processes ran.
    from tests.helpers.context import make_context
    from wattpipe.processors._cpu_unseen import UnseenTime

    clock = SteppedClock()
    unseen = UnseenTime(make_context("cpu_attribution", clock=clock))
    usage = {"a": 0.0, "b": 0.0, "c": 0.0}
    where: dict[int, str | None] = {pid: "abc"[pid % 3] if pid < 5 else None for pid in range(6)}  # pid → container
    cpu = dict.fromkeys(where, 0.0)
    unread: set[int] = set()

    def listing(last: dict[int, HostProcess]) -> tuple[Batch, dict[int, HostProcess]]:
        now = clock.now()
        hosts = {
            pid: last[pid]
            if pid in unread and pid in last
            else HostProcess(time=now, pid=pid, start_time_ticks=pid, cpu_time_s=cpu[pid], container_id=c)
            for pid, c in where.items()
        }
        records = tuple(ContainerCpuTime(time=now, container_id=c, usage_s=s) for c, s in usage.items())
        return Batch(time=now, interval_s=5.0, node="n").replace(container_cpu=records), hosts

    batch, last = listing({})
    unseen.weigh(batch, [], [], True, True, last)
    ran_total = weighed_total = 0.0
    for t in ticks:
        for pid, c in t["move"]:
            if pid in where and where[pid] != c and pid not in unread:  # (moved twice unread: not taken back)
                where[pid] = c
                unread.add(pid)
        ran = 0.0
        for pid, seconds in t["run"]:
            if pid in where:
                cpu[pid] += seconds
                ran += seconds
                if (c := where[pid]) is not None:
                    usage[c] += seconds
        for pid, last_s in t["exit"]:
            if pid in where:
                if (c := where.pop(pid)) is not None:
                    usage[c] += last_s
                    ran += last_s
                unread.discard(pid)
        for c, seconds in zip("abc", t["hidden"], strict=True):
            usage[c] += seconds
            ran += seconds
        if t["full"]:
            unread.clear()
        clock.advance(5.0)
        batch, hosts = listing(last)
        deltas = [(h, (h.cpu_time_s or 0.0) - (last[pid].cpu_time_s or 0.0)) for pid, h in hosts.items() if pid in last]
        deltas = [(h, d) for h, d in deltas if d > 0]
        got = unseen.weigh(batch, [h for h, _ in deltas], [d for _, d in deltas], True, True, last)
        cpu_s = [d for _, d in deltas] if got.cpu_s is None else list(got.cpu_s)
        assert len(cpu_s) == len(deltas)
        assert all(0.0 <= w <= d + 1e-9 for w, (_, d) in zip(cpu_s, deltas, strict=True))  # less, never below 0
        ran_total += ran
        weighed_total += sum(got.seconds) + sum(cpu_s)
        assert weighed_total <= ran_total + 1e-6  # (a tick's may be more: a host process's time read late)
        last = hosts


@settings(max_examples=60, deadline=None)
@given(UNREAD, st.lists(st.integers(0, 50_000), min_size=14, max_size=14))
@example(  # the rsync example above, with energy: its late delta taken back in the processor's split
    [
        {"run": [(5, 1.0)], "move": [(5, "c")], "full": False, "exit": [], "hidden": [0.0, 0.0, 0.0]},
        {"run": [(5, 1.0), (2, 0.5)], "move": [], "full": False, "exit": [], "hidden": [0.0, 0.0, 0.0]},
        {"run": [(5, 1.0)], "move": [], "full": True, "exit": [], "hidden": [0.0, 0.0, 0.0]},
    ],
    [10_000] * 14,
)
def test_conservation_and_monotonic_totals_with_processes_read_late(ticks: list[dict], mj: list[int]) -> None:  # type: ignore[type-arg]
    # The processor with processes moving unread, their late deltas taken back: per zone per tick, idle + attributed
    # + unattributed == the zone's energy; the containers together, and the processes, at most what was attributed;
    # a pod the sum of its containers; every total monotonic.
    node = CgroupNode(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    pods = {"a": "p1", "b": "p1", "c": "p2"}
    node.cgroups = {c: (pods[c], 0.0) for c in pods}
    where: dict[int, str | None] = {pid: "abc"[pid % 3] if pid < 5 else None for pid in range(6)}
    for pid, c in where.items():
        node.spawn(pid + 100, container_id=c, pod_uid=None if c is None else pods[c])
    proc = processor(unseen="containers", terminated_retention=1e9, max_terminated=10_000)
    step(proc, node)
    unread: dict[int, float] = {}  # pid → its CPU s not yet shown (its record handed on)
    last: dict[tuple[str, str], int] = {}
    for t, tick_mj in zip(ticks, mj, strict=False):
        for pid, c in t["move"]:
            if pid in where and where[pid] != c and pid not in unread:
                where[pid] = c
                unread[pid] = 0.0
        for pid, seconds in t["run"]:
            if pid in where:
                if pid in unread:
                    unread[pid] += seconds
                else:
                    node.run(pid + 100, seconds)
                if (c := where[pid]) is not None:
                    node.use(c, seconds)
        for pid, last_s in t["exit"]:
            if pid in where:
                if (c := where.pop(pid)) is not None:
                    node.use(c, last_s)
                node.procs.pop(pid + 100)
                unread.pop(pid, None)
        for c, seconds in zip("abc", t["hidden"], strict=True):
            node.use(c, seconds)
        if t["full"]:
            for pid, seconds in unread.items():
                c = where[pid]
                node.run(pid + 100, seconds)
                node.procs[pid + 100] = replace(
                    node.procs[pid + 100], container_id=c, pod_uid=None if c is None else pods[c]
                )
            unread.clear()
        node.spend("intel-rapl:0", tick_mj)
        node.total_s += 10.0
        node.active_s += 8.0
        out = step(proc, node)
        (zone,) = out.device_totals
        assert zone.idle_energy_mj + zone.attributed_energy_mj + zone.unattributed_energy_mj == zone.energy_mj
        processes = {int(k[0]): t.energy_mj for k, t in totals(out, "process").items()}
        containers = {k[0]: t.energy_mj for k, t in totals(out, "container").items()}
        assert sum(containers.values()) <= zone.attributed_energy_mj  # (a process's share where it was listed)
        assert sum(processes.values()) <= zone.attributed_energy_mj
        pods_mj = {k[0]: t.energy_mj for k, t in totals(out, "pod").items()}
        assert pods_mj.get("p1", 0) == containers.get("a", 0) + containers.get("b", 0)
        assert pods_mj.get("p2", 0) == containers.get("c", 0)
        for total in out.totals:
            key = (total.scope, total.key)
            assert total.energy_mj >= last.get(key, 0)  # monotonic
            last[key] = total.energy_mj
