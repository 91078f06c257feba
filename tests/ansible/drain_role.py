"""Run the clockmesh_drain role alone through ansible-playbook on localhost (the Slurm
and Kubernetes tests share it): the role's variables in, its per-node result out."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.ansible.conftest import ROOT, recap, tool_env

REM = "rem-0123456789"
NODES = [{"host": h, "node": h} for h in ("h1-1", "h1-2", "h2-1")]


def run_drain_role(
    tmp: Path, state: str, role_vars: dict[str, Any], *extra: str
) -> tuple[str, dict[str, int], list[dict[str, Any]]]:
    """(output, localhost's recap counts, clockmesh_drain_result) of one run."""
    result_file = tmp / "result.json"
    play = [{
        "name": "Drain test", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [
            {"name": "The role", "ansible.builtin.include_role": {"name": "clockmesh_drain"},
             "vars": {"clockmesh_drain_state": state, "clockmesh_drain_remediation_id": REM,
                      "clockmesh_drain_reason": "h1-1-leaf1 flapped 3 times in 10 min",
                      "clockmesh_drain_nodes": NODES, **role_vars}},
            {"name": "Result",
             "ansible.builtin.copy": {"content": "{{ clockmesh_drain_result | to_json }}",
                                      "dest": str(result_file), "mode": "0600"},
             "check_mode": False,
             "changed_when": False},  # the test's own bookkeeping: only the role's count
        ],
    }]  # fmt: skip
    book = tmp / "drain.yml"
    book.write_text(yaml.safe_dump(play, sort_keys=False))
    env = tool_env()
    env["ANSIBLE_ROLES_PATH"] = str(ROOT / "roles")
    run = subprocess.run(
        [str(Path(env["PATH"].split(os.pathsep)[0]) / "ansible-playbook"), str(book), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    return out, recap(out)["localhost"], json.loads(result_file.read_text())
