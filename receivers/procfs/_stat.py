"""The node's CPU time from ``/proc/stat``'s aggregate ``cpu`` line."""

from __future__ import annotations

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import NodeCpuTime

__all__ = ["parse_proc_stat"]

# user nice system idle iowait irq softirq steal (guest and guest_nice are already inside user and nice)
_FIELDS = 8
_IDLE, _IOWAIT = 3, 4


def parse_proc_stat(text: str, clock_ticks_per_s: int, now: Timestamp) -> NodeCpuTime:
    """``/proc/stat`` → cumulative CPU seconds of the whole node; raises ValueError when it has no ``cpu`` line."""
    total_line: list[str] | None = None
    cpus = 0
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, _, rest = line.partition(" ")
        if name == "cpu":
            total_line = rest.split()
        elif name[3:].isdigit():
            cpus += 1
    if total_line is None:
        raise ValueError("no aggregate 'cpu' line")
    if len(total_line) < 4:  # kernels before 2.5.41 wrote four fields; iowait and later are then absent
        raise ValueError(f"the 'cpu' line has {len(total_line)} fields, fewer than 4")
    try:
        ticks = [int(v) for v in total_line[:_FIELDS]]
    except ValueError:
        raise ValueError(f"a non-number on the 'cpu' line: {' '.join(total_line)[:80]!r}") from None
    total = sum(ticks)
    idle = ticks[_IDLE] + (ticks[_IOWAIT] if len(ticks) > _IOWAIT else 0)
    return NodeCpuTime(
        time=now,
        total_s=total / clock_ticks_per_s,
        active_s=(total - idle) / clock_ticks_per_s,
        cpu_count=cpus or None,
    )
