"""Generate docs/metrics.md from the metric catalog (pipeline/catalog.py).

python scripts/gen_metrics_doc.py           # rewrite docs/metrics.md
python scripts/gen_metrics_doc.py --check   # exit 1 when docs/metrics.md is not what the catalog says
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere, without installing the package
    sys.path.insert(0, str(ROOT))

from wattpipe.pipeline.catalog import ATTRIBUTES, FAMILIES, NODE, Family, label_name, prometheus_name  # noqa: E402

DOC = Path("docs") / "metrics.md"

_INTRO = """\
# Metrics reference

<!-- Generated from pipeline/catalog.py by scripts/gen_metrics_doc.py; do not edit by hand. -->

Every family is named twice. The **Kepler scheme** (the Prometheus exporter's default, `naming: kepler`)
keeps Kepler's names and labels, so Kepler dashboards work unchanged, and adds what Kepler lacks: a `gpu`
label on every attributed series and the explicit unattributed remainder. The **OpenTelemetry scheme**
(`naming: otel`) uses the `hw.*` semantic conventions where they exist and the `wattpipe.*` namespace
where they do not.

- Energy is exported in joules: records carry integer millijoules, divided by 1000 at the exporter.
- Absent is not zero: a value its source could not give is not exported (no idle watts until an idle
  baseline is known), and a label whose value is unknown is left out.
- Attributed series (process, container, pod) know only their device's UUID; their `gpu` label is the
  index that the batch's device records (DeviceSample, DevicePower, DeviceTotals) give that UUID,
  remembered by the exporter so that it stays while a device is not read.
- A device label (`gpu`, `gpu_name`, `vendor`) that a device record lacks (device totals restored from
  the state file before the device's first reading) is taken from the batch's other device records.
- Attributes a record carries beyond its identity (`extra`, keys inserted or renamed by the `attributes`
  processor) are rendered too: under their name in the table below, or under their own name.
- Every series carries the node: `node_name` (Kepler) / `k8s.node.name` (OpenTelemetry).
- Prometheus with `naming: otel`: `.` and any other character Prometheus does not allow → `_` in metric
  and label names, the unit's word appended (`W` → `_watts`, `J` → `_joules`), `_total` on counters,
  `_info` on info families: `hw.power` → `hw_power_watts`, `hw.id` → `hw_id`.
- Flags and info families (`up`, `info`, attribution mode) have no unit.
"""


def _code(name: str | None) -> str:
    return f"`{name}`" if name else "—"


def _source(family: Family) -> str:
    value = f"`{family.record.__name__}.{family.value}`" if family.value else f"`{family.record.__name__}` (always 1)"
    if family.divisor != 1:
        value += f" ÷ {family.divisor}"
    where = " and ".join(f"`{k}` = `{v}`" for k, v in family.where)
    return f"{value}, where {where}" if where else value


def _label_rows(family: Family) -> Iterable[str]:
    aliases = {canonical: attribute for attribute, canonical in family.aliases}
    for attribute in (*family.labels, *family.optional, NODE.name):
        if attribute == NODE.name:
            origin = "the exporter (every series)"
        elif attribute in family.optional:
            origin = "the record's extra attributes, when it has them"
        else:
            origin = {
                "attribute": f"attribute `{aliases.get(attribute, attribute)}`",
                "field": f"field `{attribute}`",
                "device": "the batch's device records, by `device_id`",
            }[family.label_source(attribute)]
        kepler, otel = label_name(attribute, "kepler"), label_name(attribute, "otel")
        yield f"| `{attribute}` | {_code(kepler)} | {_code(otel)} | {origin} |"


def render() -> str:
    """The text of docs/metrics.md, from the catalog."""
    lines = [
        _INTRO,
        "## Attributes",
        "",
        "| attribute | Kepler label | OpenTelemetry attribute | meaning |",
        "|---|---|---|---|",
    ]
    for a in (*ATTRIBUTES, NODE):
        lines.append(f"| `{a.name}` | {_code(a.kepler)} | {_code(a.otel)} | {a.description} |")
    lines += ["", "## Families"]
    for family in FAMILIES:
        unit = f"`{family.unit}`" if family.unit else "none"
        lines += [
            "",
            f"### `{family.kepler}`",
            "",
            family.help,
            "",
            f"- {family.instrument}, unit {unit}, from {_source(family)}",
            f"- OpenTelemetry: `{family.otel}`; Prometheus with `naming: otel`: `{prometheus_name(family, 'otel')}`",
            f"- Dropped by the Prometheus exporter's `per_process: false`: {'yes' if family.kind == 'process' else 'no'}",
            "",
            "| attribute | Kepler label | OpenTelemetry attribute | from |",
            "|---|---|---|---|",
            *_label_rows(family),
        ]
    return "\n".join(lines) + "\n"


def check(root: Path = ROOT) -> str | None:
    """Why ``root``'s docs/metrics.md is stale, or ``None`` when it is current."""
    path = root / DOC
    if not path.exists():
        return f"{DOC} is missing"
    if path.read_text(encoding="utf-8") != render():
        return f"{DOC} differs from what pipeline/catalog.py says"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        problem = check()
        if problem:
            print(f"{problem}: run python scripts/gen_metrics_doc.py", file=sys.stderr)
            return 1
        print(f"{DOC} is current")
        return 0
    (ROOT / DOC).write_text(render(), encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
