"""The arithmetic of attribution: integer millijoules split exactly by weights (no component here)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["apportion", "fractions"]


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


def fractions(weights: Sequence[float]) -> list[float]:
    """Weights normalised to sum to 1; all-zero or unusable weights split equally."""
    clean = [w if math.isfinite(w) and w > 0 else 0.0 for w in weights]
    total = math.fsum(clean)
    if total <= 0:
        return [1.0 / len(clean)] * len(clean)
    return [w / total for w in clean]
