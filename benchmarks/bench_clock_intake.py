"""CPU of the clock runner's intake: committed probe rows into 2-s windows, then joined.

    .venv/bin/python benchmarks/bench_clock_intake.py [--hosts 3000] [--span 30] [--repeat 3]

After every group commit the ingest daemon hands the commit's ``probe_tx``, ``probe_rx``
and ``echo`` records to its clock runner, which buckets them into windows by each row's
own timestamp and, when a window is solved, joins its parts into one array per table.
At 2 M probe records/s that intake sees ~3 M rows a second (echoes included), on top of
the solve itself (``bench_clock.py``). This measures the intake alone, in one run, for
today's runner (views of the runs of consecutive rows in one window) and the runner
before 2026-11-22 (one boolean mask per window and commit), on the same commits:

* commits as the daemon builds them at the advised pace: ``--span``-second segments of
  ``--hosts`` hosts, each host's rows in time order, its segment starting anywhere in the
  span, ``--per-commit`` segments per commit (80 probe_tx + 80 probe_rx + 80 echo rows per
  host-second, only the time columns filled: nothing else is read here);
* "live": every window still open when its rows arrive; "behind": the solver is past
  every window (rows dropped as late, counted), as when an overloaded daemon skips them.

Prints the machine, CPU seconds per million rows of each and their ratio; both must put
exactly the same rows into every window, in the same order (checked).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analytics.clock import tune_allocator  # noqa: E402
from analytics.clock.clock_runner import SOURCES, ClockRunner, _Window  # noqa: E402
from analytics.store.store_writer import StoreWriter  # noqa: E402
from benchmarks.bench_ingest import machine  # noqa: E402

W = 2_000_000_000
T0 = 1_800_000_000 * 1_000_000_000  # a window boundary in 2027
RATE = 80  # rows per host-second in each table


class MaskRunner(ClockRunner):
    """The intake before 2026-11-22: late/future rows masked out, then one boolean mask
    per window of the commit (a copy per window)."""

    def _bucket(self, name: str, rows: np.ndarray) -> None:
        ts = rows[SOURCES[name][1]]
        widx = ts // self.window_ns
        horizon = (self.now_ns() + 60 * 1_000_000_000) // self.window_ns
        late = widx <= self._watermark
        future = widx > horizon
        if late.any() or future.any():
            self.counters.late_rows += int(late.sum())
            self.counters.future_rows += int(future.sum())
            keep = ~(late | future)
            rows, widx = rows[keep], widx[keep]
        if not len(rows):
            return
        lo, hi = int(widx.min()), int(widx.max())
        groups = [(lo, rows)] if lo == hi else [(int(w), rows[widx == w]) for w in np.unique(widx)]
        for w, part in groups:
            self._add(name, w, part)

    @staticmethod
    def _joined(buf: _Window) -> dict[str, np.ndarray]:
        return {
            name: np.concatenate(parts) if parts else np.zeros(0, SOURCES[name][0])
            for name, parts in buf.parts.items()
        }


def commits(hosts: int, span: int, per_commit: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Every host's one ``span``-second segment, in commits of ``per_commit`` segments."""
    rng = np.random.default_rng(seed)
    starts = T0 + rng.integers(0, span * 1_000_000_000, hosts)
    step = 1_000_000_000 // RATE
    own = np.arange(span * RATE, dtype=np.int64) * step
    out = []
    for first in range(0, hosts, per_commit):
        ts = (starts[first : first + per_commit, None] + own[None, :]).ravel()
        commit = {}
        for name, (dtype, column) in SOURCES.items():
            rows = np.zeros(len(ts), dtype)
            rows[column] = ts + (1_000 if name == "probe_rx" else 0)
            commit[name] = rows
        out.append(commit)
    return out


def intake(cls: type[ClockRunner], batches: list, behind: bool, root: Path) -> tuple[float, dict]:
    """CPU seconds to bucket every commit and join every window; the joined windows
    (key -1: the number of rows dropped as late)."""
    runner = cls(StoreWriter(root), max_rows=1 << 40, now_ns=lambda: T0)
    if behind:
        runner._watermark = (T0 + 3600 * 1_000_000_000) // W
    started = time.process_time()
    for commit in batches:
        runner.feed(dict(commit))  # the runner keeps the arrays and never writes to them
        runner._drain()
    joined = {w: runner._joined(buf) for w, buf in sorted(runner._windows.items())}
    joined[-1] = {"late": np.array([runner.counters.late_rows])}
    return time.process_time() - started, joined


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=3000, help="fleet size")
    ap.add_argument("--span", type=int, default=30, help="seconds per segment (advised pace)")
    ap.add_argument("--per-commit", type=int, default=400, help="segments per group commit")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (the best is printed)")
    args = ap.parse_args()
    tune_allocator()  # as the daemon's clock runner does when it starts
    batches = commits(args.hosts, args.span, args.per_commit)
    rows = sum(len(r) for c in batches for r in c.values())
    print(f"machine: {machine()}")
    print(
        f"{args.hosts} hosts x {args.span}-s segments, {len(batches)} commits of "
        f"{args.per_commit} segments: {rows:,} rows (probe_tx, probe_rx, echo); "
        f"CPU per M rows, best of {args.repeat}"
    )
    root = Path("/nonexistent-clockmesh-bench")  # the runner never writes here
    for behind in (False, True):
        best: dict[str, float] = {}
        windows = {}
        for _ in range(args.repeat):
            for cls in (ClockRunner, MaskRunner):
                cpu, joined = intake(cls, batches, behind, root)
                best[cls.__name__] = min(best.get(cls.__name__, cpu), cpu)
                windows[cls.__name__] = joined
        a, b = windows["ClockRunner"], windows["MaskRunner"]
        same = a.keys() == b.keys() and all(
            a[w].keys() == b[w].keys() and all(np.array_equal(a[w][t], b[w][t]) for t in a[w])
            for w in a
        )
        today, old = best["ClockRunner"] / rows * 1e6, best["MaskRunner"] / rows * 1e6
        label = "behind (all rows late)" if behind else "live"
        print(
            f"{label:24} today {today:.3f} CPU-s per M rows, before {old:.3f}: "
            f"{old / today:.1f}x; windows {len(a) - 1}, rows late {a[-1]['late'][0]:,}, "
            f"identical {same}"
        )
        if not same:
            raise SystemExit("the two intakes put different rows into the windows")


if __name__ == "__main__":
    main()
