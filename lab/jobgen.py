"""Lab job generator: all-to-all style UDP traffic between lab hosts, reported in-band.

One process per host of a job (``clockmesh lab job start NAME --hosts ...``), run
inside the host's network and mount namespaces. Each process

* holds the host's fake RDMA device open (``/var/lib/clockmesh/lab/sysfs/dev/infiniband/uverbs0``,
  see lab/fake_rdma.py) with ``NCCL_IB_GID_INDEX`` and ``CLOCKMESH_JOB_ID`` in its
  environment — what the collector looks for in /proc, as with a real NCCL job;
* with ``--nccl-version X.Y.Z`` (``clockmesh lab job start --nccl-version``), maps a file
  named ``libnccl.so.X.Y.Z`` (carrying ``NCCL version X.Y.Z`` as the real library does)
  with mmap, as the dynamic loader maps the real one: the collector learns the job's NCCL
  version from ``/proc/PID/maps``. Without it the job's NCCL version is unknown;
* sends ``--rate`` messages per second of ``--size`` bytes to every other host of the
  job over the backend fabric (UDP port ``--port``), one flow per (src, dst) pair;
* reports every send and every receive (kernel RX timestamp) to the collector's
  in-band hook (``/run/clockmesh/inband.sock``, format in collector/inband.py), and
  announces its GID index once (event 2);
* marks its packets as its transport would: a job on a RoCE v2 GID sends with the RDMA
  DSCP (26: RoCE v2 is UDP/IP, so the fabric classifies it into the RDMA traffic class,
  ``lab capacity``); a job on a RoCE v1 GID sends without (RoCE v1 frames carry no IP
  header: a routed fabric cannot classify them). The GID type comes from the host's GID
  table (the lab's fake sysfs tree), the index resolved for this very process as its
  NCCL version resolves it (collector/job_nccl.py: ``NCCL_IB_GID_INDEX``, the 2.21+
  selection, or index 0 before 2.21; an unknown version sends without DSCP, as a job whose
  GID nobody can vouch for). ``--dscp`` overrides;
* opens ``NCCL_IB_QPS_PER_CONNECTION`` (environment, else nccl.conf; default 1) "queue
  pairs" per connection: as many source ports, messages sent over them in turn, so the
  fabric's ECMP spreads the job over more paths, as NCCL's queue pairs are.

    python -m lab.jobgen --job NAME --host h1-1 --bind 198.18.1.1 \\
        --peers h2-1=198.18.2.1,h3-1=198.18.3.1 [--rate 20] [--size 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import mmap
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from collector import records
from collector.inband import EVENT_GID, EVENT_RECV, EVENT_SEND, pack_report

PORT = 7471
MAGIC = b"CMJOB\0\0\0"
HEADER = struct.Struct("<8sQQqq")  # magic, flow_id, seq, src host_id, send_ns
SO_TIMESTAMPNS = 35
UVERBS = "/var/lib/clockmesh/lab/sysfs/dev/infiniband/uverbs0"
INBAND = "/run/clockmesh/inband.sock"
REPORT_EVERY_S = 0.05
# Reports held while the collector's hook queue is full (seconds of a job's messages; the
# job never waits for the collector), and how long the last flush may retry.
MAX_PENDING = 8192
FINAL_FLUSH_S = 1.0
RDMA_DSCP = 26
NCCL_CONF = "/etc/clockmesh/nccl.conf"  # the lab hosts' private nccl.conf (lab/fleet.py)
LIB_DIR = "usr/lib"  # under a host's fake RDMA tree: the lab jobs' libnccl.so.X.Y.Z
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
ENV_PREFIXES = ("NCCL_", "UCX_")


def nccl_setting(name: str, nccl_conf: str = "") -> int | None:
    """``name`` as NCCL takes it: the environment first, else nccl.conf (None: neither)."""
    from collector.rdma_config import parse_nccl_conf

    if os.environ.get(name, "").strip():
        with contextlib.suppress(ValueError):
            return int(os.environ[name])
    try:
        return parse_nccl_conf(Path(nccl_conf or NCCL_CONF).read_text(), name)
    except OSError:
        return None


def transport_dscp(host: str, gid_index: int, sysfs_root: str = "", nccl_conf: str = "") -> int:
    """The DSCP this host's job traffic carries: RDMA_DSCP on a RoCE v2 GID, 0 on RoCE v1,
    a GID the table does not have, or one that cannot be known. ``gid_index`` -1: this
    process's own, resolved as its NCCL resolves it (after it mapped its libnccl)."""
    from collector import job_nccl, rdma_config
    from lab import fake_rdma

    root = sysfs_root or fake_rdma.IN_HOST_PATH
    index = gid_index
    if index < 0:
        view = job_nccl.ProcessView("/proc", os.getpid(), dict(os.environ),
                                    nccl_conf or NCCL_CONF)  # fmt: skip
        table = job_nccl.port_gids(root, fake_rdma.DEVICE, 1)
        index = job_nccl.resolve(job_nccl.job_library(view), table).gid_index
    rows = rdma_config.gid_table(root, root + "/sys/kernel/config", 0, records.host_id(host))
    types = {int(r["gid_index"]): r["gid_type"].decode() for r in rows}
    return RDMA_DSCP if types.get(index) == "RoCE v2" else 0


def write_nccl_lib(directory: Path, version: str) -> Path:
    """A stand-in ``libnccl.so.<version>`` (ELF magic and NCCL's version string)."""
    if not _VERSION.match(version):
        raise ValueError(f"--nccl-version: expected X.Y.Z (e.g. 2.23.4), got {version!r}")
    path = directory / f"libnccl.so.{version}"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"\x7fELF" + bytes(4092) + f"NCCL version {version}+cuda12.4".encode()
                        + bytes(4096))  # fmt: skip
        os.replace(tmp, path)
    return path


def map_library(path: str) -> mmap.mmap | None:
    """Map ``path`` read-only for the life of the job, as the dynamic loader maps a
    library: it then shows in /proc/PID/maps."""
    if not path:
        return None
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)


def flow_id(job: str, src: str, dst: str) -> int:
    digest = hashlib.blake2b(f"{job}|{src}|{dst}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def run(
    job: str,
    host: str,
    bind: str,
    peers: dict[str, str],
    *,
    port: int = PORT,
    rate: float = 20.0,
    size: int = 1024,
    inband: str = INBAND,
    uverbs: str = UVERBS,
    gid_index: int = -1,
    duration: float = 0.0,
    dscp: int = 0,
    qps: int = 1,
) -> dict[str, int]:
    """Send/receive until SIGTERM (or ``duration`` s); returns counts."""
    holder = open(uverbs, "rb") if uverbs else None  # noqa: SIM115 (held for the whole run)
    me = records.host_id(host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, port))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    sock.setblocking(False)
    # NCCL_IB_QPS_PER_CONNECTION: as many queue pairs per connection, each its own UDP
    # source port (port + 1000 k), the messages spread over them in turn.
    senders = [sock]
    for k in range(1, max(1, qps)):
        extra = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        extra.bind((bind, port + 1000 * k))
        extra.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        extra.setblocking(False)
        senders.append(extra)
    hook = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    hook.setblocking(False)  # a stalled collector must not stall the job: drop and count
    targets = [
        (name, addr, records.host_id(name), flow_id(job, host, name))
        for name, addr in sorted(peers.items())
    ]
    payload_pad = b"\0" * max(0, size - HEADER.size)
    pending: list[bytes] = []
    counts = {"sent": 0, "received": 0, "reports": 0, "report_errors": 0}
    seq = 0
    interval = 1.0 / rate if rate > 0 else 1.0
    next_send = time.monotonic()
    next_report = time.monotonic()
    end = time.monotonic() + duration if duration else float("inf")
    if gid_index >= 0:
        pending.append(pack_report(EVENT_GID, job, 0, 0, 0, gid_index, time.time_ns()))
    buf = bytearray(65536)

    def flush() -> None:
        """Send what is pending, 64 reports per datagram at most (the hook's limit). The
        hook's queue full (the collector busy for a moment: a unix datagram queue holds
        net.unix.max_dgram_qlen datagrams, 10 by default): the rest waits for the next
        flush, up to MAX_PENDING reports; beyond, the oldest are dropped and counted. No
        hook listening: dropped and counted."""
        nonlocal pending
        done = 0
        for i in range(0, len(pending), 64):
            chunk = pending[i : i + 64]
            try:
                hook.sendto(b"".join(chunk), inband)
                counts["reports"] += len(chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                counts["report_errors"] += len(chunk)
            done = i + len(chunk)
        pending = pending[done:]
        if len(pending) > MAX_PENDING:
            counts["report_errors"] += len(pending) - MAX_PENDING
            pending = pending[-MAX_PENDING:]

    try:
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_send:
                seq += 1
                for _name, addr, pid, fid in targets:
                    t = time.time_ns()
                    with contextlib.suppress(OSError):
                        senders[seq % len(senders)].sendto(
                            HEADER.pack(MAGIC, fid, seq, me, t) + payload_pad, (addr, port)
                        )
                        counts["sent"] += 1
                        pending.append(pack_report(EVENT_SEND, job, fid, seq, pid, size, t))
                next_send += interval
                if next_send < now - 1.0:
                    next_send = now
            while True:
                try:
                    n, anc, _flags, _addr = sock.recvmsg_into([buf], 64)
                except (BlockingIOError, InterruptedError):
                    break
                if n < HEADER.size:
                    continue
                magic, fid, mseq, src, _sent = HEADER.unpack_from(buf)
                if magic != MAGIC:
                    continue
                rx = time.time_ns()
                for level, ctype, data in anc:
                    if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS:
                        sec, nsec = struct.unpack_from("qq", data)
                        rx = sec * 1_000_000_000 + nsec
                counts["received"] += 1
                pending.append(pack_report(EVENT_RECV, job, fid, mseq, src, n, rx))
            if now >= next_report:
                flush()
                next_report = now + REPORT_EVERY_S
            time.sleep(min(0.005, max(0.0, next_send - time.monotonic())))
    except _Stop:
        pass
    finally:
        deadline = time.monotonic() + FINAL_FLUSH_S
        flush()
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            flush()
        counts["report_errors"] += len(pending)
        for s in senders:
            s.close()
        hook.close()
        if holder is not None:
            holder.close()
    return counts


# ---- lab side: start/stop jobs on lab hosts ---------------------------------------------
def start_job(
    lab: Any,
    job: str,
    hosts: list[str],
    gid_index: int | None,
    rate: float,
    size: int,
    dscp: int | None = None,
    port: int = PORT,
    nccl_version: str | None = None,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Start one generator per host (in its namespaces); records go to the lab state.

    ``nccl_version``: the job maps a ``libnccl.so.<version>`` (None: its version is not
    knowable); ``env``: more NCCL_*/UCX_* variables in its environment
    (``NCCL_IB_TIMEOUT``, ``NCCL_IB_ROCE_VERSION_NUM``, ...)."""
    from lab import fake_rdma, processes

    topo = lab.topology
    by_name = {h.name: h for h in topo.hosts}
    unknown = [h for h in hosts if h not in by_name]
    if unknown:
        raise ValueError(
            f"--hosts: no such lab host(s) {', '.join(unknown)} (have {', '.join(by_name)})"
        )
    if len(hosts) < 2:
        raise ValueError("--hosts: a job needs at least two hosts")
    extra = dict(env or {})
    bad = [k for k in extra if not k.startswith(ENV_PREFIXES) or not k.replace("_", "").isalnum()]
    if bad:
        raise ValueError(f"--env: {', '.join(bad)}: expected NCCL_* or UCX_* variables")
    if nccl_version is not None and not _VERSION.match(nccl_version):
        raise ValueError(f"--nccl-version: expected X.Y.Z (e.g. 2.23.4), got {nccl_version!r}")
    if any(j.get("job") == job for j in lab.state.read().get("jobs", []) if processes.alive(j)):
        raise ValueError(f"job {job!r} is already running (clockmesh lab job stop {job})")
    root = Path(__file__).resolve().parents[1]
    recs = []
    for name in hosts:
        h = by_name[name]
        tree = fake_rdma.write_tree(
            fake_rdma.tree_root(lab.node_dir(name)), name, h.backend_interface, h.backend_address
        )
        lib_arg = ""
        if nccl_version is not None:  # inside the host, its tree is at IN_HOST_PATH
            lib = write_nccl_lib(tree / LIB_DIR, nccl_version)
            lib_arg = f"{fake_rdma.IN_HOST_PATH}/{LIB_DIR}/{lib.name}"
        peers = ",".join(f"{p}={by_name[p].backend_address}" for p in hosts if p != name)
        argv = [sys.executable, "-m", "lab.jobgen", "--job", job, "--host", name]
        argv += [
            "--bind",
            h.backend_address,
            "--peers",
            peers,
            "--rate",
            str(rate),
            "--size",
            str(size),
            "--dscp",
            str(-1 if dscp is None else dscp),
            "--port",
            str(port),  # two jobs on one host need their own ports (as their own QPs)
            "--nccl-lib",
            lib_arg,
        ]
        penv = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIXES)}
        penv.update(extra, CLOCKMESH_JOB_ID=job, PYTHONPATH=str(root))
        if gid_index is not None:
            penv["NCCL_IB_GID_INDEX"] = str(gid_index)
        proc = subprocess.Popen(
            lab.command(name, argv),
            cwd=str(root),
            env=penv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        recs.append(processes.record(proc.pid, kind="job", job=job, node=name, gid_index=gid_index,
                                     dscp=dscp, nccl_version=nccl_version, env=extra))  # fmt: skip
    lab.state.add("jobs", *recs)
    return recs


def stop_job(lab: Any, job: str) -> int:
    from lab import processes

    jobs = lab.state.read().get("jobs", [])
    mine = [j for j in jobs if j.get("job") == job]
    stopped = processes.terminate_records(mine)
    with lab.state.update() as st:
        st["jobs"] = [j for j in st.get("jobs", []) if j.get("job") != job]
    return len(stopped)


def list_jobs(lab: Any) -> list[dict[str, Any]]:
    from lab import processes

    return [dict(j, alive=processes.alive(j)) for j in lab.state.read().get("jobs", [])]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.jobgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--job", required=True)
    parser.add_argument("--host", required=True, help="this lab host's name")
    parser.add_argument("--bind", required=True, help="this host's backend address")
    parser.add_argument("--peers", required=True, help="name=address,... of the other hosts")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--rate", type=float, default=20.0, help="messages/s to each peer")
    parser.add_argument("--size", type=int, default=1024, help="message bytes")
    parser.add_argument("--inband", default=INBAND, help="collector in-band hook socket")
    parser.add_argument(
        "--uverbs", default=UVERBS, help="RDMA device file to hold open ('' = none)"
    )
    parser.add_argument("--duration", type=float, default=0.0, help="seconds (0 = until SIGTERM)")
    parser.add_argument("--nccl-lib", default="",
                        help="a libnccl.so.X.Y.Z to map for the job's life ('' = none)")  # fmt: skip
    parser.add_argument("--dscp", type=int, default=-1,
                        help="DSCP of the job's packets (-1: from its GID type, as its transport)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        peers = dict(p.split("=", 1) for p in args.peers.split(",") if p)
    except ValueError:
        parser.error("--peers: expected name=address,name=address")
    gid = int(os.environ.get("NCCL_IB_GID_INDEX", "-1") or -1)
    library = map_library(args.nccl_lib)  # noqa: F841 (held mapped for the whole run)
    dscp = args.dscp if args.dscp >= 0 else transport_dscp(args.host, -1)
    qps = nccl_setting("NCCL_IB_QPS_PER_CONNECTION") or 1
    signal.signal(signal.SIGTERM, _raise_stop)
    counts = run(
        args.job, args.host, args.bind, peers, port=args.port, rate=args.rate, size=args.size,
        inband=args.inband, uverbs=args.uverbs, gid_index=gid, duration=args.duration,
        dscp=dscp, qps=qps,
    )  # fmt: skip
    print(" ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
