"""Clock solver benchmark: accuracy and speed on simulated meshes, one command.

    .venv/bin/python benchmarks/bench_clock.py            # 100 .. 10,000 hosts
    .venv/bin/python benchmarks/bench_clock.py --max-hosts 1000

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
import os
import resource
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

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
from benchmarks.machine import describe

WINDOW = 2_000_000_000


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


def run_size(hosts: int, windows: int, cfg_solver: SolverConfig, **sim_kw) -> dict:
    cfg = SimConfig(
        racks=hosts // 4, hosts_per_rack=4, spines=8, buddies_random=7, ports=8,
        ts_noise_ns=10.0, seed=hosts, **sim_kw,
    )  # fmt: skip
    mesh = MeshSimulator(cfg)
    prior = None
    walls, cpus, faults = [], [], []
    res: dict = {"hosts": hosts}
    for w in range(windows):
        sim = mesh.run(start_offset_ns=w * WINDOW, duration_ns=WINDOW)
        kw = dict(window_start_ns=cfg.start_ns + w * WINDOW, window_ns=WINDOW, config=cfg_solver)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, c0 = time.perf_counter(), time.process_time()
        sol = solve_window(sim.tx, sim.rx, sim.echoes, prior=prior, **kw)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if prior is not None or windows == 1:
            walls.append(wall)
            cpus.append(cpu)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        prior = sol.state
    tracemalloc.start()
    solve_window(sim.tx, sim.rx, sim.echoes, prior=prior, **kw)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    err, derr = errors(sim, sol)
    res.update(
        records=len(sim.tx) + len(sim.rx) + len(sim.echoes),
        pairs=int(sol.stats["pairs"]),
        wall=float(np.median(walls)),
        best=float(np.min(walls)),
        cpu=float(np.median(cpus)),
        faults=int(np.median(faults)),
        peak_mib=peak / 2**20,
        med=float(np.median(err)),
        p99=float(np.percentile(err, 99)),
        drift_ppb=float(np.median(derr)) * 1e3,
        rtt2_mean=baseline_error(sim, sol.ref_ns, "mean"),
        rtt2_min=baseline_error(sim, sol.ref_ns, "min_rtt"),
        phases={k: v for k, v in sol.stats.items() if k.startswith("t_")},
        flagged=int(sol.stats["pairs_flagged"]),
    )
    return res


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
    print(head)
    sizes = [s for s in (100, 300, 1_000, 3_000, 10_000) if s <= args.max_hosts]
    runs = [(h, threads[0]) for h in sizes] + [(sizes[-1], t) for t in threads[1:] if sizes]
    for h, t in runs:
        r = run_size(h, args.windows, replace(solver, threads=t), echo_every=args.echo_every)
        print(
            f"{r['hosts']:>6} {r['records']:>9} {r['pairs']:>7} {r['wall']:>7.3f} {r['best']:>6.3f} {r['cpu']:>6.3f} "
            f"{r['peak_mib']:>8.0f} {r['med']:>7.1f} {r['p99']:>7.1f} {r['drift_ppb']:>9.2f} "
            f"{r['rtt2_mean']:>10.1f} {r['rtt2_min']:>9.1f} {r['faults']:>6} {t:>7}",
            flush=True,
        )
        if h == sizes[-1]:
            print("  phases (s):", {k: round(v, 3) for k, v in r["phases"].items()})
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
