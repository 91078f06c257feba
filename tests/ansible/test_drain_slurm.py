"""The drain role against a real Slurm controller (Debian's slurm-wlm, one node answering).

munged, slurmctld and one slurmd run in a temporary directory on their own ports
(lab/slurm.py); the role runs through ansible-playbook on localhost. Node h1-1 has a
slurmd (a node in service), h1-2 is drained by "someone else" before the test (a bad GPU),
h2-1 never answers. Everything started is stopped by its pid file, even on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.slurm import SlurmCluster, missing_tools
from tests.ansible.conftest import ROOT, recap, tool_env
from tests.ansible.drain_role import REM, run_drain_role

pytestmark = pytest.mark.root


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        pytest.skip("needs root (slurmctld runs as SlurmUser root here)")
    if missing_tools():
        pytest.skip(f"not installed: {', '.join(missing_tools())} (make deps installs them)")
    s = SlurmCluster(tmp_path / "slurm")
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _play(
    slurm: SlurmCluster, tmp: Path, state: str, *extra: str
) -> tuple[str, dict[str, int], list]:
    env = {"SLURM_CONF": str(slurm.conf)}
    return run_drain_role(tmp, state, {"clockmesh_drain_environment": env}, *extra)


def test_drain_leaves_others_drains_alone_and_undo_resumes_only_its_own(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    before = {n: slurm.node(n) for n in ("h1-1", "h1-2", "h2-1")}
    assert before == {"h1-1": (False, ""), "h1-2": (True, "bad GPU 3"), "h2-1": (False, "")}

    _, counts, result = _play(slurm, tmp_path, "drained", "--check")  # preview: nothing moves
    assert {n: slurm.node(n) for n in before} == before
    assert {r["node"]: r["action"] for r in result} == {
        "h1-1": "drain", "h1-2": "left_alone", "h2-1": "drain"
    }  # fmt: skip

    _, counts, result = _play(slurm, tmp_path, "drained")
    assert counts["changed"] >= 1 and counts["failed"] == 0
    for n in ("h1-1", "h2-1"):
        assert slurm.node(n) == (True, f"clockmesh:{REM}: h1-1-leaf1 flapped 3 times in 10 min")
    assert slurm.node("h1-2") == before["h1-2"]  # someone else's drain: untouched

    _, counts, result = _play(slurm, tmp_path, "drained")  # again: nothing to do
    assert counts["changed"] == 0
    assert {r["node"]: r["action"] for r in result} == {
        "h1-1": "already", "h1-2": "left_alone", "h2-1": "already"
    }  # fmt: skip

    _, counts, result = _play(slurm, tmp_path, "resumed")  # the undo
    assert {r["node"]: r["action"] for r in result} == {
        "h1-1": "resume", "h1-2": "left_alone", "h2-1": "resume"
    }  # fmt: skip
    after = {n: slurm.node(n) for n in before}
    assert after == before, (before, after)  # h1-2 still drained for its bad GPU


def test_remediate_playbook_drains_a_flapping_hosts_node_records_it_and_undo_resumes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """remediate.yml end to end on a host-link flap anomaly in a real store: preflight,
    check-mode preview, real drain in Slurm, the record, a no-op re-run, and the resume by
    `clockmesh remediate restore` only once the host's link has been stable."""
    import yaml

    from analytics.remediate import records
    from tests.unit.test_remediate_plan import _anomaly, _topology_racks

    store = tmp_path / "store"
    store.mkdir()
    _anomaly(store, "flapping-h11", "flapping_link", "h1-1-leaf1")
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(_topology_racks(hosts_per_rack=2, racks=2)))
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {
            "opsbox": {"hosts": {"ops": {
                "clockmesh_ops_cli": str(Path(sys.executable).parent / "clockmesh"),
                "clockmesh_ops_store_dir": str(store), "clockmesh_ops_topology_file": str(topo),
            }}},
            "collectors": {"hosts": {h: {} for h in ("h1-1", "h1-2", "h2-1", "h2-2")}},
            "scheduler": {"hosts": {"slurmctl": {
                "clockmesh_scheduler_environment": {"SLURM_CONF": str(slurm.conf)},
            }}},
        },
    }}))  # fmt: skip
    env = tool_env()

    def play(book: str, *extra: str) -> dict[str, dict[str, int]]:
        run = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv),
             str(ROOT / "playbooks" / book), *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        return recap(run.stdout)

    before = {n: slurm.node(n) for n in ("h1-1", "h1-2")}
    play("remediate.yml", "-e", "anomaly_id=flapping-h11", "--check", "--diff")
    assert {n: slurm.node(n) for n in before} == before  # the preview touched nothing

    counts = play("remediate.yml", "-e", "anomaly_id=flapping-h11")
    assert counts["slurmctl"]["changed"] == 1
    (rem,) = [r for r in records.active(store) if r.action == "host_drain"]
    assert rem.target == "h1-1" and rem.status == "ok"
    drained, reason = slurm.node("h1-1")
    assert drained and reason.startswith(f"clockmesh:{rem.remediation_id}: flapping-h11")
    assert slurm.node("h1-2") == before["h1-2"]  # drained by someone else, untouched

    assert play("remediate.yml", "-e", "anomaly_id=flapping-h11")["slurmctl"]["changed"] == 0

    # Restore once stable, from the host's own counters in the store (its collector keeps
    # shipping while the node is drained): one sample a second for two minutes, the last
    # carrier loss 50 s ago.
    from tests.unit.test_remediate_stable import _counters

    _counters(store, "h1-1", time.time_ns(), 120, loss_at_s=[50])

    def restore(after_s: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(Path(sys.executable).parent / "clockmesh"), "remediate", "restore", "--store",
             str(store), "-i", str(inv), "--after", str(after_s), "--yes"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    early = restore(90)
    assert early.returncode == 0, early.stdout[-3000:] + early.stderr
    assert f"left out  {rem.remediation_id} host_drain h1-1: h1-1-leaf1: h1-1 lost carrier" in (
        early.stdout
    ), early.stdout[-3000:]
    assert slurm.node("h1-1") == (drained, reason), "resumed while its link was not stable"

    _counters(store, "h1-1", time.time_ns(), 20, loss_at_s=[])  # the collector, still quiet
    back = restore(30)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr
    assert f"restored  {rem.remediation_id} host_drain h1-1" in back.stdout, back.stdout[-3000:]
    assert {n: slurm.node(n) for n in before} == before
    assert not [r for r in records.active(store) if r.action == "host_drain"]
