"""End-to-end ingest throughput: real segments over HTTP into a real daemon, durable in Parquet.

    .venv/bin/python benchmarks/bench_ingest.py [--hosts 2000] [--seconds 10] [--procs 2]
        [--concurrency 64] [--span 1]

Generator processes (separate from the daemon process) pre-build each host's segments
(``--span`` seconds of probe_tx + probe_rx per batch; 1 s = what a collector ships per
spool roll at the default 80 probes/s), sign them with the fleet key, then POST them with
``--concurrency`` requests in flight per process. A record counts only once its batch got
200 (= fsynced Parquet + commit record). At the end the store is read back through the
catalog and must hold exactly the acknowledged rows. Prints figures and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analytics import ingest_load  # noqa: E402
from collector import wire  # noqa: E402

KEY = b"bench-fleet-key-0123456789abcdef"


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    except OSError:
        mem = 0
    import duckdb
    import pyarrow

    return (
        f"{os.cpu_count()} cpus ({cpu}), {mem} MiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, duckdb {duckdb.__version__}, "
        f"pyarrow {pyarrow.__version__}"
    )


def build_bodies(hosts: list[int], n_hosts: int, seconds: int, span: int, t0: int) -> list[bytes]:
    ids = ingest_load.host_ids(n_hosts)
    bodies = []
    for start in range(0, seconds, span):
        for i in hosts:
            if span == 1:
                body = ingest_load.fleet_segment(i, ids, start, t0_ns=t0)
            else:
                segs = [
                    wire.decode(ingest_load.fleet_segment(i, ids, s, t0_ns=t0))
                    for s in range(start, min(start + span, seconds))
                ]
                body = wire.encode_header(segs[0].host, segs[0].host_id, start, t0)
                for table in ("probe_tx", "probe_rx"):
                    body += wire.encode_chunk(table, np.concatenate([s.table(table) for s in segs]))
            bodies.append(body)
    return bodies


def generator(idx: int, args: argparse.Namespace, url: str, t0: int, ready, go, out) -> None:
    import aiohttp

    hosts = list(range(idx, args.hosts, args.procs))
    bodies = build_bodies(hosts, args.hosts, args.seconds, args.span, t0)
    signed = [(b, wire.sign(KEY, b)) for b in bodies]
    ready.put(idx)
    go.wait()

    async def run() -> tuple[int, int, float, float]:
        queue = list(reversed(signed))
        rows = batches = 0
        first = time.time()
        last = first
        conn = aiohttp.TCPConnector(limit=args.concurrency)
        async with aiohttp.ClientSession(connector=conn) as session:

            async def worker() -> None:
                nonlocal rows, batches, last
                while queue:
                    body, auth = queue.pop()
                    while True:
                        async with session.post(
                            url, data=body, headers={"Authorization": auth}
                        ) as resp:
                            data = await resp.read()
                        if resp.status == 200:
                            rows += json.loads(data)["rows"]
                            batches += 1
                            last = time.time()
                            break
                        if resp.status < 500:
                            raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
                        await asyncio.sleep(0.05)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        return rows, batches, first, last

    out.put(asyncio.run(run()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=10, help="seconds of fleet traffic to send")
    ap.add_argument("--span", type=int, default=1, help="seconds of one host per batch")
    ap.add_argument("--procs", type=int, default=2, help="generator processes")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight per process")
    ap.add_argument("--roll-s", type=float, default=0.2, help="daemon group-commit interval")
    ap.add_argument("--keep", action="store_true", help="keep the store directory")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="clockmesh-bench-ingest-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (work / "fleet.key").write_bytes(KEY)
    (work / "ingest.yml").write_text(
        json.dumps(
            {
                "listen": f"127.0.0.1:{port}",
                "store_dir": str(work / "store"),
                "fleet_key_file": str(work / "fleet.key"),
                "roll_s": args.roll_s,
                "min_free_bytes": 0,
                "log_level": "warning",
            }
        )
    )
    log = open(work / "ingest.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen(
        [sys.executable, "-m", "clockmesh.cli", "ingest", "run", "--config", str(work / "ingest.yml")],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        t0 = (time.time_ns() // 10**9) * 10**9
        ctx = mp.get_context("fork")
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(target=generator, args=(i, args, url + "/v1/batch", t0, ready, go, out))
            for i in range(args.procs)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=600)
        go.set()
        results = [out.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
        rows = sum(r[0] for r in results)
        batches = sum(r[1] for r in results)
        elapsed = max(r[3] for r in results) - min(r[2] for r in results)
        import duckdb

        con = duckdb.connect(str(work / "store" / "catalog.duckdb"), read_only=True)
        stored = con.execute(
            "SELECT (SELECT count(*) FROM probe_tx) + (SELECT count(*) FROM probe_rx)"
        ).fetchone()[0]
        con.close()
        rate = rows / elapsed
        print(f"machine: {machine()}")
        print(
            f"setup: {args.hosts} hosts x {args.seconds} s, {args.span} s per batch "
            f"(~{rows // max(batches, 1)} records/batch), {args.procs} generator procs x "
            f"{args.concurrency} in flight, roll_s={args.roll_s}"
        )
        print(f"acknowledged: {batches} batches, {rows} records in {elapsed:.2f} s")
        print(f"stored (read back via catalog): {stored} records  exact={stored == rows}")
        print(f"throughput: {rate:,.0f} records/s end to end ({batches / elapsed:,.0f} batches/s)")
        print(f"hosts per ops box at 80 probes/s (tx + rx = 160 records/s/host): {rate / 160:,.0f}")
        if stored != rows:
            sys.exit("store does not hold exactly the acknowledged records")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"store kept in {work}")


if __name__ == "__main__":
    main()
