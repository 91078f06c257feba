"""Query speed of the one-way-delay-per-minute view over 24 h of a 1,000-host fleet.

    .venv/bin/python benchmarks/bench_query.py [--hosts 1000] [--hours 24] [--buddies 10]

What the view reads: at the default rate (80 probes/s per host) 1,000 hosts send
6.9 billion probes a day; no per-minute query over raw probe_tx/probe_rx answers in
seconds on two cores. The ingest daemon therefore rolls each finished minute up into
``probe_minute`` (per host pair: sent, received, delay min/p50/p90/p99/max/mean) and
``owd_minute`` is a view over that: hosts x buddies x 1440 rows a day (14.4 M here).
This script writes 24 h of such rollups straight into the store layout (one compacted
file per hour partition, as the compactor leaves them), builds the catalog, and times
the queries an SRE runs. Prints figures and the machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analytics.ingest import load as ingest_load  # noqa: E402
from analytics.store import layout  # noqa: E402
from analytics.store.catalog import write_catalog  # noqa: E402
from analytics.store.store_writer import StoreWriter  # noqa: E402
from benchmarks.bench_ingest import machine  # noqa: E402


def generate(store: Path, hosts: int, hours: int, buddies: int) -> int:
    writer = StoreWriter(store)
    writer.open()
    ids = ingest_load.host_ids(hosts)
    now_ns = time.time_ns()
    first_minute = (now_ns // layout.NS_PER_MINUTE - hours * 60) * layout.NS_PER_MINUTE
    names = pa.table(
        {
            "ts_ns": pa.array(np.full(hosts, first_minute, np.int64)),
            "host_id": pa.array(ids),
            "host": pa.array([ingest_load.host_name(i) for i in range(hosts)]),
        },
        schema=layout.TABLES["host_names"].schema,
    )
    writer.write_partitioned("host_names", names, "m000000000000-000000000000.parquet")
    src = np.repeat(np.arange(hosts), buddies)
    dst = (src + 1 + np.tile(np.arange(buddies), hosts)) % hosts
    rng = np.random.default_rng(7)
    total = 0
    for h in range(hours):
        minutes = first_minute + (h * 60 + np.arange(60)) * layout.NS_PER_MINUTE
        n = len(src) * 60
        m = np.repeat(minutes, len(src))
        sent = np.full(n, 480, np.int64)  # 8 ports x 1 pair/s x 60 s
        received = sent - (rng.random(n) < 0.01) * rng.integers(1, 50, n)
        p50 = rng.normal(5_000, 300, n)
        table = pa.table(
            {
                "minute_ns": m,
                "src": np.tile(ids[src], 60),
                "dst": np.tile(ids[dst], 60),
                "paths": np.full(n, 8, np.int64),
                "sent": sent,
                "received": received,
                "delay_min_ns": (p50 * 0.8).astype(np.int64),
                "delay_p50_ns": p50,
                "delay_p90_ns": p50 * 1.3,
                "delay_p99_ns": p50 * 2 + rng.exponential(2_000, n),
                "delay_max_ns": (p50 * 4).astype(np.int64),
                "delay_mean_ns": p50 * 1.1,
            },
            schema=layout.TABLES["probe_minute"].schema,
        )
        first = int(minutes[0] // layout.NS_PER_MINUTE)
        writer.write_partitioned("probe_minute", table, f"m{first:012d}-{first + 59:012d}.parquet")
        total += n
    write_catalog(store)
    return total


QUERIES = {
    "fleet per minute, 24 h": """
        SELECT minute, sum(sent) AS sent, sum(received) AS received,
               median(owd_raw_p50_us) AS p50_us, max(owd_raw_p99_us) AS worst_p99_us
        FROM owd_minute WHERE minute >= now()::TIMESTAMP - INTERVAL 24 HOUR
        GROUP BY minute ORDER BY minute""",
    "one pair per minute, 24 h": """
        SELECT minute, loss, owd_raw_p50_us, owd_raw_p99_us FROM owd_minute
        WHERE src_host = 'gpu00042' AND dst_host = 'gpu00043' ORDER BY minute""",
    "one host's pairs per minute, 24 h": """
        SELECT minute, dst_host, owd_raw_p50_us FROM owd_minute
        WHERE src_host = 'gpu00500' ORDER BY minute, dst_host""",
    "worst 10 pairs by p99, 24 h": """
        SELECT src_host, dst_host, sum(sent) - sum(received) AS lost,
               max(owd_raw_p99_us) AS worst_p99_us
        FROM owd_minute GROUP BY ALL ORDER BY worst_p99_us DESC LIMIT 10""",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--buddies", type=int, default=10)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    import duckdb

    work = Path(tempfile.mkdtemp(prefix="clockmesh-bench-query-"))
    try:
        started = time.monotonic()
        rows = generate(work / "store", args.hosts, args.hours, args.buddies)
        gen_s = time.monotonic() - started
        size = sum(p.stat().st_size for p in (work / "store").rglob("*.parquet"))
        print(f"machine: {machine()}")
        print(
            f"data: {args.hosts} hosts x {args.buddies} buddies x {args.hours} h -> {rows:,} "
            f"probe_minute rows ({size / 1e6:.0f} MB Parquet), generated in {gen_s:.1f} s"
        )
        print(f"(raw equivalent: {args.hosts * 80 * 3600 * args.hours:,} probes per table)")
        worst = 0.0
        for label, sql in QUERIES.items():
            con = duckdb.connect(str(work / "store" / "catalog.duckdb"), read_only=True)
            t = time.monotonic()
            result = con.execute(sql).fetchall()
            dt = time.monotonic() - t
            con.close()
            worst = max(worst, dt)
            print(f"{label:38s} {dt:6.2f} s  ({len(result)} rows, cold connection)")
        print(f"slowest: {worst:.2f} s (target <= 5 s): {'PASS' if worst <= 5 else 'FAIL'}")
    finally:
        if args.keep:
            print(f"store kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
