"""A host's clock stepping inside a window: told from its pairs, stated, its delays held back.

A PTP servo re-locking, chrony's ``makestep`` or ntpd stepping moves a host's timestamps
by the step from one instant on. The pair fit's line cannot follow: bins after the step
lie off it by the step, and a step late in the window leaves one bin, which the fit
rejects as a bad timestamp — the host came out SOLVED to a few ns with its one-way
delays after the step off by the whole step. Two signs tell a step on a pair:

- its midpoints **jump** where no queue explains it: a queue moves a bin's midpoint by at
  most half its excess round trip, a step moves every bin after it by the step with no
  excess (:func:`jumps`, run by the pair fit);
- one bin's **round trip reads short** of the pair's clean one, its other bins not: the
  step fell inside that bin, one direction's envelope point comes from before it and the
  other's from after, and the clocks no longer cancel. No queue shortens a round trip.
  The clean round trip is tracked per pair across windows (:func:`track_rtt`).

A host stepped when most of its pairs show a sign at the same place (:func:`stepped_hosts`);
the pair fits cannot tell which side of the step is right, so the solver states the host
uncertain by the step and keeps none of its one-way delays for the window. Limits, and
the figures: docs/clock.md, "Clock steps" and "Limits".
"""

from __future__ import annotations

import numpy as np

from analytics.clock.clock_state import ClockState
from analytics.clock.key_index import KeyIndex

STEP_SIGMAS = 10.0  # a round trip this many noise units short of the pair's clean one
RTT_RISE = 256  # a clean round trip seen longer moves 1/RTT_RISE of the way per window


def _pair_key(ia: np.ndarray, ib: np.ndarray, m: int) -> np.ndarray:
    """The key of each pair of host indices (either order) among ``m`` hosts."""
    key = np.minimum(ia, ib).astype(np.int64)
    key *= m
    key += np.maximum(ia, ib)
    return key


def rtt_summary(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per pair of ``points`` (both directions' envelope points, shape (2, pairs, bins)):
    the least round trip over its bins with both directions (inf: none), that bin (-1:
    none), the second least where it has at least 3 such bins (NaN else: its clean one),
    and the second least where it has at least 2 (NaN else)."""
    rtt = points[0] + points[1]  # inf where a direction is missing (never NaN)
    s = np.sort(rtt, axis=1)  # (a row sort of 8 is faster than a partition or a min)
    least = s[:, 0]
    known = np.isfinite(least)
    least_bin = np.where(known, np.argmax(rtt == least[:, None], axis=1), -1)
    none = np.full(len(least), np.nan)
    if s.shape[1] < 2:
        return least, least_bin, none, none
    second = np.where(np.isfinite(s[:, 1]), s[:, 1], np.nan)
    if s.shape[1] < 3:
        return least, least_bin, none, second
    return least, least_bin, np.where(np.isfinite(s[:, 2]), second, np.nan), second


def jumps(
    mid: np.ndarray,
    xm: np.ndarray,
    w: np.ndarray,
    valid: np.ndarray,
    nvalid: np.ndarray,
    excess: np.ndarray,
    noise: float,
    bad: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per pair (rows of the pair fit's bins: midpoints, their x, weights, validity, valid
    bins per pair, excess round trips, the midpoints' noise, bins the line left beyond
    what queueing allows): the jump of its midpoints where a step explains them and a
    line does not.

    For pairs of at least 3 bins with a ``bad`` bin, try each split k: two lines of one
    slope, bins < k and >= k. The split whose every bin lies within half its excess plus
    6 noise units of them, whose jump is more than half the excess of either side (of
    the bins that place it, as weighted) plus 6 noise units, whose sides have alike excess (within 6
    noise units and a quarter of the jump: a queue forming or ending lengthens the round
    trips of one side and moves its midpoints by half of that; a step moves them with
    the round trips unchanged), whose slope moves no bin by more than 12 noise units
    (the midpoints come detrended with the pair's slope), and whose weighted squared
    residual is least gives the
    jump (second intercept less the first: b's clock less a's) and k; 0 and -1 where no
    split does."""
    rows, nb = mid.shape
    jump = np.zeros(rows)
    at = np.full(rows, -1, np.intp)
    sus = np.flatnonzero(bad.any(axis=1) & (nvalid >= 3))
    if not len(sus) or nb < 2:
        return jump, at
    y, x, ws = mid[sus], xm[sus], w[sus]
    ex = np.where(valid[sus], excess[sus], np.nan)
    tol = np.where(valid[sus], ex / 2 + 6 * noise, np.inf)
    # before-sums for every split k = 1..nb-1 at once (cumulative over bins)
    terms = [ws, ws * x, ws * y, ws * x * x, ws * x * y]
    cum = [np.cumsum(t, axis=1)[:, :-1] for t in terms]  # (m, nb-1): bins < k
    tot = [t.sum(axis=1, keepdims=True) for t in terms]
    aft = [t - c for t, c in zip(tot, cum, strict=True)]
    with np.errstate(divide="ignore", invalid="ignore"):
        xb1, yb1 = cum[1] / cum[0], cum[2] / cum[0]
        xb2, yb2 = aft[1] / aft[0], aft[2] / aft[0]
        sxx = (cum[3] - cum[0] * xb1 * xb1) + (aft[3] - aft[0] * xb2 * xb2)
        sxy = (cum[4] - cum[0] * xb1 * yb1) + (aft[4] - aft[0] * xb2 * yb2)
        s = np.where(sxx > 0, sxy / sxx, 0.0)
        a1, a2 = yb1 - s * xb1, yb2 - s * xb2  # NaN where a side has no bin
    two = (cum[0] > 0) & (aft[0] > 0)  # a bin on each side
    k = np.arange(1, nb)
    after = np.arange(nb)[None, :] >= k[:, None]  # (nb-1, nb)
    fit = np.where(after[None], a2[..., None], a1[..., None]) + s[..., None] * x[:, None, :]
    r = np.where(np.isfinite(tol)[:, None, :], y[:, None, :] - fit, 0.0)
    fits = two & np.all(np.abs(r) <= tol[:, None, :], axis=2)
    # the excess of the bins that place each side (weighted as the fit weighs them)
    we = np.cumsum(ws * np.nan_to_num(ex), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = we[:, :-1] / cum[0]
        e2 = (we[:, -1:] - we[:, :-1]) / aft[0]
    # a step leaves the round trips alike on both sides; a queue forming or ending
    # lengthens them on one side, and moves the midpoints by half of that
    d = np.abs(a2 - a1)
    fits &= (d > np.fmax(e1, e2) / 2 + 6 * noise) & (np.abs(e1 - e2) <= 6 * noise + d / 4)
    # the midpoints are detrended with the pair's slope already: a step needs no slope of
    # its own (a steep one, set by bins the fit hardly weighs, bends a queue into a step)
    span = np.max(np.where(valid[sus], np.abs(x), 0.0), axis=1)
    fits &= np.abs(s) * span[:, None] <= 12 * noise
    chi2 = np.where(fits, (ws[:, None, :] * r * r).sum(axis=2), np.inf)
    best = np.argmin(chi2, axis=1)
    ok = np.isfinite(chi2[np.arange(len(sus)), best])
    jump[sus[ok]] = (a2 - a1)[np.arange(len(sus)), best][ok]
    at[sus[ok]] = best[ok] + 1
    return jump, at


def prior_rtt(
    prior: ClockState | None, prior_i: np.ndarray, pa: np.ndarray, pb: np.ndarray
) -> np.ndarray:
    """Each pair's (host indices ``pa`` < ``pb``; ``prior_i`` maps them to ``prior``'s)
    clean round trip as tracked up to the previous window (NaN: not)."""
    out = np.full(len(pa), np.nan)
    if prior is None or not len(prior.pair_keys):
        return out
    ia, ib = np.take(prior_i, pa), np.take(prior_i, pb)
    known = (ia >= 0) & (ib >= 0)
    key = _pair_key(ia, ib, len(prior.hosts))
    pos = KeyIndex(prior.pair_keys).lookup(np.where(known, key, -1))
    hit = known & (pos >= 0)
    out[hit] = prior.pair_rtt_ns[pos[hit]]
    return out


def stepped_hosts(
    jump_ns: np.ndarray,
    jump_at: np.ndarray,
    rtt_least: np.ndarray,
    rtt_least_bin: np.ndarray,
    rtt_clean: np.ndarray,
    pa: np.ndarray,
    pb: np.ndarray,
    n: int,
    hist: np.ndarray,
    noise: float,
) -> np.ndarray:
    """Per host of ``n``: how far its clock stepped inside the window (ns; 0: no step).

    Per pair (the pair fit's ``jump_*`` and ``rtt_*``; ``hist`` from :func:`prior_rtt`) a
    sign is a jump, or its least round trip short of ``hist`` by more than
    ``STEP_SIGMAS`` noise units while its clean one is within that of ``hist``. A host
    stepped when its pairs of 3 bins or more show one — at least half of them, more than
    any other end of them has — at the same place within a bin (a jump at a bin
    boundary, a short bin at its middle), jumping the same way; the step is the signs'
    median size."""
    step = np.zeros(n)
    with np.errstate(invalid="ignore"):
        # one bin short, the pair's clean round trip neither short too (a queue that had
        # stood since before the window ending leaves every bin after it short) nor
        # long (one ending in the window's last bin leaves that bin clean and the rest
        # queued: short of ``hist`` where it rose while the queue stood)
        low = hist - STEP_SIGMAS * noise
        high = hist + STEP_SIGMAS * noise
        short = np.isfinite(hist) & (rtt_least < low) & (rtt_clean >= low) & (rtt_clean <= high)
    jumped = jump_at >= 0
    judged = np.isfinite(rtt_clean)  # pairs of 3 bins or more
    sign = (jumped | short) & judged
    if not sign.any():
        return step
    n_judged = np.bincount(pa[judged], minlength=n) + np.bincount(pb[judged], minlength=n)
    n_sign = np.bincount(pa[sign], minlength=n) + np.bincount(pb[sign], minlength=n)
    where = np.where(jumped, jump_at.astype(np.float64), rtt_least_bin + 0.5)
    with np.errstate(invalid="ignore"):
        size = np.where(jumped, np.abs(jump_ns), hist - rtt_least)
    rows = np.flatnonzero(sign)
    for h in np.flatnonzero((n_sign >= 2) & (2 * n_sign >= n_judged)).tolist():
        mine = rows[(pa[rows] == h) | (pb[rows] == h)]
        same = mine[np.abs(where[mine] - np.median(where[mine])) <= 1]
        # the way its clock went, from the jumps (b's clock less a's): the most's
        way = np.sign(np.where(pb[same] == h, jump_ns[same], -jump_ns[same]))
        most = 1.0 if np.sum(way > 0) >= np.sum(way < 0) else -1.0
        same = same[~jumped[same] | (way == most)]
        other = np.where(pa[same] == h, pb[same], pa[same])
        if len(same) >= 2 and 2 * len(same) >= n_judged[h] and len(same) > n_sign[other].max():
            step[h] = float(np.median(size[same]))
    return step


def track_rtt(
    state: ClockState,
    kept: np.ndarray,
    pa: np.ndarray,
    pb: np.ndarray,
    hist: np.ndarray,
    clean: np.ndarray,
) -> None:
    """Hand each pair's clean round trip on in ``state`` (whose first hosts are this
    window's ``kept`` ones, in its order): this window's where the pair has one (at once
    when shorter, 1/RTT_RISE of the way when longer), else the previous (``hist``)."""
    if not len(pa):
        return
    with np.errstate(invalid="ignore"):
        rise = hist + (clean - hist) / RTT_RISE
        rtt = np.where(np.isnan(hist), clean, np.where(clean < hist, clean, rise))
    rtt = np.where(np.isfinite(rtt), rtt, hist)
    at = np.cumsum(kept) - 1
    use = np.isfinite(rtt) & np.take(kept, pa) & np.take(kept, pb)
    state.pair_keys = _pair_key(at[pa[use]], at[pb[use]], len(state.hosts))
    state.pair_rtt_ns = rtt[use]


class StandingQueue:
    """A queue standing in front of a host through most of a window (sustained incast)
    queues every bin of every pair of it: each pair's second-least round trip, its
    clean reference within the window, is queued too, and the midpoints sit half the
    queue off, alike on every pair, which no loop sees. Told by the host's pairs all
    reading longer (all their bins but one) than their clean round trips of earlier
    windows (``hist``) by more than ``STEP_SIGMAS`` noise units — one pair alone varies
    by more than that, with the paths its few probes took; all of a host's at once do
    not. Those pairs' excess is then measured against ``hist`` plus that slack
    (:meth:`cap`); a host none of whose pairs has a bin under it (:meth:`buried`) has
    nothing left to read its clock by: the solver carries it on its previous solution
    while that is recent, else states it uncertain by half the queue."""

    MIN_PAIRS = 4  # a host needs this many pairs with a history to be judged first

    def __init__(
        self, hist: np.ndarray, pa: np.ndarray, pb: np.ndarray, n: int, was: np.ndarray
    ) -> None:
        """``was``: per host, judged queued in the previous window (then most of its
        pairs with a history reading it suffice: the queue is followed while it stands,
        and to its last bins)."""
        self.hist, self.pa, self.pb, self.n, self.was = hist, pa, pb, n, was
        self.hosts = np.zeros(n, bool)  # the hosts judged queued (set by cap)
        self.ref_cap: np.ndarray | None = None  # what cap returned

    def _per_host(self, mask: np.ndarray) -> np.ndarray:
        return np.bincount(self.pa[mask], minlength=self.n) + np.bincount(
            self.pb[mask], minlength=self.n
        )

    def cap(self, rtt_least: np.ndarray, rtt_second: np.ndarray, noise: float) -> np.ndarray | None:
        """Per pair, the reference cap (NaN: none) for :func:`pair_fit.fit_pairs`, from
        its least and second-least round trips over its bins (NaN: fewer than 2): all
        its bins but one (its one bin) read longer than its clean round trip of earlier
        windows."""
        ref = self.hist + STEP_SIGMAS * noise
        rtt = np.where(np.isfinite(rtt_second), rtt_second, rtt_least)
        with np.errstate(invalid="ignore"):
            known = np.isfinite(ref) & np.isfinite(rtt)
            raised = known & (rtt > ref)
        if not raised.any():
            return None
        n_known, n_raised = self._per_host(known), self._per_host(raised)
        self.hosts = ((n_known >= self.MIN_PAIRS) & (n_raised == n_known)) | (
            self.was & (2 * n_raised > n_known)
        )
        use = known & (np.take(self.hosts, self.pa) | np.take(self.hosts, self.pb))
        self.ref_cap = np.where(use, ref, np.nan) if use.any() else None
        return self.ref_cap

    def buried(self, rtt_least: np.ndarray, has: np.ndarray) -> np.ndarray:
        """Per host: how far (ns) its clock may read off, judged queued with every bin of
        every pair of it (with an estimate, ``has``) over the cap: half of what the least
        round trip of its least queued pair still reads over the cap; 0: a clean bin left
        to read its clock by, or not queued."""
        if self.ref_cap is None:
            return np.zeros(self.n)
        use = has & np.isfinite(self.ref_cap)
        with np.errstate(invalid="ignore"):
            queued = np.maximum(rtt_least[use] - self.ref_cap[use], 0.0) / 2
        out = np.full(self.n, np.inf)
        np.minimum.at(out, self.pa[use], queued)
        np.minimum.at(out, self.pb[use], queued)
        return np.where(self.hosts & np.isfinite(out), out, 0.0)
