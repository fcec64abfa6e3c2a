"""Saturation end to end: `simulate --report` against ground truth, absent fields, and real dcgm-exporter texts."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from wattpipe.cli import main
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.processors.saturation import SaturationConfig, SaturationProcessor
from wattpipe.receivers.dcgm import parse_exposition, to_records
from wattpipe.simulator import DcgmExporter, DcgmExporterOptions, SimulatedNode, build
from wattpipe.simulator._dcgm_text import FIELDS

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "configs" / "scenarios" / "saturation.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "dcgm-exporter"
RATES = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    path = tmp_path_factory.mktemp("sat") / "report.json"
    err = io.StringIO()
    args = ["simulate", "-c", str(ROOT / "configs" / "saturation.yaml"), "--scenario", str(SCENARIO),
            "--duration", "5m", "--report", str(path), "--log-level", "error"]  # fmt: skip
    # A module fixture runs before the per-test logging restore (tests/conftest.py): restore it here.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        assert main(args, io.StringIO(), err) == 0, err.getvalue()
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_every_ratio_is_within_0_01_of_truth(report: dict) -> None:  # type: ignore[type-arg]
    rows = report["saturation"]
    assert len(rows) > 80
    for row in rows:
        assert row["true_value"] is not None, row
        assert row["window_s"] == pytest.approx(60.0), row  # the whole configured window: 5 min > 60 s
        if row["signal"] in RATES:
            assert row["value"] == pytest.approx(row["true_value"], rel=0.01, abs=1.0), row
        else:
            assert abs(row["value"] - row["true_value"]) <= 0.01, row


def _report(tmp_path: Path, duration: str) -> list[dict]:  # type: ignore[type-arg]
    path = tmp_path / f"report-{duration}.json"
    args = ["simulate", "-c", str(ROOT / "configs" / "saturation.yaml"), "--scenario", str(SCENARIO),
            "--duration", duration, "--report", str(path), "--log-level", "error"]  # fmt: skip
    assert main(args, io.StringIO(), io.StringIO()) == 0
    return json.loads(path.read_text())["saturation"]  # type: ignore[no-any-return]


def test_a_run_shorter_than_the_window_says_its_rows_cover_less(tmp_path: Path) -> None:
    # dcgm-exporter collects every 10 s; the first answer (0 s) cannot be told from a repeat, the collection
    # at 10 s only starts the counters, so at 25 s the rows describe (10, 20]: the last collection's window.
    rows = _report(tmp_path, "25s")
    assert rows
    assert {(row["window_s"], row["window_end_s"]) for row in rows} == {(10.0, 20.0)}
    for row in rows:
        assert abs(row["value"] - row["true_value"]) <= (1.0 if row["signal"] in RATES else 0.01), row


def test_dcgm_ratios_follow_a_throttle_onset_exactly(tmp_path: Path) -> None:
    # GPU 1 throttles from 20 s. At 75 s dcgm-exporter (10 s collections) last collected at 70 s: the value
    # is dated by that collection, so the window is (10, 70] of data time (not the tick's (15, 75]), and
    # both the ratio and the report's truth are over it: 50/60. Before this, the values were dated by the
    # scrape and the ratio lagged: 0.833 against a truth over (15, 75] of 0.917.
    rows = {(r["uuid"], r["gi"], r["signal"]): r for r in _report(tmp_path, "75s")}
    hot = yaml.safe_load(SCENARIO.read_text())["gpus"][1]
    assert hot["thermal_throttle"] == [[20, 100000]]
    [row] = [r for (u, gi, s), r in rows.items() if s == "throttle_thermal" and r["true_value"] > 0]
    assert (row["window_s"], row["window_end_s"]) == (60.0, 70.0)
    assert row["true_value"] == pytest.approx(50 / 60)
    assert row["value"] == pytest.approx(50 / 60)


@pytest.mark.parametrize("duration", [f"{s}s" for s in range(30, 90, 5)])
def test_every_ratio_is_within_0_01_of_truth_while_the_window_holds_a_change(tmp_path: Path, duration: str) -> None:
    # The thermal throttle starts at 20 s: every run up to 80 s ends with a window that holds that change
    # (on a collection; the processes' start at 8 s is in the first collection's interval, which only starts
    # the counters). Every row: its value against the truth over the data window it says it describes.
    rows = _report(tmp_path, duration)
    assert len(rows) > 80
    for row in rows:
        assert abs(row["value"] - row["true_value"]) <= (1.0 if row["signal"] in RATES else 0.01), row


def test_the_scenario_shows_each_kind_of_saturation(report: dict) -> None:  # type: ignore[type-arg]
    uuid = [g["uuid"] for g in report["devices"]]
    got = {(r["uuid"], r["gi"], r["signal"]): round(r["value"], 9) for r in report["saturation"]}
    capped, hot, full, mig, _dra = sorted(uuid, key=lambda u: [r["uuid"] for r in report["saturation"]].index(u))
    assert got[(capped, None, "throttle_power")] == 1.0
    assert got[(capped, None, "clock_event_sw_power_cap")] == 1.0
    assert got[(hot, None, "throttle_thermal")] == 1.0
    assert got[(hot, None, "xid_count")] == 1.0  # the 79 at 250 s; 13 at 200 s is outside the last 60 s
    assert got[(full, None, "memory_pressure")] == 1.0
    assert got[(mig, 9, "memory_pressure")] == 1.0
    assert got[(mig, 2, "memory_used_max")] == 0.0
    # The clock-event bitmask is the physical GPU's: never on an instance's own series.
    assert not [k for k in got if k[1] is not None and k[2].startswith(("clock_event_", "throttle_", "xid"))]


def test_pods_get_their_gpus_saturation_with_the_right_scope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load((ROOT / "configs" / "saturation.yaml").read_text())
    config["exporters"] = {"console": {"format": "json", "kinds": ["saturation"]}}
    config["service"]["pipelines"]["metrics"]["exporters"] = ["console"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["simulate", "-c", str(path), "--scenario", str(SCENARIO), "--duration", "70s", "--log-level", "error"]
    assert main(args, io.StringIO(), io.StringIO()) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]  # console
    last = max(r["time"] for r in rows)
    got = {
        (r["attributes"]["pod_name"], r["values"]["signal"]): (r["values"]["saturation_scope"], r["values"]["value"])
        for r in rows
        if r["time"] == last and "pod_name" in r["attributes"]
    }
    assert got[("trainer-0", "throttle_power")] == ("exclusive", pytest.approx(1.0))
    assert got[("shared-a", "memory_pressure")] == ("device_shared", 1.0)  # the device's, not a's own
    assert got[("shared-b", "memory_pressure")] == ("device_shared", 1.0)
    assert got[("mig-small", "memory_used_max")] == ("instance", pytest.approx(0.95))
    assert got[("mig-small", "clock_event_sw_power_cap")] == ("physical_gpu", 0.0)


def test_existing_configs_get_no_saturation_section(tmp_path: Path) -> None:
    # A pipeline without the saturation processor: the demo's, less it.
    config = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    del config["processors"]["saturation"]
    config["service"]["pipelines"]["metrics"]["processors"].remove("saturation")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    path = tmp_path / "r.json"
    args = ["simulate", "--scenario", str(SCENARIO), "-c", str(tmp_path / "c.yaml"), "--duration", "30s"]
    args += ["--report", str(path), "--log-level", "error"]
    assert main(args, io.StringIO(), io.StringIO()) == 0
    assert "saturation" not in json.loads(path.read_text())


# --- absent fields give absent series, per field group ------------------------------------------------

GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # group → (its dcgm fields, the signals they make)
    "throttle": (
        ("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
         "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION"),
        ("throttle_power", "throttle_thermal", "throttle_sync_boost", "throttle_board_limit"),
    ),
    "clock_events": (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",), ("clock_event_sw_power_cap", "clock_event_hw_thermal")),
    "memory": (("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"), ("memory_used_avg", "memory_used_max", "memory_pressure")),
    "xid": (("DCGM_FI_DEV_XID_ERRORS",), ("xid_count",)),
    "dram": (("DCGM_FI_PROF_DRAM_ACTIVE",), ("dram_active_avg", "dram_active_max")),
    "sm": (("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY"), ("sm_active_avg", "sm_occupancy_max")),
    "pcie": (("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"), ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")),
    "nvlink": (("DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"), ("nvlink_tx_bytes_per_s",)),
}  # fmt: skip


@pytest.fixture(scope="module")
def node() -> Iterator[SimulatedNode]:
    with build(SCENARIO, SteppedClock()) as built:
        yield built


def _signals(node: SimulatedNode, fields: tuple[str, ...]) -> set[str]:
    exporter = DcgmExporter(node, DcgmExporterOptions(fields=fields, collect_interval_s=10.0))
    try:
        processor = SaturationProcessor(SaturationConfig())
        batch = None
        for t in range(60, 130, 10):
            now = Timestamp(float(t), 1_700_000_000.0 + t)
            records = to_records(parse_exposition(exporter.metrics_text(float(t))).series, now)
            batch = processor.process(Batch(time=now, interval_s=10.0, node="n").with_records(records))
        assert batch is not None
        return {s.signal for s in batch.saturation}
    finally:
        exporter.close()


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_field_group_absent_gives_no_series_and_present_gives_them(node: SimulatedNode, group: str) -> None:
    fields, signals = GROUPS[group]
    without = tuple(name for name in FIELDS if name not in fields)
    assert not set(signals) & _signals(node, without)
    assert set(signals) <= _signals(node, fields)


# --- real dcgm-exporter texts -------------------------------------------------------------------------


def _values(text: str, field: str) -> dict[tuple[str, str | None], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(field + "{"):
            uuid = re.search(r'UUID="([^"]+)"', line)
            gi = re.search(r'GPU_I_ID="([^"]+)"', line)
            assert uuid is not None
            out[(uuid.group(1), gi.group(1) if gi else None)] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize(
    "fixture", ["t4_2gpu_nonmig_pod_labels.txt", "a100_mig_4instances_gpu_operator.txt", "a100_mig_1gi_nvidia_docs.txt"]
)
def test_real_exporter_text_parses_into_the_same_signals(fixture: str) -> None:
    text = (FIXTURES / fixture).read_text()
    now = Timestamp(1.0, 1_700_000_001.0)
    batch = Batch(time=now, interval_s=5.0, node="n").with_records(to_records(parse_exposition(text).series, now))
    got = {
        (s.device_id, s.gpu_instance_id, s.signal): s.value
        for s in SaturationProcessor(SaturationConfig()).process(batch).saturation
    }
    used, free = _values(text, "DCGM_FI_DEV_FB_USED"), _values(text, "DCGM_FI_DEV_FB_FREE")
    dram = _values(text, "DCGM_FI_PROF_DRAM_ACTIVE")
    assert used
    for (uuid, gi), mib in used.items():
        key = (uuid, None if gi is None else int(gi))
        assert got[(*key, "memory_used_max")] == pytest.approx(mib / (mib + free[(uuid, gi)]))
        assert got[(*key, "dram_active_avg")] == pytest.approx(dram[(uuid, gi)])
    for uuid in {u for u, _ in used}:
        assert got[(uuid, None, "xid_count")] == 0.0  # the field is there: a first reading counts nothing
        assert (uuid, None, "throttle_power") not in got  # violation counters are off by default: absent
        assert (uuid, None, "clock_event_sw_power_cap") not in got


@pytest.mark.parametrize(
    "fixture", ["a800_8gpu_mixed_mig_excerpt.txt", "h100_8gpu_eks_pod_labels.txt", "h100_mig_pod_labels_excerpt.txt"]
)
def test_real_exporter_texts_without_saturation_fields_give_no_series(fixture: str) -> None:
    # These captures carry power, energy and utilisation only: no framebuffer, XID, DCP or violation field.
    text = (FIXTURES / fixture).read_text()
    series = parse_exposition(text).series
    assert series  # the text parses: GPUs are there
    now = Timestamp(1.0, 1_700_000_001.0)
    batch = Batch(time=now, interval_s=5.0, node="n").with_records(to_records(series, now))
    assert SaturationProcessor(SaturationConfig()).process(batch).saturation == ()  # absent, never 0


def test_dcgm_last_code_field_undercounts_repeated_xids(node: SimulatedNode) -> None:
    # The scenario raises 13, 13 again, then 79 (200, 230, 250 s): dcgm's field shows 13 → 79, two changes.
    exporter = DcgmExporter(node, DcgmExporterOptions(fields=("DCGM_FI_DEV_XID_ERRORS",), collect_interval_s=10.0))
    try:
        processor = SaturationProcessor(SaturationConfig(window=1000.0))
        batch = None
        for t in range(10, 310, 10):
            now = Timestamp(float(t), 1_700_000_000.0 + t)
            records = to_records(parse_exposition(exporter.metrics_text(float(t))).series, now)
            batch = processor.process(Batch(time=now, interval_s=10.0, node="n").with_records(records))
        assert batch is not None
        gpu1 = node.scenario.gpus[1].uuid
        [count] = [
            s.value for s in batch.saturation if s.device_id == gpu1 and s.signal == "xid_count" and not s.pod_name
        ]
        assert count == 2.0  # of 3: the docs say why
    finally:
        exporter.close()


@pytest.mark.parametrize("name", ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"])
def test_both_dcgm_spellings_of_the_clock_event_bitmask_give_the_same_ratios(name: str) -> None:
    # DCGM 3.3 renamed CLOCK_THROTTLE_REASONS to CLOCKS_EVENT_REASONS; exporters of either age must work.
    # Four observations: sw_power_cap (0x4) in 3, hw_slowdown (0x8) in 1, gpu_idle (0x1, not saturation) in 2.
    processor = SaturationProcessor(SaturationConfig())
    batch = None
    for t, bits in enumerate((0x4, 0x4 | 0x8, 0x1, 0x4 | 0x1), start=1):
        text = f'# TYPE {name} gauge\n{name}{{gpu="0",UUID="GPU-a",device="nvidia0"}} {bits}\n'
        now = Timestamp(float(t), 1_700_000_000.0 + t)
        records = to_records(parse_exposition(text).series, now)
        batch = processor.process(Batch(time=now, interval_s=1.0, node="n").with_records(records))
    assert batch is not None
    got = {s.signal: s.value for s in batch.saturation}
    assert got["clock_event_sw_power_cap"] == 0.75
    assert got["clock_event_hw_slowdown"] == 0.25
    assert got["clock_event_hw_thermal"] == 0.0
    assert not [s for s in got if not s.startswith("clock_event_")]  # only the bitmask was given


def test_simulate_serves_the_cluster_to_the_dra_and_k8s_cluster_receivers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `wattpipe simulate` starts the scenario's cluster face too: WATTPIPE_CLUSTER_KUBECONFIG for the
    # receivers' kubeconfig option. dra-job's GPU 4 comes only from its DRA claim (the kubelet lists nothing
    # for it), so its saturation series exist only through the dra receiver.
    config = yaml.safe_load((ROOT / "configs" / "saturation.yaml").read_text())
    cluster = {"kubeconfig": "${env:WATTPIPE_CLUSTER_KUBECONFIG}", "relist_backoff": "0.1s"}
    config["receivers"].update({"dra": dict(cluster), "k8s_cluster": dict(cluster)})
    config["exporters"] = {"console": {"format": "json", "kinds": ["saturation", "cluster_gpu"]}}
    pipeline = config["service"]["pipelines"]["metrics"]
    pipeline["receivers"] += ["dra", "k8s_cluster"]
    pipeline["exporters"] = ["console"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["simulate", "-c", str(path), "--scenario", str(SCENARIO), "--duration", "130s", "--log-level", "error"]
    assert main(args, io.StringIO(), io.StringIO()) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    last = max(r["time"] for r in rows)
    dra = {
        r["values"]["signal"]: (r["values"]["saturation_scope"], r["values"]["value"])
        for r in rows
        if r["time"] == last and r["attributes"].get("pod_name") == "dra-job"
    }
    assert dra["memory_used_max"] == ("exclusive", pytest.approx(0.25))  # 20000 MiB of GPU 4's 80 GB
    assert dra["sm_active_avg"] == ("exclusive", pytest.approx(0.45))
    gauges = {
        r["values"]["resource_name"]: r["values"] for r in rows if r["time"] == last and r["type"] == "ClusterGpu"
    }
    assert gauges["nvidia.com/gpu"]["pending_pod_count"] == 1  # big-job placed at 120 s; huge-job waits
    assert gauges["nvidia.com/gpu"]["requested_allocatable_ratio"] == pytest.approx(22 / 10)
    assert gauges["nvidia.com/mig-1g.10gb"]["pending_pod_count"] == 1


@pytest.mark.parametrize("duration", ["65s", "70s", "75s", "80s"])
def test_collections_between_ticks_are_placed_by_the_energy_counter(tmp_path: Path, duration: str) -> None:
    # Collections at 3, 13, 23, … s, seen by the scrapes at 5, 15, 25, …: each is placed where DCGM's energy
    # reading falls among NVML's tick readings (3 s, not the scrape's 5 s), so counters and interval means
    # stay exact. The clock-event bitmask and memory are one reading per collection: sampled signals, off by
    # up to collect_interval / window while the window holds a change (docs/saturation.md, known limits).
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["dcgm"]["collect_offset_s"] = 3
    path = tmp_path / "offset.yaml"
    path.write_text(yaml.safe_dump(scenario))
    report = tmp_path / "report.json"
    args = ["simulate", "-c", str(ROOT / "configs" / "saturation.yaml"), "--scenario", str(path),
            "--duration", duration, "--report", str(report), "--log-level", "error"]  # fmt: skip
    assert main(args, io.StringIO(), io.StringIO()) == 0
    rows = json.loads(report.read_text())["saturation"]
    assert {round(r["window_end_s"] % 10, 3) for r in rows} == {3.0}  # dated by the collection, not the scrape
    for row in rows:
        error = abs(row["value"] - row["true_value"])
        if row["signal"].startswith(("memory_", "clock_event_")):
            assert error <= 10 / 60 + 1e-9, row
        else:
            assert error <= (1.0 if row["signal"] in RATES else 0.01), row
