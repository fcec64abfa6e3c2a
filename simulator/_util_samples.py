"""The driver's per-process utilisation sampling behind ``nvmlDeviceGetProcessUtilization``.

What real drivers do (NVML docs and observed behaviour): every sample period (1/6 s) the driver records
one sample per process that used the GPU in that period into a bounded per-device buffer; idle
processes get none. A query returns one entry per process with samples newer than ``lastSeenTimeStamp``
(µs, CPU wall clock): the newest such sample's timestamp and the mean of those samples' utilisation, SM
(``smUtil``) and memory (``memUtil``) alike. A process counts as using the GPU in a period when either
is above 0.
With ``lastSeenTimeStamp = 0`` that is a rolling mean over the whole buffer, i.e. stale values.

The buffer here is derived, not stored: sample ``k`` of a process is its exact mean utilisation over
``((k-1)·P, k·P]`` (SM and memory), so the same query at the same instant always gives the same answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wattpipe.simulator.truth import GroundTruth, ProcessPlan

__all__ = ["SAMPLES_PER_S", "UtilEntry", "sample_offset_us", "utilisation_entries"]

SAMPLES_PER_S = 6
_PERIOD_S = 1.0 / SAMPLES_PER_S


def sample_offset_us(k: int) -> int:
    """Microseconds from the scenario start to sample ``k`` (at ``k/6`` s), rounded like a µs clock."""
    return (k * 1_000_000 + SAMPLES_PER_S // 2) // SAMPLES_PER_S


def _first_after(offset_us: int) -> int:
    """The first sample index whose offset is strictly greater than ``offset_us``."""
    k = max(0, offset_us * SAMPLES_PER_S // 1_000_000)
    while k > 0 and sample_offset_us(k - 1) > offset_us:
        k -= 1
    while sample_offset_us(k) <= offset_us:
        k += 1
    return k


@dataclass(frozen=True, slots=True)
class UtilEntry:
    pid: int
    timestamp_us: int
    sm_util_pct: int
    mem_util_pct: int = 0


def utilisation_entries(
    truth: GroundTruth,
    gpu: int,
    t_s: float,
    start_wall_us: int,
    last_seen_us: int,
    buffer_samples: int,
) -> list[UtilEntry]:
    """Entries as the driver would answer at scenario time ``t_s`` (samples at ``k·P``, ``k >= 1``).

    The buffer keeps the newest ``buffer_samples`` samples and none older than ``buffer_samples``
    periods (so an idle stretch costs nothing to walk back over).
    """
    newest_k = math.floor(t_s / _PERIOD_S + 1e-9)
    if newest_k < 1:
        return []
    oldest_k = max(1, newest_k - buffer_samples + 1)
    # Ticks at or before last_seen are filtered out anyway: do not walk past them.
    oldest_k = max(oldest_k, _first_after(last_seen_us - start_wall_us))
    if oldest_k > newest_k:
        return []
    sums: dict[int, float] = {}
    mem_sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    newest: dict[int, int] = {}
    kept = 0
    for k in range(newest_k, oldest_k - 1, -1):
        lo_s, hi_s = (k - 1) * _PERIOD_S, k * _PERIOD_S
        # The processes alive in the period (found by time, not by scanning every process of the GPU),
        # and only those that started before t_s: hi_s can exceed t_s by a rounding error.
        active = [
            (plan, _mean(plan, lo_s, hi_s), plan.mem_util.mean(lo_s, hi_s))
            for plan in truth.running_between(gpu, lo_s, hi_s)
            if plan.start_s < t_s
        ]
        for plan, util, mem in active:
            if util <= 0.0 and mem <= 0.0:
                continue
            if kept >= buffer_samples:
                break
            kept += 1
            sums[plan.pid] = sums.get(plan.pid, 0.0) + util
            mem_sums[plan.pid] = mem_sums.get(plan.pid, 0.0) + mem
            counts[plan.pid] = counts.get(plan.pid, 0) + 1
            newest.setdefault(plan.pid, start_wall_us + sample_offset_us(k))
        if kept >= buffer_samples:
            break
    return [
        UtilEntry(
            pid=pid,
            timestamp_us=newest[pid],
            sm_util_pct=round(100.0 * sums[pid] / counts[pid]),
            mem_util_pct=round(100.0 * mem_sums[pid] / counts[pid]),
        )
        for pid in sorted(newest)
    ]


def _mean(plan: ProcessPlan, lo_s: float, hi_s: float) -> float:
    return plan.util.mean(lo_s, hi_s)
