"""Per host pair: offset and drift from the lower envelopes of both directions.

For a pair (a, b), a < b, with x on a's clock relative to the window reference:

    forward  a -> b:  y = rx_b - tx_a =  D  + g(x)     g(x) = alpha + s * x
    reverse  b -> a:  y = rx_a - tx_b =  D' - g(x)

Queueing only ever adds delay, so the forward points lie above ``g + P`` and the
negated reverse points below ``g - P'``; the separating line sits between the two
envelopes. We compute it on all pairs at once, without a Python loop per pair:

1. Split the window into bins (default 8). Detrend with the current slope guess
   ``s0`` and keep, per (direction, pair, bin), the point of least delay
   (``np.minimum.at`` over a flat cell index: one O(n) pass).
2. Per bin with both directions, the midpoint of the two envelope points is
   ``g(x_mid) + (D_f - D_r) / 2``. Its error is bounded by half the bin's excess
   round-trip time over the pair's clean round trip (queueing on either side),
   so each bin is weighted ``1 / (sigma^2 + excess^2)`` (NTP's clock-filter idea,
   made continuous). The reference round trip is the second-smallest of the
   pair's bins, so one bin with a broken (too-early) timestamp cannot become
   the reference.
3. Weighted least-squares line through the bin midpoints (closed form from
   segment sums), one rejection pass for bins whose residual exceeds what their
   excess allows (bad timestamps), refit.

Run twice: the second pass detrends with the first pass's slope, so the choice
of envelope points no longer depends on the guess.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from analytics.clock import steps

T = TypeVar("T")
# Fewer samples / pairs than this: one thread (a second would cost more than it saves).
_MIN_SPLIT_ROWS = 200_000
_MIN_SPLIT_PAIRS = 20_000


def _none() -> np.ndarray:
    """No rows: the default of the fields fit_pairs always fills."""
    return np.empty(0)


@dataclass
class PairFit:
    """Per pair (arrays of length n_pairs)."""

    alpha: np.ndarray  # offset b - a at x = 0 (a's clock at the window reference), ns
    slope: np.ndarray  # drift b - a, ns/ns
    sigma_alpha: np.ndarray  # ns; inf where there is no estimate
    sigma_slope: np.ndarray  # ns/ns; inf where the drift is not determined
    n_bins: np.ndarray  # bins with both directions that were used
    n_fwd: np.ndarray  # pure samples a -> b
    n_rev: np.ndarray  # pure samples b -> a
    noise_ns: float  # estimated per-bin noise of the midpoints
    # Where the pair is measured: the weighted mean x of its bins and the sigma of the
    # offset there (no slope in it). Where the slope is not determined (one bin),
    # ``alpha`` is carried from x_mid to 0 with the slope guess and ``sigma_alpha``
    # omits that guess's error: the solver re-anchors such pairs with the network drift.
    x_mid: np.ndarray | None = None
    sigma_mid: np.ndarray | None = None
    # Pairs with fewer than 3 bins have no clean round trip of their own: half their
    # bins' excess over the window's least clean round trip (:func:`_clean_rtt`), the
    # most their offset could be off if every probe they kept queued alike; 0 else.
    bound_ns: np.ndarray | None = None
    # The pair's round trips per bin (both directions' envelope points; clocks cancel):
    # the least, the bin it is in (-1: none), and the second least where the pair has 3
    # bins (its clean round trip, NaN else). A clock stepping inside a bin takes one
    # direction's point from before the step and the other's from after, and the bin's
    # round trip reads short by the step: no queue does that (steps.stepped_hosts).
    rtt_least: np.ndarray = field(default_factory=_none)
    rtt_least_bin: np.ndarray = field(default_factory=_none)
    rtt_clean: np.ndarray = field(default_factory=_none)
    # A pair whose midpoints no line fits within what queueing allows, but two lines of
    # one slope do, split between bin ``jump_at - 1`` and ``jump_at``: the jump between
    # them (b's clock less a's; ns); 0 and -1 elsewhere (:func:`steps.jumps`).
    jump_ns: np.ndarray = field(default_factory=_none)
    jump_at: np.ndarray = field(default_factory=_none)


RefCap = Callable[[np.ndarray, np.ndarray, float], "np.ndarray | None"]


def _kth_smallest(v: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = np.sort(v, axis=1)  # inf (missing) sorts last
    return np.take_along_axis(s, k[:, None], axis=1)[:, 0]


def fit_pairs(
    pid: np.ndarray,
    rev: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    n_pairs: int,
    *,
    window_ns: float,
    n_bins: int,
    slope_guess: np.ndarray,
    noise_ns: float | None,
    noise_floor_ns: float,
    band: float = 0.0,
    pool: ThreadPoolExecutor | None = None,
    ref_cap: RefCap | None = None,
) -> PairFit:
    """Fit every pair. ``pid`` pair index, ``rev`` True for b -> a samples,
    ``x`` float ns on a's clock relative to the reference, ``y = rx - tx`` in ns.
    ``ref_cap(rtt_least, rtt_second, noise_ns)`` (each pair's least and second-least
    round trips over its bins, inf / NaN where none) may return, per pair, a round trip
    (NaN: none) that its bins' excess is measured against where its second-least is
    longer: a queue standing through most of the window still counts as excess.
    With a ``pool``, half of the per-sample passes run in its thread."""
    n = len(pid)
    size = n_pairs * 2 * n_bins
    z = np.empty(n)  # detrended delay: y - s0 * x forward, y + s0 * x reverse
    cell = np.empty(n, np.intp)  # (direction, pair, bin): each direction contiguous

    def cells(sl: slice) -> np.ndarray:
        # bin of each sample (truncation = floor here: negative values are clipped to 0)
        t = x[sl] + window_ns / 2
        t *= n_bins / window_ns
        b = t.astype(np.intp)
        del t
        np.clip(b, 0, n_bins - 1, out=b)
        zs = z[sl]
        cs = cell[sl]
        np.take(slope_guess, pid[sl], out=zs, mode="wrap")
        zs *= x[sl]
        sign = rev[sl].astype(np.float64)  # -1.0 forward, 1.0 reverse (no branch per row)
        sign *= 2.0
        sign -= 1.0
        zs *= sign
        del sign
        zs += y[sl]
        np.multiply(rev[sl], n_pairs, out=cs)
        cs += pid[sl]
        cs *= n_bins
        cs += b
        part = np.full(size, np.inf)
        np.minimum.at(part, cs, zs)
        return part

    parts = _row_halves(pool, n, cells)
    zmin = parts[0] if len(parts) == 1 else np.minimum(parts[0], parts[1], out=parts[0])

    if band <= 0:
        z_floor = np.take(zmin, cell, mode="wrap")  # per sample: its bin's minimum
        at_min = np.flatnonzero(z == z_floor)
        xsel = np.zeros(size)
        xsel[np.take(cell, at_min, mode="wrap")] = np.take(x, at_min, mode="wrap")
        counts = np.bincount(cell, minlength=size)
    # Per-pair work below runs on row ranges of pairs (halves with a pool).
    shape = (2, n_pairs, n_bins)
    zmin3 = zmin.reshape(shape)

    if noise_ns is None:
        # Typical midpoint noise: half the median |rtt - ref| over bins of pairs
        # with enough bins (robust to congested bins by the median).
        def noise_terms(sl: slice) -> np.ndarray:
            zf, zr = zmin3[0, sl], zmin3[1, sl]
            rows = np.flatnonzero(np.count_nonzero(np.isfinite(zf) & np.isfinite(zr), axis=1) >= 3)
            _, _, valid, nvalid, excess = _bin_points(zmin3[:, sl][:, rows], None)
            e = np.sort(np.where(valid, excess, np.inf), axis=1)
            return np.take_along_axis(e, (nvalid // 2)[:, None], axis=1)[:, 0]

        per_pair = np.concatenate(
            _row_halves(pool, n_pairs, _pair_blocks(noise_terms), _MIN_SPLIT_PAIRS)
        )
        noise_ns = float(0.5 * 1.4826 * np.median(per_pair)) if len(per_pair) else noise_floor_ns
        noise_ns = max(noise_ns, noise_floor_ns)
    noise = float(noise_ns)

    if band > 0:
        # Envelope band: average every sample within band * noise of its bin's
        # minimum instead of taking the minimum alone. With timestamp noise larger
        # than the queueing, the minimum is mostly the most negative noise draw;
        # the band mean is as unbiased (same selection in both directions) and
        # far less noisy. Queued samples stay out of the band.
        thr = band * noise

        def band_sums(sl: slice) -> tuple[np.ndarray, ...]:
            cs, zs = cell[sl], z[sl]
            z_floor = np.take(zmin, cs, mode="wrap")  # per sample: its bin's minimum
            z_floor += thr
            inband = np.flatnonzero(zs <= z_floor)
            c = np.take(cs, inband, mode="wrap")
            return (
                np.bincount(c, minlength=size),
                np.bincount(c, np.take(zs, inband, mode="wrap"), size),
                np.bincount(c, np.take(x[sl], inband, mode="wrap"), size),
                np.bincount(cs, minlength=size),
            )

        sums = _row_halves(pool, n, band_sums)
        cnt, zsum, xsum, counts = (
            sums[0] if len(sums) == 1 else [a + b for a, b in zip(*sums, strict=True)]
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            zb = zsum / cnt
            xb = xsum / cnt
        zb[cnt == 0] = np.inf
        points, xs = zb.reshape(shape), xb.reshape(shape)
    else:
        points, xs = zmin3, xsel.reshape(shape)

    rtt_least, rtt_least_bin, rtt_clean, rtt_second = _pair_blocks(
        lambda sl: steps.rtt_summary(points[:, sl])
    )(slice(0, n_pairs))
    cap = None if ref_cap is None else ref_cap(rtt_least, rtt_second, noise)
    # the bin points once: the few-bin sigma, the lines and the bounds share them
    bins = _pair_blocks(
        lambda sl: _bin_points(points[:, sl], xs[:, sl], ref_cap=None if cap is None else cap[sl])
    )(slice(0, n_pairs))
    few_sigma = _few_bin_sigma(bins)
    clean_rtt = _clean_rtt(points)

    def lines(sl: slice) -> tuple[np.ndarray, ...]:
        rows = tuple(a[sl] for a in bins)
        fixed = None if cap is None else np.isfinite(cap[sl])
        return _fit_lines(rows, slope_guess[sl], noise, few_sigma, fixed)

    parts_l = _row_halves(pool, n_pairs, _pair_blocks(lines), _MIN_SPLIT_PAIRS)
    alpha, slope, sigma_alpha, sigma_slope, used, x_mid, sigma_mid, jump, jump_at = (
        parts_l[0] if len(parts_l) == 1 else [np.concatenate(p) for p in zip(*parts_l, strict=True)]
    )
    counts = _row_sum(counts.reshape(2 * n_pairs, n_bins)).reshape(2, n_pairs)
    # Pairs with fewer than 3 bins: how far their midpoints could be off if all their
    # least round trips queued (half their excess over the window's clean round trip).
    nvalid = bins[3]
    few = np.flatnonzero((nvalid > 0) & (nvalid < 3))
    bound = np.zeros(n_pairs)
    if len(few):
        # max over valid bins of rtt - ref, ref = min(least rtt, clean_rtt) <= every rtt:
        # the largest rtt less ref (x - ref rounds monotonically: the same bits as the
        # largest of the differences)
        zf, zr = points[0][few], points[1][few]
        valid = np.isfinite(zf) & np.isfinite(zr)
        rtt = zf + zr
        least = np.where(valid, rtt, np.inf).min(axis=1)
        most = np.where(valid, rtt, -np.inf).max(axis=1)
        bound[few] = (most - np.minimum(least, clean_rtt)) / 2
    return PairFit(
        alpha=alpha,
        slope=slope,
        sigma_alpha=sigma_alpha,
        sigma_slope=sigma_slope,
        n_bins=used,
        n_fwd=counts[0],
        n_rev=counts[1],
        noise_ns=noise,
        x_mid=x_mid,
        sigma_mid=sigma_mid,
        bound_ns=bound,
        rtt_least=rtt_least,
        rtt_least_bin=rtt_least_bin,
        rtt_clean=rtt_clean,
        jump_ns=jump,
        jump_at=jump_at,
    )


def _fit_lines(
    bins: tuple[np.ndarray, ...],
    slope_guess: np.ndarray,
    noise_ns: float,
    few_sigma_ns: float = 0.0,
    fixed: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Weights and the weighted line with one rejection pass, for the pairs of ``bins``
    (:func:`_bin_points` of their points): alpha, slope, their sigmas, bins used, the
    weighted mean x of the bins, the sigma of the offset there, and the jump of pairs
    whose bins a step fits but no line (:func:`steps.jumps`). Pairs with fewer than
    3 valid bins have no clean round trip to measure their bins' excess against (it
    reads 0), so ``few_sigma_ns`` (the window's typical half excess,
    :func:`_few_bin_sigma`) is added to their bins' variance. Pairs ``fixed`` (a queue
    standing in front of one of their hosts: a clean bin or two among queued ones) keep
    ``slope_guess`` (the previous window's drifts) and fit the offset alone: a line
    would tilt through the few clean bins toward the many queued ones."""
    mid, xm, valid, nvalid, excess = bins
    xj = xm  # the jump search keeps the bins' own x
    if fixed is not None and fixed.any():
        xm = np.where(fixed[:, None], 0.0, xm)
    var = noise_ns**2 + excess**2
    if few_sigma_ns > 0:
        var += np.where(nvalid < 3, few_sigma_ns**2, 0.0)[:, None]
    w = np.where(valid, 1.0 / var, 0.0)
    alpha, slope, s0, sxxc, resid = _wls(w, xm, mid)
    # Reject bins that are further from the line than their excess allows.
    bound = excess / 2 + 6 * noise_ns
    bad = valid & (np.abs(resid) > bound)
    jump, jump_at = steps.jumps(mid, xj, w, valid, nvalid, excess, noise_ns, bad)
    if bad.any():
        w = np.where(bad, 0.0, w)
        alpha, slope, s0, sxxc, resid = _wls(w, xm, mid)
    used = np.count_nonzero(w > 0, axis=1)
    dof = used - 2
    chi2 = _row_sum(w * resid**2)
    scale = np.where(dof > 0, np.maximum(1.0, chi2 / np.maximum(dof, 1)), 1.0)
    slope_ok = sxxc > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        xbar = np.where(s0 > 0, _row_sum(w * xm) / s0, 0.0)
        var_a = np.where(s0 > 0, 1.0 / s0, np.inf) + np.where(slope_ok, xbar**2 / sxxc, 0.0)
        var_s = np.where(slope_ok, 1.0 / sxxc, np.inf)
        var_m = np.where(s0 > 0, 1.0 / s0, np.inf)
    return (
        alpha,
        slope_guess + np.where(slope_ok, slope, 0.0),
        np.sqrt(var_a * scale),
        np.sqrt(var_s * scale),
        used,
        xbar,
        np.sqrt(var_m * scale),
        jump,
        jump_at,
    )


# Pairs per block of the per-pair passes: their (pairs, bins) temporaries (~40 of them)
# stay in the L2 cache instead of streaming ~5 MB each at 10,000 hosts.
_BLOCK_PAIRS = 2048


def _pair_blocks(fn: Callable[[slice], T]) -> Callable[[slice], T]:
    """``fn`` (row-wise: each output row depends on its input row only; returns an array
    or a tuple of arrays over the rows) run on blocks of ``_BLOCK_PAIRS`` rows of a
    range and concatenated: the same result, cache-sized temporaries."""

    def run(sl: slice) -> T:
        start, stop = sl.start or 0, sl.stop
        if stop - start <= _BLOCK_PAIRS:
            return fn(sl)
        parts = [
            fn(slice(a, min(a + _BLOCK_PAIRS, stop))) for a in range(start, stop, _BLOCK_PAIRS)
        ]
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate(p) for p in zip(*parts, strict=True))  # type: ignore[return-value]
        return np.concatenate(parts)  # type: ignore[return-value, arg-type]

    return run


def _row_halves(
    pool: ThreadPoolExecutor | None,
    n: int,
    fn: Callable[[slice], T],
    min_rows: int | None = None,
) -> list[T]:
    """``fn`` over all rows; with a pool and at least ``min_rows`` rows (default
    ``_MIN_SPLIT_ROWS``), over two halves, the first in the pool's thread."""
    if pool is None or n < (_MIN_SPLIT_ROWS if min_rows is None else min_rows):
        return [fn(slice(0, n))]
    half = n // 2
    job = pool.submit(fn, slice(0, half))
    second = fn(slice(half, n))
    return [job.result(), second]


# Rows per block of :func:`in_blocks`: a block's temporaries (~10 arrays of 8-byte
# values) stay in the L2 cache from one numpy pass to the next instead of streaming
# from memory at every pass (3.2 M rows per window at 10,000 hosts).
BLOCK_ROWS = 16_384


def in_blocks(
    pool: ThreadPoolExecutor | None,
    n: int,
    fn: Callable[[slice], object],
    block: int | None = None,
    min_rows: int | None = None,
) -> None:
    """``fn`` (writing its results in place) over consecutive slices of at most ``block``
    (default ``BLOCK_ROWS``) of the rows ``0..n``; with a pool, the first half's slices
    run in its thread."""
    block = block or BLOCK_ROWS

    def run(sl: slice) -> None:
        for start in range(sl.start, sl.stop, block):
            fn(slice(start, min(start + block, sl.stop)))

    _row_halves(pool, n, run, min_rows)


def _few_bin_sigma(bins: tuple[np.ndarray, ...]) -> float:
    """RMS of half the excess round trip over the valid bins of pairs with at least 3
    bins (``bins``: :func:`_bin_points` of the window's points): how far a bin's midpoint
    typically sits from the truth when nothing says whether it queued. 0 when no pair
    has fewer than 3 bins (nothing to weigh)."""
    _, _, valid, nvalid, excess = bins
    few = (nvalid > 0) & (nvalid < 3)
    if not few.any():
        return 0.0
    rows = nvalid >= 3
    e = excess[rows][valid[rows]]
    return float(np.sqrt(np.mean(np.square(e / 2)))) if len(e) else 0.0


def _clean_rtt(points: np.ndarray) -> float:
    """The least clean round trip of the window: the minimum over pairs with at least 3
    bins of their reference round trip (second-smallest bin). A lower bound of any
    pair's clean round trip on the same fabric; inf when no pair has 3 bins."""
    zf, zr = points[0], points[1]
    valid = np.isfinite(zf) & np.isfinite(zr)
    rows = np.count_nonzero(valid, axis=1) >= 3
    if not rows.any():
        return float(np.inf)
    rtt = np.where(valid[rows], zf[rows] + zr[rows], np.inf)
    return float(np.min(_kth_smallest(rtt, np.ones(int(rows.sum()), np.intp))))


def _bin_points(
    points: np.ndarray,
    xsel: np.ndarray | None,
    clean_rtt_ns: float = np.inf,
    ref_cap: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (pair, bin) from the per-direction points (shape (2, pairs, bins)): midpoint,
    its x (zeros when ``xsel`` is None), validity, valid bins per pair, excess round trip
    (over the pair's reference: its second-least round trip, for pairs with fewer than 3
    bins the lower of their least and ``clean_rtt_ns``; at most ``ref_cap`` per pair,
    where finite)."""
    zf, zr = points[0], points[1]
    valid = np.isfinite(zf) & np.isfinite(zr)
    with np.errstate(invalid="ignore"):
        mid = np.where(valid, (zf - zr) / 2, 0.0)
        rtt = np.where(valid, zf + zr, np.inf)
    xm = np.zeros(zf.shape) if xsel is None else np.where(valid, (xsel[0] + xsel[1]) / 2, 0.0)
    nvalid = np.count_nonzero(valid, axis=1)
    k = np.where(nvalid >= 3, 1, 0)
    ref = _kth_smallest(rtt, k)
    if ref_cap is not None:
        ref = np.fmin(ref, ref_cap)
    if np.isfinite(clean_rtt_ns):
        ref = np.where(nvalid < 3, np.minimum(ref, clean_rtt_ns), ref)
    with np.errstate(invalid="ignore"):
        rtt -= ref[:, None]  # inf where not valid; nan in pairs without a valid bin
    excess = np.where(valid, np.abs(rtt, out=rtt), 0.0)
    return mid, xm, valid, nvalid, excess


def _row_sum(a: np.ndarray) -> np.ndarray:
    """``a.sum(axis=1)`` of a 2-D float64 or int64 array. For 8 contiguous columns (the
    default bins) in numpy's own pairwise order, ``((a0 + a1) + (a2 + a3)) + ((a4 + a5)
    + (a6 + a7))``, as three column-wise adds over all rows: ~3x faster than numpy's
    per-row reduction of 8 values, same bits (numpy 2.4; another order would move the
    last bit of a float sum)."""
    if (
        a.ndim == 2
        and a.shape[1] == 8
        and a.dtype in (np.float64, np.int64)
        and a.strides[1] == a.itemsize
    ):
        c = a[:, 0::2] + a[:, 1::2]
        d = c[:, 0::2] + c[:, 1::2]
        return d[:, 0] + d[:, 1]
    return a.sum(axis=1)


def _wls(
    w: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise weighted line fit; slope 0 where x does not vary (one bin)."""
    s0 = _row_sum(w)
    sx = _row_sum(w * x)
    sy = _row_sum(w * y)
    with np.errstate(divide="ignore", invalid="ignore"):
        xbar = np.where(s0 > 0, sx / s0, 0.0)
        ybar = np.where(s0 > 0, sy / s0, np.nan)
    dx = x - xbar[:, None]
    sxxc = _row_sum(w * dx * dx)
    sxy = _row_sum(w * dx * (y - np.nan_to_num(ybar)[:, None]))
    # A line needs bins spread in time: weighted spread of x of at least 1 ms.
    spread_ok = sxxc > s0 * 1e12
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(spread_ok, sxy / sxxc, 0.0)
    sxxc = np.where(spread_ok, sxxc, 0.0)
    alpha = ybar - slope * xbar
    resid = np.where(w > 0, y - alpha[:, None] - slope[:, None] * x, 0.0)
    return alpha, slope, s0, sxxc, np.nan_to_num(resid)
