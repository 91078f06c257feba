"""The host audit's RDMA checks on a fake sysfs tree, and `clockmesh audit record/show`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from analytics.audit.cli import audit
from collector.audit import AuditArgs, _rdma
from lab import fake_rdma


def _tree(tmp_path: Path) -> Path:
    return fake_rdma.write_tree(tmp_path / "sysfs", "h1-1", "bk0", "198.18.1.1")


def _gid(checks: list) -> object:
    (c,) = [c for c in checks if c.check.startswith("gid ")]
    return c


def test_gid_index_v2_passes_v1_fails_naming_the_v2_indices(tmp_path: Path) -> None:
    root, conf = _tree(tmp_path), tmp_path / "nccl.conf"
    conf.write_text("# site default\nNCCL_IB_GID_INDEX=3\n")
    c = _gid(_rdma(AuditArgs(sysfs_root=str(root), nccl_conf=str(conf), lab=True)))
    assert (c.status, c.value) == ("pass", "3")
    conf.write_text("NCCL_IB_GID_INDEX=2\n")
    c = _gid(_rdma(AuditArgs(sysfs_root=str(root), nccl_conf=str(conf))))
    assert c.status == "fail" and "IB/RoCE v1, not RoCE v2; RoCE v2 indices here: 1, 3" in c.reason


def test_unset_index_is_judged_by_the_installed_nccl_version(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    libs = tmp_path / "lib"
    libs.mkdir()
    args = AuditArgs(sysfs_root=str(root), nccl_conf=str(tmp_path / "absent.conf"),
                     lib_dirs=(str(libs),))  # fmt: skip
    c = _gid(_rdma(args))  # no NCCL here: the index depends on the version a job brings
    assert c.status == "skipped" and "unset" in c.reason and "IB/RoCE v1 here" in c.reason
    (libs / "libnccl.so.2.18.3").write_bytes(b"")
    c = _gid(_rdma(args))
    assert c.status == "fail" and "NCCL 2.18.3 (before 2.21) uses index 0" in c.reason
    (libs / "libnccl.so.2.18.3").unlink()
    (libs / "libnccl.so.2.23.4").write_bytes(b"")
    (libs / "libnccl.so.2").write_bytes(b"")  # the soname link: no version of its own
    c = _gid(_rdma(args))
    assert (c.status, c.value) == ("pass", "3"), c
    assert "NCCL 2.23.4 selects index 3 by default: RoCE v2" in c.reason


def test_no_rdma_devices_is_skipped_not_passed(tmp_path: Path) -> None:
    (c,) = _rdma(AuditArgs(sysfs_root=str(tmp_path)))
    assert (c.check, c.status) == ("rdma_devices", "skipped")


def test_record_and_show(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    results = {
        "h1": [{"category": "backend", "check": "mtu", "status": "pass", "reason": "ok", "value": "9000"}],
        "h2": [{"category": "backend", "check": "mtu", "status": "fail", "reason": "at least 4200", "value": "1500"}],
    }  # fmt: skip
    res = CliRunner().invoke(
        audit, ["record", "--store", str(store), "--results", json.dumps(results)]
    )
    assert res.exit_code == 0, res.output
    assert "2 host(s), 1 pass, 1 fail, 0 skipped" in res.output
    shown = CliRunner().invoke(audit, ["show", "--store", str(store)])
    assert (
        "FAIL    mtu: 1 pass, 1 fail" in shown.output and "h2: at least 4200 [1500]" in shown.output
    )


def test_bad_results_and_empty_store_are_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    res = CliRunner().invoke(audit, ["record", "--store", str(store), "--results",
                                     '{"h1": [{"category": "x", "check": "y", "status": "ok", "reason": ""}]}'])  # fmt: skip
    assert res.exit_code == 1 and "status 'ok': expected pass, fail or skipped" in res.output
    assert not (store / "fleet_audit").exists()
    res = CliRunner().invoke(audit, ["show", "--store", str(store)])
    assert res.exit_code == 1 and "no fleet audit yet" in res.output


def test_collector_gids_recommends_the_routable_v2_gid_and_reads_nccl_conf(tmp_path: Path) -> None:
    import yaml

    from collector.cli import collector

    root = fake_rdma.write_tree(tmp_path / "sysfs", "h1-1", "bk0", "198.18.1.1")
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_IB_GID_INDEX=0\n")
    cfg = {"host": "h1-1", "backend": {"address": "198.18.1.1", "interface": "bk0"},
           "ingest": {"url": "http://127.0.0.1:1"}, "counters": {"sysfs_root": str(root)},
           "rdma": {"configfs_root": f"{root}/sys/kernel/config", "nccl_conf": str(conf),
                    "pyverbs": False}}  # fmt: skip
    path = tmp_path / "collector.yml"
    path.write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(collector, ["gids", "--json", "--config", str(path)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["recommended"]["index"] == 3 and doc["recommended"]["type"] == "RoCE v2"
    assert doc["nccl_conf_index"] == 0 and len(doc["gids"]) == 4
    bad = CliRunner().invoke(collector, ["gids", "--config", str(tmp_path / "missing.yml")])
    assert bad.exit_code == 2 and "missing.yml" in bad.output
