"""Clock solver benchmark: accuracy and speed on simulated meshes, one command.

    .venv/bin/python benchmarks/bench_clock.py            # 100 .. 10,000 hosts
    .venv/bin/python benchmarks/bench_clock.py --max-hosts 1000
    .venv/bin/python benchmarks/bench_clock.py --sizes 10000 --threads 1 --baseline main
    .venv/bin/python benchmarks/bench_clock.py --sizes 100000 --windows 3 --threads 1

``--baseline REV`` also solves the largest size's windows with the solver of git revision
REV (e.g. ``main``), loaded from ``git show`` into a temporary package, window by window
alternately with today's code in this process (same windows, same machine load), and
prints both and the speed-up.

Prints the machine, then per mesh size: records per window, solve time (wall: median
and best; CPU of both threads: median; over the steady-state windows, i.e. with the
previous window's state — the machine is shared, so the best shows the solver's own
speed and the median what the load left of it), minor page faults per solve (median),
peak memory allocated during one solve (tracemalloc: numpy registers its buffers),
median / p99 |offset error| against the simulator's truth (relative offsets, both
sides mean-zero), drift error, and the RTT/2 baseline's median error on the same
echoes. Then a congested scenario: one leaf->spine direction congested.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analytics.clock import (
    HostStatus,
    SolverConfig,
    rtt2_baseline,
    rtt2_host_offsets,
    solve_window,
    tune_allocator,
)
from analytics.sim import MeshSimulator, SimConfig
from analytics.sim.mesh_simulator import Congestion
from benchmarks.baseline import commit_of, git
from benchmarks.machine import describe

WINDOW = 2_000_000_000


def baseline_solver(rev: str) -> tuple[str, Callable, type]:
    """``(commit, solve_window, SolverConfig)`` of ``analytics/clock`` at git revision
    ``rev``, imported from a temporary package ``clock_baseline`` (its own
    ``analytics.clock`` imports rewritten). The daemon's runner is left out."""
    commit = commit_of(rev)
    pkg = Path(tempfile.mkdtemp(prefix="clockmesh-bench-baseline-")) / "clock_baseline"
    pkg.mkdir()
    atexit.register(shutil.rmtree, pkg.parent, True)
    for path in git("ls-tree", "--name-only", rev, "analytics/clock/").split():
        if path.endswith(".py") and not path.endswith("clock_runner.py"):
            text = git("show", f"{rev}:{path}").replace("analytics.clock", "clock_baseline")
            (pkg / Path(path).name).write_text(text)
    sys.path.insert(0, str(pkg.parent))
    mod = importlib.import_module("clock_baseline")
    return commit, mod.solve_window, mod.SolverConfig


def errors(sim, sol) -> tuple[np.ndarray, np.ndarray]:
    ok = sol.clock["status"] == HostStatus.SOLVED
    hosts = sol.clock["host"][ok]
    est = sol.clock["offset_ns"][ok]
    err = np.abs((est - est.mean()) - sim.truth.relative_offsets(sol.ref_ns, hosts))
    d = sol.clock["drift_ppm"][ok]
    derr = np.abs((d - d.mean()) - sim.truth.relative_drift_ppm(hosts))
    return err, derr


def baseline_error(sim, ref_ns: int, method: str) -> float:
    hosts, off = rtt2_host_offsets(rtt2_baseline(sim.echoes, ref_ns=ref_ns, method=method))
    return float(np.median(np.abs(off - sim.truth.relative_offsets(ref_ns, hosts))))


def run_size(
    hosts: int,
    windows: int,
    cfg_solver: SolverConfig,
    baseline: tuple[Callable, object] | None = None,
    **sim_kw,
) -> dict:
    """Solve ``windows`` simulated windows of ``hosts`` hosts; with ``baseline``
    (solve_window, config), each window also with it, alternately first (same windows,
    same load). Returns today's figures, and the baseline's under "baseline"."""
    cfg = SimConfig(
        racks=hosts // 4, hosts_per_rack=4, spines=8, buddies_random=7, ports=8,
        ts_noise_ns=10.0, seed=hosts, **sim_kw,
    )  # fmt: skip
    mesh = MeshSimulator(cfg)
    solvers: dict[str, tuple[Callable, object]] = {"new": (solve_window, cfg_solver)}
    if baseline is not None:
        solvers["baseline"] = baseline
    prior: dict[str, object] = dict.fromkeys(solvers)
    walls: dict[str, list[float]] = {k: [] for k in solvers}
    cpus: dict[str, list[float]] = {k: [] for k in solvers}
    faults: dict[str, list[int]] = {k: [] for k in solvers}
    sols: dict[str, Any] = {}
    for w in range(windows):
        sim = mesh.run(start_offset_ns=w * WINDOW, duration_ns=WINDOW)
        kw = dict(window_start_ns=cfg.start_ns + w * WINDOW, window_ns=WINDOW)
        names = list(solvers) if w % 2 == 0 else list(solvers)[::-1]
        for name in names:
            solve, config = solvers[name]
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0, c0 = time.perf_counter(), time.process_time()
            sol = solve(sim.tx, sim.rx, sim.echoes, prior=prior[name], config=config, **kw)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if prior[name] is not None or windows == 1:
                walls[name].append(wall)
                cpus[name].append(cpu)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            prior[name] = sol.state
            sols[name] = sol
    out: dict = {}
    for name, (solve, config) in solvers.items():
        sol = sols[name]
        tracemalloc.start()
        solve(sim.tx, sim.rx, sim.echoes, prior=prior[name], config=config, **kw)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        err, derr = errors(sim, sol)
        out[name] = dict(
            hosts=hosts,
            records=len(sim.tx) + len(sim.rx) + len(sim.echoes),
            pairs=int(sol.stats["pairs"]),
            wall=float(np.median(walls[name])),
            best=float(np.min(walls[name])),
            cpu=float(np.median(cpus[name])),
            faults=int(np.median(faults[name])),
            peak_mib=peak / 2**20,
            med=float(np.median(err)),
            p99=float(np.percentile(err, 99)),
            drift_ppb=float(np.median(derr)) * 1e3,
            rtt2_mean=baseline_error(sim, sol.ref_ns, "mean"),
            rtt2_min=baseline_error(sim, sol.ref_ns, "min_rtt"),
            phases={k: v for k, v in sol.stats.items() if k.startswith("t_")},
            flagged=int(sol.stats["pairs_flagged"]),
        )
    res = out["new"]
    if "baseline" in out:
        res["baseline"] = out["baseline"]
    return res


def row(r: dict, threads: int, label: str = "") -> str:
    return (
        f"{r['hosts']:>6} {r['records']:>9} {r['pairs']:>7} {r['wall']:>7.3f} {r['best']:>6.3f} "
        f"{r['cpu']:>6.3f} {r['peak_mib']:>8.0f} {r['med']:>7.1f} {r['p99']:>7.1f} "
        f"{r['drift_ppb']:>9.2f} {r['rtt2_mean']:>10.1f} {r['rtt2_min']:>9.1f} {r['faults']:>6} "
        f"{threads:>7}{label}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--max-hosts", type=int, default=10_000)
    ap.add_argument("--windows", type=int, default=5, help="windows per size (first is warm-up)")
    ap.add_argument("--spacing-tol-ns", type=int, default=100)
    ap.add_argument(
        "--echo-every",
        type=int,
        default=SimConfig.echo_every,
        help="simulated collectors echo 1 coded pair in N per (buddy, port), as "
        "probe.echo_every (default %(default)s, the collector's; 1 = every probe)",
    )
    ap.add_argument(
        "--threads",
        default="1,2",
        help="SolverConfig.threads: the table uses the first; the largest size is also run "
        "with the others (default 1,2)",
    )
    ap.add_argument(
        "--no-tune-allocator", action="store_true", help="leave glibc malloc thresholds alone"
    )
    ap.add_argument(
        "--sizes",
        default="",
        help="comma-separated host counts instead of 100,300,1000,3000,10000 up to --max-hosts",
    )
    ap.add_argument(
        "--baseline",
        default="",
        metavar="REV",
        help="also solve the largest size with the solver of git revision REV, alternately "
        "with today's (e.g. main)",
    )
    ap.add_argument(
        "--no-congested", action="store_true", help="skip the congested 16-host scenario"
    )
    args = ap.parse_args()
    if args.echo_every < 1:
        ap.error(f"--echo-every: expected an int >= 1, got {args.echo_every}")
    try:
        threads = [int(t) for t in args.threads.split(",")]
        if not threads or min(threads) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--threads: expected a comma-separated list of ints >= 1, got {args.threads!r}")
    tuned = False if args.no_tune_allocator else tune_allocator()
    print("machine: " + describe(numpy=np.__version__, scipy=scipy.__version__))
    print(f"glibc malloc thresholds raised (analytics.clock.tune_allocator): {tuned}")
    solver = SolverConfig(spacing_tol_ns=args.spacing_tol_ns, threads=threads[0])
    print(
        "\nidle fabric, 10 buddies (3 own rack + 7 random) x 8 source ports, 1 coded pair/s per "
        "port, 2 s window,\noffsets +-5 ms, drifts +-50 ppm, timestamp noise 10 ns, "
        f"spacing tolerance {args.spacing_tol_ns} ns,\nechoes: 1 coded pair in "
        f"{args.echo_every} per (buddy, port)\n"
    )
    head = (
        f"{'hosts':>6} {'records':>9} {'pairs':>7} {'wall s':>7} {'best s':>6} {'cpu s':>6} {'peak MiB':>8} "
        f"{'med ns':>7} {'p99 ns':>7} {'drift ppb':>9} {'RTT/2 mean':>10} {'RTT/2 min':>9} "
        f"{'faults':>6} {'threads':>7}"
    )
    if args.sizes:
        try:
            sizes = [int(h) for h in args.sizes.split(",")]
            if min(sizes) < 8:
                raise ValueError
        except ValueError:
            ap.error(f"--sizes: expected a comma-separated list of ints >= 8, got {args.sizes!r}")
    else:
        sizes = [s for s in (100, 300, 1_000, 3_000, 10_000) if s <= args.max_hosts]
    base = None
    if args.baseline:
        commit, base_solve, base_config = baseline_solver(args.baseline)
        print(f"baseline: analytics/clock at {commit} (git {args.baseline}), same windows\n")
    print(head)
    runs = [(h, threads[0]) for h in sizes] + [(sizes[-1], t) for t in threads[1:] if sizes]
    for h, t in runs:
        with_base = None
        if base is None and args.baseline and h == sizes[-1]:
            with_base = (base_solve, base_config(spacing_tol_ns=args.spacing_tol_ns, threads=t))
        load0 = os.getloadavg()[0]
        r = run_size(
            h, args.windows, replace(solver, threads=t), with_base, echo_every=args.echo_every
        )
        load = f"  load {load0:.1f}-{os.getloadavg()[0]:.1f}"
        print(row(r, t, load), flush=True)
        if "baseline" in r:
            print(row(r["baseline"], t, "  <- baseline " + commit), flush=True)
            b = r["baseline"]
            print(
                f"  speed-up over the baseline, same windows alternately: wall median "
                f"{b['wall'] / r['wall']:.2f}x, best {b['best'] / r['best']:.2f}x, "
                f"CPU {b['cpu'] / r['cpu']:.2f}x; median error {b['med']:.2f} -> "
                f"{r['med']:.2f} ns, p99 {b['p99']:.2f} -> {r['p99']:.2f} ns",
                flush=True,
            )
            base = b
        if h == sizes[-1]:
            print("  phases (s):", {k: round(v, 3) for k, v in r["phases"].items()})
    if args.no_congested:
        print(f"\nload average at end {os.getloadavg()[0]:.2f}")
        return
    cong = (Congestion(leaf=0, spine=0, up=True, util=0.95, queue_ns=200_000),)
    print(
        "\ncongested: 16 hosts (4 racks x 4, 2 spines, 3 random buddies), leaf0->spine0 only "
        "(util 0.95, mean queue 200 us);\n5% of coded pairs see equal queues (pass the filter). "
        "Errors over all hosts / over rack 0 (behind the congested link):"
    )
    for seed in range(3):
        cfg = SimConfig(
            racks=4, hosts_per_rack=4, spines=2, buddies_random=3, ts_noise_ns=10.0,
            congestion=cong, pair_queue_corr=0.05, seed=seed, echo_every=args.echo_every,
        )  # fmt: skip
        sim = MeshSimulator(cfg).run()
        sol = solve_window(sim.tx, sim.rx, sim.echoes, window_start_ns=cfg.start_ns, config=solver)
        err, _ = errors(sim, sol)
        rack0 = np.isin(sol.clock["host"], sim.truth.hosts[:4])
        hosts, off = rtt2_host_offsets(rtt2_baseline(sim.echoes, ref_ns=sol.ref_ns, method="mean"))
        berr = np.abs(off - sim.truth.relative_offsets(sol.ref_ns, hosts))
        b0 = np.isin(hosts, sim.truth.hosts[:4])
        print(
            f"  seed {seed}: solver median {np.median(err):.1f} ns (rack 0: {np.median(err[rack0]):.1f}); "
            f"RTT/2 median {np.median(berr):.0f} ns (rack 0: {np.median(berr[b0]):.0f}); "
            f"ratio {np.median(berr) / max(np.median(err), 1e-9):.0f}x; "
            f"pairs flagged {int(sol.stats['pairs_flagged'])}"
        )
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
