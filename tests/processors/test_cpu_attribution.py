"""CPU attribution as seed 002 defines it: zone delta × usage ratio = active, processes share it by CPU time,
containers / pods / VMs are sums of theirs; exact integer conservation per zone per tick, with churn and wraps."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.catalog import FAMILIES, labelled_values
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.families_cpu import CPU_FAMILIES
from wattpipe.pipeline.records import CpuZoneSample, HostProcess, NodeCpuTime, Totals, Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors._cpu_split import split_zone, usage_ratio
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.cpu_attribution import CpuAttributionConfig, CpuAttributionProcessor
from wattpipe.processors.energy import EnergyConfig, EnergyProcessor

BOOT_WALL_S = 1_700_000_000.0


@dataclass
class Node:
    """A hand-driven node: zone counters (µJ), /proc/stat (s), processes' CPU time (s), 5 s ticks."""

    clock: SteppedClock = field(default_factory=SteppedClock)
    zones: dict[str, tuple[str, int | None, int, int]] = field(default_factory=dict)  # path → zone, socket, uj, epoch
    total_s: float = 1000.0
    active_s: float = 100.0
    procs: dict[int, HostProcess] = field(default_factory=dict)
    listed: bool = True

    def batch(self) -> Batch:
        now = self.clock.now()
        zones = tuple(
            CpuZoneSample(time=now, zone=zone, path=path, socket=socket, energy_uj=uj, counter_epoch=epoch)
            for path, (zone, socket, uj, epoch) in self.zones.items()
        )
        fields = {
            "cpu_zones": zones,
            "node_cpu": (NodeCpuTime(time=now, total_s=self.total_s, active_s=self.active_s),),
        }
        if self.listed:
            fields["host_processes"] = tuple(self.procs.values())
        return Batch(time=now, interval_s=5.0, node="n").replace(**fields)

    def spawn(
        self,
        pid: int,
        cpu_s: float = 0.0,
        comm: str | None = None,
        container_id: str | None = None,
        pod_uid: str | None = None,
        vm_id: str | None = None,
    ) -> None:
        now = self.clock.now()
        self.procs[pid] = HostProcess(
            time=now,
            pid=pid,
            start_time_ticks=pid,
            cpu_time_s=cpu_s,
            start_wall_s=now.wall_s,
            comm=comm,
            container_id=container_id,
            pod_uid=pod_uid,
            vm_id=vm_id,
        )

    def run(self, pid: int, cpu_s: float) -> None:
        p = self.procs[pid]
        self.procs[pid] = HostProcess(
            time=self.clock.now(),
            pid=pid,
            start_time_ticks=p.start_time_ticks,
            cpu_time_s=(p.cpu_time_s or 0.0) + cpu_s,
            start_wall_s=p.start_wall_s,
            container_id=p.container_id,
            pod_uid=p.pod_uid,
            vm_id=p.vm_id,
            comm=p.comm,
        )

    def spend(self, path: str, mj: int) -> None:
        zone, socket, uj, epoch = self.zones[path]
        self.zones[path] = (zone, socket, uj + mj * 1000, epoch)

    def half_busy(self, path: str, mj: int) -> None:
        """A tick's ``mj`` on ``path`` while 5 of the node's 10 CPU seconds were active (usage ratio 0.5)."""
        self.spend(path, mj)
        self.total_s += 10.0
        self.active_s += 5.0


def processor(state: StateStore | None = None, **options: object) -> CpuAttributionProcessor:
    ctx = make_context("cpu_attribution", clock=SteppedClock(), pipeline="metrics", state=state)
    proc = CpuAttributionProcessor(CpuAttributionConfig(**options), ctx)
    proc.start()
    return proc


def step(proc: CpuAttributionProcessor, node: Node) -> Batch:
    out = proc.process(node.batch())
    node.clock.advance(5.0)
    return out


def restarted(proc: CpuAttributionProcessor, store: StateStore, **options: object) -> CpuAttributionProcessor:
    """``proc``'s state saved and read back by a new processor, as across a restart."""
    store.put("metrics/cpu_attribution", proc.snapshot())
    store.save()
    reloaded = StateStore(store.path, store.clock, store.node_name)
    reloaded.load()
    return processor(reloaded, **options)


def totals(b: Batch, scope: str) -> dict[tuple[str, str], Totals]:
    return {(t.key, t.device_id): t for t in b.totals if t.scope == scope}


def test_seed_example_40_w_at_25_percent_is_10_w_active_all_to_the_one_vm() -> None:
    # The guide's figure: 40 W, 25 % CPU usage → 10 W active, 30 W idle; the VM used all the CPU time.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(100, comm="qemu-kvm", vm_id="vm-1")
    proc = processor()
    step(proc, node)
    node.spend("intel-rapl:0", 200_000)  # 40 W × 5 s
    node.total_s += 20.0
    node.active_s += 5.0  # 25 %
    node.run(100, 5.0)
    out = step(proc, node)
    (power,) = out.device_power
    assert (power.energy_mj, power.active_energy_mj, power.idle_energy_mj) == (200_000, 50_000, 150_000)
    assert power.power_w == pytest.approx(40.0)
    assert power.active_w == pytest.approx(10.0)
    assert totals(out, "process")[("100", "cpu:package")].energy_mj == 50_000
    vm = totals(out, "vm")[("vm-1", "cpu:package")]  # a VM's series: scope "vm", a CPU zone type
    assert vm.energy_mj == 50_000
    assert vm.power_w == pytest.approx(10.0)


def test_processes_share_by_cpu_time_and_groups_are_sums() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0), "intel-rapl:0:0": ("dram", 0, 0, 0)})
    node.spawn(10, container_id="c1", pod_uid="p1")
    node.spawn(11, container_id="c1", pod_uid="p1")
    node.spawn(12, container_id="c2", pod_uid="p1")
    proc = processor()
    step(proc, node)
    node.spend("intel-rapl:0", 100_000)
    node.spend("intel-rapl:0:0", 10_000)
    node.total_s += 10.0
    node.active_s += 5.0  # ratio 0.5
    for pid, cpu_s in ((10, 1.0), (11, 3.0), (12, 1.0)):
        node.run(pid, cpu_s)
    out = step(proc, node)
    processes = totals(out, "process")
    assert [processes[(str(pid), "cpu:package")].energy_mj for pid in (10, 11, 12)] == [10_000, 30_000, 10_000]
    assert [processes[(str(pid), "cpu:dram")].energy_mj for pid in (10, 11, 12)] == [1_000, 3_000, 1_000]
    assert totals(out, "container")[("c1", "cpu:package")].energy_mj == 40_000
    assert totals(out, "pod")[("p1", "cpu:package")].energy_mj == 50_000
    by_zone = {t.device_id: t for t in out.device_totals}
    assert by_zone["intel-rapl:0"].attributed_energy_mj == 50_000
    assert by_zone["intel-rapl:0"].idle_energy_mj == 50_000


def test_new_process_first_tick_counts_and_exited_one_stays_terminated() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(20)
    proc = processor(terminated_retention=10.0)
    step(proc, node)
    node.spawn(21, cpu_s=2.0)  # started inside the next tick: its 2 s count
    node.run(20, 2.0)
    node.spend("intel-rapl:0", 40_000)
    node.total_s += 10.0
    node.active_s += 4.0
    out = step(proc, node)
    assert {k[0]: t.energy_mj for k, t in totals(out, "process").items()} == {"20": 8_000, "21": 8_000}
    del node.procs[21]
    node.spend("intel-rapl:0", 1_000)
    node.total_s += 10.0
    out = step(proc, node)
    gone = totals(out, "process")[("21", "cpu:package")]
    assert (gone.state, gone.energy_mj, gone.power_w) == ("terminated", 8_000, 0.0)
    for _ in range(3):
        out = step(proc, node)
    assert ("21", "cpu:package") not in totals(out, "process")  # past the retention


def test_reset_epoch_is_a_baseline_and_unlisted_ticks_active_energy_is_held() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 5_000_000, 0)})
    node.spawn(30)
    proc = processor()
    step(proc, node)
    node.zones["intel-rapl:0"] = ("package", 0, 1_000, 1)  # reset: no energy from across epochs
    node.total_s += 10.0
    assert step(proc, node).device_power == ()
    node.listed = False
    node.spend("intel-rapl:0", 9_000)
    node.total_s += 10.0
    node.active_s += 10.0
    (power,) = step(proc, node).device_power
    assert power.idle_w == 0.0  # the ratio is known: only the process listing failed
    assert power.unattributable == "processes_unknown"  # nobody's watts are known this tick
    assert (power.active_energy_mj, power.held_energy_mj) == (0, 9_000)  # held for the next listing's deltas
    zone = proc.zone_totals["intel-rapl:0"]
    assert (zone.energy_mj, zone.unattributed_mj) == (0, 0)  # the totals take it when it is released


def test_idle_mode_bills_only_energy_above_the_configured_idle() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0), "intel-rapl:1": ("package", 1, 0, 0)})
    node.spawn(40)
    proc = processor(mode="idle", idle_w={"package": 40.0})
    step(proc, node)
    for path in ("intel-rapl:0", "intel-rapl:1"):
        node.spend(path, 130_000)  # 26 W each; idle 20 W each
    node.total_s += 10.0
    node.active_s += 1.0
    node.run(40, 1.0)
    out = step(proc, node)
    assert [p.idle_energy_mj for p in out.device_power] == [100_000, 100_000]
    assert totals(out, "process")[("40", "cpu:package")].energy_mj == 60_000  # both sockets, one series


def test_idle_mode_needs_idle_values_or_learning() -> None:
    with pytest.raises(ValueError, match="idle_w"):
        CpuAttributionConfig(mode="idle", learn_idle=False)
    assert CpuAttributionConfig(mode="idle").learn_idle


def test_idle_mode_learns_a_zones_idle_from_power_against_usage() -> None:
    # One package: 40 W idle + 150 W at full usage; the load moves between 10 % and 40 % of the CPUs.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(80)
    proc = processor(mode="idle")
    step(proc, node)
    out = None
    for i in range(20):
        ratio = (0.1, 0.25, 0.4, 0.2)[i % 4]
        node.spend("intel-rapl:0", round((40.0 + 150.0 * ratio) * 5 * 1000))
        node.total_s += 10.0
        node.active_s += 10.0 * ratio
        node.run(80, 10.0 * ratio)
        out = step(proc, node)
    assert out is not None
    (power,) = out.device_power
    assert power.idle_source == "regression"
    assert power.idle_w == pytest.approx(40.0, abs=0.01)
    assert power.active_w == pytest.approx(150.0 * 0.2, abs=0.01)  # the last tick's ratio: everything above idle


def test_cpu_totals_render_only_in_cpu_families() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(50, comm="nginx", container_id="c5")
    proc = processor()
    step(proc, node)
    node.half_busy("intel-rapl:0", 10_000)
    node.run(50, 1.0)
    out = step(proc, node)
    by_name = {f.kepler: f for f in FAMILIES}
    assert labelled_values(by_name["kepler_process_gpu_joules_total"], out, "kepler") == []
    ((labels, joules, _),) = labelled_values(by_name["kepler_process_cpu_joules_total"], out, "kepler")
    assert joules == 5.0
    assert {k: labels[k] for k in ("pid", "zone", "comm", "type", "container_id", "state")} == {
        "pid": "50",
        "zone": "package",
        "comm": "nginx",
        "type": "container",
        "container_id": "c5",
        "state": "running",
    }
    ((node_labels, node_joules, _),) = labelled_values(by_name["kepler_node_cpu_joules_total"], out, "kepler")
    assert node_joules == 10.0
    assert node_labels == {"zone": "package", "path": "intel-rapl:0"}
    assert labelled_values(by_name["kepler_node_gpu_joules_total"], out, "kepler") == []
    assert all(f in FAMILIES for f in CPU_FAMILIES)
    ((otel_labels, otel_joules, _),) = labelled_values(by_name["kepler_process_cpu_joules_total"], out, "otel")
    assert otel_joules == 5.0
    assert {k: otel_labels[k] for k in ("process.pid", "wattpipe.cpu.zone", "wattpipe.process.type")} == {
        "process.pid": "50",
        "wattpipe.cpu.zone": "package",
        "wattpipe.process.type": "container",
    }
    assert by_name["kepler_process_cpu_joules_total"].otel == "wattpipe.process.cpu.energy"


@st.composite
def ticks(draw: st.DrawFn) -> list[tuple[list[int], float, dict[int, float]]]:
    """Each tick: two zones' mJ, the usage ratio, and the live processes' CPU seconds (churn: pids come and go)."""
    out = []
    for _ in range(draw(st.integers(2, 8))):
        # A negative spend is a reset: the receiver's counter_epoch goes up and the counter starts again.
        mj = draw(st.lists(st.integers(-1, 500_000), min_size=2, max_size=2))
        ratio = draw(st.floats(0.0, 1.0))
        live = draw(st.dictionaries(st.integers(2, 12), st.one_of(st.just(0.0), st.floats(0.01, 40.0)), max_size=6))
        out.append((mj, ratio, live))
    return out


@settings(max_examples=60, deadline=None)
@given(ticks(), st.integers(0, 2**32 - 1))
def test_conservation_per_zone_per_tick_with_churn_and_wraps(
    plan: list[tuple[list[int], float, dict[int, float]]], start_uj: int
) -> None:
    # The receiver hands over wrap-corrected counters that may start anywhere (a wrap added back is just a
    # large value): every tick, per zone, idle + Σ processes + unattributed == the counter's delta, and the
    # totals never fall.
    node = Node(zones={"intel-rapl:0": ("package", 0, start_uj, 0), "intel-rapl:0:0": ("dram", 0, start_uj, 0)})
    proc = processor()
    step(proc, node)
    previous: dict[tuple[str, str, str], int] = {}
    for mj, ratio, live in plan:
        for pid in list(node.procs):
            if pid not in live:
                del node.procs[pid]
        for pid, cpu_s in live.items():
            node.run(pid, cpu_s) if pid in node.procs else node.spawn(pid, cpu_s=cpu_s)
        for path, spend in zip(("intel-rapl:0", "intel-rapl:0:0"), mj, strict=True):
            if spend < 0:
                kind, socket, _, epoch = node.zones[path]
                node.zones[path] = (kind, socket, 0, epoch + 1)
            else:
                node.spend(path, spend)
        node.total_s += 100.0
        node.active_s += 100.0 * ratio
        out = step(proc, node)
        assert len(out.device_power) == sum(1 for spend in mj if spend >= 0)  # a reset tick is a baseline
        for power in out.device_power:
            zone = power.device_name
            billed = sum(t.power_w or 0.0 for t in out.totals if t.scope == "process" and t.device_id == f"cpu:{zone}")
            assert power.idle_energy_mj + power.active_energy_mj == power.energy_mj
            assert billed * 5.0 * 1000 == pytest.approx(
                power.active_energy_mj - (power.active_energy_mj if not any(live.values()) else 0), abs=1e-6
            )
        for t in out.totals:
            key = (t.scope, t.key, t.device_id)
            assert t.energy_mj >= previous.get(key, 0)
            previous[key] = t.energy_mj
    for path, z in proc.zone_totals.items():
        processes = sum(t.energy_mj for t in out.totals if t.scope == "process" and t.device_id == f"cpu:{z.zone}")
        assert z.idle_mj + (z.active_mj - z.unattributed_mj) + z.unattributed_mj == z.energy_mj, path
        assert processes <= z.active_mj - z.unattributed_mj  # less only by series pruned after exit


def test_usage_ratio_and_split_edges() -> None:
    assert usage_ratio(5.0, 0.0) is None
    assert usage_ratio(15.0, 10.0) == 1.0
    s = split_zone(1001, [1.0, 1.0, 1.0], 0.5)
    assert (s.idle_mj, s.active_mj, sum(s.shares_mj), s.unattributed_mj) == (501, 500, 500, 0)  # round half to even
    none = split_zone(1000, [0.0, 0.0], 0.5)
    assert none.unattributed_mj == 500
    assert none.shares_mj == [0, 0]
    with pytest.raises(ValueError, match="negative"):
        split_zone(-1, [], 0.5)


def test_totals_go_on_across_a_restart(tmp_path: Path) -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(60, container_id="c6", pod_uid="p6")
    store = StateStore(tmp_path / "s.json", node.clock, "n")
    proc = processor(store)
    step(proc, node)
    node.half_busy("intel-rapl:0", 20_000)
    node.run(60, 5.0)
    step(proc, node)
    again = restarted(proc, store)
    step(again, node)  # a baseline: the counters' first reading since the restart
    node.half_busy("intel-rapl:0", 20_000)
    node.run(60, 5.0)
    out = step(again, node)
    assert totals(out, "process")[("60", "cpu:package")].energy_mj == 20_000
    assert totals(out, "pod")[("p6", "cpu:package")].energy_mj == 20_000
    (zone,) = out.device_totals
    assert (zone.energy_mj, zone.idle_energy_mj, zone.attributed_energy_mj) == (40_000, 20_000, 20_000)


def test_without_rapl_the_batch_passes_untouched() -> None:
    # A GPU node without RAPL (the rapl receiver leaves cpu_zones absent): the GPU path alone.
    proc = processor()
    batch = Batch(time=SteppedClock().now(), interval_s=5.0, node="n")
    assert proc.process(batch) is batch


def test_processes_without_cpu_time_leave_the_energy_unattributed() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.procs[70] = HostProcess(time=node.clock.now(), pid=70, start_time_ticks=70)  # cpu_time: false
    proc = processor()
    step(proc, node)
    node.half_busy("intel-rapl:0", 10_000)
    out = step(proc, node)
    assert [t for t in out.totals if t.scope == "process"] == []
    assert proc.zone_totals["intel-rapl:0"].unattributed_mj == 5_000


def test_without_node_cpu_time_the_idle_watts_are_absent() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(90)
    proc = processor()
    step(proc, node)
    node.spend("intel-rapl:0", 10_000)
    node.run(90, 1.0)
    batch = node.batch()
    out = proc.process(batch.replace(node_cpu=(), present=batch.present - {"node_cpu"}))
    (power,) = out.device_power
    assert power.idle_w is None  # unknown, not 0
    assert (power.active_energy_mj, power.unattributable) == (10_000, "processes_unknown")


def test_cpu_only_containers_and_pods_are_named_from_the_k8s_roster() -> None:
    # The k8s processor names GPU processes by pid; every other container and pod through its roster entries.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(95, container_id="c9", pod_uid="p9")
    proc = processor()
    roster = (
        Workload(time=node.clock.now(), pid=None, container_id="c9", container_name="web", pod_uid="p9",
                 pod_name="shop", pod_namespace="prod", listed="api"),
        Workload(time=node.clock.now(), pid=None, pod_uid="p9", pod_name="shop", pod_namespace="prod", listed="api"),
    )  # fmt: skip
    proc.process(node.batch().replace(workloads=roster))
    node.clock.advance(5.0)
    node.half_busy("intel-rapl:0", 10_000)
    node.run(95, 1.0)
    out = proc.process(node.batch().replace(workloads=roster))
    container = totals(out, "container")[("c9", "cpu:package")]
    pod = totals(out, "pod")[("p9", "cpu:package")]
    assert dict(container.extra)["container_name"] == "web"
    assert (dict(pod.extra)["pod_name"], dict(pod.extra)["pod_namespace"]) == ("shop", "prod")
    assert dict(totals(out, "process")[("95", "cpu:package")].extra)["pod_name"] == "shop"


def test_gpu_processors_after_it_leave_cpu_zones_alone() -> None:
    # cpu_attribution placed before attribution and energy: they neither split nor total the CPU zones.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(99)
    proc = processor()
    attribution = AttributionProcessor(AttributionConfig(), make_context("attribution", clock=node.clock))
    energy = EnergyProcessor(EnergyConfig(), make_context("energy", clock=node.clock))
    step(proc, node)
    node.half_busy("intel-rapl:0", 10_000)
    node.run(99, 1.0)
    out = energy.process(attribution.process(proc.process(node.batch().replace(gpu_processes=()))))
    assert out.shares == ()
    assert [(d.device_id, d.energy_mj) for d in out.device_totals] == [("intel-rapl:0", 10_000)]  # cpu_attribution's
    assert [t.key for t in out.totals if t.scope == "process"] == ["99"]


def test_after_a_restart_a_listed_idle_processs_pod_stays_running_and_keeps_its_total(tmp_path: Path) -> None:
    # Restored groups know no members yet: the processes listed decide whether they are running. A pod whose
    # process is listed but idle must not end (nor be pruned and start again from 0) after a restart.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(70, container_id="c7", pod_uid="p7", vm_id=None)
    store = StateStore(tmp_path / "s.json", node.clock, "n")
    proc = processor(store, terminated_retention=5.0)
    step(proc, node)
    node.half_busy("intel-rapl:0", 20_000)
    node.run(70, 5.0)
    step(proc, node)
    again = restarted(proc, store, terminated_retention=5.0)
    out = step(again, node)  # a baseline: no shares this tick, the process still listed
    assert {t.state for t in out.totals} == {"running"}
    for _ in range(3):  # idle ticks, longer than the retention
        node.total_s += 10.0
        out = step(again, node)
        assert totals(out, "pod")[("p7", "cpu:package")].state == "running"
        assert totals(out, "container")[("c7", "cpu:package")].energy_mj == 10_000
    node.half_busy("intel-rapl:0", 20_000)
    node.run(70, 5.0)
    out = step(again, node)
    assert totals(out, "process")[("70", "cpu:package")].energy_mj == 20_000
    assert totals(out, "pod")[("p7", "cpu:package")].energy_mj == 20_000
    assert totals(out, "container")[("c7", "cpu:package")].energy_mj == 20_000


def _started_at(node: Node, pid: int, seconds_ago: float) -> None:
    node.procs[pid] = replace(node.procs[pid], start_wall_s=node.clock.now().wall_s - seconds_ago)


def test_a_process_started_while_the_listing_failed_counts_from_its_start() -> None:
    # The readings the next delta is taken from are the last listing's: a process that started after it (during
    # a failed listing) counts all its CPU time, as the older processes count theirs since that listing.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(1)
    proc = processor()
    step(proc, node)  # t = 0: the last listing
    node.spawn(2, cpu_s=2.0)
    _started_at(node, 2, 2.0)  # started at 3 s, between that listing and the failed one
    node.run(1, 2.0)
    node.listed = False
    node.half_busy("intel-rapl:0", 10_000)
    step(proc, node)  # t = 5: /proc did not answer, the tick's 5 J active held
    node.listed = True
    node.run(1, 2.0)
    node.run(2, 2.0)
    node.half_busy("intel-rapl:0", 10_000)
    out = step(proc, node)  # t = 10: both used 4 s since the t = 0 listing, of both ticks' 10 J active
    assert {k[0]: t.energy_mj for k, t in totals(out, "process").items()} == {"1": 5_000, "2": 5_000}


def test_a_start_time_a_clock_tick_before_the_last_listing_still_counts_its_first_tick() -> None:
    # start_time (clock ticks) and /proc/uptime are both truncated to 10 ms: a process that started just after
    # the last listing can read up to ~10 ms before it. Not listed then, it is new: its first tick counts.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(1)
    proc = processor()
    step(proc, node)  # t = 0
    node.spawn(2, cpu_s=2.0)
    _started_at(node, 2, 5.01)  # 10 ms before the t = 0 listing
    node.run(1, 2.0)
    node.spend("intel-rapl:0", 8_000)
    node.total_s += 10.0
    node.active_s += 4.0
    out = step(proc, node)
    assert {k[0]: t.energy_mj for k, t in totals(out, "process").items()} == {"1": 1_600, "2": 1_600}


def test_a_pid_two_listings_name_counts_once_its_last_record_as_the_gpu_side_reads_it() -> None:
    # Two procfs receivers (two /proc roots) can both list a pid. The energy, attribution and k8s processors
    # read a batch's processes by pid (the last record of a pid is the process): so does this one. Two series
    # for one pid would carry the same labels.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(7, cpu_s=10.0)
    other = replace(node.procs[7], start_time_ticks=99, cpu_time_s=50.0, comm="other")
    proc = processor()
    proc.process(node.batch().replace(host_processes=(*node.procs.values(), other)))
    node.clock.advance(5.0)
    node.run(7, 1.0)
    other = replace(other, time=node.clock.now(), cpu_time_s=53.0)
    node.half_busy("intel-rapl:0", 40_000)
    out = proc.process(node.batch().replace(host_processes=(*node.procs.values(), other)))
    (process,) = [t for t in out.totals if t.scope == "process"]
    assert (process.key, process.energy_mj, dict(process.extra)["comm"]) == ("7", 20_000, "other")


@settings(max_examples=40, deadline=None)
@given(ticks())
def test_groups_are_the_sums_of_their_processes_and_the_zones_attributed_energy_with_churn(
    plan: list[tuple[list[int], float, dict[int, float]]],
) -> None:
    # Every tick, nothing pruned: each container, pod and VM total is the sum of its processes' totals per zone
    # type, and the processes' totals per zone type are the zones' attributed energy, to the millijoule. A pid
    # that comes back is a new process (a new start time).
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0), "intel-rapl:1": ("package", 1, 0, 0)})
    proc = processor(terminated_retention=1e9, max_terminated=10_000)
    step(proc, node)
    starts = iter(range(1000, 10_000))
    for mj, ratio, live in plan:
        for pid in list(node.procs):
            if pid not in live:
                del node.procs[pid]
        for pid, cpu_s in live.items():
            if pid in node.procs:
                node.run(pid, cpu_s)
                continue
            node.spawn(pid, cpu_s=cpu_s, container_id=f"c{pid % 3}", pod_uid=f"p{pid % 2}", vm_id=f"v{pid % 4}")
            node.procs[pid] = replace(node.procs[pid], start_time_ticks=next(starts))
        for path, spend in zip(("intel-rapl:0", "intel-rapl:1"), mj, strict=True):
            node.spend(path, max(spend, 0))
        node.total_s += 100.0
        node.active_s += 100.0 * ratio
        step(proc, node)
        by_process: dict[tuple[str, str, str], int] = {}
        for (pid, _, zone), series in proc.series.processes.items():
            groups = (("container", f"c{pid % 3}"), ("pod", f"p{pid % 2}"), ("vm", f"v{pid % 4}"))
            for scope, key in groups:
                by_process[(scope, key, zone)] = by_process.get((scope, key, zone), 0) + series.energy_mj
        groups_mj = {key: s.energy_mj for key, s in proc.series.groups.items()}
        assert {k: v for k, v in by_process.items() if v} == {k: v for k, v in groups_mj.items() if v}
        attributed = sum(z.active_mj - z.unattributed_mj for z in proc.zone_totals.values())
        assert sum(s.energy_mj for s in proc.series.processes.values()) == attributed


def test_idle_mode_keeps_each_zones_share_of_the_idle_when_another_zone_of_its_type_did_not_answer() -> None:
    # idle_w is the node's, split over the zone type's zones: one socket missing from a tick (unreadable, its
    # counter's file gone) does not hand its share of the idle to the other.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0), "intel-rapl:1": ("package", 1, 0, 0)})
    node.spawn(40)
    proc = processor(mode="idle", idle_w={"package": 40.0})
    step(proc, node)
    del node.zones["intel-rapl:1"]
    node.spend("intel-rapl:0", 130_000)  # 26 W; its idle 20 W
    node.total_s += 10.0
    node.active_s += 1.0
    node.run(40, 1.0)
    (power,) = step(proc, node).device_power
    assert (power.idle_energy_mj, power.active_energy_mj) == (100_000, 30_000)


def test_a_pod_named_later_relabels_the_process_series_of_every_zone_type() -> None:
    # A process's series are kept with its identity; when the k8s roster names its pod, a new identity is made
    # and each of its series (package and dram) takes the new labels at its next share.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0), "intel-rapl:0:0": ("dram", 0, 0, 0)})
    node.spawn(60, container_id="c6", pod_uid="p6")
    proc = processor()
    step(proc, node)
    for named in (False, True):
        node.half_busy("intel-rapl:0", 10_000)
        node.spend("intel-rapl:0:0", 2_000)
        node.run(60, 1.0)
        roster = (
            Workload(time=node.clock.now(), pid=None, container_id="c6", container_name="web", pod_uid="p6",
                     pod_name="shop", pod_namespace="prod", listed="api"),
        ) if named else ()  # fmt: skip
        out = proc.process(node.batch().replace(workloads=roster))
        node.clock.advance(5.0)
        for zone in ("package", "dram"):
            assert dict(totals(out, "process")[("60", f"cpu:{zone}")].extra).get("pod_name") == (
                "shop" if named else None
            ), zone
            assert dict(totals(out, "container")[("c6", f"cpu:{zone}")].extra).get("container_name") == (
                "web" if named else None
            ), zone


def test_a_container_ends_when_its_last_process_exits_not_before() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(80, container_id="c8")
    node.spawn(81, container_id="c8")
    proc = processor()
    step(proc, node)
    node.half_busy("intel-rapl:0", 10_000)
    node.run(80, 1.0)
    node.run(81, 1.0)
    step(proc, node)
    for gone, state in ((80, "running"), (81, "terminated")):
        del node.procs[gone]
        node.total_s += 10.0  # idle ticks: no shares, so only the members say whether it runs
        out = step(proc, node)
        assert totals(out, "container")[("c8", "cpu:package")].state == state
        assert totals(out, "process")[(str(gone), "cpu:package")].state == "terminated"


def test_a_container_ends_when_its_last_processs_pid_is_another_processs_at_the_next_listing() -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(90, container_id="c9")
    proc = processor()
    step(proc, node)
    node.half_busy("intel-rapl:0", 10_000)
    node.run(90, 1.0)
    step(proc, node)
    node.procs[90] = replace(
        node.procs[90], time=node.clock.now(), start_time_ticks=91, cpu_time_s=0.0, container_id=None
    )
    node.total_s += 10.0
    out = step(proc, node)
    assert totals(out, "container")[("c9", "cpu:package")].state == "terminated"
    assert totals(out, "process")[("90", "cpu:package")].state == "terminated"


def test_a_process_that_execs_into_another_container_is_billed_to_it_from_then_on() -> None:
    # procfs reads a process again when exec changes its comm: a container's first process is runc's
    # (``runc:[2:INIT]``) until its runtime starts it, and a runtime may place it in its cgroup late. The same
    # (pid, start time) then comes with another comm and container: its series follows, its energy continuous;
    # the new container is billed from that tick on, and the old one ends with its last member gone.
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(70, comm="runc:[2:INIT]", container_id="shim")
    proc = processor()
    step(proc, node)
    node.half_busy("intel-rapl:0", 10_000)
    node.run(70, 1.0)
    before = step(proc, node)
    assert totals(before, "container")[("shim", "cpu:package")].energy_mj == 5_000
    node.procs[70] = replace(node.procs[70], comm="python3", container_id="c7", pod_uid="p7")
    for tick in (1, 2):
        node.half_busy("intel-rapl:0", 10_000)
        node.run(70, 1.0)
        out = step(proc, node)
        process = totals(out, "process")[("70", "cpu:package")]
        assert (dict(process.extra)["comm"], dict(process.extra)["container_id"]) == ("python3", "c7")
        assert process.energy_mj == 5_000 * (tick + 1)
        assert totals(out, "container")[("c7", "cpu:package")].energy_mj == 5_000 * tick
        assert totals(out, "pod")[("p7", "cpu:package")].energy_mj == 5_000 * tick
        shim = totals(out, "container")[("shim", "cpu:package")]
        assert (shim.energy_mj, shim.state) == (5_000, "terminated")
