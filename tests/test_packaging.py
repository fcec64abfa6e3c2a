"""The wheel ships every package and the default configs (issue 16).

pyproject.toml lists its packages by name (configs/ is mapped into the wattpipe package, which a search
for packages cannot do); a package folder added without a line there would be missing from the wheel.
The wheel itself is built, installed into a fresh virtualenv and run by .ci/run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("pipeline", "receivers", "processors", "exporters", "simulator", "wattpipe")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert folders
    assert set(setuptools["packages"]) == folders | {"wattpipe.configs", "wattpipe.configs.scenarios"}
    assert setuptools["package-dir"] == {"wattpipe.configs": "configs"}


def test_the_cli_finds_the_demo_configs() -> None:
    from wattpipe import cli

    assert cli.DEMO_CONFIG.is_file()
    assert cli.DEMO_SCENARIO.is_file()
    assert {p.name for p in (ROOT / "configs" / "scenarios").glob("*.yaml")} >= {"demo.yaml", "mig.yaml"}
