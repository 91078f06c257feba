"""What the TUI shows, computed from the ingest daemon's ``/v1/live`` (no Textual here).

:class:`LiveSource` fetches ``/v1/live`` over HTTP (so the TUI runs on the controller as
well as on the ops box); :func:`fleet` turns one answer into NIC tiles grouped by rack
(an ECMP group), each coloured by its loss and by whether the detector judged a path of
it queued beyond that path's own healthy delay (the pair's ``queue_us``: what
``clockmesh live`` calls ``slow``; a fixed delay line cannot be right on every fabric —
a healthy lab pair shows ~10 µs, a healthy fabric's a few) — or marked the *culprit* of
an open anomaly (its own link) or *affected* by one (its loss or queue is all on pairs the
anomaly explains) — and a header: healthy, failing and affected NICs, jobs, open
anomalies by class, clock-sync quality. Each tile also shows its worst corrected one-way
delay.

Corrected one-way delay of a pair = raw (receiver clock − sender clock) − (offset of the
receiver − offset of the sender), with the clock solver's offsets from the same answer.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analytics.detect import attribution
from analytics.topology import racks as racks_of
from analytics.topology import read_topology, search_words

GREEN, AMBER, RED, GREY = "ok", "slow", "loss", "silent"
CULPRIT, AFFECTED = "culprit", "affected"  # an open anomaly names its link / explains it
FAILING = (CULPRIT, RED, AMBER, GREY)


@dataclass(frozen=True)
class Thresholds:
    """A NIC's colour; the defaults are ``clockmesh live``'s verdicts
    (:mod:`analytics.detect.attribution`), so the two never disagree."""

    amber_us: float = 0.0  # a queue the detector judged slow, above this (µs): amber
    red_loss: float = attribution.LOSSY  # loss above this (1 %, either direction): red
    # no batch for this long: grey (None: attribution.stale_after the advised interval)
    silent_s: float | None = None


@dataclass
class Tile:
    host: str
    rack: str
    worst_owd_us: float | None  # corrected, over the pairs it sends or receives
    worst_loss: float  # of its probes sent or sent to it, the larger share lost
    worst_peer: str
    offset_ns: float | None
    uncertainty_ns: float | None
    clock_status: str
    age_s: float
    state: str  # CULPRIT, GREY, RED, AMBER, AFFECTED, GREEN
    culprit_of: list[str] = field(default_factory=list)  # open anomalies naming its link
    affected_by: list[str] = field(default_factory=list)  # anomalies explaining its worst
    because: str = ""  # where those anomalies are ("h1-2-leaf1"); slow: "queue 38 µs";
    # grey while it ships: "sends no probes"


@dataclass
class Fleet:
    tiles: list[Tile] = field(default_factory=list)
    racks: dict[str, list[Tile]] = field(default_factory=dict)
    healthy: int = 0
    failing: int = 0  # culprit, loss, slow or silent
    affected: int = 0  # loss or delay, all of it explained by open anomalies
    culprits: list[Tile] = field(default_factory=list)
    anomalies_by_kind: dict[str, int] = field(default_factory=dict)
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    jobs: int = 0  # running (/v1/live jobs)
    jobs_v1: int = 0  # of which on RoCE v1 on at least one host
    clock_solved: int = 0
    clock_hosts: int = 0
    clock_sigma_ns: float | None = None
    model: str = ""
    clear_s: float | None = None  # an anomaly not seen this long closes


class LiveSource:
    """``/v1/live`` of one ingest daemon."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url.rstrip("/") + "/v1/live"
        self.timeout_s = timeout_s

    def __call__(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
            return dict(json.load(resp))


def load_racks(topology: Path | None) -> dict[str, str]:
    """host -> rack (its leaf) from a topology file; {} when none is given."""
    return racks_of(read_topology(topology)) if topology is not None else {}


def _rack_of(host: str, racks: dict[str, str]) -> str:
    return racks.get(host) or "(no rack)"


# a correction more uncertain is shown only for a delay UNSURE_K times its uncertainty
UNSURE_NS = 5_000.0
UNSURE_K = 3.0  # within 3 σ of its clocks, a delay may be the clocks' error


def clock_sigmas(clock_hosts: list[dict[str, Any]]) -> dict[str, float]:
    """host -> its clock's uncertainty (ns); inf where not given (the daemon writes NaN
    and inf as null)."""
    out = {}
    for h in clock_hosts:
        sigma = h.get("uncertainty_ns")
        out[h["host"]] = float(sigma) if isinstance(sigma, int | float) else float("inf")
    return out


def corrected(raw: float | None, src: str, dst: str, offsets: dict[str, Any],
              sigmas: dict[str, float] | None = None) -> float | None:  # fmt: skip
    """A pair's corrected one-way delay (µs) from its raw one and the two clocks' offsets
    (ns); None while either clock is unsolved — or, given ``sigmas``, while the two
    clocks' uncertainty is over both :data:`UNSURE_NS` and a third of the delay: a full
    queue in front of one host's port looks like that host's clock running ahead, and the
    solver says how unsure it is; such a delay is not shown rather than shown wrong."""
    if raw is None or offsets.get(src) is None or offsets.get(dst) is None:
        return None
    d = float(raw - (offsets[dst] - offsets[src]) / 1e3)
    if sigmas is not None:
        sig = math.hypot(sigmas.get(src, math.inf), sigmas.get(dst, math.inf))
        if sig > max(UNSURE_NS, abs(d) * 1e3 / UNSURE_K):
            return None
    return d


@dataclass(frozen=True)
class Clocks:
    """The clock solver's answer in one ``/v1/live`` document: each host's offset and
    uncertainty (ns), for the delays shown beside it."""

    offsets: dict[str, Any]
    sigmas: dict[str, float]

    @classmethod
    def of(cls, live: dict[str, Any]) -> Clocks:
        hosts = (live.get("clock") or {}).get("hosts", [])
        return cls({h["host"]: h.get("offset_ns") for h in hosts}, clock_sigmas(hosts))

    def corrected(self, raw: float | None, src: str, dst: str) -> float | None:
        """:func:`corrected` with these clocks' offsets and uncertainties."""
        return corrected(raw, src, dst, self.offsets, self.sigmas)


def _worse(table: dict[str, tuple[float, str, list[str]]], me: str, value: float, peer: str,
           ids: list[str]) -> None:  # fmt: skip
    if value > table.get(me, (-1e18, "", []))[0]:
        table[me] = (value, peer, ids)


def fleet(live: dict[str, Any], racks: dict[str, str], th: Thresholds | None = None) -> Fleet:
    """The fleet model of one ``/v1/live`` answer. A pair whose place an open anomaly
    names (its ``explained_by``, placed by the daemon: analytics/detect/attribution.py)
    makes its hosts *affected*, not failing; a host whose own link an open anomaly names
    is the *culprit*."""
    th = th or Thresholds()
    ingest = live.get("ingest") or {}
    fleet_silent_s = attribution.stale_after(ingest.get("advised_roll_s"))
    clock = {h["host"]: h for h in (live.get("clock") or {}).get("hosts", [])}
    clocks = Clocks.of(live)
    anomalies = live.get("anomalies") or {}
    now = attribution.places(anomalies.get("open", []), {})
    culprits, cut_off = now.host, now.around  # cut off: a leaf gone whole, its hosts
    where = {str(a.get("anomaly_id")): attribution.place_name(a) or str(a.get("kind"))
             for a in anomalies.get("open", [])}  # fmt: skip
    # worst corrected delay (shown), worst queue (judged) and worst loss per host,
    # unexplained (u) and explained (x)
    owd: dict[str, tuple[float, str, list[str]]] = {}
    q_u: dict[str, tuple[float, str, list[str]]] = {}
    q_x: dict[str, tuple[float, str, list[str]]] = {}
    loss_u: dict[str, tuple[float, str, list[str]]] = {}
    loss_x: dict[str, tuple[float, str, list[str]]] = {}
    for p in live.get("pairs", []):
        src, dst = p["src"], p["dst"]
        ids = list(p.get("explained_by") or [])
        q_t, loss_t = (q_x, loss_x) if ids else (q_u, loss_u)
        d = clocks.corrected(p.get("owd_raw_p50_us"), src, dst)
        lo = float(p.get("loss") or 0.0)
        q = p.get("queue_us")
        for me, peer in ((src, dst), (dst, src)):
            if d is not None:
                _worse(owd, me, d, peer, ids)
            if isinstance(q, int | float):
                _worse(q_t, me, float(q), peer, ids)
            _worse(loss_t, me, lo, peer, ids)
    out = Fleet()
    none: tuple[float, str, list[str]] = (0.0, "", [])
    for h in live.get("hosts", []):
        name = h["host"]
        lo, lo_peer, _ = loss_u.get(name, none)
        xlo, xlo_peer, xlo_ids = loss_x.get(name, none)
        lo_all = max(lo, xlo)
        if "loss_unexplained" in h:  # as clockmesh live judges it: the daemon's shares of
            # this host's probes, both directions (the pairs above only name the peer)
            lo = float(h["loss_unexplained"] or 0.0)
            lo_all = max(float(h.get("loss_sent") or 0.0), float(h.get("loss_received") or 0.0))
            xlo_ids = [str(i) for i in h.get("affected_by") or []] or xlo_ids
        w = owd.get(name)
        worst_owd = w[0] if w is not None else None
        q, q_peer, _ = q_u.get(name, none)
        xq, xq_peer, xq_ids = q_x.get(name, none)
        c = clock.get(name, {})
        age = float(h.get("last_batch_age_s") or 0.0)
        probe_age = attribution.probe_age(h)
        # (a silent_s set by hand holds for every host; else each host's own interval)
        silent_s = th.silent_s or attribution.host_stale_after(h, fleet_silent_s)
        culprit_of = list(h.get("culprit_of") or culprits.get(name, []))
        affected_by: list[str] = []
        peer = ""
        if culprit_of:
            state = CULPRIT
            peer = (xlo_peer if xlo > th.red_loss else "") or lo_peer
        elif age > silent_s:
            state, peer = GREY, (w[1] if w else "")
        elif name in cut_off:  # affected before the live window's loss shows it, whatever
            # it sends or not (attribution.verdict's order: a dead leaf gives no route)
            state, peer, affected_by = AFFECTED, xlo_peer or lo_peer, list(cut_off[name])
        elif h.get("sent") == 0 or (probe_age or 0.0) > silent_s:  # ships batches, sends
            # no probes (now): clockmesh live's silent
            state, peer = GREY, lo_peer or xlo_peer
        elif lo > th.red_loss:
            state, peer = RED, lo_peer or xlo_peer
        elif q_peer and q > th.amber_us:
            state, peer = AMBER, q_peer
        elif lo_all > th.red_loss or xlo > 0:  # any loss an anomaly explains: its victim
            state, peer, affected_by = AFFECTED, xlo_peer or lo_peer, xlo_ids
        elif xq_peer and xq > th.amber_us:
            state, peer, affected_by = AFFECTED, xq_peer, xq_ids
        else:
            state = GREEN
            peer = w[1] if w else ""
        because = ", ".join(where.get(i, i) for i in culprit_of or affected_by)
        if state == AMBER:
            because = "queue " + attribution.queue_text(q)
        elif state == GREY and age <= silent_s:
            because = "sends no probes"
            if h.get("sent") and probe_age is not None:
                because = f"no probes for {probe_age:.0f} s"
        tile = Tile(name, _rack_of(name, racks), None if worst_owd is None else round(worst_owd, 2),
                    lo_all, peer, c.get("offset_ns"), c.get("uncertainty_ns"),
                    str(c.get("status", "")), age, state, culprit_of, affected_by,
                    because)  # fmt: skip
        out.tiles.append(tile)
        out.racks.setdefault(tile.rack, []).append(tile)
    out.healthy = sum(1 for t in out.tiles if t.state == GREEN)
    out.affected = sum(1 for t in out.tiles if t.state == AFFECTED)
    out.failing = len(out.tiles) - out.healthy - out.affected
    out.culprits = [t for t in out.tiles if t.state == CULPRIT]
    out.anomalies = list(anomalies.get("open", []))
    out.anomalies_by_kind = {k: n for k, n in (anomalies.get("open_by_kind") or {}).items() if n}
    out.model = str(anomalies.get("model", ""))
    clear_s = anomalies.get("clear_s")
    out.clear_s = float(clear_s) if isinstance(clear_s, int | float) else None
    jobs = live.get("jobs") or []
    out.jobs = len(jobs)
    out.jobs_v1 = sum(1 for j in jobs if j.get("roce_v1_hosts"))
    statuses = Counter(h.get("status") for h in clock.values())
    out.clock_hosts = len(clock)
    out.clock_solved = statuses.get("solved", 0)
    sig = sorted(h["uncertainty_ns"] for h in clock.values() if h.get("uncertainty_ns") is not None)
    out.clock_sigma_ns = sig[len(sig) // 2] if sig else None
    return out


def load_search_words(topology: Path | None) -> dict[str, str]:
    """host -> what else the filter finds it by (:func:`analytics.topology.search_words`)."""
    return search_words(read_topology(topology)) if topology is not None else {}


def matches(tile: Tile, query: str, words: dict[str, str] | None = None) -> bool:
    """Filter: every word of the query must appear in the host's name, rack, state,
    addresses or tags (``words``: :func:`load_search_words`)."""
    hay = f"{tile.host} {tile.rack} {tile.state} {(words or {}).get(tile.host, '')}".lower()
    return all(word in hay for word in query.lower().split())
