#!/usr/bin/env python3
"""Ansible inventory script: the molecule lab's inventory.yml, once create.yml built it.

Molecule links this file into its inventory before the lab exists, so it prints an
empty inventory until ``.lab/$CLOCKMESH_MOLECULE_LAB/inventory.yml`` appears.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

OVERRIDES = {
    "CLOCKMESH_WHEELHOUSE_SOURCE_DIR": "clockmesh_wheelhouse_source_dir",
    "CLOCKMESH_WHEELHOUSE_DIR": "clockmesh_wheelhouse_dir",
}


def flatten(inventory: dict[str, Any]) -> dict[str, Any]:
    """YAML inventory (nested children) -> the script format (`_meta.hostvars`)."""
    out: dict[str, Any] = {"_meta": {"hostvars": {}}}

    def walk(name: str, group: dict[str, Any]) -> None:
        group = group or {}
        entry = out.setdefault(name, {"hosts": [], "vars": {}, "children": []})
        for host, hostvars in (group.get("hosts") or {}).items():
            entry["hosts"].append(host)
            out["_meta"]["hostvars"].setdefault(host, {}).update(hostvars or {})
        entry["vars"].update(group.get("vars") or {})
        for child, sub in (group.get("children") or {}).items():
            entry["children"].append(child)
            walk(child, sub)

    for name, group in inventory.items():
        walk(name, group)
    return out


def main() -> int:
    if "--host" in sys.argv:
        print("{}")
        return 0
    project = Path(
        os.environ.get("MOLECULE_PROJECT_DIRECTORY") or Path(__file__).resolve().parents[3]
    )
    lab = os.environ.get("CLOCKMESH_MOLECULE_LAB", "molecule")
    path = project / ".lab" / lab / "inventory.yml"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
    inventory = flatten(data or {})
    # tests/ansible/test_molecule.py builds from a frozen copy of the source into a
    # private wheelhouse; by hand the role defaults (this repository) apply.
    for env, var in OVERRIDES.items():
        if os.environ.get(env) and "all" in inventory:
            inventory["all"]["vars"][var] = os.environ[env]
    print(json.dumps(inventory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
