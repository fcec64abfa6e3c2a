"""Exporter ``prometheus``: catalog families on /metrics, in joules, rendered per tick and served from memory."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from tests.helpers.context import make_context
from tests.helpers.reference_prometheus import exporter_for
from wattpipe.exporters.prometheus import PrometheusConfig, PrometheusExporter, _escape_label_value, factory
from wattpipe.pipeline.batch import Batch, LabelAction
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.records import (
    DevicePower,
    DeviceSample,
    DeviceTotals,
    GpuProcessSample,
    GpuShare,
    Record,
    Totals,
)
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.energy import EnergyConfig, EnergyProcessor
from wattpipe.processors.idle import IdleConfig, IdleProcessor

T = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)
A, B = "GPU-aaaa", "GPU-bbbb"
Labels = frozenset[tuple[str, str]]


# --- building batches ---------------------------------------------------------------------------------


def device(uuid: str, index: int, **changes: Any) -> DeviceSample:
    fields: dict[str, Any] = {
        "device_name": "NVIDIA H100",
        "vendor": "nvidia",
        "power_w": 300.0,
        "energy_mj": 9e9,
        "compute_mode": "default",
        "mig_enabled": False,
        **changes,
    }
    return DeviceSample(time=T, device_id=uuid, device_index=index, **fields)


def power(uuid: str, index: int, idle_w: float | None = 60.0) -> DevicePower:
    idle_mj = 0 if idle_w is None else 300_000
    return DevicePower(
        time=T,
        device_id=uuid,
        device_index=index,
        device_name="NVIDIA H100",
        vendor="nvidia",
        interval_s=5.0,
        power_w=300.0,
        idle_w=idle_w,
        active_w=(1_500_000 - idle_mj) / 5000.0,
        energy_mj=1_500_000,
        idle_energy_mj=idle_mj,
        active_energy_mj=1_500_000 - idle_mj,
    )


def device_totals(uuid: str, index: int | None) -> DeviceTotals:
    return DeviceTotals(
        time=T,
        device_id=uuid,
        device_index=index,
        device_name="NVIDIA H100" if index is not None else None,
        vendor="nvidia" if index is not None else None,
        energy_mj=7_000_123,
        idle_energy_mj=1_000_000,
        active_energy_mj=6_000_123,
        attributed_energy_mj=5_876_667,
        unattributed_energy_mj=123_456,
    )


def process(pid: int, uuid: str = A, mj: int = 4_321_987, **changes: Any) -> Totals:
    fields: dict[str, Any] = {"power_w": 42.5, **changes}
    return Totals(time=T, scope="process", key=str(pid), device_id=uuid, energy_mj=mj, **fields)


def share(pid: int | None, uuid: str = A, mode: Any = "time_slicing") -> GpuShare:
    return GpuShare(time=T, device_id=uuid, pid=pid, share=0.5, energy_mj=600_000, power_w=120.0, mode=mode)


def node_batch(*records: Record, pipeline: str = "metrics") -> Batch:
    return Batch(time=T, interval_s=5.0, node="node-a", pipeline=pipeline).with_records(records)


def full_batch() -> Batch:
    return node_batch(
        device(A, 0),
        device(B, 1, compute_mode="exclusive_process"),
        power(A, 0),
        power(B, 1, idle_w=None),
        share(7, A),
        share(8, A),
        share(None, B, mode="none"),
        process(7),
        process(8, mj=1, state="terminated", power_w=0.0),
        device_totals(A, 0),
        device_totals(B, 1),
    )


# --- running the exporter -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:  # one client: building one per request costs more than the scrape
        yield client


@contextmanager
def serving(**options: Any) -> Iterator[PrometheusExporter]:
    config = PrometheusConfig.model_validate({"listen": "127.0.0.1:0", **options})
    exporter = PrometheusExporter(config, make_context("prometheus", "exporter", node_name="node-a"))
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.shutdown()


def export(exporter: PrometheusExporter, batch: Batch) -> None:
    asyncio.run(exporter.export(batch))


def scrape(http: httpx.Client, exporter: PrometheusExporter) -> str:
    response = http.get(f"{exporter.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


def series(text: str) -> dict[str, dict[Labels, float]]:
    """Sample name → {label set → value}, as Prometheus's own parser reads the text."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset(sample.labels.items())
            assert labels not in out.get(sample.name, {}), f"duplicate series {sample.name}{sample.labels}"
            out.setdefault(sample.name, {})[labels] = sample.value
    return out


def one(text: str, name: str, **match: str) -> tuple[dict[str, str], float]:
    """The only series of ``name`` whose labels include ``match``: (its labels, its value)."""
    found = [(dict(labels), v) for labels, v in series(text).get(name, {}).items() if match.items() <= labels]
    assert len(found) == 1, f"{name}{match}: {found}"
    return found[0]


def exported(http: httpx.Client, **options: Any) -> str:
    with serving(**options) as exporter:
        export(exporter, full_batch())
        return scrape(http, exporter)


# --- the Kepler scheme -------------------------------------------------------------------------------


def test_device_families_carry_kepler_labels_and_energy_in_joules(http: httpx.Client) -> None:
    text = exported(http)
    labels, value = one(text, "kepler_node_gpu_joules_total", gpu_uuid=A)
    assert value == 7000.123  # 7_000_123 mJ
    assert labels == {"gpu": "0", "gpu_uuid": A, "gpu_name": "NVIDIA H100", "vendor": "nvidia", "node_name": "node-a"}
    assert one(text, "kepler_node_gpu_idle_joules_total", gpu="0")[1] == 1000.0
    assert one(text, "kepler_node_gpu_active_joules_total", gpu="0")[1] == 6000.123
    assert one(text, "wattpipe_node_gpu_unattributed_joules_total", gpu="1")[1] == 123.456
    assert one(text, "kepler_node_gpu_watts", gpu="0")[1] == 300.0
    assert one(text, "kepler_node_gpu_idle_watts", gpu="0")[1] == 60.0
    assert one(text, "kepler_node_gpu_active_watts", gpu="0")[1] == 240.0
    assert "# TYPE kepler_node_gpu_joules_total counter" in text
    assert "# TYPE kepler_node_gpu_watts gauge" in text


def test_idle_watts_are_absent_not_zero_while_the_baseline_is_unknown(http: httpx.Client) -> None:
    text = exported(http)
    assert {dict(labels)["gpu"] for labels in series(text)["kepler_node_gpu_idle_watts"]} == {"0"}
    assert one(text, "kepler_node_gpu_active_watts", gpu="1")[1] == 300.0


def test_process_series_carry_the_gpu_index_from_the_device_records_and_their_state(http: httpx.Client) -> None:
    text = exported(http)
    labels, value = one(text, "kepler_process_gpu_joules_total", pid="7")
    assert value == 4321.987
    assert labels == {
        "pid": "7",
        "gpu": "0",
        "gpu_uuid": A,
        "vendor": "nvidia",
        "state": "running",
        "node_name": "node-a",
    }
    assert one(text, "kepler_process_gpu_watts", pid="7")[1] == 42.5
    assert one(text, "kepler_process_gpu_joules_total", pid="8")[0]["state"] == "terminated"
    assert one(text, "kepler_process_gpu_joules_total", pid="8")[1] == 0.001
    assert one(text, "kepler_process_gpu_watts", pid="8")[1] == 0.0


def test_the_gpu_label_stays_when_a_later_tick_has_no_device_records(http: httpx.Client) -> None:
    with serving() as exporter:
        export(exporter, full_batch())
        export(exporter, node_batch(process(7)))
        assert one(scrape(http, exporter), "kepler_process_gpu_joules_total", pid="7")[0]["gpu"] == "0"


def test_device_totals_restored_without_device_attributes_take_them_from_the_samples(http: httpx.Client) -> None:
    with serving() as exporter:
        export(exporter, node_batch(device(A, 3), device_totals(A, None)))
        labels, _ = one(scrape(http, exporter), "kepler_node_gpu_joules_total", gpu_uuid=A)
    assert (labels["gpu"], labels["gpu_name"], labels["vendor"]) == ("3", "NVIDIA H100", "nvidia")


def test_device_up_info_and_attribution_mode(http: httpx.Client) -> None:
    with serving() as exporter:
        batch = full_batch()
        down = DeviceSample(time=T, device_id=B, device_index=1, device_name="NVIDIA H100", vendor="nvidia", up=False)
        export(exporter, batch.replace(devices=(device(A, 0), down)))
        text = scrape(http, exporter)
    assert one(text, "wattpipe_device_up", gpu_uuid=A) == ({"gpu": "0", "gpu_uuid": A, "node_name": "node-a"}, 1.0)
    assert one(text, "wattpipe_device_up", gpu_uuid=B)[1] == 0.0
    info, value = one(text, "kepler_node_gpu_info", gpu_uuid=A)
    assert value == 1.0
    assert (info["compute_mode"], info["mig_enabled"], info["gpu_name"]) == ("default", "false", "NVIDIA H100")
    assert "compute_mode" not in one(text, "kepler_node_gpu_info", gpu_uuid=B)[0]  # down: unknown, left out
    # One series per device and tick, however many shares the device had.
    modes = series(text)["wattpipe_attribution_mode"]
    assert {(dict(k)["gpu_uuid"], dict(k)["mode"], dict(k)["gpu"]) for k in modes} == {
        (A, "time_slicing", "0"),
        (B, "none", "1"),
    }


# --- options ------------------------------------------------------------------------------------------


def test_per_process_false_drops_the_process_families_only(http: httpx.Client) -> None:
    names = series(exported(http, per_process=False))
    assert "kepler_process_gpu_joules_total" not in names
    assert "kepler_process_gpu_watts" not in names
    assert {"kepler_node_gpu_joules_total", "wattpipe_attribution_mode", "wattpipe_device_up"} <= set(names)


def test_terminated_false_drops_the_series_of_exited_processes(http: httpx.Client) -> None:
    text = exported(http, terminated=False)
    assert {dict(k)["pid"] for k in series(text)["kepler_process_gpu_joules_total"]} == {"7"}


def test_otel_naming_uses_the_opentelemetry_names_made_prometheus_safe(http: httpx.Client) -> None:
    text = exported(http, naming="otel")
    names = set(series(text))
    assert not any(name.startswith("kepler_") for name in names)
    labels, value = one(text, "hw_energy_joules_total", hw_id=A)
    assert value == 7000.123
    assert labels == {
        "hw_id": A,
        "hw_type": "gpu",
        "hw_name": "NVIDIA H100",
        "hw_vendor": "nvidia",
        "wattpipe_gpu_index": "0",
        "k8s_node_name": "node-a",
    }
    assert one(text, "hw_power_watts", hw_id=A)[1] == 300.0
    assert one(text, "wattpipe_gpu_energy_unattributed_joules_total", hw_id=B)[1] == 123.456
    process_labels, joules = one(text, "wattpipe_process_gpu_energy_joules_total", process_pid="7")
    assert joules == 4321.987
    assert process_labels["hw_id"] == A
    assert process_labels["wattpipe_state"] == "running"
    assert {"wattpipe_gpu_info", "wattpipe_device_up", "wattpipe_gpu_attribution"} <= names


def test_const_labels_are_on_every_series_and_a_series_own_label_wins(http: httpx.Client) -> None:
    text = exported(http, const_labels={"cluster": "eu-1", "gpu": "const"})
    for name, by_labels in series(text).items():
        for labels in by_labels:
            assert ("cluster", "eu-1") in labels, name
            assert ("node_name", "node-a") in labels, name
    assert one(text, "kepler_node_gpu_watts", gpu_uuid=A)[0]["gpu"] == "0"


def test_const_labels_can_set_the_node_name(http: httpx.Client) -> None:
    text = exported(http, const_labels={"node_name": "override"})
    assert one(text, "kepler_node_gpu_watts", gpu_uuid=A)[0]["node_name"] == "override"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"listen": "28282"}, "host:port"),
        ({"const_labels": {"bad-name": "x"}}, "not Prometheus label names"),
        ({"const_labels": {"__reserved": "x"}}, "not Prometheus label names"),
        ({"naming": "statsd"}, "naming"),
        ({"prot": 1}, "prot"),
    ],
)
def test_bad_options_are_refused_at_validation(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PrometheusConfig.model_validate(options)


def test_the_factory_is_registered_as_an_alpha_exporter_through_its_entry_point() -> None:
    registered = Registry.from_entry_points().get("exporter", "prometheus")
    assert registered is factory
    assert (factory.stability, factory.provides) == ("alpha", frozenset())
    assert factory.default_config() == PrometheusConfig(listen="0.0.0.0:28282", naming="kepler")


# --- labels -------------------------------------------------------------------------------------------


def test_label_values_are_escaped_so_an_extra_attribute_cannot_break_the_text(http: httpx.Client) -> None:
    nasty = 'a "quoted" \\ back\\slash\nnew_line} x="1'
    with serving() as exporter:
        export(exporter, node_batch(device(A, 0), process(7, extra=(("comm", nasty), ("weird.key-name", "v")))))
        text = scrape(http, exporter)
    labels, value = one(text, "kepler_process_gpu_joules_total", pid="7")
    assert labels["comm"] == nasty
    assert labels["weird_key_name"] == "v"
    assert value == 4321.987
    # Every line is a comment or one sample: the newline in the value did not split a line.
    assert all(line.startswith("#") or line.startswith(("kepler_", "wattpipe_")) for line in text.splitlines())


def test_extra_attributes_render_under_their_scheme_names(http: httpx.Client) -> None:
    extra = (("comm", "python"), ("container_id", "abc123"), ("pod_name", "trainer-0"))
    batch = node_batch(device(A, 0), process(7, extra=extra))
    with serving(naming="otel") as exporter:
        export(exporter, batch)
        labels, _ = one(scrape(http, exporter), "wattpipe_process_gpu_energy_joules_total", process_pid="7")
    assert (labels["process_command"], labels["container_id"], labels["k8s_pod_name"]) == (
        "python",
        "abc123",
        "trainer-0",
    )


def test_label_actions_of_the_batch_apply(http: httpx.Client) -> None:
    actions = (
        LabelAction("upsert", "team", "ml", kinds=frozenset({"process"})),
        LabelAction("drop", "device_name"),
        LabelAction("rename", "vendor", new_key="maker"),
    )
    with serving() as exporter:
        export(exporter, full_batch().replace(label_actions=actions))
        text = scrape(http, exporter)
    assert one(text, "kepler_process_gpu_joules_total", pid="7")[0]["team"] == "ml"
    device_labels, _ = one(text, "kepler_node_gpu_watts", gpu_uuid=A)
    assert "gpu_name" not in device_labels
    assert "team" not in device_labels
    assert (device_labels.get("vendor"), device_labels["maker"]) == (None, "nvidia")


# --- ticks and serving ----------------------------------------------------------------------------------


def test_a_series_that_ends_is_gone_after_the_next_export(http: httpx.Client) -> None:
    with serving() as exporter:
        export(exporter, full_batch())
        assert one(scrape(http, exporter), "kepler_process_gpu_joules_total", pid="8")
        export(exporter, full_batch().replace(totals=(process(7),)))
        pids = {dict(k)["pid"] for k in series(scrape(http, exporter))["kepler_process_gpu_joules_total"]}
    assert pids == {"7"}


def test_scrapes_between_ticks_get_the_same_bytes_and_a_tick_renders_anew(http: httpx.Client) -> None:
    with serving() as exporter:
        assert http.get(f"{exporter.url}/metrics").content == b""  # before the first tick: nothing, not zeros
        export(exporter, full_batch())
        first = http.get(f"{exporter.url}/metrics").content
        assert first == http.get(f"{exporter.url}/metrics").content == exporter.body
        export(exporter, full_batch().replace(totals=(process(7, mj=5_000_000),)))
        second = http.get(f"{exporter.url}/metrics").content
    assert second != first
    assert one(second.decode(), "kepler_process_gpu_joules_total", pid="7")[1] == 5000.0


def test_fifty_concurrent_scrapes_all_succeed_with_identical_bodies(http: httpx.Client) -> None:
    with serving() as exporter:
        export(exporter, full_batch())
        with ThreadPoolExecutor(max_workers=50) as pool:
            responses = list(pool.map(lambda _: http.get(f"{exporter.url}/metrics"), range(50)))
    assert [r.status_code for r in responses] == [200] * 50
    assert {r.content for r in responses} == {exporter.body}


def test_gzip_is_served_to_scrapers_that_ask(http: httpx.Client) -> None:
    with serving() as exporter:
        export(exporter, full_batch())
        response = http.get(f"{exporter.url}/metrics", headers={"Accept-Encoding": "gzip"})
        raw = http.get(f"{exporter.url}/metrics", headers={"Accept-Encoding": "identity"})
    assert response.headers["content-encoding"] == "gzip"
    assert response.content == exporter.body  # httpx decompresses
    assert raw.content == exporter.body
    assert "content-encoding" not in raw.headers


def test_index_not_found_and_methods(http: httpx.Client) -> None:
    with serving() as exporter:
        assert "/metrics" in http.get(exporter.url + "/").text
        assert http.get(exporter.url + "/nope").status_code == 404
        assert http.post(exporter.url + "/metrics").status_code == 405


def test_several_pipelines_are_rendered_together_without_duplicate_series(http: httpx.Client) -> None:
    gpu = node_batch(device(A, 0), power(A, 0), process(7), device_totals(A, 0), pipeline="gpu")
    other = node_batch(device(A, 0), device(B, 1), power(B, 1), process(9, uuid=B), pipeline="other")
    with serving() as exporter:
        export(exporter, gpu)
        export(exporter, other)
        text = scrape(http, exporter)  # series() asserts there are no duplicates (device A's up is in both)
        export(exporter, gpu.replace(totals=()))
        later = scrape(http, exporter)
    assert {dict(k)["pid"] for k in series(text)["kepler_process_gpu_joules_total"]} == {"7", "9"}
    assert one(text, "kepler_process_gpu_joules_total", pid="9")[0]["gpu"] == "1"
    assert {dict(k)["gpu_uuid"] for k in series(text)["wattpipe_device_up"]} == {A, B}
    assert {dict(k)["pid"] for k in series(later)["kepler_process_gpu_joules_total"]} == {"9"}


def test_a_port_in_use_is_a_clear_error_naming_the_address() -> None:
    with serving() as first:
        taken = f"127.0.0.1:{first.url.rsplit(':', 1)[1]}"
        second = PrometheusExporter(PrometheusConfig(listen=taken), make_context("prometheus/b", "exporter"))
        with pytest.raises(RuntimeError, match=f"prometheus/b: cannot listen on {taken}"):
            second.start()
        second.shutdown()


# --- with the processors that make the records -----------------------------------------------------------


def test_exported_energy_adds_up_after_the_real_processors(http: httpx.Client) -> None:
    clock = SteppedClock()
    idle = IdleProcessor(IdleConfig(mode="fixed", watts=50.0), make_context("idle", clock=clock, pipeline="metrics"))
    attribution = AttributionProcessor(AttributionConfig(), make_context("attribution", clock=clock))
    energy = EnergyProcessor(EnergyConfig(), make_context("energy", clock=clock, pipeline="metrics"))
    counter_mj = 1_000_000.0
    with serving() as exporter:
        for tick in range(4):
            now = clock.now()
            pids = [11, 12] if tick < 2 else [11]
            batch = Batch(time=now, interval_s=5.0, node="node-a").replace(
                devices=(DeviceSample(time=now, device_id=A, device_index=2, energy_mj=counter_mj, power_w=200.0),),
                gpu_processes=tuple(
                    GpuProcessSample(time=now, device_id=A, pid=p, sm_util=0.25 * (p - 10)) for p in pids
                ),
            )
            for processor in (idle, attribution, energy):
                batch = processor.process(batch)
            export(exporter, batch)
            clock.advance(5.0)
            counter_mj += 1_000_003.0  # ~200 W; odd millijoules so the shares do not divide evenly
        text = scrape(http, exporter)
    total = one(text, "kepler_node_gpu_joules_total", gpu="2")[1]
    idle_j = one(text, "kepler_node_gpu_idle_joules_total", gpu="2")[1]
    active = one(text, "kepler_node_gpu_active_joules_total", gpu="2")[1]
    unattributed = one(text, "wattpipe_node_gpu_unattributed_joules_total", gpu="2")[1]
    processes = series(text)["kepler_process_gpu_joules_total"]
    assert total == 3000.009
    assert idle_j == 750.0  # 50 W × 5 s × 3 ticks
    assert round((idle_j + active) * 1000) == round(total * 1000)
    assert round((sum(processes.values()) + unattributed) * 1000) == round(active * 1000)
    assert {(dict(k)["pid"], dict(k)["gpu"], dict(k)["state"]) for k in processes} == {
        ("11", "2", "running"),
        ("12", "2", "terminated"),
    }


# --- the exposition text, byte for byte ---------------------------------------------------------------------

GOLDEN = Path(__file__).parent / "prometheus_golden"
NASTY = 'a "quoted" \\ back\\slash\nnew_line} x="1 naïve ☃ 日本\t'


def rich_batches() -> list[Batch]:
    """Every family, both pipelines' kinds of overlap, hostile label values and awkward floats."""
    extra = (("comm", NASTY), ("weird.key-name", "v"), ("weird_key_name", "shadowed"), ("9lives", "cat"))
    totals = (
        process(7, extra=extra),
        process(8, mj=1, state="terminated", power_w=0.0),
        process(9, uuid=B, mj=10**22, power_w=float("inf")),
        process(10, uuid=B, mj=123_456_789_012, power_w=float("nan")),
        process(11, uuid=B, mj=5, power_w=-0.0),
        process(13, uuid=B, mj=10**22, power_w=float("-inf")),
        process(7, mj=99),  # the same series as the first pid 7 record, but without extras: a second series
        Totals(time=T, scope="container", key="c0ffee", device_id=A, energy_mj=2_000, power_w=1e-7,
               extra=(("container_name", "main"), ("pod_uid", "uid-1"), ("pod_name", "p"), ("pod_namespace", "ns"))),
        Totals(time=T, scope="pod", key="uid-1", device_id=A, energy_mj=2_000, power_w=1234567.0,
               extra=(("pod_name", "p"), ("pod_namespace", "ns"))),
    )  # fmt: skip
    utilisation = (
        GpuProcessSample(time=T, device_id=A, pid=7, sm_util=0.3333333333333333, extra=(("comm", "py"),)),
        GpuProcessSample(time=T, device_id=A, pid=8, sm_util=None),
        GpuProcessSample(time=T, device_id=B, pid=9, sm_util=0.0, gpu_instance_id=3),
    )
    first = full_batch().replace(
        totals=totals,
        gpu_processes=utilisation,
        shares=(share(7, A), share(8, A), share(None, A), share(None, B, mode="none")),
    )
    second = node_batch(
        device(A, 0, power_w=1e21),
        device(B, 1, device_name="NVIDIA “H100” \\ 80GB"),
        power(B, 1),
        process(9, uuid=B, mj=42),  # also in the first pipeline: this one wins
        process(12, uuid=B, extra=(("pod_name", "ünï"),)),
        pipeline="other",
    )
    return [first, second]


GOLDEN_CASES: dict[str, dict[str, Any]] = {
    "kepler": {},
    "otel": {"naming": "otel"},
    "const_labels": {"const_labels": {"cluster": "eu-1", "gpu": "const", "zone": 'a"b\\c'}, "terminated": False},
    "per_process_false": {"per_process": False, "naming": "otel"},
    "later_tick": {},
}


def rendered(options: dict[str, Any], batches: list[Batch], renderer: str = "fast") -> bytes:
    config = PrometheusConfig.model_validate({"listen": "127.0.0.1:0", **options})
    exporter = exporter_for(renderer, config, make_context("prometheus", "exporter", node_name="node-ä"))
    for batch in batches:
        exporter.render(batch)
    return exporter.body


def golden_batches(case: str) -> list[Batch]:
    batches = rich_batches()
    if case == "per_process_false":
        actions = (
            LabelAction("upsert", "team", "ml", kinds=frozenset({"process"})),
            LabelAction("drop", "device_name"),
            LabelAction("rename", "vendor", new_key="maker"),
        )
        batches = [batch.replace(label_actions=actions) for batch in batches]
    if case == "later_tick":  # the same series again, some gone, new values, one relabelled: nothing stale
        first = batches[0]
        later = first.replace(
            totals=(process(7, mj=5_000_000), process(14), *first.totals[2:4]),
            label_actions=(LabelAction("upsert", "team", "ml", kinds=frozenset({"process"})),),
        )
        batches = [*batches, later, later.replace(label_actions=())]
    return batches


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_the_exposition_text_is_byte_for_byte_the_golden_text(case: str) -> None:
    expected = (GOLDEN / f"{case}.prom").read_bytes()
    assert rendered(GOLDEN_CASES[case], golden_batches(case)) == expected


def processed_batches(ticks: int = 4, gpus: int = 4, per_gpu: int = 16) -> list[Batch]:
    """Batches as the real idle → attribution → energy processors make them, with processes ending."""
    clock = SteppedClock()
    idle = IdleProcessor(IdleConfig(mode="fixed", watts=50.0), make_context("idle", clock=clock, pipeline="metrics"))
    attribution = AttributionProcessor(AttributionConfig(), make_context("attribution", clock=clock))
    energy = EnergyProcessor(EnergyConfig(), make_context("energy", clock=clock, pipeline="metrics"))
    out = []
    for tick in range(ticks):
        now = clock.now()
        uuids = [f"GPU-{g:04d}" for g in range(gpus)]
        batch = Batch(time=now, interval_s=5.0, node="node-a").replace(
            devices=tuple(
                DeviceSample(time=now, device_id=u, device_index=g, device_name="NVIDIA H100", vendor="nvidia",
                             energy_mj=1e6 + tick * 1_000_003.0 * (g + 1), power_w=200.0)
                for g, u in enumerate(uuids)
            ),
            gpu_processes=tuple(
                GpuProcessSample(time=now, device_id=u, pid=1000 * g + p, sm_util=0.01 * (p + tick),
                                 extra=(("comm", f"worker-{p}"),))
                for g, u in enumerate(uuids)
                for p in range(per_gpu - tick)  # one process ends every tick
            ),
        )  # fmt: skip
        for processor in (idle, attribution, energy):
            batch = processor.process(batch)
        out.append(batch)
        clock.advance(5.0)
    return out


@pytest.mark.parametrize("options", [{}, {"naming": "otel", "const_labels": {"zone": "ä\\"}}, {"terminated": False}])
def test_the_fast_renderer_writes_what_prometheus_client_writes_tick_after_tick(options: dict[str, Any]) -> None:
    def exporter(renderer: str) -> PrometheusExporter:
        config = PrometheusConfig.model_validate({"listen": "127.0.0.1:0", **options})
        return exporter_for(renderer, config, make_context("prometheus", "exporter", node_name="node-a"))

    fast, reference = exporter("fast"), exporter("prometheus_client")
    assert type(fast) is PrometheusExporter  # what ships
    batches = processed_batches()
    for batch in [*batches, *rich_batches(), *batches[2:]]:
        fast.render(batch)
        reference.render(batch)
        assert fast.body == reference.body
    assert fast.body.count(b"\nkepler_process_gpu_joules_total{") + fast.body.count(b"\nwattpipe_process_") > 10


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_the_prometheus_client_renderer_writes_the_golden_text_too(case: str) -> None:
    expected = (GOLDEN / f"{case}.prom").read_bytes()
    assert rendered(GOLDEN_CASES[case], golden_batches(case), renderer="prometheus_client") == expected


@pytest.mark.parametrize(
    "value", ["plain", 'a "quoted" one', "back\\slash\\", "new\nline\r\n", "naïve ☃ 日本 🙂", "\\n literal", "}{=,"]
)
def test_label_values_are_escaped_as_prometheus_client_escapes_them(value: str) -> None:
    metric = GaugeMetricFamily("m", "help", labels=["l"])
    metric.add_metric([value], 1.0)

    class One:
        def collect(self) -> list[GaugeMetricFamily]:
            return [metric]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    sample = generate_latest(registry).decode().split("# TYPE m gauge\n", 1)[1]
    assert sample == f'm{{l="{_escape_label_value(value)}"}} 1.0\n'


def test_promtool_accepts_the_rendered_text(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    for options in GOLDEN_CASES.values():
        body = rendered(options, [*processed_batches(), *rich_batches()])
        result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
        assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_the_series_cache_keeps_only_the_series_of_the_last_rendering() -> None:
    with_pid_8, without = full_batch(), full_batch().replace(totals=(process(7),))
    exporter = PrometheusExporter(PrometheusConfig(listen="127.0.0.1:0"), make_context("prometheus", "exporter"))
    exporter.render(with_pid_8)
    cached = exporter._fast._families["kepler_process_gpu_joules_total"]
    assert sorted('pid="8"' in prefix for _, prefix in cached.by_id.values()) == [False, True]
    assert all(id(mapping) == key for key, (mapping, _) in cached.by_id.items())  # each entry holds its mapping
    exporter.render(without)
    cached = exporter._fast._families["kepler_process_gpu_joules_total"]
    assert ['pid="7"' in prefix for _, prefix in cached.by_id.values()] == [True]
    assert [len(ids) for ids in cached.ids] == [1]  # the mappings its keys are ids of
    assert b'pid="8"' not in exporter.body


def test_a_steady_family_reuses_its_prefixes_and_a_changed_one_is_rendered_afresh() -> None:
    exporter = PrometheusExporter(PrometheusConfig(listen="127.0.0.1:0"), make_context("prometheus", "exporter"))
    exporter.render(full_batch().replace(totals=(process(7, mj=1_000), process(8, mj=2_000))))
    first = exporter._fast._families["kepler_process_gpu_joules_total"]
    exporter.render(full_batch().replace(totals=(process(7, mj=3_000), process(8, mj=4_000))))
    assert exporter._fast._families["kepler_process_gpu_joules_total"] is first  # same series, same order
    text = exporter.body.decode()
    assert [one(text, "kepler_process_gpu_joules_total", pid=pid)[1] for pid in ("7", "8")] == [3.0, 4.0]
    # A new process and another order: the family is worked out again, and its text follows the records.
    exporter.render(full_batch().replace(totals=(process(9, mj=5_000), process(8, mj=6_000), process(7, mj=7_000))))
    assert exporter._fast._families["kepler_process_gpu_joules_total"] is not first
    text = exporter.body.decode()
    assert [one(text, "kepler_process_gpu_joules_total", pid=pid)[1] for pid in ("7", "8", "9")] == [7.0, 6.0, 5.0]
    lines = [line for line in text.splitlines() if line.startswith("kepler_process_gpu_joules_total{")]
    assert ['pid="9"' in lines[0], 'pid="8"' in lines[1], 'pid="7"' in lines[2]] == [True, True, True]


def _mode_batch(pipeline: str, groups: list[tuple[str, int, str]]) -> Batch:
    """Shares of ``n`` processes per (device, count, mode), with a label action that changes nothing the mode
    family renders but keys every record in full (so the catalog's label cache turns over)."""
    shares = [
        GpuShare(time=T, device_id=device, pid=1 + i, share=0.1, energy_mj=1, power_w=1.0, mode=mode)
        for device, n, mode in groups
        for i in range(n)
    ]
    actions = (LabelAction("insert", "site", value="x", kinds=frozenset({"pod"})),)
    return Batch(time=T, interval_s=5.0, node="n", pipeline=pipeline, label_actions=actions).with_records(shares)


def test_a_prefix_is_never_taken_from_a_mapping_freed_during_the_render() -> None:
    # The prefix cache is keyed by the label mappings' identities. Here the catalog's cache turns over twice
    # within one render (two pipelines, 1,100 keys each), freeing mappings the last render used; a new
    # mapping born at a freed address must not get the old prefix (it once printed mode="time_slicing" for
    # GPU-a's "exclusive"). The last rendering's mappings stay referenced until the render is done.
    rendered = {}
    for renderer in ("fast", "prometheus_client"):
        exporter = exporter_for(
            renderer, PrometheusConfig(listen="127.0.0.1:0"), make_context("prometheus", "exporter")
        )
        exporter.render(_mode_batch("b", [("GPU-b", 1100, "time_slicing")]))
        exporter.render(_mode_batch("a", [("GPU-a", 1100, "time_slicing")]))
        exporter.render(_mode_batch("a", [("GPU-a", 1, "exclusive"), ("GPU-c", 3, "time_slicing")]))
        rendered[renderer] = exporter.body
    assert rendered["fast"] == rendered["prometheus_client"]
    assert b'wattpipe_attribution_mode{gpu_uuid="GPU-a",mode="exclusive"' in rendered["fast"]


def test_the_fast_renderer_equals_the_reference_over_random_pipelines_and_turnover() -> None:
    rng = random.Random(3)
    fast, reference = (
        exporter_for(r, PrometheusConfig(listen="127.0.0.1:0"), make_context(r, "exporter"))
        for r in ("fast", "prometheus_client")
    )
    for _ in range(60):
        pipeline = rng.choice("abc")
        groups = [(f"GPU-{pipeline}", rng.choice([1, 2, 5, 1100, 1300]), rng.choice(["time_slicing", "exclusive"]))]
        batch = _mode_batch(pipeline, groups)
        fast.render(batch)
        reference.render(batch)
        assert fast.body == reference.body


def test_prefixes_are_reused_only_for_the_same_mappings_not_equal_ones_in_another_order() -> None:
    # "x.y" and "x_y" are one Prometheus name: the first label wins. An upsert appends "x.y" when the record
    # lacks it, so the second tick's mapping equals the first's as a dict but lists its labels the other
    # way round, and the value of x_y changes with it.
    def tick(extra: tuple[tuple[str, str], ...]) -> Batch:
        record = Totals(time=T, scope="process", key="7", device_id=A, energy_mj=1000, extra=extra)
        actions = (LabelAction("upsert", "x.y", value="v"),)
        return Batch(time=T, interval_s=5.0, node="n", pipeline="p", label_actions=actions).with_records([record])

    rendered = {}
    for renderer in ("fast", "prometheus_client"):
        exporter = exporter_for(
            renderer, PrometheusConfig(listen="127.0.0.1:0"), make_context("prometheus", "exporter")
        )
        for extra in ((("x.y", "old"), ("x_y", "2")), (("x_y", "2"),)):
            exporter.render(tick(extra))
        rendered[renderer] = exporter.body
    assert rendered["fast"] == rendered["prometheus_client"]
    assert b'x_y="2"' in rendered["fast"]


def test_two_series_escaped_alike_are_written_once_the_first_labels_and_the_last_value() -> None:
    # "x.y" and "x_y" are one Prometheus label: two records that differ only there are one series in the text
    # (a duplicate sample would make Prometheus reject the scrape).
    records = [
        Totals(time=T, scope="process", key="7", device_id=A, energy_mj=mj, extra=(name,))
        for mj, name in ((1000, ("x.y", "v")), (2000, ("x_y", "v")), (3000, ("x_y", "w")))
    ]
    exporter = PrometheusExporter(PrometheusConfig(listen="127.0.0.1:0"), make_context("prometheus", "exporter"))
    exporter.render(Batch(time=T, interval_s=5.0, node="n", pipeline="p").with_records(records))
    lines = [line for line in exporter.body.decode().splitlines() if line.startswith("kepler_process_gpu_joules_total")]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["2.0", "3.0"]
    assert ['x_y="v"' in lines[0], 'x_y="w"' in lines[1]] == [True, True]
