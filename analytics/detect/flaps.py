"""Flapping links from the hosts' own interface counters.

Every collector samples its interfaces once a second (``counter`` rows): ``operstate``
(RFC 2863 code, up = 6), ``carrier_down_count`` (netdev) and ``link_downed`` (RDMA
port). A host port that goes down and comes back is one *outage*: its duration is the
time between the first sample that saw it down and the first that saw it up again (so it
is known to one sample interval); a carrier loss between two samples that both saw the
port up is a *sub-sample* outage (shorter than one interval, duration unknown).

A link is *flapping* from its first outage: the anomaly opens while the port is still
down (an outage of a few seconds already kills a collective: NCCL's default IB timeout
and retry count allow about 4 s), grows with every further outage seen in the last
``window_s``, and stays observed while the port is down; the anomaly book closes it once
the link has stayed up for its ``clear_s``.

Only what the hosts see is here: a spine-side link going down changes no host counter
and is found from the probes that cross it (path tomography, not in this module).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from analytics.detect.anomalies import Observation

OPER_UP = 6
COLLECTIVE_KILL_S = 4.0  # about what NCCL's default IB timeout x retry count survive
DOWN_COUNTERS = {b"carrier_down_count", b"link_downed"}
NAMES = {b"operstate", *DOWN_COUNTERS}


@dataclass
class Outage:
    down_ns: int
    up_ns: int = 0  # 0 while down
    sub_sample: bool = False  # seen only as a carrier-down count between two "up" samples

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
    outages: collections.deque[Outage] = field(default_factory=collections.deque)


class LinkFlaps:
    """Outages per (host, device) port, and the flapping links they make."""

    def __init__(
        self,
        window_s: float = 600.0,
        port_links: dict[tuple[int, str], str] | None = None,
        host_names: dict[int, str] | None = None,
    ) -> None:
        self.window_ns = int(window_s * 1e9)
        self.port_links = port_links or {}  # (host_id, device) -> link name (topology)
        self.host_names = host_names if host_names is not None else {}
        self.ports: dict[tuple[int, str], _Port] = {}
        # Hosts drained from the scheduler by a remediation: their flaps hurt no job.
        self.maintenance: set[str] = set()

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

    def observations(self, now_ns: int) -> list[Observation]:
        out = []
        for (host, dev), port in self.ports.items():
            prune(port.outages, now_ns, self.window_ns)
            if self.maintenance and self.host_names.get(host) in self.maintenance:
                port.outages.clear()  # drained: a flap history starts again when resumed
            if not port.outages:
                continue
            # Observed while down, and in the pass that sees an outage end.
            recent = now_ns - max(o.up_ns for o in port.outages) < 2_000_000_000
            if not (port.down_since or recent):
                continue
            out.append(self._observation(host, dev, port, now_ns))
        return out

    def _observation(self, host: int, dev: str, port: _Port, now_ns: int) -> Observation:
        name = self.host_names.get(host, f"host {host}")
        link = self.port_links.get((host, dev), f"{name}:{dev}")
        obs = flap_observation(
            link,
            list(port.outages),
            port.down_since,
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
    killing = sum(1 for d in known if d >= COLLECTIVE_KILL_S)
    window_min = window_ns / 60e9
    parts = [f"{link} flapped {n} time{'s' if n != 1 else ''} in {window_min:.0f} min"]
    if longest is not None:
        parts.append(f"outages up to {longest:.1f} s")
    if down_since:
        parts.append("down now")
    if killing:
        parts.append(f"{killing} longer than the {COLLECTIVE_KILL_S:.0f} s a collective survives")
    score = 1.0 - 0.5 ** (n + (1 if killing else 0))
    return Observation(
        kind="flapping_link",
        key=link,
        score=score,
        summary="; ".join(parts),
        link=link,
        evidence={
            **extra,
            "flaps": n,
            "down_now": bool(down_since),
            "outages_s": [None if d is None else round(d, 2) for d in durations],
            "longest_outage_s": None if longest is None else round(longest, 2),
            "collective_kill_s": COLLECTIVE_KILL_S,
            "outages_over_kill_s": killing,
            "last_down_ns": outages[-1].down_ns if outages else 0,
            "down_since_ns": down_since,
        },
    )
