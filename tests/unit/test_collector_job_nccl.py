"""A job's NCCL version, settings, GID index and QP limit, from recorded /proc-like trees
(and one real process), resolved the way NCCL of that version resolves them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from collector import job_nccl, rdma_config, records
from collector.job_nccl import From, GidRule, VersionFrom
from collector.record_buffer import RecordBuffer
from lab import fake_rdma

PID = 4242


def _proc(
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    maps: list[str] = (),  # type: ignore[assignment]
    home_conf: str | None = None,
    etc_conf: str | None = None,
    files: dict[str, str | bytes] | None = None,
) -> job_nccl.ProcessView:
    """A recorded /proc/PID: environ, maps, status (uid 1000), and its root with
    /etc/passwd (1000 -> /home/u), ~/.nccl.conf and other files."""
    base = tmp_path / "proc" / str(PID)
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    (base / "cwd").mkdir()
    (base / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in
                                            (env or {}).items()))  # fmt: skip
    lines = [f"7f00{i:08x}-7f01{i:08x} r-xp 00000000 08:01 {100 + i} {p}"
             for i, p in enumerate(maps)]  # fmt: skip
    (base / "maps").write_text("\n".join([*lines, "7ffd0000-7ffd1000 rw-p 0 00:00 0 [stack]"]))
    (base / "status").write_text("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nGid:\t0\n")
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\n")
    if home_conf is not None:
        (root / "home/u").mkdir(parents=True)
        (root / "home/u/.nccl.conf").write_text(home_conf)
    if etc_conf is not None:
        (root / "etc/nccl.conf").write_text(etc_conf)
    for path, content in (files or {}).items():
        f = root / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            f.write_bytes(content)
        else:
            f.write_text(content)
    return job_nccl.ProcessView(str(tmp_path / "proc"), PID, env or {}, "/etc/nccl.conf")


@pytest.fixture
def table(tmp_path: Path) -> list[job_nccl.GidEntry]:
    """The lab's GID table: 0/1 link-local as RoCE v1/v2, 2/3 IPv4-mapped as v1/v2, the
    rest of the 16 entries zero (lab/fake_rdma.py)."""
    root = fake_rdma.write_tree(tmp_path / "sysfs", "h1-1", "bk0", "198.18.1.1")
    t = job_nccl.port_gids(root, "mlx5_0", 1)
    assert len(t) == 16 and [e.roce_version for e in t[:4]] == [1, 2, 1, 2]
    return t


def _resolve(view: job_nccl.ProcessView, table: list[job_nccl.GidEntry]) -> job_nccl.Resolved:
    return job_nccl.resolve(job_nccl.job_library(view), table)


def test_nccl_2_23_with_no_index_selects_the_roce_v2_ipv4_gid(tmp_path: Path, table) -> None:  # type: ignore[no-untyped-def]
    r = _resolve(_proc(tmp_path, maps=["/usr/lib/x86_64-linux-gnu/libnccl.so.2.23.4"]), table)
    assert (r.lib.library, r.lib.version, r.lib.version_from) == ("nccl", (2, 23, 4),
                                                                  VersionFrom.MAPS)  # fmt: skip
    assert (r.gid_rule, r.gid_index, r.roce_version, r.addr_family) == (GidRule.AUTO, 3, 2, 4)
    assert (r.ib_timeout, r.ib_timeout_from, r.ib_retry_cnt) == (20, From.DEFAULT, 7)


def test_nccl_2_18_with_no_index_uses_index_0_and_timeout_18(tmp_path: Path, table) -> None:  # type: ignore[no-untyped-def]
    r = _resolve(_proc(tmp_path, maps=["/opt/nccl/lib/libnccl.so.2.18.3"]), table)
    assert (r.gid_rule, r.gid_index, r.ib_timeout) == (GidRule.INDEX0, 0, 18)
    assert job_nccl.qp_limit_s(r.ib_timeout, r.ib_retry_cnt) == pytest.approx(8.59, abs=0.01)


def test_version_from_the_librarys_own_string_then_the_containers_env(
    tmp_path: Path, table
) -> None:  # type: ignore[no-untyped-def]
    lib = b"\x7fELF" + b"\0" * 5000 + b"NCCL version 2.21.5+cuda12.4\0" + b"\0" * 100
    view = _proc(tmp_path, maps=["/venv/nvidia/nccl/lib/libnccl.so.2"],
                 files={"/venv/nvidia/nccl/lib/libnccl.so.2": lib})  # fmt: skip
    r = _resolve(view, table)
    assert (r.lib.version, r.lib.version_from, r.gid_rule, r.gid_index) == (
        (2, 21, 5),
        VersionFrom.LIBRARY,
        GidRule.AUTO,
        3,
    )
    view = _proc(tmp_path / "c", env={"NCCL_VERSION": "2.19.3-1"})
    r = _resolve(view, table)
    assert (r.lib.version, r.lib.version_from, r.gid_rule, r.gid_index, r.ib_timeout) == (
        (2, 19, 3),
        VersionFrom.CONTAINER_ENV,
        GidRule.INDEX0,
        0,
        18,
    )


def test_version_unknown_leaves_the_index_and_the_timeout_unknown(tmp_path: Path, table) -> None:  # type: ignore[no-untyped-def]
    r = _resolve(_proc(tmp_path, maps=["/usr/lib/libc.so.6"]), table)
    assert (r.lib.library, r.gid_rule, r.gid_index, r.ib_timeout) == ("", GidRule.UNKNOWN, -1, -1)
    assert r.ib_retry_cnt == 7  # the same default in every release
    # an explicit index is known whatever the version
    r = _resolve(_proc(tmp_path / "e", env={"NCCL_IB_GID_INDEX": "3"}), table)
    assert (r.gid_rule, r.gid_index, r.gid_from) == (GidRule.EXPLICIT, 3, From.ENVIRON)


def test_roce_version_num_1_in_the_users_nccl_conf_selects_roce_v1(tmp_path: Path, table) -> None:  # type: ignore[no-untyped-def]
    view = _proc(tmp_path, maps=["/usr/lib/libnccl.so.2.23.4"],
                 home_conf="NCCL_IB_ROCE_VERSION_NUM=1\n")  # fmt: skip
    r = _resolve(view, table)
    assert (r.gid_index, r.roce_version, r.roce_version_from) == (2, 1, From.USER_CONF)
    assert table[r.gid_index].roce_version == 1


def test_address_family_and_range_as_nccl_walks_the_table(tmp_path: Path, table) -> None:  # type: ignore[no-untyped-def]
    maps = ["/usr/lib/libnccl.so.2.23.4"]
    # AF_INET6 with only link-local IPv6 GIDs: NCCL keeps index 0 (link-local is not valid)
    r = _resolve(_proc(tmp_path / "a", maps=maps, env={"NCCL_IB_ADDR_FAMILY": "AF_INET6"}), table)
    assert (r.gid_index, r.addr_family, r.addr_family_from) == (0, 6, From.ENVIRON)
    # a range the address is outside of: no candidate matches, index 0
    r = _resolve(_proc(tmp_path / "b", maps=maps, env={"NCCL_IB_ADDR_RANGE": "10.0.0.0/8"}), table)
    assert (r.gid_index, r.addr_range) == (0, "10.0.0.0/8")
    r = _resolve(_proc(tmp_path / "c", maps=maps, env={"NCCL_IB_ADDR_RANGE": "198.18.0.0/15"}),
                 table)  # fmt: skip
    assert r.gid_index == 3


def test_settings_precedence_environment_conf_file_home_etc(tmp_path: Path, table) -> None:  # type: ignore[no-untyped-def]
    maps = ["/usr/lib/libnccl.so.2.23.4"]
    home = "NCCL_IB_TIMEOUT=16\nNCCL_IB_RETRY_CNT=3\nNCCL_IB_RETRY_CNT=5\n"
    etc = "# site\nNCCL_IB_TIMEOUT=22\nNCCL_IB_RETRY_CNT=6\nNCCL_IB_GID_INDEX=1\n"
    view = _proc(tmp_path / "a", maps=maps, env={"NCCL_IB_TIMEOUT": "14"}, home_conf=home,
                 etc_conf=etc)  # fmt: skip
    r = _resolve(view, table)
    assert (r.ib_timeout, r.ib_timeout_from) == (14, From.ENVIRON)  # env first
    assert (r.ib_retry_cnt, r.ib_retry_cnt_from) == (3, From.USER_CONF)  # first assignment
    assert (r.gid_index, r.gid_from) == (1, From.ETC_CONF)
    # NCCL_CONF_FILE (2.23+) replaces ~/.nccl.conf; /etc/nccl.conf still follows
    env = {"NCCL_CONF_FILE": "/work/my.conf"}
    view = _proc(tmp_path / "b", maps=maps, env=env, home_conf=home, etc_conf=etc,
                 files={"/work/my.conf": "NCCL_IB_TIMEOUT=17\n"})  # fmt: skip
    r = _resolve(view, table)
    assert (r.ib_timeout, r.ib_timeout_from) == (17, From.CONF_FILE)
    assert (r.ib_retry_cnt, r.ib_retry_cnt_from) == (6, From.ETC_CONF)
    # ... but NCCL 2.22 does not know NCCL_CONF_FILE: ~/.nccl.conf it is
    view = _proc(tmp_path / "c", maps=["/usr/lib/libnccl.so.2.22.3"], env=env, home_conf=home,
                 files={"/work/my.conf": "NCCL_IB_TIMEOUT=17\n"})  # fmt: skip
    r = _resolve(view, table)
    assert (r.ib_timeout, r.ib_timeout_from) == (16, From.USER_CONF)


def test_values_are_read_as_strtoll_reads_them() -> None:
    assert [job_nccl.strtoll(v) for v in ("3", " 3 # x", "0x10", "010", "x", "", "-1")] == [
        3, 3, 16, 8, 0, None, -1]  # fmt: skip
    assert job_nccl.conf_assignments("A=1\n#A=2\nA=3\n B=4\n") == {"A": "1", " B": "4"}


def test_ucx_job_uses_ucx_gid_index_or_its_own_choice(tmp_path: Path, table) -> None:  # type: ignore[no-untyped-def]
    maps = ["/usr/lib/ucx/libuct_ib.so.0.0.0"]
    r = _resolve(_proc(tmp_path / "a", maps=maps), table)
    assert (r.lib.library, r.gid_rule, r.gid_index) == ("ucx", GidRule.UCX_AUTO, 3)
    r = _resolve(_proc(tmp_path / "b", maps=maps, env={"UCX_IB_GID_INDEX": "2"}), table)
    assert (r.gid_rule, r.gid_index, r.gid_from) == (GidRule.EXPLICIT, 2, From.ENVIRON)


def test_qp_limits() -> None:
    assert job_nccl.qp_limit_s(14, 7) == pytest.approx(0.537, abs=0.001)
    assert job_nccl.qp_limit_s(18, 7) == pytest.approx(8.59, abs=0.01)
    assert job_nccl.qp_limit_s(20, 7) == pytest.approx(34.36, abs=0.01)
    assert [
        job_nccl.default_timeout(v)
        for v in ((2, 13, 4), (2, 14, 3), (2, 22, 3), (2, 23, 4), (2, 30, 7))
    ] == [14, 18, 18, 20, 20]


def test_a_real_process_mapping_libnccl_is_resolved(tmp_path: Path) -> None:
    """A process that maps a file named libnccl.so.2.23.4 (mmap, as the dynamic loader
    does) and holds the fake verbs device: its job_nccl row says 2.23.4 and index 3."""
    sysfs = fake_rdma.write_tree(tmp_path / "sysfs", "h1-1", "bk0", "198.18.1.1")
    lib = tmp_path / "lib/libnccl.so.2.23.4"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 8192)
    code = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); "
            "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); g = open(sys.argv[2]); "
            "print('ready', flush=True); time.sleep(60)")  # fmt: skip
    uverbs = sysfs / "dev/infiniband/uverbs0"
    env = dict(os.environ, CLOCKMESH_JOB_ID="j223", NCCL_IB_TIMEOUT="14")
    env.pop("NCCL_IB_GID_INDEX", None)
    proc = subprocess.Popen([sys.executable, "-c", code, str(lib), str(uverbs)], env=env,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        found = [(p, t) for p, t in rdma_config.rdma_processes(same_netns=True) if p == proc.pid]
        _, nccl = rdma_config.job_snapshot("/nonexistent", 9, records.host_id("h1-1"),
                                           found=found, sysfs_root=sysfs)  # fmt: skip
        (row,) = nccl
        assert (row["job_id"], row["version"], row["device"]) == (b"j223", b"2.23.4", b"mlx5_0")
        assert (row["gid_rule"], row["gid_index"]) == (GidRule.AUTO, 3)
        assert (row["ib_timeout"], row["ib_timeout_from"], row["ib_retry_cnt"]) == (14, 1, 7)
        buf = RecordBuffer("job_nccl")  # the collector's spool buffer takes the rows
        buf.extend(nccl)
        assert len(buf) == 1
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_a_process_in_its_own_mount_namespace_is_read_through_its_root(tmp_path: Path) -> None:
    """As a container: the process's /etc/nccl.conf is on a mount only its namespace has;
    the collector reads it through /proc/PID/root."""
    d = tmp_path / "etc"
    d.mkdir()
    code = ("import subprocess, sys, time; d = sys.argv[1]; "
            "subprocess.run(['mount', '-t', 'tmpfs', 'tmpfs', d], check=True); "
            "open(d + '/nccl.conf', 'w').write('NCCL_IB_TIMEOUT=16\\n'); "
            "print('ready', flush=True); time.sleep(60)")  # fmt: skip
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", sys.executable,
                             "-c", code, str(d)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert not (d / "nccl.conf").exists()  # not in the collector's namespace
        view = job_nccl.ProcessView("/proc", proc.pid, {}, str(d / "nccl.conf"))
        assert view.root() == f"/proc/{proc.pid}/root"
        lib = job_nccl.job_library(view)
        assert lib.settings["NCCL_IB_TIMEOUT"] == job_nccl.Setting("16", From.ETC_CONF)
    finally:
        proc.kill()
        proc.wait()
