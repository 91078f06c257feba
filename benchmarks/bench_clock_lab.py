"""Clock solver against the lab's ground truth, from a store (or raw record files).

    .venv/bin/python benchmarks/bench_clock_lab.py --store <store_dir> \\
        --inventory .lab/<name>/inventory.yml [--seconds 10] [--window-s 2]
    .venv/bin/python benchmarks/bench_clock_lab.py --records DIR --inventory ...
        (DIR holds probe_tx.npy, probe_rx.npy, echo.npy and health.npy: collector dtypes)

Truth: each lab collector skews every timestamp as
``t' = t + offset_ns + drift_ppm * 1e-6 * (t - t0)`` with ``clockmesh_lab_clock``
(offset_ns, drift_ppm) from the inventory and ``t0`` the collector's start
(HEALTH record ``lab_clock_t0_ns``). The unskewed CLOCK_REALTIME of the lab's hosts
is one kernel clock (namespaces share it), so the skew *is* the offset truth.
The solver's offsets are relative to mesh time (gauge), so both sides are compared
mean-free over the hosts solved: error_h = (est_h - mean est) - (true_h - mean true),
truth evaluated at the real time when the mean clock reads the window's reference.

Windows are solved in order with the previous window's state as prior, over the last
``--seconds`` of data; the figures of the last window (after ``--seconds`` of probing)
are the result. The RTT/2 baseline is computed on the same echoes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analytics.clock import (
    HostStatus,
    SolverConfig,
    rtt2_baseline,
    rtt2_host_offsets,
    solve_window,
)
from collector.records import ECHO, HEALTH, PROBE_RX, PROBE_TX, host_id


class BenchError(Exception):
    pass


def lab_truth(inventory: Path) -> dict[int, tuple[str, float, float]]:
    """host_id -> (name, offset_ns, drift_ppm) for every collector with a lab clock."""
    try:
        inv = yaml.safe_load(inventory.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BenchError(f"{inventory}: cannot read inventory ({exc})") from exc
    out: dict[int, tuple[str, float, float]] = {}

    def walk(group: dict) -> None:
        for name, hv in (group.get("hosts") or {}).items():
            clock = (hv or {}).get("clockmesh_lab_clock")
            if clock is not None:
                out[host_id(name)] = (name, float(clock["offset_ns"]), float(clock["drift_ppm"]))
        for child in (group.get("children") or {}).values():
            walk(child or {})

    walk((inv or {}).get("all") or {})
    if not out:
        raise BenchError(f"{inventory}: no host has clockmesh_lab_clock")
    return out


def _from_store(store: Path, table: str, dtype: np.dtype, order: str) -> np.ndarray:
    import duckdb

    files = list((store / table).glob("date=*/hour=*/*.parquet"))
    files = [f for f in files if not f.name.startswith("_")]
    if not files:
        return np.zeros(0, dtype)
    names = [n for n in dtype.names if not n.startswith("_")]
    con = duckdb.connect()
    cols = ", ".join(names)
    rel = con.execute(
        f"SELECT {cols} FROM read_parquet(?, union_by_name=true) ORDER BY {order}",
        [[str(f) for f in files]],
    ).fetchnumpy()
    arr = np.zeros(len(rel[names[0]]), dtype)
    for n in names:
        v = rel[n]
        arr[n] = v.astype(dtype[n]) if v.dtype != object else np.array(v.tolist(), dtype[n])
    return arr


def load(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if args.store:
        store = Path(args.store)
        if not store.is_dir():
            raise BenchError(f"{store}: not a directory")
        return (
            _from_store(store, "probe_tx", PROBE_TX, "src, seq"),
            _from_store(store, "probe_rx", PROBE_RX, "dst, rx_ns"),
            _from_store(store, "echo", ECHO, "src, t4_ns"),
            _from_store(store, "health", HEALTH, "host, ts_ns"),
        )
    d = Path(args.records)
    out = []
    for name, dt in (
        ("probe_tx", PROBE_TX),
        ("probe_rx", PROBE_RX),
        ("echo", ECHO),
        ("health", HEALTH),
    ):
        p = d / f"{name}.npy"
        if not p.exists():
            raise BenchError(f"{p}: missing")
        a = np.load(p)
        if a.dtype != dt:
            raise BenchError(f"{p}: expected the collector's {name} dtype")
        out.append(a)
    return out[0], out[1], out[2], out[3]


def window_rows(
    tx: np.ndarray, rx: np.ndarray, echoes: np.ndarray, w0: int, win: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records of the window ``[w0, w0 + win)`` on the senders' clocks: probes sent
    in it, arrivals with 10 ms either side (in flight across its edges), echoes begun in
    it."""
    return (
        tx[(tx["tx_ns"] >= w0) & (tx["tx_ns"] < w0 + win)],
        rx[(rx["rx_ns"] >= w0 - 10_000_000) & (rx["rx_ns"] < w0 + win + 10_000_000)],
        echoes[(echoes["t1_ns"] >= w0) & (echoes["t1_ns"] < w0 + win)],
    )


def t0_per_host(health: np.ndarray) -> dict[int, int]:
    names = np.char.rstrip(health["name"].astype("S40"), b"\x00")
    sel = health[names == b"lab_clock_t0_ns"]
    return {int(h): int(v) for h, v in zip(sel["host"], sel["value"], strict=True)}


def true_relative(truth: dict, t0: dict[int, int], hosts: np.ndarray, ref: int) -> np.ndarray:
    off = np.array([truth[int(h)][1] for h in hosts])
    ppm = np.array([truth[int(h)][2] for h in hosts])
    base = np.array([t0.get(int(h), ref) for h in hosts], dtype=np.float64)

    def offsets(t: float) -> np.ndarray:
        return off + ppm * 1e-6 * (t - base)

    t = float(ref)
    for _ in range(3):
        t = ref - float(np.mean(offsets(t)))
    o = offsets(t)
    return o - o.mean()


def _baseline(echoes: np.ndarray, ref: int, method: str, truth: dict, t0: dict) -> float:
    hosts, off = rtt2_host_offsets(rtt2_baseline(echoes, ref_ns=ref, method=method))
    ok = np.isin(hosts, list(truth))
    hosts, off = hosts[ok], off[ok]
    if len(hosts) < 2:
        return float("nan")
    return float(np.median(np.abs((off - off.mean()) - true_relative(truth, t0, hosts, ref))))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", help="ingest store directory (Parquet)")
    src.add_argument("--records", help="directory with probe_tx/probe_rx/echo/health .npy")
    ap.add_argument("--inventory", required=True, help=".lab/<name>/inventory.yml")
    ap.add_argument("--seconds", type=float, default=10.0, help="solve the last N seconds")
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--spacing-tol-ns", type=int, default=SolverConfig().spacing_tol_ns)
    args = ap.parse_args()
    try:
        truth = lab_truth(Path(args.inventory))
        tx, rx, echoes, health = load(args)
    except BenchError as exc:
        print(f"bench_clock_lab: {exc}", file=sys.stderr)
        return 2
    if len(tx) == 0 or len(rx) == 0:
        print("bench_clock_lab: no probe records", file=sys.stderr)
        return 2
    t0 = t0_per_host(health)
    missing_t0 = sorted(truth[h][0] for h in truth if h not in t0)
    if missing_t0:
        print(f"note: no lab_clock_t0_ns for {missing_t0}; drift term evaluated from ref")
    win = int(args.window_s * 1e9)
    # windows on the senders' clocks (offsets are ms, windows are s)
    end = int(np.percentile(tx["tx_ns"], 99.9))
    start = end - int(args.seconds * 1e9)
    cfg = SolverConfig(spacing_tol_ns=args.spacing_tol_ns)
    prior = None
    print(f"{len(truth)} lab hosts, {len(tx)} tx, {len(rx)} rx, {len(echoes)} echoes; "
          f"windows of {args.window_s} s over the last {args.seconds} s")  # fmt: skip
    print(f"{'window':>6} {'solved':>6} {'pure':>6} {'med ns':>8} {'p99 ns':>8} {'max ns':>8} "
          f"{'RTT/2 med':>9} {'ratio':>6} {'minRTT/2':>9}")  # fmt: skip
    result = None
    for w0 in range(start, end - win + 1, win):
        sel_tx, sel_rx, sel_ec = window_rows(tx, rx, echoes, w0, win)
        sol = solve_window(sel_tx, sel_rx, sel_ec, window_start_ns=w0, window_ns=win,
                           prior=prior, config=cfg)  # fmt: skip
        prior = sol.state
        ok = (sol.clock["status"] == HostStatus.SOLVED) & np.isin(sol.clock["host"], list(truth))
        hosts = sol.clock["host"][ok]
        if len(hosts) < 2:
            print(f"{(w0 - start) / 1e9:>6.0f} {len(hosts):>6} (too few hosts solved)")
            continue
        est = sol.clock["offset_ns"][ok]
        err = np.abs((est - est.mean()) - true_relative(truth, t0, hosts, sol.ref_ns))
        bmed, bmin = (_baseline(sel_ec, sol.ref_ns, m, truth, t0) for m in ("mean", "min_rtt"))
        med = float(np.median(err))
        print(f"{(w0 - start) / 1e9:>6.0f} {len(hosts):>6} {sol.drops['pair_pure']:>6} {med:>8.0f} "
              f"{np.percentile(err, 99):>8.0f} {err.max():>8.0f} {bmed:>9.0f} "
              f"{bmed / max(med, 1e-9):>6.1f} {bmin:>9.0f}")  # fmt: skip
        result = (med, float(np.percentile(err, 99)), bmed, bmin, sol)
    if result is None:
        print("bench_clock_lab: no window could be solved", file=sys.stderr)
        return 1
    med, p99, bmed, bmin, sol = result
    print(f"\nlast window: solver median |offset error| {med:.0f} ns, p99 {p99:.0f} ns; "
          f"RTT/2 median {bmed:.0f} ns ({bmed / max(med, 1e-9):.1f}x), with NTP's min-RTT "
          f"filter {bmin:.0f} ns ({bmin / max(med, 1e-9):.1f}x); noise {sol.noise_ns:.0f} ns; "
          f"pairs flagged {int(sol.stats['pairs_flagged'])}")  # fmt: skip
    print("drops:", sol.drops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
