from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from collector import rdma_config, records

DATA = Path(__file__).resolve().parents[1] / "data" / "sysfs"
HOST = records.host_id("h01")


def test_gid_table_with_types_and_configfs_mode() -> None:
    root = DATA / "mlx5_roce"
    rows = rdma_config.gid_table(root, root / "sys/kernel/config", 7, HOST)
    got = [(int(r["gid_index"]), r["gid"].decode(), r["gid_type"].decode()) for r in rows]
    assert got == [
        (0, "fe80:0000:0000:0000:0e42:a1ff:fe3b:5e10", "IB/RoCE v1"),
        (1, "fe80:0000:0000:0000:0e42:a1ff:fe3b:5e10", "RoCE v2"),
        (2, "0000:0000:0000:0000:0000:ffff:c612:0102", "IB/RoCE v1"),
        (3, "0000:0000:0000:0000:0000:ffff:c612:0102", "RoCE v2"),
    ]
    assert {r["default_roce_mode"] for r in rows} == {b"RoCE v2"}
    assert {r["ndev"] for r in rows} == {b"ens1f0np0"}
    assert (rows["device"] == b"mlx5_0").all() and (rows["port"] == 1).all()


def test_configfs_not_mounted_gives_empty_mode() -> None:
    root = DATA / "rxe_no_counters"
    rows = rdma_config.gid_table(root, "/nonexistent", 7, HOST)
    assert len(rows) == 1 and rows[0]["default_roce_mode"] == b""


def test_fingerprint_ignores_time_only() -> None:
    root = DATA / "mlx5_roce"
    a = rdma_config.gid_table(root, root / "sys/kernel/config", 1, HOST)
    b = rdma_config.gid_table(root, root / "sys/kernel/config", 2, HOST)
    assert rdma_config.fingerprint(a) == rdma_config.fingerprint(b)
    b["gid_type"][3] = b"IB/RoCE v1"
    assert rdma_config.fingerprint(a) != rdma_config.fingerprint(b)


def test_nccl_conf_parsing() -> None:
    assert rdma_config.parse_nccl_conf((DATA / "mlx5_roce/etc/nccl.conf").read_text()) == 3
    assert rdma_config.parse_nccl_conf("NCCL_IB_GID_INDEX=1\n# NCCL_IB_GID_INDEX=5\n") == 1
    assert rdma_config.parse_nccl_conf("NCCL_IB_GID_INDEX=x\n") == 0  # strtoll, as NCCL
    assert rdma_config.parse_nccl_conf("NCCL_IB_GID_INDEX=\n") is None  # NCCL keeps its default
    assert rdma_config.parse_nccl_conf("NCCL_DEBUG=WARN\n") is None


def test_job_from_a_real_process_holding_uverbs(tmp_path: Path) -> None:
    dev = tmp_path / "dev/infiniband"
    dev.mkdir(parents=True)
    (dev / "uverbs0").write_bytes(b"")
    code = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
    env = dict(os.environ, NCCL_IB_GID_INDEX="1", CLOCKMESH_JOB_ID="allreduce-7")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(dev / "uverbs0")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        rows = rdma_config.job_rows(DATA / "mlx5_roce/etc/nccl.conf", 9, HOST, same_netns=True)
        by_source = {r["source"].decode(): r for r in rows}
        assert by_source["nccl.conf"]["gid_index"] == 3 and by_source["nccl.conf"]["pid"] == 0
        mine = [r for r in rows if r["pid"] == proc.pid]
        assert len(mine) == 1
        assert mine[0]["job_id"] == b"allreduce-7" and mine[0]["gid_index"] == 1
        assert mine[0]["device"] == b"uverbs0"  # no sysfs to resolve it: the file's name
        sysfs = tmp_path / "sysfs"
        ibdev = sysfs / "sys/class/infiniband_verbs/uverbs0/ibdev"
        ibdev.parent.mkdir(parents=True)
        ibdev.write_text("mlx5_0\n")
        rows = rdma_config.job_rows("/nonexistent", 9, HOST, same_netns=True, sysfs_root=sysfs)
        (mine,) = [r for r in rows if r["pid"] == proc.pid]
        assert mine["device"] == b"mlx5_0"  # the RDMA device, as the GID table names it
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.05)
    rows = rdma_config.job_rows("/nonexistent", 9, HOST)
    assert not any(r["pid"] == proc.pid for r in rows)


def test_scanner_finds_new_holders_between_full_scans(tmp_path: Path) -> None:
    dev = tmp_path / "dev/infiniband"
    dev.mkdir(parents=True)
    (dev / "uverbs0").write_bytes(b"")
    scanner = rdma_config.JobScanner(full_s=3600)
    assert not any(pid for pid, _ in scanner.scan(0.0) if pid == os.getpid())  # full scan
    code = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(dev / "uverbs0")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        found = dict(scanner.scan(1.0))  # incremental: the new pid is looked at
        assert found.get(proc.pid, "").endswith("dev/infiniband/uverbs0")
        assert proc.pid in dict(scanner.scan(2.0))  # a known holder is rechecked
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in dict(scanner.scan(3.0))


def test_scanner_rechecks_young_processes_and_old_ones_at_full_scans(tmp_path: Path) -> None:
    """A process that opens the device some seconds after it started is found by the
    next scan while it is young; one that opens it later in life by the next full scan."""
    dev = tmp_path / "dev/infiniband"
    dev.mkdir(parents=True)
    (dev / "uverbs0").write_bytes(b"")
    scanner = rdma_config.JobScanner(full_s=100.0, young_s=30.0)
    scanner.scan(0.0)  # full scan
    code = (
        "import sys; print('started', flush=True); sys.stdin.readline(); "
        "f = open(sys.argv[1]); print('open', flush=True); sys.stdin.readline()"
    )
    argv = [sys.executable, "-c", code, str(dev / "uverbs0")]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(argv, **pipes) for _ in range(2)]  # type: ignore[call-overload]
    young, old = procs
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "started"
        assert not {young.pid, old.pid} & set(dict(scanner.scan(5.0)))  # seen, not holding
        for p, t in ((young, 10.0), (old, 60.0)):
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "open"
            found = dict(scanner.scan(t))
            if p is young:  # 5 s old: rechecked, found
                assert found.get(young.pid, "").endswith("dev/infiniband/uverbs0")
            else:  # 55 s old: not rechecked until the full scan at 100 s
                assert old.pid not in found and young.pid in found
        found = dict(scanner.scan(100.0))
        assert {young.pid, old.pid} <= set(found)
    finally:
        for p in procs:
            p.kill()
            p.wait()
