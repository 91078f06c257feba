"""Jobs on RoCE v1, from their in-band delay against the probes' out-of-band delay alone.

RoCE v2 is UDP/IP: a routed fabric classifies it by DSCP into the RDMA traffic class (its
own queue, served first). RoCE v1 frames carry no IP header, so they travel best effort,
behind bulk traffic. Under load a v1 job's messages wait in queues its v2 neighbours and
the probes (sent in the RDMA class, ``probe.dscp``) never see. That is visible without any
configuration: the job's own one-way delay rises far above its floor while the probes
between the same hosts stay at theirs.

Input: the jobs' in-band reports (``inband``: every send and receive of a message, with the
workload's own timestamps) and each clock window's corrected one-way delays per path
(:class:`~analytics.detect.contention.PathDelays`, which keeps every path's floor). A send
and its receive (same job, flow and sequence number) make one in-band delay on
(src, dst), corrected with the clock solver's latest solution (each host's offset and
drift) as the probes are; until both hosts are solved the message is not counted. A
flow's *excess* is its recent median minus its own floor; the probes' excess is the same
for their paths.

A flow is *held back* when its excess is at least ``min_excess_ns`` (200 µs) and at least
``ratio`` (5) times the probes' excess between the same hosts (their worst over the last
``PROBE_SPAN_NS``, so that a flow's recent waits are never judged against newer, quieter
probes) — a queue the RDMA class does not have. A job with ``min_flows`` (2) held-back flows
in every pass for ``HOLD_NS`` (5 s) is a ``roce_v1_job``: at a queue's onset the flows
filling it wait before the probes through it are judged. When every path between the hosts is slow too, it is contention, not the job.
The ``roce_v1_job`` names the hosts that send the held-back flows.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

import numpy as np

from analytics.clock.clock_state import ClockState
from analytics.detect.anomalies import Observation

WINDOW_NS = 5_000_000_000  # a flow's recent delays
# The probes' excess is taken as its worst over the passes of this long: the flow's window
# plus the in-band reports' own shipping lag, so a flow's waits are never held against
# probes newer than they are (a queue that drained as the jobs stopped left their last
# 5 s of 600-ms waits beside probes already back at their floor: a false RoCE v1 page).
PROBE_SPAN_NS = WINDOW_NS + 5_000_000_000
# A job is said to be on RoCE v1 once it has been held back this long (pass time): at the
# onset of a queue the flows filling it wait before the probes through it are judged
# (their newest window is still the last one that arrived), and two RoCE v2 jobs were
# paged for the few seconds it took the probes to catch up.
HOLD_NS = 5_000_000_000
FORGET_NS = 600_000_000_000  # a flow silent this long is forgotten (its floor too)
PENDING_NS = 10_000_000_000  # a send or receive waits this long for its other half
MIN_EXCESS_NS = 200_000.0
RATIO = 5.0
MIN_FLOWS = 2
MIN_SAMPLES = 5


@dataclass
class _Flow:
    floor: float = float("inf")
    recent: collections.deque[tuple[int, float]] = field(default_factory=collections.deque)
    last: int = 0


class JobDelays:
    def __init__(
        self,
        host_names: dict[int, str] | None = None,
        min_excess_ns: float = MIN_EXCESS_NS,
        ratio: float = RATIO,
        min_flows: int = MIN_FLOWS,
    ) -> None:
        self.host_names = host_names if host_names is not None else {}
        self.min_excess_ns = min_excess_ns
        self.ratio = ratio
        self.min_flows = min_flows
        self.sends: dict[tuple[bytes, int, int], tuple[int, int]] = {}
        self.recvs: dict[tuple[bytes, int, int], tuple[int, int]] = {}
        self.flows: dict[tuple[str, int, int], _Flow] = {}
        self.newest = 0
        self._seen_newest, self._seen_at = -1, 0  # self.newest when a pass saw it
        self._clocks: ClockState | None = None
        self._index: dict[int, int] = {}
        # (src, dst) of a flow -> the probes' excess at each pass (pass time, ns)
        self._probe_seen: dict[tuple[int, int], collections.deque[tuple[int, float]]] = {}
        self._held_since: dict[str, int] = {}  # job -> first pass it was held back in a row

    def feed(self, rows: np.ndarray, clocks: ClockState | None) -> None:
        """``inband`` records (numpy, :data:`collector.records.INBAND`), any order, and the
        clock solver's latest solution (None: nothing solved yet, nothing counted)."""
        self._clocks = clocks
        self._index = {} if clocks is None else {h: i for i, h in enumerate(clocks.hosts.tolist())}
        for job, flow, seq, host, event, t in zip(
            rows["job_id"].tolist(), rows["flow_id"].tolist(), rows["seq"].tolist(),
            rows["host"].tolist(), rows["event"].tolist(), rows["event_ns"].tolist(),
            strict=True,
        ):  # fmt: skip
            key = (job, flow, seq)
            self.newest = max(self.newest, t)
            if event == 0:  # send: host -> peer
                got = self.recvs.pop(key, None)
                if got is None:
                    self.sends[key] = (host, t)
                else:
                    self._delay(job, host, got[0], t, got[1])
            elif event == 1:  # receive: peer -> host
                got = self.sends.pop(key, None)
                if got is None:
                    self.recvs[key] = (host, t)
                else:
                    self._delay(job, got[0], host, got[1], t)
        horizon = self.newest - PENDING_NS
        for pending in (self.sends, self.recvs):
            if len(pending) > 1000:
                for k in [k for k, (_h, t) in pending.items() if t < horizon]:
                    del pending[k]

    def _delay(self, job: bytes, src: int, dst: int, sent: int, received: int) -> None:
        c, i, j = self._clocks, self._index.get(src), self._index.get(dst)
        if c is None or i is None or j is None:
            return  # these clocks are not solved yet: a raw delay would carry their offset
        f = self.flows.setdefault((job.decode(errors="replace"), src, dst), _Flow())
        d = float(received - sent) - float(c.skew(i, j, sent))
        f.floor = min(f.floor, d)
        f.recent.append((sent, d))
        f.last = max(f.last, sent)

    def jobs_between(self, src: int, dst: int) -> set[str]:
        """Jobs whose messages from ``src`` to ``dst`` were measured in the last window."""
        horizon = self.newest - WINDOW_NS
        return {
            job
            for (job, s, d), f in self.flows.items()
            if s == src and d == dst and f.recent and f.recent[-1][0] >= horizon
        }

    def observations(
        self, now_ns: int, probe_excess: dict[tuple[int, int], float]
    ) -> list[Observation]:
        """``probe_excess``: (src, dst) -> the probes' excess over their floors now (ns),
        :meth:`PathDelays.pair_excess`."""
        held: dict[str, list[tuple[int, int, float, float]]] = collections.defaultdict(list)
        measured: dict[str, set[int]] = collections.defaultdict(set)
        # Time runs on when no message arrives (every job stopped): the newest message's
        # time plus the passes' time since it came (no comparison of the hosts' clocks with
        # the ops box's), so the recent delays of a job that ended age out.
        if self.newest != self._seen_newest:
            self._seen_newest, self._seen_at = self.newest, now_ns
        horizon = self.newest + max(0, now_ns - self._seen_at) - WINDOW_NS
        pairs = {(src, dst) for _job, src, dst in self.flows}
        for pair in list(self._probe_seen):
            if pair not in pairs:
                del self._probe_seen[pair]
        for pair in pairs:
            seen = self._probe_seen.setdefault(pair, collections.deque())
            if pair in probe_excess:
                seen.append((now_ns, probe_excess[pair]))
            while seen and seen[0][0] < now_ns - PROBE_SPAN_NS:
                seen.popleft()
        for (job, src, dst), f in list(self.flows.items()):
            while f.recent and f.recent[0][0] < horizon:
                f.recent.popleft()
            if self.newest - f.last > FORGET_NS:
                del self.flows[(job, src, dst)]
                continue
            if len(f.recent) < MIN_SAMPLES:
                continue
            picture = self._probe_seen.get((src, dst))
            if not picture:
                continue  # no out-of-band picture of these hosts yet
            probe = max(e for _t, e in picture)  # their worst over the flow's window and more
            measured[job] |= {src, dst}
            excess = statistics.median(d for _t, d in f.recent) - f.floor
            if excess >= max(self.min_excess_ns, self.ratio * max(probe, 0.0)):
                held[job].append((src, dst, excess, probe))
        out = []
        held = {job: flows for job, flows in held.items() if len(flows) >= self.min_flows}
        self._held_since = {job: self._held_since.get(job, now_ns) for job in held}
        for job, flows in sorted(held.items()):
            if now_ns - self._held_since[job] < HOLD_NS:
                continue
            senders = sorted({self.host_names.get(s, str(s)) for s, _d, _e, _p in flows})
            med = statistics.median(e for _s, _d, e, _p in flows)
            probe = statistics.median(p for _s, _d, _e, p in flows)
            summary = (
                f"job {job}: {len(flows)} flow(s) from {', '.join(senders[:8])} wait "
                f"{med / 1e3:.0f} µs over their floor while the probes between the same hosts "
                f"(RDMA traffic class) wait {max(probe, 0.0) / 1e3:.0f} µs: its traffic is not "
                "in the RDMA class — RoCE v1 (no IP header, so no DSCP)"
            )
            out.append(
                Observation(
                    kind="roce_v1_job",
                    key=job,
                    score=1.0,
                    summary=summary,
                    job_id=job,
                    evidence={
                        "hosts": senders,
                        "gid_indices": [],  # not known from this signal
                        "index_source": [],
                        "job_hosts": len(measured[job]),
                        "held_back_flows": len(flows),
                        "inband_excess_us": round(med / 1e3, 1),
                        "probe_excess_us": round(max(probe, 0.0) / 1e3, 1),
                        "source": "in-band against out-of-band delay (inband, owd)",
                    },
                )
            )
        return out
