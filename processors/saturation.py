"""Processor ``saturation``: could the GPU keep up? The USE view's saturation signals over a sliding window.

Energy says what a pod cost; saturation says whether the GPU was held back while it ran: clocks throttled by
the power or thermal limit, memory nearly full, XID errors, the memory interface or the SMs busy. This
processor reads what the receivers already make:
- ``DeviceSignals`` per GPU from the ``dcgm`` receiver (``source="dcgm"``), or from the ``nvml`` receiver's
  ``saturation: true`` (``source="nvml"``: NVML's violation counters, clock event reasons, memory info and
  XID events, for nodes without dcgm-exporter). Both present: dcgm's fields win, nvml fills the rest, and
  nvml's exact XID count is used over dcgm's last-code field;
- ``MigActivity.fields`` per MIG instance (framebuffer and profiling ratios of the instance itself);
and produces :class:`~pipeline.records.Saturation` records, one per signal that has a source: per GPU
(``gpu_instance_id`` absent), per MIG instance, and per pod container through the kubelet's allocations
(``processors/_saturation_attribution.py``). The signals and their denominators: ``_saturation_window``.
A field the source does not give makes no record, never a 0 (docs/saturation.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import field_validator

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.records import DeviceSignals, Saturation
from wattpipe.processors._saturation_attribution import attribute
from wattpipe.processors._saturation_signals import SIGNALS
from wattpipe.processors._saturation_window import SaturationWindow

__all__ = ["SIGNALS", "SaturationConfig", "SaturationProcessor", "factory"]

_NEEDS = frozenset({"device_signals"})
_PROVIDES = frozenset({"saturation"})


class SaturationConfig(ComponentConfig):
    window: Duration = 60.0
    """How far back every signal looks; the window slides with each tick."""
    memory_pressure_threshold: float = 0.9
    """``memory_pressure`` is the fraction of the window with framebuffer use at or above this (0 < t ≤ 1)."""
    per_pod: bool = True
    """Also give each pod container the saturation of the GPU or MIG instance the kubelet allocated it."""

    @field_validator("window")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("window must be longer than 0s")
        return value

    @field_validator("memory_pressure_threshold")
    @classmethod
    def _ratio(cls, value: float) -> float:
        if math.isnan(value) or not 0 < value <= 1:
            raise ValueError(
                f"memory_pressure_threshold must be a ratio in (0, 1] (0.9 = 90 % of the framebuffer), got {value}"
            )
        return value


def _merged(records: tuple[DeviceSignals, ...]) -> dict[str, dict[str, float]]:
    """Per GPU, its fields: nvml's first, dcgm's over them."""
    out: dict[str, dict[str, float]] = {}
    for source in ("nvml", "dcgm"):
        for record in records:
            if record.source == source:
                out.setdefault(record.device_id, {}).update(record.fields)
    return out


class SaturationProcessor:
    needs = _NEEDS
    provides = _PROVIDES

    def __init__(self, config: SaturationConfig, ctx: CreateContext | None = None) -> None:
        self.config = config
        self.window = SaturationWindow(config.window, config.memory_pressure_threshold)

    def _observe(self, batch: Batch) -> list[tuple[str, int | None]]:
        keys: list[tuple[str, int | None]] = []
        times = {r.device_id: r.time.monotonic_s for r in batch.device_signals}
        for uuid, fields in _merged(batch.device_signals).items():
            self.window.add((uuid, None), times[uuid], fields)
            keys.append((uuid, None))
        for activity in batch.mig_activity:
            if activity.fields:
                key = (activity.device_id, activity.gpu_instance_id)
                self.window.add(key, activity.time.monotonic_s, dict(activity.fields))
                keys.append(key)
        return keys

    def process(self, batch: Batch) -> Batch:
        keys = self._observe(batch)
        self.window.forget_stale(batch.time.monotonic_s)
        records: list[Saturation] = []
        for uuid, gi in keys:
            values: Mapping[str, float] = self.window.values((uuid, gi))
            span_s = self.window.span_s((uuid, gi))
            for signal in SIGNALS:
                if signal in values:
                    records.append(
                        Saturation(
                            time=batch.time,
                            device_id=uuid,
                            gpu_instance_id=gi,
                            signal=signal,
                            value=values[signal],
                            window_s=span_s,
                            saturation_scope="device" if gi is None else "instance",
                        )
                    )
        if self.config.per_pod and batch.allocations:
            records += attribute(records, batch.allocations, batch.mig_instances)
        return batch.replace(saturation=tuple(records))


factory = Factory.of(
    SaturationProcessor,
    type="saturation",
    kind="processor",
    config_model=SaturationConfig,
    description="GPU saturation over a sliding window: throttling, clock events, memory, XIDs, activity, per pod.",
    stability="development",
    provides=_PROVIDES,
)
