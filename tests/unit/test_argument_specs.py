"""Every role's meta/argument_specs.yml mirrors its defaults/main.yml.

The argument spec is what Ansible checks inventory values against before a role
runs (a malformed variable fails there, on every host, before anything changes),
so a variable missing from it would go unchecked, and a spec entry without a
default would be a variable users cannot see.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
ROLES = sorted(p.name for p in ROLES_DIR.iterdir() if (p / "tasks" / "main.yml").is_file())
PUBLIC_VAR = re.compile(r"\b(clockmesh_[a-z]+_[a-z0-9_]*[a-z0-9])\b")
TAG_SUFFIXES = (
    "install",
    "configure",
    "run",
    "report",
)  # <role>_install etc. are tags, not variables


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _defaults(role: str) -> dict[str, Any]:
    return _yaml(ROLES_DIR / role / "defaults" / "main.yml") or {}


def _specs(role: str) -> dict[str, Any]:
    return _yaml(ROLES_DIR / role / "meta" / "argument_specs.yml")["argument_specs"]


def test_roles_found() -> None:
    assert {"clockmesh_collector", "clockmesh_opsbox"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_argument_spec_keys_equal_defaults_keys(role: str) -> None:
    defaults = set(_defaults(role))
    options = set(_specs(role)["main"]["options"])
    assert sorted(defaults - options) == [], f"{role}: in defaults/main.yml but not in the spec"
    assert sorted(options - defaults) == [], f"{role}: in the spec but not in defaults/main.yml"


@pytest.mark.parametrize("role", ROLES)
def test_spec_defaults_match_literal_defaults(role: str) -> None:
    defaults = _defaults(role)
    for name, option in _specs(role)["main"]["options"].items():
        value = defaults[name]
        assert "type" in option and "description" in option, f"{role}: {name}: type/description"
        if option.get("required"):
            continue  # default comes from an inventory-wide variable, checked at run time
        if isinstance(value, str) and "{{" in value:
            continue  # templated default: documented, resolved per host
        assert option.get("default") == value, f"{role}: {name}: spec default != defaults/main.yml"


@pytest.mark.parametrize("role", ROLES)
def test_public_variables_are_role_prefixed_and_declared(role: str) -> None:
    prefix = f"{role}_"
    defaults = set(_defaults(role))
    assert all(name.startswith(prefix) for name in defaults), f"{role}: unprefixed default"
    internal = (
        _yaml(ROLES_DIR / role / "vars" / "main.yml")
        if (ROLES_DIR / role / "vars").is_dir()
        else {}
    )
    assert all(name.startswith(f"__{prefix}") for name in internal or {}), f"{role}: vars/main.yml"
    used: set[str] = set()
    for path in (ROLES_DIR / role).rglob("*"):
        if path.suffix in {".yml", ".j2"} and "meta" not in path.parts:
            used |= {m for m in PUBLIC_VAR.findall(path.read_text()) if m.startswith(prefix)}
    used -= {prefix + tag for tag in TAG_SUFFIXES}
    undeclared = sorted(used - defaults)
    assert undeclared == [], f"{role}: used but not in defaults/main.yml: {undeclared}"


@pytest.mark.parametrize("role", ROLES)
def test_readme_documents_every_variable(role: str) -> None:
    readme = (ROLES_DIR / role / "README.md").read_text(encoding="utf-8")
    assert "## Role Variables" in readme
    missing = sorted(name for name in _defaults(role) if f"`{name}`" not in readme)
    assert missing == [], f"{role}/README.md does not document {missing}"
