"""Contention: the link and direction whose queue holds probes back, at microsecond scale.

**Input, streamed.** Every committed ``probe_tx`` and ``probe_rx`` row reaches the
detector as it arrives (:meth:`PathDelays.feed_probes`), not after the clock solver's
window: a probe's send and receive (same sender, same sequence number) make one one-way
delay, corrected with the clock solver's latest solution (each host's offset and drift,
carried forward to the send time) as the stored ``owd`` rows are. A probe sent and not
received once its receiver has shipped later receives is *lost*. Until both hosts are
solved a probe is not counted. Each (src, dst, source port) maps to the spine it crosses
from the path traces (:mod:`analytics.detect.paths`); the probes of a host pair through
one spine cross the same links and are one *route*.

**Each route against its own healthy noise.** Per route, the judged statistics are the
lower quartile and the p90 (``QUANTILES``) of the corrected delay over its newest
``WINDOW_NS`` (0.5 s) of probes. Its healthy baseline is the last ``BASE_KEEP`` such
values from windows judged healthy (one per window length): their median and robust σ
(1.4826 × MAD).
A route is *slow* when both exceed the baseline median by more than ``K_SIGMA`` robust σ,
and never by less than ``FLOOR_NS`` (20 µs): what this route's own jitter cannot explain. A route that
lost ``LOSSY_SHARE`` of its probes over ``LOSS_SPAN_NS`` while the tail of those received
in that span waited is a full queue that drops (:attr:`RouteWindow.dropping`), slow
whatever its lower quartile: a shallow queue that empties between bursts lets some probes
through unqueued — except a route into or out of a host whose port was said within that
span, judged on its newest window alone: its losses were the port's
(:meth:`PathDelays._port_held`).

**Where: tomography by magnitude.** A route from host S in rack X to host D in rack Z
through spine Y crosses S's access link (host→leaf), leafX–spineY upwards, leafZ–spineY
downwards and D's access link (leaf→host); its excess is the sum of the queues it waits
in. A receiver's own port (incast: many senders into one host, or a NIC that cannot keep
up) is such a hop, so its queue is not blamed on the fabric links in front of it. A host's
port is judged on the host's round trips (:func:`_round_trip`: a queue every probe to one
host waits in looks like that host's clock to any clock sync) and given the direction its
probes are lost in, or none.
Non-negative least squares over every judged route (slow and healthy) estimates each
(link, direction)'s queue (:func:`queues`); a fast route pins both of its hops near zero,
so a rack behind two congested uplinks is not blamed for them. A (link, direction) is
contended when its estimated queue exceeds the thresholds of the routes crossing it,
``MIN_SLOW_PATHS`` slow routes cross it and ``NAME_SHARE`` of the routes crossing it (every
one, below five) waited beyond their thresholds and what the hops already named explain;
it is said once that held ``PERSIST_NS`` and ``MIN_INSTANTS`` distinct send instants (a
collector's tick samples all of its routes at once: one sample, not one per route).
A host whose routes in arrive earlier than
healthy beyond their noise has a clock the solver holds wrong (a queue only delays): its
routes out are late by as much, which no fabric link they cross is blamed for
(:func:`_clock_leads`). Columns that are equal over the judged routes
(two racks: leafX up and leafZ down) cannot be told apart and are named together, each
with confidence 1/n. The answer depends only on the data: links are ordered by name.

The evidence cites the RoCE congestion counters' rates (ECN-marked packets, CNPs sent and
handled, transmit wait; :data:`CONGESTION_COUNTERS`) on the hosts behind the named link.

The per-window medians of the clock solver's ``owd`` rows (:meth:`PathDelays.feed`) are
still kept per path for :meth:`pair_excess` (the in-band RoCE v1 signal).

**At fleet scale.** A pass holds every route's window, verdicts and baseline as numpy
columns (:class:`Windows`, :class:`_Baselines`; paths numbered as first fed, not sorted per
pass): a healthy pass makes no Python object per route, and the naming makes a
:class:`RouteWindow` only for the routes a slow route's hops or hosts touch.

Over 500 lines: one signal; the streamed delays, per-route windows and the verdict share
one state.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from analytics.clock.clock_state import ClockState
from analytics.detect.anomalies import Observation

WINDOW_NS = 500_000_000  # a route's newest half second of probes is judged
STALE_NS = 4_000_000_000  # a route whose newest probe is this much older is not judged
LOSS_SPAN_NS = 4_000_000_000  # losses (known up to KNOWN_WITHIN_NS late) counted over this long
HOLD_NS = LOSS_SPAN_NS  # probes kept
QUANTILES = (25.0, 90.0)  # a window's lower quartile (standing queue) and tail
K_SIGMA = 6.0  # robust σ of the healthy baseline
FLOOR_NS = 20_000.0  # never a smaller excess: below the lab's and a fabric's jitter
BASE_KEEP = 120  # healthy windows kept per route (one minute)
REFIT_EVERY = 4  # a baseline of 20 windows or more is refitted every this many
MIN_BASE = 5  # healthy windows (2.5 s) before a route is judged on its own baseline
LOSSY_SHARE = 0.2  # a route losing this share of its probes has a full queue (pair_excess)
MIN_PEERS = 4  # fitted routes whose baselines judge a route not fitted yet
MIN_PROBES = 3  # probes (received or lost) in a window to judge it
MIN_SLOW_PATHS = 2
# A hop is named when this share of the judged routes across it waited beyond what named
# hops explain (not every one: with 16 routes or more across a link, one whose few probes
# in a second all met a bursty queue empty held the naming back 4-9 s; 0.8 until
# 2026-12-05, when a route whose newest window predated the onset held it back too)
NAME_SHARE = 0.6
RESIDUAL = 0.25  # a queue varies this much of itself within a window
UNSETTLED = 0.2  # lower quartile below this share of the tail's excess: not settled
# A hop queued this long (probe time: from its first slow routes, and named in two passes
# in a row; from the first pass naming it until 2026-12-06) is said. 1 s and 1-s windows
# until 2026-12-05; shorter still, the ports of a host whose link had just flapped, and
# of a host whose probes crossed a named link, were paged for what they lost (held-out
# seeds 1259, 1261, replayed with a hold of 0.25 s and of none): docs/detect.md.
PERSIST_NS = 500_000_000
# ... and seen slow at this many distinct send instants (a sender's tick, at most
# TICK_GAP_NS wide) of its routes' newest probes since it was first named. A collector
# sends every pair of a tick at once (collector/agent.py: ticks 0.15-0.45 s apart), so
# the routes of one sender across a link are one sample of its queue per tick, not one
# each: on a link crossed by one host's routes (the 3-host lab's leaf→spine links) the
# half second was ~3 ticks, and healthy jobs at 9 % of a 50-Mbit/s link (a 1,400-B frame
# 224 µs on the wire) met by ~3 ticks in a row paged it, about one detect-module run in
# three (2026-12-07). Links that many hosts cross reach this within the half second.
MIN_INSTANTS = 4
TICK_GAP_NS = 100_000_000
# A host's port is said once it held this long: its queue is one host's, and a moment of
# real incast under healthy jobs (two jobs into one host on shallow buffers) can fill it
# for a moment. On the fabric's 0.5 s, a fresh-clone CI paged h3-1's port under two
# healthy jobs (2026-12-05; most likely that, not reproduced): docs/detect.md.
PORT_PERSIST_NS = 1_000_000_000
# A port said whose check fails in a pass stays said, unreported, this long after it was
# last said: a shallow queue that fills and drains has its typical route's tail under the
# threshold now and then (the detect lab, a 480-µs buffer: 7 times in 40 s, each back
# within 3 s). Dropped at once, it began its PORT_PERSIST_NS again, its routes were learnt
# as healthy meanwhile, and a rack-mate whose routes to it wait in its queue was checked
# first and blocked it: in a fresh-clone CI (2026-12-07) the anomaly went 10 s without an
# update, closed, and opened anew 1.6 s later.
PORT_GAP_NS = 3_000_000_000
# A pair is slow (the TUI's amber) once a route of it held this long, or at once when it
# drops or crosses a hop said: a micro-burst under healthy jobs holds one route for about
# a second, and no hop is said for it.
PAIR_HOLD_NS = 1_000_000_000
# A send not received is lost once its receiver shipped receives this much later on the
# receiver's clock (the solver's skew put on the send time): a queue holds a probe for
# milliseconds, not this long. 2 s on the sender's clock until 2026-12-01 (any NTP offset
# up to 0.3 s, plus shipping): the newest 2 s of a route held only its received probes,
# so a full queue's loss share over the span reached LOSSY_SHARE late (the silent-drop
# detector's margin, MARGIN_S, is the same 0.3 s).
LOST_AFTER_NS = 300_000_000
LOST_UNSOLVED_NS = 2_000_000_000  # a pair the solver has not solved: not counted, let go
# A loss is known within this of its send, in probe time: LOST_AFTER_NS, and the receiver's
# segment with the receives after it (one every ~1.45 s, at most 1.9 s: collector/agent.py)
KNOWN_WITHIN_NS = 2_000_000_000
# (longer than any queue: a probe held 0.6 s in a lab queue is late, not lost)
PENDING_NS = 10_000_000_000  # a send or receive waits this long for its other half
PORT_LOSS = 0.01  # a host's port losing this share of its probes one way: that way is full
ONE_WAY = 4.0  # a port's one way holding this many times the other's queue: that way is full
CLOCKS_KEEP_NS = 60_000_000_000  # the solver's clocks kept (one copy per change) this long
MAX_PROBES = 200_000  # rows per side and pass; beyond, a consistent sample by sequence
COUNTER_SPAN_NS = 10_000_000_000  # counter rates over this long
# The NIC's congestion counters (mlx5 sysfs: ports/<p>/hw_counters and counters/).
CONGESTION_COUNTERS = (
    "np_ecn_marked_roce_packets",  # received with ECN CE: a queue on the way in marked them
    "np_cnp_sent",  # congestion notifications this host sent back (notification point)
    "rp_cnp_handled",  # ... it received and slowed down for (reaction point)
    "port_xmit_wait",  # ticks the port had data to send and could not (pause/credit)
)  # mlx5 has its pause counters in ethtool statistics, not sysfs: not read here
HOST_UP, HOST_DOWN = "host→leaf", "leaf→host"  # the directions of a host's access link
# (evidence key, with what unit) of the rates cited
_COUNTER_WORDS = {
    "np_ecn_marked_roce_packets": "ECN-marked",
    "np_cnp_sent": "CNP sent",
    "rp_cnp_handled": "CNP handled",
    "port_xmit_wait": "xmit wait",
}


def _grown(a: np.ndarray, keep: int, size: int, fill: float) -> np.ndarray:
    """A copy of ``a`` with ``size`` rows: its first ``keep`` rows, then ``fill``."""
    out = np.full((size, *a.shape[1:]), fill, a.dtype)
    out[:keep] = a[:keep]
    return out


class _WindowMedians:
    """Each path's median corrected delay in the clock solver's latest window it was in,
    and its least such median so far (its floor), as columns: one row per path (src,
    dst, sport), numbered as first fed — one numpy pass per solved window, not a Python
    object per path (320,000 paths a window at 4,000 hosts)."""

    def __init__(self) -> None:
        self._hosts, self._numbers = _Numbering(), _Numbering()
        self.src = np.zeros(0, np.int64)
        self.dst = np.zeros(0, np.int64)
        self.pair = np.zeros(0, np.int64)  # the host pair's key (its path keys >> 16)
        self.median = np.zeros(0)
        self.floor = np.zeros(0)
        self.window = np.zeros(0, np.int64)

    def feed(
        self, window: int, src: np.ndarray, dst: np.ndarray, sport: np.ndarray, median: np.ndarray
    ) -> None:
        median = np.asarray(median, np.float64)
        ok = np.isfinite(median)
        src = np.asarray(src, np.int64)[ok]
        dst = np.asarray(dst, np.int64)[ok]
        median = median[ok]
        key = _path_keys(self._hosts, src, dst, np.asarray(sport)[ok])
        ids = self._numbers.of(key)
        n, before = self._numbers.count, len(self.src)
        if n > before:
            self.src, self.dst, self.pair = (
                _grown(a, before, n, 0) for a in (self.src, self.dst, self.pair)
            )
            self.median = _grown(self.median, before, n, np.nan)
            self.floor = _grown(self.floor, before, n, np.inf)
            self.window = _grown(self.window, before, n, -1)
            fresh = ids >= before
            self.src[ids[fresh]], self.dst[ids[fresh]] = src[fresh], dst[fresh]
            self.pair[ids[fresh]] = key[fresh] >> 16
        # a path twice in one window: its last median, the least of both for the floor
        last = len(ids) - 1 - np.unique(ids[::-1], return_index=True)[1]
        self.median[ids[last]] = median[last]
        np.minimum.at(self.floor, ids, median)
        self.window[ids] = window

    def excess(self, window: int) -> dict[tuple[int, int], float]:
        """(src, dst) -> the worst of its paths' median in ``window`` over its floor, for
        the pairs with a path in that window (in the order their first path was fed)."""
        rows = np.flatnonzero((self.window == window) & np.isfinite(self.floor))
        if not len(rows):
            return {}
        src, dst = self.src[rows], self.dst[rows]
        value = self.median[rows] - self.floor[rows]
        uniq, first, inverse = np.unique(self.pair[rows], return_index=True, return_inverse=True)
        worst = np.full(len(uniq), -np.inf)
        np.maximum.at(worst, inverse, value)
        order = np.argsort(first, kind="stable")
        return dict(zip(zip(src[first[order]].tolist(), dst[first[order]].tolist(), strict=True),
                        worst[order].tolist(), strict=True))  # fmt: skip


class _Baselines:
    """Every route's healthy values, as columns (one row per route, rows handed out as
    routes appear): its last ``BASE_KEEP`` healthy windows' (lower quartile, tail) in a
    ring, how many were appended, the newest probe of the last one, and their median and
    robust σ (1.4826 × MAD) as last fitted — one numpy pass for a pass's routes, not a
    Python object each."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, int, str], int] = {}  # (src, dst, spine) -> row
        self.hist = np.full((0, BASE_KEEP, 2), np.nan)
        self.learnt = np.zeros(0, np.int64)  # healthy windows appended (the ring's position)
        self.last_ns = np.zeros(0, np.int64)
        self.med = np.full((0, 2), np.nan)
        self.sigma = np.full((0, 2), np.nan)

    def rows(self, keys: list[tuple[int, int, str]]) -> np.ndarray:
        """The row of each route (a new route gets the next)."""
        index = self.index
        out = np.fromiter((index.setdefault(k, len(index)) for k in keys), np.int64, len(keys))
        cap = len(self.learnt)
        if len(index) > cap:
            new = max(len(index), 2 * cap, 64)
            self.hist, self.med, self.sigma = (
                _grown(a, cap, new, np.nan) for a in (self.hist, self.med, self.sigma)
            )
            self.learnt, self.last_ns = (
                _grown(a, cap, new, 0) for a in (self.learnt, self.last_ns)
            )
        return out

    def count(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Healthy windows held (at most ``BASE_KEEP``)."""
        return np.minimum(self.learnt[: len(self.index)][rows], BASE_KEEP)

    def append(self, rows: np.ndarray, values: np.ndarray, newest_ns: np.ndarray) -> None:
        """One healthy window each (``rows`` distinct); refit at every window while a
        baseline is young, then every ``REFIT_EVERY``: one value more moves the median and
        MAD of dozens by little."""
        self.hist[rows, self.learnt[rows] % BASE_KEEP] = values
        self.last_ns[rows] = newest_ns
        self.learnt[rows] += 1
        young = np.minimum(self.learnt[rows], BASE_KEEP) < 4 * MIN_BASE
        self.fit(rows[young | (self.learnt[rows] % REFIT_EVERY == 0)])

    def fit(self, rows: np.ndarray) -> None:
        """Median and robust σ of each route's ring (grouped by how full it is: a ring not
        yet full holds its values first)."""
        counts = np.minimum(self.learnt[rows], BASE_KEEP)
        for c in np.unique(counts).tolist():
            sel = rows[counts == c]
            h = self.hist[sel, :c]
            med = np.median(h, axis=1)
            self.med[sel] = med
            self.sigma[sel] = 1.4826 * np.median(np.abs(h - med[:, None, :]), axis=1)


class _Held:
    """The probes a pass judges, in the order fed: each one's path number, send time and
    one-way delay (nan: lost), as columns grown in place — a pass reads them where they
    are instead of joining every feed's since the last pass."""

    def __init__(self) -> None:
        self.path = np.zeros(0, np.int64)
        self.t_ns = np.zeros(0, np.int64)
        self.delay = np.zeros(0)
        self.n = 0

    def append(self, cut: int, path: np.ndarray, t_ns: np.ndarray, delay: np.ndarray) -> None:
        """These probes after those held; those sent before ``cut`` (ns) are dropped first
        when the columns are full (they would be at the next :meth:`since`)."""
        m = len(path)
        if self.n + m > len(self.path):
            self.since(cut)
        if self.n + m > len(self.path):
            cap = max(2 * (self.n + m), 1024)
            self.path, self.t_ns, self.delay = (
                _grown(a, self.n, cap, 0) for a in (self.path, self.t_ns, self.delay)
            )
        end = self.n + m
        self.path[self.n : end], self.t_ns[self.n : end], self.delay[self.n : end] = (
            path, t_ns, delay,
        )  # fmt: skip
        self.n = end

    def since(self, cut: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The probes sent at ``cut`` (ns) or later, in the order fed (views: valid until
        the next :meth:`append`); the older ones are dropped."""
        keep = self.t_ns[: self.n] >= cut
        if not keep.all():
            rows = np.flatnonzero(keep)
            for a in (self.path, self.t_ns, self.delay):
                a[: len(rows)] = a[rows]
            self.n = len(rows)
        return self.path[: self.n], self.t_ns[: self.n], self.delay[: self.n]


class _Numbering:
    """Integers numbered 0, 1, ... in the order first seen (numpy: a sorted copy searched)."""

    def __init__(self) -> None:
        self.sorted = np.zeros(0, np.int64)
        self.number = np.zeros(0, np.int64)  # of each of ``sorted``
        self.count = 0

    def of(self, values: np.ndarray) -> np.ndarray:
        values = values.astype(np.int64, copy=False)
        pos = np.searchsorted(self.sorted, values)
        known = pos < self.count
        known[known] = self.sorted[pos[known]] == values[known]
        if not known.all():
            new = values[~known]
            new = new[np.sort(np.unique(new, return_index=True)[1])]  # first seen first
            every = np.concatenate([self.sorted, new])
            numbers = np.concatenate([self.number, np.arange(self.count, self.count + len(new))])
            order = np.argsort(every, kind="stable")
            self.sorted, self.number = every[order], numbers[order]
            self.count += len(new)
            pos = np.searchsorted(self.sorted, values)
        return self.number[pos]


def _path_keys(
    hosts: _Numbering, src: np.ndarray, dst: np.ndarray, sport: np.ndarray
) -> np.ndarray:
    """Each path (src, dst, sport) as one integer: its hosts' numbers in ``hosts`` and the
    port. ``key >> 16`` is the host pair's."""
    return (hosts.of(src) << 40) | (hosts.of(dst) << 16) | sport.astype(np.int64)


def _thresholds(sigma: np.ndarray) -> np.ndarray:
    """The excess a baseline of robust σ ``sigma`` lets pass."""
    return np.maximum(FLOOR_NS, K_SIGMA * sigma)


@dataclass
class RouteWindow:
    src: int
    dst: int
    spine: str
    hops: tuple[tuple[str, str], ...]  # (link, direction): source port, up, down, dest port
    newest_ns: int
    received: int
    lost: int
    stats: np.ndarray  # the window's (p25, p90) corrected delay, ns (nan: all lost)
    excess: np.ndarray  # ... over the route's healthy medians (nan: not judged yet)
    thresholds: np.ndarray  # ... and the excess each must pass
    ports: int
    # Losing LOSSY_SHARE of its probes over LOSS_SPAN_NS: the p90 of those received over
    # that span, and its excess over the route's healthy tail (nan: not lossy, or not
    # judged yet)
    span_tail: float = math.nan
    span_excess: float = math.nan

    @property
    def judged(self) -> bool:
        return bool(np.isfinite(self.excess).all())

    @property
    def dropping(self) -> bool:
        """A full queue that drops: at least ``LOSSY_SHARE`` of its probes lost over
        ``LOSS_SPAN_NS`` while those that got through in that span waited (their tail
        above its healthy range). A drop-tail queue drops only when full, so the probes it
        dropped are the ones that met it fullest; the lower quartile of those received —
        which a queue that empties for moments between bursts pulls down to its unqueued
        probes — does not decide, nor does one second whose few probes all passed
        unqueued. A silent drop loses probes without the wait; a flap moves them."""
        return self.judged and bool(self.span_excess > self.thresholds[1])

    @property
    def slow(self) -> bool:
        """A standing queue: its lower quartile and its tail both above their healthy
        range (a busy link that leaves a quarter of the probes unqueued is not one), or a
        full queue that drops (:attr:`dropping`)."""
        return self.judged and (bool((self.excess > self.thresholds).all()) or self.dropping)

    @property
    def settled(self) -> bool:
        """Not a window caught while its queue fills or drains (a tail far above its
        lower quartile): such a route measures no queue yet, for or against a hop. A
        queue that drops is full, whatever its lower quartile."""
        tail_up = self.excess[1] > self.thresholds[1]
        return self.dropping or not (tail_up and self.excess[0] < UNSETTLED * self.excess[1])

    @property
    def tail_excess(self) -> float:
        """The tail's excess (ns): this window's, or for a queue that drops its span's when
        larger (a window whose few probes passed unqueued does not say the queue is gone)."""
        if self.dropping:
            return max(float(self.excess[1]), float(self.span_excess))
        return float(self.excess[1])

    @property
    def queue(self) -> float:
        """What this window's probes waited at least, most of them (ns); for a full queue
        that drops, what the tail of its span waited (the probes it dropped would have
        waited more)."""
        if self.dropping:
            return max(float(self.excess[0]), float(self.span_excess))
        return max(float(self.excess[0]), 0.0)


def _add_instants(instants: dict[int, list[int]], slow: list[RouteWindow]) -> int:
    """Add the send instants of ``slow`` routes' newest probes to ``instants`` (src ->
    instants): one per sender's tick, those within ``TICK_GAP_NS`` of one already there
    being the same tick; ``MIN_INSTANTS`` in all at most (a queue that stands for hours
    keeps no list of its ticks). Returns how many it holds."""
    count = sum(map(len, instants.values()))
    for w in slow:
        if count >= MIN_INSTANTS:
            break
        seen = instants.setdefault(w.src, [])
        if all(abs(w.newest_ns - t) > TICK_GAP_NS for t in seen):
            seen.append(w.newest_ns)
            count += 1
    return count


DIRECTIONS = (HOST_UP, "leaf→spine", "spine→leaf", HOST_DOWN)  # a route's hops, in order


class Windows:
    """Every route's newest window as columns, one row per route in (src, dst, spine)
    order: what a pass judges without a Python object per route. The verdicts
    (``judged``, ``dropping``, ``slow``, ``settled``, ``queue``) are :class:`RouteWindow`'s,
    for all rows at once (and ``queued``: slow on its own window, not its span);
    :meth:`route` is row i as a :class:`RouteWindow` — the naming builds those only for
    the routes it looks at. Iterating gives them all."""

    def __init__(
        self, src: np.ndarray, dst: np.ndarray, spine: list[str], links: np.ndarray,
        newest: np.ndarray, received: np.ndarray, lost: np.ndarray, stats: np.ndarray,
        excess: np.ndarray, thresholds: np.ndarray, ports: np.ndarray, span_tail: np.ndarray,
        span_excess: np.ndarray, objs: list[RouteWindow] | None = None,
        base_rows: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        self.src, self.dst, self.spine, self.links = src, dst, spine, links  # links: (n, 4)
        self.newest, self.received, self.lost = newest, received, lost
        self.stats, self.excess, self.thresholds = stats, excess, thresholds  # (n, 2) each
        self.ports, self.span_tail, self.span_excess = ports, span_tail, span_excess
        self.objs = objs  # the windows these columns were made of (:meth:`of`), hops as given
        self.base_rows = base_rows  # each route's row in PathDelays' baselines, when known
        e, t = excess, thresholds
        with np.errstate(invalid="ignore"):
            self.judged = np.isfinite(e).all(axis=1)
            self.dropping = self.judged & (span_excess > t[:, 1])
            self.queued = self.judged & (e > t).all(axis=1)  # slow on its own window
            self.slow = self.queued | self.dropping
            tail_up = e[:, 1] > t[:, 1]
            self.settled = self.dropping | ~(tail_up & (e[:, 0] < UNSETTLED * e[:, 1]))
            self.queue = np.where(
                self.dropping, np.maximum(e[:, 0], span_excess), np.maximum(e[:, 0], 0.0)
            )

    @classmethod
    def empty(cls) -> Windows:
        z, f = np.zeros(0, np.int64), np.zeros((0, 2))
        return cls(z, z, [], np.empty((0, 4), object), z, z, z, f, f, f, z, z * 0.0, z * 0.0)

    @classmethod
    def of(cls, wins: list[RouteWindow]) -> Windows:
        """Columns of windows made one by one (their hops kept as they are)."""
        if not wins:
            return cls.empty()

        def col(name: str, dtype: type) -> np.ndarray:
            return np.array([getattr(w, name) for w in wins], dtype)

        pair = np.array([np.append(w.stats, [w.excess, w.thresholds]) for w in wins], float)
        return cls(
            col("src", np.int64), col("dst", np.int64), [w.spine for w in wins],
            np.empty((len(wins), 4), object), col("newest_ns", np.int64),
            col("received", np.int64), col("lost", np.int64), pair[:, 0:2], pair[:, 2:4],
            pair[:, 4:6], col("ports", np.int64), col("span_tail", float),
            col("span_excess", float), objs=list(wins),
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.src)

    def __iter__(self) -> Iterator[RouteWindow]:
        return (self.route(i) for i in range(len(self)))

    def route(self, i: int) -> RouteWindow:
        if self.objs is not None:
            return self.objs[i]
        lk = self.links[i]
        return RouteWindow(
            int(self.src[i]), int(self.dst[i]), self.spine[i],
            tuple(zip(lk.tolist(), DIRECTIONS, strict=True)), int(self.newest[i]),
            int(self.received[i]), int(self.lost[i]), self.stats[i].copy(),
            self.excess[i].copy(), self.thresholds[i].copy(), int(self.ports[i]),
            float(self.span_tail[i]), float(self.span_excess[i]),
        )  # fmt: skip

    def take(self, mask: np.ndarray) -> Windows:
        """The rows of ``mask``, in order."""
        rows = np.flatnonzero(mask)
        return Windows(
            self.src[rows], self.dst[rows], [self.spine[i] for i in rows.tolist()],
            self.links[rows], self.newest[rows], self.received[rows], self.lost[rows],
            self.stats[rows], self.excess[rows], self.thresholds[rows], self.ports[rows],
            self.span_tail[rows], self.span_excess[rows],
            None if self.objs is None else [self.objs[i] for i in rows.tolist()],
            None if self.base_rows is None else self.base_rows[rows],
        )  # fmt: skip

    def unheld(self, mask: np.ndarray) -> Windows:
        """These windows with the rows of ``mask`` judged on their own window alone: their
        span's losses and tail (:attr:`RouteWindow.dropping`) dropped."""
        rows = np.flatnonzero(mask)
        if not len(rows):
            return self
        tail, span = self.span_tail.copy(), self.span_excess.copy()
        tail[rows] = span[rows] = math.nan
        objs = None
        if self.objs is not None:
            objs = list(self.objs)
            for i in rows.tolist():
                objs[i] = replace(objs[i], span_tail=math.nan, span_excess=math.nan)
        return Windows(
            self.src, self.dst, self.spine, self.links, self.newest, self.received, self.lost,
            self.stats, self.excess, self.thresholds, self.ports, tail, span, objs,
            self.base_rows,
        )  # fmt: skip

    def touching(self, hosts: np.ndarray) -> np.ndarray:
        """Per row: whether the route runs into or out of one of ``hosts``."""
        return np.isin(self.src, hosts) | np.isin(self.dst, hosts)

    def hops(self, mask: np.ndarray) -> set[tuple[str, str]]:
        """The hops the rows of ``mask`` cross."""
        rows = np.flatnonzero(mask).tolist()
        if self.objs is not None:
            return {h for i in rows for h in self.objs[i].hops}
        return {(lk, DIRECTIONS[k]) for k in range(4) for lk in set(self.links[rows, k].tolist())}

    def crosses(self, hops: set[tuple[str, str]]) -> np.ndarray:
        """Per row: whether it crosses one of ``hops``."""
        if self.objs is not None:
            return np.array([any(h in hops for h in w.hops) for w in self.objs], bool)
        out = np.zeros(len(self), bool)
        for k, direction in enumerate(DIRECTIONS):
            names = [lk for lk, dr in hops if dr == direction]
            if names:
                out |= np.isin(self.links[:, k], names)
        return out


def queues(routes: list[RouteWindow]) -> tuple[list[tuple[str, str]], np.ndarray, np.ndarray]:
    """(hops in name order, the routes × hops crossing matrix, each hop's estimated queue
    in ns): non-negative least squares of the routes' standing queues (their lower
    quartile's excess, clipped at 0).

    Only hops some slow route crosses are estimated (the others hold no queue worth a
    name: no slow route crosses them); the routes crossing them, slow or fast, are the
    system's rows. With every host's port a hop, the whole fleet's matrix would be
    routes × (fabric links + 2 × hosts), dense; this one is as small as the fault."""
    from scipy.optimize import nnls

    hops = sorted({h for r in routes if r.slow for h in r.hops})
    col = {h: i for i, h in enumerate(hops)}
    a = np.zeros((len(routes), len(hops)))
    for i, r in enumerate(routes):
        for h in r.hops:
            c = col.get(h)
            if c is not None:
                a[i, c] = 1.0
    rows = np.flatnonzero(a.any(axis=1))
    if not len(rows):
        return hops, a, np.zeros(len(hops))
    b = np.array([routes[i].queue for i in rows]) / 1e3  # µs: a well-scaled system
    q, _ = nnls(a[rows], b, maxiter=50 * max(len(hops), 1))
    return hops, a, q * 1e3


# a host's round trip: its queue (ns), the threshold it must pass, its routes in and out
RoundTrip = tuple[float, float, list[RouteWindow], list[RouteWindow]]


def _round_trip(host: int, judged: list[RouteWindow]) -> RoundTrip | None:
    """What ``host``'s round trips wait beyond healthy (ns), the threshold that sum must
    pass, and the routes into and out of it — or None (fewer than ``MIN_SLOW_PATHS`` judged
    routes each way).

    Clock-free as far as the host's own clock goes: were its offset wrong by e, the routes
    into it would show e less and those out of it e more, so the least standing queue
    (lower quartile's excess) into it plus the least out of it is what a queue at its port
    adds, whichever direction holds it — every route of that direction waits in it. The
    least, not a middle value: a fabric link holds up only the routes through its spine,
    and the routes through the others leave it out of the sum (a median of four routes out,
    two through a full uplink, is half that uplink's queue). The peers' clocks are many
    and independent."""
    trip = _round_trips(judged).get(host)
    if trip is None:
        return None
    return *trip, [w for w in judged if w.dst == host], [w for w in judged if w.src == host]


def _round_trips(judged: list[RouteWindow] | Windows) -> dict[int, tuple[float, float]]:
    """:func:`_round_trip`'s queue and threshold for every host at once (numpy): host ->
    (least excess in + least out, median threshold in + median out), for the hosts with
    ``MIN_SLOW_PATHS`` judged routes each way."""
    cols = judged if isinstance(judged, Windows) else Windows.of(judged)
    if not len(cols):
        return {}
    hosts, ends = np.unique(np.stack([cols.src, cols.dst], axis=1), return_inverse=True)
    ends = ends.reshape(-1, 2)
    n = len(hosts)
    q, thr = np.zeros(n), np.zeros(n)
    enough = np.ones(n, bool)
    for side in (1, 0):  # into each host (by dst), away from it (by src)
        least = np.full(n, np.inf)
        np.minimum.at(least, ends[:, side], cols.excess[:, 0])
        mid, count = _group_quantiles(ends[:, side], cols.thresholds[:, 0], n, (50.0,))
        q += least
        thr += mid[:, 0]
        enough &= count >= MIN_SLOW_PATHS
    return {int(h): (float(a), float(b))
            for h, a, b in zip(hosts[enough], q[enough], thr[enough], strict=True)}  # fmt: skip


def _tail_trips(cols: Windows) -> dict[int, tuple[float, float, float]]:
    """Every host's round trip at the tail: host -> (the least of its routes in's median
    tail by spine plus the least of its routes out's; the median in plus the median out;
    median tail threshold in plus median out), for the hosts with
    ``MIN_SLOW_PATHS`` judged routes each way. A route's tail is its window's p90 excess,
    or its span's for a queue that drops (:attr:`RouteWindow.tail_excess`).

    :func:`_round_trips` at the lower quartile misses a shallow queue that fills and
    drains with the load: at a host's port fed faster than it drains, through a 6-kB
    buffer, the lab's probes in waited 5 µs at their lower quartile and 800 µs at their
    tail while a quarter of them were dropped — no queue stood, and nothing was named
    (the losses went to a false silent drop instead). By spine: a port holds up the
    routes through every spine and from its rack-mates, a fabric link only those through
    its own — but a second's tail is a few probes, and one route's can miss a queue that
    half its probes meet empty, so each spine's routes count by their median (groups of
    ``MIN_SLOW_PATHS`` routes or more). Clock-free: a wrong offset moves every route in
    one way and every route out the other by as much."""
    if not len(cols):
        return {}
    tail = np.where(cols.dropping, np.fmax(cols.excess[:, 1], cols.span_excess), cols.excess[:, 1])
    hosts, ends = np.unique(np.stack([cols.src, cols.dst], axis=1), return_inverse=True)
    ends = ends.reshape(-1, 2)
    n = len(hosts)
    _, spine = np.unique(np.array(cols.spine, dtype=object).astype(str), return_inverse=True)
    spine = spine.reshape(-1)
    mids, thrs, least = [], [], []
    enough = np.ones(n, bool)
    for side in (1, 0):  # into each host (by dst), away from it (by src)
        mid, count = _group_quantiles(ends[:, side], tail, n, (50.0,))
        t_mid, _ = _group_quantiles(ends[:, side], cols.thresholds[:, 1], n, (50.0,))
        mids.append(mid[:, 0])
        thrs.append(t_mid[:, 0])
        enough &= count >= MIN_SLOW_PATHS
        # each (host, spine) group's median tail; the least of the groups large enough
        keys, inv = np.unique(ends[:, side] * (spine.max() + 1) + spine, return_inverse=True)
        g_mid, g_count = _group_quantiles(inv.reshape(-1), tail, len(keys), (50.0,))
        g_host = keys // (spine.max() + 1)
        big = g_count >= MIN_SLOW_PATHS
        lo = np.full(n, np.inf)
        np.minimum.at(lo, g_host[big], g_mid[big, 0])
        groups = np.bincount(g_host[big], minlength=n)
        least.append(np.where(groups >= 2, lo, -np.inf))  # one spine's routes: no port
    way = least[0] + least[1]
    typical, thr = mids[0] + mids[1], thrs[0] + thrs[1]
    return {int(h): (float(a), float(b), float(c)) for h, a, b, c in zip(
        hosts[enough], way[enough], typical[enough], thr[enough], strict=True)}  # fmt: skip


def _clock_leads(judged: list[RouteWindow] | Windows) -> dict[tuple[int, str], float]:
    """(host, "in" or "out") -> how early (ns) the host's routes that way are, where the
    median of their standing queues' excess is below minus their median threshold.

    A queue only delays: routes into a host that arrive earlier than healthy, beyond their
    noise, say the clock solver holds that host's clock wrong by about that much — and
    its routes out late by as much (seen in the lab: an incast drained, and for the
    seconds until the solver's next window the probes out of the host were corrected
    with the offset that had absorbed the queue, 32 ms late)."""
    cols = judged if isinstance(judged, Windows) else Windows.of(judged)
    leads = {}
    for ends, way in ((cols.dst, "in"), (cols.src, "out")):
        hosts, inv = np.unique(ends, return_inverse=True)
        mid, count = _group_median(inv, cols.excess[:, 0], len(hosts))
        thr, _ = _group_median(inv, cols.thresholds[:, 0], len(hosts))
        early = (count >= MIN_SLOW_PATHS) & (mid < -thr)
        leads.update({(h, way): -m for h, m in zip(hosts[early].tolist(), mid[early].tolist(),
                                                   strict=True)})  # fmt: skip
    return leads


def _clock_explained(leads: dict[tuple[int, str], float], src: int, dst: int) -> float:
    """What the ends' clocks explain of a route's delay (ns), from :func:`_clock_leads`:
    the source's routes in early by e put its routes out e late, and the destination's
    routes out early put its routes in late."""
    return leads.get((src, "in"), 0.0) + leads.get((dst, "out"), 0.0)


def _loss(routes: list[RouteWindow]) -> float:
    lost = sum(w.lost for w in routes)
    sent = lost + sum(w.received for w in routes)
    return lost / sent if sent else 0.0


def _loss_side(into: list[RouteWindow], away: list[RouteWindow]) -> str | None:
    """The direction of a host's port that drops (a full queue does): probes into the host
    lost (``leaf→host``) or out of it (``host→leaf``) — at least ``PORT_LOSS`` of them, and
    four times the other way's share; None when neither."""
    li, lo = _loss(into), _loss(away)
    if li >= PORT_LOSS and lo * 4 <= li:
        return HOST_DOWN
    if lo >= PORT_LOSS and li * 4 <= lo:
        return HOST_UP
    return None


def _group_order(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The order of ``values`` by (group, value), groups non-negative integers (equal
    values of a group in any order): one sort of the values, then one of unique integers
    (group, rank) — a quarter of ``np.lexsort``'s time on a pass's 400,000 probes."""
    by_value = np.argsort(values)
    n = len(values)
    return by_value[np.argsort(groups[by_value].astype(np.int64) * n + np.arange(n))]


def _by_group(
    groups: np.ndarray, values: np.ndarray, n: int, presorted: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``values`` in (group, value) order, and per group 0..n-1 how many it has, where they
    start, and whether it has any."""
    v = values if presorted else values[_group_order(groups, values)]
    count = np.bincount(groups, minlength=n)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    return v, count, start, count > 0


def _group_quantiles(
    groups: np.ndarray, values: np.ndarray, n: int, qs: tuple[float, ...], presorted: bool = False,
    like_numpy: bool = False,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per group 0..n-1: the ``qs`` percentiles of its ``values`` (linear interpolation,
    as ``np.percentile``; nan for a group without values), and how many it has.
    ``presorted``: already in (group, value) order. ``like_numpy``: interpolated from
    the upper value where the fraction is at least a half, as numpy does — the same bits
    as ``np.percentile`` (otherwise they can differ in the last place)."""
    v, count, start, ok = _by_group(groups, values, n, presorted)
    out = np.full((n, len(qs)), np.nan)
    for j, q in enumerate(qs):
        pos = (count[ok] - 1) * (q / 100.0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, count[ok] - 1)
        a, b = v[start[ok] + lo], v[start[ok] + hi]
        t = pos - lo
        out[ok, j] = a + (b - a) * t
        if like_numpy:
            upper = t >= 0.5
            out[np.flatnonzero(ok)[upper], j] = (b - (b - a) * (1 - t))[upper]
    return out, count


def _route_quantiles(
    rid: np.ndarray, values: np.ndarray, mask: np.ndarray, n: int, qs: tuple[float, ...],
    like_numpy: bool = False,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """:func:`_group_quantiles` of the rows of ``mask`` (sorted here by (route, value))."""
    rows = np.flatnonzero(mask)
    rows = rows[_group_order(rid[rows], values[rows])]
    return _group_quantiles(rid[rows], values[rows], n, qs, presorted=True,
                            like_numpy=like_numpy)  # fmt: skip


def _group_median(groups: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group 0..n-1: the median of its ``values`` exactly as ``np.median`` gives it (the
    mean of the two middle values; nan without values), and how many it has."""
    v, count, start, ok = _by_group(groups, values, n)
    out = np.full(n, np.nan)
    lo, hi = start[ok] + (count[ok] - 1) // 2, start[ok] + count[ok] // 2
    out[ok] = (v[lo] + v[hi]) / 2
    return out, count


def _skews(tx: np.ndarray, clocks: ClockState | None) -> tuple[np.ndarray, np.ndarray]:
    """Which sends (``src``, ``dst``, ``tx_ns``) the solver has solved both ends of, and
    for those the receiver's clock less the sender's at the send time (ns; 0 elsewhere)."""
    n = len(tx)
    if clocks is None or not n or not len(clocks.hosts):
        return np.zeros(n, bool), np.zeros(n)
    order = np.argsort(clocks.hosts)
    hosts = clocks.hosts[order]
    i = np.searchsorted(hosts, tx["src"]).clip(0, len(hosts) - 1)
    j = np.searchsorted(hosts, tx["dst"]).clip(0, len(hosts) - 1)
    ok = (hosts[i] == tx["src"]) & (hosts[j] == tx["dst"])
    skew = clocks.skew(order[i], order[j], tx["tx_ns"])
    return ok, np.where(ok, skew, 0.0)


def _fields(rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The columns of ``dtype`` out of ``rows`` (a copy)."""
    out = np.empty(len(rows), dtype)
    for name in dtype.names or ():
        out[name] = rows[name]
    return out


class PathDelays:
    def __init__(
        self,
        host_rack: dict[int, str],
        links_by_ends: dict[tuple[str, str], str],
        spine_of: dict[tuple[int, int, int], str],
        host_names: dict[int, str] | None = None,
        floor_ns: float = FLOOR_NS,
        host_access: dict[int, str] | None = None,
    ) -> None:
        self.host_rack = host_rack
        # host -> its access link's name (from the topology; a host without one is named
        # by itself: "h1-1 (leaf→host)")
        self.host_access = host_access if host_access is not None else {}
        self.by_ends = links_by_ends
        self.spine_of = spine_of  # (src, dst, sport) -> spine, kept by FabricPaths
        self.host_names = host_names if host_names is not None else {}
        self.floor_ns = floor_ns
        self.medians = _WindowMedians()  # each path's clock-window medians
        self.window = 0
        # (src, dst) -> the jobs whose messages run between these hosts now (the in-band
        # reports, :meth:`JobDelays.jobs_between`): named beside a contended link.
        self.jobs_between: Callable[[int, int], set[str]] = lambda s, d: set()
        # since_ns -> the hosts whose own link (or leaf) was down at or after it
        # (:meth:`LinkFlaps.hosts_down_since`): their routes are not judged (:meth:`_cut_off`)
        self.hosts_down: Callable[[int], set[int]] = lambda since_ns: set()
        # streamed probes
        self._tx = np.zeros(0, _TX)
        self._rx = np.zeros(0, _RX)
        # receiver -> newest receive it shipped: receivers sorted, their newest rx_ns
        self._mark_hosts = np.zeros(0, np.int64)
        self._mark_ns = np.zeros(0, np.int64)
        self._held = _Held()  # joined (delay) or lost (nan), newest HOLD_NS
        self._sample = 1
        self.newest_ns = 0
        self._bases = _Baselines()  # each route's healthy baseline
        # each path (src, dst, sport) numbered in the order first fed, its key by number
        self._host_numbers, self._path_numbers = _Numbering(), _Numbering()
        self._path_keys = np.zeros((0, 3), np.int64)
        # every path's route, as the traces and the paths numbered last made it (_routes)
        none = np.zeros(0, np.int64)
        self._routes_key: tuple[int, int | None, int] = (0, None, -1)
        self._routes_made: tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (
            [], none, none, none, none,
        )  # fmt: skip
        self.lost_total = 0
        self.joined_total = 0
        self.unsure_total = 0  # host ports not named: their host's round trips do not show it
        # host -> counter -> deque of (ts_ns, delta)
        self._counters: dict[int, dict[str, collections.deque[tuple[int, int]]]] = {}
        self._twins: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._last_windows: Windows | list[RouteWindow] = Windows.empty()
        # (src, dst) with a route whose probes of the last LOSS_SPAN_NS were all lost (at
        # least MIN_PROBES of them): no window to judge, but the fullest queue of all
        self._dark: set[tuple[int, int]] = set()
        self._since: dict[tuple[str, str], int] = {}  # hop -> contended since (probe time)
        # hop -> since when it held a queue above its routes' threshold with MIN_SLOW_PATHS
        # slow routes across it, named or not (probe time)
        self._queued_since: dict[tuple[str, str], int] = {}
        # hop named -> its slow routes' send instants since (src -> tick times, ns)
        self._instants: dict[tuple[str, str], dict[int, list[int]]] = {}
        # (src, dst) with a slow route the naming reads -> slow since (probe time), and
        # those that held PERSIST_NS (or drop) -> their queue (ns): :meth:`pair_queues`
        self._pair_since: dict[tuple[int, int], int] = {}
        self._pair_queues: dict[tuple[int, int], float] = {}
        # a host's access link said -> (that host, the way that is full or None, what told it)
        self._ports: dict[str, tuple[int, str | None, str]] = {}
        self._port_said: dict[int, int] = {}  # host -> newest_ns its port was last said
        # The clock solver's solutions as they changed, newest CLOCKS_KEEP_NS of passes:
        # (pass time, ref_ns, hosts sorted, offset_ns, drift), copies; and host -> the last
        # pass its routes were healthy (its round trips hold no queue, no clock lead): what
        # the solver has moved a host's clock by since then (:meth:`_clock_moved`).
        self._clocks: ClockState | None = None
        self._clock_copies: collections.deque[
            tuple[int, int, np.ndarray, np.ndarray, np.ndarray]
        ] = collections.deque()
        self._healthy_at: dict[int, int] = {}

    # ---- clock-window medians (pair_excess) ----------------------------------------------
    def feed(self, src: np.ndarray, dst: np.ndarray, sport: np.ndarray, median: np.ndarray) -> None:
        """One solver window: the median corrected one-way delay of each path."""
        self.window += 1
        self.medians.feed(self.window, src, dst, sport, median)

    def pair_excess(self) -> dict[tuple[int, int], float]:
        """(src, dst) -> what the probes between two hosts wait in queues now (ns): the
        worst of its routes — its newest window's tail over its healthy value (streamed
        probes), infinite where a route loses a fifth of its probes or more, or all of them
        (a full queue drops: they wait too); for pairs without judged routes, the worst of its paths'
        latest clock-window median over its floor. The worst, not a middle value: a job's
        flow may take exactly the route that queues (the in-band RoCE v1 signal must not
        blame a job for contention its probes on that route see)."""
        streamed: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
        w = self._last_windows
        w = w if isinstance(w, Windows) else Windows.of(w)
        sent = w.received + w.lost
        lossy = (sent > 0) & (w.lost >= LOSSY_SHARE * sent)
        use = lossy | w.judged  # the tail of the judged: it moves first, while a queue fills
        worst = np.where(lossy, math.inf, w.excess[:, 1])
        for s, d, v in zip(w.src[use].tolist(), w.dst[use].tolist(), worst[use].tolist(),
                           strict=True):  # fmt: skip
            streamed[(s, d)].append(v)
        for k in self._dark:
            streamed[k].append(math.inf)
        out = self.medians.excess(self.window)
        out.update({k: float(max(v)) for k, v in streamed.items()})
        return out

    def pair_queues(self) -> dict[tuple[int, int], float]:
        """(src, dst) -> what the probes between two hosts waited in queues beyond their
        healthy delay (ns), for each pair with a route the detector holds slow: judged slow
        against that route's own healthy baseline (:attr:`Windows.slow`, never under
        ``FLOOR_NS``) and settled, as the naming reads them, in every pass of the last
        ``PAIR_HOLD_NS`` of probe time, or dropping (a full queue), or crossing a hop said
        in this pass (the pairs an open anomaly names are amber with it). The value is the
        most its slow routes waited (:attr:`Windows.queue`). A healthy fleet gives ``{}``,
        whatever its paths' delays are (the TUI's amber is this verdict, not a fixed
        delay), and so does a micro-burst that fills a queue for a moment (seen under
        healthy jobs on 500-µs buffers: one route 25–31 µs slow for a second, three times
        in 10 minutes, never named)."""
        return dict(self._pair_queues)

    def _hold_pairs(
        self,
        every: Windows,
        trips: dict[int, tuple[float, float]],
        leads: dict[tuple[int, str], float],
        said: set[tuple[str, str]],
    ) -> None:
        """Note, after a pass, which pairs have a slow route and since when
        (:meth:`pair_queues`); ``every``: the judged, settled routes the naming reads,
        ``trips`` and ``leads`` their :func:`_round_trips` and :func:`_clock_leads`,
        ``said``: the hops (link, direction) this pass said.

        A route late by what its ends' clocks explain is not slow: a host whose routes
        one way are early and whose round trips hold no queue has a clock the solver
        holds wrong — stepped (a PTP servo re-locking, chrony or ntpd stepping), and
        until the solver's next window its routes the other way read late by as much,
        though nothing waited. The naming discounts the same (a fabric link is not paged
        for it, a host's port only on its round trips); a host whose round trips hold a
        queue keeps its routes' delay whole."""
        now = self.newest_ns
        slow = every.slow
        queue: dict[tuple[int, int], float] = {}
        # amber without the hold: a full queue that drops, or a route across a hop said
        at_once_pairs: set[tuple[int, int]] = set()
        queued = {h for h, (rt, rt_thr) in trips.items() if rt > rt_thr}  # its delay stays whole
        held = {k: v for k, v in leads.items() if k[0] not in queued}
        at_once = every.dropping[slow] | every.crosses(said)[slow]
        for s, d, q, thr, at_once_route in zip(every.src[slow].tolist(), every.dst[slow].tolist(),
                                               every.queue[slow].tolist(),
                                               every.thresholds[slow, 0].tolist(),
                                               at_once.tolist(), strict=True):  # fmt: skip
            explained = _clock_explained(held, s, d)
            if explained and not at_once_route:
                if q - explained <= thr + RESIDUAL * explained:
                    continue
                q -= explained
            queue[(s, d)] = max(queue.get((s, d), 0.0), q)
            if at_once_route:
                at_once_pairs.add((s, d))
        since = self._pair_since = {p: self._pair_since.get(p, now) for p in queue}
        self._pair_queues = {p: q for p, q in queue.items()
                             if now - since[p] >= PAIR_HOLD_NS or p in at_once_pairs}  # fmt: skip

    # ---- streamed probes -------------------------------------------------------------------
    def feed_probes(self, tx: np.ndarray, rx: np.ndarray, clocks: ClockState | None) -> None:
        """``probe_tx`` and ``probe_rx`` records (numpy, any order, any commit) and the clock
        solver's latest solution (None: nothing is counted yet)."""
        self.feed_probe_batches([(tx, rx)], clocks)

    def feed_probe_batches(
        self, batches: list[tuple[np.ndarray, np.ndarray]], clocks: ClockState | None
    ) -> None:
        """Several commits' ``(probe_tx, probe_rx)`` at once, as :meth:`feed_probes` of each
        in turn would count them: a detector that fell behind matches its queue in one pass
        instead of re-sorting what is pending once per commit."""
        most = max(sum(len(tx) for tx, _ in batches), sum(len(rx) for _, rx in batches))
        if most > MAX_PROBES:
            # A consistent sample (the same sequence numbers on both sides); a new rate
            # starts the pending halves afresh (an old half would look lost).
            k = 1 << max(0, math.ceil(math.log2(most / MAX_PROBES)))
            if k > self._sample:
                self._sample = k
                self._tx, self._rx = self._tx[:0], self._rx[:0]
        # rates only grow: seq % 2k == 0 keeps a subset of seq % k == 0 (rows sampled
        # when queued, at a lower rate, are sampled again here)
        if clocks is not None:
            self._clocks = clocks
        new_tx = np.concatenate([_fields(self.sampled(tx), _TX) for tx, _ in batches])
        new_rx = np.concatenate([_fields(self.sampled(rx), _RX) for _, rx in batches])
        self._mark(new_rx["dst"], new_rx["rx_ns"])
        txs = np.concatenate([self._tx, new_tx])
        rxs = np.concatenate([self._rx, new_rx])
        if len(txs):
            self.newest_ns = max(self.newest_ns, int(txs["tx_ns"].max()))
        # Match send and receive: sort both by (src, seq), a send just before its receive.
        n = len(txs)
        src = np.concatenate([txs["src"], rxs["src"]])
        seq = np.concatenate([txs["seq"], rxs["seq"]])
        kind = np.concatenate([np.zeros(n, np.int8), np.ones(len(rxs), np.int8)])
        order = np.lexsort((kind, seq, src))
        ss, qq, kk = src[order], seq[order], kind[order]
        pair = np.flatnonzero(
            (ss[:-1] == ss[1:]) & (qq[:-1] == qq[1:]) & (kk[:-1] == 0) & (kk[1:] == 1)
        )
        ti, ri = order[pair], order[pair + 1] - n
        matched_tx = np.zeros(n, bool)
        matched_tx[ti] = True
        matched_rx = np.zeros(len(rxs), bool)
        matched_rx[ri] = True
        cut = self.newest_ns - HOLD_NS
        self._held.append(cut, *self._joined(txs[ti], rxs["rx_ns"][ri], clocks))
        # Sends never received: lost once their receiver shipped receives well after them.
        left = txs[~matched_tx]
        marks = self._marks_of(left["dst"])
        solved, skew = _skews(left, clocks)
        lost = np.where(solved, left["tx_ns"] + skew + LOST_AFTER_NS < marks,
                        left["tx_ns"] + LOST_UNSOLVED_NS < marks)  # fmt: skip
        horizon = self.newest_ns - PENDING_NS
        if lost.any() and clocks is not None:
            gone = left[lost & solved]
            self.lost_total += len(gone)
            self._held.append(cut, self._paths(gone), gone["tx_ns"], np.full(len(gone), np.nan))
        keep = ~lost & (left["tx_ns"] >= horizon)
        self._tx = left[keep]
        rleft = rxs[~matched_rx]
        self._rx = rleft[rleft["rx_ns"] >= horizon]

    def sampled(self, rows: np.ndarray) -> np.ndarray:
        """The probe rows (``seq`` field) of the current consistent sample: all while one
        pass matches at most :data:`MAX_PROBES` a side, one sequence number in k beyond
        (a copy then: a queued commit does not hold the daemon's buffers)."""
        k = self._sample
        return rows if k == 1 else rows[rows["seq"] % k == 0]

    def _mark(self, dst: np.ndarray, rx_ns: np.ndarray) -> None:
        """Each receiver's newest shipped receive, updated with these."""
        if not len(dst):
            return
        hosts, each = np.unique(dst.astype(np.int64), return_inverse=True)
        ns = np.full(len(hosts), np.iinfo(np.int64).min)
        np.maximum.at(ns, each, rx_ns.astype(np.int64))  # each receiver's newest of these
        hosts = np.concatenate([self._mark_hosts, hosts])
        ns = np.concatenate([self._mark_ns, ns])
        order = np.lexsort((ns, hosts))
        hosts, ns = hosts[order], ns[order]
        last = np.append(hosts[1:] != hosts[:-1], True)  # each host's newest, sorted last
        self._mark_hosts, self._mark_ns = hosts[last], ns[last]

    def _marks_of(self, dst: np.ndarray) -> np.ndarray:
        """The newest shipped receive of each of ``dst`` (0: none yet)."""
        if not len(self._mark_hosts):
            return np.zeros(len(dst), np.int64)
        i = np.searchsorted(self._mark_hosts, dst).clip(0, len(self._mark_hosts) - 1)
        return np.where(self._mark_hosts[i] == dst, self._mark_ns[i], 0)

    def _paths(self, rows: np.ndarray) -> np.ndarray:
        """The number of each row's path (``src``, ``dst``, ``sport``; a new path gets the
        next), all rows at once: hosts numbered, then (src, dst, sport) as one integer."""
        key = _path_keys(self._host_numbers, rows["src"], rows["dst"], rows["sport"])
        before = self._path_numbers.count
        out = self._path_numbers.of(key)
        if self._path_numbers.count > before:
            fresh = out >= before
            ids, first = np.unique(out[fresh], return_index=True)
            grown = np.zeros((self._path_numbers.count, 3), np.int64)
            grown[:before] = self._path_keys[:before]
            grown[ids, 0] = rows["src"][fresh][first]
            grown[ids, 1] = rows["dst"][fresh][first]
            grown[ids, 2] = rows["sport"][fresh][first]
            self._path_keys = grown
        return out

    def _joined(
        self, tx: np.ndarray, rx_ns: np.ndarray, clocks: ClockState | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each matched send's path number, send time and one-way delay on the solver's
        clocks (hosts it has not solved left out)."""
        ok, skew = _skews(tx, clocks)
        if not ok.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        tx, rx_ns, skew = tx[ok], rx_ns[ok], skew[ok]
        self.joined_total += len(tx)
        return self._paths(tx), tx["tx_ns"], (rx_ns - tx["tx_ns"]).astype(np.float64) - skew

    def feed_counters(self, rows: np.ndarray) -> None:
        """``counter`` records of :data:`CONGESTION_COUNTERS` (numpy): their deltas per host."""
        for ts, host, name, delta in zip(rows["ts_ns"].tolist(), rows["host"].tolist(),
                                         rows["name"].tolist(), rows["delta"].tolist(),
                                         strict=True):  # fmt: skip
            d = self._counters.setdefault(host, {}).setdefault(
                name.decode(errors="replace"), collections.deque()
            )
            d.append((ts, max(delta, 0)))
            while d and d[0][0] < ts - COUNTER_SPAN_NS:
                d.popleft()

    def counter_rates(self, hosts: list[int]) -> dict[str, float]:
        """Per second, summed over ``hosts``, over the last ``COUNTER_SPAN_NS`` they
        reported (only the counters some host has)."""
        out: dict[str, float] = {}
        for h in hosts:
            for name, d in self._counters.get(h, {}).items():
                if len(d) < 2:
                    continue
                span = (d[-1][0] - d[0][0]) / 1e9
                if span > 0:
                    out[name] = out.get(name, 0.0) + sum(x for _t, x in list(d)[1:]) / span
        return {k: round(v, 1) for k, v in sorted(out.items())}

    # ---- judging ------------------------------------------------------------------------------
    def windows(self) -> Windows:
        """Every route's newest window, with its excess over its own healthy tail (routes
        still learning their baseline have none: they are fed it, not judged)."""
        path, t_held, d_held = self._held.since(self.newest_ns - HOLD_NS)
        if not len(path):
            return Windows.empty()
        # The paths (src, dst, sport) held (numbered as first fed: no sort of the probes)
        # and each one's spine from the traces
        counts = np.bincount(path, minlength=self._path_numbers.count)
        held = counts > 0
        # The routes (src, dst, spine) some held path is on, numbered in that order, and
        # each held path's route (-1: not traced yet)
        spines, route_all, r_src, r_dst, r_spine = self._routes()
        on_route = route_all[held]
        present = np.zeros(len(r_src) + 1, bool)  # (the last: where -1 lands)
        present[on_route] = True
        present = present[:-1]
        number = np.full(len(r_src) + 1, -1)  # each route's number in this pass (-1: none)
        number[np.flatnonzero(present)] = np.arange(np.count_nonzero(present))
        route_of = number[on_route]
        route_of_path = np.full(len(counts), -1)
        route_of_path[held] = route_of
        src, dst, y_code = r_src[present], r_dst[present], r_spine[present]
        nr = len(src)
        self._dark = set()
        if not nr:
            return Windows.empty()
        # Each probe's route, in the order held; each route's newest probe, its probes
        # over the loss span and lost, and the quantiles of its newest window's (only
        # those sorted, by (route, delay): one sort for all routes, not a call per route)
        rid = route_of_path[path]
        on = rid >= 0
        rid, t_all, d_all = rid[on], t_held[on], d_held[on]
        newest_r = np.full(nr, np.iinfo(np.int64).min)
        np.maximum.at(newest_r, rid, t_all)
        fin = np.isfinite(d_all)
        age = newest_r[rid] - t_all
        in_span = age < LOSS_SPAN_NS
        n_span = np.bincount(rid[in_span], minlength=nr)
        n_lost = np.bincount(rid[in_span & ~fin], minlength=nr)
        win_stats, n_win = _route_quantiles(
            rid, d_all, in_span & fin & (age < WINDOW_NS), nr, QUANTILES
        )
        # Which routes are judged: both ends in known, different racks, both links known,
        # probes not stale (all routes at once: a rack and a (rack, spine) link table)
        ends, end_inv = np.unique(np.concatenate([src, dst]), return_inverse=True)
        racks = sorted(set(self.host_rack.values()))
        rack_ix = {r: i for i, r in enumerate(racks)}
        rack_code = np.array([rack_ix.get(self.host_rack.get(h) or "", -1) for h in ends.tolist()],
                             np.int64)  # fmt: skip
        x, z = rack_code[end_inv[:nr]], rack_code[end_inv[nr:]]
        link = np.empty((len(racks) + 1, len(spines)), object)  # the last row None
        for i, rack in enumerate(racks):
            link[i] = [self.by_ends.get((rack, y)) for y in spines]
        up, down = link[x, y_code], link[z, y_code]  # (rack -1: the row of None)
        ok = (x >= 0) & (z >= 0) & (x != z) & (up != None) & (down != None)  # noqa: E711
        ok &= newest_r >= self.newest_ns - STALE_NS
        stats = win_stats.copy()
        lost, sent = n_lost, n_span
        # A lossy route (a full queue drops most of what crosses it): its newest few
        # received probes, however old, rather than none judged at all.
        # (All such routes at once: a fleet whose probes are sampled, MAX_PROBES, has
        # most of its routes here, and a loop over them took 2 s a pass at 4,096 hosts.)
        few = ok & (n_win < MIN_PROBES)
        their = np.flatnonzero(few[rid])
        their = their[np.lexsort((t_all[their], rid[their]))]  # by (route, time), stable
        r_their = rid[their]
        fine = (t_all[their] > newest_r[r_their] - LOSS_SPAN_NS) & np.isfinite(d_all[their])
        got_rows, got_r = their[fine], r_their[fine]  # received in the span, by (route, time)
        n_fine = np.bincount(got_r, minlength=nr)
        rank = np.arange(len(got_r)) - np.searchsorted(got_r, got_r)  # within its route
        newest_few = np.zeros(len(rid), bool)
        newest_few[got_rows[rank >= n_fine[got_r] - MIN_PROBES]] = True  # the newest few
        for r in np.flatnonzero(few & (n_fine == 0) & (lost >= MIN_PROBES)).tolist():
            self._dark.add((int(src[r]), int(dst[r])))  # every probe lost: pair_excess
        ok &= ~(few & (n_fine < MIN_PROBES) & ~((n_fine > 0) & (lost >= MIN_PROBES)))
        judged_few = few & ok
        if judged_few.any():
            few_stats, _ = _route_quantiles(rid, d_all, newest_few, nr, QUANTILES, like_numpy=True)
            stats[judged_few] = few_stats[judged_few]
        with np.errstate(invalid="ignore"):
            lossy = (lost > 0) & (lost >= LOSSY_SHARE * sent) & (sent - lost >= MIN_PROBES)
        span_tail = np.full(nr, np.nan)
        if lossy.any():  # the tail of what they received over the span
            tails, _ = _route_quantiles(rid, d_all, in_span & fin & lossy[rid], nr, QUANTILES[1:])
            span_tail[lossy] = tails[lossy, 0]
        rows = np.flatnonzero(ok)
        ports_per = np.bincount(route_of[route_of >= 0], minlength=nr)
        spine_r = [spines[y] for y in y_code.tolist()]
        port_of = {h: self._port(h) for h in ends.tolist()}
        links = np.empty((len(rows), 4), object)
        links[:, 0] = [port_of[h] for h in src[rows].tolist()]
        links[:, 1], links[:, 2] = up[rows], down[rows]
        links[:, 3] = [port_of[h] for h in dst[rows].tolist()]
        spine_w = [spine_r[r] for r in rows.tolist()]
        keys = list(zip(src[rows].tolist(), dst[rows].tolist(), spine_w, strict=True))
        # Each route against its own healthy baseline; one with fewer than MIN_BASE healthy
        # windows (new, or congested since its first seconds: a fault already there when
        # the detector started) against its peers': the median baseline and noise of the
        # fleet's fitted routes (every inter-rack route crosses as many hops), when at
        # least MIN_PEERS have one.
        bases = self._bases
        ix = bases.rows(keys)
        fitted = np.flatnonzero(bases.count() >= MIN_BASE)
        peer_med = peer_sigma = np.full(2, np.nan)
        if len(fitted) >= MIN_PEERS:
            peer_med = np.median(bases.med[fitted], axis=0)
            peer_sigma = np.median(bases.sigma[fitted], axis=0)
        own = bases.count(ix)[:, None] >= MIN_BASE
        med = np.where(own, bases.med[ix], peer_med)
        sigma = np.where(own, bases.sigma[ix], peer_sigma)
        based = np.isfinite(med).all(axis=1).reshape(-1, 1)
        st = stats[rows]
        excess = np.where(based, st - med, np.nan)
        thresholds = np.where(based, _thresholds(sigma), np.inf)
        span_excess = np.where(based[:, 0], span_tail[rows] - med[:, 1], np.nan)
        return Windows(
            src[rows], dst[rows], spine_w, links, newest_r[rows],
            sent[rows] - lost[rows], lost[rows], st, excess, thresholds, ports_per[rows],
            span_tail[rows], span_excess, base_rows=ix,
        )  # fmt: skip

    def _routes(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every path numbered so far on its route (src, dst, spine), from the traces: the
        spines (names, sorted), each path's route (-1: not traced), and each route's src,
        dst and spine (its index), routes numbered in (src, dst, spine) order. Rebuilt
        when a path is numbered, a trace moved one (``spine_of.version``, a
        :class:`analytics.detect.spine_map.SpineMap`) or the map is another; with a plain
        dict, on every call."""
        version = getattr(self.spine_of, "version", None)
        key = (id(self.spine_of), version, self._path_numbers.count)
        if version is not None and key == self._routes_key:
            return self._routes_made
        us, ud, up = self._path_keys.T
        spine = list(map(self.spine_of.get, zip(us.tolist(), ud.tolist(), up.tolist(),
                                                 strict=True)))  # fmt: skip
        spines = sorted(y for y in set(spine) if y is not None)
        code: dict[str | None, int] = {y: i for i, y in enumerate(spines)}
        code[None] = -1
        y_path = np.fromiter(map(code.__getitem__, spine), np.int64, len(spine))
        ro = np.lexsort((y_path, ud, us))
        ro = ro[y_path[ro] >= 0]
        new_route = np.ones(len(ro), bool)
        new_route[1:] = (
            (us[ro][1:] != us[ro][:-1]) | (ud[ro][1:] != ud[ro][:-1])
            | (y_path[ro][1:] != y_path[ro][:-1])
        )  # fmt: skip
        route_all = np.full(len(us), -1)
        route_all[ro] = np.cumsum(new_route) - 1
        first = ro[new_route]
        self._routes_key = key
        self._routes_made = (spines, route_all, us[first], ud[first], y_path[first])
        return self._routes_made

    def _port(self, host: int) -> str:
        """The name of ``host``'s access link (its own name where the topology has none)."""
        return self.host_access.get(host) or self.host_names.get(host, str(host))

    def observations(self, now_ns: int) -> list[Observation]:
        wins = self.windows()
        wins = self._last_windows = wins if isinstance(wins, Windows) else Windows.of(list(wins))
        wins = self._cut_off(wins)
        own = self._port_held(wins)
        every = own.take(own.judged & own.settled)
        trips = _round_trips(every)  # once per pass: the naming, holding and saying
        leads = _clock_leads(every)
        full = self._full_ports(own, trips)
        judged = self._looked_at(every)
        hops, a, q = queues(judged)
        found: list[tuple[tuple[str, str], list[RouteWindow], float, float]] = []
        named: dict[tuple[str, str], float] = {}  # hop -> the queue it holds at least (ns)
        masked: dict[tuple[str, str], float] = {}  # hop -> its estimate, not named
        ports: dict[str, int] = {}  # a host's access link named -> that host
        queued_on: set[tuple[str, str]] = set()  # hops past the first test below (a queue)
        into_of: dict[int, list[RouteWindow]] = collections.defaultdict(list)
        away_of: dict[int, list[RouteWindow]] = collections.defaultdict(list)
        for w in judged:
            into_of[w.dst].append(w)
            away_of[w.src].append(w)

        def round_trip(host: int) -> RoundTrip | None:
            trip = trips.get(host)
            if host in full and (trip is None or trip[0] <= trip[1]):
                return full[host]
            return None if trip is None else (*trip, into_of[host], away_of[host])

        # A port whose queue fills and drops, no queue standing (:meth:`_full_ports`), is
        # named first: the routes through it wait at their tails only, too little at
        # their lower quartile for the tomography below to place it — and the hops it
        # names explain the routes it holds up.
        for host, (tq, *_) in sorted(full.items()):
            link = self._port(host)
            ports[link] = host
            named.update({(link, HOST_UP): tq, (link, HOST_DOWN): tq})

        # Largest estimated queue first: a hop is named when NAME_SHARE of the routes
        # across it (every one, below five) waited more than its threshold beyond what
        # the hops already named explain, and more than RESIDUAL of what they explain
        # (their own queues vary that much).
        for c in sorted(range(len(hops)), key=lambda c: (-q[c], hops[c])):
            hop = hops[c]
            if hop in named:
                continue
            crossing = [w for w, on in zip(judged, a[:, c], strict=True) if on]
            slow = [w for w in crossing if w.slow]
            thr = float(np.median([w.thresholds[0] for w in crossing]))
            if q[c] <= thr or len(slow) < MIN_SLOW_PATHS:
                continue
            queued_on.add(hop)
            # A host's own port is named only on its host's round trips: a full queue in
            # front of one host delays every probe to it, which any clock sync reads as
            # that host's clock running ahead (docs/clock.md) — only a host's own port can
            # pass for its clock (a fabric link's routes have peers through other spines).
            # Round trips are clock-free: a wrong clock makes the probes into the host
            # early by what it makes those out of it late.
            if hop[1] in (HOST_UP, HOST_DOWN):
                host = slow[0].src if hop[1] == HOST_UP else slow[0].dst
                rt = round_trip(host)
                if not (rt and rt[0] > rt[1]):
                    self.unsure_total += 1
                    continue
            # A hop already implicated — masked, or on a slow route with a hop named —
            # explains its routes as well as this one (the queues that a named hop's
            # traffic builds downstream): this hop is named only for a slow route that no
            # such hop crosses.
            implicated = set(masked) | {
                h for w in judged if w.slow and any(n in named for n in w.hops) for h in w.hops
            }
            if all(any(h in implicated for h in w.hops if h != hop) for w in slow):
                continue
            left = []
            first_short: RouteWindow | None = None  # the first route that did not wait
            for w in crossing:
                explained = sum(named.get(h, masked.get(h, 0.0)) for h in w.hops)
                if hop[1] not in (HOST_UP, HOST_DOWN):  # (a port's round trips decided)
                    # what its ends' clocks explain: the source's routes in early by e
                    # put its routes out e late (the destination's routes out, its in)
                    explained += _clock_explained(leads, w.src, w.dst)
                if w.queue - explained <= thr + RESIDUAL * explained:
                    first_short = first_short or w
                else:
                    left.append(w.queue - explained)
            if len(left) < max(MIN_SLOW_PATHS, math.ceil(NAME_SHARE * len(crossing))):
                if first_short is not None and first_short.queue > thr:
                    # Within the noise of the queues already named (not cleared by a fast
                    # route): not named, but it still explains its share (a smaller hop
                    # must not take it instead).
                    masked[hop] = float(q[c])
                continue
            if hop[1] in (HOST_UP, HOST_DOWN):  # its direction: _ports below
                named.update({(hop[0], HOST_UP): 0.0, (hop[0], HOST_DOWN): 0.0})
                named[hop] = min(left)
                ports[hop[0]] = slow[0].src if hop[1] == HOST_UP else slow[0].dst
                continue
            twins = [hops[t] for t in range(len(hops)) if np.array_equal(a[:, t], a[:, c])]
            named.update(dict.fromkeys(twins, 0.0))
            named[hop] = min(left)
            slow.sort(key=lambda w: (w.src, w.dst, w.spine))
            found.append((hop, slow, min(left), thr))
            self._twins[hop] = twins
        # A host's port once said stays said while its host's round trips still hold the
        # queue, in a pass where the one-way delays name neither of its directions (the
        # clock solver, which cannot tell a queue every probe to one host waits in from
        # that host's clock running ahead, moves the clock and splits the queue).
        for link, (host, *_) in sorted(self._ports.items()):
            rt = round_trip(host)
            if link not in ports and rt is not None and rt[0] > rt[1]:
                ports[link] = host
                named.update({(link, HOST_UP): rt[0], (link, HOST_DOWN): rt[0]})
        now = self.newest_ns
        # (a host whose last saying _port_held has forgotten is not kept either)
        kept = {link: said for link, said in self._ports.items() if link not in ports
                and now - self._port_said.get(said[0], now - PORT_GAP_NS - 1) <= PORT_GAP_NS}  # fmt: skip
        contended = set(named) | {(link, way) for link in kept for way in (HOST_UP, HOST_DOWN)}
        self._learn(wins, contended, leads)
        # Said once it held a queue PERSIST_NS of probe time, named in this pass and the one
        # before: a queue still filling (or draining) makes routes disagree for a moment,
        # and tomography with them. The half second runs from its first slow routes, not
        # from the first pass that names it: the flows hashed onto a link hold up some of
        # the routes across it before most (one pass named is a moment of tomography).
        said = [h for h, *_ in found] + [(link, "port") for link in (*ports, *kept)]
        self._since = {h: self._since.get(h, now) for h in said}
        self._queued_since = {h: self._queued_since.get(h, now) for h in queued_on}
        # A hop whose every slow route is a full queue that drops (:attr:`RouteWindow.
        # dropping`) is not filling: its losses, known up to KNOWN_WITHIN_NS late, held already.
        self._instants = {h: self._instants.get(h, {}) for h, *_ in found}
        sampled = {hop: _add_instants(self._instants[hop], slow) for hop, slow, *_ in found}
        held_on = [f for f in found
                   if (self._since[f[0]] < now and now - self._queued_since[f[0]] >= PERSIST_NS
                       and sampled[f[0]] >= MIN_INSTANTS)
                   or all(w.dropping for w in f[1])]  # fmt: skip
        out = [self._observation(*f) for f in held_on]
        # A port's direction: where its probes are lost (a full queue drops), clock-free;
        # else where they wait, against the host's clock as it stood while its routes were
        # healthy (a byte-limited queue full of 1400-byte datagrams still takes most small
        # probes: the lab's 20 Mbit/s incast lost under 1 % of them), once the losses of
        # its first second are known and show neither way. Decided when first said and
        # kept while it stays said.
        said_ports: dict[str, tuple[int, str | None, str]] = {}
        for link, host in sorted(ports.items()):
            rt = round_trip(host)
            if rt is None:
                continue
            held = now - self._since[(link, "port")]
            if link in self._ports:
                _, direction, told = self._ports[link]
            else:
                direction, told = _loss_side(rt[2], rt[3]), "probe loss"
                if held < PORT_PERSIST_NS or (
                    direction is None and held < PORT_PERSIST_NS + KNOWN_WITHIN_NS
                ):
                    continue
                if direction is None:
                    direction, told = self._one_way_side(host, rt[2], rt[3])
            said_ports[link] = (host, direction, told)
            out.append(self._port_observation(link, host, direction, told, *rt,
                                              standing=rt is not full.get(host)))  # fmt: skip
        self._port_said.update({host: now for host, *_ in said_ports.values()})
        self._ports = {**kept, **said_ports}
        said_hops = {t for f in held_on for t in self._twins[f[0]]}
        said_hops |= {(link, way) for link in self._ports for way in (HOST_UP, HOST_DOWN)}
        self._hold_pairs(every, trips, leads, said_hops)
        busy = set(ports.values()) | {h for h, *_ in self._ports.values()}
        self._note_healthy(trips, busy, leads)
        return out

    def _full_ports(
        self, wins: Windows, trips: dict[int, tuple[float, float]]
    ) -> dict[int, RoundTrip]:
        """Hosts whose port holds a queue that fills and drops rather than stands: their
        round trips at the tail (:func:`_tail_trips`) above its threshold while those at
        the lower quartile (``trips``) are not, and the probes one way of the port lost
        (:func:`_loss_side`: a full queue drops, clock-free) — host -> its tail round trip,
        the threshold, its judged routes in and out. Every route in (or out) waits in a
        port's queue, those from the host's rack-mates too: a fabric link holds up only
        the routes through its spine, and the least of the spines' (:func:`_tail_trips`)
        leaves it out; a silent drop loses probes without the wait; a busy port without
        loss is busy, not full. Routes to or from a host whose port is full already are
        left out: its peers' routes to it wait and lose in its queue."""
        out: dict[int, RoundTrip] = {}
        # Only hosts whose probes one way are lost (:func:`_loss_side` decides below): a
        # healthy fleet has none, and its pass pays for nothing more.
        ok = wins.judged
        hosts = np.union1d(wins.src, wins.dst)
        lost, got = np.where(ok, wins.lost, 0), np.where(ok, wins.received, 0)
        lossy = np.zeros(len(hosts), bool)
        for ends in (wins.src, wins.dst):
            at = np.searchsorted(hosts, ends)
            n_lost = np.bincount(at, lost, len(hosts))
            lossy |= n_lost >= PORT_LOSS * np.maximum(n_lost + np.bincount(at, got, len(hosts)), 1)
        if not lossy.any():
            return out
        near = hosts[lossy]
        judged = wins.take(ok & wins.touching(near))
        said = {h for h, *_ in self._ports.values()}
        # hosts whose port holds a queue already (standing, said, or named here): their
        # routes are theirs — a peer's routes to a full port wait and lose in it
        busy = said | {h for h, (q, thr) in trips.items() if q > thr}
        tails = _tail_trips(judged)

        def passes(trip: tuple[float, float, float] | None, host: int) -> bool:
            # named when every spine's routes wait; once said, held while the typical does
            return trip is not None and (trip[1] if host in said else trip[0]) > trip[2]

        for host in sorted(tails, key=lambda h: -tails[h][0]):
            trip = tails[host]
            if (host in busy and host not in said) or not passes(trip, host):
                continue
            cols = judged
            others = np.fromiter(busy - {host}, np.int64)
            if len(others):
                cols = judged.take(~judged.touching(others))
                again = _tail_trips(cols).get(host)
                if again is None or not passes(again, host):
                    continue
                trip = again
            _, typical, thr = trip
            into = [cols.route(i) for i in np.flatnonzero(cols.dst == host).tolist()]
            away = [cols.route(i) for i in np.flatnonzero(cols.src == host).tolist()]
            if _loss_side(into, away) is not None:
                out[host] = (typical, thr, into, away)  # the size: the typical route's
                busy.add(host)
        return out

    def _cut_off(self, wins: Windows) -> Windows:
        """``wins`` without the routes into or out of a host whose own link (or leaf) was
        down in the last ``LOSS_SPAN_NS + KNOWN_WITHIN_NS``: what they lost, and the probes
        held while the host was cut off and sent on when it came back, are the outage's —
        paged as a flap, not a queue — and no healthy baseline either. Seen in the demo
        lab (2026-12-06): leaf3's host links down ~6 s; 2 s after they were back,
        "h3-2-leaf3 (leaf→host) … a full queue that drops, tail ≥651922 µs … 62 % lost"."""
        down = self.hosts_down(self.newest_ns - LOSS_SPAN_NS - KNOWN_WITHIN_NS)
        if not down or not len(wins):
            return wins
        ends = np.fromiter(down, np.int64, len(down))
        return wins.take(~wins.touching(ends))

    def _port_held(self, wins: Windows) -> Windows:
        """``wins`` with the routes into or out of a host whose port was said within the
        last ``LOSS_SPAN_NS + KNOWN_WITHIN_NS`` judged on their own newest window, not held
        slow by their span (:attr:`RouteWindow.dropping`) alone: those losses and that tail
        were the port's queue. Seen in the lab (three racks of one host): the incast at
        h1-1's port drained, its routes in through spine2 had lost 23 % of their probes over
        their span and through spine1 fewer than ``LOSSY_SHARE``; the port's round trips
        no longer held a queue, and leaf1-spine2 (spine→leaf) was paged on those two
        routes' span — "a standing queue of ≥28577 µs" — while their newest seconds were
        early, not late (the clock solver still held the offset that had absorbed it)."""
        now = self.newest_ns
        recent = {
            h for h, t in self._port_said.items() if now - t <= LOSS_SPAN_NS + KNOWN_WITHIN_NS
        }
        self._port_said = {h: self._port_said[h] for h in recent}
        if not recent or not wins.dropping.any():
            return wins
        ends = np.fromiter(recent, np.int64, len(recent))
        near = wins.touching(ends)
        return wins.unheld(wins.dropping & ~wins.queued & near)

    def _looked_at(self, judged: Windows) -> list[RouteWindow]:
        """The judged routes the naming below reads, as :class:`RouteWindow` (none in a
        healthy pass): those crossing a hop some slow route crosses — the hops it can
        name, each with every route across it — and every route in or out of a host a slow
        route ends at or whose port is said (its round trips). In judged order: the
        tomography's rows are as over every judged route (the others cross none of its
        hops)."""
        if not judged.slow.any() and not self._ports:
            return []
        hosts = set(judged.src[judged.slow].tolist()) | set(judged.dst[judged.slow].tolist())
        hosts |= {h for h, *_ in self._ports.values()}
        ends = np.fromiter(hosts, np.int64, len(hosts))
        near = judged.crosses(judged.hops(judged.slow))
        near |= judged.touching(ends)
        return [judged.route(i) for i in np.flatnonzero(near).tolist()]

    def _note_healthy(
        self,
        trips: dict[int, tuple[float, float]],
        busy: set[int],
        leads: dict[tuple[int, str], float],
    ) -> None:
        """Keep a copy of the solver's clocks when they changed, and note the hosts whose
        routes are healthy this pass: round trips without a queue (``trips``, of
        :func:`_round_trips`), routes neither way early (the clock the routes' baselines
        were learnt with still holds); ``busy``: hosts whose port is named."""
        now, c = self.newest_ns, self._clocks
        if c is None or not len(c.hosts):
            return
        copies = self._clock_copies
        while copies and copies[0][0] < now - CLOCKS_KEEP_NS:
            copies.popleft()
        last = copies[-1] if copies else None
        if (
            last is None
            or last[1] != c.ref_ns
            or not np.array_equal(last[2], c.hosts)
            or not np.array_equal(last[3], c.offset_ns)
            or not np.array_equal(last[4], c.drift)
        ):
            copies.append((now, c.ref_ns, c.hosts.copy(), c.offset_ns.copy(), c.drift.copy()))
        for h, (q, thr) in trips.items():
            if q <= thr and h not in busy and (h, "in") not in leads and (h, "out") not in leads:
                self._healthy_at[h] = now

    def _clock_moved(self, host: int) -> float | None:
        """How far (ns) the clock solver has moved ``host``'s clock against its peers'
        since the host's routes were last healthy — what its routes in now show less, and
        its routes out more, than they wait (a clock sync takes a queue every probe into
        one host waits in for that host's clock running ahead). None: never seen healthy,
        or longer ago than the clocks kept, or not solved now."""
        c, seen = self._clocks, self._healthy_at.get(host)
        if c is None or seen is None:
            return None
        then = None
        for copy in self._clock_copies:  # the solution in force at that pass
            if copy[0] <= seen:
                then = copy
        if then is None:
            return None
        _, ref_then, hosts_then, off_then, drift_then = then
        common, i_now, i_then = np.intersect1d(c.hosts, hosts_then, return_indices=True)
        k = np.flatnonzero(common == host)
        if not len(k) or len(common) < 2:
            return None
        now = float(self.newest_ns)
        moved = (c.offset_ns[i_now] + c.drift[i_now] * (now - c.ref_ns)) - (
            off_then[i_then] + drift_then[i_then] * (now - ref_then)
        )
        # against the peers': the solver's gauge (mean zero) moves them all a little
        return float(moved[k[0]] - np.median(np.delete(moved, k[0])))

    def _one_way_side(
        self, host: int, into: list[RouteWindow], away: list[RouteWindow]
    ) -> tuple[str | None, str]:
        """The direction of a host's port that holds the queue, from the one-way delays:
        each way's median standing queue, put back on the host's clock as it stood while
        its routes were healthy — one way beyond its threshold and ``ONE_WAY`` times the
        other, which is not early either; and the words saying so. (None, "") when the
        clock then is not known or the two ways do not differ so."""
        moved = self._clock_moved(host)
        if moved is None:
            return None, ""
        q_in = float(np.median([w.excess[0] for w in into])) + moved
        q_out = float(np.median([w.excess[0] for w in away])) - moved
        t_in = float(np.median([w.thresholds[0] for w in into]))
        t_out = float(np.median([w.thresholds[0] for w in away]))
        name = self.host_names.get(host, str(host))
        words = (
            f"the probes to {name} waited {q_in / 1e3:.0f} µs, those from it "
            f"{q_out / 1e3:.0f} µs, on {name}'s clock as it stood while its routes were "
            f"healthy (the clock solver had moved it {moved / 1e3:+.0f} µs since)"
        )
        if q_in > t_in and abs(q_out) <= max(t_out, q_in / ONE_WAY):
            return HOST_DOWN, words
        if q_out > t_out and abs(q_in) <= max(t_in, q_out / ONE_WAY):
            return HOST_UP, words
        return None, ""

    def _learn(
        self,
        wins: Windows,
        contended: set[tuple[str, str]],
        leads: dict[tuple[int, str], float],
    ) -> None:
        """Healthy windows feed their route's baseline (one per window length). A window
        far above what the fleet's other routes show now is not learnt as healthy: every
        inter-rack route crosses the same number of hops, so a route congested since
        before its baseline was fitted stands out against the others.

        Nor is one far *below* them, or one into or out of a host with a clock lead
        (``leads``, :func:`_clock_leads`): a queue only delays, so a route earlier than
        the fleet's says the clock solver holds one of its ends' clocks wrong — a clock
        stepped, until the solver's next window (3-5 s). Seen in the lab (2026-12-05): a
        fleet a few seconds old, whose baselines held three windows, learnt five seconds
        of a stepped host's routes out 300 µs early; once the solver caught up they read
        300 µs late against that baseline for good, and its port was paged."""
        st = wins.stats
        fin = np.isfinite(st).all(axis=1)
        lows = st[fin, 0]
        ceiling, floor = float("inf"), -float("inf")
        if len(lows) >= 4:
            mid = float(np.median(lows))
            spread = max(FLOOR_NS, K_SIGMA * 1.4826 * float(np.median(np.abs(lows - mid))))
            ceiling, floor = mid + spread, mid - spread
        bases = self._bases
        ix = wins.base_rows  # (windows made by hand: their routes' rows looked up here)
        if ix is None:
            ix = bases.rows(
                list(zip(wins.src.tolist(), wins.dst.tolist(), wins.spine, strict=True))
            )
        ok = fin & (st[:, 0] <= ceiling) & (st[:, 0] >= floor) & (wins.lost == 0) & ~wins.slow
        ok &= wins.newest - bases.last_ns[ix] >= WINDOW_NS
        if leads:
            led = np.fromiter({h for h, _ in leads}, np.int64)
            ok &= ~wins.touching(led)
        if contended:
            ok &= ~wins.crosses(contended)
        rows = np.flatnonzero(ok)
        if len(np.unique(ix[rows])) == len(rows):
            bases.append(ix[rows], st[rows], wins.newest[rows])
            return
        for i in rows.tolist():  # one route twice (windows made by hand): in turn
            if wins.newest[i] - bases.last_ns[ix[i]] >= WINDOW_NS:
                bases.append(ix[i : i + 1], st[i : i + 1], wins.newest[i : i + 1])

    def _between(self, routes: list[RouteWindow]) -> tuple[list[str], list[str], list[str]]:
        """The pairs of ``routes`` ("h1-1→h2-1"), the jobs between those hosts now, and the
        hosts those jobs run between."""
        pairs = sorted(
            {f"{self.host_names.get(w.src, w.src)}→{self.host_names.get(w.dst, w.dst)}"
             for w in routes}
        )  # fmt: skip
        on = {(w.src, w.dst): self.jobs_between(w.src, w.dst) for w in routes}
        jobs = sorted(set().union(*on.values()))
        job_hosts = sorted({self.host_names.get(h, str(h)) for (s, d), j in on.items()
                            if j for h in (s, d)})  # fmt: skip
        return pairs, jobs, job_hosts

    def _observation(
        self, hop: tuple[str, str], slow: list[RouteWindow], queue: float, thr: float
    ) -> Observation:
        link, direction = hop
        twins = self._twins.get(hop, [hop])
        excesses = sorted(w.tail_excess for w in slow)
        med_us = excesses[len(excesses) // 2] / 1e3
        lost = sum(w.lost for w in slow)
        loss = _loss(slow)
        pairs, jobs, job_hosts = self._between(slow)
        leaf = next((lf for (lf, _y), name in self.by_ends.items() if name == link), "")
        behind = sorted(h for h, r in self.host_rack.items() if r == leaf)
        rates = self.counter_rates(behind)
        cited = [f"{_COUNTER_WORDS[k]} {v:g}/s" for k, v in rates.items() if k in _COUNTER_WORDS]
        label = " or ".join(f"{lk} ({dr})" for lk, dr in twins)
        summary = (
            f"{label} is contended: a standing queue of ≥{queue / 1e3:.0f} µs; p90 one-way delay "
            f"+{med_us:.0f} µs over healthy on {len(slow)} route(s) crossing it "
            f"({len(pairs)} pair(s), threshold {thr / 1e3:.0f} µs)"
            + (f", {loss:.0%} of their probes lost" if lost else "")
            + (f"; jobs between these hosts: {', '.join(jobs[:6])}" if jobs else "")
            + (f"; NICs behind {leaf}: {', '.join(cited)}" if cited else "")
        )
        return Observation(
            kind="contention",
            key=f"{link} {direction}",
            score=min(1.0, 0.5 + 0.1 * len(slow) + (0.2 if lost else 0.0)) / len(twins),
            summary=summary,
            link=link,
            evidence={
                "direction": direction,
                "candidates": sorted({lk for lk, _dr in twins}) if len(twins) > 1 else [],
                "candidate_hops": [f"{lk} {dr}" for lk, dr in twins] if len(twins) > 1 else [],
                "confidence": round(1 / len(twins), 2),
                "slow_paths": len(slow),
                "pairs": pairs[:20],
                "jobs": jobs[:20],
                "job_hosts": job_hosts[:64],  # the hosts those jobs run between
                "queue_us": round(queue / 1e3, 1),
                "median_excess_ms": round(med_us / 1e3, 4),
                "max_excess_ms": round(excesses[-1] / 1e6, 4),
                "threshold_us": round(thr / 1e3, 1),
                "lost_probes": lost,
                "loss": round(loss, 3),
                "counters_behind": {
                    "hosts": [self.host_names.get(h, str(h)) for h in behind],
                    "per_s": rates,
                },
                "source": "corrected one-way delays per route (p90 per half second) against its "
                "healthy baseline, paths from traces, tomography by queue size",
            },
        )

    def _port_observation(
        self, link: str, host: int, direction: str | None, told: str, queue: float, thr: float,
        into: list[RouteWindow], away: list[RouteWindow], standing: bool = True,
    ) -> Observation:  # fmt: skip
        """A queue at ``host``'s own port (:func:`_round_trip`): its size from the host's
        round trips, its direction from where the probes are lost or where they waited
        (``told``, in words; None: unknown), each route's excess as its own one-way excess
        plus the other way's median (the host's clock error cancels). ``standing``: the
        round trips are at the lower quartile (a queue that stands), else at the tail (one
        that fills and drops, :meth:`_full_ports`)."""
        side, other = (away, into) if direction == HOST_UP else (into, away)
        back = float(np.median([w.excess[1] for w in other]))
        excesses = sorted(float(w.excess[1]) + back for w in side)
        med_us = excesses[len(excesses) // 2] / 1e3
        loss_in, loss_out = _loss(into), _loss(away)
        lost = sum(w.lost for w in side)
        loss = loss_out if direction == HOST_UP else loss_in
        name = self.host_names.get(host, str(host))
        pairs, jobs, job_hosts = self._between(side)
        rates = self.counter_rates([host])
        cited = [f"{_COUNTER_WORDS[k]} {v:g}/s" for k, v in rates.items() if k in _COUNTER_WORDS]
        label = f"{link} ({direction})" if direction else f"{link} ({name}'s port, either way)"
        how = (
            f"{loss:.0%} of the probes {'to' if direction == HOST_DOWN else 'from'} {name} "
            f"lost, {loss_out if direction == HOST_DOWN else loss_in:.0%} the other way"
            if direction and told == "probe loss"
            else f"when first named, {told}"
            if direction
            else "no probes lost to tell which way, and no clock of "
            f"{name}'s from while its routes were healthy to tell it by their delays: a queue "
            f"every probe one way waits in looks like {name}'s clock to any clock sync"
        )
        what = (
            f"a standing queue of ≥{queue / 1e3:.0f} µs"
            if standing
            else f"a full queue that drops, its tail ≥{queue / 1e3:.0f} µs"
        )
        summary = (
            f"{label} is contended: {what} in {name}'s "
            f"round trips ({len(into)} route(s) in, {len(away)} out; threshold "
            f"{thr / 1e3:.0f} µs); {how}"
            + (f"; jobs between these hosts: {', '.join(jobs[:6])}" if jobs else "")
            + (f"; {name}'s NIC: {', '.join(cited)}" if cited else "")
        )
        both = [f"{link} {HOST_DOWN}", f"{link} {HOST_UP}"]
        return Observation(
            kind="contention",
            key=f"{link} {direction or 'port'}",
            score=min(1.0, 0.5 + 0.1 * len(side) + (0.2 if lost else 0.0)),
            summary=summary,
            link=link,
            evidence={
                "host": name,  # the culprit in /v1/live, its peers affected
                "direction": direction or "unknown",
                "direction_from": ("probe loss" if told == "probe loss" else "one-way delays")
                if direction
                else "",
                "candidates": [],
                "candidate_hops": [] if direction else both,
                "confidence": 1.0,
                "slow_paths": len(side),
                "pairs": pairs[:20],
                "jobs": jobs[:20],
                "job_hosts": job_hosts[:64],
                "queue_us": round(queue / 1e3, 1),
                "median_excess_ms": round(med_us / 1e3, 4),
                "max_excess_ms": round(excesses[-1] / 1e6, 4),
                "threshold_us": round(thr / 1e3, 1),
                "lost_probes": lost,
                "loss": round(loss, 3),
                "loss_in": round(loss_in, 3),
                "loss_out": round(loss_out, 3),
                "counters_behind": {"hosts": [name], "per_s": rates},
                "queue_at": "lower quartile" if standing else "tail",
                "source": "the host's round trips (the least standing queue of its routes "
                "in plus the least out, clock-free; at the tail for a queue that fills and "
                "drops), tomography of one-way delays for the place, "
                "probe loss (else the one-way delays on the host's healthy clock) for the "
                "direction",
            },
        )


_TX = np.dtype([("src", "<i8"), ("seq", "<u8"), ("dst", "<i8"), ("sport", "<u2"),
                ("tx_ns", "<i8")])  # fmt: skip
_RX = np.dtype([("src", "<i8"), ("seq", "<u8"), ("dst", "<i8"), ("rx_ns", "<i8")])
