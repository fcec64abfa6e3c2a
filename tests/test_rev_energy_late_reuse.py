"""Held energy released for an exited process whose pid the kernel already gave to a process on another GPU
(the rev-energy review). The process series was right (the late share goes to the ended series on its own
GPU), but its container and pod were taken from this tick's Workload for the pid, which is the new process's:
the old pod's late energy was billed to the new pod.

Fixed by keying late workloads by (pid, device): the k8s processor remembers each (pid, device) the driver
stops listing, even while the pid is listed on another device, and its late Workload carries ``device_id`` in
``extra``; the energy processor gives a late share the Workload of its (pid, device) first. The late
Workloads come before the pids' own, so a consumer keyed by pid alone (cpu_attribution) keeps the pid's own.
"""

from __future__ import annotations

from tests.processors.test_idle_energy import energy
from tests.processors.test_late_shares import k8s, late, power_of, running
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import GpuProcessSample, GpuShare, HostProcess


def test_late_energy_of_a_pid_reused_on_another_gpu_reaches_the_old_pod() -> None:
    clock = SteppedClock()
    names, totals = k8s(clock), energy(clock)

    def tick(listed: list[tuple[int, str]], hosts: list[HostProcess], shares: list[GpuShare]) -> Batch:
        now = clock.now()
        devices = sorted({"G", "H", *(s.device_id for s in shares)})
        batch = Batch(time=now, interval_s=5.0, node="n").replace(
            device_power=tuple(
                power_of(clock, d, sum(s.energy_mj for s in shares if s.device_id == d)) for d in devices
            ),
            gpu_processes=tuple(GpuProcessSample(time=now, device_id=d, pid=p) for p, d in listed),
            host_processes=tuple(hosts),
            shares=tuple(shares),
        )
        out = totals.process(names.process(batch))
        clock.advance(5.0)
        return out

    old = HostProcess(time=clock.now(), pid=7, start_time_ticks=100, container_id="a" * 64, pod_uid="uid-old")
    new = HostProcess(time=clock.now(), pid=7, start_time_ticks=900, container_id="b" * 64, pod_uid="uid-new")
    tick([(7, "G")], [old], [running(clock, 7, 100)])
    tick([], [], [])  # pid 7 exits; GPU G still holds some of its energy
    b = tick([(7, "H")], [new], [running(clock, 7, 30, "H"), late(clock, 7, 40)])
    pods = sorted((t.key, t.device_id, t.energy_mj) for t in b.totals if t.scope == "pod")
    assert pods == [("uid-new", "H", 30), ("uid-old", "G", 140)]


def test_the_pid_own_workload_comes_last_and_the_late_one_names_its_device() -> None:
    clock = SteppedClock()
    names = k8s(clock)

    def tick(listed: list[tuple[int, str]], hosts: list[HostProcess], shares: list[GpuShare]) -> Batch:
        now = clock.now()
        batch = Batch(time=now, interval_s=5.0, node="n").replace(
            gpu_processes=tuple(GpuProcessSample(time=now, device_id=d, pid=p) for p, d in listed),
            host_processes=tuple(hosts),
            shares=tuple(shares),
        )
        out = names.process(batch)
        clock.advance(5.0)
        return out

    old = HostProcess(time=clock.now(), pid=7, start_time_ticks=100, container_id="a" * 64, pod_uid="uid-old")
    new = HostProcess(time=clock.now(), pid=7, start_time_ticks=900, container_id="b" * 64, pod_uid="uid-new")
    tick([(7, "G")], [old], [])
    tick([], [], [])
    out = tick([(7, "H")], [new], [running(clock, 7, 30, "H"), late(clock, 7, 40)])
    sevens = [(w.pod_uid, dict(w.extra).get("device_id")) for w in out.workloads if w.pid == 7]
    assert sevens == [("uid-old", "G"), ("uid-new", None)]
