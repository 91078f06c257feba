"""CPU of the detector's streamed-probe passes: silent drops and contention, per pass.

    .venv/bin/python benchmarks/bench_detect_pass.py [--hosts 16] [--buddies 12] [--passes 60]
    .venv/bin/python benchmarks/bench_detect_pass.py --hosts 1024 --passes 10 --baseline main

The ingest daemon's detector runs a pass every 0.2–0.5 s over the probes committed since
the last one (:class:`analytics.detect.silent_drop.SilentDrops`,
:class:`analytics.detect.contention.PathDelays`). This feeds both the same synthetic,
healthy probes — ``--hosts`` hosts in racks of 4, each probing ``--buddies`` others on 8
source ports, one round every 0.5 s, clocks known — first 30 s (the silent-drop history
fills), then ``--passes`` passes timed one by one. The demo lab is 16 hosts with ~12
buddies (~3,300 probes/s). Prints the machine, the paths, the probes per pass, and each
module's CPU time per pass (median, p90) and the share of one core at 2 passes a second,
and the routes the contention pass judged (its cost grows with them).

``--baseline REV`` also feeds the same probes to the contention check of git revision REV
(``analytics/detect/contention.py`` loaded from ``git show``), timed pass by pass
alternately with today's in this process, and prints both and the speed-up; the two must
judge the same routes and say the same (nothing, on this healthy fleet).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analytics.clock.clock_state import ClockState
from analytics.detect.contention import PathDelays
from analytics.detect.silent_drop import SilentDrops
from analytics.detect.spine_map import SpineMap
from benchmarks.baseline import commit_of, git
from benchmarks.machine import describe
from collector import records

NS = 1_000_000_000
T0 = 1_800_000_000 * NS
SPINES = ("spine1", "spine2")


def baseline_contention(rev: str) -> tuple[str, type]:
    """``(commit, PathDelays)`` of ``analytics/detect/contention.py`` at git revision
    ``rev``, imported as module ``contention_baseline`` (its other imports today's)."""
    commit = commit_of(rev)
    try:
        text = git("show", f"{rev}:analytics/detect/contention.py")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--baseline: {rev} has no analytics/detect/contention.py") from None
    with tempfile.TemporaryDirectory(prefix="clockmesh-bench-baseline-") as tmp:
        path = Path(tmp) / "contention_baseline.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location("contention_baseline", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["contention_baseline"] = mod  # (dataclasses look their module up)
        spec.loader.exec_module(mod)
    return commit, mod.PathDelays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--buddies", type=int, default=12)
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--baseline", metavar="REV", help="also time contention at git revision REV")
    args = ap.parse_args()
    if args.hosts < 8 or not 1 <= args.buddies < args.hosts:
        ap.error("--hosts: 8 or more; --buddies: 1 to hosts - 1")
    base = baseline_contention(args.baseline) if args.baseline else None
    print(describe(numpy=np.__version__))
    hosts = list(range(1, args.hosts + 1))
    rack = {h: f"leaf{(h - 1) // 4 + 1}" for h in hosts}
    names = {h: f"h{h}" for h in hosts}
    by_ends = {(leaf, s): f"{leaf}-{s}" for leaf in set(rack.values()) for s in SPINES}
    paths = np.array([(s, hosts[(i + k) % len(hosts)], p)
                      for i, s in enumerate(hosts) for k in range(1, args.buddies + 1)
                      for p in range(40000, 40008)], np.int64)  # fmt: skip
    spine_of = SpineMap()  # the daemon's map (FabricPaths.spine_of)
    for s, d, p in paths.tolist():
        spine_of[(s, d, p)] = SPINES[zlib.crc32(f"{s}.{d}.{p}".encode()) % 2]
    drops = SilentDrops(rack, by_ends, spine_of, names)
    delays = PathDelays(rack, by_ends, spine_of, names)
    before = base[1](rack, by_ends, spine_of, names) if base else None
    n = len(hosts)
    clocks = ClockState(0, np.array(hosts, np.int64), np.zeros(n), np.zeros(n), np.zeros(n),
                        np.zeros(n), np.zeros(n, np.int64))  # fmt: skip
    rng = np.random.default_rng(1)
    seq = 0
    timed: dict[str, list[float]] = {"silent_drop": [], "contention": []}
    if base:
        timed[f"contention at {base[0]}"] = []
    warm = 60
    for i in range(warm + args.passes):
        t = T0 + i * NS // 2
        m = len(paths)
        tx = np.zeros(m, records.PROBE_TX)
        rx = np.zeros(m, records.PROBE_RX)
        for r in (tx, rx):
            r["src"], r["dst"], r["sport"] = paths[:, 0], paths[:, 1], paths[:, 2]
            r["seq"] = np.arange(seq, seq + m)
        seq += m
        tx["tx_ns"] = t + rng.integers(0, NS // 2, m)
        rx["rx_ns"] = tx["tx_ns"] + 8_000 + rng.exponential(1_500, m).astype(np.int64)
        cols_tx = {k: tx[k].astype(np.int64) for k in ("src", "dst", "sport", "seq", "tx_ns")}
        cols_rx = {k: rx[k].astype(np.int64) for k in ("src", "dst", "sport", "seq", "rx_ns")}
        c0 = time.process_time()
        drops.feed("probe_tx", cols_tx)
        drops.feed("probe_rx", cols_rx)
        drops.observations(t)
        c1 = time.process_time()
        delays.feed_probes(tx, rx, clocks)
        said = delays.observations(t)
        c2 = time.process_time()
        if i >= warm:
            timed["silent_drop"].append(c1 - c0)
            timed["contention"].append(c2 - c1)
        if before is not None and base is not None:
            c3 = time.process_time()
            before.feed_probes(tx, rx, clocks)
            said_before = before.observations(t)
            c4 = time.process_time()
            if i >= warm:
                timed[f"contention at {base[0]}"].append(c4 - c3)
            judged = (len(delays._last_windows), len(before._last_windows))
            if judged[0] != judged[1] or [o.summary for o in said] != [
                o.summary for o in said_before
            ]:
                raise SystemExit(f"pass {i}: routes judged {judged}, today said {said}, "
                                 f"{base[0]} said {said_before}")  # fmt: skip
    print(f"{n} hosts, {len(paths)} paths, {len(paths)} probes a pass (a round every 0.5 s), "
          f"{args.passes} passes after 30 s of history")  # fmt: skip
    routes = len(delays._last_windows)  # (src, dst, spine) judged in the last pass
    for name, cpu in timed.items():
        a = np.array(cpu) * 1e3
        print(f"{name:12s} CPU per pass: median {np.median(a):.1f} ms, p90 "
              f"{np.percentile(a, 90):.1f} ms; at 2 passes/s {2 * np.median(a) / 10:.1f} % "
              f"of a core")  # fmt: skip
    # The contention pass judges every route (numpy columns): it grows with routes, which
    # sampling probes does not bound.
    per_route = np.median(timed["contention"]) / max(routes, 1) * 1e6
    print(f"contention   {routes} routes judged: {per_route:.1f} µs of CPU per route and pass")
    if base:
        was = np.median(timed[f"contention at {base[0]}"])
        print(f"contention   speed-up over {base[0]} (git {args.baseline}), same probes, "
              f"passes alternately: {was / np.median(timed['contention']):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
