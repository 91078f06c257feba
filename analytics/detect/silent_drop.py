"""Silent drops: a switch that discards part of what crosses it while links and routing stay up.

A stale FIB entry, a bad line card or a mis-programmed ACL drops some destinations, or a
share of the flows, at one switch: no port goes down, BGP keeps advertising, no ICMP is
sent. Only the probes notice (Pingmesh, 007, NetBouncer): this module judges every probe
sent (``probe_tx``) received or lost, per path — (src, dst, UDP source port): one 5-tuple,
so one ECMP path — and localises the loss on the paths the traces say each 5-tuple crosses
(:mod:`analytics.detect.paths`, ``spine_of``).

**Lost, within seconds.** A probe is *lost* once its destination's collector has shipped
probe_rx rows received ``MARGIN_S`` after the probe was sent (the destination's watermark),
or its own sends of ``SEND_LAG_NS`` later (a host that receives nothing but sends on),
and none of them is that probe: a host that ships nothing judges nothing (a host that is
down is a flap, not a drop; its own port counters say so). With 1-s segments that is
1–2 s after the probe. A pair none of whose probes was ever received has not started
(a new buddy its destination's collector does not take yet) and is not judged. A *lossy*
path lost its newest probes in a row, at least ``MIN_LOST`` of them sent over at least
three send rounds (``MIN_SPREAD_NS``); a *clean* one lost none in the last ``WINDOW_S``.

**Tomography.** Each lossy path is explained by a place it crosses: a switch (all its
flows), a switch towards one destination (a spine towards host D: every path X → D
through it; or a sender's leaf towards D: every path from its rack to D), a leaf–spine
link in one direction — or a host (all that a host sends, all it receives, or both: a
host problem, not a switch's; never reported here — unless the host's own port counted
nothing in while its link stayed up: then its leaf towards it,
:meth:`SilentDrops._unreached`). A place that drops a share q of the flows through it
makes each of its paths lossy with probability q; greedily, the place whose lossy and
clean paths that explains best against the background (:func:`evidence`, a
log-likelihood ratio less the cost of naming one more place) is taken, its lossy paths
explained, until no place earns its cost or explains ``MIN_PATHS`` more. So a spine
dropping every flow to one host is named with the host (all its paths there lost, none
clean), and one dropping 30 % of all its flows as the spine (a few lossy paths towards
one host among its clean ones earn less). Places that explain exactly the same paths
cannot be told apart and are named together.

**Not a flap, not contention.** A path whose traced spine changed after its loss began
moved (a link went and routing took it out: :mod:`analytics.detect.paths` names that
flap), and paths over a link the path tomography suspects or a remediation took out are
not judged. When the probes that do get through on a link-direction the lossy paths cross
wait (median) longer than ``RISE_NS`` over their pair's floor, the loss is a full queue
(:mod:`analytics.detect.contention`), not a silent drop, and nothing is reported. A place
that is a link-direction alone (everything through it lost) is named only once its paths
have been lossy ``LINK_HOLD_NS``: a saturated shallow queue looks the same at its onset.

The class is a rule the model does not re-judge: the forest was trained on the other
classes only (docs/detect.md).

Over 500 lines: one signal; loss judgement, tomography and queue check share its path state.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from analytics.detect.anomalies import Observation

log = logging.getLogger("clockmesh.detect.silent_drop")

KIND = "silent_drop"
MARGIN_S = 0.3  # the destination's clock may be this far ahead of the sender's
# A host's collector records what it receives and what it sends in one loop and ships
# both in the same segments: once it has shipped a send of time t, it has shipped what it
# received before t less this (its receive path behind its sends, at most) — a host that
# receives nothing at all but sends on still judges the probes sent to it
SEND_LAG_NS = 1_000_000_000
WINDOW_S = 4.0  # probes judged over the last this many seconds (send time)
RECENT_S = 2.0  # ... and their delay over the last this many
HISTORY_S = 30.0  # received delays kept for each pair's floor
PENDING_S = 30.0  # a probe its destination never judged is forgotten after this
MIN_LOST = 5  # a lossy path lost its newest this many probes in a row ...
# ... sent over three send rounds at least: a blackout of a second or two (a control
# plane hiccup, a receiver's collector restarting) is not a silent drop
MIN_SPREAD_NS = 1_500_000_000
# A probe lost to a host that neither sent nor received any probe (judged) in the
# DEAF_NS before it is not judged: that host's collector was not running (restarted by a
# deploy, crashed) or its link was down, not a switch dropping. Shorter than
# MIN_SPREAD_NS, so a host's silence of any length makes no lossy path. A host behind a
# switch that drops everything still sends (its sends are recorded, lost or not).
DEAF_NS = 1_000_000_000
MIN_PATHS = 2  # lossy paths a place must explain to be named
# ... from this many source hosts: a switch that drops traffic drops it from every sender
# whose paths cross it; one sender's paths alone (a new buddy's first seconds in
# `make demo`: 12 of 12 probes on its two paths through spine1, every other path clean)
# are that pair's problem, not a switch's
MIN_SOURCES = 2
# ... and a host's way out, to this many destinations at least (a random share lost on the
# paths of one pair or two is those pairs', not the host's port)
MIN_DESTINATIONS = 3
BACKGROUND = 1e-3  # chance that a path of a healthy fabric looks lossy
# A place that is one link-direction and nothing narrower (every path through it losing
# its newest probes) is named only once its paths have been lossy this long: the onset of a
# saturated shallow queue looks the same for a few seconds (on/off bulk keeps it full or
# empty, so what gets through does not wait, what arrives while it is full is dropped)
# until probes caught while it fills show the delay (lab, 50 Mbit/s, 500-µs buffer: 4 s).
LINK_HOLD_NS = 6_000_000_000
PLACE_COST = 10.0  # nats: what naming one more place must earn (2 paths all lost: 13.8)
# Narrower places named this recently keep explaining their lossy paths: a broader place
# whose lossy paths they all explain is not named (a heal's paths recover unevenly)
NAMED_HOLD_NS = 15_000_000_000


def rate_evidence(lost: float, sent: float) -> float:
    """What naming a place that drops a random share of its packets earns, in nats: how
    much better its rate q = lost / sent explains ``lost`` of ``sent`` probes than
    GRAY_BACKGROUND does (binomial), less GRAY_COST."""
    if lost <= 0 or sent <= 0:
        return -GRAY_COST
    q = min(lost / sent, 1 - 1e-12)
    b = GRAY_BACKGROUND
    if q <= b:
        return -GRAY_COST
    return lost * math.log(q / b) + (sent - lost) * math.log((1 - q) / (1 - b)) - GRAY_COST


def in_a_burst(per_s: np.ndarray) -> bool:
    """Whether a place's lost probes, per second of the window, were lost in a burst, not
    at random: one second holds over :data:`GRAY_MAX_SECOND_SHARE` of them, more than a
    random share losing at the other seconds' mean rate (since the first lossy second)
    reaches in any of those seconds but with chance :data:`GRAY_BURST_P`."""
    from scipy.special import pdtrc  # P(X > k), X Poisson; lazy: the CLI's start stays light

    total, most = int(per_s.sum()), int(per_s.max(initial=0))
    if not total or most <= GRAY_MAX_SECOND_SHARE * total:
        return False
    seconds = len(per_s) - int(np.flatnonzero(per_s)[0])
    if seconds < 2:
        return True
    return seconds * float(pdtrc(most - 1, (total - most) / (seconds - 1))) < GRAY_BURST_P


def said_rate(q: float, lo: float = 0.0, hi: float = 1.0) -> float:
    """The step of ``_SAID`` nearest ``q`` (in ratio) among those in its interval
    ``[lo, hi]``; else ``q`` to the fewest significant figures (two or more) that keep it
    in the interval."""
    inside = [x for x in _SAID if lo <= x <= hi]
    if inside:
        return min(inside, key=lambda x: (abs(x - q), x))
    return next((r for d in (2, 3, 4) if lo <= (r := float(f"{q:.{d}g}")) <= hi), q)


def interval95(lost: int, sent: int) -> tuple[float, float]:
    """Wilson's 95 % interval of the rate ``lost / sent``."""
    if sent <= 0:
        return 0.0, 1.0
    z, q = 1.96, lost / sent
    mid = (q + z * z / (2 * sent)) / (1 + z * z / sent)
    half = z * math.sqrt(q * (1 - q) / sent + z * z / (4 * sent * sent)) / (1 + z * z / sent)
    return (0.0 if lost <= 0 else max(0.0, mid - half),
            1.0 if lost >= sent else min(1.0, mid + half))  # fmt: skip


def evidence(lossy: int, clean: int) -> float:
    """What naming a place earns, in nats: how much better "it drops a share q = lossy /
    (lossy + clean) of the flows through it" explains its paths than the background
    (each path lossy with probability BACKGROUND), less PLACE_COST. Every path lost
    through a place is strong evidence; a few among many clean ones are weak."""
    n = lossy + clean
    if not lossy:
        return -PLACE_COST
    q = lossy / n
    fit = lossy * math.log(q) + (clean * math.log(1 - q) if clean else 0.0)
    null = lossy * math.log(BACKGROUND) + clean * math.log(1 - BACKGROUND)
    return fit - null - PLACE_COST


# A place that drops a random share of the packets crossing it — a bad optic or cable, a
# port counting CRC errors: every flow through it loses some, none loses many in a row, so
# no path ever looks lossy above. Judged on the probes' loss rate per place over
# GRAY_WINDOW_NS (shorter than the runner's FABRIC_SETTLE_S: a flap's lost probes have
# left it when judging resumes), against GRAY_BACKGROUND, by the same tomography; named
# once chosen for GRAY_HOLD_NS (no gap over GRAY_GAP_NS) with no queue on its paths — a
# saturated shallow queue's onset drops what crosses it before the delay shows.
GRAY_WINDOW_NS = 8_000_000_000
GRAY_BACKGROUND = 1e-4  # a healthy place loses this share of the probes crossing it, at most
GRAY_MIN_LOST = 10  # lost probes a place must explain (in one pass of its hold) ...
GRAY_COST = 20.0  # ... and nats it must earn over the background
GRAY_HOLD_NS = 6_000_000_000
GRAY_GAP_NS = 3_000_000_000
# A place is chosen, and its hold runs, with GRAY_KEEP_LOST lost probes (and its cost
# earned) while it lost some in the window's newest GRAY_FRESH_SECONDS seconds (the
# newest ~1.5 s of which are not yet judged); it is named only once it explained
# GRAY_MIN_LOST in one pass of its hold. The detect lab's 15 % of ~12 probes a second
# loses ~11.7 in the window's judged ~6.5 s: a hold that began only at 10 began again
# when the count dipped under it for over GRAY_GAP_NS (named in 19.9 s and 23.8 s,
# 2026-12-07), or began late when it stood at 7-9 for 10 s (22.6 s in CI, the same
# day). A loss that ended is not kept: its window empties from the newest seconds first.
GRAY_KEEP_LOST = 5
GRAY_FRESH_SECONDS = 4
# ... and spread over the window: lost in GRAY_MIN_SECONDS of its seconds at least, no
# second holding over GRAY_MAX_SECOND_SHARE of them. A burst (a rack's collectors
# restarting, a control plane's hiccup of a few rounds, paths coming back unevenly after
# a heal) loses many probes in a second or three: not a random share.
GRAY_MIN_SECONDS = 5
_GRAY_FIRST = {"link": 0, "to": 1, "switch": 2}  # of places that cannot be told apart
# The rate a summary says: a whole step of its decade (0.1-0.9 %, 1-9 %, then tens to
# 90 %) inside the rate's 95 % interval, kept while the interval holds it (an 8-s
# window's count varies by ±20 % at the demo's 2 %: a summary that followed it would
# store a row every pass, and say a different number every second). A 1-2-5 scale said a
# hand-made 4 % share, measured 3.7 % [3.0, 4.5], "about 5 %": outside its own interval.
_SAID = tuple(round(d * 10.0**e, 3) for e in (-3, -2, -1) for d in range(1, 10))
GRAY_MAX_SECOND_SHARE = 0.4
# ... and beyond chance: a second a random share losing at the other seconds' mean rate
# (Poisson) would reach in any of them with less than this probability. At the detect
# lab's 15 % (~1.8 probes lost a second through the port) a second of 5 among a
# fault's first dozen lost is chance, and was held as a burst until diluted.
GRAY_BURST_P = 1e-3
GRAY_MAX_PLACES = 4  # places named per pass, at most
# A host's received share is its link's only while its collector's socket dropped nothing
# (its rx_kernel_drops, shipped a second apart) over the window: a collector not keeping
# up loses probes sent to it at random too
SOCKET_KEEP_NS = 20_000_000_000
SOCKET_BEFORE_NS = 2_000_000_000  # the count this long before the window: where it began
# ... and not (nearly) all of them: a place losing every probe is the streak rule's, once
# its paths have lost enough in a row (the demo lab: a host whose NIC sent nothing was
# first paged as dropping "about 100 % of what it sends, at random")
GRAY_MAX_SHARE = 0.9
# judged this often, the last judgement repeated between (it costs 2-3x the rest of the
# pass; its window, hold and gap are seconds long)
GRAY_EVERY_NS = 1_000_000_000

RISE_NS = 100_000.0  # received probes this much over their pair's floor: a queue, not a drop
# A probe lost while its coded twin (same path, sent ~0.1 ms apart) waited this long over
# its pair's floor was lost at a full queue, not at random: a random share is judged
# without it. Healthy jobs on shallow buffers drop a few probes at their queue's brief
# peaks, with the path's median flat (the detect lab module, 2026-12-05: 8 of the 13
# probes lost through one busy leaf in 8 s had a twin 135-224 µs late, and it was paged
# as a bad optic); a bad optic's losses have twins as late as any probe on the path.
TWIN_QUEUED_NS = 50_000.0
QUEUE_MEMORY_S = 10.0  # a link-direction that queued is not judged for drops this long
MAX_PATHS = 5_000  # paths judged; beyond, a stable hash-sample of them
FORGET_S = 3600.0  # a pair that delivered nothing this long may be forgotten (_started)
# a pair is judged this long after its first delivered probe: new buddies in `make demo`
# lost every probe on some of their paths for their first seconds (cause unknown), and
# were paged as silent drops at the leaves and spines they crossed
WARMUP_NS = 10_000_000_000
# ... and a pair that never delivered is judged once it has lost everything this long:
# new buddies lost their first ~3 s, a leaf black-holing a host before the ops box
# (re)started loses the pair for good
UNSTARTED_NS = 30_000_000_000
# A destination's own port that counted (nearly) nothing in over RX_SPAN_NS while its link
# stayed up and it kept sending: what every path into it lost was dropped before its
# NIC counted it — its leaf towards it (a black-holed /32 for its own host), not its
# socket or collector (those count the packets in, then lose them)
RX_SPAN_NS = 3_000_000_000
RX_SHARE = 0.1  # "nearly nothing": fewer than this share of the probes sent to it ...
RX_FLOOR = 3  # ... or than this many packets (the leaf's own ARP)
# A host cut off whose port counted out fewer than this share of the probes it sent: they
# were lost before its port (its NIC, its filter, its egress queue), not after it
TX_PART = 0.5
# the ways a host is cut off from the fabric (evidence.direction)
OUT, IN, BOTH = "host→leaf", "leaf→host", "both ways"
UP = 6  # operstate "up" (RFC 2863, collector.sysfs_counters.OPERSTATE)
PORT_COUNTERS = ("rx_packets", "tx_packets", "operstate", "carrier_down_count")
_MIX = np.uint64(0x9E3779B97F4A7C15)
TABLES = ("probe_tx", "probe_rx")
_TX = ("src", "dst", "sport", "seq", "tx_ns")
_RX = ("src", "dst", "sport", "seq", "rx_ns")


def columns(name: str, data: pa.Table, sample_bits: int = 0) -> dict[str, np.ndarray]:
    """The columns this module reads of a commit's ``probe_tx``/``probe_rx``, copied (the
    commit's buffers are reused): only the sampled paths' rows (:attr:`SilentDrops.
    sample_bits`), so a large fleet costs the commit thread little."""
    names = _TX if name == "probe_tx" else _RX
    view = {c: data.column(c).to_numpy() for c in names}  # zero-copy where it can be
    keep = _path_sample(view, sample_bits)
    if keep is None:
        return {c: v.astype(np.int64) for c, v in view.items()}  # copies
    return {c: v[keep].astype(np.int64) for c, v in view.items()}


def _path_sample(cols: dict[str, np.ndarray], bits: int) -> np.ndarray | None:
    """Rows of the paths kept (a stable hash of (src, dst, sport)); None: every row."""
    if not bits:
        return None
    k = cols["path"] if "path" in cols else _key(cols["src"], cols["dst"], cols["sport"])
    return (k >> np.uint64(40)) % np.uint64(1 << bits) == 0


def _key(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(over="ignore"):
        k = a.astype(np.uint64) * _MIX + b.astype(np.uint64)
        if c is not None:
            k = k * _MIX + c.astype(np.uint64)
    return k


class Place(NamedTuple):
    """Where a loss can be: ``("switch", sw)``, ``("to", switch, host_id)`` (a spine, or
    the sender's leaf, towards one destination), ``("link",
    name, direction)``, or a host (``("out", host_id)`` all it sends, ``("in", host_id)``
    all it receives, ``("host", host_id)`` both: its link, its NIC, its socket, its
    collector — not a switch's fault). A tuple: hashed and compared in C (a frozen
    dataclass's Python ``__hash__``/``__eq__`` took two thirds of a pass's tomography)."""

    what: str
    name: str
    detail: str = ""  # direction of a link; destination host id of "to"

    @property
    def reported(self) -> bool:
        return self.what not in ("out", "in", "host")


@dataclass
class _Cols:
    data: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, cols: dict[str, np.ndarray]) -> None:
        if not self.data:
            self.data = cols
        else:
            self.data = {k: np.concatenate((self.data[k], cols[k])) for k in self.data}

    def keep(self, mask: np.ndarray) -> None:
        self.data = {k: v[mask] for k, v in self.data.items()}

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0


class _Floors:
    """Each pair's lowest received delay per second of send time, kept as probes are
    judged: the pair's floor over HISTORY_S is the least of its seconds kept (the oldest
    of them may reach up to a second further back), without sorting the whole history
    every pass. The floors last asked for are kept until a probe is added or older
    seconds are asked to go: a pass's path stats and its random-share judgement ask alike
    (~50 ms at 5,000 pairs)."""

    def __init__(self) -> None:
        # second of send time -> (pair keys sorted, src, dst, least delay)
        self.by_sec: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._last: tuple[int, dict[tuple[int, int], float]] | None = None  # (first, floors)

    def add(self, src: np.ndarray, dst: np.ndarray, tx_ns: np.ndarray, delay: np.ndarray) -> None:
        """Received probes (finite delays)."""
        if not len(src):
            return
        sec = tx_ns // 1_000_000_000
        for s in np.unique(sec).tolist():
            on = sec == s
            parts = [(_key(src[on], dst[on]), src[on], dst[on], delay[on])]
            if s in self.by_sec:
                parts.append(self.by_sec[s])
            k, a, b, x = (np.concatenate(c) for c in zip(*parts, strict=True))
            self.by_sec[s] = _least(k, a, b, x)
        self._last = None

    def floors(self, since_ns: int) -> dict[tuple[int, int], float]:
        """(src, dst) -> its least delay sent since ``since_ns`` (older seconds dropped).
        Not to be changed by the caller: the next call may return it again."""
        first = since_ns // 1_000_000_000
        if self._last is not None and self._last[0] == first:
            return self._last[1]
        self.by_sec = {s: v for s, v in self.by_sec.items() if s >= first}
        out: dict[tuple[int, int], float] = {}
        if self.by_sec:
            k, a, b, x = (np.concatenate(c) for c in zip(*self.by_sec.values(), strict=True))
            _k, a, b, x = _least(k, a, b, x)
            out = dict(zip(zip(a.tolist(), b.tolist(), strict=True), x.tolist(), strict=True))
        self._last = (first, out)
        return out


def _unheard(h: dict[str, np.ndarray], since_ns: int) -> np.ndarray:
    """Rows of the history ``h`` that are probes sent since ``since_ns`` and lost to a
    destination that neither sent nor received a probe in the DEAF_NS before (by send
    time, the only clock every row has): its collector was not running."""
    out = np.zeros(len(h["tx_ns"]), bool)
    lost = np.flatnonzero(h["lost"] & (h["tx_ns"] >= since_ns))
    if not len(lost):
        return out
    span = h["tx_ns"] >= since_ns - DEAF_NS
    got = span & ~h["lost"]
    # a host is heard at each of its sends (lost or not) and each probe it received
    hosts = np.concatenate((h["src"][span], h["dst"][got]))
    times = np.concatenate((h["tx_ns"][span], h["tx_ns"][got]))
    _ids, inv = np.unique(np.concatenate((hosts, h["dst"][lost])), return_inverse=True)
    base = int(since_ns) - DEAF_NS
    heard = np.sort((inv[: len(hosts)].astype(np.int64) << 34) | (times - base))
    t = h["tx_ns"][lost] - base
    q = (inv[len(hosts) :].astype(np.int64) << 34) | t
    pos = np.searchsorted(heard, q, "right") - 1  # the newest heard at or before the send
    prev = heard[np.maximum(pos, 0)]
    ok = (pos >= 0) & ((prev >> 34) == (q >> 34)) & (t - (prev & ((1 << 34) - 1)) <= DEAF_NS)
    out[lost[~ok]] = True
    return out


def _least(
    k: np.ndarray, a: np.ndarray, b: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per key (sorted), its row with the least ``x``."""
    order = np.lexsort((x, k))
    k, a, b, x = k[order], a[order], b[order], x[order]
    first = np.append(True, k[1:] != k[:-1])
    return k[first], a[first], b[first], x[first]


class _Ports:
    """Each host's access port, as its collector samples it once a second: the packets it
    counted in and out over the last ``RX_SPAN_NS`` and whether its link stayed up
    meanwhile."""

    def __init__(self, access: Iterable[tuple[int, str]]) -> None:
        self.access = {(h, dev.encode()) for h, dev in access}  # (host, netdev) to a leaf
        # host -> (ts_ns, rx_packets delta, tx_packets delta, operstate, carrier losses),
        # newest RX_SPAN_NS
        self.samples: dict[int, collections.deque[tuple[int, int, int, int, int]]] = {}
        self._partial: dict[tuple[int, int], dict[bytes, int]] = {}

    def feed(self, rows: np.ndarray) -> None:
        """``counter`` records of :data:`PORT_COUNTERS` (numpy); others are ignored."""
        for ts, host, dev, name, value, delta in zip(
            rows["ts_ns"].tolist(), rows["host"].tolist(), rows["device"].tolist(),
            rows["name"].tolist(), rows["value"].tolist(), rows["delta"].tolist(), strict=True,
        ):  # fmt: skip
            if (host, dev) not in self.access:
                continue
            part = self._partial.setdefault((host, ts), {})
            part[name] = value if name == b"operstate" else max(delta, 0)
            if len(part) < len(PORT_COUNTERS):
                continue
            del self._partial[(host, ts)]
            d = self.samples.setdefault(host, collections.deque())
            d.append((ts, part[b"rx_packets"], part[b"tx_packets"], part[b"operstate"],
                      part[b"carrier_down_count"]))  # fmt: skip
            while d and d[0][0] < ts - RX_SPAN_NS:
                d.popleft()
        if len(self._partial) > 4 * max(len(self.access), 1):  # a counter never came
            self._partial.clear()

    def counted(self, host: int, now_ns: int) -> tuple[int, int] | None:
        """Packets ``host``'s port counted in and out over the last ``RX_SPAN_NS`` — or
        None when that cannot be told: no port known, samples older than a span or
        spanning less than half of it (samples a second apart drift), its link not up
        throughout (operstate, carrier losses)."""
        d = self.samples.get(host)
        if not d or d[-1][0] < now_ns - RX_SPAN_NS or d[-1][0] - d[0][0] < RX_SPAN_NS // 2:
            return None
        if any(op != UP or lost for *_n, op, lost in d):
            return None
        later = list(d)[1:]
        return sum(s[1] for s in later), sum(s[2] for s in later)


class SilentDrops:
    def __init__(
        self,
        host_rack: dict[int, str],
        links_by_ends: dict[tuple[str, str], str],
        spine_of: dict[tuple[int, int, int], str],
        host_names: dict[int, str] | None = None,
        excluded_links: Callable[[], set[str]] | None = None,
        recalled: dict[tuple[int, int, int], str] | None = None,
        access_ports: Iterable[tuple[int, str]] = (),
        contended: Callable[[], set[tuple[str, str]]] | None = None,
        full_ports: Callable[[], set[int]] | None = None,
        host_access: dict[int, str] | None = None,
    ) -> None:
        self.host_rack = host_rack
        self.host_access = host_access if host_access is not None else {}  # host -> its link
        # hosts drained by a remediation (names): what they send is not judged their way
        # out's again — the drain dealt with it (DetectRunner, as LinkFlaps.maintenance)
        self.drained: set[str] = set()
        self.by_ends = links_by_ends
        self.spine_of = spine_of  # (src, dst, sport) -> spine, kept by FabricPaths
        # ... as the store's traces left it before this detector started (FabricPaths.
        # recalled): a path the switch's drop silences is traced no more, and a detector
        # started after the drop would not know where it goes
        self.recalled = recalled if recalled is not None else {}
        self.ports = _Ports(access_ports)  # (host, netdev) of each host's leaf link
        self._link_spine = {name: spine for (_leaf, spine), name in links_by_ends.items()}
        self.host_names = host_names if host_names is not None else {}
        # () -> links whose paths are not judged now (suspected flaps, maintenance)
        self.excluded_links: Callable[[], set[str]] = excluded_links or set
        # () -> (link, direction) a contention anomaly names: a random share lost on a path
        # through its spine is the queue's (its tail drops), not judged as a bad optic's
        self.contended: Callable[[], set[tuple[str, str]]] = contended or set
        # () -> hosts whose own port a contention anomaly names: the probes lost into (or
        # out of) such a host are its full queue's (:meth:`_port_queued`)
        self.full_ports: Callable[[], set[int]] = full_ports or set
        self._tx = _Cols()  # sent, not judged yet
        self._rx = _Cols()  # received, not matched yet
        self._hist = _Cols()  # judged: src, dst, sport, tx_ns, lost, delay
        # host -> every receive up to this shipped: its newest rx_ns shipped, or its newest
        # send shipped less SEND_LAG_NS
        self.watermark: dict[int, int] = {}
        self.sample_bits = 0  # paths kept: hash % 2**bits == 0 (grows, never shrinks)
        # path -> (its spine when it went lossy, the pass that first saw it lossy)
        self._lossy: dict[tuple[int, int, int], tuple[str, int]] = {}
        # (src, dst) -> newest send of a pair whose destination has received at least one
        # of its probes (on any path): a pair that never delivered has not started
        self._delivered: dict[tuple[int, int], int] = {}
        self._first: dict[tuple[int, int], int] = {}  # pair -> its first delivered send
        self._unstarted: dict[tuple[int, int], int] = {}  # pair -> first lost, none delivered
        self.held_as_queue = 0  # passes whose loss came with a delay rise (contention)
        self.one_source = 0  # places whose lossy paths all came from one source host
        self.held_as_named = 0  # broader places whose lossy paths narrower named ones explain
        self.held_as_burst = 0  # places losing a share of their probes, in a burst
        self.held_as_few_seconds = 0  # ... lost in fewer than GRAY_MIN_SECONDS seconds
        self.held_as_socket = 0  # a host's received share, its collector's socket dropping
        # host -> its collector's socket drop count (rx_kernel_drops), (ts, value) a second
        self._socket: dict[int, collections.deque[tuple[int, int]]] = {}
        self._named: dict[Place, int] = {}  # place observed -> the newest pass it was
        self._queued: dict[Place, int] = {}  # link-direction -> queued (remembered) until
        self._floors = _Floors()  # each pair's least delay received, per second
        # (path, spine) -> the places it crosses, and the link-directions among them
        self._places_of: dict[
            tuple[tuple[int, int, int], str | None], tuple[list[Place], list[Place]]
        ] = {}
        # place losing a random share of its packets -> (first, newest) pass it was chosen,
        # and whether it explained GRAY_MIN_LOST in one of them
        self._gray: dict[Place, tuple[int, int, bool]] = {}
        self._gray_twins: dict[Place, list[Place]] = {}  # ... and the places it cannot be told from
        self._gray_said: dict[Place, float] = {}  # ... and the rate its summary says
        self._gray_last: tuple[int, list[Observation]] = (-(1 << 62), [])  # when, what
        # host cut off from the fabric -> (first, newest) pass it was, which way then, and
        # which way it began
        self._cut: dict[int, tuple[int, int, str, str]] = {}
        # ... of them, named: whether some of its probes got through when it was first named
        self._leaky: dict[int, bool] = {}
        self._cut_said: dict[int, tuple[str, str, list[str]]] = {}  # ... way, why, candidates
        self._paths_seen = np.zeros(0, np.uint64)  # paths judged (for _bound), sorted
        self._paths_since = 0  # ... since this send time (recounted every HISTORY_S)

    # ---- input -----------------------------------------------------------------------
    def _sampled(self, cols: dict[str, np.ndarray]) -> np.ndarray | None:
        return _path_sample(cols, self.sample_bits)

    def feed(self, name: str, cols: dict[str, np.ndarray]) -> None:
        """A commit's probe_tx or probe_rx columns (:func:`columns`)."""
        if not len(cols["src"]):
            return
        keep = self._sampled(cols)
        if keep is not None:
            cols = {k: v[keep] for k, v in cols.items()}
        if name == "probe_tx":
            self._tx.add(cols)
            self._raise_watermarks(cols["src"], cols["tx_ns"] - SEND_LAG_NS)
            return
        dst, rx = cols["dst"], cols["rx_ns"]
        self._raise_watermarks(dst, rx)
        self._rx.add({"key": _key(cols["src"], cols["seq"]), "rx_ns": rx,
                      "path": _key(cols["src"], dst, cols["sport"])})  # fmt: skip

    def feed_socket(self, ts_ns: np.ndarray, host: np.ndarray, value: np.ndarray) -> None:
        """Collectors' ``rx_kernel_drops`` health values: datagrams the kernel dropped on
        their probe sockets (SO_RXQ_OVFL), cumulative, one a second."""
        for t, h, v in zip(ts_ns.tolist(), host.tolist(), value.tolist(), strict=True):
            d = self._socket.setdefault(h, collections.deque())
            d.append((t, v))
            while d[0][0] < t - SOCKET_KEEP_NS:
                d.popleft()

    def socket_dropped(self, host: int, since_ns: int) -> int | None:
        """Datagrams ``host``'s collector socket dropped since ``since_ns`` (the count at
        the sample before it on); None: no count since then (an older collector, or
        none shipped yet). A collector restarted counts from 0 again."""
        d = sorted(x for x in self._socket.get(host, ()) if x[0] >= since_ns - SOCKET_BEFORE_NS)
        if not d or d[-1][0] < since_ns:
            return None
        # (the value is the last socket's to report: its echo sockets' and its probe
        # socket's counts by turns read as drops — never as none)
        return sum(b if b < a else b - a for (_t, a), (_u, b) in itertools.pairwise(d))

    def _raise_watermarks(self, hosts: np.ndarray, ns: np.ndarray) -> None:
        """Each of ``hosts`` has shipped every receive up to its newest of ``ns``."""
        order = np.lexsort((ns, hosts))
        last = np.flatnonzero(np.append(hosts[order][1:] != hosts[order][:-1], True))
        for h, t in zip(hosts[order][last].tolist(), ns[order][last].tolist(), strict=True):
            if t > self.watermark.get(h, 0):
                self.watermark[h] = t

    def _judge(self) -> None:
        """Match the pending probe_tx with the probe_rx; judged ones go to the history."""
        if not len(self._tx):
            self._late()
            return
        tx = self._tx.data
        key = _key(tx["src"], tx["seq"])
        rx_ns = np.full(len(key), np.iinfo(np.int64).min, np.int64)
        matched = np.zeros(len(key), bool)
        if len(self._rx):
            rk = self._rx.data["key"]
            order = np.argsort(rk, kind="stable")
            sk = rk[order]
            pos = np.minimum(np.searchsorted(sk, key), len(sk) - 1)
            matched = sk[pos] == key
            rx_ns[matched] = self._rx.data["rx_ns"][order][pos[matched]]
            used = np.zeros(len(rk), bool)
            used[order[pos[matched]]] = True
            newest_rx = int(self._rx.data["rx_ns"].max())
            self._rx.keep(~used & (self._rx.data["rx_ns"] >= newest_rx - int(PENDING_S * 1e9)))
        uniq, inv = np.unique(tx["dst"], return_inverse=True)
        wm = np.array([self.watermark.get(d, 0) for d in uniq.tolist()], np.int64)[inv]
        judged = matched | (wm >= tx["tx_ns"] + int(MARGIN_S * 1e9))
        self._started(tx["src"][matched], tx["dst"][matched], tx["tx_ns"][matched])
        self._unstarted_since(tx["src"], tx["dst"], tx["tx_ns"], judged & ~matched)
        new = np.zeros(0, np.uint64)
        if judged.any():
            new = np.unique(_key(tx["src"][judged], tx["dst"][judged], tx["sport"][judged]))
            delay = np.where(matched, rx_ns - tx["tx_ns"], 0).astype(np.float64)
            delay[~matched] = np.nan
            self._floors.add(tx["src"][matched], tx["dst"][matched], tx["tx_ns"][matched],
                             delay[matched])  # fmt: skip
            self._hist.add({
                "src": tx["src"][judged], "dst": tx["dst"][judged],
                "sport": tx["sport"][judged], "tx_ns": tx["tx_ns"][judged],
                "lost": ~matched[judged], "delay": delay[judged], "key": key[judged],
                "twin": _key(tx["src"][judged], tx["seq"][judged] >> 1),
            })  # fmt: skip
        self._late()
        newest = int(tx["tx_ns"].max())
        self._tx.keep(~judged & (tx["tx_ns"] >= newest - int(PENDING_S * 1e9)))
        h = self._hist.data
        if len(self._hist):
            self._hist.keep(h["tx_ns"] >= int(h["tx_ns"].max()) - int(HISTORY_S * 1e9))
        self._bound(new)

    def _late(self) -> None:
        """probe_rx of probes already judged lost: a queue held them longer than MARGIN_S
        (hundreds of ms behind a saturated slow link). They were late, not lost: received,
        with their delay — which tells a queue from a drop."""
        if not len(self._rx) or not len(self._hist):
            return
        h = self._hist.data
        lost = np.flatnonzero(h["lost"])
        if not len(lost):
            return
        rk = self._rx.data["key"]
        order = np.argsort(rk, kind="stable")
        sk = rk[order]
        pos = np.minimum(np.searchsorted(sk, h["key"][lost]), len(sk) - 1)
        hit = sk[pos] == h["key"][lost]
        if not hit.any():
            return
        rows = lost[hit]
        self._started(h["src"][rows], h["dst"][rows], h["tx_ns"][rows])
        h["lost"][rows] = False
        h["delay"][rows] = (self._rx.data["rx_ns"][order][pos[hit]] - h["tx_ns"][rows]).astype(
            np.float64
        )
        self._floors.add(h["src"][rows], h["dst"][rows], h["tx_ns"][rows], h["delay"][rows])
        used = np.zeros(len(rk), bool)
        used[order[pos[hit]]] = True
        self._rx.keep(~used)

    def _unstarted_since(
        self, src: np.ndarray, dst: np.ndarray, tx_ns: np.ndarray, lost: np.ndarray
    ) -> None:
        """The first lost probe of each pair that has delivered nothing yet."""
        if not lost.any():
            return
        src, dst, tx_ns = src[lost], dst[lost], tx_ns[lost]
        _pair, src, dst, tx_ns = _least(_key(src, dst), src, dst, tx_ns)
        for s_, d_, t in zip(src.tolist(), dst.tolist(), tx_ns.tolist(), strict=True):
            if (s_, d_) not in self._first:
                self._unstarted.setdefault((s_, d_), t)

    def _started(self, src: np.ndarray, dst: np.ndarray, tx_ns: np.ndarray) -> None:
        """Pairs with a probe received: started (the destination's collector takes the
        sender's probes). Once more than 4 × MAX_PATHS pairs are known, those that
        delivered nothing for ``FORGET_S`` are forgotten (buddies that changed)."""
        if len(src):
            pair = _key(src, dst)
            order = np.lexsort((tx_ns, pair))
            last = order[np.append(pair[order][1:] != pair[order][:-1], True)]
            for s_, d_, t in zip(src[last].tolist(), dst[last].tolist(), tx_ns[last].tolist(),
                                 strict=True):  # fmt: skip
                if t > self._delivered.get((s_, d_), 0):
                    self._delivered[(s_, d_)] = t
                    self._first.setdefault((s_, d_), t)
                    self._unstarted.pop((s_, d_), None)
        if len(self._delivered) > 4 * MAX_PATHS and len(self._hist):
            horizon = int(self._hist.data["tx_ns"].max()) - int(FORGET_S * 1e9)
            self._delivered = {k: t for k, t in self._delivered.items() if t >= horizon}
            self._first = {k: t for k, t in self._first.items() if k in self._delivered}
        if len(self._unstarted) > 4 * MAX_PATHS and len(self._hist):
            horizon = int(self._hist.data["tx_ns"].max()) - int(FORGET_S * 1e9)
            self._unstarted = {k: t for k, t in self._unstarted.items() if t >= horizon}

    def _bound(self, new: np.ndarray) -> None:
        """More than MAX_PATHS paths: keep a stable hash-sample (half, then a quarter...),
        applied to what is held too, so a probe and its partner are always both kept.
        ``new``: the paths of the probes just judged."""
        h = self._hist.data
        if not len(self._hist):
            return
        # The paths judged over the last HISTORY_S to 2 × HISTORY_S: those of the newest
        # judged probes added to the set, recounted from the history every HISTORY_S.
        newest = int(h["tx_ns"].max())
        if newest - self._paths_since > int(HISTORY_S * 1e9):
            self._paths_seen = np.unique(_key(h["src"], h["dst"], h["sport"]))
            self._paths_since = newest
        elif len(new):
            self._paths_seen = np.union1d(self._paths_seen, new)
        paths = len(self._paths_seen)
        if paths <= MAX_PATHS:
            return
        self._paths_since = 0  # recounted among the paths kept
        self.sample_bits += max(1, math.ceil(math.log2(paths / MAX_PATHS)))
        log.info("event=silent_drop_sampling paths=%d keep=1/%d", paths, 1 << self.sample_bits)
        for part in (self._hist, self._tx, self._rx):
            keep = self._sampled(part.data)
            if keep is not None and len(part):
                part.keep(keep)

    # ---- judgement -------------------------------------------------------------------
    def path_stats(self) -> dict[tuple[int, int, int], dict[str, float]]:
        """Per path over the last WINDOW_S of judged probes: sent, lost, the newest lost in
        a row (``streak``) and the span of their send times, whether the newest was lost,
        the (lower) median delay received in the last RECENT_S; and the pair's floor
        (lowest delay over HISTORY_S)."""
        self._judge()
        h = self._hist.data
        if not len(self._hist):
            return {}
        newest = int(h["tx_ns"].max())
        floor = self._floors.floors(newest - int(HISTORY_S * 1e9))
        since = newest - int(WINDOW_S * 1e9)
        recent = (h["tx_ns"] >= since) & ~_unheard(h, since)
        w = {k: v[recent] for k, v in h.items()}
        order = np.lexsort((w["tx_ns"], w["sport"], w["dst"], w["src"]))
        w = {k: v[order] for k, v in w.items()}
        pk = _key(w["src"], w["dst"], w["sport"])
        heads = np.flatnonzero(np.append(True, pk[1:] != pk[:-1]))
        ends = np.append(heads[1:], len(pk))
        lost = w["lost"]
        n_lost = np.add.reduceat(lost.astype(np.int64), heads)
        t = w["tx_ns"]
        # the newest probes lost in a row: after the last one received
        idx = np.arange(len(pk))
        last_got = np.maximum.reduceat(np.where(lost, heads.repeat(ends - heads) - 1, idx), heads)
        streak = ends - 1 - last_got
        spread = np.where(streak > 0, t[ends - 1] - t[np.minimum(last_got + 1, ends - 1)], 0)
        # lower median of the delays received in the last RECENT_S (a queue that just
        # filled shows at once): within each path sorted by delay (NaN — lost, or older —
        # sorts last), the middle of those
        recent_delay = np.where(t >= t.max() - int(RECENT_S * 1e9), w["delay"], np.nan)
        group = np.repeat(np.arange(len(heads)), ends - heads)
        by_delay = np.lexsort((recent_delay, group))
        received = np.add.reduceat((~np.isnan(recent_delay)).astype(np.int64), heads)
        mid = heads + np.maximum(received - 1, 0) // 2
        median = np.where(received > 0, recent_delay[by_delay][mid], np.nan)
        keys = zip(w["src"][heads].tolist(), w["dst"][heads].tolist(),
                   w["sport"][heads].tolist(), strict=True)  # fmt: skip
        return {
            key: {"sent": float(n), "lost": float(nl), "streak": float(sk), "spread_ns": float(sp),
                  "newest_lost": float(nw), "delay": float(md), "newest_ns": float(tn),
                  "floor": floor.get(key[:2], float("nan"))}
            for key, n, nl, sk, sp, nw, md, tn in zip(
                keys, (ends - heads).tolist(), n_lost.tolist(), streak.tolist(), spread.tolist(),
                lost[ends - 1].tolist(), median.tolist(), t[ends - 1].tolist(), strict=True)
        }  # fmt: skip

    def _places(self, key: tuple[int, int, int], spine: str | None) -> list[Place]:
        s, d, _ = key
        x, z = self.host_rack.get(s), self.host_rack.get(d)
        if x is None or z is None:
            return []
        hosts = [Place("out", str(s)), Place("in", str(d)), Place("host", str(s)),
                 Place("host", str(d))]  # fmt: skip
        if x == z:
            return [*hosts, Place("switch", x), Place("to", x, str(d))]
        if spine is None:
            # untraced: its hop-2 trace never came back. A switch's blackhole silences the
            # traces of what it drops (the route lookup fails before the TTL check), so a
            # drop standing since before the detector started leaves its paths untraced:
            # only what every path of the pair crosses can be judged without the spine.
            return [*hosts, Place("to", x, str(d))]
        up, down = self.by_ends.get((x, spine)), self.by_ends.get((z, spine))
        if up is None or down is None:
            return []
        return [
            *hosts,
            Place("switch", spine),
            Place("switch", x),
            Place("switch", z),
            Place("to", spine, str(d)),
            Place("to", x, str(d)),  # the source leaf towards d (its FIB entry for d)
            Place("link", up, "leaf→spine"),
            Place("link", down, "spine→leaf"),
        ]

    def observations(self, now_ns: int) -> list[Observation]:
        stats = self.path_stats()
        excluded = set(self.excluded_links())
        lossy: set[tuple[int, int, int]] = set()
        clean: set[tuple[int, int, int]] = set()
        pending: set[tuple[int, int, int]] = set()
        streaking: set[tuple[int, int, int]] = set()
        crossing: dict[tuple[int, int, int], list[Place]] = {}
        links: dict[tuple[int, int, int], list[Place]] = {}  # ... the link-directions of those
        for key, st in stats.items():
            spine = self.spine_of.get(key) or self.recalled.get(key)
            cached = self._places_of.get((key, spine))
            if cached is None:
                if len(self._places_of) > 4 * MAX_PATHS:  # buddies and paths changed
                    self._places_of.clear()
                places = self._places(key, spine)
                cached = (places, [p for p in places if p.what == "link"])
                self._places_of[(key, spine)] = cached
            places, on_links = cached
            if not places or any(p.name in excluded for p in on_links):
                continue
            first = self._first.get(key[:2])
            if first is None:
                # every probe of the pair lost since it began: a pair that has not started
                # (its destination's collector does not take the sender's probes yet, as
                # when a new buddy joins) — for UNSTARTED_NS; past that, a drop that was
                # there before the detector started (every path of a pair: its leaf).
                since = self._unstarted.get(key[:2])
                if since is None or st["newest_ns"] - since < UNSTARTED_NS:
                    continue
            elif st["newest_ns"] - first < WARMUP_NS:
                continue  # new pairs lost some paths' first probes in `make demo`
            crossing[key] = places
            links[key] = on_links
            is_lossy = st["streak"] >= MIN_LOST and st["spread_ns"] >= MIN_SPREAD_NS
            if is_lossy:
                streaking.add(key)
                was, _since = self._lossy.setdefault(key, (spine or "", now_ns))
                if spine is not None and was != spine:  # the path moved: a flap's doing
                    continue  # (until its streak ends: its lost probes were the old path's)
                lossy.add(key)
            elif st["lost"] == 0:
                clean.add(key)
            elif st["newest_lost"]:
                pending.add(key)  # losing now, not judged lossy yet (or a stray loss)
        for key in [k for k in self._lossy if k not in streaking]:
            del self._lossy[key]
        queues = self._queues(links, stats, now_ns)  # every pass: it remembers
        full = self.full_ports()
        when, gray = self._gray_last
        if not 0 <= now_ns - when < GRAY_EVERY_NS:
            gray = self._gray_places(crossing, streaking, queues, now_ns)
            self._gray_last = (now_ns, gray)
        cut = self._cut_offs(lossy, crossing, stats, now_ns)
        if len(lossy) < MIN_PATHS:
            return [*cut, *gray]
        claims: dict[Place, set[tuple[int, int, int]]] = collections.defaultdict(set)
        clean_of: collections.Counter[Place] = collections.Counter()
        for key, places in crossing.items():
            for p in places:
                if key in lossy:
                    claims[p].add(key)
                elif key in clean:
                    clean_of[p] += 1
        left = set(lossy)
        chosen: list[tuple[list[Place], set[tuple[int, int, int]]]] = []
        while left:
            pick = _best(claims, left, claims, clean_of)
            if pick is None:
                break
            best, covered = pick
            for place, part in _refined(best, covered, claims, clean_of, left):
                twins = [p for p in claims if claims[p] & left == part
                         and clean_of[p] == clean_of[place]]  # fmt: skip
                chosen.append((sorted(twins, key=repr), part))
                left -= part
        # A host's own loss is not a switch's, unless its port counted nothing in: then
        # its leaf's (all that goes into the host, judged at its pace: nothing to wait for)
        own: dict[int, int] = {}  # chosen index -> packets its host's port counted in
        for i, (places, covered) in enumerate(chosen):
            if not all(p.reported for p in places):
                got = self._unreached(places, covered, lossy, clean, stats, now_ns)
                if got is not None:
                    d = places[0].name
                    chosen[i] = ([Place("to", self.host_rack[int(d)], d)], covered)
                    own[i] = got
        reportable = sum(len(c) for places, c in chosen if all(p.reported for p in places))
        out: dict[str, Observation] = {}
        self._named = {p: t for p, t in self._named.items() if now_ns - t < NAMED_HOLD_NS}
        named: list[Place] = []
        for i, (places, covered) in enumerate(chosen):
            if not all(p.reported for p in places):
                continue  # a host's own loss: its port counters speak for it
            if self._explained_by_named(places, covered, claims, clean_of):
                self.held_as_named += 1
                continue
            if i not in own and self._premature(places[0], pending, crossing):
                continue
            if len({src for src, _d, _p in covered}) < MIN_SOURCES:
                self.one_source += 1
                continue
            if all(p.what == "link" for p in places) and any(
                now_ns - self._lossy.get(k, ("", now_ns))[1] < LINK_HOLD_NS for k in covered
            ):
                continue  # a link-direction losing everything: a full queue, for now
            hops = {p for k in covered for p in crossing[k] if p.what == "link"}
            rise = max((queues.get(p, 0.0) for p in hops), default=0.0)
            if rise > RISE_NS or hops & self._queued.keys() or self._port_queued(covered, full):
                self.held_as_queue += 1
                continue
            obs = self._observation(places, covered, clean_of, crossing, stats, rise, reportable,
                                    own.get(i))  # fmt: skip
            named += places
            seen = out.get(obs.key)
            if seen is None:
                out[obs.key] = obs
            else:
                _merge(seen, obs)
        self._named.update(dict.fromkeys(named, now_ns))
        return [*cut, *out.values(), *(g for g in gray if g.key not in out)]

    def window_counts(
        self, since_ns: int
    ) -> dict[tuple[int, int, int], tuple[int, int, np.ndarray]]:
        """Per path, its probes judged that were sent since ``since_ns``, of them lost, and
        the lost per second of the window (a probe to a host not heard from is not
        counted: :func:`_unheard`; nor one lost beside a queue: :data:`TWIN_QUEUED_NS`)."""
        h = self._hist.data
        if not len(self._hist):
            return {}
        m = (h["tx_ns"] >= since_ns) & ~_unheard(h, since_ns) & ~self._lost_at_queue(since_ns)
        if not m.any():
            return {}
        keys = _key(h["src"][m], h["dst"][m], h["sport"][m])
        uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        sent = np.bincount(inv, minlength=len(uniq))
        lost = h["lost"][m]
        seconds = max(1, -(-(int(h["tx_ns"][m].max()) + 1 - since_ns) // 1_000_000_000))
        per_s = np.zeros((len(uniq), seconds), np.int64)
        sec = (h["tx_ns"][m][lost] - since_ns) // 1_000_000_000
        np.add.at(per_s, (inv[lost], sec), 1)
        src, dst, sport = (h[c][m][first].tolist() for c in ("src", "dst", "sport"))
        return {
            (a, b, c): (int(n), int(row.sum()), row)
            for a, b, c, n, row in zip(src, dst, sport, sent.tolist(), per_s, strict=True)
        }

    def _lost_at_queue(self, since_ns: int) -> np.ndarray:
        """Rows of the history that are probes sent since ``since_ns``, lost, whose coded
        twin was received :data:`TWIN_QUEUED_NS` or more over its pair's floor."""
        h = self._hist.data
        out = np.zeros(len(h["tx_ns"]), bool)
        window = h["tx_ns"] >= since_ns
        lost = np.flatnonzero(h["lost"] & window)
        if not len(lost):
            return out
        # the lost probes' received twins: as few as the lost (a sorted search, not isin:
        # the window holds every judged probe of the sampled paths)
        pairs_lost = np.sort(h["twin"][lost])
        got = np.flatnonzero(~h["lost"] & window)
        at = np.minimum(np.searchsorted(pairs_lost, h["twin"][got]), len(pairs_lost) - 1)
        twins = got[pairs_lost[at] == h["twin"][got]]
        if not len(twins):
            return out
        floor = self._floors.floors(int(h["tx_ns"].max()) - int(HISTORY_S * 1e9))
        pairs = zip(h["src"][twins].tolist(), h["dst"][twins].tolist(), strict=True)
        low = np.array([floor.get(p, np.inf) for p in pairs])
        late = h["twin"][twins][h["delay"][twins] - low >= TWIN_QUEUED_NS]
        out[lost[np.isin(h["twin"][lost], late)]] = True
        return out

    def _gray_places(
        self,
        crossing: dict[tuple[int, int, int], list[Place]],
        streaking: set[tuple[int, int, int]],
        queues: dict[Place, float],
        now_ns: int,
    ) -> list[Observation]:
        """Places dropping a random share of the packets crossing them (:data:`GRAY_WINDOW_NS`
        and the rest above): greedily, the place whose probes' loss rate best explains
        the lost probes of the paths through it, its paths then explained, while one
        explains :data:`GRAY_KEEP_LOST` and earns :data:`GRAY_COST`. A host's own place
        (all it sends or receives) is chosen like any other and never reported: its NIC
        or socket, not a switch. Paths losing everything in a row are the rule above's
        (``streaking``)."""
        h = self._hist.data
        if not len(self._hist):
            self._gray.clear()
            return []
        since = int(h["tx_ns"].max()) - GRAY_WINDOW_NS
        counts = self.window_counts(since)
        # a spine with a contended link-direction: its paths' loss is the queue's — and the
        # bulk that fills it fills its sources' uplinks to that spine too (held-out seed
        # 1251: leaf3-spine2's saturating flows dropped 4 % at leaf1-spine2 going up, with
        # 2 µs of delay rise, and it was paged as a bad optic there)
        queued = {Place("switch", sp) for n, _d in self.contended()
                  if (sp := self._link_spine.get(n))}  # fmt: skip
        # ... and a host's port whose queue is full drops a share of what goes through it
        full = self.full_ports()
        paths = {k: c for k, c in counts.items() if k in crossing and k not in streaking
                 and not (queued and queued.intersection(crossing[k]))
                 and not (full and (k[0] in full or k[1] in full))}  # fmt: skip
        sent: collections.Counter[Place] = collections.Counter()
        lost: collections.Counter[Place] = collections.Counter()
        through: dict[Place, list[tuple[int, int, int]]] = collections.defaultdict(list)
        for k, (n, nl, _per_s) in paths.items():
            for p in crossing[k]:
                sent[p] += n
                lost[p] += nl
                through[p].append(k)
        total_lost = sum(c[1] for c in paths.values())
        self._gray_twins = {}
        chosen: list[tuple[Place, list[tuple[int, int, int]], int, int]] = []
        while lost and len(chosen) < GRAY_MAX_PLACES:
            best = max(lost, key=lambda p: (rate_evidence(lost[p], sent[p]), -sent[p], repr(p)))
            k_, n_ = lost[best], sent[best]
            if k_ < GRAY_KEEP_LOST or rate_evidence(k_, n_) <= 0:
                break
            mine = [k for k in through[best] if k in paths]
            # places crossed by exactly these paths cannot be told apart (a spine towards
            # the one host of a rack, and its link down to that rack): named together,
            # the link first — taking it out routes round every one of them
            same = set(mine)
            twins = sorted((p for p in through if p.reported and lost[p] == k_
                            and sent[p] == n_ and {k for k in through[p] if k in paths} == same),
                           key=lambda p: (_GRAY_FIRST.get(p.what, 9), repr(p)))  # fmt: skip
            if best.reported and twins:
                best = twins[0]
            self._gray_twins[best] = twins
            chosen.append((best, mine, n_, k_))
            for k in mine:  # explained: out of every other place's counts
                n, nl, _per_s = paths.pop(k)
                for p in crossing[k]:
                    sent[p] -= n
                    lost[p] -= nl
            lost = +lost  # drop places left with no loss
        out = []
        seen: dict[Place, tuple[int, int, bool]] = {}
        # A host's own place, lost at random to or from every peer, is its access link (a
        # dirty optic or cable drops one direction or both) or its NIC — what it receives,
        # only while its collector's sockets dropped nothing (else that collector not
        # keeping up, held): named on its link, the host the culprit
        ways: dict[str, set[str]] = collections.defaultdict(set)
        for p, *_ in chosen:
            if not p.reported:
                ways[p.name].add(p.what)
        for place, mine, n_, k_ in chosen:
            own = not place.reported
            if own and self.host_names.get(int(place.name)) in self.drained:
                continue
            # what a host receives: its collector's socket dropped some (or cannot say)
            if place.what in ("in", "host") and self.socket_dropped(int(place.name), since) != 0:
                self.held_as_socket += 1
                continue
            if interval95(k_, n_)[0] > GRAY_MAX_SHARE:
                continue  # (nearly) every probe: lost in a row, not at random
            hops = {p for k in mine for p in crossing[k] if p.what == "link"}
            rise = max((queues.get(p, 0.0) for p in hops), default=0.0)
            if rise > RISE_NS or hops & self._queued.keys():
                self.held_as_queue += 1
                continue  # a full queue drops too, and delays what it lets through
            losing = [k for k in mine if counts[k][1]]
            if len(losing) < MIN_PATHS:
                continue
            # a switch drops what every sender sends through it; a host's link, what it
            # sends to or receives from every peer
            if own:
                me = int(place.name)
                ends = {d_ if s_ == me else s_ for s_, d_, _p in losing}
            else:
                ends = {s_ for s_, _d, _p in losing}
            if len(ends) < (MIN_DESTINATIONS if own else MIN_SOURCES):
                continue
            per_s = np.sum([counts[k][2] for k in losing], axis=0)
            if np.count_nonzero(per_s) < GRAY_MIN_SECONDS:
                self.held_as_few_seconds += 1
                continue  # lost in a few seconds: a hiccup, or a share just begun
            if in_a_burst(per_s):
                self.held_as_burst += 1
                continue  # lost in a burst, not at random
            if k_ < GRAY_MIN_LOST and not per_s[-GRAY_FRESH_SECONDS:].any():
                continue  # kept by fewer only while it keeps losing (a loss that ended)
            first, _, armed = (self._gray[place] if self._gray_held(place, now_ns)
                               else (now_ns, now_ns, False))  # fmt: skip
            armed = armed or k_ >= GRAY_MIN_LOST
            seen[place] = (first, now_ns, armed)
            if not armed or now_ns - first < GRAY_HOLD_NS:
                continue
            both = own and ways[place.name] >= {"out", "in"}  # each way chosen on its own
            out.append(self._gray_observation(place, mine, losing, n_, k_, total_lost, rise, both,
                                              losing_now=bool(per_s[-1])))  # fmt: skip
        # a place not chosen this pass keeps its start for GRAY_GAP_NS (a rate near the
        # threshold is chosen in most passes, not all)
        self._gray = {p: v for p, v in self._gray.items() if now_ns - v[1] <= GRAY_GAP_NS}
        self._gray.update(seen)
        self._gray_said = {p: q for p, q in self._gray_said.items() if p in self._gray}
        return out

    def _gray_held(self, place: Place, now_ns: int) -> bool:
        """Is ``place`` holding as a random share (chosen, its last choice within
        :data:`GRAY_GAP_NS`)?"""
        got = self._gray.get(place)
        return got is not None and now_ns - got[1] <= GRAY_GAP_NS

    def _where(
        self, sw: str, links: list[str], dests: list[str], paths: Iterable[tuple[int, int, int]]
    ) -> dict[str, Any]:
        """The place in an anomaly's evidence, as attribution and remediation read it: the
        switch, the links to take out, the destinations and the racks whose pairs to them
        it drops (who is a victim)."""
        racks = sorted({self.host_rack[s] for s, _d, _p in paths}) if dests else []
        return {"switch": sw, "links": links, "destinations": dests, "from_racks": racks}

    def _gray_observation(
        self,
        place: Place,
        mine: list[tuple[int, int, int]],
        losing: list[tuple[int, int, int]],
        sent: int,
        lost: int,
        total_lost: int,
        rise: float,
        both: bool = False,
        losing_now: bool = True,
    ) -> Observation:
        """A random share at ``place``; ``both``: a host's way out and way in were each
        chosen (at their own rates); ``losing_now``: it lost probes in the window's newest
        second (the rate said is changed only then: once the loss ends the window's
        share falls each second, and the rate it had is what a page should go on saying)."""
        name = self.host_names.get
        where = _words(place, name)
        share = lost / sent if sent else 0.0
        lo, hi = interval95(lost, sent)
        said = self._gray_said.get(place)
        if said is None or (losing_now and not lo <= said <= hi):
            said = self._gray_said[place] = said_rate(share, lo, hi)
        direction: dict[str, str] = {}
        dests: list[str]
        host = port = ""
        way = {"out": OUT, "in": IN, "host": BOTH}.get(place.what, "")
        if way:  # a host's access link: the way out of it, into it, or both
            host = name(int(place.name), f"host {place.name}")
            port = self.host_access.get(int(place.name), "")
            bare = {OUT: "sending", IN: "receiving"}.get(way, way)  # no topology: no port
            where = f"{port} ({way})" if port else f"{host}'s port ({bare})"
            sw, links, dests = self.host_rack.get(int(place.name), ""), [], []
            direction = {"direction": way, "host": host}
        elif place.what == "link":
            sw, links, dests = "", [place.name], []
            # one direction of one leaf–spine link, as contention names it: the pairs
            # leaving (leaf→spine) or entering (spine→leaf) its leaf are its victims
            leaf = next((lf for (lf, _sp), n in self.by_ends.items() if n == place.name), "")
            direction = {"direction": place.detail, "leaf": leaf}
        elif place.what == "to":
            sw, dests = place.name, [name(int(place.detail), f"host {place.detail}")]
            links = []
        else:
            sw, links, dests = place.name, [], []
        sources = sorted({name(s, f"host {s}") for s, _, _ in losing})
        # no counts: they change every pass (in the evidence)
        rate = f"{said * 100:g} %"
        if way == OUT:
            candidates = [where, f"{host}'s NIC (sending)"]
            other = ("what it receives loses some too" if both
                     else "while what it receives arrives")  # fmt: skip
            summary = (
                f"{where} silently drops about {rate} of what {host} sends, at random: its "
                f"flows to its peers lose some, none many in a row, {other} (a bad optic or "
                "cable, its NIC sending, or its own egress queue); link up, paths unmoved, "
                "no queue"
            )
        elif way == IN:
            # (its collector not keeping up, the other cause, is ruled out: a received
            # share is named only while its sockets dropped nothing, feed_socket)
            candidates = [where, f"{host}'s NIC (receiving)"]
            other = "what it sends loses some too" if both else "while what it sends arrives"
            summary = (
                f"{where} silently drops about {rate} of what is sent to {host}, at random: "
                f"its peers' flows to it lose some, none many in a row, {other} (a bad optic "
                "or cable, or its NIC receiving: its collector's sockets dropped none); link "
                "up, paths unmoved, no queue"
            )
        elif way == BOTH:
            candidates = [where, f"{host}'s NIC"]
            summary = (
                f"{where} silently drops about {rate} of what {host} sends and receives, at "
                "random: its flows with its peers lose some both ways, none many in a row (a "
                "bad optic or cable, or its NIC); link up, paths unmoved, no queue"
            )
        else:
            candidates = [_words(p, name) for p in self._gray_twins.get(place) or [place]]
            summary = (
                f"{where} silently drops about {rate} of the packets crossing it, "
                "at random: every flow through it loses some, none many in a row (a bad "
                "optic, cable or port); links and routes up, paths unmoved, no queue"
            )
        if len(links) == 1:
            summary += f"; out of service: {links[0]}"
        pairs = sorted({f"{name(s, f'host {s}')}→{name(d, f'host {d}')}" for s, d, _ in losing})
        return Observation(
            kind=KIND,
            key=f"{where} (random)",
            score=round(min(1.0, 0.5 + 10 * said), 2),
            summary=summary,
            link=links[0] if len(links) == 1 else port,
            evidence={
                **self._where(sw, links, dests, losing),
                "candidates": candidates,
                "confidence": round(lost / max(total_lost, 1), 2),
                **direction,
                "pattern": "random",
                "packet_share": round(share, 5),
                "packet_share_95": [round(lo, 5), round(hi, 5)],
                "lossy_paths": len(losing),
                "clean_paths_through": len(mine) - len(losing),
                "flow_share": round(len(losing) / len(mine), 3) if mine else 0.0,
                "lost_probes": int(lost),
                "sent_probes": int(sent),
                "window_s": GRAY_WINDOW_NS / 1e9,
                "sources": sources[:20],
                "pairs": pairs[:20],
                "delay_rise_us": round(rise / 1e3, 1),
                "source": "probe loss rate per place over the window, paths from traces, "
                "tomography",
            },
        )

    def _explained_by_named(
        self,
        places: list[Place],
        covered: set[tuple[int, int, int]],
        claims: dict[Place, set[tuple[int, int, int]]],
        clean_of: collections.Counter[Place],
    ) -> bool:
        """Whether places narrower than ``places`` (fewer clean paths), observed within
        :data:`NAMED_HOLD_NS`, explain every one of its lossy paths ``covered``: then it is
        no new fault. Held-out seed 1246: spine2 black-holing h3-2 and h1-2, named towards
        each; 1.2 s after the heal, as their paths came back unevenly, the rest read as
        "spine2 silently drops traffic: 14 of 86 paths through it (16%)" — a third page,
        all of whose paths went to those two hosts."""
        if not self._named or any(p in self._named for p in places):
            return False
        wide = min(clean_of[p] for p in places)
        return covered <= set().union(
            *(claims.get(q, ()) for q in self._named if clean_of[q] < wide)
        )

    def _unreached(
        self,
        places: list[Place],
        covered: set[tuple[int, int, int]],
        lossy: set[tuple[int, int, int]],
        clean: set[tuple[int, int, int]],
        stats: dict[tuple[int, int, int], dict[str, float]],
        now_ns: int,
    ) -> int | None:
        """Every path into one host lossy (``places``: that host's receiving): the packets
        its port counted in over ``RX_SPAN_NS``, when that is (nearly) none while its link
        stayed up and its own paths out delivered — the packets never reached its NIC, its
        leaf towards it dropped them. None otherwise: a host whose port counts them in and
        then loses them (its socket, its collector) is its own problem; a host whose link
        is down or that sends nothing is a flap's or its own. (A NIC that discards what it
        receives before counting it looks the same: the evidence says so.)"""
        if len(places) != 1 or places[0].what != "in":
            return None
        d = int(places[0].name)
        if self._cut.get(d, (0, 0, "", ""))[3] == IN:
            return None  # it dropped what it received first: its leaf's ARP went unanswered
        out = [k for k in lossy | clean if k[0] == d]
        if not self.host_rack.get(d) or len(out) < MIN_PATHS or any(k in lossy for k in out):
            return None
        counted = self.ports.counted(d, now_ns)
        if counted is None:
            return None
        got = counted[0]
        return got if self._nearly_none(got, covered, stats) else None

    def _nearly_none(
        self,
        packets: int,
        paths: Iterable[tuple[int, int, int]],
        stats: dict[tuple[int, int, int], dict[str, float]],
        share: float = RX_SHARE,
    ) -> bool:
        """Whether a port's count over ``RX_SPAN_NS`` is (nearly) none beside the probes
        ``paths`` carried over the window (scaled to the span, every path kept): fewer
        than ``share`` of them, or than RX_FLOOR packets (the leaf's own ARP)."""
        sent = sum(stats[k]["sent"] for k in paths) * (1 << self.sample_bits)
        per_span = sent * RX_SPAN_NS / (WINDOW_S * 1e9)
        return packets <= max(RX_FLOOR, share * per_span)

    def _cut_offs(
        self,
        lossy: set[tuple[int, int, int]],
        crossing: dict[tuple[int, int, int], list[Place]],
        stats: dict[tuple[int, int, int], dict[str, float]],
        now_ns: int,
    ) -> list[Observation]:
        """Hosts cut off from the fabric, their link up — one way or both:

        * **out** (``host→leaf``): every probe the host sent over the window lost, on every
          path judged (``crossing``), to at least MIN_DESTINATIONS peers, MIN_PATHS of them
          lost in a row (``lossy``) — what it sends never reaches the fabric (its NIC not
          sending, an optic or cable one way, its own filter). What is sent to it arrives,
          or every probe of every path into it is lost from MIN_SOURCES hosts (``both
          ways``: its leaf's ARP entry for it aged out);
        * **in** (``leaf→host``): the same for every path into it, from MIN_DESTINATIONS
          peers, while its own paths out deliver and its port counted the packets in (not
          (nearly) none: that is its leaf dropping what it forwards to it, a switch's
          place, :meth:`_unreached`) — the host drops them itself (its own filter, its
          NIC's receive ring, its collector not reading). Its peers each lose one in
          fifteen of what they send and read "lossy" without it.

        Their port's counters must say the link stayed up. Named once it has lasted
        LINK_HOLD_NS (a full queue shows meanwhile; a collector restarting is back in two
        seconds), not for a host drained or whose own port contention names. Judged on
        the window's counts, not on the streak rule alone: the paths into and out of it,
        probed every second or two, go from lost-in-a-row to losing-their-newest and back
        from pass to pass."""
        # only hosts losing in a row to or from MIN_DESTINATIONS peers (a switch's drop
        # rarely is; a pass during one must not walk every path for nothing)
        reach: dict[int, set[int]] = collections.defaultdict(set)
        heard: dict[int, set[int]] = collections.defaultdict(set)
        for s, d, _p in lossy:
            reach[s].add(d)
            heard[d].add(s)
        hosts = {h for h, ds in [*reach.items(), *heard.items()] if len(ds) >= MIN_DESTINATIONS}
        hosts = (hosts & self.host_access.keys()) | self._cut.keys()
        if not hosts:
            return []
        out: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
        into: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
        for k in crossing:
            if k[0] in hosts:
                out[k[0]].append(k)
            if k[1] in hosts:
                into[k[1]].append(k)

        def nearly_all(paths: list[tuple[int, int, int]]) -> bool:
            # every probe, or so nearly every one that the random-share rule leaves it to
            # this one (its 95 % interval above GRAY_MAX_SHARE): a trickle getting through
            # (the demo lab, a host's own egress shaped to 8 kbit/s) fell between the two
            # rules, and was named only after 39 s, once its leaf's ARP entry aged out
            lost = int(sum(stats[k]["lost"] for k in paths))
            sent = int(sum(stats[k]["sent"] for k in paths))
            return sent > 0 and (lost == sent or interval95(lost, sent)[0] > GRAY_MAX_SHARE)

        def all_lost(paths: list[tuple[int, int, int]], peers: set[int]) -> bool:
            return (len(peers) >= MIN_DESTINATIONS and sum(k in lossy for k in paths) >= MIN_PATHS
                    and nearly_all(paths))  # fmt: skip

        def delivering(paths: list[tuple[int, int, int]]) -> bool:
            return (not any(k in lossy for k in paths)
                    and sum(stats[k]["lost"] < stats[k]["sent"] for k in paths) >= MIN_PATHS)  # fmt: skip

        full = self.full_ports()
        seen: dict[int, tuple[int, int, str, str]] = {}
        found = []
        for h in sorted(hosts):
            if self.host_names.get(h) in self.drained or h in full:
                continue
            counted = self.ports.counted(h, now_ns)
            if counted is None:
                continue  # its link not up throughout (a flap's), or its port not known
            paths, back = out.get(h, []), into.get(h, [])
            first, last, way, began = self._cut.get(h, (now_ns, now_ns, "", ""))
            if now_ns - last > GRAY_GAP_NS:
                way = began = ""
            if all_lost(paths, {d for _s, d, _p in paths}):
                if len({s for s, _d, _p in back}) >= MIN_SOURCES and nearly_all(back):
                    now = BOTH
                elif sum(stats[k]["lost"] < stats[k]["sent"] for k in back) >= MIN_PATHS:
                    now = OUT
                else:  # the paths into it not judged yet: as it was
                    now = way if way == BOTH else OUT
            elif (all_lost(back, {s for s, _d, _p in back})
                    and (delivering(paths) or way in (IN, BOTH))
                    and (began == IN or not self._nearly_none(counted[0], back, stats))):  # fmt: skip
                # (while its own sends go too, until all of them are lost; and once its
                # leaf, its ARP requests unanswered, no longer sends to it: as it was)
                now = IN
            else:
                continue
            if began and now not in (began, BOTH):
                # the other way alone, after one way or both: clearing, not a new fault (the
                # demo lab: a host's ingress filter removed, what is sent to it arrives at
                # once while its window still holds its sends lost, its gateway not resolved
                # — "nothing it sends arrives … its NIC is not sending" was said, and stood)
                continue
            if not began:
                first, began = now_ns, now
                self._leaky.pop(h, None)
                self._cut_said.pop(h, None)
            seen[h] = (first, now_ns, now, began)
            if now_ns - first >= LINK_HOLD_NS:
                # a trickle getting through when first named (its window all since the
                # onset by then) is said "(almost)" for good: one summary a way, and not
                # another as it heals (its window then holds probes delivered)
                if h not in self._leaky:
                    self._leaky[h] = any(stats[k]["lost"] < stats[k]["sent"] for k in
                                         {OUT: paths, IN: back}.get(now, [*paths, *back]))  # fmt: skip
                found.append(self._cut_off_observation(h, paths, back, now, began, stats,
                                                       *counted))  # fmt: skip
        # a host not cut off this pass keeps its start for GRAY_GAP_NS, as a random share
        self._cut = {h: v for h, v in self._cut.items() if now_ns - v[1] <= GRAY_GAP_NS}
        self._cut.update(seen)
        self._leaky = {h: v for h, v in self._leaky.items() if h in self._cut}
        self._cut_said = {h: v for h, v in self._cut_said.items() if h in self._cut}
        return found

    def _cut_off_observation(
        self,
        h: int,
        out: list[tuple[int, int, int]],
        into: list[tuple[int, int, int]],
        way: str,
        began: str,
        stats: dict[tuple[int, int, int], dict[str, float]],
        rx: int,
        tx: int,
    ) -> Observation:
        """A host cut off from the fabric (:meth:`_cut_offs`, ``way`` it is): on its access
        link, one anomaly whichever way and however that changes (its leaf's ARP entry
        for a host that sends nothing ages out; a host that takes nothing in loses its
        ARP entry for its gateway), the host the culprit. Whether its port counted what
        it sent out tells its NIC from its cable, optic or leaf port."""
        name = self.host_names.get
        host, port = name(h, f"host {h}"), self.host_access[h]
        covered = {OUT: out, IN: into}.get(way, [*out, *into])
        span = f"{RX_SPAN_NS / 1e9:.0f} s"
        itself = "itself (its own filter, its NIC's receive ring, or its collector not reading)"
        if IN in (way, began):  # what is sent to it lost (first): it drops what it receives
            candidates = [f"{host}'s own filter", f"{host}'s NIC (receiving)",
                          f"{host}'s collector (receiving)"]  # fmt: skip
        if way == IN:
            # not "cut off": its port may count a job's traffic in while a filter drops only
            # the probes. The count, in the evidence, changes every pass — and comes and goes
            # as its leaf's ARP entry for it runs out unanswered and its own requests renew
            # it (the demo lab): "counted", true either way, not "counts"
            why = f"its port counted them in, so they reached it: the host drops them {itself}"
        elif began == IN and way == BOTH:
            why = ("first what was sent to it was lost, its port counting it in: the host "
                   "drops what it receives (its own filter or its NIC's receive ring) — its "
                   "leaf's ARP answers too, so it can no longer send either")  # fmt: skip
        elif self._nearly_none(tx, out, stats, TX_PART):
            # a trickle its own egress queue lets out is counted out too (the demo lab's
            # 8-kbit/s shaper: about a tenth of its probes): not its optic or cable's
            counted = ("(almost) nothing out" if self._nearly_none(tx, out, stats)
                       else "only part of what it sent out")  # fmt: skip
            why = (f"its port counted {counted} over {span}: its NIC is not sending (a hung "
                   "transmit queue), or the host's own filter or egress queue drops it")  # fmt: skip
            candidates = [f"{host}'s NIC (sending)", f"{host}'s own filter", port]
        else:
            why = (f"its port counted it out: {port}'s optic or cable, or its leaf's port, "
                   "drops it")  # fmt: skip
            candidates = [f"{port} (host→leaf)", f"{host}'s NIC (sending)"]
        # what it is said to be, and where, decided when first named that way: a count
        # near a threshold (a trickle through) must not change the summary every pass
        said = self._cut_said.get(h)
        if said is not None and said[0] == way:
            _way, why, candidates = said
        self._cut_said[h] = (way, why, candidates)
        leaky = self._leaky.get(h, False)  # a trickle got through: not "nothing"
        nothing, every = ("(almost) nothing", "(almost) every") if leaky else ("nothing", "every")
        what = {
            BOTH: f"{nothing} it sends arrives and {nothing} sent to it arrives",
            OUT: f"{nothing} it sends arrives, while what it receives arrives",
        }.get(way, "")
        summary = (f"{host} takes in {nothing} sent to it, its link {port} up: {every} probe "
                   f"its peers send it is lost, while what it sends arrives; {why}" if way == IN
                   else f"{host} is cut off from the fabric, its link {port} up: {what}; {why}")  # fmt: skip
        lost = sum(stats[k]["lost"] for k in covered)
        n = sum(stats[k]["sent"] for k in covered)
        peers = {d for _s, d, _p in out} if way != IN else {s for s, _d, _p in into}
        pairs = sorted({f"{name(s, f'host {s}')}→{name(d, f'host {d}')}" for s, d, _ in covered})
        return Observation(
            kind=KIND,
            key=f"{port} (host cut off)",
            score=1.0,
            summary=summary,
            link=port,
            evidence={
                **self._where(self.host_rack.get(h, ""), [], [], covered),
                "host": host,
                "direction": way,
                "candidates": candidates,
                "confidence": 1.0,
                "pattern": "almost every packet" if leaky else "every packet",
                "peers_unreached": len(peers),
                "lossy_paths": len(covered),
                "clean_paths_through": 0,
                "flow_share": 1.0,
                "lost_probes": int(lost),
                "sent_probes": int(n),
                "pairs": pairs[:20],
                "port_rx_packets": {host: rx},
                "port_tx_packets": {host: tx},
                "source": "probe loss per (pair, source port), its access port's counters",
            },
        )

    def _premature(
        self,
        place: Place,
        pending: set[tuple[int, int, int]],
        crossing: dict[tuple[int, int, int], list[Place]],
    ) -> bool:
        """A place narrower than its switch (towards one host, one link) while other paths
        through the same spine are losing their newest probes but not judged lossy yet:
        destinations are judged at their own pace (each receiver's watermark), so wait
        for those before saying only some are dropped."""
        if place.what == "switch":
            return False
        spine = place.name if place.what == "to" else self._link_spine.get(place.name, "")
        whole = Place("switch", spine)
        return any(whole in crossing[k] and place not in crossing[k] for k in pending)

    @staticmethod
    def _port_queued(covered: Iterable[tuple[int, int, int]], full: set[int]) -> bool:
        """Whether every path of ``covered`` goes into or out of a host whose own port
        holds a full queue (``full``, :attr:`full_ports`): their loss is that queue's.
        Seen in the demo lab: a leaf's port towards one host, 6 kB of buffer fed three
        times faster than it drains, dropped a quarter of the probes to that host and
        delayed the rest 0–0.8 ms — and the two paths that lost five in a row through
        spine1 were paged as "spine1 towards h2-3 silently drops traffic … no queue"
        (the links' median delay rise, over every path through them, was 0.5 µs)."""
        return bool(full) and all(s in full or d in full for s, d, _p in covered)

    def _queues(
        self,
        links: dict[tuple[int, int, int], list[Place]],
        stats: dict[tuple[int, int, int], dict[str, float]],
        now_ns: int,
    ) -> dict[Place, float]:
        """Per link-direction, the median over the paths crossing it of their received
        probes' delay over their pair's floor (ns; last RECENT_S): a full queue delays
        what it does not drop. A link-direction over RISE_NS is remembered as queued for
        QUEUE_MEMORY_S: the streaks of probes a queue dropped outlive the queue by a few
        seconds, and must not then pass for a silent drop."""
        by_hop: dict[Place, list[float]] = collections.defaultdict(list)
        for k, hops in links.items():
            st = stats[k]
            ex = st["delay"] - st["floor"]
            if math.isfinite(ex):
                for p in hops:
                    by_hop[p].append(ex)
        rise = {p: float(np.median(v)) for p, v in by_hop.items()}
        for p, r in rise.items():
            if r > RISE_NS:
                self._queued[p] = now_ns + int(QUEUE_MEMORY_S * 1e9)
        self._queued = {p: t for p, t in self._queued.items() if t > now_ns}
        return rise

    def _observation(
        self,
        places: list[Place],
        covered: set[tuple[int, int, int]],
        clean_of: collections.Counter[Place],
        crossing: dict[tuple[int, int, int], list[Place]],
        stats: dict[tuple[int, int, int], dict[str, float]],
        rise: float,
        reportable: int,
        port_rx: int | None = None,
    ) -> Observation:
        """``port_rx``: for a leaf towards its own host, the packets that host's port counted
        in (:meth:`_unreached`)."""
        name = self.host_names.get
        best = places[0]
        to = [p for p in places if p.what == "to"]
        switches = [p for p in places if p.what == "switch"]
        dests = sorted({name(int(p.detail), f"host {p.detail}") for p in to})
        sw = to[0].name if to else switches[0].name if switches else ""
        # the links the lossy paths leave a spine by (towards their destinations): taking
        # the one link out routes round it. A leaf drops before it picks an uplink (its
        # FIB entry), so no link of a leaf's is offered.
        links = sorted({
            p.name for k in covered for p in crossing[k]
            if p.what == "link" and p.detail == "spine→leaf" and p.name.endswith(f"-{sw}")
        }) if sw in self._link_spine.values() else []  # fmt: skip
        link_places = [p for p in places if p.what == "link"]
        if not sw and link_places:
            links = sorted({p.name for p in link_places})
        through = len(covered) + clean_of[best]
        lost = sum(stats[k]["lost"] for k in covered)
        sent = sum(stats[k]["sent"] for k in covered)
        pairs = sorted({f"{name(s, f'host {s}')}→{name(d, f'host {d}')}" for s, d, _ in covered})
        sources = sorted({name(s, f"host {s}") for s, _, _ in covered})
        if sw:
            where = f"{sw} towards {', '.join(dests)}" if dests else sw
            key = f"{sw}" + (f" → {','.join(dests)}" if dests else "")
        else:
            where = " or ".join(f"{p.name} ({p.detail})" for p in link_places)
            key = where
        share = len(covered) / through if through else 1.0
        # No counts when it is every path: which paths (and so which senders, and their
        # racks) have lost enough probes to be judged changes every pass (11-24 of 24
        # paths, 7-10 senders on the demo lab); the place says whom, the evidence counts.
        what = (
            "every path through it loses every probe"
            if share >= 1.0
            else f"{len(covered)} of {through} paths through it ({share:.0%}) lose every "
            f"probe ({len(sources)} source host(s))"
        )
        summary = (
            f"{where} silently drops traffic: {what}; links and routes up, paths unmoved, no queue"
        )
        if len(links) == 1:
            summary += f"; out of service: {links[0]}"
        alternatives = [_words(p, name) for p in places]
        if port_rx is not None:  # its own host: the probes never reached the host's NIC
            host = dests[0]
            # not the count itself (0 or 1 by turns, the leaf's ARP): it is in the evidence
            summary += (
                f"; {host}'s port counted (almost) nothing in over "
                f"{RX_SPAN_NS / 1e9:.0f} s, its link up and its own probes out delivered"
                " (or its NIC discards what it receives before counting it)"
            )
            alternatives.append(f"{host}'s NIC (receiving)")
        obs = Observation(
            kind=KIND,
            key=key,
            score=min(1.0, 0.5 + 0.05 * len(covered)),
            summary=summary,
            link=links[0] if len(links) == 1 else "",
            evidence={
                **self._where(sw, links, dests, covered),
                "candidates": alternatives,
                "confidence": round(
                    len(covered)
                    / max(reportable, 1)
                    / len({p.name for p in places if p.what != "link"} or {""}),
                    2,
                ),
                "lossy_paths": len(covered),
                "clean_paths_through": clean_of[best],
                "flow_share": round(share, 3),
                "lost_probes": int(lost),
                "sent_probes": int(sent),
                "pairs": pairs[:20],
                "delay_rise_us": round(rise / 1e3, 1),
                "source": "probe loss per (pair, source port), paths from traces, tomography",
            },
        )
        if port_rx is not None:
            obs.evidence["port_rx_packets"] = {dests[0]: port_rx}
        return obs


def _refined(
    best: Place,
    covered: set[tuple[int, int, int]],
    claims: dict[Place, set[tuple[int, int, int]]],
    clean_of: collections.Counter[Place],
    left: set[tuple[int, int, int]],
) -> list[tuple[Place, set[tuple[int, int, int]]]]:
    """``best`` and the lossy paths it would explain — or, when narrower places explain
    those paths better, each of those and its share. A spine black-holing two hosts of
    different racks: "the spine drops 12 % of the flows" earns more than either "the spine
    towards h1-2" or "towards h4-1" (each explains half the paths), less than the two
    together (no clean path through either), and was paged as the spine's share drop on
    the demo lab. Narrower: fewer clean paths, no lossy path outside ``covered``; chosen
    greedily over ``covered`` alone, by the same evidence."""
    narrower = [
        p for p in claims
        if clean_of[p] < clean_of[best] and claims[p] & covered and claims[p] & left <= covered
    ]  # fmt: skip
    parts: list[tuple[Place, set[tuple[int, int, int]]]] = []
    rest = set(covered)
    gain = 0.0
    while rest and narrower:
        pick = _best(narrower, rest, claims, clean_of)
        if pick is None:
            break
        parts.append(pick)
        rest -= pick[1]
        gain += evidence(len(pick[1]), clean_of[pick[0]])
    return parts if gain > evidence(len(covered), clean_of[best]) else [(best, covered)]


def _best(
    places: Iterable[Place],
    paths: set[tuple[int, int, int]],
    claims: dict[Place, set[tuple[int, int, int]]],
    clean_of: collections.Counter[Place],
) -> tuple[Place, set[tuple[int, int, int]]] | None:
    """Of ``places``, the one that best explains the lossy ``paths`` it crosses (most
    :func:`evidence`, then fewest clean paths, then by name), and those paths — or None
    when it explains fewer than MIN_PATHS or does not earn its cost."""
    best = max(
        places,
        key=lambda p: (evidence(len(claims[p] & paths), clean_of[p]), -clean_of[p], repr(p)),
    )
    part = claims[best] & paths
    if len(part) < MIN_PATHS or evidence(len(part), clean_of[best]) <= 0:
        return None
    return best, part


def _words(p: Place, name: object) -> str:
    get = name  # host_names.get
    if p.what == "to":
        return f"{p.name} towards {get(int(p.detail), f'host {p.detail}')}"  # type: ignore[operator]
    if p.what == "link":
        return f"{p.name} ({p.detail})"
    return p.name


def _merge(a: Observation, b: Observation) -> None:
    """Two places of one switch (two destinations): one anomaly."""
    e, f = a.evidence, b.evidence
    for k in ("links", "destinations", "from_racks", "candidates", "pairs"):
        e[k] = sorted(set(e[k]) | set(f[k]))
    for k in ("lossy_paths", "clean_paths_through", "lost_probes", "sent_probes"):
        e[k] += f[k]
    e["confidence"] = round(min(1.0, e["confidence"] + f["confidence"]), 2)
    a.link = e["links"][0] if len(e["links"]) == 1 else ""
    a.score = max(a.score, b.score)
