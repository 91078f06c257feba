"""The live document: what ``GET /v1/live`` (and ``clockmesh live``) shows of the fleet now.

:meth:`LiveDocument.refresh` runs every ``live_refresh_s`` in the daemon's live thread, after
the acknowledgements: it takes the hot window's live snapshot, writes the rollups of the
minutes that became final (``probe_minute``, ``path_minute``) and the per-host row rates.
:meth:`LiveDocument.document` builds the JSON document from that snapshot, the clock
runner's and the detector's state, with each pair's culprit and victims
(:mod:`analytics.detect.attribution`) and, for a pair the detector judged slow, its
queue beyond its own healthy delay (``queue_us``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from analytics.clock.clock_runner import ClockRunner
from analytics.detect import attribution
from analytics.detect.detect_runner import DetectRunner
from analytics.ingest.group_commit import GroupCommit
from analytics.ingest.hot_window import HotWindow
from analytics.ingest.metrics import FleetView, IngestMetrics
from analytics.store.store_writer import StoreWriter


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 1)


class LiveDocument:
    """The live snapshot and the document built from it."""

    def __init__(
        self,
        view: FleetView,
        hot: HotWindow,
        writer: StoreWriter,
        metrics: IngestMetrics,
        clock: ClockRunner,
        detect: DetectRunner,
        commit: GroupCommit,
        advised_roll_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.view = view
        self.hot = hot
        self.writer = writer
        self.metrics = metrics
        self.clock = clock
        self.detect = detect
        self.commit = commit
        self.advised_roll_s = advised_roll_s  # the pacer's advice (analytics/ingest/pace.py)
        self._attribution = attribution.LiveAttribution()  # culprit and victims
        self._prev_rates: tuple[float, dict[int, dict[str, int]]] = (time.monotonic(), {})
        self._evicted_seen = 0  # hot.evicted_rows already counted in /metrics

    def refresh(self) -> None:
        """Runs in the live thread: the live snapshot, the final minutes' rollups, the rates."""
        self.view.live = self.hot.live()
        started = time.monotonic()
        rolled = self.hot.rollup()
        self.metrics.hot_evicted_rows.inc(self.hot.evicted_rows - self._evicted_seen)
        self._evicted_seen = self.hot.evicted_rows
        if rolled is not None:
            first_minute, pair, path = rolled
            self.metrics.rollup_seconds.inc(time.monotonic() - started)
            self.metrics.rollup_probes.inc(pc.sum(pair.column("sent")).as_py() or 0)
            name = f"r{first_minute:012d}.parquet"
            for table, data in (("probe_minute", pair), ("path_minute", path)):
                if data.num_rows:
                    self.writer.write_partitioned(table, data, name)
            self.metrics.rollup_minutes.inc(len(set(pair.column("minute_ns").to_pylist())))
        now = time.monotonic()
        then, prev = self._prev_rates
        dt = max(now - then, 1e-6)
        current = {hid: dict(h.rows) for hid, h in self.view.hosts.items()}
        for hid, rows in current.items():
            before = prev.get(hid, {})
            self.view.hosts[hid].rates = {t: (v - before.get(t, 0)) / dt for t, v in rows.items()}
        self._prev_rates = (now, current)
        self.view.table_sizes = self.writer.table_sizes()

    def document(self) -> dict:
        """The ``GET /v1/live`` document, now."""
        now_ns = time.time_ns()
        names = {h.host_id: h.host for h in self.view.hosts.values()}
        live = self.view.live
        passes = self.detect.passes  # (read first: a pass sets its queues, then counts)
        queues = self.detect.pair_queues()  # the pairs the detector judged slow
        doc: dict[str, Any] = {
            "generated_ns": now_ns,
            "live_window_s": live.window_s,
            "live_computed_ns": live.generated_ns,
            "hosts": [
                {
                    "host": h.host,
                    "host_id": h.host_id,
                    "last_batch_age_s": round((now_ns - h.last_ns) / 1e9, 3),
                    # since the last batch with probes it sent (null: none yet)
                    "last_probe_age_s": round((now_ns - h.probes_ns) / 1e9, 3)
                    if h.probes_ns
                    else None,
                    # since its collector's current run began to listen (null: not said)
                    "collector_run_age_s": round((now_ns - max(h.runs)) / 1e9, 3)
                    if h.runs
                    else None,
                    # the interval it ships at, from its newest segment (null: not said);
                    # stale after attribution.host_stale_after of it
                    "roll_s": h.roll_s or None,
                    "batches": h.batches,
                    "rows": h.rows,
                    "rates": {k: round(v, 2) for k, v in h.rates.items()},
                }
                for h in sorted(self.view.hosts.values(), key=lambda h: h.host)
            ],
            "pairs": [
                {
                    "src": names.get(p.src, str(p.src)),
                    "dst": names.get(p.dst, str(p.dst)),
                    "src_id": p.src,
                    "dst_id": p.dst,
                    "sent": p.sent,
                    "received": p.received,
                    "loss": round(p.loss, 6),
                    "owd_raw_min_us": None if p.owd_raw_min_ns is None else p.owd_raw_min_ns / 1e3,
                    "owd_raw_p50_us": None if p.owd_raw_p50_ns is None else p.owd_raw_p50_ns / 1e3,
                    "owd_raw_p99_us": None if p.owd_raw_p99_ns is None else p.owd_raw_p99_ns / 1e3,
                    # beyond its own healthy delay, when judged slow (null: not slow)
                    "queue_us": _us(queues.get((p.src, p.dst))),
                }
                for p in live.pairs
            ],
            "clock": self.clock.live(names),
            "anomalies": self.detect.live(),
            "jobs": self.detect.jobs(),
            "ingest": {
                # the shipping interval the acks advise (longer on a large fleet): a host
                # is stale after attribution.stale_after of it
                "advised_roll_s": self.advised_roll_s(),
                "commits": self.writer.committed + 1,
                "pending_rows": self.commit.pending_rows,
                "hot_window_rows": self.hot.rows,
                "hot_window_bytes": self.hot.nbytes,
                "hot_window_max_bytes": self.hot.max_bytes,
                "hot_window_evicted_rows": self.hot.evicted_rows,
            },
            "store": {
                "dir": str(self.writer.root),
                "free_bytes": self.view.free_bytes,
                "accepting": not self.commit.unavailable_reason(),
                "reason": self.commit.unavailable_reason(),
                "tables": {
                    t: {"files": f, "bytes": b} for t, (f, b) in self.view.table_sizes.items()
                },
            },
        }
        # Culprit and victims: which open anomaly explains each pair, each host's loss in
        # both directions and its verdict (analytics/detect/attribution.py).
        racks = {names[i]: r for i, r in self.detect.paths.host_rack.items() if i in names}
        link_leaf = {n: lk.leaf for n, lk in self.detect.paths.links.items()}
        ended = attribution.still_explaining(doc["anomalies"]["recently_closed"],
                                             live.generated_ns, live.window_s)  # fmt: skip
        open_ = doc["anomalies"]["open"]
        stale_s = attribution.stale_after(doc["ingest"]["advised_roll_s"])
        self._attribution.annotate((live.generated_ns, passes), doc["hosts"], doc["pairs"], open_,
                                   racks, link_leaf, ended, stale_s)  # fmt: skip
        return doc
