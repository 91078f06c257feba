"""Where contention's detection latency goes, from labelled runs already made.

    .venv/bin/python benchmarks/bench_contention_stages.py RUN_DIR [RUN_DIR ...]

For every `contention` fault in each run's ``truth.json`` (``lab scenario run``), three
stages from its onset to the anomaly, all read from the run's store:

- *queued*: onset → the first probe sent after it whose corrected one-way delay (``owd``)
  is ≥ 100 µs over its path's (src, dst, source port) median of the 20 s before — the
  queue is there and a probe has waited in it;
- *shipped*: that probe → the batch holding it at the ops box (``batches.received_ns`` of
  the receiver's segment open when it wrote the probe down: :func:`_arrival`);
- *judged*: that batch → the first `contention` anomaly in the fault's window, timed as
  ``clockmesh detector eval`` times it (:mod:`analytics.detect.evaluate`).

The three add up to the latency ``detector eval`` reports. Send times are on the mesh's
reference clock, the rest on the ops box's (in the lab one kernel clock, skewed by each
collector by at most milliseconds). Prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analytics.detect.evaluate import fault_window, stored_anomalies
from analytics.store.catalog import connect_views
from benchmarks.machine import describe

QUEUED_NS = 100_000  # a probe that waited at least this long over its path's median
BASELINE_NS = 20_000_000_000  # the path's healthy median is taken over this much before onset
STAGES = ("queued", "shipped", "judged", "total")
FLUSH_NS = 300_000_000  # collector.agent.FLUSH_S: received probes are written at a drain


def _arrival(con: duckdb.DuckDBPyConnection, src: int, seq: int, dst: int) -> int | None:
    """When the batch holding probe (src, seq) reached the ops box. The receiver writes
    it into the segment open at its next socket drain (every ``FLUSH_S``, 0.3 s); a
    segment's ``created_ns`` is when it was opened, on the receiver's clock as ``rx_ns``
    is. A segment opened within 0.3 s after the receive was opened at that drain (the
    one before had rolled), else the probe is in the one open at the receive."""
    rx = con.execute(
        f"SELECT min(rx_ns) FROM probe_rx WHERE src = {src} AND seq = {seq}"
    ).fetchone()
    if rx is None or rx[0] is None:
        return None
    segs = con.execute(
        f"SELECT created_ns, received_ns FROM batches WHERE host_id = {dst} "
        f"AND created_ns BETWEEN {rx[0] - 5_000_000_000} AND {rx[0] + 5_000_000_000} "
        "ORDER BY created_ns"
    ).fetchall()
    before = [r for c, r in segs if c <= rx[0]]
    after = [(c, r) for c, r in segs if c > rx[0]]
    if after and after[0][0] - rx[0] < FLUSH_NS:
        return int(after[0][1])
    return int(before[-1]) if before else None


def stages(run: Path) -> list[tuple[str, str, list[float]]]:
    """[(kind, where, [queued, shipped, judged, total] seconds)] of one run's contention."""
    truth = json.loads((run / "truth.json").read_text())
    opened_at = [a["opened_ns"] for a in stored_anomalies(run) if a["kind"] == "contention"]
    con = connect_views(run / "store", only=["owd", "probe_rx", "batches"])
    out = []
    for f in truth["faults"]:
        if f["label"] != "contention":
            continue
        lo, hi = fault_window(f)
        opened = min((t for t in opened_at if lo <= t <= hi), default=None)
        s0, s1 = int(f["start_ns"]), int(f["end_ns"])
        first = con.execute(
            f"""WITH o AS (SELECT * FROM owd WHERE ts_ns BETWEEN {s0 - BASELINE_NS} AND {s1}),
                base AS (SELECT src, dst, sport, median(owd_ns) AS m FROM o
                         WHERE ts_ns < {s0} GROUP BY ALL)
            SELECT o.src, o.seq, o.dst, o.ts_ns FROM o JOIN base USING (src, dst, sport)
            WHERE o.ts_ns >= {s0} AND o.owd_ns - base.m >= {QUEUED_NS}
            ORDER BY o.ts_ns LIMIT 1"""
        ).fetchone()
        if opened is None or first is None:
            print(f"{run.name}: {f['where']}: no anomaly or no queued probe (not counted)")
            continue
        src, seq, dst, sent = first
        arrived = _arrival(con, src, seq, dst)
        if arrived is None:
            print(f"{run.name}: {f['where']}: the queued probe's batch is not stored")
            continue
        t = [(sent - s0) / 1e9, (arrived - sent) / 1e9, (opened - arrived) / 1e9]
        out.append((f["kind"], f["where"], [*t, (opened - s0) / 1e9]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (truth.json, store/)")
    args = ap.parse_args()
    for run in args.runs:
        if not (run / "truth.json").is_file() or not (run / "store").is_dir():
            ap.error(f"{run}: expected a `lab scenario run` directory (truth.json and store/)")
    print(describe(duckdb=duckdb.__version__))
    every: list[list[float]] = []
    for run in args.runs:
        for kind, where, t in stages(run):
            every.append(t)
            print(f"{run.name} {kind:15s} {where:14s} "
                  + "  ".join(f"{n} {v:5.2f}" for n, v in zip(STAGES, t, strict=True)))  # fmt: skip
    if not every:
        print("no contention fault with an anomaly in these runs")
        return
    print(f"{len(every)} contention faults, seconds:")
    for i, name in enumerate(STAGES):
        v = [t[i] for t in every]
        print(f"  {name:8s} median {statistics.median(v):.2f}  min {min(v):.2f}  max {max(v):.2f}")


if __name__ == "__main__":
    main()
