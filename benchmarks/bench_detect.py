"""The detector on held-out labelled lab runs: confusion matrix, precision, recall,
localisation, latency.

    .venv/bin/python benchmarks/bench_detect.py --seeds 1001-1020 --minutes 10 --out runs/
    .venv/bin/python benchmarks/bench_detect.py --eval-only runs/*    (runs already made)

Each seed is one `clockmesh lab scenario run` (a 3-rack lab, a fleet of collectors, an
ops box, a seeded random fault mix with its ground truth), then `clockmesh detector
eval` over all of them. Seeds 1000 and above are evaluation seeds: never train on them.
Needs root (network namespaces). Prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analytics.detect.evaluate import evaluate, render
from benchmarks.machine import describe

ROOT = Path(__file__).resolve().parents[1]


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1001-1020", help="e.g. 1001-1020 or 1001,1005")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=Path("runs"))
    ap.add_argument("--eval-only", nargs="*", type=Path, help="evaluate these run dirs only")
    args = ap.parse_args()
    print(describe())
    runs = args.eval_only or []
    if not args.eval_only:
        for seed in _seeds(args.seeds):
            run = args.out / f"seed{seed}"
            if (run / "truth.json").exists():
                print(f"seed {seed}: already run, kept")
            else:
                t0 = time.monotonic()
                subprocess.run(
                    [sys.executable, "-m", "clockmesh.cli", "lab", "scenario", "run",
                     "--seed", str(seed), "--minutes", str(args.minutes), "--out", str(run)],
                    cwd=ROOT, check=True,
                )  # fmt: skip
                print(f"seed {seed}: {time.monotonic() - t0:.0f} s")
            runs.append(run)
    print(render(evaluate(runs)))


if __name__ == "__main__":
    main()
