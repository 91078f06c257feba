"""`clockmesh report` over 24 h of generated telemetry for 1,000 hosts at default rates.

    .venv/bin/python benchmarks/bench_report.py [--hosts 1000] [--hours 24] [--dir DIR]

Generates a store the way the ops box leaves it — per-minute probe rollups
(`probe_minute`: every host to its rack and its 10 random buddies, every minute), the
clock solver's estimates (`clock`: every host, every 2-s window), host names, 60
anomalies over the day, remediations, an audit — then times `clockmesh report --since
24h` end to end in a fresh process (store views, queries, plots, HTML/Markdown/JSON).
The generation is not timed. Acceptance (issue 19): <= 15 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analytics.store import layout
from benchmarks.machine import describe
from collector import records

NS = 1_000_000_000


def _write(store: Path, table: str, cols: dict[str, np.ndarray], hour: int, name: str) -> int:
    spec = layout.TABLES[table]
    part = store / table / layout.partition_of(hour)
    part.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols, schema=spec.schema), part / name, compression="zstd")
    return len(next(iter(cols.values())))


def generate(store: Path, hosts: int, hours: int, end_ns: int) -> dict[str, int]:
    rng = np.random.default_rng(7)
    store.mkdir(parents=True, exist_ok=True)
    (store / "store.json").write_text(json.dumps({"schema": layout.STORE_SCHEMA}))
    per_rack = 8
    names = [f"h{i // per_rack + 1}-{i % per_rack + 1}" for i in range(hosts)]
    ids = np.array([records.host_id(n) for n in names], dtype=np.int64)
    start = end_ns - hours * 3600 * NS
    h0 = start // layout.NS_PER_HOUR
    counts = {"probe_minute": 0, "clock": 0}
    _write(store, "host_names", {"ts_ns": np.full(hosts, start), "host_id": ids,
           "host": np.array(names)}, h0, "names.parquet")  # fmt: skip
    # Each host probes its rack (7 peers) and 10 random buddies: 17 destinations.
    src_i = np.repeat(np.arange(hosts), 17)
    rack_peers = [(i // per_rack) * per_rack + j for i in range(hosts) for j in range(per_rack)
                  if (i // per_rack) * per_rack + j != i]  # fmt: skip
    buddies = rng.integers(0, hosts, size=(hosts, 10))
    dst_i = np.concatenate([np.array(rack_peers).reshape(hosts, 7), buddies], axis=1).ravel()
    n_pairs = len(src_i)
    windows_per_hour = 1800
    for h in range(hours):
        hour_ns = (h0 + h) * layout.NS_PER_HOUR
        minutes = hour_ns + np.arange(60, dtype=np.int64) * 60 * NS
        m = np.repeat(minutes, n_pairs)
        sent = np.full(len(m), 480, dtype=np.int64)  # 8 ports x 1 coded pair/s x 60 s
        p50 = rng.normal(5500, 300, len(m))
        counts["probe_minute"] += _write(store, "probe_minute", {
            "minute_ns": m, "src": np.tile(ids[src_i], 60), "dst": np.tile(ids[dst_i], 60),
            "paths": np.full(len(m), 8), "sent": sent,
            "received": sent - (rng.random(len(m)) < 0.001).astype(np.int64),
            "delay_min_ns": (p50 - 500).astype(np.int64), "delay_p50_ns": p50,
            "delay_p90_ns": p50 + 800, "delay_p99_ns": p50 + 3000,
            "delay_max_ns": (p50 + 9000).astype(np.int64), "delay_mean_ns": p50 + 200,
        }, h0 + h, "minute.parquet")  # fmt: skip
        w = hour_ns + np.arange(windows_per_hour, dtype=np.int64) * 2 * NS
        ws = np.repeat(w, hosts)
        counts["clock"] += _write(store, "clock", {
            "window_start_ns": ws, "window_end_ns": ws + 2 * NS, "host": np.tile(ids, len(w)),
            "offset_ns": rng.normal(0, 1e6, len(ws)), "drift_ppm": rng.normal(0, 5, len(ws)),
            "uncertainty_ns": np.abs(rng.normal(40, 15, len(ws))),
            "reference": np.full(len(ws), ids[0]), "method": np.full(len(ws), "huygens"),
        }, h0 + h, "clock.parquet")  # fmt: skip
    rows = []
    for k in range(60):
        t = start + int(rng.integers(0, hours * 3600)) * NS
        kind = ["flapping_link", "roce_v1_job", "contention"][k % 3]
        link = (
            f"leaf{k % (hosts // per_rack) + 1}-spine{k % 2 + 1}" if kind != "roce_v1_job" else ""
        )
        ev = {"outages_s": [1.5, 4.2] if kind == "flapping_link" else [],
              "racks_exposed": [f"leaf{k % (hosts // per_rack) + 1}"]}  # fmt: skip
        rows.append({"opened_ns": t, "closed_ns": t + 90 * NS, "anomaly_id": f"a-{k}",
                     "kind": kind, "score": 0.9, "src": 0, "dst": 0, "link": link,
                     "job_id": "" if link else f"job{k}", "updated_ns": t + 90 * NS,
                     "detail": json.dumps({"summary": f"{kind} {k}", "evidence": ev})})  # fmt: skip
    cols = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    _write(store, "anomalies", cols, h0 + hours - 1, "anomalies.parquet")
    counts["anomalies"] = len(rows)
    topo = {"hosts": [{"name": n, "rack": f"leaf{i // per_rack + 1}"} for i, n in enumerate(names)]}
    (store.parent / "topology.json").write_text(json.dumps(topo))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/clockmesh-bench-report"))
    args = ap.parse_args()
    print(describe())
    store = args.dir / "store"
    end_ns = (time.time_ns() // layout.NS_PER_HOUR) * layout.NS_PER_HOUR
    if store.exists():
        import shutil

        shutil.rmtree(store)
    t0 = time.monotonic()
    counts = generate(store, args.hosts, args.hours, end_ns)
    size = sum(f.stat().st_size for f in store.rglob("*.parquet")) / 2**20
    print(f"generated {args.hosts} hosts x {args.hours} h in {time.monotonic() - t0:.0f} s: "
          f"{counts['probe_minute']:,} probe_minute rows, {counts['clock']:,} clock rows, "
          f"{counts['anomalies']} anomalies, {size:.0f} MiB")  # fmt: skip
    until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(end_ns / NS))
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(end_ns / NS - args.hours * 3600))
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "report", "--since", since,
         "--until", until, "--out", str(args.dir / "out"), "--store", str(store),
         "--topology", str(args.dir / "topology.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    took = time.monotonic() - t0
    if res.returncode != 0:
        sys.exit(f"report failed: {res.stderr.strip()}")
    print(res.stdout.strip())
    print(
        f"clockmesh report over {args.hours} h, {args.hosts} hosts: {took:.1f} s "
        "(fresh process, end to end; acceptance <= 15 s)"
    )


if __name__ == "__main__":
    main()
