"""Benchmark: what the best-set search costs (issue 19), exact up to EXACT_LIMIT free GPUs and heuristic above.

    .venv/bin/python benchmarks/topology_search.py [--repeat 5]

For each node size it times ``best_sets`` (every request size 1…N among all N free GPUs: what the agent
computes when allocations change) and the single hardest request (N/2 GPUs, the most candidate sets). The
topology is random but seeded (PCIe levels and 0–6 NVLinks per pair), so runs compare. For N > 8 it also
runs the exhaustive search on the same node (while C(N, N/2) ≤ 10⁶), to show what the heuristic saves and how far below the exact
optimum it lands (0 = found the optimum), and how often the heuristic misses the optimum on 300 random
9–11 GPU nodes (every request size). Last, one extender ``prioritize`` call over ``--nodes`` annotated
8-GPU nodes (JSON parsing of the annotations, the search, normalisation; not the HTTP round trip).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable

from wattpipe.pipeline.topology import PCIE_SCORES, GpuTopology, Link, _exact, best_set, best_sets


def random_topology(count: int, seed: int) -> GpuTopology:
    rng = random.Random(seed)
    levels = sorted(PCIE_SCORES)
    links = [
        Link(a, b, rng.choice(levels), rng.choice([0, 0, 0, 1, 2, 6]))
        for a, b in itertools.combinations(range(count), 2)
    ]
    return GpuTopology([f"GPU-{i}" for i in range(count)], links)


def _time_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def heuristic_gap(nodes: int) -> tuple[int, int, float]:
    """(requests, requests where the heuristic is below the optimum, worst relative gap) on random 9–11 GPU
    nodes of four link mixes (sparse NVLink, dense, NVSwitch-like, PCIe-only), every size 2…N-1."""
    total = missed = 0
    worst = 0.0
    for seed in range(nodes):
        rng = random.Random(seed)
        count, mix = rng.choice([9, 10, 11]), rng.choice([[0, 0, 0, 1, 2, 6], [0, 1, 2], [0, 0, 0, 0, 18], [0]])
        pairs = itertools.combinations(range(count), 2)
        links = [Link(a, b, rng.choice(sorted(PCIE_SCORES)), rng.choice(mix)) for a, b in pairs]
        topology = GpuTopology([f"GPU-{i}" for i in range(count)], links)
        for size in range(2, count):
            _, optimum = _exact(topology, list(range(count)), size)
            found = best_set(topology, range(count), size)
            assert found is not None
            assert not found.exact
            total += 1
            if found.score < optimum:
                missed += 1
                worst = max(worst, (optimum - found.score) / optimum)
    return total, missed, worst


def extender_ms(nodes: int, repeat: int) -> float:
    from wattpipe.extender import prioritize
    from wattpipe.pipeline.topology_annotation import ANNOTATION, encode

    items = []
    for index in range(nodes):
        topology = random_topology(8, seed=index)
        free = [g for g in range(8) if (index >> g) & 1 == 0] or [0, 1]
        annotation = encode(topology, free, best_sets(topology, free))
        items.append({"metadata": {"name": f"node-{index}", "annotations": {ANNOTATION: annotation}}})
    pod = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    args = {"pod": pod, "nodes": {"items": items}}
    return _time_ms(functools.partial(prioritize, args), repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=1000, help="annotated nodes in the extender request")
    args = parser.parse_args()
    print("| GPUs | search | all sizes 1…N (ms) | size N/2 (ms) | exact N/2 (ms) | heuristic below optimum |")
    print("|---|---|---|---|---|---|")
    for count in (2, 4, 8, 10, 12, 16, 32):
        topology = random_topology(count, seed=count)
        free = range(count)
        half = count // 2
        all_ms = _time_ms(functools.partial(best_sets, topology, free), args.repeat)
        half_ms = _time_ms(functools.partial(best_set, topology, free, half), args.repeat)
        found = best_set(topology, free, half)
        assert found is not None
        if found.exact:
            print(f"| {count} | exact | {all_ms:.2f} | {half_ms:.2f} | = | 0 |")
            continue
        if math.comb(count, half) > 1_000_000:
            print(f"| {count} | heuristic | {all_ms:.2f} | {half_ms:.2f} | C({count},{half}) sets: not run | ? |")
            continue
        exact_ms = _time_ms(functools.partial(_exact, topology, list(free), half), 1)
        _, optimum = _exact(topology, list(free), half)
        print(f"| {count} | heuristic | {all_ms:.2f} | {half_ms:.2f} | {exact_ms:.1f} | {optimum - found.score} |")
    total, missed, worst = heuristic_gap(300)
    print(
        f"\nheuristic on 300 random 9-11 GPU nodes: {missed} of {total} requests below the optimum, worst {worst:.1%}"
    )
    ms = extender_ms(args.nodes, args.repeat)
    print(f"extender prioritize, {args.nodes} annotated 8-GPU nodes, 2 GPUs: {ms:.1f} ms")


if __name__ == "__main__":
    main()
