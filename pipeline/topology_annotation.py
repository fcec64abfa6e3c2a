"""The node annotation that carries a node's GPU topology to the scheduler extender (issue 19).

Written by the agent's ``node_annotation`` exporter, read by ``wattpipe extender``; both sides use this
module, so the format has one definition. Compact JSON, one line::

    wattpipe.io/gpu-topology: {"v":1,"n":8,"links":"PIX+1 NODE+1 NODE+2 SYS+2 SYS SYS SYS …","free":[0,1,3],"best":[0,220,490]}

``links``: every pair's link in row order of the upper triangle (0-1, 0-2, …, 0-(n-1), 1-2, …): the PCIe
level, ``+N`` when N NVLinks join the pair; ``n`` the GPU count. ``free``: the
GPU indices no pod holds. ``best``: the best free set's score of each size 1, 2, … (as many as free GPUs).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wattpipe.pipeline.topology import BestSet, GpuTopology, Link, TopologyError

__all__ = ["ANNOTATION", "VERSION", "NodeTopology", "decode", "encode"]

ANNOTATION = "wattpipe.io/gpu-topology"
VERSION = 1


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """What a node's annotation says: its GPU topology, its free GPUs and the agent's best-set scores."""

    topology: GpuTopology
    free: tuple[int, ...]
    best: tuple[int, ...]


def encode(topology: GpuTopology, free: Sequence[int], sets: Sequence[BestSet]) -> str:
    tokens = [link.pcie + (f"+{link.nvlinks}" if link.nvlinks else "") for link in topology.links]
    body = {
        "v": VERSION,
        "n": len(topology),
        "links": " ".join(tokens),
        "free": sorted(free),
        "best": [s.score for s in sets],
    }
    return json.dumps(body, separators=(",", ":"))


def _int_list(body: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
    value = body.get(key)
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TopologyError(f"{where}: {key!r} must be a list of integers")
    return tuple(value)


def decode(text: str, where: str = ANNOTATION) -> NodeTopology:
    """Parse an annotation; :class:`TopologyError` naming ``where`` (e.g. the node) and the field on any problem."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(f"{where}: not JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise TopologyError(f'{where}: not a version-{VERSION} wattpipe GPU topology ("v": {VERSION})')
    tokens = body.get("links")
    if not isinstance(tokens, str):
        raise TopologyError(f"{where}: 'links' must be a string of space-separated links")
    words = tokens.split()
    count = body.get("n")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0 or len(words) != count * (count - 1) // 2:
        raise TopologyError(f"{where}: 'n' ({count!r}) GPUs do not make the {len(words)} pairs 'links' lists")
    links = []
    for (a, b), token in zip(itertools.combinations(range(count), 2), words, strict=True):
        pcie, _, nvlinks = token.partition("+")
        if nvlinks and not nvlinks.isdigit():
            raise TopologyError(f"{where}: link {a}-{b} {token!r} is not LEVEL or LEVEL+NVLINKS")
        links.append(Link(a, b, pcie, int(nvlinks or 0)))
    topology = GpuTopology([f"gpu{i}" for i in range(count)], links)
    free = _int_list(body, "free", where)
    if any(not 0 <= gpu < count for gpu in free):
        raise TopologyError(f"{where}: 'free' names a GPU beyond the {count} the links describe")
    return NodeTopology(topology=topology, free=free, best=_int_list(body, "best", where))
