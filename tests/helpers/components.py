"""Test-only components, loaded in configs through ``custom`` (``class: tests.helpers.components:…``).

They speak the real component contract, so tests exercise the engine exactly as a plugin would.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import CreateContext
from wattpipe.pipeline.records import DevicePower, DeviceSample, GpuProcessSample, GpuShare, Record


class CountingGpu:
    """A receiver for one fake GPU: its energy counter grows by ``watts`` × elapsed clock time."""

    provides = frozenset({"devices"})

    def __init__(self, *, uuid: str = "GPU-test-0", watts: float = 100.0, context: CreateContext) -> None:
        self.uuid = uuid
        self.watts = watts
        self.clock = context.clock
        self.polls = 0
        self.started = False
        self.stopped = False
        self._t0: float | None = None

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.stopped = True

    async def collect(self) -> Sequence[Record]:
        self.polls += 1
        now = self.clock.now()
        if self._t0 is None:
            self._t0 = now.monotonic_s
        energy_mj = (now.monotonic_s - self._t0) * self.watts * 1000.0
        return [DeviceSample(time=now, device_id=self.uuid, device_index=0, power_w=self.watts, energy_mj=energy_mj)]


class ProcessLister:
    """A receiver listing fixed GPU processes."""

    provides = frozenset({"gpu_processes"})

    def __init__(self, *, uuid: str = "GPU-test-0", pids: Sequence[int] = (100, 200), context: CreateContext) -> None:
        self.uuid = uuid
        self.pids = list(pids)
        self.clock = context.clock

    async def collect(self) -> Sequence[Record]:
        now = self.clock.now()
        return [GpuProcessSample(time=now, device_id=self.uuid, pid=pid, sm_util=0.5) for pid in self.pids]


class Flaky:
    """A receiver that works for ``good_polls`` polls, then raises (or hangs, with ``hang: true``) forever."""

    provides = frozenset({"gpu_processes"})

    def __init__(self, *, good_polls: int = 2, hang: bool = False, context: CreateContext) -> None:
        self.good_polls = good_polls
        self.hang = hang
        self.clock = context.clock
        self.polls = 0

    async def collect(self) -> Sequence[Record]:
        self.polls += 1
        if self.polls > self.good_polls:
            if self.hang:
                await asyncio.sleep(3600)
            raise ConnectionError("device went away")
        return [GpuProcessSample(time=self.clock.now(), device_id="GPU-flaky", pid=7)]


class EvenSplit:
    """A processor: power from device samples, split evenly over the listed processes (for order tests)."""

    needs = frozenset({"devices", "gpu_processes"})
    provides = frozenset({"device_power", "shares"})

    def process(self, batch: Batch) -> Batch:
        powers, shares = [], []
        for d in batch.devices:
            w = d.power_w or 0.0
            e = round(w * batch.interval_s * 1000)  # mJ
            powers.append(
                DevicePower(
                    time=d.time,
                    device_id=d.device_id,
                    interval_s=batch.interval_s,
                    power_w=w,
                    idle_w=None,
                    active_w=w,
                    energy_mj=e,
                    idle_energy_mj=0,
                    active_energy_mj=e,
                )
            )
            procs = [p for p in batch.gpu_processes if p.device_id == d.device_id]
            for p in procs:
                shares.append(
                    GpuShare(
                        time=d.time,
                        device_id=d.device_id,
                        pid=p.pid,
                        share=1 / len(procs),
                        energy_mj=e // len(procs),
                        power_w=w / len(procs),
                    )
                )
        return batch.replace(device_power=tuple(powers), shares=tuple(shares))


class NeedsShares:
    """A processor that needs shares (and provides nothing): for order checks."""

    needs = frozenset({"shares"})
    provides: frozenset[str] = frozenset()

    def process(self, batch: Batch) -> Batch:
        return batch


class Boom:
    """A processor that always fails."""

    needs: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()

    def process(self, batch: Batch) -> Batch:
        raise RuntimeError("boom")


class Recorder:
    """An exporter keeping every batch it got; with ``path``, it appends JSON lines there and writes
    ``<path>.flushed`` at shutdown (for tests that run wattpipe in a subprocess)."""

    def __init__(self, *, path: str | None = None, slow_s: float = 0.0, fail: bool = False) -> None:
        self.batches: list[Batch] = []
        self.path = Path(path) if path else None
        self.slow_s = slow_s
        self.fail = fail
        self.flushed = False

    async def export(self, batch: Batch) -> None:
        if self.slow_s:
            await asyncio.sleep(self.slow_s)
        if self.fail:
            raise OSError("collector unreachable")
        self.batches.append(batch)
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(
                    json.dumps({"tick": len(self.batches), "records": [r.to_json() for r in batch.records()]}) + "\n"
                )

    def shutdown(self) -> None:
        self.flushed = True
        if self.path is not None:
            Path(f"{self.path}.flushed").write_text(f"{len(self.batches)} {os.getpid()}\n")


class Tally:
    """A processor that counts ticks and keeps the count in the state file."""

    needs: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()

    def __init__(self, *, context: CreateContext) -> None:
        self.ctx = context
        self.count = 0

    def start(self) -> None:
        saved = self.ctx.state.section(self.ctx.state_key)
        self.count = int(saved["count"]) if saved else 0

    def process(self, batch: Batch) -> Batch:
        self.count += 1
        return batch

    def snapshot(self) -> dict[str, int]:
        return {"count": self.count}
