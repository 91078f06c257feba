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
        [--echo-every N | --no-echo] [--ops N] [--py-spy FILE]

``--ops 2`` (issue 29): a second pair of collectors runs side by side with the first
over the same window, shipping every segment to two receivers instead of one; both
are reported, with the ratio of their CPU and the CPU of their shipping threads
alone (the OS threads named ``cm-shipper``).
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
SHIPPER_THREAD = "cm-shipper"


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


def shipper_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid``'s shipping threads (OS name cm-shipper)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != SHIPPER_THREAD:
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def run(
    args: argparse.Namespace, echo_every: int | None, spy_bin: Path, boxes: list[int]
) -> list[dict[str, Any]]:
    """One measurement window: one pair of collectors per entry of ``boxes`` (each pair
    shipping to that many receivers), all running side by side over the same window;
    ``echo_every`` None = the collector's default. One result per pair."""
    ports = 8
    rate_per_port = args.probes_per_s / 2 / ports  # coded pairs per (buddy, port) per second
    probe: dict[str, Any] = {"rate_per_port": rate_per_port, "ports_per_buddy": ports}
    if echo_every is not None:
        probe["echo_every"] = echo_every
    receivers = [[Receiver(KEY) for _ in range(n)] for n in boxes]
    pairs: list[tuple[CollectorProcess, CollectorProcess]] = []
    with (
        tempfile.TemporaryDirectory(prefix="cm-bench-") as tmp_s,
        tempfile.TemporaryDirectory(prefix="cm-bench-", dir=run_dir()) as run_s,
    ):
        try:
            for i, rcvs in enumerate(receivers):
                tmp = Path(tmp_s) / f"pair{i}"
                net = loopback_net()
                a_addr, b_addr = f"{net}.1", f"{net}.2"
                port = free_udp_port(a_addr)
                names = ("ba", "bb") if i == 0 else (f"b{i}a", f"b{i}b")
                peers = [
                    {"name": names[0], "address": a_addr, "rack": "r"},
                    {"name": names[1], "address": b_addr, "rack": "r"},
                ]
                ingest = (
                    {"url": rcvs[0].url} if len(rcvs) == 1
                    else {"url": "", "urls": [r.url for r in rcvs]}
                )  # fmt: skip

                def config(host: str, address: str) -> Path:
                    return write_config(
                        tmp, host, address, peers, "", port=port,  # noqa: B023
                        base_sport=42000 + port % 20000, probe=dict(probe),  # noqa: B023
                        spool={"roll_s": 1.0}, ingest=dict(ingest),  # noqa: B023
                        status_file=f"{run_s}/{host}.status.json",
                    )  # fmt: skip

                pairs.append(
                    (CollectorProcess(config(names[0], a_addr)),
                     CollectorProcess(config(names[1], b_addr)))
                )  # fmt: skip
            for a, b in pairs:
                a.start()
                b.start()
            time.sleep(args.warmup)
            pids = [(a.proc.pid, b.proc.pid) for a, b in pairs]  # type: ignore[union-attr]
            spy = None
            if args.py_spy:
                spy = subprocess.Popen(
                    [str(spy_bin), "record", "--pid", str(pids[0][0]),
                     "--duration", str(int(args.seconds)), "--rate", "250", "--format", "raw",
                     "--nonblocking", "--output", args.py_spy],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            load0 = os.getloadavg()[0]
            before = [
                (a.status(), cpu_seconds(p), cpu_seconds(q), shipper_cpu_seconds(p))
                for (a, _), (p, q) in zip(pairs, pids, strict=True)
            ]
            t0 = time.monotonic()
            time.sleep(args.seconds)
            after = [
                (a.status(), cpu_seconds(p), cpu_seconds(q), shipper_cpu_seconds(p))
                for (a, _), (p, q) in zip(pairs, pids, strict=True)
            ]
            t1 = time.monotonic()
            load1 = os.getloadavg()[0]
            mems = [mem_kib(p) for p, _ in pids]
            if spy is not None:
                spy.wait(30)
        finally:
            for a, b in pairs:
                a.stop()
                b.stop()
            for rcvs in receivers:
                for r in rcvs:
                    r.close()
    wall = t1 - t0
    out = []
    for (st0, c0, p0, s0), (st1, c1, p1, s1), mem, (pid, _), n in zip(
        before, after, mems, pids, boxes, strict=True
    ):
        out.append(
            {
                "pid": pid,
                "boxes": n,
                "wall": wall,
                "sent": (st1["probes_sent"] - st0["probes_sent"]) / wall,
                "recv": (st1["probes_received"] - st0["probes_received"]) / wall,
                "echo": (st1["echoes_received"] - st0["echoes_received"]) / wall,
                "rejected": {  # in the window, by reason (the status counts since start)
                    k: v - st0["rejected"].get(k, 0)
                    for k, v in st1["rejected"].items()
                    if v - st0["rejected"].get(k, 0)
                },
                "tx_kernel": st1["tx_timestamps"]["kernel"],
                "tx_user": st1["tx_timestamps"]["user"],
                "acked": [x["segments_acked"] for x in st1["shipping"]["boxes"]],
                "waiting": st1["spool"]["segments"],
                "user": 100.0 * (c1[0] - c0[0]) / wall,
                "system": 100.0 * (c1[1] - c0[1]) / wall,
                "shipping": 100.0 * (s1 - s0) / wall,
                "peer": 100.0 * (sum(p1) - sum(p0)) / wall,
                "load": (load0, load1),
                "mem": mem,
            }
        )
    return out


def report(title: str, r: dict[str, Any]) -> None:
    cpu = r["user"] + r["system"]
    print(f"== {title}")
    print(
        f"  window: {r['wall']:.1f} s; collector (pid {r['pid']}) shipping to "
        f"{r['boxes']} ops box{'es' if r['boxes'] > 1 else ''}"
    )
    print(
        f"  probes sent/s: {r['sent']:.0f}  received/s: {r['recv']:.0f}  "
        f"echoes received/s: {r['echo']:.0f}"
    )
    why = ", ".join(f"{k} {v}" for k, v in sorted(r["rejected"].items()))
    print(
        f"  rejected in the window: {sum(r['rejected'].values())}{f' ({why})' if why else ''}"
        f"  kernel TX timestamps: {r['tx_kernel']}  "
        f"user: {r['tx_user']}  segments acked per box: {r['acked']}  "
        f"spool waiting: {r['waiting']}"
    )
    print(
        f"  CPU: {cpu:.2f}% of one core (user {r['user']:.2f}%, system {r['system']:.2f}%; "
        f"target <= 2%)  load average {r['load'][0]:.2f} -> {r['load'][1]:.2f}"
    )
    print(f"  CPU of its shipping threads (cm-shipper): {r['shipping']:.3f}%")
    print(f"  CPU of its peer (same work, same window): {r['peer']:.2f}%")
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
        "--ops",
        type=int,
        default=1,
        metavar="N",
        help="also run, side by side in the same window, a pair whose collectors ship to N "
        "ops boxes, and compare its CPU with the pair shipping to one (issue 29: <= 1.5x)",
    )
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
    if args.ops < 1:
        ap.error("--ops: expected an int >= 1")
    boxes = [1] if args.ops == 1 else [1, args.ops]
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
        f"{args.probes_per_s:.0f} probes/s sent by each of two collectors on loopback"
        f"{f' (two such pairs side by side, shipping to 1 and {args.ops} boxes)' if args.ops > 1 else ''}; "
        f"{args.seconds:.0f}-s window after {args.warmup:.0f} s warm-up per run"
    )
    for i, (title, every) in enumerate(runs):
        results = run(args, every, spy_bin, boxes)
        if i == 0:
            args.py_spy = None  # one profile: the first run
        for result in results:
            report(title, result)
        if len(results) == 2:
            one, many = results
            cpu_one, cpu_many = one["user"] + one["system"], many["user"] + many["system"]
            print(
                f"== {args.ops} ops boxes against 1, same window: collector CPU "
                f"{cpu_many:.2f}% / {cpu_one:.2f}% = {cpu_many / cpu_one:.2f}x (target <= 1.5x); "
                f"shipping threads {many['shipping']:.3f}% / {one['shipping']:.3f}%"
            )


if __name__ == "__main__":
    main()
