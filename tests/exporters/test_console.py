"""Exporter ``console``: tables for people, JSON lines for jq; absent values are "—", never 0."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

from tests.helpers.context import make_context
from wattpipe.exporters.console import ConsoleConfig, ConsoleExporter, factory
from wattpipe.pipeline.batch import Batch, LabelAction
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.components import CreateContext
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuProcessSample, Totals

T = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)
EARLIER = Timestamp(monotonic_s=999.5, wall_s=1_767_225_599.5)


def sample_batch(**changes: Any) -> Batch:
    batch = Batch(time=T, interval_s=5.0, node="node-a").with_records(
        [
            DeviceSample(time=T, device_id="GPU-0", device_index=0, power_w=251.25, energy_mj=1234.5678),
            DeviceSample(time=T, device_id="GPU-1", device_index=1, power_w=None, energy_mj=99.0),
            DevicePower(
                time=T,
                device_id="GPU-0",
                interval_s=5.0,
                power_w=300.0,
                idle_w=60.0,
                active_w=240.0,
                energy_mj=1500000,
                idle_energy_mj=300000,
                active_energy_mj=1200000,
            ),
            GpuProcessSample(time=EARLIER, device_id="GPU-0", pid=4242, sm_util=0.5),
            Totals(time=T, scope="pod", key="uid-1", device_id="GPU-0", energy_mj=12000),
        ]
    )
    return batch.replace(**changes) if changes else batch


def export(batch: Batch, **options: Any) -> str:
    stream = io.StringIO()
    options.setdefault("width", 200)
    asyncio.run(ConsoleExporter(ConsoleConfig.model_validate(options), stream=stream).export(batch))
    return stream.getvalue()


def is_title(line: str) -> bool:
    return line.strip().split(" · ")[0].removesuffix(" (continued)") in Batch.FIELDS


def titles(output: str) -> list[str]:
    """The tables' titles, in order (a field's name, with its kind where a field holds several)."""
    return [line.strip() for line in output.splitlines()[1:] if is_title(line)]


def row(output: str, table: str, first_cell: str) -> list[str]:
    """The cells of the row of ``table`` that starts with ``first_cell``."""
    lines = [line.rstrip() for line in output.splitlines()]
    start = lines.index(table)
    end = next((i for i in range(start + 1, len(lines)) if is_title(lines[i])), len(lines))
    (line,) = [line for line in lines[start:end] if line.startswith(first_cell + " ")]
    return [cell.strip() for cell in line.split("│")]


def headers(output: str, table: str) -> list[str]:
    lines = [line.rstrip() for line in output.splitlines()]
    return [cell.strip() for cell in lines[lines.index(table) + 1].split("┃")]


def test_table_shows_a_header_with_node_readable_time_interval_and_record_count() -> None:
    out = export(sample_batch())

    header = out.splitlines()[0]
    assert "metrics" in header
    assert "node node-a" in header
    assert "2026-01-01 00:00:00 UTC" in header  # not 1767225600.000
    assert "every 5 s" in header
    assert "5 records" in header


def test_table_shows_energy_in_joules_and_units_in_the_headers() -> None:
    out = export(sample_batch())

    assert headers(out, "devices") == ["device id", "device index", "device type", "up", "power W", "energy J",
                                       "processes known", "counter epoch"]  # fmt: skip
    assert row(out, "devices", "GPU-0")[:6] == ["GPU-0", "0", "gpu", "True", "251.250", "1.235"]
    assert "4242" in out
    assert "0.500" in out  # sm_util
    assert row(out, "device_power", "GPU-0")[-6:-3] == ["1500.000", "300.000", "1200.000"]  # J, from mJ
    assert "1500000" not in out
    assert titles(out) == ["devices", "gpu_processes", "device_power", "totals · pod"]


def test_table_shows_absent_values_as_a_dash_not_zero() -> None:
    out = export(sample_batch())

    cells = row(out, "devices", "GPU-1")
    assert cells[4] == "—"  # power_w: the source could not say
    assert cells[5] == "0.099"
    assert "0.000" not in cells


def test_table_kinds_option_limits_the_fields_shown_in_that_order() -> None:
    out = export(sample_batch(), kinds=["totals", "devices"])

    assert titles(out) == ["totals · pod", "devices"]
    assert "4242" not in out
    assert "uid-1" in out


def test_process_container_and_pod_totals_are_tables_of_their_own() -> None:
    totals = (
        Totals(time=T, scope="process", key="7", device_id="GPU-0", energy_mj=1000),
        Totals(time=T, scope="container", key="c1", device_id="GPU-0", energy_mj=2000),
        Totals(time=T, scope="pod", key="uid-1", device_id="GPU-0", energy_mj=3000),
        Totals(time=T, scope="process", key="8", device_id="GPU-0", energy_mj=4000),
    )
    out = export(Batch(time=T, interval_s=5, node="n").replace(totals=totals))

    assert titles(out) == ["totals · process", "totals · container", "totals · pod"]
    lines = [line.strip() for line in out.splitlines()]
    process_rows = lines[lines.index("totals · process") + 3 : lines.index("totals · container")]
    assert [r.split("│")[1].strip() for r in process_rows] == ["7", "8"]
    assert "scope" not in headers(out, "totals · pod")  # the title says it
    assert row(out, "totals · container", "GPU-0")[1:3] == ["c1", "running"]
    assert row(out, "totals · pod", "GPU-0") == ["GPU-0", "uid-1", "running", "3.000"]


def test_table_renders_labels_after_the_batch_label_actions() -> None:
    batch = sample_batch(
        label_actions=(
            LabelAction(op="insert", key="cluster", value="prod-eu"),
            LabelAction(op="rename", key="device_id", new_key="gpu_uuid"),
        )
    )
    out = export(batch, kinds=["devices"])

    assert "gpu uuid" in headers(out, "devices")
    assert "device id" not in headers(out, "devices")
    assert out.count("prod-eu") == 2


@pytest.mark.parametrize("width", [60, 80, 120])
def test_tables_fit_the_width_without_cutting_a_header_or_a_value(width: int) -> None:
    """A table wider than the terminal is split in several, each repeating the first column."""
    batch = sample_batch(
        label_actions=(LabelAction(op="insert", key="a_rather_long_cluster_label_name", value="production-eu"),)
    )
    out = export(batch, width=width)

    assert max(len(line) for line in out.splitlines()[1:]) <= width
    assert "…" not in out
    for heading in ("a rather long cluster label name", "active energy J", "idle energy J", "processes known"):
        assert heading in out
    assert "1500.000" in out
    assert "1200.000" in out
    if width < 120:
        assert "device_power (continued)" in titles(out)


def test_long_hexadecimal_ids_are_shortened_as_docker_does() -> None:
    container = "0271f6ceccc" + "d" * 53
    total = Totals(time=T, scope="container", key=container, device_id="GPU-d45a74cd-629a-2859-337f-5ff4d997a9cb",
                   energy_mj=5)  # fmt: skip
    out = export(Batch(time=T, interval_s=5, node="n").replace(totals=(total,)))

    assert "0271f6cecccd…" in out
    assert "GPU-d45a74cd-629…" in out
    assert container not in out


def test_width_zero_follows_the_columns_variable_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "70")
    out = export(sample_batch(), width=0)

    assert max(len(line) for line in out.splitlines()[1:]) <= 70
    monkeypatch.setenv("COLUMNS", "300")
    wide = export(sample_batch(), width=0)
    assert max(len(line) for line in wide.splitlines()[1:]) > 70


def test_table_for_an_empty_batch_prints_only_the_header() -> None:
    out = export(Batch(time=T, interval_s=5.0, node="node-a"))

    assert out.splitlines() == [out.splitlines()[0]]
    assert "0 records" in out


def test_a_reader_that_went_away_stops_the_output_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    stream = Closed()
    exporter = ConsoleExporter(ConsoleConfig(format="json"), stream=stream)
    with caplog.at_level("WARNING"):
        asyncio.run(exporter.export(sample_batch()))
        asyncio.run(exporter.export(sample_batch()))  # no second error, no second warning

    assert [r.getMessage() for r in caplog.records] == [
        "the stdout reader went away (broken pipe): no more console output"
    ]


def test_json_writes_one_object_per_record_with_labels_after_actions_and_values() -> None:
    batch = sample_batch(
        label_actions=(
            LabelAction(op="insert", key="cluster", value="prod"),
            LabelAction(op="drop", key="device_type"),
        )
    )

    out = export(batch, format="json")

    assert out.endswith("\n")
    objects = [json.loads(line) for line in out.splitlines()]
    assert len(objects) == batch.count() == 5
    first = objects[0]
    assert first == {
        "time": 1_767_225_600.0,
        "node": "node-a",
        "pipeline": "metrics",
        "field": "devices",
        "type": "DeviceSample",
        "kind": "device",
        "attributes": {"cluster": "prod", "device_id": "GPU-0", "device_index": "0"},
        "values": {"up": True, "power_w": 251.25, "energy_mj": 1234.5678, "processes_known": True, "counter_epoch": 0},
    }
    assert "power_w" not in objects[1]["values"]  # absent, not 0
    process = next(o for o in objects if o["type"] == "GpuProcessSample")
    assert process["time"] == 1_767_225_599.5  # the record's own read time
    assert process["values"] == {"sm_util": 0.5}
    totals = objects[-1]
    assert (totals["field"], totals["kind"], totals["values"]) == ("totals", "pod", {"energy_mj": 12000})


def test_json_kinds_option_limits_the_records() -> None:
    out = export(sample_batch(), format="json", kinds=["gpu_processes"])

    objects = [json.loads(line) for line in out.splitlines()]
    assert [o["attributes"]["pid"] for o in objects] == ["4242"]


def test_json_writes_nothing_for_an_empty_batch() -> None:
    assert export(Batch(time=T, interval_s=5.0, node="node-a"), format="json") == ""
    assert export(sample_batch(), format="json", kinds=["shares"]) == ""


def context() -> CreateContext:
    clock = SteppedClock()
    return make_context("console", "exporter", clock, node_name="node-a")


def test_create_rejects_unknown_kinds_listing_the_known_fields() -> None:
    with pytest.raises(ValueError, match="kinds: unknown batch field") as info:
        factory.create(context(), ConsoleConfig(kinds=["devices", "device", "pods"]))

    text = str(info.value)
    assert "field(s) device, pods;" in text
    assert "known: devices, gpu_processes" in text


def test_created_exporter_writes_json_to_the_configured_stream(capsys: pytest.CaptureFixture[str]) -> None:
    exporter = factory.create(context(), ConsoleConfig(format="json", output="stderr", kinds=["devices"]))
    assert isinstance(exporter, ConsoleExporter)

    asyncio.run(exporter.export(sample_batch()))

    captured = capsys.readouterr()
    assert captured.out == ""
    assert [json.loads(line)["attributes"]["device_id"] for line in captured.err.splitlines()] == ["GPU-0", "GPU-1"]


def test_unknown_format_is_a_validation_error() -> None:
    with pytest.raises(ValueError, match="'table' or 'json'"):
        ConsoleConfig.model_validate({"format": "yaml"})


def test_series_start_times_print_as_clock_times_not_dicts() -> None:
    start = Timestamp(monotonic_s=1.0, wall_s=1_767_225_600.0 + 3723)  # 01:02:03 UTC
    total = Totals(time=T, scope="process", key="7", device_id="GPU-0", energy_mj=5, start=start)
    stream = io.StringIO()
    asyncio.run(
        ConsoleExporter(ConsoleConfig(), stream=stream).export(
            Batch(time=T, interval_s=5, node="n").replace(totals=(total,))
        )
    )
    assert "01:02:03" in stream.getvalue()
    assert "wall_s" not in stream.getvalue()


def test_a_tick_with_records_but_none_of_the_kinds_shown_says_so_under_its_header() -> None:
    # The demo's first tick (no counter delta yet) printed "── metrics · … · 116 records" and then nothing.
    batch = Batch(time=T, interval_s=5.0, node="node-a").with_records(
        [GpuProcessSample(time=EARLIER, device_id="GPU-0", pid=4242, sm_util=0.5)]
    )
    out = export(batch, kinds=["device_power", "shares"])

    lines = out.splitlines()
    assert "1 records" in lines[0]
    assert lines[1:] == ["(no device_power or shares this tick)"]
    three = export(batch, kinds=["device_power", "shares", "totals"]).splitlines()
    assert three[1:] == ["(no device_power, shares or totals this tick)"]
