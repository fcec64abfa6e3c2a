"""Records and the Batch: typed, frozen, routed to their fields, labels edited only at render time."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

from wattpipe.pipeline._slots import positional
from wattpipe.pipeline.batch import Batch, LabelAction
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.constructors import new_process_sample, new_share, new_totals
from wattpipe.pipeline.records import (
    ClusterGpu,
    CpuZoneSample,
    DeviceAllocation,
    DevicePower,
    DeviceSample,
    DeviceSignals,
    DeviceTotals,
    GpuProcessSample,
    GpuShare,
    HostProcess,
    InstanceEnergy,
    MigActivity,
    MigInstance,
    NodeCpuTime,
    Record,
    Saturation,
    Totals,
    Workload,
    record_kind,
)
from wattpipe.pipeline.records_cpu import ContainerCpuTime, CpuInfo
from wattpipe.pipeline.records_topology import GpuLink, GpuSetScore

T = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)


def batch(**fields: object) -> Batch:
    return Batch(time=T, interval_s=5.0, node="node-a", **fields)  # type: ignore[arg-type]


def one_of_each() -> list[Record]:
    return [
        DeviceSample(time=T, device_id="GPU-0", power_w=250.0),
        GpuProcessSample(time=T, device_id="GPU-0", pid=42),
        MigInstance(time=T, device_id="GPU-0", gpu_instance_id=1),
        MigActivity(time=T, device_id="GPU-0", gpu_instance_id=1, sm_active=0.5),
        DeviceSignals(time=T, device_id="GPU-0", fields=(("power_w", 250.0),)),
        DeviceAllocation(
            time=T,
            device_id="GPU-0",
            resource_name="nvidia.com/gpu",
            pod_name="train",
            pod_namespace="ml",
            container_name="main",
        ),
        HostProcess(time=T, pid=42, comm="python"),
        DevicePower(
            time=T,
            device_id="GPU-0",
            interval_s=5.0,
            power_w=250.0,
            idle_w=50.0,
            active_w=200.0,
            energy_mj=1250000,
            idle_energy_mj=250000,
            active_energy_mj=1000000,
        ),
        GpuShare(time=T, device_id="GPU-0", pid=42, share=1.0, energy_mj=1000000, power_w=200.0),
        InstanceEnergy(time=T, device_id="GPU-0", gpu_instance_id=1, energy_mj=5, power_w=0.001),
        Workload(time=T, pid=42, pod_name="train"),
        Totals(time=T, scope="pod", key="uid-1", device_id="GPU-0", energy_mj=9500),
        DeviceTotals(
            time=T,
            device_id="GPU-0",
            energy_mj=1250000,
            idle_energy_mj=250000,
            active_energy_mj=1000000,
            attributed_energy_mj=1000000,
            unattributed_energy_mj=0,
        ),
        Saturation(time=T, device_id="GPU-0", signal="throttle_power", value=0.25, window_s=60.0),
        ClusterGpu(time=T, resource_name="nvidia.com/gpu", pending_pod_count=2),
        CpuZoneSample(time=T, zone="package", path="intel-rapl:0", socket=0, energy_uj=123_456),
        NodeCpuTime(time=T, total_s=400.0, active_s=100.0, cpu_count=4),
        GpuLink(time=T, gpu_a=0, gpu_b=1, link="NV2", pcie="NODE", nvlinks=2, score=220),
        GpuSetScore(time=T, size=2, free_gpus=2, score=220, gpus="0,1"),
        CpuInfo(time=T, processor="0", vendor_id="GenuineIntel", model_name="Xeon", physical_id="0", core_id="0"),
        ContainerCpuTime(time=T, container_id="c" * 64, container_runtime="containerd", pod_uid="uid-1", usage_s=7.5),
    ]


def test_with_records_routes_each_record_type_to_its_field_and_marks_it_present() -> None:
    records = one_of_each()
    out = batch().with_records(records)

    assert out.present == frozenset(Batch.FIELDS)
    assert out.count() == len(Batch.FIELDS) == 21
    for record in records:
        field = Batch.field_for(type(record))
        assert getattr(out, field) == (record,), field
    assert list(out.records()) == records  # records() walks the fields in FIELDS order


def test_with_records_appends_in_order_and_marks_only_fields_that_got_records() -> None:
    first = DeviceSample(time=T, device_id="GPU-0")
    second = DeviceSample(time=T, device_id="GPU-1")
    start = batch(devices=(first,))

    out = start.with_records([second, GpuProcessSample(time=T, device_id="GPU-1", pid=7)])

    assert [d.device_id for d in out.devices] == ["GPU-0", "GPU-1"]
    assert out.present == {"devices", "gpu_processes"}
    assert batch().with_records([]).present == frozenset()


def test_replace_returns_a_new_batch_and_leaves_the_original_unchanged() -> None:
    device = DeviceSample(time=T, device_id="GPU-0")
    original = batch(devices=(device,))

    changed = original.replace(devices=(), shares=())

    assert changed is not original
    assert original.devices == (device,)
    assert original.present == frozenset()
    assert changed.devices == ()
    assert changed.present == {"devices", "shares"}  # filled, even if empty
    with pytest.raises(dataclasses.FrozenInstanceError):
        original.devices = ()  # type: ignore[misc]


def test_replace_of_label_actions_does_not_mark_anything_present() -> None:
    out = batch().replace(label_actions=(LabelAction(op="drop", key="vendor"),))
    assert out.present == frozenset()
    assert len(out.label_actions) == 1


def test_labels_apply_actions_in_order() -> None:
    record = DeviceSample(time=T, device_id="GPU-0", device_name="H100", extra=(("zone", "a"),))
    b = batch(
        label_actions=(
            LabelAction(op="insert", key="cluster", value="prod"),
            LabelAction(op="rename", key="cluster", new_key="env"),
            LabelAction(op="insert", key="device_name", value="ignored"),  # insert never overwrites
            LabelAction(op="upsert", key="zone", value="b"),
            LabelAction(op="drop", key="device_type"),
        )
    )

    assert b.labels(record) == {"device_id": "GPU-0", "device_name": "H100", "env": "prod", "zone": "b"}
    # The record itself is untouched: edits exist only where labels are rendered.
    assert record.attributes() == {"device_type": "gpu", "device_id": "GPU-0", "device_name": "H100", "zone": "a"}


def test_labels_order_matters_rename_before_insert_leaves_both_keys() -> None:
    record = DeviceSample(time=T, device_id="GPU-0")
    b = batch(
        label_actions=(
            LabelAction(op="rename", key="cluster", new_key="env"),  # nothing to rename yet
            LabelAction(op="insert", key="cluster", value="prod"),
        )
    )
    assert b.labels(record)["cluster"] == "prod"
    assert "env" not in b.labels(record)


def test_label_action_with_kinds_skips_other_kinds_and_uses_totals_scope() -> None:
    drop_for_pods = LabelAction(op="drop", key="device_id", kinds=frozenset({"pod"}))
    b = batch(label_actions=(drop_for_pods,))
    pod_total = Totals(time=T, scope="pod", key="uid-1", device_id="GPU-0", energy_mj=1000)
    process_total = Totals(time=T, scope="process", key="42", device_id="GPU-0", energy_mj=1000)

    assert "device_id" not in b.labels(pod_total)
    assert b.labels(process_total)["device_id"] == "GPU-0"
    assert b.labels(DeviceSample(time=T, device_id="GPU-0"))["device_id"] == "GPU-0"


def test_values_omit_absent_measurements_and_identity_fields() -> None:
    sample = DeviceSample(time=T, device_id="GPU-0", device_index=0, power_w=250.5, energy_mj=None)

    assert sample.values() == {"up": True, "power_w": 250.5, "processes_known": True, "counter_epoch": 0}


def test_values_render_timestamps_and_pairs_as_json_ready_objects() -> None:
    start = Timestamp(monotonic_s=900.0, wall_s=1_767_225_500.0)
    total = Totals(time=T, scope="process", key="42", device_id="GPU-0", energy_mj=12500, start=start)
    signals = DeviceSignals(time=T, device_id="GPU-0", fields=(("power_w", 251.0), ("sm_active", 0.75)))

    assert total.values() == {"energy_mj": 12500, "start": {"monotonic_s": 900.0, "wall_s": 1_767_225_500.0}}
    assert signals.values() == {"fields": {"power_w": 251.0, "sm_active": 0.75}, "source": "dcgm"}


def test_to_json_has_type_kind_time_attributes_and_values() -> None:
    total = Totals(time=T, scope="pod", key="uid-1", device_id="GPU-0", energy_mj=9500, power_w=1.9)

    assert total.to_json() == {
        "type": "Totals",
        "kind": "pod",
        "time": {"monotonic_s": 1000.0, "wall_s": 1_767_225_600.0},
        "attributes": {"scope": "pod", "key": "uid-1", "device_id": "GPU-0", "state": "running"},
        "values": {"energy_mj": 9500, "power_w": 1.9},
    }


def test_record_kind_is_the_class_kind_except_totals_which_use_their_scope() -> None:
    assert record_kind(DeviceSample(time=T, device_id="GPU-0")) == "device"
    assert (
        record_kind(GpuShare(time=T, device_id="GPU-0", pid=None, share=0.1, energy_mj=1000, power_w=0.2)) == "process"
    )
    assert record_kind(Workload(time=T, pid=1)) == "container"
    assert record_kind(MigActivity(time=T, device_id="GPU-0", gpu_instance_id=3)) == "instance"
    assert record_kind(Totals(time=T, scope="container", key="c1", device_id="GPU-0", energy_mj=0)) == "container"


def test_with_extra_stores_sorted_pairs_and_attributes_include_them() -> None:
    sample = DeviceSample(time=T, device_id="GPU-0").with_extra({"zone": "b", "rack": "7"})

    assert sample.extra == (("rack", "7"), ("zone", "b"))
    assert sample.attributes()["rack"] == "7"
    assert hash(sample) == hash(DeviceSample(time=T, device_id="GPU-0", extra=(("rack", "7"), ("zone", "b"))))


def test_field_for_routes_a_subclass_to_its_parent_field() -> None:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class NvidiaSample(DeviceSample):
        pass

    assert Batch.field_for(NvidiaSample) == "devices"


def test_field_for_raises_type_error_for_an_unknown_record_type() -> None:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Stray(Record):
        pass

    with pytest.raises(TypeError, match="Stray is not a record kind a Batch carries"):
        Batch.field_for(Stray)
    with pytest.raises(TypeError, match="Stray"):
        batch().with_records([Stray(time=T)])


RECORD_TYPES = (
    DeviceSample,
    GpuProcessSample,
    MigInstance,
    MigActivity,
    DeviceSignals,
    DeviceAllocation,
    HostProcess,
    DevicePower,
    GpuShare,
    InstanceEnergy,
    Workload,
    Totals,
    DeviceTotals,
    GpuLink,
    GpuSetScore,
)


@pytest.mark.parametrize("record_class", RECORD_TYPES, ids=lambda t: t.__name__)
def test_each_record_constructor_sets_every_field_and_default_and_stays_frozen(record_class: type[Record]) -> None:
    # Record classes get a generated __init__ (slots set through their descriptors, for speed): it must
    # behave as the dataclass one, field for field. (Any: the values are stand-ins of the wrong types.)
    record_type: Any = record_class
    fields = dataclasses.fields(record_type)
    given = {f.name: f"value-{i}" for i, f in enumerate(fields)}
    record = record_type(**given)
    assert {f.name: getattr(record, f.name) for f in fields} == given
    required = {f.name: given[f.name] for f in fields if f.default is dataclasses.MISSING}
    minimal = record_type(**required)
    for f in fields:
        assert getattr(minimal, f.name) == (given[f.name] if f.name in required else f.default), f.name
    assert record == record_type(**given)
    assert hash(record) == hash(record_type(**given))
    assert dataclasses.replace(record, time="later").time == "later"
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.time = "changed"
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        record_type(**given, bogus=1)
    if required:
        with pytest.raises(TypeError, match="missing"):
            record_type()
    with pytest.raises(TypeError):
        record_type(*given.values())  # keyword-only, as declared
    signature = inspect.signature(record_class)
    assert [(p.name, p.kind, p.annotation) for p in signature.parameters.values()] == [
        (f.name, inspect.Parameter.KEYWORD_ONLY, f.type) for f in fields
    ]
    assert record_class.__init__.__module__ == record_class.__module__


POSITIONAL = ((new_process_sample, GpuProcessSample), (new_share, GpuShare), (new_totals, Totals))


@pytest.mark.parametrize(("make", "record_class"), POSITIONAL, ids=lambda x: getattr(x, "__name__", ""))
def test_positional_constructor_makes_the_record_the_keyword_one_makes(make: Any, record_class: type[Record]) -> None:
    # The hot paths' constructors take every field by position, in the class's own field order.
    names = list(inspect.signature(make).parameters)
    assert names == [f.name for f in dataclasses.fields(record_class)]
    given = {name: f"value-{i}" for i, name in enumerate(names)}
    record: Any = make(*given.values())  # (Any: the values are stand-ins of the wrong types)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.time = "changed"
    assert type(record) is record_class
    assert {name: getattr(record, name) for name in names} == given
    assert record == record_class(**given)
    assert hash(record) == hash(record_class(**given))
    with pytest.raises(TypeError):
        make(*list(given.values())[:-1])  # every field is required
    assert make.__module__ == "wattpipe.pipeline.constructors"
    assert record_class.__name__ in make.__doc__
    # The stub's annotations are kept (inspect and documentation tools show the typed signature).
    assert inspect.signature(make).return_annotation == record_class.__name__


def test_positional_refuses_a_stub_that_is_not_the_fields() -> None:
    def missing(time: Timestamp, device_id: str) -> GpuShare:
        raise NotImplementedError

    with pytest.raises(TypeError, match=r"missing: parameters \['time', 'device_id'\] are not the fields of GpuShare"):
        positional(GpuShare)(missing)

    def extra(time: Timestamp, extra: tuple[()], scope: str, key: str, device_id: str, energy_mj: int,
              power_w: float, state: str, start: None, bogus: int) -> Totals:  # fmt: skip
        raise NotImplementedError

    with pytest.raises(TypeError, match="bogus"):
        positional(Totals)(extra)


def test_positional_refuses_a_stub_in_another_order_than_the_class() -> None:
    # The very fields, but ``extra`` after ``start`` rather than after ``time`` as Record declares it: a
    # positional call would then read unlike the class, so the stub is refused when it is decorated.
    def reordered(time: Timestamp, scope: str, key: str, device_id: str, energy_mj: int, power_w: float,
                  state: str, start: None, extra: tuple[()]) -> Totals:  # fmt: skip
        raise NotImplementedError

    with pytest.raises(TypeError, match=r"reordered: parameters .* are not the fields of Totals in its order"):
        positional(Totals)(reordered)


def test_every_record_type_has_its_batch_field_and_the_quick_init() -> None:
    from wattpipe.pipeline.records import RECORD_TYPES as CORE
    from wattpipe.pipeline.records_cpu import CPU_RECORD_TYPES
    from wattpipe.pipeline.records_topology import TOPOLOGY_RECORD_TYPES

    RECORD_TYPES = CORE + TOPOLOGY_RECORD_TYPES + CPU_RECORD_TYPES
    assert {Batch.field_for(t) for t in RECORD_TYPES} == set(Batch.FIELDS)
    assert len(Batch.FIELDS) == len(RECORD_TYPES)
    for record_type in RECORD_TYPES:  # the slot-setting __init__ (pipeline/_slots.py), not the dataclass's
        assert "_set0" in record_type.__init__.__code__.co_names, record_type.__name__


def test_cpu_records_name_their_zone_and_keep_absent_values_out() -> None:
    zone = CpuZoneSample(time=T, zone="dram", path="intel-rapl:1:0", socket=1, energy_uj=5_000_000, counter_epoch=2)
    assert zone.attributes() == {"zone": "dram", "path": "intel-rapl:1:0"}
    assert zone.values() == {"socket": 1, "energy_uj": 5_000_000, "counter_epoch": 2}
    assert record_kind(zone) == "device"
    psys = CpuZoneSample(time=T, zone="psys", path="intel-rapl:1", energy_uj=7)
    assert "socket" not in psys.values()  # absent, not zero
    node = NodeCpuTime(time=T, total_s=800.0, active_s=200.0)
    assert node.attributes() == {}
    assert node.values() == {"total_s": 800.0, "active_s": 200.0}
    vm = HostProcess(time=T, pid=7, comm="qemu-kvm", vm_id="0b5c0f8e-1", vm_name="web", hypervisor="kvm")
    assert (vm.values()["vm_name"], vm.vm_id) == ("web", "0b5c0f8e-1")
    assert HostProcess(time=T, pid=8).vm_id is None
    assert batch().with_records([zone, node]).present == frozenset({"cpu_zones", "node_cpu"})


def test_new_host_process_makes_the_record_the_class_makes() -> None:
    from wattpipe.pipeline.constructors import new_host_process

    fields = {
        "pid": 7,
        "comm": "qemu-kvm",
        "exe": "/usr/libexec/qemu-kvm",
        "start_time_ticks": 900,
        "container_id": None,
        "container_runtime": None,
        "pod_uid": None,
        "cpu_time_s": 12.5,
        "start_wall_s": 1_767_225_000.0,
        "vm_id": "u-1",
        "vm_name": "web",
        "hypervisor": "kvm",
    }
    made = new_host_process(T, (), *fields.values())  # type: ignore[arg-type]
    assert made == HostProcess(time=T, **fields)  # type: ignore[arg-type]
    assert hash(made) == hash(HostProcess(time=T, **fields))  # type: ignore[arg-type]
