"""The Batch: one tick's records, one field per record type, plus the tick's context and label edits."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import (
    RECORD_TYPES,
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
from wattpipe.pipeline.records_cpu import CPU_RECORD_TYPES, ContainerCpuTime, CpuInfo
from wattpipe.pipeline.records_topology import TOPOLOGY_RECORD_TYPES, GpuLink, GpuSetScore

__all__ = ["Batch", "LabelAction"]


@dataclass(frozen=True, slots=True)
class LabelAction:
    """One edit of the attributes exporters render: insert a static value, rename or drop a key.

    ``kinds`` limits the edit to records of those kinds (empty: every record). ``insert`` never
    overwrites an attribute the record already has; ``upsert`` does.
    """

    op: Literal["insert", "upsert", "rename", "drop"]
    key: str
    value: str | None = None
    new_key: str | None = None
    kinds: frozenset[str] = frozenset()

    def apply(self, kind: str, labels: dict[str, str]) -> None:
        if self.kinds and kind not in self.kinds:
            return
        if self.op == "insert":
            labels.setdefault(self.key, self.value or "")
        elif self.op == "upsert":
            labels[self.key] = self.value or ""
        elif self.op == "rename":
            if self.key in labels and self.new_key:
                labels[self.new_key] = labels.pop(self.key)
        else:
            labels.pop(self.key, None)


_FIELD_BY_TYPE: dict[type[Record], str] = {
    DeviceSample: "devices",
    GpuProcessSample: "gpu_processes",
    MigInstance: "mig_instances",
    MigActivity: "mig_activity",
    DeviceSignals: "device_signals",
    DeviceAllocation: "allocations",
    HostProcess: "host_processes",
    DevicePower: "device_power",
    GpuShare: "shares",
    InstanceEnergy: "instance_energy",
    Workload: "workloads",
    Totals: "totals",
    DeviceTotals: "device_totals",
    Saturation: "saturation",
    ClusterGpu: "cluster_gpu",
    CpuZoneSample: "cpu_zones",
    NodeCpuTime: "node_cpu",
    GpuLink: "gpu_links",
    GpuSetScore: "gpu_set_scores",
    CpuInfo: "cpu_info",
    ContainerCpuTime: "container_cpu",
}
if tuple(_FIELD_BY_TYPE) != RECORD_TYPES + TOPOLOGY_RECORD_TYPES + CPU_RECORD_TYPES:
    raise TypeError("records.RECORD_TYPES and the Batch fields differ: a new record type needs both")


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """One tick's records, one field per record kind, plus the tick's context.

    A Batch is immutable: a processor returns a new one (``batch.replace(shares=…)``), so every
    exporter sees the same finished batch and no processor can disturb another's view.
    ``label_actions`` are attribute edits (insert, rename, drop) that exporters apply when rendering
    labels, so typed records stay typed.
    """

    FIELDS: ClassVar[tuple[str, ...]] = tuple(_FIELD_BY_TYPE.values())

    time: Timestamp
    interval_s: float
    node: str
    pipeline: str = "metrics"
    devices: tuple[DeviceSample, ...] = ()
    gpu_processes: tuple[GpuProcessSample, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    mig_activity: tuple[MigActivity, ...] = ()
    device_signals: tuple[DeviceSignals, ...] = ()
    allocations: tuple[DeviceAllocation, ...] = ()
    host_processes: tuple[HostProcess, ...] = ()
    device_power: tuple[DevicePower, ...] = ()
    shares: tuple[GpuShare, ...] = ()
    instance_energy: tuple[InstanceEnergy, ...] = ()
    workloads: tuple[Workload, ...] = ()
    totals: tuple[Totals, ...] = ()
    device_totals: tuple[DeviceTotals, ...] = ()
    gpu_links: tuple[GpuLink, ...] = ()
    gpu_set_scores: tuple[GpuSetScore, ...] = ()
    saturation: tuple[Saturation, ...] = ()
    cluster_gpu: tuple[ClusterGpu, ...] = ()
    cpu_zones: tuple[CpuZoneSample, ...] = ()
    node_cpu: tuple[NodeCpuTime, ...] = ()
    cpu_info: tuple[CpuInfo, ...] = ()
    container_cpu: tuple[ContainerCpuTime, ...] = ()
    # Which fields some receiver or processor actually filled this tick (present, even if empty):
    # lets exporters tell "no processes" from "no process source".
    present: frozenset[str] = field(default_factory=frozenset)
    label_actions: tuple[LabelAction, ...] = ()

    @staticmethod
    def field_for(record_type: type[Record]) -> str:
        for klass in record_type.__mro__:
            name = _FIELD_BY_TYPE.get(klass)
            if name is not None:
                return name
        raise TypeError(f"{record_type.__name__} is not a record kind a Batch carries")

    def replace(self, **changes: Any) -> Batch:
        """A new batch with ``changes``; every record field named is marked present."""
        present = set(changes.pop("present", self.present))
        present.update(name for name in changes if name in self.FIELDS)
        return dataclasses.replace(self, present=frozenset(present), **changes)

    def with_records(self, records: Iterable[Record]) -> Batch:
        """A batch with ``records`` appended to the fields their types belong to."""
        grouped: dict[str, list[Record]] = {}
        known = _FIELD_BY_TYPE.get  # the exact type, most often; a subclass goes through field_for
        for record_type, run in itertools.groupby(records, type):  # receivers give their records in runs
            grouped.setdefault(known(record_type) or self.field_for(record_type), []).extend(run)
        changes: dict[str, Any] = {name: tuple(getattr(self, name)) + tuple(items) for name, items in grouped.items()}
        return self.replace(**changes)

    def labels(self, record: Record) -> dict[str, str]:
        """The attributes an exporter renders for ``record``: its own, after this batch's label actions."""
        labels = record.attributes()
        kind = record_kind(record)
        for action in self.label_actions:
            action.apply(kind, labels)
        return labels

    def records(self) -> Iterator[Record]:
        for name in self.FIELDS:
            yield from getattr(self, name)

    def count(self) -> int:
        return sum(len(getattr(self, name)) for name in self.FIELDS)
