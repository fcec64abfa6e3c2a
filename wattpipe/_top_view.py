"""How ``wattpipe top`` draws a :class:`~wattpipe._top_model.Snapshot`: one rich table, GPUs, CPUs, their trees.

Each GPU is a bold row (power, energy, idle baseline and its source, sharing and attribution mode, a
sparkline of its recent watts), followed by its consumers, indented: MIG instances, pods → containers →
processes, those no pod claims, and the unattributed rest. After the GPUs, each RAPL zone type (its zones
summed, their paths named) is a bold row with its tree of CPU consumers. ``share`` is a consumer's part of
its device's active (above-idle) power this tick. Rows are sorted within each level by the chosen key.

The table fits the width it is drawn at: the name and the numbers (W, active W, J, share) are always whole;
the GPU's details (idle, sharing, attribution, recent W) follow in that order while they fit, and a line
names those left out.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from wattpipe._top_model import CpuZone, Gpu, Row, Snapshot

__all__ = ["SORTS", "History", "View", "render", "sparkline"]

_BARS = "▁▂▃▄▅▆▇█"
HISTORY_POINTS = 20

SORTS = {"w": "watts", "j": "joules", "n": "name"}
"""Key → what the rows are sorted by (watts and joules largest first, names A→Z with numbers by value; ``r`` reverses)."""


class History:
    """The last :data:`HISTORY_POINTS` watts of each GPU (by UUID) and CPU zone type (``cpu:<zone>``)."""

    def __init__(self, points: int = HISTORY_POINTS) -> None:
        self.points = points
        self.watts: dict[str, deque[float]] = {}

    def add(self, snapshot: Snapshot) -> None:
        for gpu in snapshot.gpus:
            if gpu.watts is not None:
                self.watts.setdefault(gpu.uuid, deque(maxlen=self.points)).append(gpu.watts)
        for cpu in snapshot.cpus:
            if cpu.watts is not None:
                self.watts.setdefault(cpu.key, deque(maxlen=self.points)).append(cpu.watts)


def sparkline(values: Iterable[float]) -> str:
    """One block character per value, from 0 W (lowest) to the largest value shown (highest)."""
    values = list(values)
    top = max(values, default=0.0)
    if top <= 0:
        return _BARS[0] * len(values)
    return "".join(_BARS[min(len(_BARS) - 1, int(v / top * (len(_BARS) - 1) + 0.5))] for v in values)


@dataclass
class View:
    """What the person chose: the sort key and direction; what the screen says about the source."""

    sort: str = "w"
    reverse: bool = False
    source: str = ""
    status: str = ""
    paused: bool = False
    errors: list[str] = field(default_factory=list)
    height: int | None = None  # the terminal's lines (the live view); None: every row (into a pipe or a file)
    keys: bool = True  # the line of keys: only where keys are read (the live view, not --once or a pipe)


def _number(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _joules(value: float | None) -> str:
    """Whole joules; some energy under half a joule reads ``<1``, not ``0`` (which says none)."""
    return "<1" if value is not None and 0 < value < 0.5 else _number(value, 0)


_NOTHING_ACTIVE_W = 0.05
"""Below this (shown as 0.0 W) a GPU draws nothing above idle: a share of it would be noise shown as 100 %."""


def _share(watts: float | None, active_w: float | None) -> str:
    if watts is None or active_w is None or active_w < _NOTHING_ACTIVE_W:
        return "—"
    return f"{100 * watts / active_w:.1f}%"


def _name_key(name: str) -> tuple[str | int, ...]:
    """``name`` with its runs of digits as numbers: pid 95 before 900 before 1001."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name)))


def _order(view: View) -> Callable[[Row | Gpu | CpuZone], tuple[bool, float | tuple[str | int, ...]]]:
    by = SORTS.get(view.sort, "watts")

    def key(row: Row | Gpu | CpuZone) -> tuple[bool, float | tuple[str | int, ...]]:
        if by == "name":
            if isinstance(row, CpuZone):
                return (False, _name_key(_cpu_name(row)))
            name = row.name if isinstance(row, Row) else f"{row.index or ''} {row.name or row.uuid}"
            return (False, _name_key(name or ""))
        value: float | None = getattr(row, by)
        return (value is None, -value if value is not None else 0.0)  # absent values last

    return key


def _sorted(items: list[Row], view: View) -> list[Row]:
    """Sorted by the view's key within each group: MIG instances, then pods and the rest, unattributed last."""
    rows = sorted(items, key=_order(view), reverse=view.reverse)
    group = {"instance": 0, "unattributed": 2}
    return sorted(rows, key=lambda r: group.get(r.kind, 1))  # stable: the order within a group stays


Cells = list[str | Text]
"""One table row's cells, in :data:`_COLUMNS` order (a consumer's row stops after ``share``)."""

_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("device / pod / container / process", "left"),
    ("W", "right"),
    ("active W", "right"),
    ("J", "right"),
    ("share", "right"),
    ("idle W (source)", "left"),
    ("sharing", "left"),
    ("attribution", "left"),
    ("recent W", "left"),
)
_ALWAYS = 5
"""The name and the numbers are always shown; the GPU's details after them, in order, as the width allows."""
_NAME_MIN = 22
"""The name column shrinks (with an ellipsis) down to this before a detail column is left out."""
_GAP = 2
"""Between two columns (rich's padding of one on each side)."""
_NAME_TITLES = ("device / pod / container / process", "device / pod / container", "device / pod")
"""The name column's title, the longest that fits when the column shrinks."""


def _gpu_cells(gpu: Gpu, history: History) -> Cells:
    name = f"GPU {gpu.index if gpu.index is not None else '?'} {gpu.name or gpu.uuid}"
    if gpu.up is False:
        name += " (down)"
    idle = "—" if gpu.idle_w is None else f"{gpu.idle_w:.1f} ({gpu.idle_source or 'source unknown'})"
    if gpu.idle_w is None and gpu.held_j:  # its J wait for idle: say how many (processors/_idle_hold.py)
        idle += f" ({_joules(gpu.held_j)} J held)"
    sharing = "MIG" if gpu.mig_enabled else (gpu.compute_mode or "—")
    mode = (gpu.mode or "—") + (f" ({gpu.model})" if gpu.model else "")
    trend = sparkline(history.watts.get(gpu.uuid, ()))
    return [
        Text(name, style="bold"),
        _number(gpu.watts),
        _number(gpu.active_w),
        _joules(gpu.joules),
        "",
        idle,
        sharing,
        mode,
        Text(trend, style="green"),
    ]


def _cpu_name(cpu: CpuZone) -> str:
    """``CPU package intel-rapl:0``; a type with several zones (sockets) names them all: its row is their sum."""
    return f"CPU {cpu.zone} " + (" + ".join(cpu.paths) or "(no zone series)")


def _cpu_cells(cpu: CpuZone, history: History) -> Cells:
    trend = sparkline(history.watts.get(cpu.key, ()))
    idle = _number(cpu.idle_w)
    return [
        Text(_cpu_name(cpu), style="bold"),
        _number(cpu.watts),
        _number(cpu.active_w),
        _joules(cpu.joules),
        "",
        idle,
        "—",
        "by CPU time",
        Text(trend, style="green"),
    ]


def _consumer_cells(device: Gpu | CpuZone, rows: list[Row], depth: int, view: View) -> list[tuple[Cells, str]]:
    out: list[tuple[Cells, str]] = []
    for row in _sorted(rows, view):
        label = "  " * depth + row.name
        if row.state and row.state != "running":
            label += f" ({row.state})"
        style = "dim" if row.kind == "unattributed" or row.state == "terminated" else ""
        share = _share(row.watts, device.active_w)
        out.append(([label, _number(row.watts), "", _joules(row.joules), share], style))
        out.extend(_consumer_cells(device, row.children, depth + 1, view))
    return out


def _rows(snapshot: Snapshot, history: History, view: View, budget: int | None = None) -> list[tuple[Cells, str]]:
    """The table's rows; with a ``budget`` of lines, each device keeps its row and its first consumers (in the
    view's order) and a line counting those left out, so that no device falls off the bottom of the screen."""
    devices = [
        (_gpu_cells(gpu, history), _consumer_cells(gpu, gpu.rows, 1, view))
        for gpu in sorted(snapshot.gpus, key=_order(view), reverse=view.reverse)
    ] + [  # the CPU zone types after the GPUs, as a group
        (_cpu_cells(cpu, history), _consumer_cells(cpu, cpu.rows, 1, view))
        for cpu in sorted(snapshot.cpus, key=_order(view), reverse=view.reverse)
    ]
    quota = _quota([len(consumers) for _, consumers in devices], budget)
    rows: list[tuple[Cells, str]] = []
    for cells, consumers in devices:
        rows.append((cells, "bold"))
        if len(consumers) <= quota + 1:  # one row left out would take the line that says so: shown instead
            rows.extend(consumers)
        else:
            rows.extend(consumers[:quota])
            rows.append(([f"  … {len(consumers) - quota} more rows"], "dim"))
    return rows


def _quota(sizes: list[int], budget: int | None) -> int:
    """The most consumer rows each device may show so that all of them, with their device rows and the lines
    counting what is left out, fit in ``budget`` lines (no budget: all of them)."""
    most = max(sizes, default=0)
    if budget is None:
        return most
    for quota in range(most, 0, -1):
        if sum(1 + min(n, quota + 1) for n in sizes) <= budget:  # a device's row, its rows or quota + "… more"
            return quota
    return 0


def _natural(rows: list[tuple[Cells, str]]) -> list[int]:
    """Each column's width with nothing cut: its longest cell or its title."""
    widths = [cell_len(title) for title, _ in _COLUMNS]
    for cells, _ in rows:
        for i, cell in enumerate(cells):
            widths[i] = max(widths[i], cell.cell_len if isinstance(cell, Text) else cell_len(cell))
    return widths


def _fitting(natural: list[int], width: int) -> list[int]:
    """The columns shown at ``width``: the name and the numbers, then each detail while the next still fits."""
    used = min(natural[0], _NAME_MIN) + sum(natural[1:_ALWAYS]) + _GAP * (_ALWAYS - 1)
    shown = list(range(_ALWAYS))
    for i in range(_ALWAYS, len(_COLUMNS)):
        if used + _GAP + natural[i] > width:
            break  # details keep their order: none shown after one left out
        shown.append(i)
        used += _GAP + natural[i]
    return shown


class _Fitted:
    """The table drawn for the width it is given at each refresh (a resized terminal redraws to fit)."""

    def __init__(self, rows: list[tuple[Cells, str]]) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        natural = _natural(self.rows)
        shown = _fitting(natural, width)
        rest = sum(natural[i] for i in shown[1:]) + _GAP * (len(shown) - 1)
        table = Table(expand=True, box=None, header_style="bold reverse", pad_edge=False)
        for i in shown:
            title, justify = _COLUMNS[i]
            fixed = max(_NAME_MIN, width - rest) if i == 0 and natural[0] + rest > width else None
            if fixed is not None:  # the name column shrinks: a shorter title, never a cut one
                title = next(t for t in _NAME_TITLES if cell_len(t) <= fixed)
            table.add_column(
                title,
                justify=justify,
                no_wrap=True,
                min_width=natural[i] if fixed is None else None,
                width=fixed,
                overflow="ellipsis",
            )
        for cells, style in self.rows:
            padded = cells + [""] * (len(_COLUMNS) - len(cells))
            table.add_row(*(padded[i] for i in shown), style=style)
        yield table
        hidden = [_COLUMNS[i][0] for i in range(len(_COLUMNS)) if i not in shown]
        if hidden:
            yield Text(f"not shown at {width} columns: {', '.join(hidden)} (widen the terminal)", style="dim")


def render(snapshot: Snapshot | None, history: History, view: View) -> RenderableType:
    """The whole screen: a title line, the table (or why there is none), and the keys."""
    by = SORTS.get(view.sort, "watts")
    title = Text.assemble(
        ("wattpipe top", "bold"),
        f"  {view.source}",
        f"  node {snapshot.node}" if snapshot and snapshot.node else "",
        f"  names: {snapshot.scheme}" if snapshot and snapshot.scheme else "",
        f"  sorted by {by}" + (" (reversed)" if view.reverse else ""),
        "  PAUSED" if view.paused else "",
    )
    parts: list[RenderableType] = [title]
    if view.status:
        parts.append(Text(view.status, style="yellow"))
    if snapshot is not None and (snapshot.gpus or snapshot.cpus):
        # The lines left for the table's rows: less the title, status, errors, keys, header and hidden-columns note.
        budget = None if view.height is None else view.height - 4 - bool(view.status) - len(view.errors)
        parts.append(_Fitted(_rows(snapshot, history, view, budget)))
    elif snapshot is not None and (snapshot.scheme or snapshot.node):  # a wattpipe, with nothing to show yet
        parts.append(
            Text(
                "no GPU power and no RAPL zone series (no GPU, RAPL absent or unreadable, or no tick yet): "
                "`wattpipe probe rapl` and `wattpipe probe nvml` on the node say why",
                style="yellow",
            )
        )
    elif snapshot is not None and snapshot.telemetry:
        parts.append(
            Text(
                "this is wattpipe's own telemetry (service.telemetry.listen), not its energy series: read the "
                "prometheus exporter's listen (:28282 by default)",
                style="yellow",
            )
        )
    elif snapshot is not None:
        parts.append(Text("no GPU or CPU series in the exposition (is this a wattpipe /metrics?)", style="yellow"))
    parts.extend(Text(e, style="red") for e in view.errors)
    if view.keys:
        parts.append(Text("keys: w sort by watts  j by joules  n by name  r reverse  p pause  q quit", style="dim"))
    return Group(*parts)
