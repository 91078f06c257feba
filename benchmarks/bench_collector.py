"""Collector footprint: CPU and RSS of one collector at ~1,000 probes/s sent + received.

Two real collectors on two loopback addresses probe each other (1 buddy x 8 source
ports x 62.5 coded pairs/s = 1,000 probes/s each way, echoes on, so each process also
sends and receives 1,000 echoes/s), spool and ship to an in-process HTTP receiver
implementing the ingest contract. CPU is utime+stime from /proc/<pid>/stat over the
measurement window; RSS is VmRSS/VmHWM from /proc/<pid>/status.

    .venv/bin/python benchmarks/bench_collector.py [--seconds 30] [--probes-per-s 1000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy  # noqa: E402

from benchmarks.machine import describe  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--probes-per-s", type=float, default=1000.0, help="probes sent per collector")
    ap.add_argument("--no-echo", action="store_true", help="probe without echoes")
    ap.add_argument(
        "--py-spy",
        metavar="FILE",
        help="also sample the collector with py-spy over the window (collapsed stacks to FILE)",
    )
    args = ap.parse_args()
    spy_bin = Path(sys.executable).with_name("py-spy")
    if args.py_spy and not spy_bin.exists():
        ap.error(f"--py-spy: {spy_bin} not found (pip install py-spy)")
    ports = 8
    rate_per_port = args.probes_per_s / 2 / ports  # coded pairs per (buddy, port) per second
    receiver = Receiver(KEY)
    with tempfile.TemporaryDirectory(prefix="cm-bench-") as tmp_s:
        tmp = Path(tmp_s)
        net = loopback_net()
        a_addr, b_addr = f"{net}.1", f"{net}.2"
        port = free_udp_port(a_addr)
        peers = [
            {"name": "ba", "address": a_addr, "rack": "r"},
            {"name": "bb", "address": b_addr, "rack": "r"},
        ]
        common = {
            "port": port,
            "base_sport": 42000 + port % 20000,
            "probe": {
                "rate_per_port": rate_per_port,
                "ports_per_buddy": ports,
                "echo": not args.no_echo,
            },
            "spool": {"roll_s": 1.0},
        }
        a = CollectorProcess(
            write_config(
                tmp,
                "ba",
                a_addr,
                peers,
                receiver.url,
                **dict(common, probe=dict(common["probe"]), spool=dict(common["spool"])),
            )
        )
        b = CollectorProcess(
            write_config(
                tmp,
                "bb",
                b_addr,
                peers,
                receiver.url,
                **dict(common, probe=dict(common["probe"]), spool=dict(common["spool"])),
            )
        )
        try:
            a.start()
            b.start()
            assert a.proc is not None
            time.sleep(args.warmup)
            pid = a.proc.pid
            spy = None
            if args.py_spy:
                spy = subprocess.Popen(
                    [str(spy_bin), "record", "--pid", str(pid),
                     "--duration", str(int(args.seconds)), "--rate", "250", "--format", "raw",
                     "--nonblocking", "--output", args.py_spy],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            st0, c0, t0 = a.status(), cpu_seconds(pid), time.monotonic()
            time.sleep(args.seconds)
            st1, c1, t1 = a.status(), cpu_seconds(pid), time.monotonic()
            mem = mem_kib(pid)
            if spy is not None:
                spy.wait(30)
        finally:
            a.stop()
            b.stop()
            receiver.close()
    wall = t1 - t0
    sent = (st1["probes_sent"] - st0["probes_sent"]) / wall
    recv = (st1["probes_received"] - st0["probes_received"]) / wall
    echo = (st1["echoes_received"] - st0["echoes_received"]) / wall
    user = 100.0 * (c1[0] - c0[0]) / wall
    system = 100.0 * (c1[1] - c0[1]) / wall
    cpu = user + system
    print(f"machine: {describe(numpy=numpy.__version__)}")
    print(f"window: {wall:.1f} s after {args.warmup:.0f} s warm-up; collector 'ba' (pid {pid})")
    print(f"probes sent/s: {sent:.0f}  received/s: {recv:.0f}  echoes received/s: {echo:.0f}")
    print(
        f"rejected: {sum(st1['rejected'].values())}  kernel TX timestamps: {st1['tx_timestamps']['kernel']}  user: {st1['tx_timestamps']['user']}"
    )
    print(
        f"segments acked: {st1['shipping']['segments_acked']}  spool waiting: {st1['spool']['segments']}"
    )
    print(f"CPU: {cpu:.2f}% of one core (user {user:.2f}%, system {system:.2f}%; target <= 2%)")
    print(
        f"load average during run: {os.getloadavg()[0]:.2f} (other work on the machine inflates CPU figures)"
    )
    print(
        f"RSS: {mem['VmRSS'] / 1024:.1f} MiB, peak {mem['VmHWM'] / 1024:.1f} MiB (target <= 60 MiB)"
    )


if __name__ == "__main__":
    main()
