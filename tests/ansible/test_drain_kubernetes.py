"""The drain role's Kubernetes path: cordon with the reason in an annotation, leave a node
someone else cordoned alone, uncordon only our own. No Kubernetes API server can run on
the test machine, so kubectl is a stand-in (tests/ansible/fakes/kubectl: nodes in a JSON
file, kubectl's subcommands and errors); the README says the real cluster was not run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ansible.conftest import ROOT
from tests.ansible.drain_role import REM, run_drain_role

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
    role_vars = {
        "clockmesh_drain_scheduler": "kubernetes",
        "clockmesh_drain_kubectl": [str(FAKE)],
        "clockmesh_drain_environment": {"FAKE_KUBECTL_STATE": str(state)},
    }
    _, counts, result = run_drain_role(tmp, want, role_vars, *extra)
    return counts, result


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
