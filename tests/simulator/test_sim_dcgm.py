"""The simulated dcgm-exporter, scraped with httpx and parsed with prometheus_client."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.simulator.conftest import two_gpu_data
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.dcgm_server import DcgmExporter, DcgmExporterOptions, start_dcgm_exporter
from wattpipe.simulator.scenario import parse_scenario

Samples = dict[tuple[str, str | None], tuple[dict[str, str], float]]


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def node(clock: SteppedClock) -> Iterator[simulator.SimulatedNode]:
    with simulator.build(parse_scenario(two_gpu_data()), clock) as built:
        yield built


def _scrape(exporter: DcgmExporter) -> tuple[str, Samples]:
    text = httpx.get(exporter.url, timeout=5).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser appends _total to counter samples; key by the family name as the exporter wrote it.
            key = (f"{family.name}/{sample.labels['gpu']}", sample.labels.get("GPU_I_ID"))
            samples[key] = (sample.labels, sample.value)
    return text, samples


def test_values_are_the_truth_at_the_last_collection(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    exporter = start_dcgm_exporter(node, DcgmExporterOptions(collect_interval_s=5))
    clock.advance(12.0)  # last collection at 10 s, over (5 s, 10 s]
    _, samples = _scrape(exporter)
    truth = node.truth
    assert samples[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION/0", None)][1] == node.energy_counter_mj(0, 10)
    assert samples[("DCGM_FI_DEV_POWER_USAGE/0", None)][1] == pytest.approx(truth.device_average_power_w(0, 10))
    assert samples[("DCGM_FI_PROF_GR_ENGINE_ACTIVE/0", None)][1] == pytest.approx(truth.activity(0, None, 5, 10))
    assert samples[("DCGM_FI_DEV_GPU_UTIL/0", None)][1] == 100
    assert samples[("DCGM_FI_DEV_FB_USED/0", None)][1] == 1500
    # Ratios are means over the interval: gi 2 ran at 0.6 until 5 s, then 1.0 (capped sum of 1.2).
    assert samples[("DCGM_FI_PROF_GR_ENGINE_ACTIVE/1", "2")][1] == pytest.approx(1.0)
    assert samples[("DCGM_FI_PROF_GR_ENGINE_ACTIVE/1", "1")][1] == pytest.approx(0.25)


def test_ratio_is_the_mean_over_the_collect_interval(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    exporter = start_dcgm_exporter(node, DcgmExporterOptions(collect_interval_s=30))
    clock.advance(31.0)
    _, samples = _scrape(exporter)
    # Collected at 30 s over (0, 30]: gi 2 at 0.6 for 5 s, then 1.0 for 25 s.
    assert samples[("DCGM_FI_PROF_GR_ENGINE_ACTIVE/1", "2")][1] == pytest.approx((0.6 * 5 + 25) / 30, abs=1e-6)
    # GPU 0 was capped from 10 s to 20 s: optional fields are off by default.
    assert ("DCGM_FI_DEV_POWER_VIOLATION/0", None) not in samples


def test_collections_are_every_30_s_by_default_as_in_dcgm_exporter(
    node: simulator.SimulatedNode, clock: SteppedClock
) -> None:
    exporter = start_dcgm_exporter(node)
    assert (exporter.options.collect_interval_s, exporter.options.collect_offset_s) == (30.0, 0.0)
    assert [exporter.collection_time_s(t) for t in (0.0, 29.9, 30.0, 59.0, 61.0)] == [0.0, 0.0, 30.0, 30.0, 60.0]
    clock.advance(45.0)
    _, samples = _scrape(exporter)
    assert samples[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION/0", None)][1] == node.energy_counter_mj(0, 30)


def test_the_scenario_sets_the_interval_and_the_phase_of_collections(clock: SteppedClock) -> None:
    data = two_gpu_data()
    data["dcgm"] = {"collect_interval_s": 10, "collect_offset_s": 2.5}
    with simulator.build(parse_scenario(data), clock) as node:
        exporter = start_dcgm_exporter(node)
        assert [exporter.collection_time_s(t) for t in (0.0, 2.5, 12.4, 12.5)] == [-7.5, 2.5, 2.5, 12.5]
        clock.advance(14.0)
        _, samples = _scrape(exporter)
        # Collected at 12.5 s over (2.5 s, 12.5 s]: gi 2 at 0.6 until 5 s, then 1.0.
        assert samples[("DCGM_FI_PROF_GR_ENGINE_ACTIVE/1", "2")][1] == pytest.approx((0.6 * 2.5 + 7.5) / 10, abs=1e-6)
    data["dcgm"] = {"collect_interval_s": 10, "collect_offset_s": 10}
    with pytest.raises(simulator.ScenarioError, match="collect_offset_s must be less than collect_interval_s"):
        parse_scenario(data)


def test_text_round_trips_with_six_decimal_doubles(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    exporter = start_dcgm_exporter(node)
    clock.advance(3.5)
    text, samples = _scrape(exporter)
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    assert "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W)." in text
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_POWER_USAGE") or line.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
            assert re.search(r" \d+\.\d{6}$", line), line
        if line.startswith(("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_FB_USED")):
            assert re.search(r" \d+$", line), line
    assert exporter.metrics_text() == text  # the same collection renders the same bytes
    assert len(samples) > 0


def _label_names(text: str, family: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith(family + "{")]
    return [re.findall(r'([A-Za-z_]+)="', row) for row in rows]


def test_label_order_and_mig_rows_4x(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    exporter = start_dcgm_exporter(node, DcgmExporterOptions(vintage="4.x", pod_uid_label=True))
    clock.advance(2.0)
    text, samples = _scrape(exporter)
    names = _label_names(text, "DCGM_FI_DEV_POWER_USAGE")
    pod_labels = ["container", "namespace", "pod", "pod_uid"]
    base = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
    assert names[0] == [*base, "hostname", "DCGM_FI_DRIVER_VERSION", *pod_labels]  # GPU 0, allocated
    assert names[1] == [*base, "GPU_I_PROFILE", "GPU_I_ID", "hostname", "DCGM_FI_DRIVER_VERSION"]  # gi 1, free
    assert names[2] == [*base, "GPU_I_PROFILE", "GPU_I_ID", "hostname", "DCGM_FI_DRIVER_VERSION", *pod_labels]
    labels, _ = samples[("DCGM_FI_DEV_POWER_USAGE/1", "2")]
    assert (labels["pod"], labels["namespace"], labels["GPU_I_PROFILE"]) == ("embed-0", "ml", "1g.5gb")
    assert labels["pod_uid"] == node.scenario.pods[1].uid
    # Board fields repeat the board value on every instance row; GPU_UTIL is absent on a MIG GPU.
    assert samples[("DCGM_FI_DEV_POWER_USAGE/1", "1")][1] == samples[("DCGM_FI_DEV_POWER_USAGE/1", "2")][1]
    assert ("DCGM_FI_DEV_GPU_UTIL/1", "1") not in samples
    assert ("DCGM_FI_DEV_GPU_UTIL/0", None) in samples


def test_3x_vintage_has_empty_pod_labels_and_capital_hostname(
    node: simulator.SimulatedNode, clock: SteppedClock
) -> None:
    exporter = start_dcgm_exporter(node, DcgmExporterOptions(vintage="3.x"))
    text, samples = _scrape(exporter)
    names = _label_names(text, "DCGM_FI_DEV_FB_USED")
    assert names[1] == [
        "gpu", "UUID", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "Hostname", "DCGM_FI_DRIVER_VERSION",
        "container", "namespace", "pod",
    ]  # fmt: skip
    labels, _ = samples[("DCGM_FI_DEV_FB_USED/1", "1")]
    assert (labels["container"], labels["namespace"], labels["pod"]) == ("", "", "")


def test_optional_fields_report_power_cap_throttling(node: simulator.SimulatedNode, clock: SteppedClock) -> None:
    options = DcgmExporterOptions(
        collect_interval_s=1.0, extra_fields=("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_PROF_SM_ACTIVE")
    )
    exporter = start_dcgm_exporter(node, options)
    clock.advance(15.0)
    _, samples = _scrape(exporter)
    assert samples[("DCGM_FI_DEV_POWER_VIOLATION/0", None)][1] == 5 * 10**9  # capped since 10 s, in ns
    assert ("DCGM_FI_PROF_SM_ACTIVE/0", None) in samples
    with pytest.raises(ValueError, match="unknown dcgm fields"):
        DcgmExporterOptions(extra_fields=("DCGM_FI_DEV_FAN_SPEED",))


def _faulted(clock: SteppedClock, fault: dict[str, Any]) -> Iterator[DcgmExporter]:
    data = two_gpu_data()
    data["faults"] = [fault]
    with simulator.build(parse_scenario(data), clock) as node:
        yield start_dcgm_exporter(node)


def test_down_fault_hangs_up_for_its_window(clock: SteppedClock) -> None:
    for exporter in _faulted(clock, {"target": "dcgm", "at_s": 30, "for_s": 10, "kind": "down"}):
        clock.advance(30)
        with pytest.raises(httpx.TransportError):
            httpx.get(exporter.url, timeout=5)
        clock.advance(10)
        assert httpx.get(exporter.url, timeout=5).status_code == 200


def test_slow_fault_delays_the_answer(clock: SteppedClock) -> None:
    for exporter in _faulted(clock, {"target": "dcgm", "at_s": 0, "kind": "slow", "delay_s": 1.0}):
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(exporter.url, timeout=0.2)


def test_garbage_fault_is_not_exposition_text(clock: SteppedClock) -> None:
    for exporter in _faulted(clock, {"target": "dcgm", "at_s": 0, "kind": "garbage"}):
        response = httpx.get(exporter.url, timeout=5)
        assert response.status_code == 200
        with pytest.raises(ValueError):  # noqa: PT011 (the parser raises a bare ValueError)
            list(text_string_to_metric_families(response.text))


def test_oversized_fault_streams_the_promised_size(clock: SteppedClock) -> None:
    fault = {"target": "dcgm", "at_s": 0, "kind": "oversized", "size_bytes": 3_000_000}
    for exporter in _faulted(clock, fault):
        response = httpx.get(exporter.url, timeout=5)
        assert int(response.headers["content-length"]) == 3_000_000
        assert len(response.content) == 3_000_000


def test_oversized_fault_stops_streaming_when_the_scraper_hangs_up(clock: SteppedClock) -> None:
    fault = {"target": "dcgm", "at_s": 0, "kind": "oversized", "size_bytes": 100_000_000}
    for exporter in _faulted(clock, fault):
        with httpx.stream("GET", exporter.url, timeout=5) as response:
            assert int(response.headers["content-length"]) == 100_000_000
            first = next(response.iter_bytes())
        assert first.startswith(b"DCGM_FI_DEV_XID_ERRORS{")
        deadline = time.monotonic() + 20
        while exporter.requests["oversized"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert exporter.requests == {"oversized": 1}  # the answer is over
        # Cut short: what the sockets took before the hang-up (well under a MiB here), not 100 MB.
        assert len(first) <= exporter.body_bytes_sent < 16 * 1024 * 1024


def test_requests_and_body_bytes_are_counted(clock: SteppedClock) -> None:
    for exporter in _faulted(clock, {"target": "dcgm", "at_s": 10, "for_s": 10, "kind": "down"}):
        body = httpx.get(exporter.url, timeout=5).content
        not_found = httpx.get(exporter.url.replace("/metrics", "/other"), timeout=5)
        assert not_found.status_code == 404
        clock.advance(10)
        with pytest.raises(httpx.TransportError):
            httpx.get(exporter.url, timeout=5)
        assert exporter.requests == {"metrics": 1, "down": 1}  # the 404 is no scrape
        assert exporter.body_bytes_sent == len(body) + len(not_found.content)


def test_close_stops_the_server(node: simulator.SimulatedNode) -> None:
    exporter = start_dcgm_exporter(node)
    assert exporter.url.startswith("http://127.0.0.1:")
    assert httpx.get(exporter.url.replace("/metrics", "/other"), timeout=5).status_code == 404
    node.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(exporter.url, timeout=1)
