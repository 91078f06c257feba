"""Clock steps found by the solver in held-out lab runs, against the runs' truth.

    .venv/bin/clockmesh lab scenario run --seed 1258 --minutes 8 \\
        --kinds clock_step,clean --out /tmp/ho1258
    .venv/bin/python benchmarks/bench_clock_steps.py /tmp/ho1258 [/tmp/ho1259 ...]

Each run directory holds the scenario's store and ``truth.json``. Every 2-s window of
the store's probe records is solved in order, with the previous window's state as prior
(as the ops box does), and the hosts the solver states stepped
(``WindowSolution.stepped``) are compared with the scenario's ``clock_step`` faults: a
step is found when the window that holds its injection time (±2 s: a collector reload
takes effect at its next probe) names its host. Prints per run the steps (found, on
which window, the size stated against the size injected), the windows that named a host
with no step injected near (false), and the wall time per window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_clock_lab import _from_store, window_rows
from machine import describe

from analytics.clock import SolverConfig, solve_window
from collector.records import ECHO, PROBE_RX, PROBE_TX

WINDOW_NS = 2_000_000_000
NEAR_NS = 2_000_000_000  # a step's window: the one holding its injection, give or take


def _names(store: Path) -> dict[int, str]:
    files = [str(f) for f in (store / "host_names").glob("date=*/hour=*/*.parquet")]
    if not files:
        return {}
    rows = duckdb.connect().execute(
        "SELECT host_id, host FROM read_parquet(?, union_by_name=true)", [files]
    )
    return dict(rows.fetchall())


def run(path: Path) -> tuple[int, int, int, int]:
    """Solve one run; print its table. Returns (steps, found, windows, false)."""
    store = path / "store"
    truth = json.loads((path / "truth.json").read_text())
    t0 = int(truth["started_ns"])
    steps = [
        (int(f["start_ns"]), str(f["where"]), int(f["detail"]["step_ns"]))
        for f in truth["faults"]
        if f["kind"] == "clock_step"
    ]
    tx = _from_store(store, "probe_tx", PROBE_TX, "src, seq")
    rx = _from_store(store, "probe_rx", PROBE_RX, "dst, rx_ns")
    ec = _from_store(store, "echo", ECHO, "src, t4_ns")
    names = _names(store)
    if not len(tx):
        print(f"{path}: no probe records")
        return len(steps), 0, 0, 0
    start = int(np.percentile(tx["tx_ns"], 0.1))
    end = int(np.percentile(tx["tx_ns"], 99.9))
    prior = None
    said: list[tuple[int, str, float]] = []  # (window start, host, step stated)
    walls: list[float] = []
    windows = 0
    for w0 in range(start - start % WINDOW_NS, end - WINDOW_NS + 1, WINDOW_NS):
        s_tx, s_rx, s_ec = window_rows(tx, rx, ec, w0, WINDOW_NS)
        if not len(s_tx):
            continue
        t = time.perf_counter()
        sol = solve_window(s_tx, s_rx, s_ec, window_start_ns=w0, window_ns=WINDOW_NS,
                           prior=prior, config=SolverConfig())  # fmt: skip
        walls.append(time.perf_counter() - t)
        prior = sol.state
        windows += 1
        said += [(w0, names.get(h, str(h)), s) for h, s in sol.stepped.items()]
    print(f"{path}: {windows} windows of 2 s, {len(steps)} clock steps injected")
    found = 0
    used: set[int] = set()
    for at, host, size in steps:
        hit = [i for i, (w0, h, _s) in enumerate(said)
               if h == host and w0 - NEAR_NS <= at < w0 + WINDOW_NS + NEAR_NS]  # fmt: skip
        used.update(hit)
        if hit:
            found += 1
            w0, _h, s = said[hit[0]]
            print(f"  {(at - t0) / 1e9:7.1f} s  {host:<6} {size / 1e3:+9.1f} µs  found in the "
                  f"window at {(w0 - t0) / 1e9:.1f} s, stated {s / 1e3:.1f} µs")  # fmt: skip
        else:
            print(f"  {(at - t0) / 1e9:7.1f} s  {host:<6} {size / 1e3:+9.1f} µs  not found")
    false = [x for i, x in enumerate(said) if i not in used]
    for w0, h, s in false:
        print(f"  false: the window at {(w0 - t0) / 1e9:.1f} s named {h} ({s / 1e3:.1f} µs)")
    print(f"  found {found} of {len(steps)}; windows naming a host with no step: {len(false)} "
          f"of {windows}; solve {np.median(walls) * 1e3:.1f} ms a window (median)")  # fmt: skip
    return len(steps), found, windows, len(false)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path, help="scenario run directories (--out)")
    args = ap.parse_args()
    for p in args.runs:
        if not (p / "truth.json").is_file() or not (p / "store").is_dir():
            print(f"bench_clock_steps: {p}: expected a scenario run (truth.json and store/)",
                  file=sys.stderr)  # fmt: skip
            return 2
    print(f"machine: {describe(numpy=np.__version__, duckdb=duckdb.__version__)}")
    totals = np.zeros(4, int)
    for p in args.runs:
        totals += run(p)
    steps, found, windows, false = totals.tolist()
    print(f"all: found {found} of {steps} steps; {false} false of {windows} windows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
