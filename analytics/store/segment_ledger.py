"""Which (host, segment id) pairs the store already holds: the dedup ledger.

Collectors number segments monotonically per host, so the acknowledged ids of one host
are a handful of runs ("1..5000, 5003..9000" when the spool dropped two segments). The
ledger keeps each host's ids as sorted, disjoint, inclusive intervals: memory grows with
gaps, not with traffic. It is rebuilt at start from the ``batches`` table (the commit
record of every stored batch), so dedup survives restarts and crashes.
"""

from __future__ import annotations

import bisect

import numpy as np


class SegmentLedger:
    """Sorted disjoint inclusive intervals of segment ids, per host id."""

    def __init__(self) -> None:
        self._starts: dict[int, list[int]] = {}
        self._ends: dict[int, list[int]] = {}

    def __contains__(self, key: tuple[int, int]) -> bool:
        host, seg = key
        starts = self._starts.get(host)
        if not starts:
            return False
        i = bisect.bisect_right(starts, seg) - 1
        return i >= 0 and seg <= self._ends[host][i]

    def add(self, host: int, seg: int) -> None:
        starts = self._starts.setdefault(host, [])
        ends = self._ends.setdefault(host, [])
        i = bisect.bisect_right(starts, seg) - 1
        if i >= 0 and seg <= ends[i]:
            return
        joins_left = i >= 0 and ends[i] == seg - 1
        joins_right = i + 1 < len(starts) and starts[i + 1] == seg + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = seg
        elif joins_right:
            starts[i + 1] = seg
        else:
            starts.insert(i + 1, seg)
            ends.insert(i + 1, seg)

    def add_many(self, hosts: np.ndarray, segs: np.ndarray) -> None:
        """Bulk load (start-up): runs are found with numpy, then merged in."""
        if len(hosts) == 0:
            return
        order = np.lexsort((segs, hosts))
        h = hosts[order].astype(np.int64)
        g = segs[order].astype(np.int64)
        breaks = np.flatnonzero((np.diff(h) != 0) | (np.diff(g) > 1)) + 1
        run_starts = np.concatenate(([0], breaks))
        run_ends = np.concatenate((breaks - 1, [len(h) - 1]))
        for a, z in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
            self._add_run(int(h[a]), int(g[a]), int(g[z]))

    def _add_run(self, host: int, lo: int, hi: int) -> None:
        starts = self._starts.setdefault(host, [])
        ends = self._ends.setdefault(host, [])
        i = bisect.bisect_left(starts, lo)
        if i > 0 and ends[i - 1] >= lo - 1:
            i -= 1
        j = i
        while j < len(starts) and starts[j] <= hi + 1:
            j += 1
        if i < j:  # merge with the overlapping/adjacent intervals i..j-1
            lo = min(lo, starts[i])
            hi = max(hi, ends[j - 1])
        starts[i:j] = [lo]
        ends[i:j] = [hi]

    def hosts(self) -> int:
        return len(self._starts)

    def intervals(self) -> int:
        return sum(len(v) for v in self._starts.values())
