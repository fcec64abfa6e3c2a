"""Receiver ``nvml``: GPU power, the energy counter, sharing mode and running processes, from NVML.

Each GPU is read on its own worker thread, so a GPU that hangs in the driver delays nobody: the tick
takes what the others returned and the slow one is reported absent (never zero) until it answers.
Sharing mode (compute mode, MIG mode) is re-read every tick, so a change is honoured at once.

Failure modes, each degrading rather than stopping:
- no driver (library missing, module not loaded): one clear log line, no devices, the pipeline runs on
  (``required: true`` makes it fatal instead);
- a GPU lost: marked down (``up=False``), its handle re-acquired by UUID with exponential backoff, the
  other GPUs keep flowing;
- a single call failing (no permission, not supported): that value is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pynvml
from pydantic import Field

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.records import DeviceSample, Record
from wattpipe.pipeline.telemetry import ComponentTelemetry
from wattpipe.receivers.nvml._device import DeviceReader, Reading
from wattpipe.receivers.nvml._errors import DeviceLost, LibraryMissing, NvmlFailure, nvml_call
from wattpipe.receivers.nvml._mig import MigLayout
from wattpipe.receivers.nvml._xid import XidEvents

__all__ = ["NvmlConfig", "NvmlReceiver", "factory"]


class NvmlConfig(ComponentConfig):
    required: bool = False
    """Fail to start when NVML is unavailable, instead of running with no GPUs."""
    devices: list[str] = Field(default_factory=list)
    """Only these GPUs, by UUID or index; empty: every GPU."""
    process_utilization: bool = True
    """Read per-process SM utilisation (the time-slicing shares)."""
    device_timeout: Duration = 2.0
    """How long one GPU's reads may take in a tick before it is reported absent for that tick."""
    mig_layout_refresh: Duration = 60.0
    """How often a MIG GPU's instance layout is re-read (also at once when a process names an unknown instance, or
    an instance has processes none of which was on it the tick before: it may have been made again)."""
    reinit_backoff: Duration = 5.0
    reinit_backoff_max: Duration = 300.0
    saturation: bool = False
    """Also read the saturation fields (violation counters, clock event reasons, memory) as DeviceSignals
    for the ``saturation`` processor: its source where no dcgm-exporter runs (docs/saturation.md)."""


@dataclass
class _Retry:
    """When a GPU that failed (could not be opened, or was lost) is tried next, and the backoff that led
    there: ``reinit_backoff`` after the first failure, doubled after each next one up to the maximum."""

    at_s: float = 0.0
    backoff_s: float = 0.0  # 0: no failure since the GPU last answered

    def failed(self, now_s: float, config: NvmlConfig) -> None:
        self.backoff_s = min(self.backoff_s * 2, config.reinit_backoff_max) if self.backoff_s else config.reinit_backoff
        self.at_s = now_s + self.backoff_s


@dataclass
class _Slot:
    """A GPU as this receiver tracks it: its reader, its thread, and its health."""

    reader: DeviceReader
    executor: ThreadPoolExecutor
    pending: Future[Reading] | None = None
    down: bool = False
    dropped: bool = False  # ``pending`` timed out: its reading, when it comes, is not delivered
    retry: _Retry = field(default_factory=_Retry)


class NvmlReceiver:
    provides = frozenset({"devices", "gpu_processes", "mig_instances"})

    def __init__(self, config: NvmlConfig, ctx: CreateContext) -> None:
        self.config = config
        self.xids: XidEvents | None = None
        if config.saturation:
            self.provides = NvmlReceiver.provides | {"device_signals"}
            self.xids = XidEvents()
        self.clock = ctx.clock
        self.log = ctx.logger
        self.rl: ComponentTelemetry = ctx.telemetry
        self.failures = ctx.telemetry.counter(
            "wattpipe_nvml_device_failures",
            "GPU reads that failed, by GPU index and reason: lost (a read or a re-acquisition failed), open "
            "(the GPU could not be opened), timeout (no answer within device_timeout), busy (still answering "
            "the previous tick).",
            ("gpu", "reason"),
        )
        self.slots: list[_Slot] = []
        self.available = False
        self._unopened: dict[int, _Retry] = {}  # GPUs that could not be opened yet, by index
        self._opener = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml-open")
        self._opening: Future[dict[int, DeviceReader | NvmlFailure]] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self._init)

    def _init(self) -> None:
        try:
            nvml_call(pynvml.nvmlInit)
        except LibraryMissing as exc:
            if self.config.required:
                raise RuntimeError(f"NVML is not available and the nvml receiver is required: {exc}") from None
            self.log.warning(
                "NVML is not available (%s): no NVIDIA driver on this node? Running with no GPUs "
                "(set required: true to make this fatal)",
                exc,
            )
            return
        except NvmlFailure as exc:
            if self.config.required:
                raise RuntimeError(f"NVML failed to initialise: {exc}") from None
            self.log.error("NVML failed to initialise (%s): running with no GPUs", exc)
            return
        self.available = True
        count = nvml_call(pynvml.nvmlDeviceGetCount)
        now_s = self.clock.monotonic()
        for index in range(count):
            try:
                reader = self._open(index)
            except NvmlFailure as exc:
                # It may come back (a GPU lost at boot, a driver still settling): tried again with backoff.
                retry = self._unopened[index] = _Retry()
                retry.failed(now_s, self.config)
                self.failures.inc(gpu=str(index), reason="open")
                self.log.error("GPU %d cannot be opened (%s): retrying in %gs", index, exc, retry.backoff_s)
                continue
            self._adopt(reader)
        wanted = set(self.config.devices)
        known = {s.reader.uuid for s in self.slots} | {
            str(i) for i in (*(s.reader.index for s in self.slots), *self._unopened)
        }
        missing = wanted - known
        if missing:
            self.log.warning("devices %s are not on this node", ", ".join(sorted(missing)))
        self.log.info("NVML: %d GPU(s): %s", len(self.slots), ", ".join(s.reader.uuid for s in self.slots) or "none")

    def _open(self, index: int) -> DeviceReader:
        """Blocking: a GPU's handle and identity, or NvmlFailure."""
        handle = nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(nvml_call(pynvml.nvmlDeviceGetUUID, handle))
        name = _text(nvml_call(pynvml.nvmlDeviceGetName, handle))
        return DeviceReader(
            index=index,
            uuid=uuid,
            name=name,
            handle=handle,
            read_utilisation=self.config.process_utilization,
            read_saturation=self.config.saturation,
            mig_layout=MigLayout(self.config.mig_layout_refresh),
            # Only samples from now on: the driver's buffer holds older ones (Kepler reads them all).
            last_seen_us=int(self.clock.wall() * 1e6),
        )

    def _adopt(self, reader: DeviceReader) -> bool:
        wanted = set(self.config.devices)
        if wanted and reader.uuid not in wanted and str(reader.index) not in wanted:
            return False
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"nvml-gpu{reader.index}")
        self.slots.append(_Slot(reader=reader, executor=executor))
        self.slots.sort(key=lambda slot: slot.reader.index)
        return True

    def _open_all(self, indices: list[int]) -> dict[int, DeviceReader | NvmlFailure]:
        """On the opener thread: each GPU opened, or why not."""
        out: dict[int, DeviceReader | NvmlFailure] = {}
        for index in indices:
            try:
                out[index] = self._open(index)
            except NvmlFailure as exc:
                out[index] = exc
        return out

    async def _retry_unopened(self, now: Timestamp) -> None:
        """GPUs that could not be opened at start are tried again, with backoff, off the event loop."""
        if self._opening is None:
            due = sorted(i for i, retry in self._unopened.items() if now.monotonic_s >= retry.at_s)
            if not due:
                return
            self._opening = self._opener.submit(self._open_all, due)
        opening = self._opening
        await asyncio.wait({asyncio.wrap_future(opening)}, timeout=self.config.device_timeout)
        if not opening.done():
            return  # still opening (a hung driver call): looked at again next tick
        self._opening = None
        for index, result in opening.result().items():
            if isinstance(result, NvmlFailure):
                self.failures.inc(gpu=str(index), reason="open")
                self._unopened[index].failed(now.monotonic_s, self.config)
                continue
            del self._unopened[index]
            if self._adopt(result):
                self.log.warning("GPU %d (%s) can be opened now: measuring it from this tick", index, result.uuid)

    async def shutdown(self) -> None:
        for slot in self.slots:
            slot.executor.shutdown(wait=False, cancel_futures=True)
        self._opener.shutdown(wait=False, cancel_futures=True)
        if self.available:
            if self.xids is not None:
                await asyncio.to_thread(self.xids.close)
            try:
                await asyncio.to_thread(nvml_call, pynvml.nvmlShutdown)
            except NvmlFailure as exc:
                self.log.warning("nvmlShutdown failed: %s", exc)
            self.available = False

    # --- the tick -------------------------------------------------------------------------

    async def collect(self) -> Sequence[Record]:
        now = self.clock.now()
        if self._unopened:
            await self._retry_unopened(now)
        waiting: list[_Slot] = []
        readings: dict[int, list[Record]] = {}  # by slot position, so records come out in device order
        for pos, slot in enumerate(self.slots):
            if slot.pending is not None and not slot.pending.done():
                self.failures.inc(gpu=str(slot.reader.index), reason="busy")
                self._warn(
                    slot, "slow", f"GPU {slot.reader.index} ({slot.reader.uuid}) is still answering the last tick"
                )
                continue
            if slot.dropped:
                slot.dropped = False
                slot.reader.rewind()
            if slot.down and now.monotonic_s < slot.retry.at_s:
                readings[pos] = [self._down_sample(slot, now)]
                continue
            slot.pending = slot.executor.submit(self._read, slot, now)
            waiting.append(slot)
        if waiting:
            await self._all_done([slot.pending for slot in waiting if slot.pending is not None])
            for slot in waiting:
                pending = slot.pending
                if pending is None or not pending.done():
                    slot.dropped = True
                    self.failures.inc(gpu=str(slot.reader.index), reason="timeout")
                    self._warn(
                        slot,
                        "timeout",
                        f"GPU {slot.reader.index} did not answer within {self.config.device_timeout:g}s; "
                        "its values are absent this tick",
                    )
                    continue
                reading = pending.result()
                readings[self.slots.index(slot)] = [
                    reading.device,
                    *reading.processes,
                    *reading.instances,
                    *reading.signals,
                ]
                for problem in reading.problems:
                    self._warn(slot, problem, f"GPU {slot.reader.index}: {problem}; that value is absent")
        records = [record for pos in sorted(readings) for record in readings[pos]]
        if self.xids is not None:
            records += await asyncio.to_thread(self._xid_records, now)
        return records

    def _xid_records(self, now: Timestamp) -> list[Record]:
        assert self.xids is not None
        for slot in self.slots:
            if not slot.down:
                self.xids.register(slot.reader.handle, slot.reader.uuid)
        self.xids.drain()
        for problem in self.xids.problems:
            self.rl.log.log(logging.WARNING, "xid", f"nvml: {problem}; its XIDs are absent")
        self.xids.problems.clear()
        return list(self.xids.records(now))

    async def _all_done(self, futures: list[Future[Reading]]) -> None:
        """Until every read is done or ``device_timeout`` passed: one wake-up of the event loop when the
        last GPU answers, not one per GPU (eight GPUs answering within a millisecond of each other)."""
        loop = asyncio.get_running_loop()
        finished = asyncio.Event()
        left = [len(futures)]
        lock = threading.Lock()

        def one_done(_: Future[Reading]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                with contextlib.suppress(RuntimeError):  # the loop closed while a hung GPU finished
                    loop.call_soon_threadsafe(finished.set)

        for future in futures:
            future.add_done_callback(one_done)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), timeout=self.config.device_timeout)

    def _read(self, slot: _Slot, now: Timestamp) -> Reading:
        """Runs on the slot's thread. Never raises: a lost GPU comes back as a down sample."""
        r = slot.reader
        try:
            if slot.down:
                r.handle = nvml_call(pynvml.nvmlDeviceGetHandleByUUID, r.uuid)
            # Stamped when this GPU is actually read, not when the tick began: the idle processor divides
            # the counter's delta by the time between two stamps, and a worker that starts a few ms late
            # (eight GPUs, one core) would otherwise read as a few % more or less power at short intervals.
            reading = r.read(self.clock.now())
        except NvmlFailure as exc:
            self.failures.inc(gpu=str(r.index), reason="lost")
            lost = isinstance(exc, DeviceLost) or slot.down
            slot.retry.failed(now.monotonic_s, self.config)
            if not slot.down:
                # What answers next comes through a new handle, maybe a reloaded driver's whose energy
                # counter started again from 0: the readings after the outage are of a new counter epoch.
                r.epoch += 1
                self.log.error(
                    "GPU %d (%s) %s: %s; marked down, retrying in %gs",
                    r.index,
                    r.uuid,
                    "lost" if lost else "failed",
                    exc,
                    slot.retry.backoff_s,
                )
            slot.down = True
            return Reading(self._down_sample(slot, now), [])
        if slot.down:
            self.log.warning("GPU %d (%s) is back", r.index, r.uuid)
            slot.down = False
            slot.retry = _Retry()
        return reading

    def _down_sample(self, slot: _Slot, now: Timestamp) -> DeviceSample:
        r = slot.reader
        return DeviceSample(
            time=now, device_id=r.uuid, device_index=r.index, device_name=r.name, vendor="nvidia", up=False
        )

    def _warn(self, slot: _Slot, key: str, message: str) -> None:
        self.rl.log.log(logging.WARNING, f"{slot.reader.uuid}/{key}", message)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


factory = Factory.of(
    NvmlReceiver,
    type="nvml",
    kind="receiver",
    config_model=NvmlConfig,
    description="NVIDIA GPUs through NVML: power, energy counter, sharing mode, processes and their SM utilisation.",
    stability="alpha",
    provides=frozenset({"devices", "gpu_processes", "mig_instances"}),
)
