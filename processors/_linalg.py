"""Small dense linear algebra for attribution's learned model: Cholesky, solves, and non-negative least squares.

The systems are at most 2 × ``learned.max_processes`` unknowns (32 by default): numpy would be a new
dependency for that, and plain lists with ``sum(map(mul, …))`` (the products in C) solve one in ~1 ms.
Every matrix here is a Gram matrix scaled to a unit diagonal, whose conditioning the caller bounds (the
variance inflation factors), so plain sums are as accurate as compensated ones would be.
"""

from __future__ import annotations

import operator

__all__ = ["cholesky", "inverse_diagonal", "nnls", "solve"]

_MUL = operator.mul
PIVOT_MIN = 1e-9
"""A pivot below this (of a unit-diagonal matrix): a column is a combination of the others."""


def cholesky(a: list[list[float]]) -> list[list[float]] | None:
    """The lower triangle L (rows, each as long as ``a``) of ``a = L Lᵀ``; None where ``a`` is not safely
    positive definite."""
    k = len(a)
    lower = [[0.0] * k for _ in range(k)]
    for j in range(k):
        row_j = lower[j]
        head = row_j[:j]
        pivot = a[j][j] - sum(map(_MUL, head, head))
        if pivot < PIVOT_MIN:
            return None
        row_j[j] = d = pivot**0.5
        for i in range(j + 1, k):
            row_i = lower[i]
            row_i[j] = (a[i][j] - sum(map(_MUL, row_i[:j], head))) / d
    return lower


def solve(lower: list[list[float]], b: list[float]) -> list[float]:
    """x with L Lᵀ x = b."""
    k = len(b)
    y: list[float] = []
    for i in range(k):
        y.append((b[i] - sum(map(_MUL, lower[i][:i], y))) / lower[i][i])
    x = [0.0] * k
    for i in reversed(range(k)):
        tail = sum(lower[m][i] * x[m] for m in range(i + 1, k))  # (Lᵀ's row i: L's column i)
        x[i] = (y[i] - tail) / lower[i][i]
    return x


def inverse_diagonal(lower: list[list[float]]) -> list[float]:
    """diag((L Lᵀ)⁻¹): the squared column norms of L⁻¹, found row by row (forward substitution)."""
    columns: list[list[float]] = []  # column j of L⁻¹ from row j down, grown one row at a time
    for i, row in enumerate(lower):
        d = row[i]
        for j in range(i):
            columns[j].append(-sum(map(_MUL, row[j:i], columns[j])) / d)
        columns.append([1.0 / d])
    return [sum(map(_MUL, column, column)) for column in columns]


def nnls(gram: list[list[float]], rhs: list[float], tolerance: float = 1e-12) -> list[float]:
    """min ‖Ax − y‖² subject to x ≥ 0, from the normal equations (``gram`` = AᵀA, ``rhs`` = Aᵀy), by Lawson
    and Hanson's active-set method: exact in a finite number of steps (a few per unknown)."""
    k = len(rhs)
    x = [0.0] * k
    passive: list[int] = []
    limit = tolerance * max(1.0, max(map(abs, rhs), default=0.0))
    for _ in range(3 * k + 3):
        gradient = [rhs[i] - sum(map(_MUL, gram[i], x)) for i in range(k)]
        candidates = [i for i in range(k) if i not in passive and gradient[i] > limit]
        if not candidates:
            break
        passive.append(max(candidates, key=gradient.__getitem__))
        x = _passive_step(gram, rhs, x, passive)
    return x


def _passive_step(gram: list[list[float]], rhs: list[float], x: list[float], passive: list[int]) -> list[float]:
    """Lawson–Hanson's inner loop: solve on the passive set, stepping back to the boundary while a passive
    unknown would go negative (it leaves the set)."""
    x = list(x)
    for _ in range(len(rhs) + 1):
        lower = cholesky([[gram[i][j] for j in passive] for i in passive])
        if lower is None:
            passive.pop()  # the newest unknown made the set singular: it stays at 0
            return x
        solved = solve(lower, [rhs[i] for i in passive])
        if min(solved) > 0.0:
            for i, v in zip(passive, solved, strict=True):
                x[i] = v
            return x
        # Step from x towards the solution as far as the first unknown to reach 0; it (and any other at 0)
        # leaves the passive set.
        step, first = 1.0, passive[0]
        for i, v in zip(passive, solved, strict=True):
            if v <= 0.0 and (x[i] - v <= 0.0 or x[i] / (x[i] - v) < step):
                step, first = (x[i] / (x[i] - v) if x[i] - v > 0.0 else 0.0), i
        for i, v in zip(passive, solved, strict=True):
            x[i] += step * (v - x[i])
        x[first] = 0.0
        for i in [i for i in passive if x[i] <= 0.0]:
            x[i] = 0.0
            passive.remove(i)
        if not passive:
            return x
    return x
