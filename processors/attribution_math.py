"""The arithmetic of attribution: integer millijoules split exactly by weights (no component here)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

__all__ = ["apportion", "fractions"]

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
