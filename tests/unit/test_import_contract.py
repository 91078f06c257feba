"""Imports flow one way: tui -> analytics -> collector. The collector stays light."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "collector": ("analytics", "tui", "lab", "sklearn", "textual", "duckdb", "pyarrow", "scipy"),
    "analytics": ("tui", "textual"),
}


def _all_modules(package: str) -> list[str]:
    pkg_dir = ROOT / package
    names = [package]
    for info in pkgutil.walk_packages([str(pkg_dir)], prefix=f"{package}."):
        names.append(info.name)
    return names


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return {name.split(".")[0] for name in json.loads(out)}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_forbidden_layers(package: str) -> None:
    loaded = _loaded_after_import(_all_modules(package))
    leaked = sorted(set(FORBIDDEN[package]) & loaded)
    assert not leaked, f"importing {package} pulled in {leaked}"


def test_cli_help_does_not_import_opsbox_packages() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from clockmesh.cli import cli\n"
        "r = CliRunner().invoke(cli, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted({m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    for heavy in ("analytics", "duckdb", "sklearn", "textual"):
        assert f"'{heavy}'" not in out
