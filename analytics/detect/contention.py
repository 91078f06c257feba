"""Contention: the link whose paths are slower than their own baseline.

Input: each clock-solver window's corrected one-way delays (``owd`` rows: src, dst,
source port), summarised per path as the window's median, and which spine each path
(src, dst, source port) takes, from the path traces (:mod:`analytics.detect.paths`).
Each path has its own healthy baseline: the lowest window median seen. A path whose
median exceeds its baseline by more than ``excess_ns`` (1 ms: a queue, not jitter) in a
window is *slow*; one within a tenth of that is *fast*.

A path X → Z through spine Y crosses leafX–spineY upwards and leafZ–spineY downwards.
Every fast path clears the two (link, direction) it crosses; the suspects are the
smallest set of (link, direction) among the rest that explains every slow path (greedy
set cover, as for flaps), each with the slow paths and their median excess as evidence.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analytics.detect.anomalies import Observation

EXCESS_NS = 1_000_000.0
MIN_SLOW_PATHS = 2


@dataclass
class _Path:
    baseline: float = float("inf")
    median: float = float("nan")
    window: int = -1


class PathDelays:
    def __init__(
        self,
        host_rack: dict[int, str],
        links_by_ends: dict[tuple[str, str], str],
        spine_of: dict[tuple[int, int, int], str],
        host_names: dict[int, str] | None = None,
        excess_ns: float = EXCESS_NS,
    ) -> None:
        self.host_rack = host_rack
        self.by_ends = links_by_ends
        self.spine_of = spine_of  # (src, dst, sport) -> spine, kept by FabricPaths
        self.host_names = host_names if host_names is not None else {}
        self.excess_ns = excess_ns
        self.paths: dict[tuple[int, int, int], _Path] = {}
        self.window = 0
        # (src, dst) -> the jobs whose messages run between these hosts now (the in-band
        # reports, :meth:`JobDelays.jobs_between`): named beside a contended link.
        self.jobs_between: Callable[[int, int], set[str]] = lambda s, d: set()

    def feed(self, src: np.ndarray, dst: np.ndarray, sport: np.ndarray, median: np.ndarray) -> None:
        """One solver window: the median corrected one-way delay of each path."""
        self.window += 1
        for s, d, p, m in zip(src.tolist(), dst.tolist(), sport.tolist(), median.tolist(),
                              strict=True):  # fmt: skip
            if not np.isfinite(m):
                continue
            path = self.paths.setdefault((s, d, p), _Path())
            path.median, path.window = m, self.window
            path.baseline = min(path.baseline, m)

    def pair_excess(self) -> dict[tuple[int, int], float]:
        """(src, dst) -> the median over its paths of their latest window's excess over
        their floor (ns): what the probes between two hosts wait in queues now."""
        by_pair: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
        for (s, d, _p), path in self.paths.items():
            if path.window == self.window and np.isfinite(path.baseline):
                by_pair[(s, d)].append(path.median - path.baseline)
        return {k: float(np.median(v)) for k, v in by_pair.items()}

    def observations(self, now_ns: int) -> list[Observation]:
        slow: dict[tuple[int, int, int], float] = {}
        crossing: dict[tuple[int, int, int], list[tuple[str, str]]] = {}
        cleared: set[tuple[str, str]] = set()
        for key, path in self.paths.items():
            if path.window != self.window or not np.isfinite(path.baseline):
                continue
            spine = self.spine_of.get(key)
            src_rack, dst_rack = self.host_rack.get(key[0]), self.host_rack.get(key[1])
            if spine is None or src_rack is None or dst_rack is None or src_rack == dst_rack:
                continue
            up, down = self.by_ends.get((src_rack, spine)), self.by_ends.get((dst_rack, spine))
            if up is None or down is None:
                continue
            hops = [(up, "leaf→spine"), (down, "spine→leaf")]
            excess = path.median - path.baseline
            if excess > self.excess_ns:
                slow[key] = excess
                crossing[key] = hops
            elif excess < self.excess_ns / 10:
                cleared.update(hops)
        explains: dict[tuple[str, str], set[tuple[int, int, int]]] = collections.defaultdict(set)
        for key, hops in crossing.items():
            for hop in hops:
                if hop not in cleared:
                    explains[hop].add(key)
        out = []
        left = {k for k in slow if any(k in e for e in explains.values())}
        while left:
            best = max(explains, key=lambda h: (len(explains[h] & left), h))
            covered = explains[best] & left
            if len(covered) < MIN_SLOW_PATHS:
                break
            left -= covered
            link, direction = best
            excesses = sorted(slow[k] for k in covered)
            pairs = sorted(
                {f"{self.host_names.get(s, s)}→{self.host_names.get(d, d)}" for s, d, _ in covered}
            )
            med_ms = excesses[len(excesses) // 2] / 1e6
            on = {(s, d): self.jobs_between(s, d) for s, d, _ in covered}
            jobs = sorted(set().union(*on.values()))
            job_hosts = sorted({self.host_names.get(h, str(h)) for (s, d), j in on.items()
                                if j for h in (s, d)})  # fmt: skip
            out.append(
                Observation(
                    kind="contention",
                    key=f"{link} {direction}",
                    score=min(1.0, 0.5 + 0.1 * len(covered)),
                    summary=(
                        f"{link} ({direction}) is contended: +{med_ms:.1f} ms one-way on "
                        f"{len(covered)} path(s) crossing it ({len(pairs)} pair(s))"
                        + (f"; jobs between these hosts: {', '.join(jobs[:6])}" if jobs else "")
                    ),
                    link=link,
                    evidence={
                        "direction": direction,
                        "slow_paths": len(covered),
                        "pairs": pairs[:20],
                        "jobs": jobs[:20],
                        "job_hosts": job_hosts[:64],  # the hosts those jobs run between
                        "median_excess_ms": round(med_ms, 3),
                        "max_excess_ms": round(excesses[-1] / 1e6, 3),
                        "threshold_ms": self.excess_ns / 1e6,
                        "source": "corrected one-way delays per path against its baseline, "
                        "paths from traces, tomography",
                    },
                )
            )
        return out
