"""Receiver ``dcgm``: real dcgm-exporter captures parse to the numbers a person reads in them, the
simulated exporter's MIG activity matches the ground truth over real loopback HTTP, and every failure is a
typed, counted error that the next scrape recovers from."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import ssl
import subprocess
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.client import V1ObjectMeta, V1Pod, V1PodStatus
from pydantic import ValidationError

from tests.helpers.context import make_context
from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.records import DeviceSignals, MigActivity, Record
from wattpipe.pipeline.runtime import PipelineRunner
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.receivers.dcgm import (
    DcgmConfig,
    DcgmReceiver,
    DcgmScrapeError,
    Discovery,
    Series,
    discover,
    parse_exposition,
)
from wattpipe.receivers.dcgm._discovery import choose_pod
from wattpipe.receivers.dcgm._scrape import TlsOptions, ssl_context
from wattpipe.simulator.dcgm_server import DcgmExporterOptions
from wattpipe.simulator.k8sapi import K8sApiOptions
from wattpipe.simulator.scenario import parse_scenario

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm-exporter"
MIG_SCENARIO = Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "mig.yaml"
MIB = 1024 * 1024
URL = "http://dcgm.test:9400/metrics"


# --- helpers -------------------------------------------------------------------------------------


def _receiver(
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    clock: SteppedClock | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> DcgmReceiver:
    options.setdefault("endpoint", URL)
    config = DcgmConfig.model_validate(options)
    return DcgmReceiver(config, make_context("dcgm", "receiver", clock), transport=transport, env=env or {})


def _serving(body: bytes | str, status: int = 200, seen: list[httpx.Request] | None = None) -> httpx.MockTransport:
    content = body.encode() if isinstance(body, str) else body

    def answer(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=content)

    return httpx.MockTransport(answer)


def _collect(receiver: DcgmReceiver, times: int = 1) -> list[Sequence[Record]]:
    async def go() -> list[Sequence[Record]]:
        try:
            return [await receiver.collect() for _ in range(times)]
        finally:
            await receiver.shutdown()

    return asyncio.run(go())


def _scrape_fixture(name: str) -> tuple[dict[str, dict[str, float]], list[MigActivity]]:
    """A fixture served over httpx.MockTransport → ({UUID: device signals}, MIG activity records)."""
    [records] = _collect(_receiver(_serving((FIXTURES / name).read_bytes())))
    return _split(records)


def _split(records: Sequence[Record]) -> tuple[dict[str, dict[str, float]], list[MigActivity]]:
    signals = [r for r in records if isinstance(r, DeviceSignals)]
    assert len({s.device_id for s in signals}) == len(signals), "one DeviceSignals per UUID"
    return {s.device_id: dict(s.fields) for s in signals}, [r for r in records if isinstance(r, MigActivity)]


def _series(name: str) -> list[Series]:
    return parse_exposition((FIXTURES / name).read_text()).series


# --- every capture in tests/fixtures/dcgm-exporter ------------------------------------------------


def test_t4_two_whole_gpus_convert_every_field_to_si_units() -> None:
    devices, activity = _scrape_fixture("t4_2gpu_nonmig_pod_labels.txt")
    assert activity == []
    assert list(devices) == ["GPU-7a2e92f2-be71-d37e-a744-541600ffc722", "GPU-5f587dd4-6505-0873-c6db-8324dbfe5ba9"]
    gpu0 = devices["GPU-7a2e92f2-be71-d37e-a744-541600ffc722"]
    assert gpu0["power_w"] == 28.722
    assert gpu0["energy_j"] == pytest.approx(9022.652)  # 9022652 mJ
    assert gpu0["gpu_util"] == 0.0
    assert gpu0["fb_used_bytes"] == 128 * MIB
    assert gpu0["fb_free_bytes"] == 14831 * MIB
    assert gpu0["sm_clock_hz"] == 585e6
    assert gpu0["mem_clock_hz"] == 5000e6
    assert gpu0["gpu_temp_c"] == 55
    assert gpu0["gr_engine_active"] == 0.000039  # a whole GPU's activity is a device signal
    assert gpu0["pcie_rx_bytes_per_s"] == 420785
    # Not in the table: kept under the lowercased DCGM name, value as printed.
    assert gpu0["dcgm_fi_dev_nvlink_bandwidth_total"] == 0
    gpu1 = devices["GPU-5f587dd4-6505-0873-c6db-8324dbfe5ba9"]
    assert gpu1["power_w"] == 17.035
    assert gpu1["energy_j"] == pytest.approx(8855.497)
    assert gpu1["fb_used_bytes"] == 5 * MIB
    assert len(gpu0) == len(gpu1) == 19  # 19 families, one field each


def test_t4_pod_labels_empty_strings_mean_unallocated() -> None:
    by_gpu = {s.gpu_index: s for s in _series("t4_2gpu_nonmig_pod_labels.txt") if s.field == "DCGM_FI_DEV_POWER_USAGE"}
    allocated, free = by_gpu[0], by_gpu[1]
    assert (allocated.namespace, allocated.pod, allocated.container) == (
        "runai-reservation",
        "runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw",
        "runai-reservation",
    )
    assert (free.namespace, free.pod, free.container) == (None, None, None)  # container="",namespace="",pod=""
    assert allocated.hostname == "nvidia-dcgm-exporter-s228n"  # Hostname: the exporter pod, not the node
    assert allocated.model == "Tesla T4"
    assert allocated.pci_bus_id is None  # this vintage has no pci_bus_id label


def test_a100_with_four_instances_takes_board_power_once_never_summed() -> None:
    devices, activity = _scrape_fixture("a100_mig_4instances_gpu_operator.txt")
    [(uuid, board)] = devices.items()
    assert uuid == "GPU-473571f2-fb37-ef7e-50fe-9885b74a23cd"
    # Four rows print the board's power at two instants (112.252 on GI 5 and 7, 106.463 on GI 8 and 9):
    # one value, the lowest GPU_I_ID's, and never the 437.43 W sum.
    assert board["power_w"] == 112.252
    assert board["energy_j"] == pytest.approx(6890.956)
    assert board["gpu_temp_c"] == 35
    assert board["memory_temp_c"] == 36
    assert board["sm_clock_hz"] == 1410e6
    assert "gpu_util" not in board  # absent on MIG GPUs
    assert "fb_used_bytes" not in board  # an instance's memory is not the board's
    assert "gr_engine_active" not in board
    by_gi = {a.gpu_instance_id: a for a in activity}
    assert sorted(by_gi) == [5, 7, 8, 9]
    assert {gi: a.profile for gi, a in by_gi.items()} == {5: "2g.10gb", 7: "1g.5gb", 8: "1g.5gb", 9: "1g.5gb"}
    assert by_gi[8].gr_engine_active == 0.408493
    assert [by_gi[gi].gr_engine_active for gi in (5, 7, 9)] == [0.0, 0.0, 0.0]  # idle is 0, not absent
    assert all(a.sm_active is None for a in activity)  # SM_ACTIVE is off by default
    assert all(a.device_id == uuid for a in activity)


def test_a100_nvidia_docs_whole_gpu_rows_beside_one_instance() -> None:
    devices, activity = _scrape_fixture("a100_mig_1gi_nvidia_docs.txt")
    board = devices["GPU-34319582-d595-d1c7-d1d2-179bcfa61660"]
    assert board["power_w"] == 409.692
    assert board["energy_j"] == pytest.approx(319159.391)
    assert board["gr_engine_active"] == 0.995630  # the whole-GPU row's, not instance 13's 0.995687
    assert board["dram_active"] == 0.690789
    assert board["fb_used_bytes"] == 4845 * MIB
    assert board["xid_last"] == 0
    [instance] = activity
    assert (instance.gpu_instance_id, instance.profile, instance.gr_engine_active) == (13, "1g.5gb", 0.995687)
    # The oldest label set: Hostname, no modelName, no pci_bus_id, no pod labels.
    row = _series("a100_mig_1gi_nvidia_docs.txt")[0]
    assert (row.hostname, row.model, row.pci_bus_id, row.pod) == ("ub20-a100-k8s", None, None, None)


def test_a800_mixed_node_counts_each_board_once() -> None:
    devices, activity = _scrape_fixture("a800_8gpu_mixed_mig_excerpt.txt")
    assert len(devices) == 8
    mig = devices["GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418"]
    assert mig == {"power_w": 78.174, "energy_j": pytest.approx(257858.316)}  # GI 3's; GI 6 printed 78.446
    assert devices["GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6"]["power_w"] == 55.942
    assert devices["GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6"]["gpu_util"] == 0.0
    assert sum(d["power_w"] for d in devices.values()) == pytest.approx(
        78.174 + 55.942 + 53.752 + 56.990 + 58.643 + 54.581 + 57.145 + 55.011
    )
    assert [(a.gpu_instance_id, a.profile) for a in activity] == [(3, "2g.20gb"), (5, "2g.20gb"), (6, "2g.20gb")]
    # The excerpt has no profiling family: the instances are known, their activity absent (not 0).
    assert all(a.gr_engine_active is None for a in activity)


def test_h100_eks_pod_labels_absent_on_unallocated_gpus() -> None:
    devices, activity = _scrape_fixture("h100_8gpu_eks_pod_labels.txt")
    assert activity == []
    assert len(devices) == 8
    assert devices["GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"]["power_w"] == 113.611
    assert devices["GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"]["gpu_temp_c"] == 30
    assert devices["GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"]["power_w"] == 68.347
    # Pod labels (present on GPU 0 only) never split a device's series.
    assert set(devices["GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"]) == set(
        devices["GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"]
    )
    rows = {s.gpu_index: s for s in _series("h100_8gpu_eks_pod_labels.txt") if s.field == "DCGM_FI_DEV_POWER_USAGE"}
    assert (rows[0].namespace, rows[0].pod, rows[0].container) == (
        "dynamo-workload",
        "vllm-agg-0-vllmdecodeworker-s65j5",
        "main",
    )
    assert (rows[1].namespace, rows[1].pod, rows[1].container) == (None, None, None)
    assert rows[0].pci_bus_id == "00000000:53:00.0"
    assert rows[0].hostname == "gpu-node-1"


def test_h100_mig_instances_with_and_without_pods() -> None:
    devices, activity = _scrape_fixture("h100_mig_pod_labels_excerpt.txt")
    assert devices == {"GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77": {}}  # only instance fields were printed
    assert [(a.gpu_instance_id, a.profile, a.gr_engine_active) for a in activity] == [
        (7, "1g.10gb", 0.0),
        (8, "1g.10gb", 0.0),
        (9, "1g.10gb", 0.0),
    ]
    pods = {s.gpu_instance_id: s.pod for s in _series("h100_mig_pod_labels_excerpt.txt")}
    assert pods == {7: "text-embedding-predictor-00008-deployment-57946f6c67-vdtjl", 8: None, 9: pods[9]}
    assert pods[9] == "tts-predictor-00011-deployment-5554f75554-8j8pl"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.txt")))
def test_label_spellings_hostname_and_uuid_do_not_change_the_records(name: str) -> None:
    original = (FIXTURES / name).read_text()
    respelled = original.replace("Hostname=", "hostname=").replace("UUID=", "uuid=")
    assert respelled != original
    [a] = _collect(_receiver(_serving(original)))
    [b] = _collect(_receiver(_serving(respelled)))
    assert a == b
    assert len(a) > 0


def test_records_carry_the_time_of_the_scrape() -> None:
    clock = SteppedClock()
    clock.advance(42.0)
    [records] = _collect(
        _receiver(_serving((FIXTURES / "a100_mig_4instances_gpu_operator.txt").read_bytes()), clock=clock)
    )
    assert {r.time for r in records} == {clock.now()}


# --- when a collection happened -------------------------------------------------------------------


def _mig_answer(activity: float, energy_mj: int) -> str:
    """One MIG GPU with one instance, as a 30 s exporter would answer between two collections."""
    labels = 'gpu="0",UUID="GPU-m",device="nvidia0",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7",Hostname="n"'
    return (
        f"# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {activity:.6f}\n"
        f"# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {energy_mj}\n"
    )


def test_the_scrape_that_first_sees_a_new_collection_dates_it() -> None:
    # Scrapes every 5 s: the same collection twice, a new one, a failed scrape, then another new one.
    # The exporter prints no times: a collection happened after the last answered scrape, by this one.
    answers = iter(
        [
            (200, _mig_answer(0.5, 1000)),
            (200, _mig_answer(0.5, 1000)),
            (200, _mig_answer(0.5, 3000)),  # same activity, the counter moved: a new collection
            (503, "busy"),
            (200, _mig_answer(0.25, 9000)),
            (200, _mig_answer(0.25, 9000)),
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        status, body = next(answers)
        return httpx.Response(status, text=body)

    transport = httpx.MockTransport(answer)
    clock = SteppedClock()
    receiver = _receiver(transport, clock=clock, collect_interval="30s")
    dated: list[tuple[float | None, float | None, float | None]] = []

    async def scrape_every_5_s() -> None:
        for _ in range(6):
            try:
                (activity,) = [r for r in await receiver.collect() if isinstance(r, MigActivity)]
                dated.append((activity.collected_after_s, activity.collected_by_s, activity.window_s))
            except DcgmScrapeError:
                dated.append((None, None, None))
            clock.advance(5.0)
        await receiver.shutdown()

    asyncio.run(scrape_every_5_s())
    t0 = 1000.0  # the stepped clock's start
    assert dated == [
        (None, None, 30.0),  # the first answer: new or a repeat, nobody can tell
        (None, None, 30.0),
        (t0 + 5, t0 + 10, 30.0),
        (None, None, None),  # the failed scrape
        (t0 + 10, t0 + 20, 30.0),  # after the last *answered* scrape
        (None, None, 30.0),
    ]


def test_simulated_collections_every_30_s_are_dated_once_each(clock: SteppedClock) -> None:
    with _mig_node(clock) as node:
        exporter = simulator.start_dcgm_exporter(node)  # dcgm-exporter's default: every 30 s
        receiver = _receiver(endpoint=exporter.url, clock=clock)
        start = clock.monotonic()
        dated = []
        for _ in range(14):  # 0 … 65 s
            [records] = _collect(receiver)
            _, activity = _split(records)
            first = activity[0]
            assert {(a.collected_after_s, a.collected_by_s) for a in activity} == {
                (first.collected_after_s, first.collected_by_s)
            }  # every instance of the GPU at once
            if first.collected_by_s is not None:
                assert first.collected_after_s is not None
                dated.append((first.collected_after_s - start, first.collected_by_s - start))
            clock.advance(5.0)
    assert dated == [(25.0, 30.0), (55.0, 60.0)]


# --- names: DCGM 4.6 beside the old ones ---------------------------------------------------------

DCGM_46 = textwrap.dedent("""\
    # TYPE DCGM_FI_DEV_BOARD_POWER_WATTS gauge
    DCGM_FI_DEV_BOARD_POWER_WATTS{gpu="0",uuid="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",hostname="n"} 301.5
    # TYPE DCGM_FI_DEV_POWER_USAGE gauge
    DCGM_FI_DEV_POWER_USAGE{gpu="0",uuid="GPU-a",pci_bus_id="00000000:18:00.0",device="nvidia0",hostname="n"} 299.0
    # TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL counter
    DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL{gpu="0",uuid="GPU-a",device="nvidia0",hostname="n"} 1234
    # TYPE DCGM_FI_DEV_GPU_UTIL_RATIO gauge
    DCGM_FI_DEV_GPU_UTIL_RATIO{gpu="0",uuid="GPU-a",device="nvidia0",hostname="n"} 0.42
    # TYPE DCGM_FI_DEV_POWER_VIOLATION counter
    DCGM_FI_DEV_POWER_VIOLATION{gpu="0",uuid="GPU-a",device="nvidia0",hostname="n"} 2500000000
    # TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge
    DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0",uuid="GPU-a",device="nvidia0",hostname="n"} 4
    # TYPE DCGM_FI_DEV_FUTURE_THING gauge
    DCGM_FI_DEV_FUTURE_THING{gpu="0",uuid="GPU-a",device="nvidia0",hostname="n"} 7
    # TYPE DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO gauge
    DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO{gpu="1",uuid="GPU-b",device="nvidia1",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",hostname="n"} 0.25
    DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO{gpu="1",uuid="GPU-b",device="nvidia1",GPU_I_PROFILE="4g.40gb",GPU_I_ID="2",hostname="n"} 0.75
    # TYPE DCGM_FI_PROF_SM_UTIL_RATIO gauge
    DCGM_FI_PROF_SM_UTIL_RATIO{gpu="1",uuid="GPU-b",device="nvidia1",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",hostname="n"} 0.2
    # TYPE DCGM_FI_DEV_BOARD_POWER_WATTS gauge
    DCGM_FI_DEV_BOARD_POWER_WATTS{gpu="1",uuid="GPU-b",device="nvidia1",GPU_I_PROFILE="4g.40gb",GPU_I_ID="2",hostname="n"} 250
    DCGM_FI_DEV_BOARD_POWER_WATTS{gpu="1",uuid="GPU-b",device="nvidia1",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",hostname="n"} 251
    # TYPE DCGM_FI_DEV_GPU_TEMP gauge
    DCGM_FI_DEV_GPU_TEMP{gpu="1",device="nvidia1",hostname="n"} 40
    DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-b",device="nvidia1",GPU_I_ID="x",hostname="n"} 41
    DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-b",device="nvidia1",GPU_I_ID="1",hostname="n"} NaN
    # TYPE DCGM_EXP_XID_ERRORS_COUNT gauge
    DCGM_EXP_XID_ERRORS_COUNT{gpu="0",uuid="GPU-a",xid="79"} 1
""")


def test_dcgm_46_names_are_read_beside_the_old_ones(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        [records] = _collect(_receiver(_serving(DCGM_46)))
    devices, activity = _split(records)
    assert devices["GPU-a"] == {
        "power_w": 301.5,  # the canonical spelling wins over POWER_USAGE's 299.0
        "energy_j": 1234,  # already joules
        "gpu_util": 0.42,  # already 0–1
        "power_violation_s": 2.5,  # nanoseconds
        "clocks_event_reasons": 4,
        "dcgm_fi_dev_future_thing": 7,
    }
    assert devices["GPU-b"] == {"power_w": 251}  # GI 1's row: the lowest GPU_I_ID, whatever the row order
    assert [(a.gpu_instance_id, a.profile, a.gr_engine_active, a.sm_active) for a in activity] == [
        (1, "3g.40gb", 0.25, 0.2),
        (2, "4g.40gb", 0.75, None),
    ]
    # No UUID, and a GPU_I_ID that is not a number: skipped and said; NaN is DCGM's blank: silently absent.
    assert "GPU_I_ID 'x' is not a number" in caplog.text
    assert "2 DCGM series skipped" in caplog.text


# --- the simulated exporter over loopback HTTP ---------------------------------------------------


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


def _mig_node(clock: SteppedClock, faults: list[dict[str, Any]] | None = None) -> simulator.SimulatedNode:
    data = yaml.safe_load(MIG_SCENARIO.read_text())
    data["faults"] = faults or []
    return simulator.build(parse_scenario(data, source=str(MIG_SCENARIO)), clock)


@pytest.mark.parametrize(
    ("vintage", "uuid_label"), [("3.x", "UUID"), ("4.x", "UUID"), ("4.x", "uuid")], ids=["3.x", "4.x", "4.x-o"]
)
def test_simulated_mig_activity_per_instance_matches_the_truth(
    clock: SteppedClock, vintage: str, uuid_label: str
) -> None:
    interval_s = 2.0
    options = DcgmExporterOptions(
        vintage=vintage,  # type: ignore[arg-type]
        uuid_label=uuid_label,  # type: ignore[arg-type]
        collect_interval_s=interval_s,
        extra_fields=("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_POWER_VIOLATION"),
    )
    with _mig_node(clock) as node:
        exporter = simulator.start_dcgm_exporter(node, options)
        receiver = _receiver(endpoint=exporter.url, clock=clock)
        readings = []
        for t_s in (12.5, 45.0, 61.0):  # process 3201 stops at 40 s, 3001 slows at 50 s, 3202 ends at 70 s
            clock.advance(t_s - node.t_s())
            [records] = _collect(receiver)
            readings.append((exporter.collection_time_s(node.t_s()), records))
        truth = node.truth
        h100, a100 = (gpu.uuid for gpu in node.scenario.gpus)
        for t1, records in readings:
            t0 = t1 - interval_s
            devices, activity = _split(records)
            assert list(devices) == [h100, a100]
            assert [(a.device_id, a.gpu_instance_id, a.profile) for a in activity] == [
                (h100, 2, "3g.40gb"),
                (h100, 3, "2g.20gb"),
                (h100, 9, "1g.10gb"),
                (h100, 10, "1g.10gb"),
            ]
            for a in activity:
                expected = truth.activity(0, a.gpu_instance_id, t0, t1)
                assert a.gr_engine_active == pytest.approx(expected, abs=1e-6)
                assert a.sm_active == pytest.approx(0.9 * expected, abs=1e-6)
            # The board's power, once: four instance rows, one value.
            assert devices[h100]["power_w"] == pytest.approx(truth.device_average_power_w(0, t1), abs=1e-3)
            assert devices[h100]["energy_j"] == pytest.approx(node.energy_counter_mj(0, t1) / 1000)
            assert devices[h100]["power_violation_s"] == pytest.approx(truth.device_capped_s(0, t1), abs=1e-9)
            assert "gpu_util" not in devices[h100]
            assert devices[a100]["gpu_util"] == pytest.approx(round(100 * truth.activity(1, None, t0, t1)) / 100)
            assert devices[a100]["power_w"] == pytest.approx(truth.device_average_power_w(1, t1), abs=1e-3)
        # The instances' activity moved with the workload: 10 went idle at 40 s, 9 stayed busy.
        by_time = [{a.gpu_instance_id: a.gr_engine_active for a in _split(r)[1]} for _, r in readings]
        assert by_time[0][9] == by_time[2][9] == 1.0
        assert by_time[1][10] == pytest.approx(0.5)  # only 3202 (0.5) runs on GI 10 between 40 and 70 s


FAULTS = [
    {"at_s": 10, "for_s": 5, "target": "dcgm", "kind": "down"},
    {"at_s": 20, "for_s": 5, "target": "dcgm", "kind": "slow", "delay_s": 0.6},
    {"at_s": 30, "for_s": 5, "target": "dcgm", "kind": "garbage"},
    {"at_s": 40, "for_s": 5, "target": "dcgm", "kind": "oversized", "size_bytes": 4 * MIB},
]


@pytest.mark.parametrize(
    ("at_s", "reason", "words"),
    [
        (10, "unreachable", "unreachable (RemoteProtocolError"),
        (20, "timeout", "no complete answer within 0.2s"),
        (30, "garbage", "not UTF-8 text"),
        (40, "oversized", "larger than max_bytes (262144 bytes)"),
    ],
)
def test_exporter_faults_are_typed_errors_and_the_next_scrape_works(
    clock: SteppedClock, at_s: float, reason: str, words: str
) -> None:
    with _mig_node(clock, FAULTS) as node:
        exporter = simulator.start_dcgm_exporter(node)
        receiver = _receiver(endpoint=exporter.url, clock=clock, timeout="200ms", max_bytes=256 * 1024)

        async def go() -> tuple[DcgmScrapeError, Sequence[Record]]:
            clock.advance(at_s + 1 - node.t_s())
            with pytest.raises(DcgmScrapeError) as caught:
                await receiver.collect()
            clock.advance(at_s + 6 - node.t_s())  # the fault window has closed
            records = await receiver.collect()
            await receiver.shutdown()
            return caught.value, records

        error, records = asyncio.run(go())
    assert error.reason == reason
    assert str(error).startswith(f"dcgm-exporter at {exporter.url}: ")
    assert words in str(error)
    devices, activity = _split(records)
    assert len(devices) == 2
    assert len(activity) == 4
    assert receiver.failures == 0


# --- failures through a mock transport -----------------------------------------------------------


def test_max_bytes_stops_reading_a_body_without_content_length() -> None:
    pulled = []

    async def endless() -> AsyncIterator[bytes]:
        for i in range(10_000):
            pulled.append(i)
            yield b'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-flood"} 0\n' * 20  # 1 KiB a chunk

    receiver = _receiver(httpx.MockTransport(lambda request: httpx.Response(200, content=endless())), max_bytes=4096)
    with pytest.raises(DcgmScrapeError, match=r"larger than max_bytes \(4096 bytes\); refused") as caught:
        _collect(receiver)
    assert caught.value.reason == "oversized"
    assert len(pulled) <= 5  # stopped at the limit, not after 10 MB


def test_max_bytes_refuses_a_declared_length_before_reading() -> None:
    body = b"x" * 5000
    with pytest.raises(DcgmScrapeError, match="larger than max_bytes") as caught:
        _collect(_receiver(_serving(body), max_bytes=4096))
    assert caught.value.reason == "oversized"
    # At the limit exactly is fine: the body is parsed (and is garbage here).
    with pytest.raises(DcgmScrapeError, match="not Prometheus text"):
        _collect(_receiver(_serving(b"<html>" + b"x" * 4090), max_bytes=4096))


@pytest.mark.parametrize(
    ("status", "body", "reason", "words"),
    [
        (503, "busy", "http_status", "answered HTTP 503 Service Unavailable"),
        (200, "<html><body>502 Bad Gateway</body></html>\n", "garbage", "not Prometheus text"),
        (200, b"\xff\xfe\x00garbage", "garbage", "not UTF-8 text"),
    ],
)
def test_bad_answers_are_typed_errors(status: int, body: str | bytes, reason: str, words: str) -> None:
    with pytest.raises(DcgmScrapeError) as caught:
        _collect(_receiver(_serving(body, status)))
    assert caught.value.reason == reason
    assert words in str(caught.value)
    assert URL in str(caught.value)


def test_credentials_in_the_endpoint_never_reach_a_message() -> None:
    with pytest.raises(DcgmScrapeError) as caught:
        _collect(_receiver(_serving("", 503), endpoint="http://scraper:hunter2@dcgm.test:9400/metrics"))
    assert str(caught.value) == "dcgm-exporter at http://dcgm.test:9400/metrics: answered HTTP 503 Service Unavailable"


def test_a_scrape_cut_short_by_the_pipeline_timeout_counts_as_a_failure() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    receiver = _receiver(httpx.MockTransport(hang), timeout="3s")

    async def go() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(receiver.collect(), timeout=0.05)  # what the runtime's _poll does
        await receiver.shutdown()

    asyncio.run(go())
    assert receiver.failures == 1


def test_another_exporters_metrics_are_no_records_and_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        [records] = _collect(_receiver(_serving("# TYPE go_goroutines gauge\ngo_goroutines 12\n")))
    assert records == []
    assert "answered 1 series but no DCGM field of any GPU: is this dcgm-exporter?" in caplog.text


def test_a_closed_port_is_counted_by_the_runtime_and_the_tick_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    text = f"""
        receivers:
          dcgm: {{endpoint: "http://127.0.0.1:{port}/metrics", timeout: 1s}}
        exporters:
          custom/out: {{class: "tests.helpers.components:Recorder"}}
        service:
          pipelines:
            metrics: {{interval: 5s, receivers: [dcgm], exporters: [custom/out]}}
    """
    clock = SteppedClock()
    registry = Registry.from_entry_points()
    config = load_config_text(textwrap.dedent(text), "test.yaml", registry, {"NODE_NAME": "node-a"})
    graph = build(config, registry, clock, Telemetry(clock))
    runner = PipelineRunner(graph, graph.pipelines[0])
    with caplog.at_level(logging.WARNING):
        batch = asyncio.run(runner.tick())
    assert batch.mig_activity == ()
    labels = {"pipeline": "metrics", "component": "dcgm"}
    assert graph.telemetry.registry.get_sample_value("wattpipe_receiver_errors_total", labels) == 1
    assert f"receiver dcgm failed: DcgmScrapeError: dcgm-exporter at http://127.0.0.1:{port}/metrics: unreachable" in (
        caplog.text
    )


# --- auth and TLS --------------------------------------------------------------------------------


def test_bearer_token_is_sent_and_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[httpx.Request] = []
    receiver = _receiver(_serving("", 401, seen), bearer_token="s3cret-token")
    with pytest.raises(DcgmScrapeError) as caught:
        _collect(receiver)
    assert seen[0].headers["authorization"] == "Bearer s3cret-token"
    assert "s3cret-token" not in str(caught.value)
    assert "s3cret-token" not in repr(receiver.config)
    assert "s3cret-token" not in receiver.config.model_dump_json()


def test_bearer_token_file_is_read_at_every_scrape(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    seen: list[httpx.Request] = []
    receiver = _receiver(_serving("", 200, seen), bearer_token_file=str(token))

    async def go() -> None:
        await receiver.collect()
        token.write_text("rotated")
        await receiver.collect()
        token.unlink()
        with pytest.raises(DcgmScrapeError, match=r"cannot read bearer_token_file .*token \(No such file"):
            await receiver.collect()
        await receiver.shutdown()

    asyncio.run(go())
    assert [r.headers["authorization"] for r in seen] == ["Bearer first", "Bearer rotated"]


def test_no_token_no_authorization_header() -> None:
    seen: list[httpx.Request] = []
    _collect(_receiver(_serving("", 200, seen)))
    assert "authorization" not in seen[0].headers


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"bearer_token": "a", "bearer_token_file": "/t"}, "bearer_token or bearer_token_file, not both"),
        ({"key_file": "/k"}, "key_file needs cert_file"),
        ({"insecure_skip_verify": True, "ca_file": "/ca"}, "insecure_skip_verify ignores ca_file"),
        ({"endpoint": "dcgm:9400/metrics"}, "must be an http:// or https:// URL"),
        ({"timeout": "0s"}, "timeout must be longer than 0s"),
        ({"collect_interval": "0s"}, "collect_interval must be longer than 0s"),
        ({"max_bytes": 10}, "greater than or equal to 1024"),
        ({"tls": {}}, "Extra inputs are not permitted"),
    ],
)
def test_config_mistakes_are_named(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        DcgmConfig.model_validate(options)


def test_defaults() -> None:
    config = DcgmConfig(bearer_token="", bearer_token_file="/var/run/secrets/token")  # "" is unset, as documented
    assert config.bearer_token_file == "/var/run/secrets/token"
    config = DcgmConfig()
    assert (config.endpoint, config.timeout, config.max_bytes, config.collect_interval) == ("", 2.0, 16 * MIB, 30.0)
    assert (config.discovery_label_selector, config.discovery_port, config.rediscover_after) == (
        "app=nvidia-dcgm-exporter",
        9400,
        3,
    )


def test_insecure_skip_verify_turns_verification_off() -> None:
    context = ssl_context(TlsOptions(insecure_skip_verify=True))
    assert context.verify_mode == ssl.CERT_NONE
    assert context.check_hostname is False
    strict = ssl_context(TlsOptions(cert_file="", ca_file=""))
    assert strict.verify_mode == ssl.CERT_REQUIRED
    assert strict.check_hostname is True


def test_a_missing_tls_file_is_named() -> None:
    with pytest.raises(FileNotFoundError, match=r"ca_file /nonexistent/ca\.pem does not exist"):
        ssl_context(TlsOptions(ca_file="/nonexistent/ca.pem"))


def test_a_file_that_is_not_pem_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=r"cert_file .*junk\.pem: not a PEM certificate and its key"):
        ssl_context(TlsOptions(cert_file=str(junk)))


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=dcgm-exporter.test"],
        check=True, capture_output=True, timeout=10,
    )  # fmt: skip
    return cert, key


def test_tls_files_build_the_client(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    context = ssl_context(TlsOptions(ca_file=str(cert), cert_file=str(cert), key_file=str(key)))
    assert context.verify_mode == ssl.CERT_REQUIRED
    [ca] = context.get_ca_certs()
    assert ("commonName", "dcgm-exporter.test") in [pair for rdn in ca["subject"] for pair in rdn]
    # The receiver builds its client with them, and scrapes through it.
    [records] = _collect(
        _receiver(
            _serving((FIXTURES / "h100_mig_pod_labels_excerpt.txt").read_bytes()),
            endpoint="https://dcgm.test:9400/metrics",
            ca_file=str(cert),
            cert_file=str(cert),
            key_file=str(key),
        )
    )
    assert len(records) == 4


# --- discovery -----------------------------------------------------------------------------------


def _pod(name: str, phase: str, ip: str | None, namespace: str = "gpu-operator") -> V1Pod:
    return V1Pod(metadata=V1ObjectMeta(name=name, namespace=namespace), status=V1PodStatus(phase=phase, pod_ip=ip))


def test_choose_pod_takes_a_running_pod_with_an_ip() -> None:
    pods = [
        _pod("nvidia-dcgm-exporter-zz", "Running", "10.0.3.7"),
        _pod("nvidia-dcgm-exporter-aa", "Pending", None),
        _pod("nvidia-dcgm-exporter-bb", "Running", "10.0.3.9"),
    ]
    assert choose_pod(pods) == ("gpu-operator/nvidia-dcgm-exporter-bb", "10.0.3.9")
    assert choose_pod([]) == "no pod matches"
    assert choose_pod([pods[1]]) == (
        "matching pod(s) gpu-operator/nvidia-dcgm-exporter-aa are not Running with an IP yet"
    )


def test_discovery_without_node_name_falls_back_to_localhost() -> None:
    found = discover({}, label_selector="app=nvidia-dcgm-exporter", port=9400)
    assert found == Discovery(
        "http://localhost:9400/metrics",
        False,
        "NODE_NAME is not set, so the exporter pod on this node cannot be looked up; "
        "using http://localhost:9400/metrics",
    )
    no_api = discover({"NODE_NAME": "n1"}, label_selector="app=x", port=9500, scheme="https")
    assert no_api.endpoint == "https://localhost:9500/metrics"
    assert "not in a pod, and KUBECONFIG is not set" in no_api.how


def test_discovery_finds_the_labelled_pod_on_this_node_and_the_receiver_scrapes_it(
    clock: SteppedClock, tmp_path: Path
) -> None:
    with _mig_node(clock) as node:
        clock.advance(10.0)
        dcgm = simulator.start_dcgm_exporter(node)
        labels = {"ml/batch-0": {"app": "nvidia-dcgm-exporter"}}
        api = simulator.start_k8s_api(node, K8sApiOptions(labels=labels))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        env = {"NODE_NAME": node.scenario.node.name, "KUBECONFIG": str(kubeconfig)}
        found = discover(env, label_selector="app=nvidia-dcgm-exporter", port=dcgm.port)
        assert found.endpoint == f"http://127.0.0.1:{dcgm.port}/metrics"
        assert "ml/batch-0" in found.how
        missing = discover(env, label_selector="app=something-else", port=9400)
        assert missing.endpoint == "http://localhost:9400/metrics"
        assert "no pod matches" in missing.how
        receiver = DcgmReceiver(DcgmConfig(discovery_port=dcgm.port), make_context("dcgm", "receiver", clock), env=env)

        async def start_and_collect() -> Sequence[Record]:
            await receiver.start()  # discovers the endpoint
            try:
                return await receiver.collect()
            finally:
                await receiver.shutdown()

        records = asyncio.run(start_and_collect())
    assert {r.gpu_instance_id for r in records if isinstance(r, MigActivity)} == {2, 3, 9, 10}
    assert api.requests["list"] >= 2


def test_discovery_with_an_api_server_that_is_down_falls_back(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    cluster = {"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}
    context = {"name": "c", "context": {"cluster": "c", "user": "u"}}
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "kind": "Config",
                "current-context": "c",
                "clusters": [cluster],
                "users": [{"name": "u", "user": {}}],
                "contexts": [context],
            }
        )
    )
    found = discover({"NODE_NAME": "n1", "KUBECONFIG": str(kubeconfig)}, label_selector="app=x", port=9400, timeout_s=1)
    assert not found.found
    assert found.how.startswith("listing pods with label 'app=x' on node n1 failed: ")


def _fake_discovery(endpoints: Iterator[str], calls: list[str]) -> Callable[..., Discovery]:
    def fake(env: Mapping[str, str], **kwargs: Any) -> Discovery:
        endpoint = next(endpoints)
        calls.append(endpoint)
        return Discovery(endpoint, True, f"fake pod at {endpoint}")

    return fake


def test_an_empty_endpoint_is_discovered_and_rediscovered_after_repeated_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(
        "wattpipe.receivers.dcgm.discover",
        _fake_discovery(iter(["http://old:9400/metrics", "http://new:9400/metrics"]), calls),
    )
    good = (FIXTURES / "t4_2gpu_nonmig_pod_labels.txt").read_bytes()
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=good) if request.url.host == "new" else httpx.Response(503)
    )
    receiver = _receiver(transport, endpoint="", rediscover_after=3)

    async def go() -> list[str]:
        outcomes = []
        for _ in range(5):
            try:
                outcomes.append(f"{len(await receiver.collect())} records")
            except DcgmScrapeError as exc:
                outcomes.append(exc.reason)
            if receiver._discovery is not None:  # a rediscovery runs in the background: let it land
                await asyncio.wrap_future(receiver._discovery)
        await receiver.shutdown()
        return outcomes

    outcomes = asyncio.run(go())
    # Three failures on the old endpoint, a fourth while the new lookup runs, then the new endpoint.
    assert outcomes == ["http_status"] * 4 + ["2 records"]
    assert calls == ["http://old:9400/metrics", "http://new:9400/metrics"]
    assert receiver.endpoint == "http://new:9400/metrics"


def test_an_explicit_endpoint_is_never_rediscovered(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr("wattpipe.receivers.dcgm.discover", _fake_discovery(iter(["http://x/metrics"]), calls))
    receiver = _receiver(_serving("", 503), rediscover_after=1)

    async def go() -> None:
        for _ in range(3):
            with pytest.raises(DcgmScrapeError):
                await receiver.collect()
        await receiver.shutdown()

    asyncio.run(go())
    assert calls == []
    assert receiver.failures == 3


def test_start_discovers_before_the_first_tick(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[httpx.Request] = []
    receiver = _receiver(_serving("", 200, seen), endpoint="", env={})

    async def go() -> None:
        await receiver.start()
        assert receiver.endpoint == "http://localhost:9400/metrics"
        await receiver.collect()
        await receiver.shutdown()

    with caplog.at_level(logging.WARNING):
        asyncio.run(go())
    assert str(seen[0].url) == "http://localhost:9400/metrics"
    assert "receiver dcgm: dcgm-exporter not discovered: NODE_NAME is not set" in caplog.text
