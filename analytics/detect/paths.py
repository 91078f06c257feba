"""Fabric links from the paths probes take: a leaf-spine link no host counter sees.

Every collector traces its paths: every trace interval (2 s by default) one TTL-limited
probe per (buddy in another rack, source port), with the same 5-tuple as its probes, so
it takes the same ECMP path. The router at hop 2 — the spine — answers with ICMP time
exceeded from its address on the link the probe arrived on (``path_hop`` rows): this
5-tuple crosses leafX–spineY now. A collector that sees one of its 5-tuples change spine
traces all its paths again at once and ships them without waiting for its next segment.

**Tomography, one trace at a time.** A path X → Z through Y needs both leafX–spineY and
leafZ–spineY. ECMP hashing is deterministic: while rack X's group towards Z keeps its
members, every 5-tuple keeps its spine. A 5-tuple that crossed Y and now crosses another
spine is the first evidence that Y left the group (a link went down and the fabric's
routing took it out — with BGP and BFD within a second — or it was withdrawn by hand).
The path X → Z through Y is *gone* once, since that move, enough traces from X to Z have
avoided Y that Y being still in the group is unlikely (below 1 %: with two spines the
move itself is enough; with k, Y would still take 1/(k−1) of them). A move *onto* a spine
whose path was gone is that path coming back, not another one leaving (hash-threshold
ECMP moves flows both ways when a member returns). Every trace through Y shows the path
is there.

The links suspected are the smallest set, among those not seen working since a path
went, that explains every gone path (greedy set cover); two links that explain exactly
the same gone paths cannot be told apart (in a fabric of two racks, leaf1–spineY and
leaf2–spineY never can) and are named together, each with confidence 1/2.

A suspected link is out of service until a trace crosses it again: the outage runs from
the first trace that saw a 5-tuple move off it to the first that crossed it again. Such
a link is a ``flapping_link`` from its first outage, like a host port
(:mod:`analytics.detect.flaps`), naming the racks that lost a path.
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from analytics.detect.anomalies import Observation
from analytics.detect.flaps import Outage, flap_observation, prune

log = logging.getLogger("clockmesh.detect.paths")

# A gone path is believed once Y still in the group would have shown in fewer than this
# share of the traces since the move.
CHANCE = 0.01
RECENT_NS = 7_000_000_000  # an outage that ended this recently is still reported


@dataclass
class FabricLink:
    name: str
    leaf: str
    spine: str
    hop: str  # the spine's address on this link: what hop-2 answers come from


@dataclass
class _Gone:
    since_ns: int  # the trace that saw a 5-tuple move off the spine
    avoided: int = 0  # traces from X to Z since then, none of them through it


@dataclass
class _LinkState:
    down_since: int = 0
    outages: collections.deque[Outage] = field(default_factory=collections.deque)
    group: tuple[str, ...] = ()  # the links it was suspected together with
    back_ns: int = 0  # the first trace across it since it went down
    # The anomaly's key: the name(s) it was first suspected under, kept while it has
    # outages, so naming it more precisely later updates the anomaly instead of opening
    # another one.
    key: str = ""


def traces_needed(spines: int) -> int:
    """Traces from X to Z that must all avoid Y before the path through Y counts as gone,
    when X reaches Z through ``spines`` spines: with Y still in the group each trace
    would cross it with probability 1/(spines − 1) (one member left the group)."""
    if spines <= 2:
        return 1
    return math.ceil(math.log(CHANCE) / math.log(1 - 1 / (spines - 1)))


class FabricPaths:
    """Which spines each rack reaches each other rack through, and which links dropped out."""

    def __init__(
        self,
        links: list[FabricLink],
        host_rack: dict[int, str],
        window_s: float = 600.0,
    ) -> None:
        self.by_hop = {lk.hop: lk for lk in links}
        self.links = {lk.name: lk for lk in links}
        self.by_ends = {(lk.leaf, lk.spine): lk.name for lk in links}
        self.host_rack = host_rack  # host_id -> its leaf
        self.window_ns = int(window_s * 1e9)
        # (src rack, dst rack, spine) -> newest trace through it (its keys: every path seen)
        self.last_seen: dict[tuple[str, str, str], int] = {}
        self.spines: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        self.gone: dict[tuple[str, str, str], _Gone] = {}
        self.newest_ns = 0
        self.state = {name: _LinkState() for name in self.links}
        # Links taken out of service by a remediation: their missing paths are expected.
        self.maintenance: set[str] = set()
        self.unknown_hops: collections.Counter[str] = collections.Counter()
        self.spine_of: dict[tuple[int, int, int], str] = {}  # (src, dst, sport) -> spine now
        self.traced_ns: dict[tuple[int, int, int], int] = {}  # ... and when it was traced
        self.returned: dict[tuple[str, str, str], int] = {}  # path back after it had gone

    def feed(self, rows: np.ndarray) -> None:
        """``path_hop`` records (numpy, :data:`collector.records.PATH_HOP`)."""
        if not len(rows):
            return
        rows = rows[np.argsort(rows["ts_ns"], kind="stable")]
        for ts, src, dst, sport, hop in zip(
            rows["ts_ns"].tolist(),
            rows["src"].tolist(),
            rows["dst"].tolist(),
            rows["sport"].tolist(),
            rows["hop"].tolist(),
            strict=True,
        ):
            address = hop.decode(errors="replace")
            lk = self.by_hop.get(address)
            x, z = self.host_rack.get(src, ""), self.host_rack.get(dst, "")
            if lk is None or not x or not z:
                self._mismatch(address if lk is None else "", src if not x else dst if not z else 0)
                continue
            self._trace(ts, x, z, (src, dst, sport), lk.spine)

    def _mismatch(self, hop: str, host: int) -> None:
        """A trace the topology cannot place: counted, and said once per address or host
        (the topology file does not match the fabric the probes cross)."""
        what = hop or f"host {host}"
        self.unknown_hops[what] += 1
        if self.unknown_hops[what] == 1:
            reason = (
                f"trace answer from {hop}, which the topology file names on no fabric link"
                if hop
                else f"host id {host} traced, which the topology file does not list"
            )
            log.warning("event=detect_topology_mismatch reason=%r (its traces are ignored)",
                        reason)  # fmt: skip

    def _trace(self, ts: int, x: str, z: str, key: tuple[int, int, int], y: str) -> None:
        """One answer: 5-tuple ``key`` from rack x to rack z crossed spine y at ``ts``."""
        self.newest_ns = max(self.newest_ns, ts)
        before = self.spine_of.get(key)
        before_ns = self.traced_ns.get(key, 0)
        self.spine_of[key] = y
        self.traced_ns[key] = ts
        for w in self.spines[(x, z)]:  # every path gone before this trace: avoided again
            g = self.gone.get((x, z, w))
            if g is not None and w != y and ts >= g.since_ns:
                g.avoided += 1
        g = self.gone.get((x, z, y))
        if g is not None and ts > g.since_ns:  # the path is back
            del self.gone[(x, z, y)]
            self.returned[(x, z, y)] = ts
        if ts > self.last_seen.get((x, z, y), 0):
            self.last_seen[(x, z, y)] = ts
        joined = y not in self.spines[(x, z)]
        self.spines[(x, z)].add(y)
        for end in (x, z):
            st = self.state.get(self.by_ends.get((end, y), ""))
            if st is not None and st.down_since and not st.back_ns and ts > st.down_since:
                st.back_ns = ts
        if before is None or before == y or joined or g is not None:
            return  # new, unchanged, or onto a spine that was not in the group
        if self.returned.get((x, z, y), 0) > before_ns:
            return  # y came back since this 5-tuple's last trace: hashing moved it there
        if (x, z, before) not in self.gone and self.last_seen.get((x, z, before), 0) < ts:
            self.gone[(x, z, before)] = _Gone(ts, avoided=1)

    def suspects(self) -> list[tuple[tuple[str, ...], int, int]]:
        """[(links that cannot be told apart, gone paths they explain, since when)]."""
        missing = {
            (x, z, y): g.since_ns
            for (x, z, y), g in self.gone.items()
            if g.avoided >= traces_needed(len(self.spines[(x, z)]))
            and self.by_ends.get((x, y)) not in self.maintenance
            and self.by_ends.get((z, y)) not in self.maintenance
        }
        working: dict[str, int] = collections.defaultdict(int)  # link -> newest trace across
        for (x, z, y), ts in self.last_seen.items():
            for end in (x, z):
                name = self.by_ends.get((end, y), "")
                working[name] = max(working[name], ts)
        explains: dict[str, set[tuple[str, str, str]]] = collections.defaultdict(set)
        for (x, z, y), since in missing.items():
            for end in (x, z):
                name = self.by_ends.get((end, y), "")
                if name and working[name] <= since:  # not seen working since the path went
                    explains[name].add((x, z, y))
        groups: list[tuple[tuple[str, ...], int, int]] = []
        left = {m for m in missing if any(m in e for e in explains.values())}
        while left:
            best = max(explains, key=lambda n: (len(explains[n] & left), n))
            covered = explains[best] & left
            if not covered:
                break
            twins = tuple(sorted(n for n in explains if explains[n] & left == covered))
            groups.append((twins, len(covered), min(missing[m] for m in covered)))
            left -= covered
        return groups

    def observations(self, now_ns: int) -> list[Observation]:
        suspected = {}
        for twins, n, since in self.suspects():
            for name in twins:
                suspected[name] = (twins, n, since)
        for name in self.maintenance & set(self.state):  # out of service: no flap history
            self.state[name] = _LinkState()
        for name, st in self.state.items():
            if name in suspected and not st.down_since:
                st.down_since, st.back_ns = suspected[name][2], 0
                st.outages.append(Outage(st.down_since))
                st.key = st.key or " or ".join(suspected[name][0])
            if name in suspected:
                st.group = suspected[name][0]
            elif st.down_since and any(t in suspected for t in st.group if t != name):
                # Named with a twin, then seen working while the twin is still out: the
                # outage was the twin's, never this link's.
                st.outages.pop()
                st.down_since, st.group = 0, ()
            elif st.down_since and st.back_ns:
                st.outages[-1].up_ns = st.back_ns
                st.down_since = 0
            prune(st.outages, now_ns, self.window_ns)
            if not st.outages:
                st.key = ""
        newest = self.newest_ns
        out = []
        done: set[str] = set()
        for name, st in self.state.items():
            if not st.outages or name in done:
                continue
            ended = max((o.up_ns for o in st.outages), default=0)
            recent = ended and newest - ended < RECENT_NS
            if not (st.down_since or recent):
                continue
            twins = st.group if len(st.group) > 1 else (name,)
            done |= set(twins)
            lk = self.links[name]
            label = " or ".join(twins)
            extra = {
                "leaf": lk.leaf,
                "spine": lk.spine,
                "candidates": list(twins),
                "confidence": round(1 / len(twins), 2),
                "missing_paths": suspected.get(name, ((), 0))[1],
                "racks_exposed": sorted({self.links[t].leaf for t in twins}),
                "source": "path traces (hop-2 answers per source port), tomography",
            }
            obs = flap_observation(
                label, list(st.outages), st.down_since, newest, self.window_ns, extra
            )
            obs.link = twins[0] if len(twins) == 1 else label
            obs.key = st.key or label
            obs.score *= 1 / len(twins) if len(twins) > 1 else 1.0
            out.append(obs)
        return out
