"""``wattpipe probe rapl``: the zones it sees, readable or not, their counters and ranges, then its records."""

from __future__ import annotations

import io
import json
from pathlib import Path

from tests.receivers.test_rapl import RANGE_UJ, two_socket_tree
from wattpipe.cli import main

CONFIG = """
receivers:
  rapl: {{root: "{root}"}}
exporters:
  console:
service:
  telemetry: {{listen: ""}}
  pipelines:
    metrics: {{interval: 5s, receivers: [rapl], exporters: [console]}}
"""


def probe(tmp_path: Path, root: Path) -> tuple[int, dict[str, object]]:
    cfg = tmp_path / "rapl.yaml"
    cfg.write_text(CONFIG.format(root=root))
    out, err = io.StringIO(), io.StringIO()
    code = main(["probe", "rapl", "-c", str(cfg)], out, err)
    return code, json.loads(out.getvalue())


def test_probe_rapl_shows_zones_paths_counters_ranges_and_records(tmp_path: Path) -> None:
    two_socket_tree(tmp_path / "sys")
    code, result = probe(tmp_path, tmp_path / "sys")
    assert code == 0
    sees = result["sees"]
    assert isinstance(sees, dict)
    assert sees["dropped_duplicates"] == ["intel-rapl-mmio:0"]
    assert [(z["path"], z["zone"], z["readable"], z["energy_uj"]) for z in sees["zones"]][:2] == [
        ("intel-rapl:0", "package", True, 1_000),
        ("intel-rapl:0:0", "core", True, 2_000),
    ]
    assert {z["max_energy_range_uj"] for z in sees["zones"]} == {RANGE_UJ}
    records = result["records"]
    assert isinstance(records, list)
    assert len(records) == 7
    assert records[0]["attributes"] == {"path": "intel-rapl:0", "zone": "package"}


def test_probe_rapl_says_why_there_is_nothing(tmp_path: Path) -> None:
    code, result = probe(tmp_path, tmp_path / "empty")
    assert code == 0
    sees = result["sees"]
    assert isinstance(sees, dict)
    assert sees["zones"] == []
    assert f"{tmp_path / 'empty' / 'class' / 'powercap'} does not exist" in str(sees["problem"])
    assert result["records"] == []


def test_probe_rapl_with_no_config_reads_this_machines_sys() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["probe", "rapl"], out, err) == 0
    result = json.loads(out.getvalue())
    assert result["sees"]["powercap"] == "/sys/class/powercap"
    if result["sees"]["problem"] is not None:  # this VM: no RAPL, said so, and no records
        assert "no CPU energy" in result["sees"]["problem"]
        assert result["records"] == []


def test_probe_with_no_config_names_the_installed_receiver_types() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["probe", "nosuch"], out, err) == 2
    assert "no receiver type 'nosuch'" in err.getvalue()
    assert "rapl" in err.getvalue()
