"""The NTP-style RTT/2 baseline on the same echoes, for comparison with the solver.

Per echo (prober S, echoer E): ``offset(E) - offset(S) = ((t2 - t1) + (t3 - t4)) / 2``
and ``rtt = (t4 - t1) - (t3 - t2)``, assuming both legs take equally long. Per
host pair, the drift is the least-squares slope of those offsets over time, and
the offset at the reference instant is either the mean (``method="mean"``: the
plain ping-pong estimate) or the sample of least RTT carried to the reference
with that slope (``method="min_rtt"``: NTP's clock filter). No coded-probe
filter and no network effect: that is what the baseline is for.
"""

from __future__ import annotations

import numpy as np

from analytics.clock import network
from analytics.clock.key_index import KeyIndex
from analytics.clock.tables import BASELINE_ROW
from collector.records import ECHO


def rtt2_baseline(echoes: np.ndarray, *, ref_ns: int, method: str = "min_rtt") -> np.ndarray:
    """BASELINE_ROW per host pair (host_a < host_b by id) seen in ``echoes``."""
    if not isinstance(echoes, np.ndarray) or echoes.dtype != ECHO:
        raise TypeError("echoes: expected a numpy array of collector.records.ECHO")
    if method not in ("min_rtt", "mean"):
        raise ValueError("method: expected min_rtt or mean")
    t1, t2, t3, t4 = (echoes[k].astype(np.int64) for k in ("t1_ns", "t2_ns", "t3_ns", "t4_ns"))
    ok = (t4 >= t1) & (t3 >= t2) & (echoes["src"] != echoes["dst"])
    s, e = echoes["src"][ok], echoes["dst"][ok]
    t1, t2, t3, t4 = t1[ok], t2[ok], t3[ok], t4[ok]
    off = ((t2 - t1) + (t3 - t4)).astype(np.float64) / 2  # offset(E) - offset(S)
    rtt = ((t4 - t1) - (t3 - t2)).astype(np.float64)
    flip = s > e  # orient to (a, b) = (min id, max id)
    a = np.where(flip, e, s)
    b = np.where(flip, s, e)
    m = np.where(flip, -off, off)
    # time on a's clock: t1 when a probed, t2 when a echoed
    x = (np.where(flip, t2, t1) - ref_ns).astype(np.float64)
    hosts = np.unique(np.concatenate((a, b)))
    key = np.searchsorted(hosts, a).astype(np.int64) * len(hosts) + np.searchsorted(hosts, b)
    _, pid = np.unique(key, return_inverse=True)
    pid = pid.ravel()
    n = int(pid.max()) + 1 if len(pid) else 0
    cnt = np.bincount(pid, minlength=n).astype(np.float64)
    sx = np.bincount(pid, x, n)
    sy = np.bincount(pid, m, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        xb, yb = sx / cnt, sy / cnt
        dx = x - xb[pid]
        sxx = np.bincount(pid, dx * dx, n)
        sxy = np.bincount(pid, dx * (m - yb[pid]), n)
        slope = np.where(sxx > cnt * 1e12, sxy / sxx, 0.0)  # needs >= 1 ms of spread
    rmin = np.full(n, np.inf)
    np.minimum.at(rmin, pid, rtt)
    if method == "mean":
        alpha = yb - slope * xb
    else:
        best = np.full(n, -1, np.intp)
        at = np.flatnonzero(rtt == rmin[pid])
        best[pid[at]] = at
        alpha = m[best] - slope * x[best]
    first = np.full(n, -1, np.intp)
    first[pid[::-1]] = np.arange(len(pid))[::-1]
    out = np.zeros(n, BASELINE_ROW)
    out["host_a"] = a[first]
    out["host_b"] = b[first]
    out["offset_ns"] = alpha
    out["drift_ppm"] = slope * 1e6
    out["rtt_min_ns"] = rmin
    out["n"] = cnt
    return out


def rtt2_host_offsets(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host ids and mean-zero offsets from baseline pairs by plain least squares
    (equal weights), so the baseline can be compared host by host as well."""
    hosts = np.unique(np.concatenate((pairs["host_a"], pairs["host_b"])))
    idx = KeyIndex(hosts)
    ia, ib = idx.lookup(pairs["host_a"]), idx.lookup(pairs["host_b"])
    g = network.solve(ia, ib, pairs["offset_ns"], np.ones(len(pairs)), len(hosts))
    return hosts, g.value
