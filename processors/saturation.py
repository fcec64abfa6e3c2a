"""Processor ``saturation``: could the GPU keep up? The USE view's saturation signals over a sliding window.

Energy says what a pod cost; saturation says whether the GPU was held back while it ran: clocks throttled by
the power or thermal limit, memory nearly full, XID errors, the memory interface or the SMs busy. This
processor reads what the receivers already make:
- ``DeviceSignals`` per GPU from the ``dcgm`` receiver (``source="dcgm"``), or from the ``nvml`` receiver's
  ``saturation: true`` (``source="nvml"``: NVML's violation counters, clock event reasons, memory info and
  XID events, for nodes without dcgm-exporter). Both present: dcgm's fields win, nvml fills the rest, and
  nvml's exact XID count and its per-tick readings of framebuffer use and the clock-event bitmask are used
  over dcgm's last-code field and once-per-collection readings;
- ``MigActivity.fields`` per MIG instance (framebuffer and profiling ratios of the instance itself);
and produces :class:`~pipeline.records.Saturation` records, one per signal that has a source: per GPU
(``gpu_instance_id`` absent), per MIG instance, and per pod container through the kubelet's allocations
(``processors/_saturation_attribution.py``). The signals and their denominators: ``_saturation_window``.
A field the source does not give makes no record, never a 0 (docs/saturation.md).

Windows are in data time, one per device or instance and source: NVML's values describe the tick, dcgm's
the collection they come from (dated by the receiver to within a scrape, placed by the energy counter in
``_saturation_dating``; a repeated answer adds nothing). Each record says where its window ends
(``window_end_s``) and how long it is (``window_s``).
"""

from __future__ import annotations

import math

from pydantic import field_validator

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.records import DeviceSignals, MigActivity, Saturation
from wattpipe.processors._saturation_attribution import attribute
from wattpipe.processors._saturation_dating import CollectionDating
from wattpipe.processors._saturation_signals import CLOCK_EVENT_BITS, MEMORY, SIGNALS
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


_NVML_FIRST = frozenset({"xid_count", *MEMORY, *CLOCK_EVENT_BITS})
"""Signals where nvml's value wins when both sources give one: its exact XID count (dcgm's field is the last
code), and the readings of an instant (framebuffer use, the clock-event bitmask), which nvml takes every tick and
dcgm once per collection, so nvml's cover the window at least as finely."""
_Key = tuple[str, int | None, str]  # (GPU UUID, MIG instance or None, source): one window each


def _undated(record: DeviceSignals | MigActivity) -> float | None:
    """The tick, for values not dated by a collection (nvml's, or dcgm's from a caller that does not track
    collections); None for a dcgm answer that is dated or a repeat: see ``_dated``."""
    period = record.collect_s if isinstance(record, DeviceSignals) else record.window_s
    return record.time.monotonic_s if period is None and record.collected_by_s is None else None


def _merged(records: tuple[DeviceSignals, ...]) -> dict[_Key, tuple[DeviceSignals, dict[str, float]]]:
    """Per GPU and source, one record's dating and all the fields its records of this batch give."""
    out: dict[_Key, tuple[DeviceSignals, dict[str, float]]] = {}
    for record in records:
        key = (record.device_id, None, record.source)
        first, fields = out.setdefault(key, (record, {}))
        fields.update(record.fields)
        if record.source == "dcgm" and first.collect_s is None:
            out[key] = (record, fields)
    return out


class SaturationProcessor:
    needs = _NEEDS
    provides = _PROVIDES

    def __init__(self, config: SaturationConfig, ctx: CreateContext | None = None) -> None:
        self.config = config
        self.window = SaturationWindow(config.window, config.memory_pressure_threshold)
        self.dating = CollectionDating()

    def _dated(self, batch: Batch, merged: dict[_Key, tuple[DeviceSignals, dict[str, float]]]) -> dict[str, float]:
        """Per GPU with a new dcgm collection in this batch, when it happened (``_saturation_dating``)."""
        for sample in batch.devices:
            if sample.energy_mj is not None and sample.device_id.startswith("GPU-"):
                self.dating.reading(sample.device_id, batch.time.monotonic_s, sample.energy_mj)
        self.dating.forget({d.device_id for d in batch.devices})
        out: dict[str, float] = {}
        for (uuid, _, source), (record, fields) in merged.items():
            after, by = record.collected_after_s, record.collected_by_s
            if source == "dcgm" and by is not None:
                # It happened no longer than one collection interval before the scrape that first saw it.
                after = max(after if after is not None else -math.inf, by - (record.collect_s or math.inf))
                out[uuid] = self.dating.place(uuid, after, by, fields.get("energy_j"))
        return out

    def _observe(self, batch: Batch) -> list[tuple[str, int | None]]:
        """Adds the batch's new values to their windows; the devices and instances it has values for."""
        places: dict[tuple[str, int | None], None] = {}
        now_s = batch.time.monotonic_s
        merged = _merged(batch.device_signals)
        dated = self._dated(batch, merged)
        for key, (record, fields) in merged.items():
            t_s = _undated(record) if record.collected_by_s is None else dated.get(key[0])
            if t_s is not None:
                self.window.add(key, t_s, fields, first_is_baseline=record.collect_s is not None)
            self.window.seen(key, now_s)
            places[key[:2]] = None
        for activity in batch.mig_activity:
            if activity.fields:
                key = (activity.device_id, activity.gpu_instance_id, "dcgm")
                by = activity.collected_by_s
                t_s = _undated(activity) if by is None else dated.get(activity.device_id, by)
                if t_s is not None:
                    self.window.add(key, t_s, dict(activity.fields), first_is_baseline=activity.window_s is not None)
                self.window.seen(key, now_s)
                places[key[:2]] = None
        return list(places)

    def _values(self, uuid: str, gi: int | None) -> dict[str, tuple[float, _Key]]:
        """Each signal's value and the window it comes from: dcgm's over nvml's, except where nvml's is finer
        (:data:`_NVML_FIRST`)."""
        out: dict[str, tuple[float, _Key]] = {}
        for source in ("nvml", "dcgm"):
            key = (uuid, gi, source)
            for signal, value in self.window.values(key).items():
                if source == "nvml" or signal not in _NVML_FIRST or signal not in out:
                    out[signal] = (value, key)
        return out

    def process(self, batch: Batch) -> Batch:
        places = self._observe(batch)
        self.window.forget_stale(batch.time.monotonic_s)
        records: list[Saturation] = []
        for uuid, gi in places:
            values = self._values(uuid, gi)
            for signal in SIGNALS:
                if signal in values:
                    value, key = values[signal]
                    records.append(
                        Saturation(
                            time=batch.time,
                            device_id=uuid,
                            gpu_instance_id=gi,
                            signal=signal,
                            value=value,
                            window_s=self.window.span_s(key),
                            window_end_s=self.window.end_s(key),
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
