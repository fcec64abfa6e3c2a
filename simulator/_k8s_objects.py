"""Pods as the Kubernetes API shows them over scenario time: lifetimes, selectors, Status objects.

The server in ``simulator/k8sapi.py`` answers from these.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import Container, Pod

Json = dict[str, Any]

BASE_RV = 1000  # the resourceVersion of the empty cluster; event i gets BASE_RV + i + 1

SELECTABLE_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase")
LABEL_TERM = re.compile(r"(?P<neg>!)?(?P<key>[A-Za-z0-9_./-]+)(?:(?P<op>==|!=|=)(?P<value>[A-Za-z0-9_.-]*))?")


def container_id(container: Container) -> str:
    """``containerStatuses[].containerID`` of ``container``: ``<runtime>://<64 hex>``."""
    return f"{container.runtime}://{container.id}"


@dataclass(frozen=True, slots=True)
class Event:
    rv: int
    t_s: float
    type: Literal["ADDED", "DELETED"]
    pod: Pod


class Timeline:
    """Every pod's ADDED and DELETED events in scenario-time order, each one resourceVersion."""

    def __init__(self, node: SimulatedNode, lifetimes: Literal["static", "processes"]) -> None:
        spans: list[tuple[float, int, int, Literal["ADDED", "DELETED"]]] = []
        for index, pod in enumerate(node.scenario.pods):
            start_s, end_s = lifetime(node, pod) if lifetimes == "processes" else (0.0, math.inf)
            spans.append((start_s, 1, index, "ADDED"))
            if end_s != math.inf:
                spans.append((end_s, 0, index, "DELETED"))  # at one instant, deletions go first
        spans.sort()
        pods = node.scenario.pods
        self.events = [Event(BASE_RV + i + 1, t_s, kind, pods[index]) for i, (t_s, _, index, kind) in enumerate(spans)]
        self._times = [event.t_s for event in self.events]

    def happened(self, t_s: float) -> int:
        """How many events have happened by scenario time ``t_s``."""
        return bisect.bisect_right(self._times, t_s)

    def present(self, count: int) -> list[Event]:
        """The ADDED event of every pod present after the first ``count`` events."""
        live: dict[int, Event] = {}
        for event in self.events[:count]:
            if event.type == "ADDED":
                live[id(event.pod)] = event
            else:
                live.pop(id(event.pod), None)
        return sorted(live.values(), key=lambda e: pod_key(e.pod))  # etcd's order: /registry/pods/<ns>/<name>


def pod_key(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}"


def lifetime(node: SimulatedNode, pod: Pod) -> tuple[float, float]:
    plans = node.truth.pod_plans(pod.namespace, pod.name)
    if not plans:
        return 0.0, math.inf
    return min(p.start_s for p in plans), max(p.end_s for p in plans)


class BadRequest(ValueError):
    pass


def field_selector(text: str) -> Callable[[Json], bool]:
    terms: list[tuple[str, bool, str]] = []  # (field, equal?, value)
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = re.fullmatch(r"([A-Za-z.]+)(==|!=|=)(.*)", term)
        if match is None:
            raise BadRequest(f"invalid field selector: {term!r}")
        if match[1] not in SELECTABLE_FIELDS:
            raise BadRequest(f"field label not supported: {match[1]}")
        terms.append((match[1], match[2] != "!=", match[3]))
    return lambda fields: all((fields[name] == value) == equal for name, equal, value in terms)


def label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """Equality-based terms (``a=b``, ``a==b``, ``a!=b``) and existence (``a``, ``!a``), comma-joined."""
    terms: list[tuple[str, str | None, bool]] = []  # (key, value or None for existence, wanted?)
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = LABEL_TERM.fullmatch(term)
        if match is None or (match["neg"] and match["op"]):
            raise BadRequest(f"unable to parse requirement: {term!r} (set-based selectors are not simulated)")
        wanted = not match["neg"] and match["op"] != "!="
        terms.append((match["key"], match["value"] if match["op"] else None, wanted))
    return lambda labels: all(
        ((k in labels) if v is None else (labels.get(k) == v)) == wanted for k, v, wanted in terms
    )


def rfc3339(wall_s: float) -> str:
    return datetime.fromtimestamp(math.floor(wall_s), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code: int, reason: str, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
