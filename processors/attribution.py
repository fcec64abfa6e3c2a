"""Processor ``attribution``: split each device's active energy of a tick among the processes that used it.

How, per device and tick (re-decided every tick, so a change of sharing mode is honoured at once):

- **exclusive** (compute mode EXCLUSIVE_PROCESS, or a single process): that process gets it all;
- **time_slicing** (and MPS, as an approximation: MPS clients run concurrently, and SM utilisation
  per client is what the driver reports): shares by each process's SM utilisation integrated over the
  tick (the nvml receiver's ``sm_util``); when every share is zero but processes run, or utilisation is
  unavailable, an equal split;
- **mig**: until the dcgm-exporter receiver brings per-instance activity, an equal split over the GPU's
  processes, with a warning once per device;
- **none**: no process: the active energy is *unattributed*, carried by an explicit record
  (``pid=None``) so it is never silently lost. Every device has that record every tick (0 mJ when its
  processes carried everything), so the remainder is an observed value, never an absent one.

Conservation is exact, in integer millijoules: shares are apportioned by the largest-remainder
method, so Σ process mJ + unattributed mJ == active mJ, and with the idle part == the counter's delta.
A process is attributed from its first tick.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.components import ComponentConfig, CreateContext, Factory
from pipeline.records import Batch, DevicePower, DeviceSample, GpuProcessSample, GpuShare, SharingMode

__all__ = ["AttributionConfig", "AttributionProcessor", "apportion", "factory"]


class AttributionConfig(ComponentConfig):
    pass


def apportion(total_mj: int, weights: Sequence[float]) -> list[int]:
    """Split ``total_mj`` into integers proportional to ``weights`` that sum to it exactly.

    Largest remainder: each gets the floor of its exact part, and the millijoules left over go one each
    to the largest fractional parts (ties to the earlier weight, so the result is deterministic).
    All-zero (or empty-sum) weights split equally.
    """
    n = len(weights)
    if n == 0:
        return []
    if total_mj < 0:
        raise ValueError(f"cannot apportion negative energy ({total_mj} mJ)")
    clean = [w if math.isfinite(w) and w > 0 else 0.0 for w in weights]
    weight_sum = math.fsum(clean)
    if weight_sum <= 0:
        clean, weight_sum = [1.0] * n, float(n)
    exact = [total_mj * w / weight_sum for w in clean]
    parts = [math.floor(x) for x in exact]
    left = total_mj - sum(parts)
    # Rounding can leave a part one above its exact share when left < 0; never hand out more than total.
    order = sorted(range(n), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: max(0, left)]:
        parts[i] += 1
    if left < 0:
        for i in sorted(range(n), key=lambda i: (exact[i] - parts[i], i))[:-left]:
            parts[i] -= 1
    return parts


class AttributionProcessor:
    needs = frozenset({"device_power", "gpu_processes"})
    provides = frozenset({"shares"})

    def __init__(self, ctx: CreateContext) -> None:
        self.log = ctx.logger
        self._warned_mig: set[str] = set()

    def process(self, batch: Batch) -> Batch:
        devices = {d.device_id: d for d in batch.devices}
        by_device: dict[str, list[GpuProcessSample]] = {}
        for p in batch.gpu_processes:
            by_device.setdefault(p.device_id, []).append(p)
        shares: list[GpuShare] = []
        for power in batch.device_power:
            shares.extend(self._device(power, devices.get(power.device_id), by_device.get(power.device_id, [])))
        return batch.replace(shares=batch.shares + tuple(shares))

    def _mode(self, device: DeviceSample | None, procs: list[GpuProcessSample]) -> SharingMode:
        if not procs:
            return "none"
        if device is not None and device.mig_enabled:
            return "mig"
        if len(procs) == 1 or (device is not None and device.compute_mode == "exclusive_process"):
            return "exclusive"
        return "time_slicing"

    def _device(self, power: DevicePower, device: DeviceSample | None, procs: list[GpuProcessSample]) -> list[GpuShare]:
        # One record per pid: a driver listing a pid twice (two contexts) must not double its weight.
        unique: dict[int, GpuProcessSample] = {}
        for p in procs:
            unique.setdefault(p.pid, p)
        procs = sorted(unique.values(), key=lambda p: p.pid)
        mode = self._mode(device, procs)
        interval_s = power.interval_s
        if mode == "none":
            return [
                GpuShare(
                    time=power.time,
                    device_id=power.device_id,
                    pid=None,
                    share=1.0,
                    energy_mj=power.active_energy_mj,
                    power_w=power.active_energy_mj / 1000.0 / interval_s,
                    mode=mode,
                )
            ]
        if mode == "mig":
            if power.device_id not in self._warned_mig:
                self._warned_mig.add(power.device_id)
                self.log.warning(
                    "device %s is in MIG mode: splitting its energy equally among its processes until a dcgm "
                    "receiver supplies per-instance activity",
                    power.device_id,
                )
            weights = [1.0] * len(procs)
        elif mode == "exclusive" and len(procs) > 1:
            # EXCLUSIVE_PROCESS yet several listed (a process just exiting as another starts): by utilisation.
            weights = [p.sm_util or 0.0 for p in procs]
        elif all(p.sm_util is not None for p in procs):
            weights = [p.sm_util or 0.0 for p in procs]
        else:
            weights = [1.0] * len(procs)  # utilisation unavailable for some: no basis to weigh them
        fractions = _fractions(weights)
        parts = apportion(power.active_energy_mj, fractions)
        # The remainder is explicit every tick: here the processes carried it all, so it is an observed 0.
        remainder = GpuShare(
            time=power.time, device_id=power.device_id, pid=None, share=0.0, energy_mj=0, power_w=0.0, mode=mode
        )
        return [remainder] + [
            GpuShare(
                time=power.time,
                device_id=power.device_id,
                pid=p.pid,
                share=fraction,
                energy_mj=mj,
                power_w=mj / 1000.0 / interval_s,
                mode=mode,
                gpu_instance_id=p.gpu_instance_id,
            )
            for p, fraction, mj in zip(procs, fractions, parts, strict=True)
        ]


def _fractions(weights: Sequence[float]) -> list[float]:
    """Weights normalised to sum to 1; all-zero or unusable weights split equally."""
    clean = [w if math.isfinite(w) and w > 0 else 0.0 for w in weights]
    total = math.fsum(clean)
    if total <= 0:
        return [1.0 / len(clean)] * len(clean)
    return [w / total for w in clean]


def _create(ctx: CreateContext, config: ComponentConfig) -> AttributionProcessor:
    assert isinstance(config, AttributionConfig)
    return AttributionProcessor(ctx)


factory = Factory(
    type="attribution",
    kind="processor",
    config_model=AttributionConfig,
    create=_create,
    description="Splits each device's active energy among its processes by sharing mode; exact, with the remainder explicit.",
    stability="alpha",
    provides=frozenset({"shares"}),
)
