"""Sub-millisecond contention on a running lab: how long from a saturated leaf–spine
direction to an open anomaly naming it (root; a lab with the ops box deployed, e.g.
``make demo``)::

    .venv/bin/python benchmarks/bench_contention_lab.py [--name demo] [--runs 8] [--seed 1]

Each run: every leaf–spine link gets 50 Mbit/s and a 500-µs buffer (``lab capacity``), 25 s
for the routes to learn their healthy tails, then ``lab saturate`` on the next of the
fabric's directions (shuffled by ``--seed``, each at most once: an anomaly still closing
from an earlier run is on another link), and ``/v1/live`` polled every 50 ms until a new
``contention`` anomaly names that link with the right direction (30 s at most); then
``lab heal``. Prints each run, the median and the machine. Judges only what a user sees
in ``/v1/live`` — the injector's state is used for the clock, never for the verdict.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.machine import describe  # noqa: E402

WAIT_S = 30.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default="demo", help="the lab's name (default demo)")
    ap.add_argument("--runs", type=int, default=8, help="directions saturated, one each")
    ap.add_argument("--seed", type=int, default=1, help="order of the directions")
    ap.add_argument("--url", default="", help="the ops box's /v1/live (default: the lab's)")
    args = ap.parse_args()
    from lab.fabric import Lab
    from lab.inventory import INGEST_PORT

    topo = Lab(args.name, None).topology
    url = args.url or f"http://{topo.ops.mgmt_address}:{INGEST_PORT}/v1/live"
    links = [lk.name for lk in topo.links if lk.kind == "fabric"]
    combos = [(lk, d) for lk in links for d in ("a2b", "b2a")]
    random.Random(args.seed).shuffle(combos)
    cm = str(ROOT / ".venv" / "bin" / "clockmesh")

    def lab(*a: str) -> None:
        done = subprocess.run([cm, "lab", *a, "--name", args.name], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"clockmesh lab {a[0]}: {done.stderr.strip() or done.stdout.strip()}")

    def contention() -> list[dict[str, Any]]:
        with urllib.request.urlopen(url, timeout=2) as r:
            live = json.load(r)
        return [a for a in live["anomalies"]["open"] if a["kind"] == "contention"]

    print(describe())
    took: list[float] = []
    for link, way in combos[: args.runs]:
        words = "leaf→spine" if way == "a2b" else "spine→leaf"
        lab("capacity", "--rate", "50mbit", "--buffer", "500us")
        time.sleep(25.0)
        before = {a["anomaly_id"] for a in contention()}
        lab("saturate", link, "--direction", way, "--rate", "50mbit")
        t0, got = time.monotonic(), None
        try:
            while got is None and time.monotonic() - t0 < WAIT_S:
                new = [a for a in contention() if a["anomaly_id"] not in before]
                got = next((a for a in new if a.get("link") == link), None)
                if got is None:
                    time.sleep(0.05)
            dt = time.monotonic() - t0
            others = [a["summary"][:70] for a in contention()
                      if a["anomaly_id"] not in before and a.get("link") != link]  # fmt: skip
        finally:
            lab("heal")
        right = got is not None and got["evidence"].get("direction") == words
        shown = f"{dt:.2f} s" if got else f"not in {WAIT_S:.0f} s"
        print(f"{link} {words}: {shown}, direction {'right' if right else 'WRONG'}, "
              f"others open: {others or 'none'}", flush=True)  # fmt: skip
        if right:
            took.append(dt)
        time.sleep(5.0)
    if took:
        print(f"named {len(took)} of {args.runs} with link and direction: "
              f"{min(took):.1f}–{max(took):.1f} s, median {statistics.median(took):.1f} s")  # fmt: skip
    return 0 if len(took) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
