"""The metric catalog: every family resolvable against its record, named uniquely per scheme, documented."""

from __future__ import annotations

import dataclasses
import importlib.util
import operator
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wattpipe.pipeline._label_plan import LABEL_CACHE_MIN
from wattpipe.pipeline.batch import Batch, LabelAction
from wattpipe.pipeline.catalog import (
    ATTRIBUTES,
    DEVICE_DERIVED,
    FAMILIES,
    NODE,
    Family,
    LabelEngine,
    Scheme,
    SeriesLabels,
    device_attributes,
    label_name,
    labelled_columns,
    labelled_values,
    points,
    prometheus_name,
)
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.labels import _plan
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuShare, Record, SharingMode, Totals

ROOT = Path(__file__).resolve().parents[2]
T = Timestamp(monotonic_s=10.0, wall_s=1_767_225_600.0)
SCHEMES: tuple[Scheme, ...] = ("kepler", "otel")


def _gen_metrics_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_metrics_doc", ROOT / "scripts" / "gen_metrics_doc.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.kepler)
def test_every_field_a_family_names_exists_on_its_record_type(family: Family) -> None:
    names = {f.name for f in dataclasses.fields(family.record)}
    if family.value is not None:
        assert family.value in names
    for field_name, _ in family.where:
        assert field_name in names
    for attribute, _ in family.aliases:
        assert attribute in family.record.IDENTITY
    for attribute in family.labels:
        family.label_source(attribute)  # raises when neither an attribute, a field nor derivable
    assert set(family.labels).isdisjoint(family.optional)
    assert (family.divisor == 1000) == (family.value is not None and family.value.endswith("_mj"))


def test_label_source_refuses_what_the_record_cannot_give() -> None:
    broken = dataclasses.replace(FAMILIES[0], labels=("pod_name",))
    with pytest.raises(KeyError, match="DevicePower has no attribute or field 'pod_name'"):
        broken.label_source("pod_name")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_names_are_unique_per_scheme_and_valid_for_prometheus(scheme: Scheme) -> None:
    names = [f.name(scheme) for f in FAMILIES]
    assert len(names) == len(set(names))
    prom = [prometheus_name(f, scheme) for f in FAMILIES]
    assert len(prom) == len(set(prom))
    assert all(re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name) for name in prom)
    labels = [label_name(a.name, scheme) for a in (*ATTRIBUTES, NODE)]
    rendered = [name for name in labels if name is not None]
    assert len(rendered) == len(set(rendered))


def test_kepler_names_follow_prometheus_conventions_and_otel_names_the_rule() -> None:
    for family in FAMILIES:
        if family.instrument == "counter":  # a counter's name ends with its unit's word and _total
            assert family.kepler.endswith({"J": "_joules_total", "s": "_seconds_total"}[family.unit])
        if family.unit == "W":
            assert family.kepler.endswith("_watts")
        if family.instrument == "info":
            assert family.kepler.endswith("_info")
    by_otel = {f.otel: prometheus_name(f, "otel") for f in FAMILIES}
    assert by_otel["hw.power"] == "hw_power_watts"
    assert by_otel["hw.energy"] == "hw_energy_joules_total"
    assert by_otel["wattpipe.gpu.info"] == "wattpipe_gpu_info"
    assert by_otel["wattpipe.device.up"] == "wattpipe_device_up"


def test_the_families_the_kepler_dashboards_use_are_all_there() -> None:
    kepler = {f.kepler for f in FAMILIES}
    assert {
        "kepler_node_gpu_watts",
        "kepler_node_gpu_idle_watts",
        "kepler_node_gpu_active_watts",
        "kepler_node_gpu_joules_total",
        "kepler_node_gpu_idle_joules_total",
        "kepler_node_gpu_active_joules_total",
        "kepler_node_gpu_info",
        "kepler_process_gpu_watts",
        "kepler_process_gpu_joules_total",
        "kepler_container_gpu_watts",
        "kepler_container_gpu_joules_total",
        "kepler_pod_gpu_watts",
        "kepler_pod_gpu_joules_total",
    } <= kepler


def test_points_map_attributes_derive_the_gpu_index_and_skip_absent_values() -> None:
    batch = Batch(time=T, interval_s=5.0, node="n").with_records(
        [
            DeviceSample(time=T, device_id="GPU-x", device_index=4, vendor="nvidia"),
            DevicePower(
                time=T,
                device_id="GPU-x",
                device_index=4,
                interval_s=5.0,
                power_w=100.0,
                idle_w=None,
                active_w=100.0,
                energy_mj=500_000,
                idle_energy_mj=0,
                active_energy_mj=500_000,
            ),
            Totals(time=T, scope="process", key="42", device_id="GPU-x", energy_mj=2_500, extra=(("comm", "py"),)),
            Totals(time=T, scope="pod", key="uid-1", device_id="GPU-x", energy_mj=1),
        ]
    )
    family = {f.kepler: f for f in FAMILIES}
    (process,) = points(family["kepler_process_gpu_joules_total"], batch, "kepler")
    assert process.value == 2.5
    assert dict(process.labels) == {
        "pid": "42",
        "gpu": "4",
        "gpu_uuid": "GPU-x",
        "vendor": "nvidia",
        "state": "running",
        "comm": "py",
    }
    (otel,) = points(family["kepler_process_gpu_joules_total"], batch, "otel")
    assert dict(otel.labels) == {
        "process.pid": "42",
        "wattpipe.gpu.index": "4",
        "hw.id": "GPU-x",
        "hw.vendor": "nvidia",
        "wattpipe.state": "running",
        "process.command": "py",
    }
    assert list(points(family["kepler_process_gpu_watts"], batch, "kepler")) == []  # power_w absent
    assert list(points(family["kepler_node_gpu_idle_watts"], batch, "kepler")) == []  # idle_w absent
    (pod,) = points(family["kepler_pod_gpu_joules_total"], batch, "kepler")
    assert dict(pod.labels)["pod_id"] == "uid-1"
    assert device_attributes(batch) == {"GPU-x": {"device_index": "4", "vendor": "nvidia"}}
    assert set(DEVICE_DERIVED) == {"device_index", "device_name", "vendor"}


def test_points_collapse_records_onto_one_series_and_apply_label_actions() -> None:
    shares = [
        GpuShare(time=T, device_id="GPU-x", pid=pid, share=0.5, energy_mj=1, power_w=1.0, extra=(("comm", str(pid)),))
        for pid in (1, 2)
    ]
    batch = Batch(time=T, interval_s=5.0, node="n").with_records(shares)
    mode = next(f for f in FAMILIES if f.kepler == "wattpipe_attribution_mode")
    (point,) = points(mode, batch, "kepler")
    assert dict(point.labels) == {"gpu_uuid": "GPU-x", "mode": "time_slicing"}  # no index known, no extras
    renamed = batch.replace(label_actions=(LabelAction("rename", "device_id", new_key="uuid"),))
    (point,) = points(mode, renamed, "kepler")
    assert dict(point.labels) == {"mode": "time_slicing"}


def test_a_family_without_extras_is_keyed_by_its_label_fields_alone_unless_actions_may_move_attributes() -> None:
    # The attribution mode has one series per device: its 65 shares there are one key (one lookup), not 65.
    mode = next(f for f in FAMILIES if f.kepler == "wattpipe_attribution_mode")
    shares = [
        GpuShare(time=T, device_id="GPU-k", pid=pid, share=0.5, energy_mj=1, power_w=1.0, extra=(("comm", "x"),))
        for pid in range(65)
    ]
    batch = Batch(time=T, interval_s=5.0, node="n").with_records(shares)
    cache = _plan(mode, "otel").cache
    before = len(cache)
    (point,) = points(mode, batch, "otel")
    assert len(cache) - before == 1
    assert point.record is shares[-1]
    # A label action could rename a per-process attribute into a rendered label: then every record is keyed
    # in full, and the action's result is what renders.
    moved = batch.replace(label_actions=(LabelAction("rename", "pid", new_key="device_id"),))
    found = list(points(mode, moved, "otel"))
    assert len(cache) - before == 1 + 65
    assert sorted(int(p.labels["hw.id"]) for p in found) == list(range(65))


def test_metrics_doc_is_current() -> None:
    problem = _gen_metrics_doc().check(ROOT)
    assert problem is None, f"{problem}: run python scripts/gen_metrics_doc.py"


def test_metrics_doc_check_notices_a_stale_or_missing_file(tmp_path: Path) -> None:
    gen = _gen_metrics_doc()
    assert gen.check(tmp_path) == "docs/metrics.md is missing"
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "metrics.md", tmp_path / "docs" / "metrics.md")
    assert gen.check(tmp_path) is None
    with (tmp_path / "docs" / "metrics.md").open("a", encoding="utf-8") as f:
        f.write("hand edit\n")
    assert "differs" in gen.check(tmp_path)


def test_metrics_doc_names_every_family_in_both_schemes() -> None:
    text = _gen_metrics_doc().render()
    for family in FAMILIES:
        assert f"### `{family.kepler}`" in text
        assert f"`{family.otel}`" in text
        assert f"`{prometheus_name(family, 'otel')}`" in text


def _process(pid: int, mj: int, scope: str = "process", device: str = "GPU-x", **changes: Any) -> Totals:
    return Totals(time=T, scope=scope, key=str(pid), device_id=device, energy_mj=mj, **changes)  # type: ignore[arg-type]


FAMILY = {f.kepler: f for f in FAMILIES}


def test_every_family_reads_records_of_exactly_the_type_its_batch_field_holds() -> None:
    # points() takes a family's records from its Batch field without an isinstance test: that holds while
    # no family names a subclass of a record type.
    for family in FAMILIES:
        assert family.record.__mro__[1] is Record, family.kepler
        assert Batch.field_for(family.record) in Batch.FIELDS


def test_a_collapsed_series_keeps_its_first_records_place_and_its_last_records_value() -> None:
    batch = Batch(time=T, interval_s=5.0, node="n").with_records(
        [_process(1, 1_000), _process(2, 2_000), _process(1, 3_000, power_w=5.0)]
    )
    found = list(points(FAMILY["kepler_process_gpu_joules_total"], batch, "kepler"))
    assert [(p.labels["pid"], p.value) for p in found] == [("1", 3.0), ("2", 2.0)]
    assert isinstance(found[0].record, Totals)
    assert found[0].record.power_w == 5.0


def test_each_consumer_family_takes_only_its_scope_from_mixed_totals_batch_after_batch() -> None:
    def scopes(batch: Batch) -> dict[str, list[float]]:
        return {
            scope: [p.value for p in points(FAMILY[f"kepler_{scope}_gpu_joules_total"], batch, "kepler")]
            for scope in ("process", "container", "pod")
        }

    first = Batch(time=T, interval_s=5.0, node="n").with_records(
        [_process(1, 1_000), _process(2, 2_000, "pod"), _process(3, 3_000, "container"), _process(4, 4_000)]
    )
    assert scopes(first) == {"process": [1.0, 4.0], "container": [3.0], "pod": [2.0]}
    second = first.replace(totals=(_process(5, 5_000, "pod"),))
    assert scopes(second) == {"process": [], "container": [], "pod": [5.0]}
    assert scopes(first) == {"process": [1.0, 4.0], "container": [3.0], "pod": [2.0]}


def test_a_series_labels_are_the_same_mapping_from_tick_to_tick() -> None:
    family = FAMILY["kepler_process_gpu_joules_total"]
    device = DeviceSample(time=T, device_id="GPU-x", device_index=0)

    def labels(batch: Batch) -> Mapping[str, str]:
        (point,) = points(family, batch, "kepler")
        return point.labels

    tick = Batch(time=T, interval_s=5.0, node="n").with_records([device, _process(1, 1_000)])
    later = Batch(time=T, interval_s=5.0, node="n").with_records([device, _process(1, 9_000)])
    assert labels(tick) is labels(later)  # what the Prometheus exporter's per-series text cache relies on
    relabelled = later.replace(label_actions=(LabelAction("upsert", "team", "ml"),))
    assert labels(relabelled) is not labels(later)
    assert labels(relabelled)["team"] == "ml"
    moved = later.replace(devices=(DeviceSample(time=T, device_id="GPU-x", device_index=3),))
    assert labels(moved)["gpu"] == "3"


def test_series_labels_keep_their_identity_while_unchanged_and_are_new_once_a_label_changes() -> None:
    # SeriesLabels' identity promise, which the Prometheus and OTLP exporters key their caches on: every way
    # the engine hands out labels gives the same object for an unchanged series in the next batch, and a
    # new one (with the new label) when one of its labels changes.
    family = FAMILY["kepler_process_gpu_joules_total"]
    device = DeviceSample(time=T, device_id="GPU-x", device_index=0)

    def pid_labels(batch: Batch) -> dict[str, SeriesLabels]:
        columns = labelled_columns(family, batch, "kepler")
        by_pid = {labels["pid"]: labels for labels in columns.labels}
        assert all(type(labels) is SeriesLabels for labels in columns.labels)
        assert [triple[0] for triple in labelled_values(family, batch, "kepler")] == list(columns.labels)
        assert all(
            a is b for a, b in zip((p.labels for p in points(family, batch, "kepler")), columns.labels, strict=True)
        )
        return by_pid

    first = pid_labels(
        Batch(time=T, interval_s=5.0, node="n").with_records([device, _process(41, 1_000), _process(42, 1_000)])
    )
    # The next batch: new values, records in another order, one more series; 41 and 42 unchanged.
    second = pid_labels(
        Batch(time=T, interval_s=5.0, node="n").with_records(
            [device, _process(43, 1), _process(42, 2_000), _process(41, 3_000)]
        )
    )
    assert second["41"] is first["41"]
    assert second["42"] is first["42"]
    # 41's extras change (a new label), 42's do not: only 41 gets a new object.
    third = pid_labels(
        Batch(time=T, interval_s=5.0, node="n").with_records(
            [device, _process(41, 4_000, extra=(("team", "ml"),)), _process(42, 4_000)]
        )
    )
    assert third["41"] is not second["41"]
    assert third["41"]["team"] == "ml"
    assert third["42"] is second["42"]
    # The device's index changes: the gpu label of both changes, and both get new objects.
    moved = DeviceSample(time=T, device_id="GPU-x", device_index=3)
    fourth = pid_labels(
        Batch(time=T, interval_s=5.0, node="n").with_records([moved, _process(41, 5_000), _process(42, 5_000)])
    )
    assert fourth["41"] is not first["41"]
    assert fourth["42"] is not third["42"]
    assert fourth["41"]["gpu"] == fourth["42"]["gpu"] == "3"


def test_each_label_engine_owns_its_caches_and_keeps_the_identity_promise_within_itself() -> None:
    family = FAMILY["kepler_process_gpu_joules_total"]
    batch = Batch(time=T, interval_s=5.0, node="n").with_records(
        [DeviceSample(time=T, device_id="GPU-x", device_index=0), _process(51, 1_000)]
    )
    later = batch.replace(totals=(_process(51, 2_000),))
    one, other = LabelEngine(), LabelEngine()
    (mine,) = labelled_columns(family, batch, "kepler", engine=one).labels
    (theirs,) = labelled_columns(family, batch, "kepler", engine=other).labels
    assert mine == theirs
    assert mine is not theirs  # no cache shared between engines
    assert labelled_columns(family, later, "kepler", engine=one).labels[0] is mine
    assert labelled_columns(family, later, "kepler", engine=other).labels[0] is theirs
    (default,) = labelled_columns(family, later, "kepler").labels  # DEFAULT_ENGINE
    assert default is not mine
    assert default is not theirs


def test_label_cache_forgets_gone_series_and_keeps_live_ones_through_churn() -> None:
    # 20 new processes per tick for 500 ticks, 3 long-lived ones throughout: the cache stays near what
    # is in use (not every pid ever seen) and the long-lived series keep their mapping objects.
    family = FAMILY["kepler_process_gpu_joules_total"]
    device = DeviceSample(time=T, device_id="GPU-x", device_index=0)
    plan = _plan(family, "kepler")
    plan.cache.current.clear()  # what earlier tests left would shift the generations by a tick
    plan.cache.older.clear()
    first: dict[str, Mapping[str, str]] = {}
    sizes = []
    for tick in range(500):
        churn = [_process(10_000 + tick * 20 + i, 1) for i in range(20)]
        batch = Batch(time=T, interval_s=5.0, node="n").with_records(
            [device, *churn, *(_process(p, 1) for p in (1, 2, 3))]
        )
        for point in points(family, batch, "kepler"):
            if point.labels["pid"] in ("1", "2", "3"):
                assert first.setdefault(point.labels["pid"], point.labels) is point.labels, tick
        sizes.append(len(plan.cache))
    assert len(first) == 3
    assert max(sizes) <= 2 * (LABEL_CACHE_MIN + 1) + 2 * 23  # two generations, each bounded
    assert max(sizes[250:]) == max(sizes[:250])  # flat, not growing with the pids ever seen


def _passes(value: object, wanted: str) -> bool:
    """A ``where`` test as families.Family documents it (``!None``; ``^x`` / ``!^x`` prefix tests), one record at a time."""
    if wanted == "!None":
        return value is not None
    if wanted.startswith("!^"):
        return not str(value).startswith(wanted[2:])
    if wanted.startswith("^"):
        return str(value).startswith(wanted[1:])
    return str(value) == wanted


def _uncached(family: Family, batch: Batch, scheme: Scheme) -> list[tuple[dict[str, str], float, Record]]:
    """What labelled_values must give, worked out record by record with no cache: each record's labels made
    afresh, one point per label set (first place, last value), records without a value left out."""
    plan = _plan(family, scheme)
    devices = device_attributes(batch)
    out: dict[str, tuple[dict[str, str], float, Record]] = {}
    for record in getattr(batch, plan.field):
        if not all(_passes(getattr(record, name), wanted) for name, wanted in family.where):
            continue
        raw = 1.0 if family.value is None else getattr(record, family.value)
        if raw is None:
            continue
        labels = plan.labels(record, batch, devices.get(getattr(record, "device_id", ""), {}))
        out[labels.series] = (dict(labels), float(raw) / family.divisor, record)
    return list(out.values())


_DEVICE_NAMES = st.sampled_from(["NVIDIA H100", "NVIDIA A100"])
_EXTRA_VALUES = st.sampled_from([(), (("comm", "python"),), (("comm", "trainer"), ("container_id", "c1"))])


@st.composite
def _ticks(draw: st.DrawFn) -> list[Batch]:
    """Batches a node might give tick after tick: mostly the same processes, sometimes a change (a process
    starts, exits or is renamed, the GPU is renamed, a label action appears, records come in another order,
    a value goes absent); their totals of processes and containers, on GPUs and a CPU zone type, mixed."""
    batches = []
    pids = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5, unique=True))
    for _ in range(draw(st.integers(2, 6))):
        if draw(st.booleans()):
            pids = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5, unique=True))
        devices = tuple(
            DeviceSample(
                time=T,
                device_id=f"GPU-{i}",
                device_index=draw(st.sampled_from([i, i + 4])),  # renumbered: labels from the device change
                device_name=draw(_DEVICE_NAMES),
                vendor="nvidia",
                compute_mode=draw(st.sampled_from([None, "default", "exclusive_process"])),
                up=draw(st.booleans()),
            )
            for i in range(2)
        )
        totals = tuple(
            Totals(
                time=T,
                scope=draw(st.sampled_from(["process", "process", "container"])),
                key=str(pid),
                device_id=draw(st.sampled_from([f"GPU-{pid % 2}", f"GPU-{pid % 2}", "cpu:package"])),
                energy_mj=draw(st.integers(0, 10**6)),
                power_w=draw(st.none() | st.floats(0, 500)),
                state=draw(st.sampled_from(["running", "terminated"])),
                extra=draw(_EXTRA_VALUES),
            )
            for pid in pids
        )
        shares = tuple(
            GpuShare(time=T, device_id=f"GPU-{pid % 2}", pid=pid if pid != 6 else None, share=0.5, energy_mj=1,
                     power_w=1.0, mode=draw(st.sampled_from(["time_slicing", "exclusive"])))
            for pid in pids
        )  # fmt: skip
        actions = draw(st.sampled_from([(), (LabelAction("insert", "team", "ml"),), (LabelAction("drop", "comm"),)]))
        batch = Batch(time=T, interval_s=5.0, node="n").with_records((*devices, *totals, *shares))
        batches.append(batch.replace(label_actions=actions))
    return batches


_CACHED_FAMILIES = [
    f
    for f in FAMILIES
    if f.kepler
    in (
        "kepler_process_gpu_joules_total",
        "kepler_process_gpu_watts",
        "kepler_process_cpu_joules_total",  # each selects a scope and a kind of device among mixed totals
        "kepler_container_gpu_watts",
        "kepler_container_cpu_joules_total",
        "wattpipe_attribution_mode",
        "wattpipe_node_gpu_unattributed_watts",
        "wattpipe_device_up",  # before the info family: the same records, keyed by fewer fields
        "kepler_node_gpu_info",
    )
]


@settings(max_examples=150, deadline=None)
@given(_ticks())
def test_labelled_values_equal_the_uncached_answer_tick_after_tick(batches: list[Batch]) -> None:
    # The caches (labels by key, and the last call's keys for a node whose records did not change) must never
    # give a label, value or record that a fresh computation would not.
    for batch in batches:
        for family in _CACHED_FAMILIES:
            for scheme in SCHEMES:
                got = [
                    (dict(labels), value, record) for labels, value, record in labelled_values(family, batch, scheme)
                ]
                assert got == _uncached(family, batch, scheme), family.kepler


def test_a_where_value_absent_from_the_batch_selects_nothing_and_a_present_one_selects_its_records() -> None:
    # The tested field's texts are kept per record tuple with their set: a value not among them is answered
    # from the set, so the same tuple must still give the records of a value that is there.
    def total(scope: str, key: str) -> Totals:
        return Totals(time=T, scope=scope, key=key, device_id="GPU-a", energy_mj=1000)  # type: ignore[arg-type]

    def keys(family: str, batch: Batch) -> list[str]:
        family_ = next(f for f in FAMILIES if f.kepler == family)
        return [p.record.key for p in points(family_, batch, "kepler") if isinstance(p.record, Totals)]

    batch = Batch(time=T, interval_s=5.0, node="n").with_records([total("process", "1"), total("process", "2")])
    assert keys("kepler_container_gpu_joules_total", batch) == []
    assert keys("kepler_process_gpu_joules_total", batch) == ["1", "2"]
    mixed = batch.with_records([total("container", "c1")])
    assert keys("kepler_container_gpu_joules_total", mixed) == ["c1"]
    assert keys("kepler_process_gpu_joules_total", mixed) == ["1", "2"]


def test_a_steady_family_gets_the_last_calls_very_label_list_and_a_changed_one_a_new_list() -> None:
    # The Prometheus renderer compares the list by identity before comparing an id per series: the same list
    # must mean the same mappings, in the same order.
    family = FAMILY["kepler_process_gpu_joules_total"]
    device = DeviceSample(time=T, device_id="GPU-x", device_index=0)
    engine = LabelEngine()
    batch = Batch(time=T, interval_s=5.0, node="n").with_records([device, _process(61, 1_000), _process(62, 1_000)])
    first = labelled_columns(family, batch, "kepler", engine=engine).labels
    steady = batch.replace(totals=(_process(61, 2_000), _process(62, 3_000)))
    assert labelled_columns(family, steady, "kepler", engine=engine).labels is first
    before = list(first)
    changed = batch.replace(totals=(_process(62, 4_000), _process(63, 1_000)))
    labels = labelled_columns(family, changed, "kepler", engine=engine).labels
    assert labels is not first
    assert [dict(m)["pid"] for m in labels] == ["62", "63"]
    assert len(first) == len(before)  # the old list was not changed
    assert all(map(operator.is_, first, before))


def test_a_steady_call_picks_the_same_series_positions_as_the_call_before() -> None:
    # The attribution mode: a device's shares collapse onto one series per mode. A second call with the same
    # records takes the last call's labels and kept positions: one point per series, the last record's value.
    mode = next(f for f in FAMILIES if f.kepler == "wattpipe_attribution_mode")
    modes: list[tuple[int, SharingMode]] = [(1, "time_slicing"), (2, "exclusive"), (3, "time_slicing")]
    shares = [
        GpuShare(time=T, device_id="GPU-s", pid=pid, share=0.5, energy_mj=1, power_w=1.0, mode=mode_)
        for pid, mode_ in modes
    ]
    batch = Batch(time=T, interval_s=5.0, node="n").with_records(shares)
    first = [(dict(p.labels)["mode"], p.record) for p in points(mode, batch, "kepler")]
    again = [(dict(p.labels)["mode"], p.record) for p in points(mode, batch, "kepler")]  # the steady path
    assert first == again == [("time_slicing", shares[2]), ("exclusive", shares[1])]


def test_values_a_custom_component_gave_as_other_numbers_are_exported_as_floats() -> None:
    # Records are not type-checked at runtime: a Decimal or a numeric text in an mJ field is exported as its
    # value in joules, not a failed render.
    from decimal import Decimal

    records = [_process(1, 1500), _process(2, Decimal(2500)), _process(3, "3500")]  # type: ignore[arg-type]
    batch = Batch(time=T, interval_s=5.0, node="n").with_records(records)
    got = [value for _, value, _ in labelled_values(FAMILY["kepler_process_gpu_joules_total"], batch, "kepler")]
    assert got == [1.5, 2.5, 3.5]
    assert all(type(value) is float for value in got)


def test_families_over_the_same_records_share_their_columns_across_pipelines_rendered_in_turn() -> None:
    # A process's joules and watts select the same Totals and key them alike: worked out once per batch, also
    # when another pipeline's batch is rendered in between (an exporter renders every pipeline's batch).
    joules, watts = FAMILY["kepler_process_gpu_joules_total"], FAMILY["kepler_process_gpu_watts"]
    a, b = (
        Batch(time=T, interval_s=5.0, node="n", pipeline=name).with_records(
            [_process(pid, 1000 * pid, power_w=1.0) for pid in pids]
        )
        for name, pids in (("a", (1, 2, 3)), ("b", (4, 5)))
    )
    first = {name: labelled_columns(joules, batch, "kepler") for name, batch in (("a", a), ("b", b))}
    again = {name: labelled_columns(watts, batch, "kepler") for name, batch in (("a", a), ("b", b))}
    assert [again[name].records is first[name].records for name in "ab"] == [True, True]
    assert [r.key for r in again["a"].records] == ["1", "2", "3"]
    assert list(again["b"].values) == [1.0, 1.0]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_family_takes_a_suffix_prometheus_reserves_for_another_type(scheme: Scheme) -> None:
    # promtool check metrics: "non-counter metrics should not have _total suffix", and _count, _sum and
    # _bucket belong to histograms and summaries. Two gauges keep the names issue 18 gives them (promtool warns
    # on both); no other family may.
    issue_named = {"pending_pod_count", "pending_request_total"}
    wrong = []
    for family in FAMILIES:
        if family.value in issue_named:
            continue
        name = prometheus_name(family, scheme)
        reserved = ("_count", "_sum", "_bucket") + (() if family.instrument == "counter" else ("_total",))
        if name.endswith(reserved):
            wrong.append(name)
    assert wrong == []
