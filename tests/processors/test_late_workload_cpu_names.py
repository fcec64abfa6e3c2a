"""A late Workload (who an exited GPU process was, for the late shares of one device) names a pid the kernel may
have given to another process since. cpu_attribution looks Workloads up by pid (processors/_cpu_identity.py,
``Names``): where the new process is not a GPU process (no Workload of its own to come last), it took the late
one, and its CPU series, container's and pod's were labelled with the old pod's names, for the process's life
(an identity that is named is not worked out again). The k8s processor's memory of exited processes now also
survives a restart (tests/test_rev_restart_late_pods.py), so this reaches across restarts too.
"""

from __future__ import annotations

import dataclasses

from tests.helpers.context import make_context
from tests.processors.test_cpu_attribution import Node, processor, totals
from tests.processors.test_late_shares import late
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.records import DeviceAllocation, GpuProcessSample, GpuShare
from wattpipe.processors.k8s import K8sConfig, K8sProcessor

ZONE = "intel-rapl:0"


def test_a_cpu_process_that_got_the_pid_of_an_exited_gpu_process_is_not_named_after_its_pod() -> None:
    node = Node(zones={ZONE: ("package", 0, 0, 0)})
    names = K8sProcessor(K8sConfig(api="off"), make_context("k8s", clock=node.clock), env={})
    names.start()
    cpu = processor()
    owner = DeviceAllocation(
        time=node.clock.now(), device_id="G", resource_name="nvidia.com/gpu", pod_name="trainer", pod_namespace="ml",
        container_name="main",
    )  # fmt: skip

    def tick(on_gpu: list[int], shares: list[GpuShare]) -> Batch:
        now = node.clock.now()
        batch = node.batch().replace(
            gpu_processes=tuple(GpuProcessSample(time=now, device_id="G", pid=p) for p in on_gpu),
            allocations=(dataclasses.replace(owner, time=now),),
            shares=tuple(shares),
        )
        out = cpu.process(names.process(batch))
        node.clock.advance(5.0)
        return out

    node.spawn(7, container_id="a" * 64, pod_uid="uid-old")  # a GPU process of ml/trainer (pod-resources names it)
    tick([7], [])
    del node.procs[7]
    tick([], [])  # it exited; its GPU still holds some of its energy
    node.spawn(7, container_id="c9", pod_uid="p9")  # the kernel gives pid 7 to a CPU-only process in another pod
    node.procs[7] = dataclasses.replace(node.procs[7], start_time_ticks=9999)
    node.half_busy(ZONE, 10_000)
    node.run(7, 1.0)
    tick([], [late(node.clock, 7, 40)])  # the held energy of the old pid 7 is released
    node.half_busy(ZONE, 10_000)
    node.run(7, 1.0)
    out = tick([], [])
    pod = dict(totals(out, "pod")[("p9", "cpu:package")].extra)
    container = dict(totals(out, "container")[("c9", "cpu:package")].extra)
    process = dict(totals(out, "process")[("7", "cpu:package")].extra)
    assert (pod.get("pod_name"), container.get("container_name"), process.get("pod_name")) == (None, None, None)
