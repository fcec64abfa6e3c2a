"""The arithmetic of attribution: integer millijoules split exactly by weights (no component here)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

__all__ = ["apportion", "fractions", "since_start"]

_INF = float("inf")


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
    clean = [w if 0.0 < w < _INF else 0.0 for w in weights]  # finite and positive (NaN fails both)
    weight_sum = math.fsum(clean)
    if weight_sum <= 0:
        clean, weight_sum = [1.0] * n, float(n)
    exact = [total_mj * w / weight_sum for w in clean]
    parts = list(map(math.floor, exact))
    left = total_mj - sum(parts)
    if left > 0:
        # Largest fractional part first; a stable sort keeps equal ones in index order, also reversed.
        remainders = list(map(operator.sub, exact, parts))
        for i in sorted(range(n), key=remainders.__getitem__, reverse=True)[:left]:
            parts[i] += 1
    elif left < 0:
        # Rounding can leave a part one above its exact share; never hand out more than total.
        for i in sorted(range(n), key=lambda i: (exact[i] - parts[i], i))[:-left]:
            parts[i] -= 1
    return parts


def fractions(weights: Sequence[float]) -> list[float]:
    """Weights normalised to sum to 1; all-zero or unusable weights split equally."""
    clean = [w if 0.0 < w < _INF else 0.0 for w in weights]
    total = math.fsum(clean)
    if total <= 0:
        return [1.0 / len(clean)] * len(clean)
    return [w / total for w in clean]


def since_start(
    weight: float, busy_mean: float | None, start_s: float | None, window_start_s: float, window_s: float | None
) -> float:
    """A process's utilisation weight over the window, less the part of the window before it started.

    The driver gives one entry per process: its mean over busy samples and its newest sample's time, from
    which the receiver weighs it as if busy from the window's start. A process that started inside the
    window (``start_s``, Unix s, from /proc) was not: ``busy_mean`` × the window's part before its start
    comes off. Without a start time, a busy mean or a window, the weight stands as it is.
    """
    if busy_mean is None or start_s is None or not window_s or start_s <= window_start_s:
        return weight
    before = min(start_s - window_start_s, window_s) / window_s
    return max(0.0, weight - busy_mean * before)
