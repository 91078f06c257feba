"""``playbooks/audit.yml`` over real SSH into lab hosts running collectors: every check gets
a status, a host whose jobs would use a RoCE v1 GID and a host whose backend link is down
are flagged, the others pass; the ops box stores it and ``clockmesh audit show`` tells."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from lab import fleet
from lab.fabric import Lab
from tests.lab.helpers import opsbox_fleet

pytestmark = [pytest.mark.root, pytest.mark.lab]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_audit_flags_the_v1_host_and_the_dead_link_and_passes_the_rest(
    lab_factory: Callable[..., Lab], tmp_path: Path
) -> None:
    lab = lab_factory("a", spines=2, leaves=2, hosts_per_leaf=2)
    v1_host, dead_host = "h1-1", "h2-2"
    with opsbox_fleet(lab, tmp_path) as site:
        inv_path = fleet.opsbox_inventory(lab, site["store"], tmp_path / "inventory.yml")
        inv = yaml.safe_load(inv_path.read_text())
        # The fleet's collectors run from this checkout: the audit uses the same CLI and
        # each host's collector.yml; nccl.conf per host (the lab's hosts share /etc).
        for rack in inv["all"]["children"]["collectors"]["children"].values():
            for name, hv in rack["hosts"].items():
                conf = tmp_path / "hosts" / name / "nccl.conf"
                conf.write_text(f"NCCL_IB_GID_INDEX={2 if name == v1_host else 3}\n")
                hv.update(
                    clockmesh_audit_cli=str(BIN / "clockmesh"),
                    clockmesh_audit_config=str(tmp_path / "hosts" / name / "collector.yml"),
                    clockmesh_audit_nccl_conf=str(conf),
                )
        inv_path.write_text(yaml.safe_dump(inv))
        time.sleep(3.0)  # every collector has written its status file
        dead = lab.topology.host(dead_host)
        subprocess.run(["ip", "-n", dead.namespace, "link", "set", dead.backend_interface,
                        "down"], check=True)  # fmt: skip
        run = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inv_path), str(ROOT / "playbooks/audit.yml")],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-4000:]
        assert "changed=0" in run.stdout and "changed=1" not in run.stdout  # read-only

    show = subprocess.run([str(BIN / "clockmesh"), "audit", "show", "--json", "--store",
                           str(tmp_path / "store")], capture_output=True, text=True)  # fmt: skip
    assert show.returncode == 0, show.stderr
    checks = json.loads(show.stdout)["checks"]
    hosts = {h.name for h in lab.topology.hosts}
    assert {c["host"] for c in checks} == hosts
    assert all(c["status"] in ("pass", "fail", "skipped") and c["reason"] for c in checks)
    failed = {(c["host"], c["category"], c["check"]) for c in checks if c["status"] == "fail"}
    assert (v1_host, "backend", "gid mlx5_0/1") in failed
    assert (dead_host, "backend", "interface") in failed
    assert (dead_host, "backend", "mesh") in failed  # it answers nobody, nobody answers it
    # The others pass everything they can check: the mesh check of a live host fails only
    # for the dead host, so it is counted apart.
    for c in checks:
        if c["host"] in hosts - {v1_host, dead_host} and c["status"] == "fail":
            assert c["check"] == "mesh" and dead_host in c["reason"], c
            assert "no answer from " + dead_host == c["reason"], c
    skipped = {c["check"]: c["reason"] for c in checks if c["status"] == "skipped"}
    assert skipped["nccl_tests"] == "nccl-tests is not installed"
    assert "fake RDMA tree" in skipped["rdma_modules"]
    text = subprocess.run([str(BIN / "clockmesh"), "audit", "show", "--store",
                           str(tmp_path / "store")], capture_output=True, text=True).stdout  # fmt: skip
    assert f"{v1_host}: NCCL_IB_GID_INDEX=2" in text and "not RoCE v2" in text
