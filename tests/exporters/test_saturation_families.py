"""Saturation records rendered by the Prometheus exporter in both namings, and the catalog's signal list."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.context import make_context
from tests.helpers.otlp_receiver import OtlpReceiver, attributes
from wattpipe.exporters.otlp import OtlpConfig, OtlpExporter
from wattpipe.exporters.prometheus import PrometheusConfig, PrometheusExporter
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.families_saturation import SATURATION_SIGNALS
from wattpipe.pipeline.records import ClusterGpu, DeviceSample, Saturation
from wattpipe.processors._saturation_signals import SIGNALS

T = Timestamp(100.0, 1_700_000_100.0)
GPU = "GPU-00000000-0000-0000-0000-000000000001"


def _render(naming: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    records = [
        DeviceSample(time=T, device_id=GPU, device_index=0),
        Saturation(time=T, device_id=GPU, signal="throttle_power", value=0.25, window_s=60.0),
        Saturation(
            time=T,
            device_id=GPU,
            signal="throttle_power",
            value=0.25,
            window_s=60.0,
            saturation_scope="device_shared",
            pod_name="p",
            pod_namespace="ns",
            container_name="c",
        ),
        Saturation(
            time=T,
            device_id=GPU,
            gpu_instance_id=3,
            signal="memory_used_max",
            value=0.95,
            window_s=60.0,
            saturation_scope="instance",
        ),
    ]
    exporter = PrometheusExporter(
        PrometheusConfig.model_validate({"listen": "127.0.0.1:0", "naming": naming}),
        make_context("prometheus", "exporter"),
    )
    exporter.render(Batch(time=T, interval_s=1.0, node="n").with_records(records))
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(exporter.body.decode())
        if f.samples
    }


def test_kepler_naming_renders_device_pod_and_instance_series() -> None:
    families = _render("kepler")
    [(labels, value)] = families["wattpipe_gpu_throttle_power_ratio"]
    assert (value, labels["gpu_uuid"], labels["scope"], labels["gpu"]) == (0.25, GPU, "device", "0")
    assert "gpu_instance_id" not in labels  # absent, not empty
    [(labels, value)] = families["wattpipe_pod_gpu_throttle_power_ratio"]
    assert (labels["pod_name"], labels["pod_namespace"], labels["container_name"], labels["scope"]) == (
        "p",
        "ns",
        "c",
        "device_shared",
    )
    [(labels, value)] = families["wattpipe_gpu_memory_used_max_ratio"]
    assert (labels["gpu_instance_id"], labels["scope"], value) == ("3", "instance", 0.95)
    assert "wattpipe_gpu_throttle_thermal_ratio" not in families  # no record, no series


def test_otel_naming() -> None:
    families = _render("otel")
    [(labels, value)] = families["wattpipe_gpu_saturation_throttle_power"]
    assert (value, labels["hw_id"], labels["wattpipe_saturation_scope"]) == (0.25, GPU, "device")
    [(labels, _)] = families["wattpipe_pod_gpu_saturation_throttle_power"]
    assert labels["k8s_pod_name"] == "p"


def test_every_signal_the_processor_makes_has_a_family() -> None:
    assert [name for name, _, _ in SATURATION_SIGNALS] == list(SIGNALS)


def test_otlp_sends_saturation_and_cluster_gauges() -> None:
    records = [
        Saturation(
            time=T, device_id=GPU, signal="memory_pressure", value=0.5, window_s=60.0, pod_name="p", pod_namespace="ns"
        ),
        ClusterGpu(time=T, resource_name="nvidia.com/gpu", pending_pod_count=3, requested_allocatable_ratio=0.75),
    ]
    with OtlpReceiver() as receiver:
        config = OtlpConfig(endpoint=receiver.grpc_endpoint, insecure=True, timeout=0.5, shutdown_timeout=2.0)
        exporter = OtlpExporter(config, make_context("otlp", "exporter", node_name="n"))

        async def go() -> None:
            exporter.start()
            await exporter.export(Batch(time=T, interval_s=1.0, node="n").with_records(records))
            await exporter.shutdown()

        asyncio.run(go())
        (received,) = receiver.wait_for_requests(1, "grpc")
    metrics = {m.name: m for rm in received.request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    (point,) = metrics["wattpipe.pod.gpu.saturation.memory_pressure"].gauge.data_points
    assert point.as_double == 0.5
    assert attributes(point.attributes)["k8s.pod.name"] == "p"
    assert metrics["wattpipe.pod.gpu.saturation.memory_pressure"].unit == "1"
    (pending,) = metrics["wattpipe.cluster.gpu.pending_pod_count"].gauge.data_points
    assert (pending.as_double or pending.as_int) == 3
    assert attributes(pending.attributes)["k8s.resource.name"] == "nvidia.com/gpu"
    assert "wattpipe.cluster.gpu.pending_request_total" not in metrics  # switched off: None, no point
