"""The wheel ships every package and the default configs (issue 16).

pyproject.toml lists its packages by name; a package folder added without a line there would be missing
from the wheel. Everything installs under ``wattpipe``: the repository's top-level folders are reached
through relative symlinks in ``wattpipe/``.
The wheel itself is built, installed into a fresh virtualenv and run by .ci/run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("pipeline", "receivers", "processors", "exporters", "simulator")


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {
        ".".join(["wattpipe", *init.parent.relative_to(ROOT).parts]).removeprefix("wattpipe.wattpipe") or "wattpipe"
        for top in (*LINKED, "wattpipe")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert {"wattpipe", "wattpipe.pipeline.proto.podresources.v1", "wattpipe.receivers.nvml"} <= folders
    assert set(setuptools["packages"]) == folders | {"wattpipe.configs", "wattpipe.configs.scenarios"}
    assert "package-dir" not in setuptools


def test_every_top_level_folder_is_linked_under_the_wattpipe_package() -> None:
    for name in (*LINKED, "configs"):
        link = ROOT / "wattpipe" / name
        assert link.is_symlink(), f"wattpipe/{name} should be a symlink to ../{name}"
        assert link.readlink() == Path("..") / name, "relative, so it survives a move of the checkout"
    assert sorted(p.name for p in (ROOT / "wattpipe").iterdir() if p.is_symlink()) == sorted((*LINKED, "configs"))


def test_modules_load_once_under_their_installed_names() -> None:
    import sys

    import wattpipe.pipeline.records  # noqa: F401

    assert "pipeline" not in sys.modules, "something imported a layer by its bare folder name"
    assert "pipeline.records" not in sys.modules


def test_the_cli_finds_the_demo_configs() -> None:
    from wattpipe import cli

    assert cli.DEMO_CONFIG.is_file()
    assert cli.DEMO_SCENARIO.is_file()
    assert {p.name for p in (ROOT / "configs" / "scenarios").glob("*.yaml")} >= {"demo.yaml", "mig.yaml"}
