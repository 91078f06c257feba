"""``solve_window``: one window of probe records in, per-host clocks and one-way delays out.

See docs/clock.md for the method, the gauge, the uncertainty model and the flags.

Gathers in analytics/clock use ``np.take(..., mode="wrap")``: for indices in [-n, n) (all
of ours; -1 reads the last element where that is relied on) the same values as numpy's
default mode, which buffers for its bounds check (2-2.5x slower with ``out=``).

Over 500 lines: one method (docs/clock.md); network, gauge, variances, delays are its steps.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from analytics.clock import network, steps
from analytics.clock.clock_state import ClockState
from analytics.clock.key_index import KeyIndex, dense_ids
from analytics.clock.pair_fit import PairFit, fit_pairs, in_blocks
from analytics.clock.probe_samples import ProbeSamples, extract, hosts_in, prepare
from analytics.clock.tables import CLOCK_ROW, PAIR_ROW, HostStatus, PairFlag
from collector.records import ECHO, PROBE_RX, PROBE_TX

DEFAULT_WINDOW_NS = 2_000_000_000


@dataclass(frozen=True)
class SolverConfig:
    """Knobs of the solver; the defaults suit kernel software timestamps."""

    spacing_tol_ns: int = 10_000  # coded pair: |RX spacing - TX spacing| allowed (software ts)
    spacing_tol_hw_ns: int = 200  # ... when all its timestamps are NIC / RDMA timestamps
    n_bins: int = 8  # sub-windows per window for the envelope fit
    envelope_band: float = 2.0  # average samples within this many noise units of a bin's min
    echo_reverse: str = "fallback"  # echo return legs as reverse samples: fallback|always|never
    noise_floor_ns: float = 1.0  # lower bound of the estimated midpoint noise
    disagree_sigmas: float = 5.0  # flag a pair beyond this many sigmas from the loops ...
    disagree_floor_ns: float | None = None  # ... and beyond this (default 10 x noise)
    gauge_host: int | None = None  # host id pinned to offset 0; None: mean zero / continuity
    state_max_age_ns: int = 60_000_000_000  # forget hosts unseen for this long
    threads: int = 1  # 2: the echo half of the join runs in a second thread (idle box only)

    def __post_init__(self) -> None:
        if self.echo_reverse not in ("fallback", "always", "never"):
            raise ValueError("echo_reverse: expected one of fallback, always, never")
        if self.n_bins < 1:
            raise ValueError("n_bins: expected an int >= 1")
        if self.spacing_tol_ns < 0 or self.spacing_tol_hw_ns < 0:
            raise ValueError("spacing_tol_ns, spacing_tol_hw_ns: expected ints >= 0")


@dataclass
class WindowSolution:
    """Everything one window produced. Arrays are structured (tables.py dtypes)."""

    window_start_ns: int
    window_ns: int
    ref_ns: int
    clock: np.ndarray  # CLOCK_ROW per host seen in the window
    pairs: np.ndarray  # PAIR_ROW per probed pair
    owd: dict[str, np.ndarray]  # columns of OWD_ROW (minus window_start_ns) per RX row
    drops: dict[str, int]
    state: ClockState  # pass as ``prior`` to the next window
    noise_ns: float
    stats: dict[str, float] = field(default_factory=dict)
    gauge_host: int | None = None
    # host id -> how far its clock stepped inside the window (ns): stated uncertain by
    # that much, its one-way delays not ok (steps.stepped_hosts)
    stepped: dict[int, float] = field(default_factory=dict)

    def offsets(self) -> dict[int, float]:
        """host id -> offset_ns (solved or predicted hosts only)."""
        ok = self.clock["status"] != HostStatus.UNSOLVED
        return dict(
            zip(self.clock["host"][ok].tolist(), self.clock["offset_ns"][ok].tolist(), strict=True)
        )


class _PhaseClock:
    def __init__(self, stats: dict[str, float]) -> None:
        self.stats = stats
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stats[name] = now - self.t
        self.t = now


def _check(name: str, arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype:
        got = getattr(arr, "dtype", type(arr).__name__)
        raise TypeError(f"{name}: expected a numpy array of collector.records dtype, got {got}")
    return arr


def solve_window(
    tx: np.ndarray,
    rx: np.ndarray,
    echoes: np.ndarray,
    *,
    window_start_ns: int,
    window_ns: int = DEFAULT_WINDOW_NS,
    prior: ClockState | None = None,
    config: SolverConfig | None = None,
) -> WindowSolution:
    """Solve the clocks of one window.

    ``tx``/``rx``/``echoes`` are PROBE_TX / PROBE_RX / ECHO rows (any order; fastest
    when each host's rows are contiguous, as the collectors ship them). Offsets
    refer to ``ref_ns = window_start_ns + window_ns // 2`` in mesh time; ``prior``
    is the previous window's ``state`` (slope guess, continuity of the gauge,
    hosts without data this window)."""
    cfg = config or SolverConfig()
    _check("tx", tx, PROBE_TX)
    _check("rx", rx, PROBE_RX)
    _check("echoes", echoes, ECHO)
    if window_ns <= 0:
        raise ValueError("window_ns: expected an int > 0")
    ref = int(window_start_ns) + int(window_ns) // 2

    pool = _worker() if cfg.threads > 1 else None
    return _solve(tx, rx, echoes, window_start_ns, window_ns, ref, prior, cfg, pool)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    """The second thread of ``threads=2``: one for the process, started on first use
    (a thread per window would fault in a fresh stack and arena every window).
    Jobs never wait on other jobs, so concurrent solves only queue."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clock-solver")
        return _POOL


def _solve(
    tx: np.ndarray,
    rx: np.ndarray,
    echoes: np.ndarray,
    window_start_ns: int,
    window_ns: int,
    ref: int,
    prior: ClockState | None,
    cfg: SolverConfig,
    pool: ThreadPoolExecutor | None,
) -> WindowSolution:
    stats: dict[str, float] = {}
    clock_t = _PhaseClock(stats)
    cols = extract(tx, rx, echoes, pool)
    hosts = hosts_in(cols.tx_src, cols.rx_dst, cols.e_src)
    n = len(hosts)
    index = KeyIndex(hosts)
    ps = prepare(cols, index, (cfg.spacing_tol_ns, cfg.spacing_tol_hw_ns), pool)
    del cols  # the columns not kept in ps
    clock_t.lap("t_prepare_s")

    # prior, per host index
    prior_i = np.full(n, -1, np.intp)
    if prior is not None and len(prior.hosts):
        prior_i = KeyIndex(prior.hosts).lookup(hosts)
    has_prior = prior_i >= 0
    p_off = np.full(n, np.nan)
    p_sig = np.full(n, np.inf)
    p_drift = np.zeros(n)
    p_dsig = np.full(n, np.inf)
    if prior is not None and has_prior.any():
        off, sig = prior.predict(ref)
        p_off[has_prior] = off[prior_i[has_prior]]
        p_sig[has_prior] = sig[prior_i[has_prior]]
        p_drift[has_prior] = prior.drift[prior_i[has_prior]]
        p_dsig[has_prior] = prior.drift_sigma[prior_i[has_prior]]

    # ---- samples for the pair fit --------------------------------------------------
    pr = ps.pure_rows
    n_probe = len(pr)
    u = np.concatenate((np.take(ps.rx_src_i, pr, mode="wrap"), ps.echo_src_i))
    v = np.concatenate((np.take(ps.rx_dst_i, pr, mode="wrap"), ps.echo_dst_i))
    rev = u > v
    key = np.minimum(u, v).astype(np.int64)
    key *= n
    key += np.maximum(u, v)
    pid, pair_keys = dense_ids(key, size_hint=16 * max(n, 1))
    n_pairs = len(pair_keys)
    # Echo return legs as reverse samples: decide which to keep before gathering
    # their times (the probe samples come first, the echo samples after them).
    keep_echo: np.ndarray | slice = slice(None)
    if cfg.echo_reverse != "always" and len(u):
        if cfg.echo_reverse == "never":
            keep_echo = np.empty(0, np.intp)
        else:
            pd = pid * 2
            pd += rev
            has_probe = np.zeros(2 * n_pairs, bool)
            has_probe[pd[:n_probe]] = True
            keep_echo = np.flatnonzero(~np.take(has_probe, pd[n_probe:], mode="wrap"))
        ps.drops["echo_samples_unused"] = len(ps.echo_rows) - len(keep_echo)
        if len(keep_echo) < len(ps.echo_rows):
            sel = np.concatenate((np.arange(n_probe), keep_echo + n_probe))
            pid, rev = np.take(pid, sel, mode="wrap"), np.take(rev, sel, mode="wrap")
    t_send = np.concatenate((np.take(ps.tx_ns, pr, mode="wrap"), ps.echo_t3[keep_echo]))
    t_recv = np.concatenate((np.take(ps.rx_ns, pr, mode="wrap"), ps.echo_t4[keep_echo]))
    t_recv -= t_send  # y, in int64
    # x = the sender's clock: t_send forward, t_recv reverse (arithmetic, no branch per row)
    x = rev.astype(np.int64)
    x *= t_recv
    x += t_send
    x -= ref
    x = x.astype(np.float64)
    y = t_recv.astype(np.float64)
    pa = pair_keys // max(n, 1)
    pb = pair_keys % max(n, 1)
    clock_t.lap("t_samples_s")

    # ---- per-pair fit (two passes: the second detrends with the first's slope) ------
    known = has_prior[pa] & has_prior[pb]
    s_guess = np.where(known, p_drift[pb] - p_drift[pa], 0.0)
    prior_pairs = bool(known.any())
    # Pass 1 only needs a slope good enough to pick envelope points inside a bin.
    # Pairs whose drift the prior knows skip it; the rest use a decimated sample
    # (<= 400k rows) and 4 bins.
    s1 = s_guess
    todo = np.flatnonzero(~known)  # pairs without a prior slope
    if len(todo):
        # fit only those pairs, renumbered 0..len(todo)-1
        sub = np.full(n_pairs, -1, np.intp)
        sub[todo] = np.arange(len(todo))
        rows = (
            np.flatnonzero(np.take(sub, pid, mode="wrap") >= 0)
            if prior_pairs
            else np.arange(len(pid))
        )
        if len(rows) > 400_000:
            rows = rows[:: len(rows) // 400_000]
        coarse = fit_pairs(
            np.take(sub, pid[rows], mode="wrap"), rev[rows], x[rows], y[rows], len(todo),
            slope_guess=s_guess[todo], noise_ns=None if prior_pairs else 1000.0,
            noise_floor_ns=cfg.noise_floor_ns, window_ns=float(window_ns),
            n_bins=min(cfg.n_bins, 4), pool=pool,
        )  # fmt: skip
        s1 = s_guess.copy()
        s1[todo] = np.where(np.isfinite(coarse.sigma_slope), coarse.slope, s_guess[todo])
    clock_t.lap("t_coarse_s")
    # the pairs' clean round trips of earlier windows: the step finder's reference, and
    # against which a queue standing in front of a host through most of this window is
    # still excess
    hist = steps.prior_rtt(prior, prior_i, pa, pb)
    was = np.zeros(n, bool)
    if prior is not None and len(prior.queued_hosts):
        was = KeyIndex(prior.queued_hosts).lookup(hosts) >= 0
    standing = steps.StandingQueue(hist, pa, pb, n, was)
    fit = fit_pairs(
        pid, rev, x, y, n_pairs, slope_guess=s1, ref_cap=standing.cap,
        noise_ns=None, noise_floor_ns=cfg.noise_floor_ns, band=cfg.envelope_band,
        window_ns=float(window_ns), n_bins=cfg.n_bins, pool=pool,
    )  # fmt: skip
    noise = fit.noise_ns
    drift_solve: list = []  # the re-anchoring's drift solve, for _network to reuse
    # the network solves' graphs: the previous window's are most often this one's
    graphs: dict = prior.cache if prior is not None else {}
    stats["pairs_reanchored"] = _anchor_without_slope(
        fit, pa, pb, n, p_drift, p_dsig, drift_solve, graphs
    )
    clock_t.lap("t_pair_fit_s")
    stats["pairs"] = n_pairs
    # a host under a queue that stood through every bin of every pair of it: its pairs
    # read its clock half the queue off, alike, and no loop sees that. Left out of the
    # network and carried on its previous solution (PREDICTED) while that is recent;
    # after, solved with the rest and uncertain by half the queue
    queued = standing.buried(fit.rtt_least, np.isfinite(fit.alpha))
    fresh = np.zeros(n, bool)
    if prior is not None and has_prior.any():
        fresh[has_prior] = ref - prior.last_seen_ns[prior_i[has_prior]] <= cfg.state_max_age_ns
    buried = (queued > 0) & fresh
    stats["hosts_queued"] = int((queued > 0).sum())

    # ---- network effect ------------------------------------------------------------
    theta, drift, flags, _residual, comp, _o_wsum, d_wsum, scales, o_rvar, o_mvar = _network(
        fit, pa, pb, n, cfg, noise, p_off, drift_solve, graphs,
        ignore=np.take(buried, pa) | np.take(buried, pb) if buried.any() else None,
    )  # fmt: skip
    stats["chi2_scale_offset"], stats["chi2_scale_drift"] = scales
    clock_t.lap("t_network_s")

    # ---- gauge -----------------------------------------------------------------------
    solved = np.isfinite(theta)
    # Host sigma: the larger of the model's (pair fit sigmas, chi2-scaled) and the one
    # its own pairs' loop residuals give, plus the gauge's (mesh time is itself an
    # estimate: the mean of the component's clocks, or the prior's continuation).
    o_var = np.maximum(scales[0] * o_mvar, o_rvar)
    theta, drift, g_var = _apply_gauge(
        theta, drift, comp, hosts, has_prior, p_off, p_drift, cfg, o_var
    )
    o_sig = np.sqrt(o_var + g_var)
    d_sig = np.sqrt(scales[1] / np.where(d_wsum > 0, d_wsum, np.nan))
    no_drift = solved & ~np.isfinite(drift)
    drift = np.where(no_drift, p_drift, drift)
    d_sig = np.where(no_drift, p_dsig, d_sig)
    status = np.full(n, HostStatus.UNSOLVED, np.uint8)
    status[solved] = HostStatus.SOLVED
    pred = ~solved & has_prior
    status[pred] = HostStatus.PREDICTED
    theta = np.where(pred, p_off, theta)
    o_sig = np.where(pred, p_sig, o_sig)
    drift = np.where(pred, p_drift, drift)
    d_sig = np.where(pred, p_dsig, d_sig)
    # a clock that stepped inside the window (solved, or carried from the previous one
    # when its pairs disagreed): uncertain by the step, its delays not kept
    step = steps.stepped_hosts(
        fit.jump_ns, fit.jump_at, fit.rtt_least, fit.rtt_least_bin, fit.rtt_clean,
        pa, pb, n, hist, noise,
    )  # fmt: skip
    stepped = (status != HostStatus.UNSOLVED) & (step > 0)
    o_sig = np.where(stepped, np.maximum(o_sig, step), o_sig)
    stats["hosts_stepped"] = int(stepped.sum())
    o_sig = np.where(status == HostStatus.SOLVED, np.maximum(o_sig, queued), o_sig)

    # ---- output tables ---------------------------------------------------------------
    has_est = np.isfinite(fit.alpha)
    n_pairs_host = np.bincount(pa[has_est], minlength=n) + np.bincount(pb[has_est], minlength=n)
    dis = (flags & PairFlag.DISAGREE) > 0
    n_flag_host = np.bincount(pa[dis], minlength=n) + np.bincount(pb[dis], minlength=n)
    clock = np.zeros(n, CLOCK_ROW)
    clock["window_start_ns"] = window_start_ns
    clock["ref_ns"] = ref
    clock["host"] = hosts
    clock["offset_ns"] = theta
    clock["drift_ppm"] = drift * 1e6
    clock["offset_sigma_ns"] = o_sig
    clock["drift_sigma_ppm"] = d_sig * 1e6
    clock["component"] = comp
    clock["n_pairs"] = n_pairs_host
    clock["n_flagged"] = n_flag_host
    clock["status"] = status

    pairs = np.zeros(int(has_est.sum()), PAIR_ROW)
    e = np.flatnonzero(has_est)
    pairs["window_start_ns"] = window_start_ns
    pairs["host_a"] = hosts[pa[e]]
    pairs["host_b"] = hosts[pb[e]]
    pairs["offset_ns"] = fit.alpha[e] + fit.slope[e] * np.nan_to_num(theta[pa[e]])
    pairs["drift_ppm"] = fit.slope[e] * 1e6
    pairs["offset_sigma_ns"] = fit.sigma_alpha[e]
    pairs["residual_ns"] = theta[pb[e]] - theta[pa[e]] - pairs["offset_ns"]
    pairs["n_fwd"] = fit.n_fwd[e]
    pairs["n_rev"] = fit.n_rev[e]
    pairs["n_bins"] = fit.n_bins[e]
    pairs["flags"] = flags[e]

    owd = _owd(rx, ps, theta, drift, ref, pool)
    if stepped.any():
        # (an unknown host, -1, reads the last host's flag: such rows are not ok anyway)
        gone = np.take(stepped, ps.rx_src_i, mode="wrap") | np.take(
            stepped, ps.rx_dst_i, mode="wrap"
        )
        owd["ok"] &= ~gone
        owd["owd_ns"][gone] = np.nan
    clock_t.lap("t_owd_s")
    # a host seen but not solved keeps the age of its last solution (so it expires)
    seen = np.full(n, ref, np.int64)
    if prior is not None and pred.any():
        seen[pred] = prior.last_seen_ns[prior_i[pred]]
    kept = (status != HostStatus.UNSOLVED) & (ref - seen <= cfg.state_max_age_ns)
    state = _next_state(prior, hosts, theta, drift, o_sig, d_sig, kept, seen, ref, cfg)
    state.cache = graphs
    steps.track_rtt(state, kept, pa, pb, hist, fit.rtt_clean)
    state.queued_hosts = hosts[standing.hosts & kept]
    stats["hosts"] = n
    stats["hosts_solved"] = int(solved.sum())
    stats["components"] = int(comp.max()) + 1 if (comp >= 0).any() else 0
    stats["pairs_flagged"] = int(dis.sum())
    return WindowSolution(
        window_start_ns=int(window_start_ns),
        window_ns=int(window_ns),
        ref_ns=ref,
        clock=clock,
        pairs=pairs,
        owd=owd,
        drops=ps.drops,
        state=state,
        noise_ns=noise,
        stats=stats,
        gauge_host=cfg.gauge_host,
        stepped=dict(zip(hosts[stepped].tolist(), step[stepped].tolist(), strict=True)),
    )


def _anchor_without_slope(
    fit: PairFit,
    pa: np.ndarray,
    pb: np.ndarray,
    n: int,
    p_drift: np.ndarray,
    p_dsig: np.ndarray,
    drift_solve: list | None = None,
    graphs: dict | None = None,
) -> int:
    """Re-anchor the pairs whose own drift is not determined (bins with both directions
    in one sub-window only), in place; returns how many. The drift solve it makes is
    appended to ``drift_solve`` as ``(weights, slopes of the weighted pairs, solution)``.

    Such a pair measures the offset at ``x_mid`` only (its bin, up to a second from the
    reference); the fit carried it to the reference with the slope guess (the coarse
    pass or 0), and a wrong guess moved it by drift x ``x_mid`` (tens of us at 50 ppm)
    while its sigma still said a few ns. Instead: carry it with the drift difference of
    the two hosts solved over the pairs that do determine a drift (same component), else
    with the prior's drifts, and add that difference's uncertainty times ``x_mid``. With
    neither, the pair's sigma is infinite: it cannot place the offset at the reference."""
    if fit.x_mid is None or fit.sigma_mid is None:
        return 0
    est = np.isfinite(fit.alpha)
    nod = est & ~np.isfinite(fit.sigma_slope)
    if not nod.any():
        return 0
    dok = est & np.isfinite(fit.sigma_slope)
    wd = np.where(dok, 1.0 / np.maximum(np.where(dok, fit.sigma_slope, 1.0), 1e-12) ** 2, 0.0)
    gd = network.solve(pa, pb, fit.slope, wd, n, x0=p_drift, cache=graphs)
    if drift_solve is not None:
        drift_solve.append((wd, fit.slope[wd > 0], gd))  # before the slopes change below
    wsum = np.bincount(pa[dok], wd[dok], minlength=n) + np.bincount(pb[dok], wd[dok], minlength=n)
    with np.errstate(divide="ignore"):
        dsig = np.sqrt(max(gd.chi2_scale, 1.0) / wsum)
    e = np.flatnonzero(nod)
    a, b = pa[e], pb[e]
    same = (gd.component[a] >= 0) & (gd.component[a] == gd.component[b])
    same &= np.isfinite(gd.value[a]) & np.isfinite(gd.value[b])
    ds = np.where(same, gd.value[b] - gd.value[a], np.nan)
    var = np.where(same, dsig[a] ** 2 + dsig[b] ** 2, np.inf)
    prior = ~same & np.isfinite(p_dsig[a]) & np.isfinite(p_dsig[b])
    ds = np.where(prior, p_drift[b] - p_drift[a], ds)
    var = np.where(prior, p_dsig[a] ** 2 + p_dsig[b] ** 2, var)
    xm = fit.x_mid[e]
    at_mid = fit.alpha[e] + fit.slope[e] * xm
    known = np.isfinite(var)
    fit.alpha[e] = np.where(known, at_mid - np.nan_to_num(ds) * xm, fit.alpha[e])
    fit.slope[e] = np.where(known, ds, fit.slope[e])
    fit.sigma_alpha[e] = np.where(known, np.sqrt(fit.sigma_mid[e] ** 2 + var * xm**2), np.inf)
    return len(e)


def _network(
    fit: PairFit,
    pa: np.ndarray,
    pb: np.ndarray,
    n: int,
    cfg: SolverConfig,
    noise: float,
    p_off: np.ndarray,
    drift_solve: list | None = None,
    graphs: dict | None = None,
    ignore: np.ndarray | None = None,
) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
    tuple[float, float], np.ndarray, np.ndarray,
]:  # fmt: skip
    """Offsets and drifts over the probe graph; flags for disagreeing pairs; per host
    the offset variance from the loop residuals and the model variance (pair sigmas).
    The drift solve is ``drift_solve``'s (the re-anchoring's) when its weights and
    slopes are the ones here (no pair disagrees): the same solve, made once. Pairs
    in ``ignore`` count as pairs without an estimate."""
    flags = np.zeros(len(pa), np.uint8)
    one_way = ((fit.n_fwd == 0) | (fit.n_rev == 0)) & ((fit.n_fwd + fit.n_rev) > 0)
    flags[one_way] |= np.uint8(PairFlag.ONE_WAY)
    est = np.isfinite(fit.alpha) & np.isfinite(fit.sigma_alpha)
    if ignore is not None:
        est &= ~ignore
    flags[np.isfinite(fit.alpha) & ~np.isfinite(fit.sigma_slope)] |= np.uint8(PairFlag.NO_DRIFT)
    sig = np.maximum(np.where(est, fit.sigma_alpha, np.inf), 0.1 * max(noise, 1e-3))
    w = np.where(est, 1.0 / sig**2, 0.0)
    # The pair's intercept is at a's clock reading ref, i.e. mesh time ref - theta_a:
    # first solve, then move each pair's estimate to mesh time ref, solve again.
    # warm start from the prior's offsets (10,000 hosts: 34-36 CG iterations -> 21-22)
    g = network.solve(pa, pb, fit.alpha, w, n, x0=p_off, cache=graphs)
    theta_a = np.where(np.isfinite(g.value[pa]), g.value[pa], np.nan_to_num(p_off[pa]))
    m = fit.alpha + fit.slope * theta_a
    g = network.solve(pa, pb, m, w, n, x0=g.value, cache=graphs)
    floor = cfg.disagree_floor_ns if cfg.disagree_floor_ns is not None else 10.0 * noise
    # Exclude disagreeing pairs one "layer" at a time: in each round, a pair over
    # the threshold is excluded only if it is the worst pair at both its hosts
    # (one broken pair also bends its neighbours' residuals; they must not be
    # blamed with it). Independent broken pairs go in the same round.
    thr = np.maximum(cfg.disagree_sigmas * sig, floor)
    excluded = np.zeros(len(pa), bool)
    for _ in range(8):
        z = np.where(est & ~excluded, np.abs(g.residual) / thr, 0.0)
        over = z > 1.0
        if not over.any():
            break
        worst = np.zeros(n)
        np.maximum.at(worst, pa[over], z[over])
        np.maximum.at(worst, pb[over], z[over])
        excluded |= over & (z >= np.maximum(worst[pa], worst[pb]))
        g = network.solve(pa, pb, m, np.where(excluded, w * 1e-6, w), n, x0=g.value, cache=graphs)
    flags[excluded] |= np.uint8(PairFlag.EXCLUDED)
    bad = est & (np.abs(g.residual) > thr)
    flags[bad] |= np.uint8(PairFlag.DISAGREE)
    o_wsum = np.bincount(pa[~bad], w[~bad], minlength=n) + np.bincount(
        pb[~bad], w[~bad], minlength=n
    )
    o_var = _residual_variance(pa, pb, w, g.residual, est & ~bad, o_wsum, n)
    # the weights of the final solve (excluded pairs at 1e-6): a host tied to the rest
    # only through excluded pairs is not known better than they are
    w_solve = np.where(est, np.where(excluded, w * 1e-6, w), 0.0)
    bound = fit.bound_ns if fit.bound_ns is not None else np.zeros(len(pa))
    o_model = _model_variance(pa, pb, w_solve, o_wsum, g.component, n, g.residual, o_var, bound)
    dok = est & np.isfinite(fit.sigma_slope) & ~bad
    dsig = np.where(dok, fit.sigma_slope, np.inf)
    dsig = np.maximum(dsig, 1e-12)
    wd = np.where(dok, 1.0 / dsig**2, 0.0)
    if (
        drift_solve
        and np.array_equal(drift_solve[0][0], wd)
        and np.array_equal(drift_solve[0][1], fit.slope[wd > 0])
    ):
        gd = drift_solve[0][2]
    else:
        gd = network.solve(pa, pb, fit.slope, wd, n, cache=graphs)
    d_wsum = np.bincount(pa[dok], wd[dok], minlength=n) + np.bincount(pb[dok], wd[dok], minlength=n)
    return (
        g.value, gd.value, flags, g.residual, g.component, o_wsum, d_wsum,
        (g.chi2_scale, gd.chi2_scale), o_var, o_model,
    )  # fmt: skip


_EXACT_MAX_HOSTS = 256  # components up to this size: exact Laplacian pseudo-inverse diagonal


def _model_variance(
    pa: np.ndarray,
    pb: np.ndarray,
    w: np.ndarray,
    wsum: np.ndarray,
    comp: np.ndarray,
    n: int,
    residual: np.ndarray,
    res_var: np.ndarray,
    bound: np.ndarray,
) -> np.ndarray:
    """Per host, the offset variance the pair sigmas imply (before the chi2 scale):
    the diagonal of the weighted Laplacian's pseudo-inverse (offsets relative to the
    component's mean). Exact for components of up to ``_EXACT_MAX_HOSTS`` hosts, where
    a few weak pairs can be all that ties two racks together (a bottleneck the Jacobi
    approximation ``1 / sum w`` does not see); ``1 / sum w`` for larger components
    (the buddy graph is an expander there, and a dense inverse would cost O(n^3)).

    For those small components ``res_var`` (the per-host residual estimate) is
    replaced in place by the full sandwich ``L+ (sum_e w_e^2 r_e^2 b_e b_e^T) L+``
    with exact leverages: pairs across a bottleneck that are all biased alike (one
    rack's paths asymmetric) move every host behind it, not only their own two.
    Pairs with a ``bound`` (fewer than 3 bins: nothing says whether their probes
    queued) add ``w_e^2 bound_e^2`` to that sandwich: a bridge has no loop to check it."""
    with np.errstate(divide="ignore"):
        var = np.where(wsum > 0, 1.0 / np.where(wsum > 0, wsum, 1.0), np.inf)
    if not (comp >= 0).any():
        return var
    sizes = np.bincount(comp[comp >= 0])
    ok = (w > 0) & (pa != pb)
    for c in np.flatnonzero((sizes >= 2) & (sizes <= _EXACT_MAX_HOSTS)):
        members = np.flatnonzero(comp == c)
        local = np.full(n, -1, np.intp)
        local[members] = np.arange(len(members))
        e = ok & (local[pa] >= 0) & (local[pb] >= 0)
        la, lb, we = local[pa[e]], local[pb[e]], w[e]
        m = len(members)
        lap = np.zeros((m, m))
        np.add.at(lap, (la, lb), -we)
        np.add.at(lap, (lb, la), -we)
        np.add.at(lap, (la, la), we)
        np.add.at(lap, (lb, lb), we)
        # pinv of L = inv(L + J/m) - J/m (J all ones; the component is connected)
        j = np.full((m, m), 1.0 / m)
        try:
            inv = np.linalg.inv(lap + j) - j
        except np.linalg.LinAlgError:  # pragma: no cover - connected: L + J/m is regular
            continue
        var[members] = np.maximum(np.diag(inv), 0.0)
        r = residual[e]
        fin = np.isfinite(r)
        infl = inv[:, lb[fin]] - inv[:, la[fin]]  # d theta / d m_e, per unit weight
        lev = we[fin] * (infl[lb[fin], np.arange(fin.sum())] - infl[la[fin], np.arange(fin.sum())])
        lev = np.clip(lev, 0.0, 0.9)
        t = np.square(we[fin] * r[fin] / (1.0 - lev)) + np.square(we[fin] * bound[e][fin])
        res_var[members] = np.square(infl) @ t
    return var


def _residual_variance(
    pa: np.ndarray,
    pb: np.ndarray,
    w: np.ndarray,
    residual: np.ndarray,
    use: np.ndarray,
    wsum: np.ndarray,
    n: int,
) -> np.ndarray:
    """Per host, the variance of its offset from the loop residuals of its own pairs
    (the sandwich / HC3 estimate): ``sum_e w_e^2 (r_e / (1 - h_e))^2 / (sum_e w_e)^2``,
    with the leverage ``h_e ~ w_e (1/W_a + 1/W_b)`` (Jacobi). Unlike the model sigma
    (the pairs' own fit sigmas), it sees what the pair fits cannot: coded pairs that
    queued alike, path asymmetry, a biased envelope, whenever the loops disagree."""
    ok = use & np.isfinite(residual) & (w > 0)
    a, b, we, r = pa[ok], pb[ok], w[ok], residual[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        h = we * (1.0 / wsum[a] + 1.0 / wsum[b])
    h = np.clip(np.nan_to_num(h, nan=0.9), 0.0, 0.9)
    t = np.square(we * r / (1.0 - h))
    num = np.bincount(a, t, minlength=n) + np.bincount(b, t, minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(wsum > 0, num / np.square(wsum), 0.0)


def _apply_gauge(
    theta: np.ndarray,
    drift: np.ndarray,
    comp: np.ndarray,
    hosts: np.ndarray,
    has_prior: np.ndarray,
    p_off: np.ndarray,
    p_drift: np.ndarray,
    cfg: SolverConfig,
    o_var: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Solutions come out mean-zero per component; shift components to the gauge.

    - ``gauge_host``: its component is shifted so that host reads 0 (offset, drift).
    - otherwise, components that share solved hosts with the prior are shifted so
      those hosts' mean change from their predicted offset/drift is zero (mesh time
      continues across windows; hosts joining or leaving do not make it jump);
    - other components stay mean-zero.

    Also returns, per host, the variance the gauge adds to its offset: the variance
    of the mean of the ``o_var`` over the hosts that fix the gauge (the pinned host's
    own variance with ``gauge_host``); 0 outside components."""
    theta = theta.copy()
    drift = drift.copy()
    g_var = np.zeros(len(theta))
    if not (comp >= 0).any():
        return theta, drift, g_var
    ov = np.nan_to_num(o_var, nan=0.0, posinf=0.0)
    for c in range(int(comp.max()) + 1):
        members = comp == c
        if cfg.gauge_host is not None:
            pin = members & (hosts == cfg.gauge_host)
            if pin.any():
                if np.isfinite(drift[pin][0]):
                    drift[members] -= drift[pin][0]
                _shift(theta, drift, members, float(theta[pin][0]), pin)
                g_var[members & ~pin] = ov[pin][0]
                continue
        both = members & has_prior
        if both.any():
            dboth = both & np.isfinite(drift)
            if dboth.any():
                drift[members] -= np.mean(drift[dboth] - p_drift[dboth])
            _shift(theta, drift, members, np.mean(theta[both] - p_off[both]), both)
            g_var[members] = ov[both].sum() / both.sum() ** 2
        else:
            g_var[members] = ov[members].sum() / members.sum() ** 2
    return theta, drift, g_var


def _shift(
    theta: np.ndarray, drift: np.ndarray, members: np.ndarray, c: float, ref: np.ndarray
) -> None:
    """Move the mesh time of one component by ``c`` at the reference instant.

    Reading the clocks ``c`` later changes each offset by its drift too:
    ``theta' = theta - c * (1 + drift)``; ``c`` is scaled so the mean over
    ``ref`` hosts of the change is exactly the requested one."""
    d = np.nan_to_num(drift[members])
    c = c / (1.0 + float(np.mean(np.nan_to_num(drift[ref]))))
    theta[members] -= c * (1.0 + d)


def _owd(
    rx: np.ndarray,
    ps: ProbeSamples,
    theta: np.ndarray,
    drift: np.ndarray,
    ref: int,
    pool: ThreadPoolExecutor | None = None,
) -> dict[str, np.ndarray]:
    """Corrected one-way delay of every RX row, as columns (OWD_ROW names, no window).

    Computed in blocks of rows (cache-sized temporaries); with a ``pool``, the first
    half of the rows in its thread."""
    n = len(ps.matched)
    tx_ns = np.empty(n, np.int64)
    owd = np.empty(n)
    ok = np.empty(n, bool)
    mesh = np.empty(n, np.int64)
    drift0 = np.nan_to_num(drift)

    def rows(sl: slice) -> None:
        # an unknown host (-1) reads the last host's clock: such rows are not matched,
        # and every unmatched row is masked below
        s, d = ps.rx_src_i[sl], ps.rx_dst_i[sl]
        m = ps.matched[sl]
        t = tx_ns[sl]
        np.multiply(ps.tx_ns[sl], m, out=t)  # 0 where unmatched
        th_s, th_d = np.take(theta, s, mode="wrap"), np.take(theta, d, mode="wrap")
        dr_s, dr_d = np.take(drift0, s, mode="wrap"), np.take(drift0, d, mode="wrap")
        # send time in mesh time relative to ref: invert clock_s(t) = t + th_s + dr_s * t
        t_rel = (t - ref).astype(np.float64)
        t_rel -= th_s
        t_rel /= dr_s + 1.0
        o = owd[sl]
        np.subtract(ps.rx_ns[sl], t, out=o, casting="unsafe")
        dr_d -= dr_s
        dr_d *= t_rel
        th_d -= th_s
        th_d += dr_d
        o -= th_d
        k = ok[sl]
        np.isfinite(o, out=k)
        k &= m
        bad = None if k.all() else ~k
        if bad is not None:
            o[bad] = np.nan
            t_rel[bad] = 0.0
        ms = mesh[sl]
        np.rint(t_rel, out=t_rel)
        ms[:] = t_rel
        ms += ref
        if bad is not None:
            ms[bad] = 0

    in_blocks(pool, n, rows)
    pure = np.zeros(n, bool)
    pure[ps.pure_rows] = True
    return {
        # views into rx (no copy); np.ascontiguousarray them for Arrow if needed
        "src": rx["src"],
        "dst": rx["dst"],
        "seq": rx["seq"],
        "sport": rx["sport"],
        "pure": pure,
        "ok": ok,
        "tx_ns": tx_ns,
        "tx_mesh_ns": mesh,
        "owd_ns": owd,
    }


def _next_state(
    prior: ClockState | None,
    hosts: np.ndarray,
    theta: np.ndarray,
    drift: np.ndarray,
    o_sig: np.ndarray,
    d_sig: np.ndarray,
    keep: np.ndarray,
    seen: np.ndarray,
    ref: int,
    cfg: SolverConfig,
) -> ClockState:
    """The state handed to the next window: the hosts ``keep`` (solved or predicted, seen
    recently) first, in this window's order, then the prior's hosts not seen, carried."""
    ids = [hosts[keep]]
    off = [theta[keep]]
    dr = [np.nan_to_num(drift[keep])]
    osg = [o_sig[keep]]
    dsg = [np.where(np.isfinite(d_sig[keep]), d_sig[keep], np.inf)]
    last = [seen[keep]]
    if prior is not None and len(prior.hosts):
        if keep.any():
            absent = KeyIndex(hosts[keep]).lookup(prior.hosts) < 0
        else:
            absent = np.ones(len(prior.hosts), bool)
        fresh = ref - prior.last_seen_ns <= cfg.state_max_age_ns
        carry = absent & fresh
        p_off, p_sig = prior.predict(ref)
        ids.append(prior.hosts[carry])
        off.append(p_off[carry])
        dr.append(prior.drift[carry])
        osg.append(p_sig[carry])
        dsg.append(prior.drift_sigma[carry])
        last.append(prior.last_seen_ns[carry])
    return ClockState(
        ref_ns=ref,
        hosts=np.concatenate(ids),
        offset_ns=np.concatenate(off),
        drift=np.concatenate(dr),
        offset_sigma_ns=np.concatenate(osg),
        drift_sigma=np.concatenate(dsg),
        last_seen_ns=np.concatenate(last),
    )
