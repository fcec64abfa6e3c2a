"""Which scrape first saw a dcgm-exporter collection, and so roughly when that collection happened.

dcgm-exporter prints no timestamps. It collects every ``-c`` milliseconds (30 s by default) and answers
every scrape with its last collection, so most scrapes repeat the previous answer. The only sign of a new
collection is that a GPU's values changed since the previous answer. The collection then happened after
the previous successful scrape and by this one: its time is known to within one scrape interval. The
board's energy counter is printed on every row and moves whenever the GPU draws power, so in practice
every new collection differs from the one before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # _parse uses Collection
    from wattpipe.receivers.dcgm._parse import Series

__all__ = ["Collection", "CollectionTracker"]

_Print = frozenset[tuple[str, int, float]]  # (field, GPU_I_ID or -1, value): one GPU's whole answer


@dataclass(frozen=True, slots=True)
class Collection:
    """A GPU's new collection: it happened in ``(after_s, by_s]`` (monotonic seconds)."""

    after_s: float
    by_s: float


class CollectionTracker:
    """Remembers each GPU's last answer and says which GPUs' answers are new collections."""

    def __init__(self) -> None:
        self._prints: dict[str, _Print] = {}
        self._last_s: float | None = None  # the last scrape that was answered

    def observe(self, series: Iterable[Series], now_s: float) -> dict[str, Collection]:
        """The GPUs (by UUID) whose values changed since the last answered scrape.

        The first answer says nothing (a repeat cannot be told from a new collection yet). A GPU missing
        from an answer is forgotten, so memory stays bounded by the GPUs in one answer.
        """
        rows: dict[str, set[tuple[str, int, float]]] = {}
        for s in series:
            gi = -1 if s.gpu_instance_id is None else s.gpu_instance_id
            rows.setdefault(s.uuid, set()).add((s.field, gi, s.value))
        prints = {uuid: frozenset(values) for uuid, values in rows.items()}
        new: dict[str, Collection] = {}
        if self._last_s is not None:
            for uuid, fingerprint in prints.items():
                before = self._prints.get(uuid)
                if before is not None and before != fingerprint:
                    new[uuid] = Collection(self._last_s, now_s)
        self._prints = prints
        self._last_s = now_s
        return new
