"""RDMA configuration: GID tables, rdma_cm default RoCE mode, and jobs' GID index.

* GID table (records.RDMA_CONFIG): ``sys/class/infiniband/<dev>/ports/<p>/gids/<n>``
  with ``gid_attrs/types/<n>`` ("IB/RoCE v1" or "RoCE v2") and
  ``gid_attrs/ndevs/<n>`` under the sysfs root. Empty entries (all-zero GID,
  or a type file that fails with EINVAL as on real kernels) are skipped.
* ``default_roce_mode`` from configfs
  (``<configfs_root>/rdma_cm/<dev>/ports/<p>/default_roce_mode``) when mounted
  and present; "" otherwise.
* Jobs (records.JOB_RDMA): ``NCCL_IB_GID_INDEX`` in ``/etc/nccl.conf``
  (``KEY=VALUE`` lines, ``#`` lines skipped, the first assignment counts, as NCCL reads
  it), and the environment of every process
  holding an RDMA device open (a ``/proc/<pid>/fd`` link to
  ``.../dev/infiniband/uverbsN``; in the lab, the fake tree's file of that name):
  ``NCCL_IB_GID_INDEX``, else ``UCX_IB_GID_INDEX``. The job id is
  ``CLOCKMESH_JOB_ID``, else ``SLURM_JOB_ID``, else ``pid-<pid>``. In the lab
  (many "hosts" share one kernel) only processes in the collector's own network
  namespace count.
* What each job's library will do (records.JOB_NCCL, :mod:`collector.job_nccl`): its NCCL
  version, settings from the environment and NCCL's files, the GID index resolved as that
  version resolves it, and its QP timeout and retry count.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from numpy.lib.recfunctions import repack_fields

from collector import job_nccl, records

_UVERBS = re.compile(r"(^|/)dev/infiniband/uverbs\d+$")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def gid_table(
    sysfs_root: str | Path, configfs_root: str | Path, ts_ns: int, host: int
) -> np.ndarray:
    """RDMA_CONFIG rows for every populated GID of every RDMA port."""
    ib = Path(sysfs_root) / "sys/class/infiniband"
    rows: list[tuple[object, ...]] = []
    if not ib.is_dir():
        return np.zeros(0, records.RDMA_CONFIG)
    for dev in sorted(os.listdir(ib)):
        ports = ib / dev / "ports"
        if not ports.is_dir():
            continue
        for port in sorted((p for p in os.listdir(ports) if p.isdigit()), key=int):
            base = ports / port
            mode = _text(
                Path(configfs_root) / "rdma_cm" / dev / "ports" / port / "default_roce_mode"
            )
            gids = base / "gids"
            if not gids.is_dir():
                continue
            for n in sorted((g for g in os.listdir(gids) if g.isdigit()), key=int):
                gid = _text(gids / n)
                if not gid or gid == _ZERO_GID:
                    continue
                gid_type = _text(base / "gid_attrs" / "types" / n)
                if not gid_type:
                    continue  # the kernel answers EINVAL for unpopulated entries
                ndev = _text(base / "gid_attrs" / "ndevs" / n) or ""
                rows.append(
                    (ts_ns, host, dev.encode()[:16], int(port), int(n), 0, gid.encode()[:40],
                     gid_type.encode()[:16], ndev.encode()[:16], (mode or "").encode()[:16])
                )  # fmt: skip
    return np.array(rows, dtype=records.RDMA_CONFIG) if rows else np.zeros(0, records.RDMA_CONFIG)


def parse_nccl_conf(text: str, name: str = "NCCL_IB_GID_INDEX") -> int | None:
    """An integer setting (``NCCL_IB_GID_INDEX`` by default) from nccl.conf text as NCCL
    reads it (:func:`collector.job_nccl.conf_assignments`: the first assignment counts;
    the value as ``strtoll`` reads it), or None when the file does not set it."""
    value = job_nccl.conf_assignments(text).get(name)
    return None if value is None else job_nccl.strtoll(value)


def _environ(pid: str, proc: Path) -> dict[str, str]:
    try:
        raw = (proc / pid / "environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, val = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = val.decode("utf-8", "replace")
    return env


def _gid_from_env(env: dict[str, str]) -> int:
    for key in ("NCCL_IB_GID_INDEX", "UCX_IB_GID_INDEX"):
        try:
            return int(env[key])
        except (KeyError, ValueError):
            continue
    return -1


def _holds_uverbs(proc: str, pid: str) -> str | None:
    """The uverbs path ``pid`` holds open, or None."""
    fd_dir = f"{proc}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if "infiniband/uverbs" in target and _UVERBS.search(target):
            return target
    return None


def _netns(proc: str, pid: str) -> str | None:
    try:
        return os.readlink(f"{proc}/{pid}/ns/net")
    except OSError:
        return None


def rdma_processes(
    proc: str | Path = "/proc", same_netns: bool = False, pids: Iterable[str] | None = None
) -> list[tuple[int, str]]:
    """(pid, uverbs device path) of processes holding an RDMA device open.

    ``pids`` limits the scan (default: every process); with ``same_netns`` only
    processes in the caller's network namespace are looked at (checked first: it
    is one readlink, listing a process's fds is many).
    """
    proc = str(proc)
    own_ns = _netns(proc, "self") if same_netns else None
    self_pid = str(os.getpid())
    candidates = pids if pids is not None else (p for p in os.listdir(proc) if p.isdigit())
    found: list[tuple[int, str]] = []
    for pid in candidates:
        if pid == self_pid:
            continue
        if own_ns is not None and _netns(proc, pid) != own_ns:
            continue
        target = _holds_uverbs(proc, pid)
        if target is not None:
            found.append((int(pid), target))
    return found


class JobScanner:
    """Finds RDMA processes cheaply: young pids and known holders every scan, all every ``full_s``.

    A full /proc scan reads every fd link of every process (34 ms here for 85
    processes with 5,600 fds: ~0.1 % of a core at one per 30 s). Most scans only
    look at the processes that appeared within the last ``young_s`` (a job that
    opens the device while it starts up, as NCCL does, is found within one scan)
    and at the ones already holding a device; a process that opens the device
    later in its life is found by the next full scan.
    """

    def __init__(
        self,
        proc: str | Path = "/proc",
        same_netns: bool = False,
        full_s: float = 120.0,
        young_s: float = 60.0,
    ) -> None:
        self.proc = str(proc)
        self.same_netns = same_netns
        self.full_s = full_s
        self.young_s = young_s
        self._first_seen: dict[str, float] = {}
        self._holders: set[str] = set()
        self._last_full = -1e18

    def scan(self, now: float) -> list[tuple[int, str]]:
        try:
            pids = {p for p in os.listdir(self.proc) if p.isdigit()}
        except OSError:
            return []
        # pids already there at the first scan are not young: they were all looked at
        born = now if self._last_full > -1e18 else -1e18
        first_seen = {p: self._first_seen.get(p, born) for p in pids}
        if now - self._last_full >= self.full_s:
            check: set[str] = pids
            self._last_full = now
        else:
            young = {p for p, t in first_seen.items() if now - t < self.young_s}
            check = young | (self._holders & pids)
        self._first_seen = first_seen
        found = rdma_processes(self.proc, self.same_netns, sorted(check, key=int))
        self._holders = {str(pid) for pid, _ in found}  # every holder was in ``check``
        return found


def job_rows(
    nccl_conf: str | Path,
    ts_ns: int,
    host: int,
    *,
    proc: str | Path = "/proc",
    same_netns: bool = False,
    device: str = "",
    found: list[tuple[int, str]] | None = None,
    sysfs_root: str | Path | None = None,
) -> np.ndarray:
    """JOB_RDMA rows: one from nccl.conf (if it sets the index), one per RDMA process."""
    return job_snapshot(nccl_conf, ts_ns, host, proc=proc, same_netns=same_netns,
                        device=device, found=found, sysfs_root=sysfs_root)[0]  # fmt: skip


def job_snapshot(
    nccl_conf: str | Path,
    ts_ns: int,
    host: int,
    *,
    proc: str | Path = "/proc",
    same_netns: bool = False,
    device: str = "",
    found: list[tuple[int, str]] | None = None,
    sysfs_root: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(JOB_RDMA rows, JOB_NCCL rows) of this host's RDMA processes.

    JOB_RDMA: one row from nccl.conf (if it sets the index), one per process with the
    index its environment sets (-1 none). JOB_NCCL: one per process, what its library will
    do (:mod:`collector.job_nccl`: version, settings from the environment and NCCL's
    files, the GID index resolved against the port's GID table, QP timeout and retries).
    A process's device is the RDMA device behind the verbs file it holds
    (``sys/class/infiniband_verbs/uverbsN/ibdev`` under ``sysfs_root``: ``mlx5_0``, the
    name the GID table uses), or the file's own name when that is not known.
    """
    rows: list[tuple[object, ...]] = []
    nccl: list[tuple[object, ...]] = []
    text = _text(Path(nccl_conf))
    if text is not None:
        gid = parse_nccl_conf(text)
        if gid is not None:
            rows.append((ts_ns, host, b"", 0, gid, b"nccl.conf", device.encode()[:16]))
    if found is None:
        found = rdma_processes(proc, same_netns)
    tables: dict[tuple[str, int], list[job_nccl.GidEntry]] = {}
    for pid, target in found:
        env = _environ(str(pid), Path(proc))
        job = env.get("CLOCKMESH_JOB_ID") or env.get("SLURM_JOB_ID") or f"pid-{pid}"
        uverbs = target.rsplit("/", 1)[-1]
        ibdev = None
        if sysfs_root is not None:
            ibdev = _text(Path(sysfs_root) / "sys/class/infiniband_verbs" / uverbs / "ibdev")
        dev = device or ibdev or uverbs
        rows.append(
            (ts_ns, host, job.encode()[:32], pid, _gid_from_env(env), b"environ",
             dev.encode()[:16])
        )  # fmt: skip
        view = job_nccl.ProcessView(str(proc), pid, env, str(nccl_conf))
        lib = job_nccl.job_library(view)
        table = None
        port = 1
        if sysfs_root is not None and ibdev:
            port = job_nccl.first_port(sysfs_root, ibdev)
            if (ibdev, port) not in tables:
                tables[(ibdev, port)] = job_nccl.port_gids(sysfs_root, ibdev, port)
            table = tables[(ibdev, port)]
        r = job_nccl.resolve(lib, table, port)
        nccl.append(
            (ts_ns, host, job.encode()[:32], pid, max(-1, min(r.gid_index, 32767)),
             lib.library.encode(), job_nccl.version_text(lib.version).encode()[:16],
             int(lib.version_from), int(r.gid_rule), int(r.gid_from), min(r.port, 255),
             max(-1, min(r.roce_version, 127)), int(r.roce_version_from), r.addr_family,
             int(r.addr_family_from), int(r.addr_range_from),
             max(-1, min(r.ib_timeout, 127)), int(r.ib_timeout_from),
             max(-1, min(r.ib_retry_cnt, 127)), int(r.ib_retry_cnt_from),
             dev.encode()[:16], r.addr_range.encode(errors="replace")[:48])
        )  # fmt: skip
    return (
        np.array(rows, dtype=records.JOB_RDMA) if rows else np.zeros(0, records.JOB_RDMA),
        np.array(nccl, dtype=records.JOB_NCCL) if nccl else np.zeros(0, records.JOB_NCCL),
    )


def no_jobs_row(ts_ns: int, host: int) -> np.ndarray:
    """The snapshot of a host with no RDMA job: one row with an empty job id."""
    return np.array([(ts_ns, host, b"", 0, -1, b"none", b"")], dtype=records.JOB_RDMA)


def fingerprint(rows: np.ndarray, ignore: tuple[str, ...] = ("ts_ns",)) -> bytes:
    """Content of rows without their timestamps: re-send only when this changes."""
    names = [n for n in rows.dtype.names or () if n not in ignore]
    return repack_fields(rows[names]).tobytes() if len(rows) else b""
