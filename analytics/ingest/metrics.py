"""Prometheus metrics of the ingest daemon (``GET /metrics``).

Event counters are plain prometheus-client counters updated on the request path. The
fleet picture (per-host freshness, per-pair loss and raw one-way delay, store size) is
produced on scrape by :class:`FleetCollector` from the daemon's latest live snapshot, so
later components (clock solver, detector) add their families by registering another
collector on :attr:`IngestMetrics.registry`.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from analytics.ingest.hot_window import LiveSnapshot
from analytics.ingest.slabs import SlabPool

# *_created series double the scrape size and no dashboard of ours reads them.
prometheus_client.disable_created_metrics()

RUNS_KEPT = 8  # a host's collector runs remembered (the live window spans a few at most)
# a restarted collector's run_ns is its own clock; a sender's probe is stamped by the
# sender's: probes sent this long after the restart still count as sent to no listener
RESTART_MARGIN_NS = 500_000_000

REJECT_REASONS = ("auth", "malformed", "schema", "too_large", "unavailable")


@dataclass
class HostState:
    host: str
    host_id: int
    first_ns: int
    last_ns: int
    batches: int = 0
    # its collector is known to run since (the earliest segment it shipped began, its
    # clock): probes to it lost before then were lost to no listener, not to the fabric
    since_ns: int = 2**63 - 1
    # the newest segment it shipped began then (its clock; 0: none yet): a probe sent to
    # it before then whose probe_rx has not come is lost, not on its way
    newest_ns: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # rows/s over the last refresh
    # the last batch that carried probes it sent (probe_tx rows) arrived then (0: none
    # yet): a host whose batches arrive without them sends no probes (a firewall, a
    # socket that fails), though the live window still holds its earlier ones
    probes_ns: int = 0
    # its collector's runs seen (segment header ``run_ns``: when each began to listen)
    # -> the newest segment of each; the last RUNS_KEPT
    runs: dict[int, int] = field(default_factory=dict)
    # between two runs, (the older run's newest segment began, the newer run listened
    # + RESTART_MARGIN_NS): probes sent to it then were lost to no listener (a restart,
    # a redeploy), not to the fabric
    deaf: tuple[tuple[int, int], ...] = ()
    # its newest segment's shipping interval (segment header ``roll_s``; 0: not said,
    # a collector older than it): the host ships every that many seconds
    roll_s: float = 0.0

    def add_runs(self, runs: Mapping[int, int]) -> None:
        """Merge a commit's ``run_ns -> newest created_ns`` and recompute :attr:`deaf`
        (copy-on-write: readers hold the old tuple)."""
        merged = dict(self.runs)
        for run, created in runs.items():
            merged[run] = max(merged.get(run, 0), created)
        keep = sorted(merged)[-RUNS_KEPT:]
        self.runs = {r: merged[r] for r in keep}
        self.deaf = tuple(
            (self.runs[a], b + RESTART_MARGIN_NS) for a, b in itertools.pairwise(keep)
        )


@dataclass
class FleetView:
    """What the collector reads at scrape time (filled by the daemon)."""

    hosts: dict[int, HostState] = field(default_factory=dict)
    live: LiveSnapshot = field(default_factory=LiveSnapshot)
    table_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    free_bytes: int = 0
    unavailable_reason: str = ""


class FleetCollector(Collector):
    def __init__(self, view: Callable[[], FleetView], max_pairs: int) -> None:
        self._view = view
        self._max_pairs = max_pairs

    def collect(self) -> Iterable[Metric]:
        view = self._view()
        now_ns = time.time_ns()
        names = {h.host_id: h.host for h in view.hosts.values()}

        age = GaugeMetricFamily(
            "clockmesh_host_last_batch_age_seconds",
            "Seconds since the last stored batch of each host.",
            labels=["host"],
        )
        rate = GaugeMetricFamily(
            "clockmesh_host_rows_per_second",
            "Rows per second stored per host and table (last refresh interval).",
            labels=["host", "table"],
        )
        for h in view.hosts.values():
            age.add_metric([h.host], max(0.0, (now_ns - h.last_ns) / 1e9))
            for table, value in sorted(h.rates.items()):
                rate.add_metric([h.host, table], value)
        yield age
        yield rate

        pairs = view.live.worst(self._max_pairs)
        labels = ["src", "dst"]
        sent = GaugeMetricFamily(
            "clockmesh_link_probes_sent",
            "Probes sent per host pair in the live window.",
            labels=labels,
        )
        loss = GaugeMetricFamily(
            "clockmesh_link_probe_loss_ratio",
            "Fraction of probes sent per host pair in the live window that never arrived.",
            labels=labels,
        )
        p50 = GaugeMetricFamily(
            "clockmesh_link_owd_raw_p50_seconds",
            "Median raw one-way delay per host pair (rx - tx across two clocks, uncorrected).",
            labels=labels,
        )
        p99 = GaugeMetricFamily(
            "clockmesh_link_owd_raw_p99_seconds",
            "99th percentile raw one-way delay per host pair (uncorrected).",
            labels=labels,
        )
        for p in pairs:
            key = [names.get(p.src, str(p.src)), names.get(p.dst, str(p.dst))]
            sent.add_metric(key, p.sent)
            loss.add_metric(key, p.loss)
            if p.owd_raw_p50_ns is not None:
                p50.add_metric(key, p.owd_raw_p50_ns / 1e9)
            if p.owd_raw_p99_ns is not None:
                p99.add_metric(key, p.owd_raw_p99_ns / 1e9)
        yield from (sent, loss, p50, p99)

        pairs_total = GaugeMetricFamily(
            "clockmesh_live_pairs",
            "Host pairs with probes in the live window (per-pair series are capped).",
            value=view.live.pair_count,
        )
        yield pairs_total

        files = GaugeMetricFamily(
            "clockmesh_store_files", "Parquet files per store table.", labels=["table"]
        )
        size = GaugeMetricFamily(
            "clockmesh_store_bytes", "Bytes of Parquet per store table.", labels=["table"]
        )
        for table, (n, b) in sorted(view.table_sizes.items()):
            files.add_metric([table], n)
            size.add_metric([table], b)
        yield files
        yield size
        yield GaugeMetricFamily(
            "clockmesh_store_free_bytes",
            "Free bytes on the store's filesystem.",
            value=view.free_bytes,
        )
        unavailable = GaugeMetricFamily(
            "clockmesh_ingest_unavailable",
            "1 while the daemon refuses batches (503); the reason label says why.",
            labels=["reason"],
        )
        unavailable.add_metric(
            [view.unavailable_reason or "none"], 1 if view.unavailable_reason else 0
        )
        yield unavailable


_POOL_SUFFIX = re.compile(r"_\d+$")


def stat_cpu_seconds(stat: str | Path) -> tuple[float, float]:
    """(user, system) CPU seconds from a ``/proc/<pid>[/task/<tid>]/stat`` file."""
    text = Path(stat).read_text()
    fields = text[text.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) of this process by Python thread name, a pool's
    threads (``convert_0`` .. ``convert_3``) summed under the pool's name, and
    ``other`` for threads Python did not start (DuckDB's, Arrow's). Linux only
    (``/proc/self/task``); an empty dict elsewhere."""
    out: dict[str, float] = {}
    named = 0.0
    for t in threading.enumerate():
        try:
            cpu = sum(stat_cpu_seconds(f"/proc/self/task/{t.native_id}/stat"))
        except (OSError, TypeError):
            continue
        name = _POOL_SUFFIX.sub("", t.name)
        out[name] = out.get(name, 0.0) + cpu
        named += cpu
    if not out:
        return out
    times = os.times()
    out["other"] = max(0.0, times.user + times.system - named)
    return out


class ThreadCpuCollector(Collector):
    """``clockmesh_ingest_thread_cpu_seconds{thread=...}``: where the daemon's CPU goes
    (event loop ``MainThread``, ``commit``, ``convert``, ``fsync``, ``live``, ``clock``,
    ``other``), read at scrape time."""

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "clockmesh_ingest_thread_cpu_seconds",
            "CPU seconds used by the daemon's threads, by thread (pools summed; other = "
            "threads of DuckDB and Arrow).",
            labels=["thread"],
        )
        for name, seconds in sorted(thread_cpu_seconds().items()):
            family.add_metric([name], seconds)
        yield family


class SlabCollector(Collector):
    """``clockmesh_ingest_slab_bytes{pool}`` and ``..._in_use_bytes{pool}``: the memory the
    daemon keeps in its slab pools (ingest_slabs.py), read at scrape time."""

    def __init__(self, pools: dict[str, SlabPool]) -> None:
        self.pools = pools

    def collect(self) -> Iterable[Metric]:
        kept = GaugeMetricFamily(
            "clockmesh_ingest_slab_bytes",
            "Memory kept for request bodies until their commit (pool=bodies) and for the "
            "records the hot window and clock solver hold (pool=records); reused, never "
            "given back (ingest_slabs.py).",
            labels=["pool"],
        )
        in_use = GaugeMetricFamily(
            "clockmesh_ingest_slab_in_use_bytes",
            "Part of it that still holds live data.",
            labels=["pool"],
        )
        for name, pool in self.pools.items():
            kept.add_metric([name], pool.nbytes)
            in_use.add_metric([name], pool.in_use() * pool.slab_bytes)
        yield kept
        yield in_use


class IngestMetrics:
    def __init__(self, view: Callable[[], FleetView], max_pairs: int = 2000) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.batches = Counter(
            "clockmesh_ingest_batches",
            "Batches acknowledged, by outcome (stored or duplicate).",
            ["status"],
            registry=r,
        )
        self.rejected = Counter(
            "clockmesh_ingest_rejected_batches",
            "Batches refused, by reason (auth 401, malformed 400, schema 422, "
            "too_large 413, unavailable 503).",
            ["reason"],
            registry=r,
        )
        self.rows = Counter(
            "clockmesh_ingest_rows", "Rows stored, by table.", ["table"], registry=r
        )
        self.bytes = Counter("clockmesh_ingest_body_bytes", "Batch body bytes stored.", registry=r)
        self.commits = Counter(
            "clockmesh_ingest_commits", "Group commits made durable.", registry=r
        )
        self.commit_failures = Counter(
            "clockmesh_ingest_commit_failures",
            "Group commits that failed (their batches got 503).",
            registry=r,
        )
        self.commit_seconds = Histogram(
            "clockmesh_ingest_commit_seconds",
            "Time to write and fsync one group commit.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.ack_seconds = Histogram(
            "clockmesh_ingest_ack_seconds",
            "Time from receiving a batch to acknowledging it.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.pending_rows = Gauge(
            "clockmesh_ingest_pending_rows", "Rows received, not yet committed.", registry=r
        )
        self.hot_rows = Gauge(
            "clockmesh_hot_window_rows", "Probe rows held in the hot window.", registry=r
        )
        self.hot_bytes = Gauge(
            "clockmesh_hot_window_bytes",
            "Bytes of the probe rows held in the hot window (its share of "
            "memory_budget_bytes caps them).",
            registry=r,
        )
        self.rollup_minutes = Counter(
            "clockmesh_rollups",
            "One-minute rollups written to probe_minute/path_minute.",
            registry=r,
        )
        self.rollup_probes = Counter(
            "clockmesh_rollup_probes", "Probes summarised in the one-minute rollups.", registry=r
        )
        self.rollup_seconds = Counter(
            "clockmesh_rollup_seconds",
            "Time spent computing the one-minute rollups (one thread).",
            registry=r,
        )
        self.hot_evicted_rows = Counter(
            "clockmesh_hot_window_evicted_rows",
            "Probe rows dropped from the hot window over hot_max_rows or its share of "
            "memory_budget_bytes (their minute's rollup is partial; the rows are in the store).",
            registry=r,
        )
        self.compactions = Counter(
            "clockmesh_store_compacted_files", "Small files merged by compaction.", registry=r
        )
        self.recovered_orphans = Gauge(
            "clockmesh_store_recovered_orphan_files",
            "Files of an unacknowledged partial commit removed at start.",
            registry=r,
        )
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for status in ("stored", "duplicate"):
            self.batches.labels(status)
        r.register(FleetCollector(view, max_pairs))
        r.register(ThreadCpuCollector())

    def render(self) -> bytes:
        return generate_latest(self.registry)
