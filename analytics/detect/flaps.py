"""Flapping links from the hosts' own interface counters.

Every collector samples its interfaces once a second (``counter`` rows): ``operstate``
(RFC 2863 code, up = 6), ``carrier_down_count`` (netdev) and ``link_downed`` (RDMA
port). A host port that goes down and comes back is one *outage*: its duration is the
time between the first sample that saw it down and the first that saw it up again (so it
is known to one sample interval); a carrier loss between two samples that both saw the
port up is a *sub-sample* outage (shorter than one interval, duration unknown).

A link is *flapping* from its first outage: the anomaly opens while the port is still
down, grows with every further outage seen in the last
``window_s``, and stays observed while the port is down; the anomaly book closes it once
the link has stayed up for its ``clear_s``.

A leaf whose every host link goes down at once is one place, named after the leaf
(:class:`LinkFlaps`): its hosts are cut off, and the leaf, not each of them, is to blame.

Only what the hosts see is here: a spine-side link going down changes no host counter
and is found from the probes that cross it (path tomography, not in this module).

What a job survives of each outage is judged in :mod:`analytics.detect.survival`.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import numpy as np

from analytics.detect.anomalies import Observation
from analytics.detect.survival import judge_outages

OPER_UP = 6
DOWN_COUNTERS = {b"carrier_down_count", b"link_downed"}
# A leaf that goes as a whole: every host link under it seen down at once, the first and
# the last going down within this (collectors sample their ports once a second, unaligned)
LEAF_SKEW_NS = 2_500_000_000
# A host link's outage in a rack of two hosts or more is named on its own once every other
# host link of the rack has been sampled LEAF_HEARD_NS or more after it went down (up, or
# down: then its leaf's), or LEAF_WAIT_NS after it went down. The hosts of a dead leaf
# see their links go within milliseconds, but their collectors' reports reach the ops box
# up to a few tenths of a second apart: held-out seed 1267 named h1-1-leaf1 0.14 s after
# leaf1 died and folded it into the leaf's anomaly 0.18 s later (7 of 19 dead leaves in
# seeds 1259-1266 were first paged as a host link so). Past the wait, while another host
# link of the rack is down that went within LEAF_SKEW_NS of it, up to LEAF_SKEW_NS: a leaf
# can go port by port.
LEAF_WAIT_NS = 400_000_000
LEAF_HEARD_NS = 100_000_000
NAMES = {b"operstate", *DOWN_COUNTERS}


@dataclass
class Outage:
    down_ns: int
    up_ns: int = 0  # 0 while down
    sub_sample: bool = False  # seen only as a carrier-down count between two "up" samples
    # A fabric link (analytics.detect.paths): the longest its flows can have lost packets
    # before the fabric routed them over another spine (0: not measured, or no other path:
    # a job sees the whole outage), and whether its rack lost every path (every spine's
    # link out) while it lasted.
    reroute_ns: int = 0
    every_path_lost: bool = False
    whole_spine: str = ""  # the spine it went with, every path through which went
    # the leaf it went with, every host link of which went (a host link's), or whose
    # going took it out (a leaf–spine link's: DetectRunner._with_leaves)
    whole_leaf: str = ""

    def duration_s(self, now_ns: int) -> float | None:
        if self.sub_sample:
            return None
        return ((self.up_ns or now_ns) - self.down_ns) / 1e9


@dataclass
class _Port:
    oper_up: bool | None = None
    down_since: int = 0
    pending: int = 0  # carrier losses counted while operstate still read "up"
    pending_ts: int = 0
    seen_ns: int = 0  # its newest sample with an operstate
    outages: collections.deque[Outage] = field(default_factory=collections.deque)


class LinkFlaps:
    """Outages per (host, device) port, and the flapping links they make.

    A leaf every host link of which goes down at once (within :data:`LEAF_SKEW_NS`, all
    down together) is one place, not as many flapping host links: its outages are observed
    under the leaf's name (the key and link ``leaf2``, ``evidence.hosts_cut_off``), and a
    host link's anomaly opened before the last of them was seen down is folded into it
    (:meth:`take_folded`)."""

    def __init__(
        self,
        window_s: float = 600.0,
        port_links: dict[tuple[int, str], str] | None = None,
        host_names: dict[int, str] | None = None,
        host_rack: dict[int, str] | None = None,
        host_access: dict[int, str] | None = None,
    ) -> None:
        self.window_ns = int(window_s * 1e9)
        self.port_links = port_links or {}  # (host_id, device) -> link name (topology)
        self.host_names = host_names if host_names is not None else {}
        self.ports: dict[tuple[int, str], _Port] = {}
        # Hosts drained from the scheduler by a remediation: their flaps hurt no job.
        self.maintenance: set[str] = set()
        # leaf -> its hosts' access ports (racks of two hosts or more: one host's link
        # going is that link's flap, whatever the leaf did)
        access = host_access or {}
        racks: dict[str, list[tuple[int, str]]] = {}
        for (host, dev), link in sorted(self.port_links.items()):
            rack = (host_rack or {}).get(host, "")
            if rack and access.get(host) == link:
                racks.setdefault(rack, []).append((host, dev))
        self.rack_ports = {r: ports for r, ports in racks.items() if len(ports) > 1}
        self.rack_of = {k: r for r, ports in self.rack_ports.items() for k in ports}
        # the hosts' access ports (every port without a topology): hosts_down_since
        self.access = {k for k, link in self.port_links.items() if access.get(k[0]) == link}
        self.leaves: dict[str, collections.deque[Outage]] = {}
        self.folded: list[tuple[str, str]] = []

    def feed(self, rows: np.ndarray) -> None:
        """``counter`` records (numpy, :data:`collector.records.COUNTER`), any order."""
        if not len(rows):
            return
        rows = rows[np.isin(rows["name"], list(NAMES))]
        if not len(rows):
            return
        # One sample of one port = its rows with the same ts_ns.
        samples: dict[tuple[int, str], dict[int, list[int]]] = {}
        for ts, host, dev, name, value, delta in zip(
            rows["ts_ns"].tolist(),
            rows["host"].tolist(),
            rows["device"].tolist(),
            rows["name"].tolist(),
            rows["value"].tolist(),
            rows["delta"].tolist(),
            strict=True,
        ):
            sample = samples.setdefault((host, dev.decode(errors="replace")), {}).setdefault(
                ts, [-1, 0]
            )
            if name == b"operstate":
                sample[0] = value
            elif delta > 0:
                sample[1] += delta
        for key, by_ts in samples.items():
            port = self.ports.setdefault(key, _Port())
            for ts in sorted(by_ts):
                oper, downs = by_ts[ts]
                self._sample(port, ts, None if oper < 0 else oper == OPER_UP, downs)

    @staticmethod
    def _sample(port: _Port, ts: int, up: bool | None, downs: int) -> None:
        """One sample: operstate (None if absent) and carrier losses since the last one.

        The counters and operstate are separate sysfs reads: a carrier loss may be counted
        one sample before operstate shows the port down. Such a loss is held back one
        sample; if operstate then shows the port down, it is that outage (starting at the
        earlier sample), otherwise it was an outage shorter than one sample.
        """
        pending, pending_ts, port.pending = port.pending, port.pending_ts, 0
        went_down = up is False and port.oper_up is not False
        if went_down:
            start = pending_ts if pending else ts
            port.down_since = start
            port.outages.append(Outage(start))
            extra = pending + downs - 1
        else:
            extra = pending
            if up is not False and downs:
                port.pending, port.pending_ts = downs, ts
        for _ in range(max(0, extra)):
            at = pending_ts if pending else ts
            port.outages.append(Outage(at, at, sub_sample=True))
        if up is True and port.oper_up is False:
            if port.outages and port.outages[-1].up_ns == 0:
                port.outages[-1].up_ns = ts
            port.down_since = 0
        if up is not None:
            port.oper_up = up
            port.seen_ns = max(port.seen_ns, ts)

    def observations(self, now_ns: int) -> list[Observation]:
        out = []
        for (host, _dev), port in self.ports.items():
            prune(port.outages, now_ns, self.window_ns)
            if self.maintenance and self.host_names.get(host) in self.maintenance:
                port.outages.clear()  # drained: a flap history starts again when resumed
        self._whole_leaves()
        for (host, dev), port in self.ports.items():
            own = [o for o in port.outages if not o.whole_leaf]  # not the leaf's
            if not own:
                continue
            down_since = port.down_since if own[-1].up_ns == 0 else 0
            # Observed while down, and in the pass that sees an outage end.
            recent = now_ns - max(o.up_ns for o in own) < 2_000_000_000
            if not (down_since or recent) or self._leaf_unheard((host, dev), own[-1], now_ns):
                continue
            out.append(self._observation(host, dev, own, down_since, now_ns))
        for rack, outages in list(self.leaves.items()):
            prune(outages, now_ns, self.window_ns)
            if not outages:
                del self.leaves[rack]
                continue
            down_since = outages[-1].down_ns if outages[-1].up_ns == 0 else 0
            if down_since or now_ns - outages[-1].up_ns < 2_000_000_000:
                out.append(self._leaf_observation(rack, now_ns))
        return out

    def _leaf_unheard(self, key: tuple[int, str], outage: Outage, now_ns: int) -> bool:
        """Whether a host link's ``outage`` may yet be its whole leaf's: another host link
        of its rack not sampled since it went down, :data:`LEAF_WAIT_NS` not over; or,
        up to :data:`LEAF_SKEW_NS`, another down now that went within that of it (a leaf
        going port by port: the demo lab's leaf3, its four host links 0.15 s apart,
        2026-12-06 — h3-1-leaf3 was paged 0.53 s, past the wait, then folded into leaf3)."""
        rack = self.rack_of.get(key)
        age = now_ns - outage.down_ns
        if rack is None or outage.sub_sample or age >= LEAF_SKEW_NS:
            return False
        others = [self.ports.get(k) for k in self.rack_ports[rack] if k != key]
        if age < LEAF_WAIT_NS:
            heard = outage.down_ns + LEAF_HEARD_NS
            if any(p is None or p.seen_ns < heard for p in others):
                return True
        return any(p is not None and p.down_since and p.outages and not p.outages[-1].whole_leaf
                   and abs(p.outages[-1].down_ns - outage.down_ns) <= LEAF_SKEW_NS
                   for p in others)  # fmt: skip

    def _whole_leaves(self) -> None:
        """Mark the newest outage of every host link of a leaf as the leaf's when they all
        went down at once (:data:`LEAF_SKEW_NS`) and were all down together; the leaf's
        outage runs from the first going down to the last coming back."""
        for rack, keys in self.rack_ports.items():
            newest = [p.outages[-1] if (p := self.ports.get(k)) and p.outages else None
                      for k in keys]  # fmt: skip
            leaf = self.leaves[rack][-1] if self.leaves.get(rack) else None
            if leaf is not None and not leaf.up_ns:  # the leaf's: follow its hosts back
                mine = [next((o for o in reversed(self.ports[k].outages)
                              if o.whole_leaf == rack and o.down_ns >= leaf.down_ns), None)
                        for k in keys]  # fmt: skip
                if all(o is None or o.up_ns for o in mine):  # (None: drained since)
                    leaf.up_ns = max((o.up_ns for o in mine if o), default=leaf.down_ns + 1)
                continue
            if any(o is None or o.sub_sample or o.whole_leaf for o in newest):
                continue
            group = [o for o in newest if o is not None]
            downs = [o.down_ns for o in group]
            ups = [o.up_ns or (1 << 62) for o in group]
            if max(downs) - min(downs) > LEAF_SKEW_NS or max(downs) >= min(ups):
                continue
            for o, (host, dev) in zip(group, keys, strict=True):
                o.whole_leaf = rack
                name = self.host_names.get(host, f"host {host}")
                self.folded.append((self.port_links.get((host, dev), f"{name}:{dev}"), rack))
            up = max(ups) if all(o.up_ns for o in group) else 0
            self.leaves.setdefault(rack, collections.deque()).append(Outage(min(downs), up))

    def hosts_down_since(self, since_ns: int) -> set[int]:
        """Hosts whose access port was down at or after ``since_ns`` (down now, back
        since, or a carrier loss counted since): their probes' losses and delays then are
        the outage's, not a queue's (:meth:`PathDelays._cut_off`)."""
        return {
            host for (host, dev), p in self.ports.items()
            if (not self.access or (host, dev) in self.access)
            and (p.down_since or (p.pending and p.pending_ts >= since_ns)
                 or any(o.up_ns >= since_ns for o in p.outages))
        }  # fmt: skip

    def take_folded(self) -> list[tuple[str, str]]:
        """[(key of a host link's anomaly, the leaf's key)] since the last call: a host
        link named on its own, then found to have gone with its whole leaf."""
        out, self.folded = self.folded, []
        return out

    def _leaf_observation(self, rack: str, now_ns: int) -> Observation:
        outages = self.leaves[rack]
        named = sorted((self.host_names.get(h, f"host {h}"), self.port_links[(h, dev)])
                       for h, dev in self.rack_ports[rack])  # fmt: skip
        hosts, links = [h for h, _ in named], [lk for _, lk in named]
        return flap_observation(
            rack,
            list(outages),
            outages[-1].down_ns if outages[-1].up_ns == 0 else 0,
            now_ns,
            self.window_ns,
            {
                "switch": rack,
                "hosts_cut_off": hosts,
                "links": links,
                "switch_note": (
                    f"all {len(links)} host links under {rack} went down at once: the "
                    "leaf is down or isolated, or its hosts lost power together"
                ),
                "source": "host counters (operstate, carrier_down_count, link_downed)",
            },
        )

    def _observation(
        self, host: int, dev: str, outages: list[Outage], down_since: int, now_ns: int
    ) -> Observation:
        name = self.host_names.get(host, f"host {host}")
        link = self.port_links.get((host, dev), f"{name}:{dev}")
        obs = flap_observation(
            link,
            outages,
            down_since,
            now_ns,
            self.window_ns,
            {
                "host": name,
                "device": dev,
                "source": "host counters (operstate, carrier_down_count, link_downed)",
            },
        )
        obs.src = host
        return obs


def prune(outages: collections.deque[Outage], now_ns: int, window_ns: int) -> None:
    """Forget outages that ended more than ``window_ns`` ago."""
    while outages and outages[0].up_ns and now_ns - outages[0].up_ns > window_ns:
        outages.popleft()


def flap_observation(
    link: str,
    outages: list[Outage],
    down_since: int,
    now_ns: int,
    window_ns: int,
    extra: dict,
) -> Observation:
    """The ``flapping_link`` observation of a link with these outages (any source)."""
    n = len(outages)
    # Only finished outages: the row changes when something happens, not every pass.
    durations = [o.duration_s(now_ns) for o in outages if o.up_ns]
    known = [d for d in durations if d is not None]
    longest = max(known) if known else None
    obs = Observation(
        kind="flapping_link",
        key=link,
        score=0.0,
        summary="",
        link=link,
        evidence={
            **extra,
            "flaps": n,
            "down_now": bool(down_since),
            "outages_s": [None if d is None else round(d, 2) for d in durations],
            "outages_ns": [[o.down_ns, o.up_ns] for o in outages if o.up_ns],
            "longest_outage_s": None if longest is None else round(longest, 2),
            **(_reroutes(outages) if "spine" in extra else {}),
            "window_s": round(window_ns / 1e9),
            "last_down_ns": outages[-1].down_ns if outages else 0,
            "down_since_ns": down_since,
        },
    )
    judge_outages(obs, [])
    return obs


def _reroutes(outages: list[Outage]) -> dict[str, list]:
    """A fabric link's finished outages: the reroute bound of each (rounded up: it stays a
    bound; null: a job sees the whole outage) and whether its rack lost every path."""
    done = [o for o in outages if o.up_ns]
    return {
        "reroutes_s": [math.ceil(o.reroute_ns / 1e7) / 100 if o.reroute_ns else None
                       for o in done],
        "every_path_lost": [o.every_path_lost for o in done],
    }  # fmt: skip
