"""Reading one GPU through NVML: the blocking part, run on that device's own worker thread."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pynvml

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.constructors import new_process_sample
from wattpipe.pipeline.records import DeviceSample, DeviceSignals, GpuProcessSample, MigInstance
from wattpipe.receivers.nvml._errors import DeviceLost, NotFound, NotSupported, NvmlFailure, nvml_call, nvml_optional
from wattpipe.receivers.nvml._mig import MigLayout
from wattpipe.receivers.nvml._raw import ProcessEntry, ProcessList, UtilisationSamples
from wattpipe.receivers.nvml._saturation import read_saturation

__all__ = ["COMPUTE_MODES", "DeviceReader", "Reading", "integrate_utilisation"]


COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}

# NVML reports "not in a MIG instance" as 0xFFFFFFFF in the process struct.
_NO_INSTANCE = 0xFFFFFFFF


# How old a process's newest sample may be at the end of the window for the process to count as busy
# to the end: the driver samples every 1/6 s on current GPUs (and a sample may be published a little
# late), so a process busy throughout has its newest sample within this of "now". A sample older than
# that marks when the process stopped: it counts up to the sample, not a moment more (a fixed grace
# after every last sample once overweighted a one-second burst in a two-second tick by half).
_BUSY_TO_THE_END_US = 250_000


def integrate_utilisation(
    samples: list[tuple[int, int, float]], window_start_us: int, now_us: int, busy: dict[int, float] | None = None
) -> dict[int, float]:
    """Each pid's SM utilisation over the window ``(window_start_us, now_us]``, as a 0–1 mean.

    ``samples`` are the driver's entries ``(pid, timestamp_us, sm_util_percent)`` newer than the
    window's start. Drivers answer in one of two shapes:

    - a buffer of per-period samples (several entries per pid): each distinct timestamp is a sample
      slot, and a process with no sample in a slot was idle in it (drivers only sample busy processes),
      so it counts 0 there: the mean over all slots;
    - one entry per process (current drivers; nvtop#110, go-nvml#51): the mean over that process's
      busy samples since the window start, stamped with its newest sample. The process was idle after
      that sample (unless the sample is within a sample period or so of the window's end), so its value
      is scaled by the part of the window up to it: a process that stopped (or exited) halfway through
      weighs half. A process that only *started* mid-window cannot be told apart from one busy from the
      window's start: a known limit of this API, smaller with shorter ticks.

    Entries with pid 0 (seen from drivers with zombie processes) are dropped; values clamp to 0–100 %.
    In the second shape, ``busy`` (when given) gets each pid's mean over its busy samples, unscaled: with
    the process's start time, attribution can take off the part of the window before it started.
    """
    kept = [entry for entry in samples if entry[0] > 0]
    if len({pid for pid, _, _ in kept}) < len(kept):  # some pid has several entries: the buffer shape
        by_pid: dict[int, list[tuple[int, float]]] = {}
        for pid, ts, sm in kept:
            by_pid.setdefault(pid, []).append((ts, _clamp(sm)))
        slots = len({ts for entries in by_pid.values() for ts, _ in entries})
        out_slots: dict[int, float] = {}
        for pid, entries in by_pid.items():
            per_slot: dict[int, list[float]] = {}
            for ts, sm in entries:
                per_slot.setdefault(ts, []).append(sm)  # a pid twice in one slot: take their mean
            out_slots[pid] = sum(sum(v) / len(v) for v in per_slot.values()) / 100.0 / slots
        return out_slots
    window_us = now_us - window_start_us
    if window_us <= 0:
        return {pid: _clamp(sm) / 100.0 for pid, _, sm in kept}
    busy_to_the_end_us = now_us - _BUSY_TO_THE_END_US  # (integers: exact)
    out: dict[int, float] = {}
    for pid, ts, sm in kept:
        coverage = 1.0 if ts >= busy_to_the_end_us else (ts - window_start_us) / window_us
        coverage = 1.0 if coverage > 1.0 else (coverage if coverage > 0.0 else 0.0)
        mean = (sm if 0.0 <= sm <= 100.0 else _clamp(sm)) / 100.0
        out[pid] = mean * coverage
        if busy is not None:
            busy[pid] = mean
    return out


def _clamp(sm: float) -> float:
    return sm if 0.0 <= sm <= 100.0 else max(0.0, min(100.0, sm))


@dataclass
class Reading:
    device: DeviceSample
    processes: list[GpuProcessSample]
    problems: list[str] = field(default_factory=list)  # absent values, and why
    instances: list[MigInstance] = field(default_factory=list)
    signals: list[DeviceSignals] = field(default_factory=list)  # saturation fields (``saturation: true``)


@dataclass
class DeviceReader:
    """One GPU's handle and the state its reads carry from tick to tick."""

    index: int
    uuid: str
    name: str
    handle: Any
    read_utilisation: bool = True
    read_saturation: bool = False
    last_seen_us: int = 0  # newest utilisation sample already consumed (driver's µs CPU clock)
    mig_layout: MigLayout = field(default_factory=lambda: MigLayout(refresh_s=60.0))
    prev_read: tuple[float, float] | None = None  # the last read's (wall s, monotonic s): the next window's start
    epoch: int = 0  # the energy counter's continuity: one more each time the handle is re-acquired
    list_processes: ProcessList = field(default_factory=ProcessList)
    utilisation_samples: UtilisationSamples = field(default_factory=UtilisationSamples)
    busy_means: dict[int, float] = field(default_factory=dict)  # the last read's, by pid (see integrate_…)
    mem_utils: dict[int, float] = field(default_factory=dict)  # the last read's memory utilisation, by pid
    stale_pids: set[int] = field(default_factory=set)  # the last read's entries from before a clock step back
    _window_before: tuple[tuple[float, float] | None, int] | None = None  # the utilisation window before the last read

    def rewind(self) -> None:
        """The last read's reading was dropped (it came after device_timeout): its utilisation window is
        given back, so the next read covers it too, as the next delivered reading's energy does."""
        if self._window_before is not None:
            self.prev_read, self.last_seen_us = self._window_before
            self._window_before = None

    def read(self, now: Timestamp) -> Reading:
        self._window_before = (self.prev_read, self.last_seen_us)
        problems: list[str] = []
        device = self._device_sample(now, problems)
        signals = read_saturation(self.handle, self.uuid, now, problems) if self.read_saturation else None
        saturation = [signals] if signals is not None else []
        procs = nvml_optional(problems, self.list_processes, self.handle)
        if procs is None:
            # Unknown, not empty: "nobody on it" would let idle learn busy power and bill no one.
            # This tick's reading still goes out (its energy unattributed), so the next tick's utilisation
            # window starts here too: reaching back, it billed this tick's processes (one that exited in it)
            # a share of the next tick's energy.
            self.prev_read = (now.wall_s, now.monotonic_s)
            return Reading(dataclasses.replace(device, processes_known=False), [], problems, signals=saturation)
        mig_enabled = device.mig_enabled is True  # (always a bool here: this reader read the mode)
        processes = self._process_samples(now, procs, mig_enabled, problems)
        instances: list[MigInstance] = []
        if mig_enabled:
            instances = self._mig_instances(now, processes, problems)
        else:
            self.mig_layout.forget()
        return Reading(device, processes, problems, instances, saturation)

    def _device_sample(self, now: Timestamp, problems: list[str]) -> DeviceSample:
        """The device's own readings: power, energy counter, compute and MIG mode, utilisation."""
        # Power first: if the GPU is gone, this is where we learn it (any failure but NotSupported propagates,
        # and marks it down). A board that cannot read its power (a vGPU guest) is up, its power absent.
        try:
            power_mw: int | None = nvml_call(pynvml.nvmlDeviceGetPowerUsage, self.handle)
        except NotSupported:
            power_mw = None
        energy_mj = nvml_optional(problems, pynvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)
        mode = nvml_optional(problems, pynvml.nvmlDeviceGetComputeMode, self.handle)
        mig = nvml_optional(problems, pynvml.nvmlDeviceGetMigMode, self.handle)
        mig_enabled = bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE) if mig is not None else False
        # The device's own utilisation: lets the idle processor tell a quiet tick from one whose work the
        # process listing cannot see. Not on MIG (NVML does not support it there).
        rates = (
            nvml_optional(problems, pynvml.nvmlDeviceGetUtilizationRates, self.handle)
            if self.read_utilisation and not mig_enabled
            else None
        )
        return DeviceSample(
            time=now,
            device_id=self.uuid,
            device_index=self.index,
            device_name=self.name,
            vendor="nvidia",
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            energy_mj=float(energy_mj) if energy_mj is not None else None,
            compute_mode=COMPUTE_MODES.get(mode) if mode is not None else None,
            mig_enabled=mig_enabled,
            counter_epoch=self.epoch,
            util=rates.gpu / 100.0 if rates is not None else None,
        )

    def _process_samples(
        self, now: Timestamp, procs: list[ProcessEntry], mig_enabled: bool, problems: list[str]
    ) -> list[GpuProcessSample]:
        """One record per listed process (with its utilisation over the tick), plus one per process busy
        in the tick but gone from the listing by its end."""
        util: dict[int, float] | None = None
        window_s: float | None = None
        self.busy_means.clear()
        self.mem_utils.clear()
        self.stale_pids.clear()
        if self.read_utilisation and not mig_enabled:
            util, window_s = self._utilisation(now, problems)
        processes = []
        listed = {pid for pid, _, _, _ in procs}
        for pid in sorted(set(util or ()) - listed - self.stale_pids):
            # Busy during this tick but gone by its end: it used energy, so it stays in the tick.
            processes.append(
                GpuProcessSample(
                    time=now,
                    device_id=self.uuid,
                    pid=pid,
                    sm_util=util[pid] if util else None,
                    util_window_s=window_s,
                    sm_util_busy=self.busy_means.get(pid),
                    mem_util=self.mem_utils.get(pid, 0.0) if util else None,
                )
            )
        uuid, busy, mem = self.uuid, self.busy_means.get, self.mem_utils.get
        # One record per process per tick: made positionally (see new_process_sample).
        processes += [
            new_process_sample(
                now,
                (),
                uuid,
                pid,
                memory,
                gi if mig_enabled and gi != _NO_INSTANCE else None,
                ci if mig_enabled and ci != _NO_INSTANCE else None,
                None if util is None else util.get(pid, 0.0),
                window_s,
                busy(pid),
                None if util is None else mem(pid, 0.0),
            )
            for pid, memory, gi, ci in procs
        ]
        return processes

    def _mig_instances(
        self, now: Timestamp, processes: list[GpuProcessSample], problems: list[str]
    ) -> list[MigInstance]:
        """The device's GPU instances (MIG enabled), from the layout cache; none where it cannot be read."""
        on_instances: dict[int, set[int]] = {}
        for p in processes:
            if p.gpu_instance_id is not None:
                on_instances.setdefault(p.gpu_instance_id, set()).add(p.pid)
        try:
            layout = self.mig_layout.current(self.handle, now.monotonic_s, on_instances)
        except DeviceLost:
            raise
        except NvmlFailure as exc:
            problems.append(f"MIG layout: {exc}")
            layout = {}
        return [
            MigInstance(
                time=now,
                device_id=self.uuid,
                gpu_instance_id=slot.gpu_instance_id,
                profile=slot.profile,
                compute_slices=slot.compute_slices,
                mig_uuid=slot.mig_uuid,
            )
            for slot in sorted(layout.values(), key=lambda s: s.gpu_instance_id)
        ]

    def _utilisation(self, now: Timestamp, problems: list[str]) -> tuple[dict[int, float] | None, float | None]:
        # The window is the tick: from the previous read, or from the newest sample already used if that
        # is later. The newest sample alone is not enough: after quiet ticks (no samples at all) it lies
        # far back, and a process busy for one second of this tick would weigh as if busy all along.
        # The driver stamps its samples with the wall clock. Where that stepped back since (NTP, ``date -s``), the
        # window's start by it lies after now and every new sample is older: asked for samples newer than that,
        # the driver had none until the clock caught up, and each process read 0 % meanwhile. The window then
        # starts its length by the monotonic clock before now (its length is always by that clock).
        since_us = self.last_seen_us
        window_s = None
        now_us = int(now.wall_s * 1e6)
        stepped_back = False
        if self.prev_read is not None:
            prev_wall_s, prev_monotonic_s = self.prev_read
            since_us = max(since_us, int(prev_wall_s * 1e6))
            window_s = now.monotonic_s - prev_monotonic_s
            if since_us >= now_us:
                stepped_back = True
                since_us = now_us - int(window_s * 1e6)
        self.prev_read = (now.wall_s, now.monotonic_s)
        try:
            raw = nvml_call(self.utilisation_samples, self.handle, since_us)
        except NotFound:
            # The driver's way of saying "no busy process since then": observed, and zero.
            return {}, window_s
        except NotSupported:
            return None, None
        except NvmlFailure as exc:
            problems.append(str(exc))
            return None, None
        # Only samples newer than the last one we used: some drivers return the boundary sample again.
        samples = [entry for entry in raw if entry[1] > since_us]
        if stepped_back:
            # Samples from before the step are stamped after now until the clock catches up, and come again with
            # every window so placed. An entry no newer than those already used is of them: a process the listing
            # lacks is not one that ran in this tick on their account (it would be billed so for as long).
            self.stale_pids = {pid for pid, ts, _, _ in samples if ts <= self.last_seen_us}
        if samples:
            self.last_seen_us = max(ts for _, ts, _, _ in samples)
        if any(mem for _, _, _, mem in samples):  # (all 0: every process's is an observed 0, found for free)
            # Memory utilisation comes in the same entries, so it integrates over the tick the same way.
            mem_entries = [(pid, ts, mem) for pid, ts, _, mem in samples]
            self.mem_utils.update(integrate_utilisation(mem_entries, since_us, now_us))
        sm_entries = [(pid, ts, sm) for pid, ts, sm, _ in samples]
        return integrate_utilisation(sm_entries, since_us, now_us, self.busy_means), window_s
