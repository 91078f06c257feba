"""Culprit and victims: which open anomaly explains a pair's loss or delay, and whose fault.

A host whose own access link flaps sends nothing while the link is down (so it loses
nothing of its own) while every peer loses the probes it sends *to* that host: judged by
what each host sent, the culprit looks healthy and its victims look broken. So loss is
judged from both directions (what a host sent that was lost, and what was sent to it that
was lost), and every pair is matched against the *places* the open anomalies name:

* a host access link (``evidence.host``): that host is the **culprit**; every pair to or
  from it crosses the place;
* a leaf that went as a whole (``evidence.hosts_cut_off``): every pair to or from its
  hosts crosses it, and the leaf, not its hosts, is the culprit;
* a leaf–spine link (``evidence.racks_exposed`` / ``evidence.leaf``, or the link's leaf
  from the topology): the pairs between its rack and another rack cross it;
* a contended link and direction (``evidence.direction``): leaf→spine carries the pairs
  leaving the link's rack, spine→leaf those entering it;
* a switch dropping what it forwards to some hosts (``evidence.destinations`` with
  ``evidence.from_racks``): the pairs from those racks to those hosts.

Anomalies that name no place a probe crosses (a RoCE v1 job) explain nothing here. The
place comes from the evidence, not the class, so a model that re-judged a class
(``unknown``) still places it. A pair's ``explained_by`` lists the open anomalies whose
place it crosses: its loss or delay, if any, is theirs. A host's loss split into explained
and unexplained parts gives its verdict (:func:`verdict`): ``culprit`` (an open anomaly
names its own link), ``lossy`` (loss no open anomaly explains), ``slow`` (a pair of it
the detector judged queued beyond that path's own healthy delay — the pair's
``queue_us`` — and no open anomaly explains), ``affected`` (loss or queue, all of it
explained, however little: a spine port losing 1 % of what it sends loses each of its
victims well under 1 % of their probes, and they are its), ``ok``. Readers
(``/v1/live``, ``clockmesh live``, the TUI, the report) all go through this module. No
Textual, no DuckDB here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

LOSSY = 0.01  # more than 1 % lost in either direction (unexplained) is worth a look
STALE_S = 5.0  # no batch for longer than this: stale ...
# ... or than this many of the intervals the ops box advises collectors to ship at, when
# longer (a large fleet is advised up to 30 s: analytics/ingest/pace.py)
STALE_ROLLS = 2.5

CULPRIT, STALE, SILENT, LOSSY_, SLOW, AFFECTED, OK = (
    "culprit", "stale", "silent", "lossy", "slow", "affected", "ok",
)  # fmt: skip


@dataclass(frozen=True)
class Places:
    """The open anomalies, compiled into lookups a pair is checked against in O(1)."""

    host: dict[str, list[str]] = field(default_factory=dict)  # host -> anomaly ids
    # host -> anomalies of a switch every path to or from it crosses (a leaf gone whole)
    around: dict[str, list[str]] = field(default_factory=dict)
    leave: dict[str, list[str]] = field(default_factory=dict)  # pairs leaving this leaf
    enter: dict[str, list[str]] = field(default_factory=dict)  # pairs entering this leaf
    # destination host -> (the source racks whose pairs to it are dropped, anomaly id)
    to: dict[str, list[tuple[frozenset[str], str]]] = field(default_factory=dict)

    def explained_by(self, src: str, dst: str, src_rack: str, dst_rack: str) -> list[str]:
        """The anomalies whose place the probes from ``src`` to ``dst`` cross."""
        out: list[str] = []
        for ids in (self.host.get(src), self.host.get(dst), self.around.get(src),
                    self.around.get(dst)):  # fmt: skip
            if ids:
                out += ids
        out += [aid for racks, aid in self.to.get(dst, ()) if src_rack in racks]
        if src_rack and dst_rack and src_rack != dst_rack:
            for ids in (self.leave.get(src_rack), self.enter.get(dst_rack)):
                if ids:
                    out += ids
        return sorted(set(out)) if len(out) > 1 else out


def places(anomalies: Iterable[Mapping[str, Any]], link_leaf: Mapping[str, str]) -> Places:
    """Compile the open anomalies' places (``link_leaf``: fabric link name -> its leaf)."""
    p = Places()

    def add(side: dict[str, list[str]], leaf: str, aid: str) -> None:
        side.setdefault(leaf, []).append(aid)

    for a in anomalies:
        aid = str(a.get("anomaly_id", ""))
        ev = a.get("evidence") or {}
        if not isinstance(ev, Mapping):
            continue
        if ev.get("host"):  # a host's own access link
            p.host.setdefault(str(ev["host"]), []).append(aid)
            continue
        if ev.get("hosts_cut_off"):  # a leaf gone as a whole: its hosts' every path
            for h in ev["hosts_cut_off"]:
                p.around.setdefault(str(h), []).append(aid)
            continue
        dests, froms = ev.get("destinations"), ev.get("from_racks")
        if dests and froms:  # a switch dropping what it forwards to these hosts
            for d in dests:
                p.to.setdefault(str(d), []).append((frozenset(str(r) for r in froms), aid))
            continue
        link = str(a.get("link") or "")
        direction = str(ev.get("direction") or "")
        if direction:  # contention on one direction of a leaf–spine link
            leaf = str(ev.get("leaf") or link_leaf.get(link, ""))
            if leaf:
                add(p.leave if direction.startswith("leaf") else p.enter, leaf, aid)
            continue
        leaves = [str(x) for x in ev.get("racks_exposed") or []]
        if not leaves:
            cands = [str(c) for c in ev.get("candidates") or []] or ([link] if link else [])
            leaves = [link_leaf[c] for c in cands if c in link_leaf]
            if ev.get("leaf"):
                leaves.append(str(ev["leaf"]))
        for leaf in sorted(set(leaves)):  # a leaf–spine link: both ways between racks
            add(p.leave, leaf, aid)
            add(p.enter, leaf, aid)
    return p


@dataclass
class HostLoss:
    """One host's probes in both directions, split by whether an open anomaly explains them."""

    sent: int = 0  # probes it sent
    lost: int = 0  # of those, lost
    lost_explained: int = 0
    sent_to: int = 0  # probes its peers sent to it
    lost_to: int = 0  # of those, lost
    lost_to_explained: int = 0
    peers_losing_to: int = 0  # peers that lost probes sent to it
    peers_to: int = 0  # peers that sent to it
    culprit_of: list[str] = field(default_factory=list)  # anomalies naming its own link
    # open anomalies of a switch that cut every path to and from it (a leaf gone whole):
    # affected from the anomaly on, before the live window's loss shows it
    cut_off_by: list[str] = field(default_factory=list)
    affected_by: set[str] = field(default_factory=set)  # anomalies explaining lost probes
    # The worst queue (µs beyond the path's healthy delay) of its pairs judged slow, those
    # no anomaly explains (and the peer) and those one does; 0: none
    queue_us: float = 0.0
    queue_peer: str = ""
    queue_explained_us: float = 0.0

    @staticmethod
    def _share(n: int, of: int) -> float:
        return n / of if of else 0.0

    @property
    def loss_sent(self) -> float:
        return self._share(self.lost, self.sent)

    @property
    def loss_received(self) -> float:
        return self._share(self.lost_to, self.sent_to)

    @property
    def unexplained(self) -> float:
        """The larger share of unexplained loss, of the two directions."""
        return max(self._share(self.lost - self.lost_explained, self.sent),
                   self._share(self.lost_to - self.lost_to_explained, self.sent_to))  # fmt: skip

    @property
    def worst(self) -> float:
        return max(self.loss_sent, self.loss_received)

    def doc(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "loss_sent": round(self.loss_sent, 6),
            "sent_to": self.sent_to,
            "loss_received": round(self.loss_received, 6),
            "loss_unexplained": round(self.unexplained, 6),
            "peers_losing_to": self.peers_losing_to,
            "peers_to": self.peers_to,
            "culprit_of": list(self.culprit_of),
            "cut_off_by": list(self.cut_off_by),
            "affected_by": sorted(self.affected_by),
            "queue_us": round(max(self.queue_us, self.queue_explained_us), 1) or None,
            "queue_unexplained_us": round(self.queue_us, 1) or None,
        }


def attribute(
    hosts: Iterable[str],
    pairs: Iterable[Mapping[str, Any]],
    anomalies: Iterable[Mapping[str, Any]],
    racks: Mapping[str, str],
    link_leaf: Mapping[str, str],
    explained: list[list[str]] | None = None,
    closed: Iterable[Mapping[str, Any]] = (),
) -> tuple[list[list[str]], dict[str, HostLoss]]:
    """Each pair's ``explained_by`` (in order) and each host's :class:`HostLoss`.

    ``pairs``: ``src``, ``dst`` (names), ``sent``, ``received``, optionally ``queue_us``
    (the detector judged the pair slow: its queue, µs); ``racks``: host -> leaf.
    ``explained``: each pair's ``explained_by`` as the daemon placed it (a reader of
    ``/v1/live`` passes it; the places are then not computed again). ``closed``:
    anomalies closed within the live window — the loss they caused is still counted there,
    so they still explain it; only an open one makes a culprit.
    """
    anomalies = list(anomalies)
    pl = places([*anomalies, *closed], link_leaf)
    out = {h: HostLoss() for h in hosts}
    now = places(anomalies, link_leaf)
    for h, ids in now.host.items():
        if h in out:
            out[h].culprit_of = list(ids)
    for h, ids in now.around.items():
        if h in out:
            out[h].cut_off_by = list(ids)
            out[h].affected_by.update(ids)
    given = explained
    explained = []
    # The daemon runs this for every /v1/live request (~130,000 pairs at 13,000 hosts):
    # the common pair crosses no anomaly's place and is judged with a few dict lookups.
    by_host, leave, enter, to, rack = pl.host, pl.leave, pl.enter, pl.to, racks.get
    around = pl.around
    racked = bool(leave or enter)
    for n, p in enumerate(pairs):
        src, dst = p["src"], p["dst"]
        if given is not None:
            ids = [str(x) for x in given[n]]
        else:
            ids = []
            if racked:
                rs, rd = rack(src), rack(dst)
                if rs != rd and (rs in leave or rd in enter):
                    ids = pl.explained_by("", "", rs or "", rd or "")
            if src in by_host or dst in by_host or dst in to or src in around or dst in around:
                ids = pl.explained_by(src, dst, rack(src) or "", rack(dst) or "")
        explained.append(ids)
        sent = p["sent"] or 0
        lost = sent - (p["received"] or 0)
        s = out.get(src) or out.setdefault(src, HostLoss())
        d = out.get(dst) or out.setdefault(dst, HostLoss())
        s.sent += sent
        d.sent_to += sent
        d.peers_to += 1
        if lost > 0:
            s.lost += lost
            d.lost_to += lost
            d.peers_losing_to += 1
            if ids:
                s.lost_explained += lost
                d.lost_to_explained += lost
                s.affected_by.update(ids)
                d.affected_by.update(ids)
        queue = p.get("queue_us")
        if queue:
            for me, peer in ((s, dst), (d, src)):
                if ids:
                    me.queue_explained_us = max(me.queue_explained_us, float(queue))
                    me.affected_by.update(ids)
                elif queue > me.queue_us:
                    me.queue_us, me.queue_peer = float(queue), peer
    return explained, out


def stale_after(advised_roll_s: object) -> float:
    """Seconds without a batch after which a host is stale: :data:`STALE_S`, or
    :data:`STALE_ROLLS` of the shipping interval the ops box advises (``/v1/live``'s
    ``ingest.advised_roll_s``) when that is longer — at 13,000 hosts a healthy host ships
    every ~30 s, and 5 s would call the whole fleet stale."""
    roll = float(advised_roll_s) if isinstance(advised_roll_s, int | float) else 0.0
    return max(STALE_S, STALE_ROLLS * roll)


def host_stale_after(host: Mapping[str, Any], stale_s: float) -> float:
    """``stale_s`` (:func:`stale_after` the advised interval), or :data:`STALE_ROLLS` of
    the interval this host ships at (``/v1/live``'s ``roll_s``, its collector's own
    ``spool.roll_s`` when longer than the advice) when that is longer: a collector set to
    ship every 10 s is not silent 5 s after each batch."""
    roll = host.get("roll_s")
    return max(stale_s, STALE_ROLLS * float(roll)) if isinstance(roll, int | float) else stale_s


def verdict(
    loss: HostLoss,
    age_s: float,
    stale_s: float = STALE_S,
    lossy: float = LOSSY,
    probe_age_s: float | None = None,
) -> str:
    """``culprit`` | ``stale`` | ``silent`` | ``lossy`` | ``slow`` | ``affected`` | ``ok``.

    The culprit first: an open anomaly names its own link, whatever its own probes say.
    A host an open anomaly cut off (its leaf gone whole) is affected from then on, before
    its loss reaches the live window, and whether it still sends probes or not.
    ``probe_age_s``: seconds since the last batch that carried probes it sent
    (``/v1/live``'s ``last_probe_age_s``; None: unknown). A host whose batches arrive
    without them for ``stale_s`` is silent, although the live window still counts the
    probes it sent before (a firewall dropping its probes fails their sends: they are
    never recorded, so never lost).
    """
    if loss.culprit_of:
        return CULPRIT
    if age_s > stale_s:
        return STALE
    if loss.cut_off_by:  # whatever it sends or not (a dead leaf: no route to send on)
        return AFFECTED
    if not loss.sent or (probe_age_s is not None and probe_age_s > stale_s):
        return SILENT
    if loss.unexplained > lossy:
        return LOSSY_
    if loss.queue_us > 0:
        return SLOW
    if loss.lost_explained or loss.lost_to_explained or loss.queue_explained_us > 0:
        return AFFECTED  # any loss an anomaly explains, however small: its victim
    return OK


def probe_age(host: Mapping[str, Any]) -> float | None:
    """Seconds a ``/v1/live`` host row has been without probes it sent, while its
    collector ran: its ``last_probe_age_s``, or its ``collector_run_age_s`` when that is
    younger — a collector restarted a moment ago has sent none yet, and is not silent
    (None: none yet, or an older daemon)."""
    x = host.get("last_probe_age_s")
    if not isinstance(x, int | float):
        return None
    run = host.get("collector_run_age_s")
    return float(min(x, run)) if isinstance(run, int | float) else float(x)


def queue_text(us: float) -> str:
    """A queue as read at a glance: "61 µs", "46.6 ms"."""
    return f"{us:.0f} µs" if us < 999.5 else f"{us / 1e3:.1f} ms"


def place_name(a: Mapping[str, Any]) -> str:
    """What an anomaly names, in a few words: its link, its job, or the switch (towards the
    hosts) it drops at — "" when it names none."""
    if a.get("link") or a.get("job_id"):
        return str(a.get("link") or a.get("job_id"))
    ev = a.get("evidence") or {}
    if not isinstance(ev, Mapping) or not ev.get("switch"):
        return ""
    dests = [str(d) for d in ev.get("destinations") or []]
    return f"{ev['switch']} towards {', '.join(dests)}" if dests else str(ev["switch"])


# How far before the live window's start (its newest probes' age) a probe it counts was
# sent: the collectors' lag and the wait for a probe's receipt (analytics/ingest/live.py)
WINDOW_LAG_S = 10.0


def still_explaining(
    closed: Iterable[Mapping[str, Any]], now_ns: int, window_s: float
) -> list[dict[str, Any]]:
    """The closed anomalies whose loss the live window (``window_s`` up to ``now_ns``) may
    still hold: last seen (their condition last held) no earlier than the window's start,
    less :data:`WINDOW_LAG_S`. Not by when they closed: an anomaly closes the clear time
    (60 s) after its last sighting, when its loss is already leaving the window — keyed on
    closing, one went on explaining a fresh fault at its place for 70 s after it closed
    (the demo lab: a host cut off, healed, then its leaf dropping what it sent)."""
    since = now_ns - int((window_s + WINDOW_LAG_S) * 1e9)
    return [
        dict(a) for a in closed if int(a.get("last_seen_ns") or a.get("closed_ns") or 0) >= since
    ]


def link_leaves(topology: Mapping[str, Any]) -> dict[str, str]:
    """Fabric link name -> its leaf, from a topology document (``kind: fabric`` links,
    the leaf being the end whose node is not a spine: the ``a`` end in clockmesh's)."""
    out = {}
    for lk in topology.get("links") or []:
        if lk.get("kind") == "fabric":
            out[str(lk["name"])] = str(lk["a"]["node"])
    return out


def annotate(
    hosts: list[dict[str, Any]],
    pairs: list[dict[str, Any]],
    anomalies: Iterable[Mapping[str, Any]],
    racks: Mapping[str, str],
    link_leaf: Mapping[str, str],
    closed: Iterable[Mapping[str, Any]] = (),
    stale_s: float = STALE_S,
) -> None:
    """Add the attribution to a ``/v1/live`` document's rows, in place: each pair's
    ``explained_by``; each host's ``verdict`` and :meth:`HostLoss.doc` fields."""
    LiveAttribution().annotate(None, hosts, pairs, anomalies, racks, link_leaf, closed, stale_s)


class LiveAttribution:
    """:func:`annotate` for the ingest daemon's ``/v1/live``: the pairs' places and the
    hosts' losses are computed once per live picture and set of anomalies (a second or
    more of Python at 130,000 pairs), each answer then only copies them in and judges
    each host's freshness."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._result: tuple[list[list[str]], dict[str, HostLoss]] = ([], {})

    def annotate(
        self,
        picture: Any,
        hosts: list[dict[str, Any]],
        pairs: list[dict[str, Any]],
        anomalies: Iterable[Mapping[str, Any]],
        racks: Mapping[str, str],
        link_leaf: Mapping[str, str],
        closed: Iterable[Mapping[str, Any]] = (),
        stale_s: float = STALE_S,
    ) -> None:
        """``picture``: what identifies the live picture the pairs come from (its
        computation time); None computes afresh. ``stale_s``: :func:`stale_after`."""
        anomalies, closed = list(anomalies), list(closed)
        key = (picture, len(pairs), tuple(str(a.get("anomaly_id")) for a in anomalies),
               tuple(str(a.get("anomaly_id")) for a in closed))  # fmt: skip
        if picture is None or key != self._key:
            names = [str(h["host"]) for h in hosts]
            self._result = attribute(names, pairs, anomalies, racks, link_leaf, closed=closed)
            self._key = key
        explained, losses = self._result
        for p, ids in zip(pairs, explained, strict=True):
            p["explained_by"] = ids
        for h in hosts:
            loss = losses.get(str(h["host"])) or HostLoss()
            h["verdict"] = verdict(loss, float(h.get("last_batch_age_s") or 0.0),
                                   host_stale_after(h, stale_s), probe_age_s=probe_age(h))  # fmt: skip
            h.update(loss.doc())
