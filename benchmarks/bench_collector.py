"""Collector footprint: CPU and RSS of one collector at ~1,000 probes/s sent + received.

Two real collectors on two loopback addresses probe each other (1 buddy x 8 source
ports x 62.5 coded pairs/s = 1,000 probes/s each way), spool and ship to an
in-process HTTP receiver implementing the ingest contract. Everything else is the
collector's default configuration. Two runs by default:

* default settings (the acceptance figure): 1 coded pair in 8 is echoed
  (``probe.echo_every: 8``), so each process also sends and receives 125 echoes/s;
* every probe echoed (``probe.echo_every: 1``, the previous default): 1,000 echoes/s.

CPU is utime+stime from /proc/<pid>/stat over the measurement window (also printed
for the peer 'bb', which does the same work: a second sample from the same run); RSS
is VmRSS/VmHWM from /proc/<pid>/status. On loopback the sender's system time includes
the receiver's whole input path (a real NIC runs it in softirq on the receiver). The
status file goes to tmpfs (/run or /dev/shm) as on a deployed host, whose default
status_file is under /run; spools stay on the temp dir's disk.

    .venv/bin/python benchmarks/bench_collector.py [--seconds 30] [--probes-per-s 1000]
        [--echo-every N | --no-echo] [--py-spy FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy  # noqa: E402

from benchmarks.machine import describe  # noqa: E402
from collector.config import ECHO_EVERY_DEFAULT  # noqa: E402
from tests.unit.collector_procs import (  # noqa: E402
    KEY,
    CollectorProcess,
    free_udp_port,
    loopback_net,
    write_config,
)
from tests.unit.collector_receiver import Receiver  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` (all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def mem_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(val.split()[0])
    return out


def run_dir() -> str | None:
    """A tmpfs directory for the status file, as /run is on a deployed host (the
    default status_file is /run/clockmesh/...); None (the temp dir) if there is none.
    Rewriting a file by rename on ext4 costs noticeably more than on tmpfs."""
    for cand in ("/run", "/dev/shm"):
        try:
            fs = [ln.split()[2] for ln in Path("/proc/mounts").read_text().splitlines()
                  if ln.split()[1] == cand]  # fmt: skip
        except OSError:
            return None
        if fs and fs[-1] == "tmpfs" and os.access(cand, os.W_OK):
            return cand
    return None


def run(args: argparse.Namespace, echo_every: int | None, spy_bin: Path) -> dict[str, Any]:
    """One measurement: two collectors, ``echo_every`` None = the collector's default."""
    ports = 8
    rate_per_port = args.probes_per_s / 2 / ports  # coded pairs per (buddy, port) per second
    receiver = Receiver(KEY)
    probe: dict[str, Any] = {"rate_per_port": rate_per_port, "ports_per_buddy": ports}
    if echo_every is not None:
        probe["echo_every"] = echo_every
    with (
        tempfile.TemporaryDirectory(prefix="cm-bench-") as tmp_s,
        tempfile.TemporaryDirectory(prefix="cm-bench-", dir=run_dir()) as run_s,
    ):
        tmp = Path(tmp_s)
        net = loopback_net()
        a_addr, b_addr = f"{net}.1", f"{net}.2"
        port = free_udp_port(a_addr)
        peers = [
            {"name": "ba", "address": a_addr, "rack": "r"},
            {"name": "bb", "address": b_addr, "rack": "r"},
        ]

        def config(host: str, address: str) -> Path:
            return write_config(
                tmp, host, address, peers, receiver.url, port=port,
                base_sport=42000 + port % 20000, probe=dict(probe), spool={"roll_s": 1.0},
                status_file=f"{run_s}/{host}.status.json",
            )  # fmt: skip

        a = CollectorProcess(config("ba", a_addr))
        b = CollectorProcess(config("bb", b_addr))
        try:
            a.start()
            b.start()
            assert a.proc is not None and b.proc is not None
            time.sleep(args.warmup)
            pid, peer = a.proc.pid, b.proc.pid
            spy = None
            if args.py_spy:
                spy = subprocess.Popen(
                    [str(spy_bin), "record", "--pid", str(pid),
                     "--duration", str(int(args.seconds)), "--rate", "250", "--format", "raw",
                     "--nonblocking", "--output", args.py_spy],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            load0 = os.getloadavg()[0]
            st0, c0, p0, t0 = a.status(), cpu_seconds(pid), cpu_seconds(peer), time.monotonic()
            time.sleep(args.seconds)
            st1, c1, p1, t1 = a.status(), cpu_seconds(pid), cpu_seconds(peer), time.monotonic()
            load1 = os.getloadavg()[0]
            mem = mem_kib(pid)
            if spy is not None:
                spy.wait(30)
        finally:
            a.stop()
            b.stop()
            receiver.close()
    wall = t1 - t0
    return {
        "pid": pid,
        "wall": wall,
        "sent": (st1["probes_sent"] - st0["probes_sent"]) / wall,
        "recv": (st1["probes_received"] - st0["probes_received"]) / wall,
        "echo": (st1["echoes_received"] - st0["echoes_received"]) / wall,
        "rejected": sum(st1["rejected"].values()),
        "tx_kernel": st1["tx_timestamps"]["kernel"],
        "tx_user": st1["tx_timestamps"]["user"],
        "acked": st1["shipping"]["segments_acked"],
        "waiting": st1["spool"]["segments"],
        "user": 100.0 * (c1[0] - c0[0]) / wall,
        "system": 100.0 * (c1[1] - c0[1]) / wall,
        "peer": 100.0 * (sum(p1) - sum(p0)) / wall,
        "load": (load0, load1),
        "mem": mem,
    }


def report(title: str, r: dict[str, Any]) -> None:
    cpu = r["user"] + r["system"]
    print(f"== {title}")
    print(f"  window: {r['wall']:.1f} s; collector 'ba' (pid {r['pid']})")
    print(
        f"  probes sent/s: {r['sent']:.0f}  received/s: {r['recv']:.0f}  "
        f"echoes received/s: {r['echo']:.0f}"
    )
    print(
        f"  rejected: {r['rejected']}  kernel TX timestamps: {r['tx_kernel']}  "
        f"user: {r['tx_user']}  segments acked: {r['acked']}  spool waiting: {r['waiting']}"
    )
    print(
        f"  CPU: {cpu:.2f}% of one core (user {r['user']:.2f}%, system {r['system']:.2f}%; "
        f"target <= 2%)  load average {r['load'][0]:.2f} -> {r['load'][1]:.2f}"
    )
    print(f"  CPU of its peer 'bb' (same work, same window): {r['peer']:.2f}%")
    mem = r["mem"]
    print(
        f"  RSS: {mem['VmRSS'] / 1024:.1f} MiB, peak {mem['VmHWM'] / 1024:.1f} MiB "
        "(target <= 60 MiB)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=30.0, help="measurement window per run")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--probes-per-s", type=float, default=1000.0, help="probes sent per collector")
    which = ap.add_mutually_exclusive_group()
    which.add_argument(
        "--echo-every",
        type=int,
        metavar="N",
        help="one run with probe.echo_every N (default: two runs, default settings and N=1)",
    )
    which.add_argument("--no-echo", action="store_true", help="one run without echoes (N=0)")
    ap.add_argument(
        "--py-spy",
        metavar="FILE",
        help="also sample the collector with py-spy over the (first) window "
        "(raw collapsed stacks to FILE)",
    )
    args = ap.parse_args()
    spy_bin = Path(sys.executable).with_name("py-spy")
    if args.py_spy and not spy_bin.exists():
        ap.error(f"--py-spy: {spy_bin} not found (pip install py-spy)")
    if args.echo_every is not None and args.echo_every < 0:
        ap.error("--echo-every: expected an int >= 0")
    if args.no_echo:
        runs: list[tuple[str, int | None]] = [("no echoes (probe.echo_every: 0)", 0)]
    elif args.echo_every is not None:
        runs = [(f"probe.echo_every: {args.echo_every}", args.echo_every)]
    else:
        runs = [
            (f"default settings (1 coded pair in {ECHO_EVERY_DEFAULT} echoed): acceptance", None),
            ("every probe echoed (probe.echo_every: 1)", 1),
        ]
    print(f"machine: {describe(numpy=numpy.__version__)}")
    print(
        f"{args.probes_per_s:.0f} probes/s sent by each of two collectors on loopback; "
        f"{args.seconds:.0f}-s window after {args.warmup:.0f} s warm-up per run"
    )
    for i, (title, every) in enumerate(runs):
        result = run(args, every, spy_bin)
        if i == 0:
            args.py_spy = None  # one profile: the first run
        report(title, result)


if __name__ == "__main__":
    main()
