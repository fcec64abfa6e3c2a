"""GPU topology scores: the link between two GPUs, the best set of free GPUs for a request, node scores.

One place for the arithmetic that both the agent (which publishes scores and the node annotation) and the
scheduler extender (which ranks nodes) use, so the two can never disagree. Pure functions, no I/O.

Scores follow go-gpuallocator's table: the PCIe path scores by its common ancestor (``PSB`` 60 … ``SYS`` 10)
and every bonded NVLink adds 100 (``NV2`` inside a NUMA node = 20 + 200 = 220). On an NVSwitch board NVML
cannot name the peer at the far end of a link (it is a switch), so the caller counts the NVLinks a pair can
use (P2P over NVLink) and passes that count: a full HGX H100 pair is ``NV18``. A set's score is the sum of
its pairs' scores. The best set of each size is searched exactly among up to :data:`EXACT_LIMIT` free GPUs,
greedily (then improved by swaps) above that; see docs/topology.md. Sets are never padded: a request larger
than the free GPUs has no set.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "EXACT_LIMIT",
    "MAX_EXTENDER_SCORE",
    "NVLINK_SCORE",
    "PCIE_BY_NVML_LEVEL",
    "PCIE_SCORES",
    "BestSet",
    "GpuTopology",
    "Link",
    "TopologyError",
    "best_set",
    "best_sets",
    "free_gpus",
    "normalise",
    "set_score",
]

# nvidia-smi's PCIe letters (NVML's nvmlGpuTopologyLevel_t value → letter) and go-gpuallocator's scores.
PCIE_BY_NVML_LEVEL: Mapping[int, str] = {0: "PSB", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
PCIE_SCORES: Mapping[str, int] = {"PSB": 60, "PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}
NVLINK_SCORE = 100
MAX_NVLINKS = 18
# Exhaustive search up to this many free GPUs (C(8, 4) = 70 sets at most); a heuristic above.
EXACT_LIMIT = 8
# k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority.
MAX_EXTENDER_SCORE = 10


class TopologyError(ValueError):
    """A topology that cannot be scored; the message names the pair or field."""


@dataclass(frozen=True, slots=True)
class Link:
    """The path between GPUs ``a`` < ``b``: the PCIe common ancestor and the NVLinks they share."""

    a: int
    b: int
    pcie: str
    nvlinks: int = 0

    def __post_init__(self) -> None:
        if self.pcie not in PCIE_SCORES:
            raise TopologyError(
                f"link {self.a}-{self.b}: unknown PCIe level {self.pcie!r} (one of {list(PCIE_SCORES)})"
            )
        if not 0 <= self.nvlinks <= MAX_NVLINKS:
            raise TopologyError(f"link {self.a}-{self.b}: {self.nvlinks} NVLinks (0 to {MAX_NVLINKS})")
        if not 0 <= self.a < self.b:
            raise TopologyError(f"link {self.a}-{self.b}: needs 0 <= a < b")

    @property
    def name(self) -> str:
        """What ``nvidia-smi topo -m`` prints: ``NV<n>`` when NVLinks join them, else the PCIe letter."""
        return f"NV{self.nvlinks}" if self.nvlinks else self.pcie

    @property
    def score(self) -> int:
        return PCIE_SCORES[self.pcie] + NVLINK_SCORE * self.nvlinks


@dataclass(frozen=True, slots=True)
class BestSet:
    """The best set of ``size`` free GPUs (indices, ascending) and its score; ``exact`` says how it was found."""

    size: int
    gpus: tuple[int, ...]
    score: int
    exact: bool = True


class GpuTopology:
    """Every pair's link on one node. ``uuids[i]`` is GPU ``i`` (NVML index order)."""

    __slots__ = ("_scores", "links", "uuids")

    def __init__(self, uuids: Sequence[str], links: Iterable[Link]) -> None:
        self.uuids = tuple(uuids)
        count = len(self.uuids)
        by_pair = {(link.a, link.b): link for link in links}
        missing = [f"{a}-{b}" for a, b in itertools.combinations(range(count), 2) if (a, b) not in by_pair]
        extra = [f"{a}-{b}" for a, b in by_pair if b >= count]
        if missing or extra:
            raise TopologyError(f"topology of {count} GPUs: missing pairs {missing}, pairs beyond the GPUs {extra}")
        self.links = tuple(by_pair[pair] for pair in sorted(by_pair))
        self._scores = [[0] * count for _ in range(count)]
        for link in self.links:
            self._scores[link.a][link.b] = self._scores[link.b][link.a] = link.score

    def __len__(self) -> int:
        return len(self.uuids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GpuTopology) and (self.uuids, self.links) == (other.uuids, other.links)

    def __hash__(self) -> int:
        return hash((self.uuids, self.links))

    def score(self, a: int, b: int) -> int:
        return self._scores[a][b]

    def link(self, a: int, b: int) -> Link:
        lo, hi = min(a, b), max(a, b)
        for link in self.links:
            if (link.a, link.b) == (lo, hi):
                return link
        raise TopologyError(f"no link {a}-{b} among {len(self)} GPUs")


def set_score(topology: GpuTopology, gpus: Iterable[int]) -> int:
    """The sum of every pair's score in ``gpus`` (0 for one GPU)."""
    chosen = list(gpus)
    return sum(topology.score(a, b) for a, b in itertools.combinations(chosen, 2))


def _exact(topology: GpuTopology, free: Sequence[int], size: int) -> tuple[tuple[int, ...], int]:
    best: tuple[int, ...] = ()
    best_score = -1
    for combo in itertools.combinations(free, size):  # lexicographic: ties keep the lowest indices
        score = set_score(topology, combo)
        if score > best_score:
            best, best_score = combo, score
    return best, best_score


def _greedy(topology: GpuTopology, free: Sequence[int], size: int) -> tuple[tuple[int, ...], int]:
    """From every seed GPU, add the GPU that adds most; then swap members for outsiders while it gains."""
    best: tuple[int, ...] = ()
    best_score = -1
    for seed in free:
        chosen = [seed]
        rest = [g for g in free if g != seed]
        while len(chosen) < size:
            pick = max(rest, key=lambda g: (sum(topology.score(g, c) for c in chosen), -g))
            chosen.append(pick)
            rest.remove(pick)
        chosen = _improve(topology, chosen, rest)
        combo = tuple(sorted(chosen))
        score = set_score(topology, combo)
        if score > best_score or (score == best_score and combo < best):
            best, best_score = combo, score
    return best, best_score


def _swap_once(topology: GpuTopology, chosen: list[int], rest: list[int]) -> bool:
    """Swap one member for an outsider that joins the others better (the set's score strictly rises);
    False when none does: a local optimum. Strict gains make the swapping end."""
    for i, member in enumerate(chosen):
        others = chosen[:i] + chosen[i + 1 :]
        here = sum(topology.score(member, o) for o in others)
        for j, outsider in enumerate(rest):
            if sum(topology.score(outsider, o) for o in others) > here:
                chosen[i], rest[j] = outsider, member
                return True
    return False


def _improve(topology: GpuTopology, chosen: list[int], rest: list[int]) -> list[int]:
    while _swap_once(topology, chosen, rest):
        pass
    return chosen


def best_set(topology: GpuTopology, free: Iterable[int], size: int) -> BestSet | None:
    """The best ``size`` GPUs among ``free``; ``None`` when fewer are free (never a padded set)."""
    candidates = sorted(set(free))
    for gpu in candidates:
        if not 0 <= gpu < len(topology):
            raise TopologyError(f"free GPU {gpu} is not one of the node's {len(topology)} GPUs")
    if size < 1:
        raise TopologyError(f"request of {size} GPUs: must be at least 1")
    if size > len(candidates):
        return None
    exact = len(candidates) <= EXACT_LIMIT
    gpus, score = (_exact if exact else _greedy)(topology, candidates, size)
    return BestSet(size=size, gpus=gpus, score=score, exact=exact)


def best_sets(topology: GpuTopology, free: Iterable[int]) -> list[BestSet]:
    """The best set of every size from 1 to the number of free GPUs."""
    candidates = sorted(set(free))
    found = (best_set(topology, candidates, size) for size in range(1, len(candidates) + 1))
    return [found_set for found_set in found if found_set is not None]


def normalise(raw: Mapping[str, int | None]) -> dict[str, int]:
    """Raw set scores per node → the extender's 0–10, order kept, without truncation to 0.

    The KEP divides by the best score imaginable (k(k-1)/2 × 1800), so a PCIe-only node (10 per pair) rounds
    to 0, the same as a node with no fitting GPUs. Here the nodes are ranked against each other: the best
    gets 10, the worst that fits gets 1, the rest linearly between (rounded; never above a better node).
    ``None`` (no topology known, or no set fits) scores 0. All equal: every fitting node gets 10.
    """
    known = [score for score in raw.values() if score is not None]
    if not known:
        return {node: 0 for node in raw}
    low, high = min(known), max(known)
    result: dict[str, int] = {}
    for node, score in raw.items():
        if score is None:
            result[node] = 0
        elif high == low:
            result[node] = MAX_EXTENDER_SCORE
        else:
            result[node] = 1 + math.floor((MAX_EXTENDER_SCORE - 1) * (score - low) / (high - low) + 0.5)
    return result


def free_gpus(topology: GpuTopology, taken: Iterable[str]) -> list[int]:
    """Indices of the GPUs whose UUID is not in ``taken`` (allocated whole, by replica, or in MIG mode)."""
    busy = set(taken)
    return [index for index, uuid in enumerate(topology.uuids) if uuid not in busy]
