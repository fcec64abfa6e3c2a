"""``wattpipe top`` in a terminal shorter than its table: every device row stays on the screen.

Found in a review: ``wattpipe top --demo --scenario configs/scenarios/cpu.yaml`` in a 160×20 tmux pane showed the
GPU and the CPU package tree, and nothing after them: the CPU dram row, its tree and the keys line were cut off
the bottom of the screen without a word. The CPU side makes this common: every host process that used CPU time
has a row (hundreds on a busy node), after the GPUs, so on a GPU node the CPU zone types fell off first.
With the terminal's height known (the live view), each device keeps its row and its largest consumers (in the
chosen order), a dim line says how many rows of it are not shown, and the keys line stays. Into a pipe or a file
(no height) every row is printed, as before.
"""

from __future__ import annotations

import io

from rich.console import Console

from tests.top.test_cpu import CPU_KEPLER
from wattpipe._top_model import parse
from wattpipe._top_view import History, View, render


def _busy_node(extra: int) -> str:
    """CPU_KEPLER with ``extra`` more bare processes on the package zone type."""
    rows = [
        f'kepler_process_cpu_watts{{comm="worker",pid="{5000 + i}",state="running",type="regular",zone="package"}} '
        f"{0.01 * (i + 1):.2f}\n"
        for i in range(extra)
    ]
    return CPU_KEPLER + "".join(rows)


def _lines(text: str, view: View, height: int = 60) -> list[str]:
    out = io.StringIO()
    snapshot = parse(text)
    history = History()
    history.add(snapshot)
    Console(file=out, width=160, height=height, color_system=None).print(render(snapshot, history, view))
    return out.getvalue().splitlines()


def test_a_short_terminal_keeps_every_device_row_and_the_keys_and_says_what_is_left_out() -> None:
    shown = _lines(_busy_node(40), View(height=20))
    assert len(shown) <= 20
    assert any(line.startswith("CPU package intel-rapl:0 + intel-rapl:1") for line in shown)
    assert any(line.startswith("CPU dram intel-rapl:0:0") for line in shown)  # was cut off the bottom
    assert shown[-1].startswith("keys: w sort by watts")
    more = [line for line in shown if "more rows" in line]
    assert more, "the rows left out are not mentioned"
    assert "5039 worker" in "\n".join(shown)  # the largest of the extra processes (sorted by watts) is kept


def test_without_a_height_every_row_is_printed() -> None:
    shown = _lines(_busy_node(40), View())
    assert sum("worker" in line for line in shown) == 40
    assert not any("more rows" in line for line in shown)


def test_a_table_that_fits_is_unchanged() -> None:
    assert _lines(CPU_KEPLER, View(height=50)) == _lines(CPU_KEPLER, View())
