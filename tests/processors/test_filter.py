"""Processor ``filter``: keep or drop records by kind and by attribute regex."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch, LabelAction
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import (
    DevicePower,
    DeviceSample,
    GpuProcessSample,
    GpuShare,
    HostProcess,
    MigInstance,
    Totals,
    Workload,
)
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.processors.filter import FilterConfig, FilterProcessor, factory

T = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)


def make_filter(**options: Any) -> FilterProcessor:
    return FilterProcessor(FilterConfig.model_validate(options))


def sample_batch() -> Batch:
    """Two GPUs, three processes on them, a container, a MIG instance and totals of every scope."""
    return Batch(time=T, interval_s=5.0, node="node-a").with_records(
        [
            DeviceSample(time=T, device_id="GPU-0", device_name="H100"),
            DeviceSample(time=T, device_id="GPU-1", device_name="A100"),
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
            GpuProcessSample(time=T, device_id="GPU-0", pid=100),
            GpuProcessSample(time=T, device_id="GPU-0", pid=200),
            GpuProcessSample(time=T, device_id="GPU-1", pid=1000),
            HostProcess(time=T, pid=100, comm="python"),
            GpuShare(time=T, device_id="GPU-0", pid=100, share=0.5, energy_mj=600000, power_w=120.0),
            Workload(time=T, pid=100, pod_name="train-0", pod_namespace="ml"),
            MigInstance(time=T, device_id="GPU-1", gpu_instance_id=1, profile="1g.10gb"),
            Totals(time=T, scope="process", key="100", device_id="GPU-0", energy_mj=600000),
            Totals(time=T, scope="container", key="c-1", device_id="GPU-0", energy_mj=600000),
            Totals(time=T, scope="pod", key="uid-1", device_id="GPU-0", energy_mj=600000),
        ]
    )


def kinds_of(batch: Batch) -> list[tuple[str, str]]:
    return [(type(r).__name__, getattr(r, "scope", "")) for r in batch.records()]


def test_exclude_process_kind_keeps_pods_and_devices() -> None:
    out = make_filter(exclude={"kinds": ["process"]}).process(sample_batch())

    assert out.gpu_processes == ()
    assert out.host_processes == ()
    assert out.shares == ()
    assert [t.scope for t in out.totals] == ["container", "pod"]
    assert len(out.devices) == 2
    assert len(out.device_power) == 1
    assert len(out.workloads) == 1
    assert len(out.mig_instances) == 1
    assert out.count() == 13 - 6


def test_include_device_kind_keeps_only_device_records() -> None:
    out = make_filter(include={"kinds": ["device"]}).process(sample_batch())

    assert kinds_of(out) == [("DeviceSample", ""), ("DeviceSample", ""), ("DevicePower", "")]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("pod", [("Totals", "pod")]),
        ("container", [("Workload", ""), ("Totals", "container")]),
        ("instance", [("MigInstance", "")]),
    ],
)
def test_include_kind_selects_that_kind_and_totals_of_that_scope(kind: str, expected: list[tuple[str, str]]) -> None:
    out = make_filter(include={"kinds": [kind]}).process(sample_batch())
    assert kinds_of(out) == expected


def test_attribute_regex_must_match_the_whole_value() -> None:
    partial = make_filter(include={"kinds": ["device"], "attributes": {"device_id": "GPU-"}}).process(sample_batch())
    whole = make_filter(include={"kinds": ["device"], "attributes": {"device_id": "GPU-1"}}).process(sample_batch())

    assert partial.count() == 0
    assert [d.device_id for d in whole.devices] == ["GPU-1"]
    assert whole.device_power == ()  # GPU-0's power


def test_a_number_in_the_config_matches_as_its_text() -> None:
    out = make_filter(include={"kinds": ["process"], "attributes": {"pid": 200}}).process(sample_batch())

    assert [p.pid for p in out.gpu_processes] == [200]
    assert out.count() == 1


def test_every_attribute_regex_must_match() -> None:
    out = make_filter(include={"attributes": {"device_id": "GPU-0", "pid": "1.*"}}).process(sample_batch())

    assert [p.pid for p in out.gpu_processes] == [100]
    assert [s.pid for s in out.shares] == [100]
    assert out.devices == ()  # no pid attribute


def test_absent_attribute_never_matches_even_a_pattern_that_matches_empty() -> None:
    include = make_filter(include={"attributes": {"pod_name": ".*"}}).process(sample_batch())
    exclude = make_filter(exclude={"attributes": {"pod_name": ".*"}}).process(sample_batch())

    assert kinds_of(include) == [("Workload", "")]
    assert exclude.workloads == ()
    assert exclude.count() == 12


def test_include_and_exclude_together_keep_included_records_not_excluded() -> None:
    out = make_filter(include={"kinds": ["process"]}, exclude={"attributes": {"device_id": "GPU-1"}}).process(
        sample_batch()
    )

    assert [p.pid for p in out.gpu_processes] == [100, 200]
    assert [p.pid for p in out.host_processes] == [100]  # no device_id: not excluded
    assert [t.scope for t in out.totals] == ["process"]
    assert out.devices == ()
    assert out.workloads == ()


def test_untouched_fields_keep_their_identity_and_no_drop_returns_the_same_batch() -> None:
    batch = sample_batch()

    out = make_filter(exclude={"kinds": ["instance"]}).process(batch)
    nothing_dropped = make_filter(exclude={"kinds": ["pod"], "attributes": {"key": "nobody"}}).process(batch)

    assert out.mig_instances == ()
    assert out.devices is batch.devices
    assert out.gpu_processes is batch.gpu_processes
    assert out.totals is batch.totals
    assert nothing_dropped is batch


def test_filter_keeps_present_as_it_was() -> None:
    device = DeviceSample(time=T, device_id="GPU-0")
    hand_built = Batch(time=T, interval_s=5.0, node="n", devices=(device,))  # records, but not marked present
    filled = Batch(time=T, interval_s=5.0, node="n").with_records([device])

    drop_all = make_filter(exclude={"kinds": ["device"]})

    assert drop_all.process(hand_built).present == frozenset()
    emptied = drop_all.process(filled)
    assert emptied.devices == ()
    assert emptied.present == {"devices"}  # still "a receiver filled it", now with nothing left


def test_attribute_matching_sees_renames_from_earlier_label_actions() -> None:
    batch = sample_batch().replace(
        label_actions=(LabelAction(op="rename", key="device_id", new_key="gpu", kinds=frozenset({"device"})),)
    )

    by_new_name = make_filter(include={"kinds": ["device"], "attributes": {"gpu": "GPU-0"}}).process(batch)
    by_old_name = make_filter(include={"kinds": ["device"], "attributes": {"device_id": "GPU-0"}}).process(batch)

    assert [d.device_id for d in by_new_name.devices] == ["GPU-0"]
    assert len(by_new_name.device_power) == 1
    assert by_old_name.count() == 0


def test_attribute_matching_sees_inserted_attributes() -> None:
    batch = sample_batch().replace(
        label_actions=(LabelAction(op="insert", key="team", value="infra", kinds=frozenset({"container"})),)
    )
    out = make_filter(exclude={"attributes": {"team": "infra"}}).process(batch)

    assert out.workloads == ()
    assert [t.scope for t in out.totals] == ["process", "pod"]


def test_unknown_kind_is_a_validation_error_listing_the_kinds() -> None:
    with pytest.raises(ValidationError) as info:
        FilterConfig.model_validate({"exclude": {"kinds": ["process", "gpu"]}})

    text = str(info.value)
    assert "unknown kind(s) gpu" in text
    assert "kinds are container, device, instance, pod, process" in text


def test_bad_regex_is_a_validation_error_naming_the_attribute() -> None:
    with pytest.raises(ValidationError, match=r"attributes\.pod_name: 'train-\(' is not a valid regular expression"):
        FilterConfig.model_validate({"include": {"attributes": {"pod_name": "train-("}}})


def test_unknown_option_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="extra"):
        FilterConfig.model_validate({"exclude": {"kind": ["process"]}})


def test_factory_creates_a_filter_processor_that_needs_and_provides_nothing() -> None:
    clock = SteppedClock()
    telemetry = Telemetry(clock)
    ctx = make_context(
        "filter/no-pids", "processor", clock, pipeline="metrics", telemetry=telemetry, node_name="node-a"
    )

    processor = factory.create(ctx, FilterConfig.model_validate({"exclude": {"kinds": ["process"]}}))

    assert isinstance(processor, FilterProcessor)
    assert processor.needs == frozenset()
    assert processor.provides == frozenset()
    assert processor.process(sample_batch()).count() == 7
