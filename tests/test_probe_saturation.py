"""`wattpipe probe` says which saturation sources were found per GPU and how to enable the missing ones."""

from __future__ import annotations

import io
from pathlib import Path

from wattpipe.cli import main
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator import DcgmExporter, DcgmExporterOptions, build

SCENARIO = Path(__file__).resolve().parents[1] / "configs" / "scenarios" / "saturation.yaml"


def _probe(tmp_path: Path, extra: tuple[str, ...]) -> str:
    with build(SCENARIO, SteppedClock()) as node:
        exporter = DcgmExporter(node, DcgmExporterOptions(extra_fields=extra))
        try:
            config = tmp_path / "c.yaml"
            config.write_text(
                f"receivers:\n  dcgm:\n    endpoint: {exporter.url}\nexporters:\n  console:\n"
                "service:\n  pipelines:\n    metrics:\n      receivers: [dcgm]\n      exporters: [console]\n"
            )
            err = io.StringIO()
            assert main(["probe", "dcgm", "-c", str(config)], io.StringIO(), err) == 0
            return err.getvalue()
        finally:
            exporter.close()


def test_default_exporter_fields_name_the_missing_groups_and_how_to_enable_them(tmp_path: Path) -> None:
    text = _probe(tmp_path, ())
    lines = [line for line in text.splitlines() if line.startswith(("saturation", "  missing"))]
    assert lines[0].endswith("found memory (dcgm), xid (dcgm), dram (dcgm), pcie (dcgm)")
    assert lines[1].startswith("  missing throttle: add DCGM_FI_DEV_POWER_VIOLATION")
    assert "nvml receiver's saturation: true" in lines[1]
    assert sum(1 for line in lines if line.startswith("saturation GPU-")) == 5


def test_enabled_fields_are_found(tmp_path: Path) -> None:
    text = _probe(tmp_path, ("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"))
    assert "found throttle (dcgm), clock_events (dcgm), memory (dcgm)" in text
    assert "missing throttle" not in text
