"""Benchmark: how close wattpipe's attribution comes to the truth on every shipped scenario (issue 15).

    .venv/bin/python benchmarks/accuracy.py [--duration 5m] [--scenario FILE]... [--config FILE]
                                            [--json | --markdown] [--reports DIR]

Each scenario (every ``configs/scenarios/*.yaml`` unless ``--scenario`` names some) runs through
``wattpipe simulate --report`` in this process, on the stepped clock, with the default pipeline
(configs/demo.yaml) or ``--config``. One row per scenario, from the report's numbers:

- **process / container / pod**: the worst relative error, sign kept, of attributed energy against what
  could have been attributed: the true energy less the true energy inside ticks wattpipe declared it
  could not split (an outage's gap, a failed process listing), as in the simulate report. Only entities
  with at least ``FLOOR_J`` (1 J) of such energy count: below it a relative error divides by ~0.
- **stray**: the joules billed to processes below that floor (a context held at 0 % utilisation is
  truly worth 0 J of active energy; whatever it is billed is error).
- **idle**: the largest |learned − true| idle power over the GPUs, in W; ``absent`` where a GPU's idle
  was never learned (then all its energy counted as active).
- **residual**: the largest |counter − idle − attributed − unattributed − held| over the GPUs, in J
  (conservation: 0).
- **unattributed**: the joules left explicitly unattributed, summed over the GPUs.
- **held**: energy measured but not yet split when the run ended (MIG: it waits for dcgm-exporter's next
  collection; elsewhere for idle to be known), summed over the GPUs; the processes that used it are short of it.

``--json`` prints the same as one JSON document; ``--markdown`` the table for docs/accuracy.md.
Exit status 1 when a scenario could not run (its row says why).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from wattpipe.cli import main as wattpipe_main
from wattpipe.pipeline.config import parse_duration

__all__ = ["FLOOR_J", "Failed", "Score", "Worst", "main", "run_scenario", "score", "scoreboard"]

SCENARIOS = Path(__file__).resolve().parents[1] / "configs" / "scenarios"
FLOOR_J = 1.0  # entities with less attributable true energy than this get no relative error


@dataclass(frozen=True, slots=True)
class Worst:
    """The entity of one kind whose attributed energy is furthest from the truth, relatively."""

    name: str  # "pid 4242", "ml/trainer-0/main", "ml/trainer-0"
    error: float  # (attributed − attributable) / attributable; signed, 0.05 = 5 % too much
    attributed_j: float
    attributable_j: float  # true_j − true_unattributable_j
    counted: int  # entities of this kind at or above the floor


@dataclass(frozen=True, slots=True)
class Score:
    """One scenario's row."""

    scenario: str
    simulated_s: float
    ticks: int
    gpus: int
    process: Worst | None  # None: no entity of the kind at or above the floor
    container: Worst | None
    pod: Worst | None
    stray_j: float  # billed to processes whose attributable true energy is below the floor
    idle_error_w: float | None  # max over the GPUs whose idle was learned; None: none was
    idle_absent: int  # GPUs whose idle was never learned
    residual_j: float  # max |residual| over the GPUs
    residual_rel: float  # max |residual| / counter over the GPUs
    unattributed_j: float
    held_j: float  # MIG energy measured but not yet split when the run ended (its processes are short of it)
    wall_s: float  # how long the simulation took here


@dataclass(frozen=True, slots=True)
class Failed:
    """A scenario that could not run, and why."""

    scenario: str
    message: str


def _worst(rows: list[dict[str, Any]], name_of: Callable[[dict[str, Any]], str]) -> Worst | None:
    worst: Worst | None = None
    counted = 0
    for row in rows:
        attributable_j = row["true_j"] - row["true_unattributable_j"]
        if attributable_j < FLOOR_J:
            continue
        counted += 1
        error = (row["attributed_j"] - attributable_j) / attributable_j
        if worst is None or abs(error) > abs(worst.error):
            worst = Worst(name_of(row), error, row["attributed_j"], attributable_j, 0)
    return None if worst is None else dataclasses.replace(worst, counted=counted)


def score(scenario: str, report: dict[str, Any], wall_s: float = 0.0) -> Score:
    """The scoreboard's row for one ``wattpipe simulate --report`` document."""
    devices = report["devices"]
    learned = [abs(d["detected_idle_w"] - d["true_idle_w"]) for d in devices if d["detected_idle_w"] is not None]
    residuals = [abs(d["residual_j"]) for d in devices]
    return Score(
        scenario=scenario,
        simulated_s=report["simulated_s"],
        ticks=report["ticks"],
        gpus=len(devices),
        process=_worst(report["processes"], lambda r: f"pid {r['pid']}"),
        container=_worst(report["containers"], lambda r: f"{r['namespace']}/{r['pod']}/{r['name']}"),
        pod=_worst(report["pods"], lambda r: f"{r['namespace']}/{r['name']}"),
        stray_j=sum(
            p["attributed_j"] for p in report["processes"] if p["true_j"] - p["true_unattributable_j"] < FLOOR_J
        ),
        idle_error_w=max(learned) if learned else None,
        idle_absent=len(devices) - len(learned),
        residual_j=max(residuals, default=0.0),
        residual_rel=max((abs(d["residual_j"]) / d["counter_j"] for d in devices if d["counter_j"]), default=0.0),
        unattributed_j=sum(d["unattributed_j"] for d in devices),
        held_j=sum(d.get("held_j", 0.0) for d in devices),
        wall_s=wall_s,
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The console exporter prints every tick to stdout: as JSON lines (cheaper than tables), to nowhere.
    The fault scenarios log errors by design (a GPU lost): those go to nowhere too, and the root logger
    that ``simulate`` reconfigures is put back as it was."""
    previous = os.environ.get("WATTPIPE_CONSOLE_FORMAT")
    handlers, level = logging.root.handlers[:], logging.root.level
    os.environ["WATTPIPE_CONSOLE_FORMAT"] = "json"
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
            yield
    finally:
        logging.root.handlers[:] = handlers
        logging.root.setLevel(level)
        if previous is None:
            os.environ.pop("WATTPIPE_CONSOLE_FORMAT", None)
        else:
            os.environ["WATTPIPE_CONSOLE_FORMAT"] = previous


def run_scenario(scenario: Path, duration_s: float, report_path: Path, config: Path | None = None) -> dict[str, Any]:
    """``wattpipe simulate --scenario S --duration D --report R`` in this process; the report it wrote.

    Raises RuntimeError with the command's own error output when it does not exit 0."""
    argv = ["simulate", "--scenario", str(scenario), "--duration", f"{duration_s:g}s", "--report", str(report_path),
            "--log-level", "error"]  # fmt: skip
    if config is not None:
        argv += ["-c", str(config)]
    err = io.StringIO()
    with _quiet():
        code = wattpipe_main(argv, io.StringIO(), err)
    if code != 0:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        raise RuntimeError(f"wattpipe simulate exited {code}: " + " / ".join(lines[-3:]))
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def scoreboard(
    scenarios: Sequence[Path], duration_s: float, config: Path | None = None, reports: Path | None = None
) -> list[Score | Failed]:
    """Every scenario through ``wattpipe simulate``, scored; each report kept under ``reports`` if given."""
    rows: list[Score | Failed] = []
    with tempfile.TemporaryDirectory(prefix="wattpipe-accuracy-") as tmp:
        where = reports if reports is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for scenario in scenarios:
            started = time.perf_counter()
            try:
                report = run_scenario(scenario, duration_s, where / f"{scenario.stem}.json", config)
            except RuntimeError as exc:
                rows.append(Failed(scenario.stem, str(exc)))
                continue
            except Exception as exc:  # a crash in one scenario must not hide the others' numbers
                rows.append(Failed(scenario.stem, f"{type(exc).__name__}: {exc}"))
                continue
            rows.append(score(scenario.stem, report, time.perf_counter() - started))
    return rows


# --- output ---------------------------------------------------------------------------------------

HEADERS = ("scenario", "GPUs", "worst process", "worst container", "worst pod", "stray J", "idle error",
           "residual J", "unattributed J", "held J")  # fmt: skip


def _pct(worst: Worst | None) -> str:
    return "—" if worst is None else f"{worst.error * 100:+.2f} % ({worst.name})"


def _idle(row: Score) -> str:
    if row.idle_error_w is None:
        return "absent"
    text = f"{row.idle_error_w:.1f} W"
    return text if not row.idle_absent else f"{text}, absent on {row.idle_absent} of {row.gpus}"


def _cells(row: Score | Failed) -> list[str]:
    if isinstance(row, Failed):
        return [row.scenario, "", "failed (below)", *[""] * (len(HEADERS) - 3)]
    return [
        row.scenario,
        str(row.gpus),
        _pct(row.process),
        _pct(row.container),
        _pct(row.pod),
        f"{row.stray_j:,.1f}",
        _idle(row),
        f"{row.residual_j:g}",
        f"{row.unattributed_j:,.1f}",
        f"{row.held_j:,.1f}",
    ]


def legend(duration_s: float) -> str:
    return (
        f"{duration_s:g} s of node time per scenario. Errors: (attributed − true) / true energy of the entity\n"
        f"furthest from the truth; only entities with at least {FLOOR_J:g} J of true energy count. stray J: billed\n"
        "to processes under that floor. idle error: max |learned − true| idle power over the GPUs (absent: never\n"
        "learned). residual: max |counter − idle − attributed − unattributed − held| over the GPUs. held J:\n"
        "energy not yet split when the run ended (MIG, or idle not known yet; its processes are short of it).\n"
    )


def render_table(rows: Sequence[Score | Failed], duration_s: float, width: int = 200) -> str:
    table = Table(*HEADERS, box=None, pad_edge=False)
    for column in table.columns[1:]:
        column.justify = "right"
    for row in rows:
        table.add_row(*_cells(row))
    buffer = io.StringIO()
    Console(file=buffer, width=width, force_terminal=False, color_system=None).print(table)
    failures = "".join(f"{r.scenario}: {r.message}\n" for r in rows if isinstance(r, Failed))
    return buffer.getvalue() + "\n" + legend(duration_s) + ("\n" + failures if failures else "")


def render_markdown(rows: Sequence[Score | Failed]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = _cells(row)
        if isinstance(row, Failed):
            cells[2] = "failed: " + row.message
        cells = [cell.replace("|", "\\|") for cell in cells]
        cells[0] = f"`{cells[0]}`"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_json(rows: Sequence[Score | Failed], duration_s: float, config: Path | None) -> dict[str, Any]:
    return {
        "duration_s": duration_s,
        "floor_j": FLOOR_J,
        "config": str(config) if config is not None else None,
        "scenarios": [
            {"scenario": r.scenario, "failed": r.message} if isinstance(r, Failed) else dataclasses.asdict(r)
            for r in rows
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=parse_duration, default=300.0, help="node time per scenario (default 5m)")
    parser.add_argument("--scenario", type=Path, action="append", help="a scenario file (repeatable; default: all)")
    parser.add_argument("-c", "--config", type=Path, default=None, help="pipeline (default: configs/demo.yaml)")
    parser.add_argument("--reports", type=Path, default=None, help="keep each scenario's report JSON in this folder")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print one JSON document")
    output.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    scenarios = args.scenario or sorted(SCENARIOS.glob("*.yaml"), key=lambda path: path.stem)
    rows = scoreboard(scenarios, args.duration, args.config, args.reports)
    if args.json:
        print(json.dumps(to_json(rows, args.duration, args.config), indent=2))
    elif args.markdown:
        print(render_markdown(rows), end="")
    else:
        print(render_table(rows, args.duration), end="")
    return 1 if any(isinstance(r, Failed) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
