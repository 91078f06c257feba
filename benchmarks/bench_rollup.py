"""CPU of one final minute's rollups (``probe_minute`` + ``path_minute``) at fleet scale.

    .venv/bin/python benchmarks/bench_rollup.py [--hosts 12500] [--seconds 60] [--repeat 3]

Once a minute the ingest daemon rolls the minute's joined probes up: per host pair and per
ECMP path (pair + UDP source port) sent, received, min/max, exact p50/p99 (pairs also p90
and the mean). At 12,500 hosts and the default rate (80 probes/s per host: 10 buddies x 8
source ports) that is 60 M probes in 125,000 pairs and 1,000,000 paths a minute; the
ingest benchmark's traffic never spans a whole minute after the daemon starts, so this
measures the rollup on its own: what it costs the ops box every minute, on top of ingest.

The joined rows are built as the hot window holds them: in arrival order (each host's
probes of a ``--span``-second segment together, hosts' segments interleaved), one-way
delay = 5 us + jitter + the two hosts' clock offsets, 1 % lost (null). The same rows go
through :func:`analytics.ingest.hot_window.rollup_minute` (today's) and through the SQL
the daemon ran before 2026-11-22 (one ``quantile_cont`` per fraction, ``count(DISTINCT
sport)`` per pair), in one run, on one DuckDB thread each as in the daemon; the outputs
must be identical. Prints the machine, CPU seconds of each, their ratio, and the share of
one core each costs at this fleet size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analytics.ingest import load as ingest_load  # noqa: E402
from analytics.ingest.hot_window import query_over, rollup_minute  # noqa: E402
from analytics.store import layout  # noqa: E402
from benchmarks.bench_ingest import machine  # noqa: E402

MINUTE_NS = 29_000_000 * layout.NS_PER_MINUTE  # a minute in 2025

# The daemon's rollup SQL until 2026-11-22 (the baseline; j had a minute_ns column).
OLD_PAIR = """
    SELECT minute_ns, src, dst, count(DISTINCT sport) AS paths,
           count(*) AS sent, count(d) AS received, min(d) AS delay_min_ns,
           quantile_cont(d, 0.5) AS delay_p50_ns,
           quantile_cont(d, 0.9) AS delay_p90_ns,
           quantile_cont(d, 0.99) AS delay_p99_ns, max(d) AS delay_max_ns,
           avg(d) AS delay_mean_ns
    FROM j GROUP BY ALL ORDER BY minute_ns, src, dst
"""
OLD_PATH = """
    SELECT minute_ns, src, dst, sport::INTEGER AS sport, count(*) AS sent,
           count(d) AS received,
           min(d) AS delay_min_ns, quantile_cont(d, 0.5) AS delay_p50_ns,
           quantile_cont(d, 0.99) AS delay_p99_ns, max(d) AS delay_max_ns
    FROM j GROUP BY ALL ORDER BY minute_ns, src, dst, sport
"""


def joined_minute(hosts: int, seconds: int, span: int, seed: int = 1) -> pa.Table:
    """A minute's joined rows (src, dst, sport, d) in the order the hot window holds them."""
    rng = np.random.default_rng(seed)
    ids = ingest_load.host_ids(hosts)
    buddies, ports = ingest_load.DEFAULT_BUDDIES, ingest_load.DEFAULT_PORTS
    per_s = buddies * ports
    offset = rng.normal(0, 200_000, hosts).astype(np.int64)  # clocks not corrected yet
    # (arrival, host, first second, last second + 1): each host's segments, staggered
    blocks = []
    for h in range(hosts):
        phase = int(rng.integers(0, span))
        for first in range(-phase, seconds, span):
            lo, hi = max(first, 0), min(first + span, seconds)
            blocks.append((first + span + h / hosts, h, lo, hi))
    blocks.sort()
    n = hosts * seconds * per_s
    src = np.empty(n, np.int64)
    dst = np.empty(n, np.int64)
    sport = np.empty(n, np.uint16)
    d = np.empty(n, np.int64)
    k = np.arange(per_s)
    pos = 0
    for _, h, lo, hi in blocks:
        rows = (hi - lo) * per_s
        end = pos + rows
        kk = np.tile(k, hi - lo)
        buddy = (h + 1 + kk // ports) % hosts
        src[pos:end] = ids[h]
        dst[pos:end] = ids[buddy]
        sport[pos:end] = 40000 + kk % ports
        d[pos:end] = 5_000 + offset[buddy] - offset[h]
        pos = end
    d += rng.gamma(2.0, 800.0, n).astype(np.int64)
    lost = rng.random(n) < 0.01
    return pa.table({"src": src, "dst": dst, "sport": sport, "d": pa.array(d, mask=lost)})


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET threads = 1")  # as the hot window: the other core ingests
    con.execute("SET preserve_insertion_order = false")
    return con


def old_rollup(con: duckdb.DuckDBPyConnection, j: pa.Table) -> tuple[pa.Table, pa.Table]:
    j = j.add_column(0, "minute_ns", pa.repeat(pa.scalar(MINUTE_NS, pa.int64()), j.num_rows))
    pair, path = query_over(con, "j", j, OLD_PAIR, OLD_PATH)
    return (
        pair.cast(layout.TABLES["probe_minute"].schema),
        path.cast(layout.TABLES["path_minute"].schema),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hosts", type=int, default=12_500, help="fleet size")
    ap.add_argument("--seconds", type=int, default=60, help="seconds of probes in the minute")
    ap.add_argument("--span", type=int, default=21, help="segment length (s) the hosts ship")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    t = time.monotonic()
    j = joined_minute(args.hosts, args.seconds, args.span)
    print(
        f"setup: {args.hosts} hosts x {args.seconds} s, {j.num_rows:,} joined probes "
        f"({j.column('d').null_count:,} lost), built in {time.monotonic() - t:.0f} s"
    )
    con = connect()
    times: dict[str, list[float]] = {"today": [], "before": []}
    outputs = {}
    for _ in range(args.repeat):
        for name, run in (
            ("today", lambda: rollup_minute(con, MINUTE_NS, j)),
            ("before", lambda: old_rollup(con, j)),
        ):
            t = time.process_time()
            outputs[name] = run()
            times[name].append(time.process_time() - t)
    new, old = outputs["today"], outputs["before"]
    same = new[0].equals(old[0]) and new[1].equals(old[1])
    print(f"rollup rows: {new[0].num_rows:,} pairs, {new[1].num_rows:,} paths; identical: {same}")
    best = {name: min(v) for name, v in times.items()}
    for name, v in times.items():
        runs = ", ".join(f"{x:.2f}" for x in v)
        print(
            f"{name:>6}: {best[name]:.2f} CPU-s per minute (runs {runs}), "
            f"{best[name] / j.num_rows * 1e9:.0f} ns per probe, "
            f"{best[name] / 60:.1%} of one core"
        )
    print(f"ratio before/today: {best['before'] / best['today']:.2f}x")
    if not same:
        sys.exit("today's rollup differs from the SQL it replaced")


if __name__ == "__main__":
    main()
