"""The drain role's Kubernetes path: cordon with the reason in an annotation, leave a node
someone else cordoned alone, uncordon only our own. No Kubernetes API server can run on
the test machine, so kubectl is a stand-in (tests/ansible/fakes/kubectl: nodes in a JSON
file, kubectl's subcommands and errors); the README says the real cluster was not run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.ansible.conftest import ROOT, recap, tool_env

REM = "rem-0123456789"
KEY = "clockmesh.io/drain-reason"
FAKE = ROOT / "tests" / "ansible" / "fakes" / "kubectl"
MUTATING = ("cordon", "uncordon", "annotate")


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    state = tmp_path / "nodes.json"
    state.write_text(json.dumps({
        "h1-1": {"unschedulable": False, "annotations": {}},
        "h1-2": {"unschedulable": True, "annotations": {"ops/why": "bad GPU 3"}},
        "h2-1": {"unschedulable": False, "annotations": {}},
    }))  # fmt: skip
    return state


def _nodes(state: Path) -> dict[str, tuple[bool, str]]:
    data = json.loads(state.read_text())
    return {n: (v["unschedulable"], v["annotations"].get(KEY, "")) for n, v in data.items()}


def _calls(state: Path) -> list[list[str]]:
    log = Path(str(state) + ".log")
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def _play(state: Path, tmp: Path, want: str, *extra: str) -> tuple[dict[str, int], list]:
    book = tmp / "drain.yml"
    book.write_text(
        f"""---
- name: Drain test
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The role
      ansible.builtin.include_role:
        name: clockmesh_drain
      vars:
        clockmesh_drain_scheduler: kubernetes
        clockmesh_drain_kubectl: ["{FAKE}"]
        clockmesh_drain_state: {want}
        clockmesh_drain_remediation_id: {REM}
        clockmesh_drain_reason: "h1-1-leaf1 flapped 3 times in 10 min"
        clockmesh_drain_environment:
          FAKE_KUBECTL_STATE: "{state}"
        clockmesh_drain_nodes:
          - {{host: h1-1, node: h1-1}}
          - {{host: h1-2, node: h1-2}}
          - {{host: h2-1, node: h2-1}}
    - name: Result
      ansible.builtin.copy:
        content: "{{{{ clockmesh_drain_result | to_json }}}}"
        dest: "{tmp / "result.json"}"
        mode: "0600"
      check_mode: false
      changed_when: false  # the test's own bookkeeping: only the role's changes count
"""
    )
    env = tool_env()
    env["ANSIBLE_ROLES_PATH"] = str(ROOT / "roles")
    run = subprocess.run(
        [str(Path(env["PATH"].split(os.pathsep)[0]) / "ansible-playbook"), str(book), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return recap(run.stdout)["localhost"], json.loads((tmp / "result.json").read_text())


def test_cordon_leaves_others_alone_and_uncordon_only_its_own(
    cluster: Path, tmp_path: Path
) -> None:
    before = _nodes(cluster)
    counts, result = _play(cluster, tmp_path, "drained", "--check")  # preview
    assert _nodes(cluster) == before
    assert not [c for c in _calls(cluster) if c[0] in MUTATING], "check mode changed a node"
    assert {r["node"]: r["action"] for r in result} == {
        "h1-1": "drain", "h1-2": "left_alone", "h2-1": "drain"
    }  # fmt: skip

    counts, result = _play(cluster, tmp_path, "drained")
    assert counts["changed"] >= 1 and counts["failed"] == 0
    reason = f"clockmesh:{REM}: h1-1-leaf1 flapped 3 times in 10 min"
    assert _nodes(cluster) == {"h1-1": (True, reason), "h1-2": before["h1-2"],
                               "h2-1": (True, reason)}  # fmt: skip
    assert json.loads(cluster.read_text())["h1-2"]["annotations"] == {"ops/why": "bad GPU 3"}

    counts, result = _play(cluster, tmp_path, "drained")  # again: nothing to do
    assert counts["changed"] == 0
    assert {r["node"]: r["action"] for r in result} == {
        "h1-1": "already", "h1-2": "left_alone", "h2-1": "already"
    }  # fmt: skip

    counts, result = _play(cluster, tmp_path, "resumed")  # the undo
    assert {r["node"]: r["action"] for r in result} == {
        "h1-1": "resume", "h1-2": "left_alone", "h2-1": "resume"
    }  # fmt: skip
    assert _nodes(cluster) == before  # h1-2 still cordoned for its bad GPU
