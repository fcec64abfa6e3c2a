"""The node CPU families over OTLP (issue 17): the usage ratio as a gauge, each logical CPU as an info point
with its /proc/cpuinfo attributes, each process's CPU seconds as a monotonic cumulative sum in seconds."""

from __future__ import annotations

from tests.exporters.test_otlp import at, make_exporter, metrics_of, receiver, run  # noqa: F401 - receiver: fixture
from tests.helpers.otlp_receiver import CUMULATIVE, OtlpReceiver, attributes
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.records import HostProcess, NodeCpuTime
from wattpipe.pipeline.records_cpu import CpuInfo


def test_usage_ratio_cpu_info_and_process_cpu_time(receiver: OtlpReceiver) -> None:  # noqa: F811
    t = at(0.0)
    records = [
        HostProcess(time=t, pid=7001, comm="qemu-system-x86", cpu_time_s=42.5, vm_id="6f1c"),
        HostProcess(time=t, pid=12, comm="kthreadd"),  # no CPU time read (cpu_time: false): no point
        NodeCpuTime(time=t, total_s=4000.0, active_s=1000.0, cpu_count=2, usage_ratio=0.375),
        CpuInfo(time=t, processor="0", vendor_id="AuthenticAMD", model_name="AMD EPYC", physical_id="0", core_id="0"),
        CpuInfo(time=t, processor="1"),
    ]
    run(make_exporter(receiver.grpc_endpoint), Batch(time=t, interval_s=5.0, node="n1").with_records(records))
    (received,) = receiver.wait_for_requests(1, "grpc")
    metrics = metrics_of(received.request)

    ratio = metrics["system.cpu.utilization"]
    assert ratio.unit == "1"
    (point,) = ratio.gauge.data_points
    assert point.as_double == 0.375
    assert attributes(point.attributes) == {}

    info = [attributes(p.attributes) for p in metrics["wattpipe.cpu.info"].gauge.data_points]
    assert info == [
        {
            "cpu.logical_number": 0,
            "host.cpu.vendor.id": "AuthenticAMD",
            "host.cpu.model.name": "AMD EPYC",
            "wattpipe.cpu.physical_id": "0",  # Kepler's labels are text; only OTel's cpu.logical_number is an int
            "wattpipe.cpu.core_id": "0",
        },
        {"cpu.logical_number": 1},  # what the kernel does not write is absent, not empty
    ]
    assert [p.as_double for p in metrics["wattpipe.cpu.info"].gauge.data_points] == [1.0, 1.0]

    seconds = metrics["process.cpu.time"]
    assert seconds.unit == "s"
    assert seconds.sum.is_monotonic
    assert seconds.sum.aggregation_temporality == CUMULATIVE
    (process,) = seconds.sum.data_points
    assert process.as_double == 42.5
    assert attributes(process.attributes) == {
        "process.pid": 7001,
        "process.command": "qemu-system-x86",
        "wattpipe.process.type": "vm",
        "wattpipe.vm.id": "6f1c",
    }


def test_a_record_kept_from_an_earlier_read_is_sent_at_the_ticks_time(receiver: OtlpReceiver) -> None:  # noqa: F811
    """procfs hands on the record of a process whose cgroup ran nothing as it was first read (its value holds
    now): its point is stamped with the tick that sends it, not with that old read, which a backend would
    take for a repeated sample and let go stale. A record read during the tick keeps its own time."""
    kept = HostProcess(time=at(0.0), pid=10, comm="idle", cpu_time_s=1.0)
    fresh = HostProcess(time=at(15.25), pid=11, comm="busy", cpu_time_s=3.0)
    tick = at(15.0)
    run(make_exporter(receiver.grpc_endpoint), Batch(time=tick, interval_s=5.0, node="n1").with_records([kept, fresh]))
    (received,) = receiver.wait_for_requests(1, "grpc")
    points = metrics_of(received.request)["process.cpu.time"].sum.data_points
    times = {attributes(p.attributes)["process.pid"]: p.time_unix_nano for p in points}
    assert times == {10: tick.wall_ns, 11: at(15.25).wall_ns}
