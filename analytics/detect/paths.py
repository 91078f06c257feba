"""Fabric links from the paths probes take: a leaf-spine link no host counter sees.

Every collector traces its paths: every trace interval (2 s by default) one TTL-limited
probe per (buddy in another rack, source port), with the same 5-tuple as its probes, so
it takes the same ECMP path. The router at hop 2 — the spine — answers with ICMP time
exceeded from its address on the link the probe arrived on (``path_hop`` rows). Each
answer shows that rack X reaches rack Z through spine Y now; each trace *round* of a
host (its answers arrive within milliseconds of each other) shows all the spines its
rack reaches each traced rack through.

**Tomography.** A path X → Z through Y needs both leafX–spineY and leafZ–spineY. When a
spine that used to carry X → Z traffic is missing from every latest round of rack X's
hosts to Z, one of those two links is out of service (down, and the fabric's routing
took it out of every ECMP group — with BGP and BFD within a second — or withdrawn by
hand). Every path still seen through Y clears both of its links. The links suspected are
the smallest set, among those not cleared, that explains every missing path (greedy set
cover); two links that explain exactly the same missing paths cannot be told apart (in a
fabric of two racks, leaf1–spineY and leaf2–spineY never can) and are named together,
each with confidence 1/2.

A suspected link is out of service until a round crosses it again; the outage's duration
is known to one trace interval. Such a link is a ``flapping_link`` from its first outage,
like a host port (:mod:`analytics.detect.flaps`), naming the racks that lost a path.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import numpy as np

from analytics.detect.anomalies import Observation
from analytics.detect.flaps import Outage, flap_observation, prune

ROUND_GAP_NS = 500_000_000  # answers further apart than this are different rounds
ROUND_SETTLE_S = 1.0  # a round is complete once no answer came for it this long
STALE_ROUND_NS = 30_000_000_000  # a host whose latest round is older does not vote
MIN_ROUND_ANSWERS = 2  # a round with fewer answers says nothing about what is missing


@dataclass
class FabricLink:
    name: str
    leaf: str
    spine: str
    hop: str  # the spine's address on this link: what hop-2 answers come from


@dataclass
class _Round:
    start_ns: int
    seen: set[tuple[str, str]] = field(default_factory=set)  # (dst rack, spine)
    traced: collections.Counter[str] = field(default_factory=collections.Counter)  # dst rack
    answers: int = 0
    arrived: float = 0.0  # ops-box monotonic time of the last answer


@dataclass
class _LinkState:
    down_since: int = 0
    outages: collections.deque[Outage] = field(default_factory=collections.deque)
    group: tuple[str, ...] = ()  # the links it was suspected together with


class FabricPaths:
    """Which spines each rack reaches each other rack through, and which links dropped out."""

    def __init__(
        self,
        links: list[FabricLink],
        host_rack: dict[int, str],
        window_s: float = 600.0,
        clock: object = time.monotonic,
    ) -> None:
        self.by_hop = {lk.hop: lk for lk in links}
        self.links = {lk.name: lk for lk in links}
        self.by_ends = {(lk.leaf, lk.spine): lk.name for lk in links}
        self.host_rack = host_rack  # host_id -> its leaf
        self.window_ns = int(window_s * 1e9)
        self._clock = clock
        self.current: dict[int, _Round] = {}  # src -> round being filled
        self.latest: dict[int, _Round] = {}  # src -> last complete round
        self.baseline: set[tuple[str, str, str]] = set()  # (src rack, dst rack, spine) seen
        self.state = {name: _LinkState() for name in self.links}
        # Links taken out of service by a remediation: their missing paths are expected.
        self.maintenance: set[str] = set()
        self.unknown_hops: collections.Counter[str] = collections.Counter()
        self.spine_of: dict[tuple[int, int, int], str] = {}  # (src, dst, sport) -> spine now

    def feed(self, rows: np.ndarray) -> None:
        """``path_hop`` records (numpy, :data:`collector.records.PATH_HOP`)."""
        if not len(rows):
            return
        rows = rows[np.argsort(rows["ts_ns"], kind="stable")]
        now = self._clock()  # type: ignore[operator]
        for ts, src, dst, sport, hop in zip(
            rows["ts_ns"].tolist(),
            rows["src"].tolist(),
            rows["dst"].tolist(),
            rows["sport"].tolist(),
            rows["hop"].tolist(),
            strict=True,
        ):
            cur = self.current.get(src)
            if cur is None or ts - cur.start_ns > ROUND_GAP_NS:
                if cur is not None:
                    self._complete(src, cur)
                cur = self.current[src] = _Round(ts)
            cur.answers += 1
            cur.arrived = now
            rack = self.host_rack.get(dst, "")
            cur.traced[rack] += 1
            lk = self.by_hop.get(hop.decode(errors="replace"))
            if lk is None:
                self.unknown_hops[hop.decode(errors="replace")] += 1
            else:
                cur.seen.add((rack, lk.spine))
                self.spine_of[(src, dst, sport)] = lk.spine

    def _complete(self, src: int, rnd: _Round) -> None:
        if rnd.answers >= MIN_ROUND_ANSWERS:
            self.latest[src] = rnd
            mine = self.host_rack.get(src, "")
            for rack, spine in rnd.seen:
                self.baseline.add((mine, rack, spine))

    def _settle(self) -> None:
        now = self._clock()  # type: ignore[operator]
        for src, rnd in list(self.current.items()):
            if now - rnd.arrived >= ROUND_SETTLE_S:
                del self.current[src]
                self._complete(src, rnd)

    def suspects(self) -> tuple[list[tuple[tuple[str, ...], int]], set[str], int]:
        """([(links that cannot be told apart, missing paths they explain)], links
        cleared by a path seen now, newest round start)."""
        newest = max((r.start_ns for r in self.latest.values()), default=0)
        fresh = [
            (self.host_rack.get(src, ""), r)
            for src, r in self.latest.items()
            if newest - r.start_ns < STALE_ROUND_NS
        ]
        seen: set[tuple[str, str, str]] = set()
        traced: set[tuple[str, str]] = set()
        for mine, r in fresh:
            seen |= {(mine, rack, spine) for rack, spine in r.seen}
            traced |= {(mine, rack) for rack, n in r.traced.items() if n >= MIN_ROUND_ANSWERS}
        cleared = set()
        for x, z, y in seen:
            cleared |= {self.by_ends.get((x, y), ""), self.by_ends.get((z, y), "")}
        missing = [
            (x, z, y)
            for x, z, y in self.baseline - seen
            if (x, z) in traced
            and self.by_ends.get((x, y)) not in self.maintenance
            and self.by_ends.get((z, y)) not in self.maintenance
        ]
        explains: dict[str, set[tuple[str, str, str]]] = collections.defaultdict(set)
        for x, z, y in missing:
            for end in (x, z):
                name = self.by_ends.get((end, y))
                if name and name not in cleared:
                    explains[name].add((x, z, y))
        groups: list[tuple[tuple[str, ...], int]] = []
        left = {m for m in missing if any(m in e for e in explains.values())}
        while left:
            best = max(explains, key=lambda n: (len(explains[n] & left), n))
            covered = explains[best] & left
            if not covered:
                break
            twins = tuple(sorted(n for n in explains if explains[n] & left == covered))
            groups.append((twins, len(covered)))
            left -= covered
        return groups, cleared, newest

    def observations(self, now_ns: int) -> list[Observation]:
        self._settle()
        groups, cleared, newest = self.suspects()
        suspected = {}
        for twins, n in groups:
            for name in twins:
                suspected[name] = (twins, n)
        for name in self.maintenance & set(self.state):  # out of service: no flap history
            self.state[name] = _LinkState()
        for name, st in self.state.items():
            if name in suspected and not st.down_since:
                st.down_since = newest
                st.outages.append(Outage(newest))
            if name in suspected:
                st.group = suspected[name][0]
            elif st.down_since and name in cleared:
                st.outages[-1].up_ns = max(st.down_since + 1, newest)
                st.down_since = 0
            prune(st.outages, now_ns, self.window_ns)
        out = []
        done: set[str] = set()
        for name, st in self.state.items():
            if not st.outages or name in done:
                continue
            ended = max((o.up_ns for o in st.outages), default=0)
            recent = ended and newest - ended < 2 * ROUND_SETTLE_S * 1e9 + 5e9
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
            obs.score *= 1 / len(twins) if len(twins) > 1 else 1.0
            out.append(obs)
        return out
