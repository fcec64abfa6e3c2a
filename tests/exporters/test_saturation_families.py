"""Saturation records rendered by the Prometheus exporter in both namings, and the catalog's signal list."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.context import make_context
from wattpipe.exporters.prometheus import PrometheusConfig, PrometheusExporter
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.families import SATURATION_SIGNALS
from wattpipe.pipeline.records import DeviceSample, Saturation
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
