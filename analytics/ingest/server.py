"""The ingest daemon: HTTP batches in, durable Parquet out, live state and metrics.

This module wires the daemon's parts together and runs its lifecycle and background work;
each part is a module of its own:

- :mod:`analytics.ingest.routes` - the HTTP surface: ``POST /v1/batch`` (its contract, the
  HMAC check, the answers), ``GET /metrics``, ``GET /v1/live``, ``GET /healthz``;
- :mod:`analytics.ingest.group_commit` - batches written together, fsynced once,
  acknowledged together; whether the store accepts commits;
- :mod:`analytics.ingest.live` - the live document (``/v1/live``) and its refresh (rollups).

Background work here: once a second the free space, memory peaks and pace; every
``live_refresh_s`` the live refresh and every ``compact_s`` a compaction, both in the live
thread (lower priority, after acknowledgements); the memory reserve at start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import ssl
import sys
import threading
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import Gauge

from analytics.clock.clock_runner import ClockRunner
from analytics.detect.detect_runner import DetectRunner
from analytics.ingest.config import (
    IngestConfig,
    ResolvedIngest,
    auto_max_rows,
    detect_config,
    memory_budget,
)
from analytics.ingest.group_commit import GroupCommit
from analytics.ingest.hot_window import HotWindow
from analytics.ingest.live import LiveDocument
from analytics.ingest.metrics import FleetView, IngestMetrics, SlabCollector
from analytics.ingest.pace import Pacer
from analytics.ingest.routes import Routes
from analytics.ingest.slabs import (
    PeakTracker,
    SlabPool,
    mem_available,
    plan_reserve,
    read_peaks,
)
from analytics.store import catalog
from analytics.store.compactor import Compactor
from analytics.store.store_writer import StoreWriter
from analytics.thread_priority import lower_thread_priority

log = logging.getLogger("clockmesh.ingest")
_GC_THRESHOLD = 50_000
_PEAKS_SAVE_S = 60.0  # how often the memory peaks are remembered for the next start
# On stop, the requests in flight get this long to be committed and answered (a group
# commit takes roll_s and its write); past it aiohttp cancels them and their collectors
# send again. aiohttp's own default, 60 s, held a restart that long.
_SHUTDOWN_S = 15.0
_SWITCH_INTERVAL_S = float(os.environ.get("CLOCKMESH_INGEST_SWITCH_INTERVAL_S", "0.0005"))


class IngestServer:
    """One daemon: owns the store, serves HTTP. ``await start()``, ``await stop()``."""

    def __init__(self, config: IngestConfig, resolved: ResolvedIngest, fleet_key: bytes) -> None:
        self.config = config
        self.resolved = resolved
        self.key = fleet_key
        self.writer = StoreWriter(
            config.store_dir,
            compression=config.compression,
            dedup_window_s=resolved.dedup_window_s,
        )
        self.compactor = Compactor(
            self.writer,
            retention_s=resolved.retention_s,
            min_age_s=config.compact_min_age_s,
        )
        budget = memory_budget(config.memory_budget_bytes)
        self.hot = HotWindow(
            window_s=config.hot_window_s,
            max_rows=auto_max_rows(config.hot_max_rows),
            max_bytes=budget["hot"],
            grace_s=config.rollup_grace_s,
            listening=lambda: self.view.hosts,
        )
        self.pacer = Pacer(config.max_requests_per_s, max_s=config.max_advised_roll_s)
        self.view = FleetView()
        self.metrics = IngestMetrics(lambda: self.view, config.metrics_max_pairs)
        self.clock = ClockRunner(
            self.writer,
            window_s=config.clock_window_s,
            lateness_s=config.clock_lateness_s,
            max_rows=auto_max_rows(config.clock_max_rows),
            max_bytes=budget["clock"],
            nice=config.analysis_nice,
        )
        self.metrics.registry.register(self.clock.collector(self._host_names))
        self.detect = DetectRunner(
            self.writer,
            detect_config(config),
            host_names=self._host_names,
            nice=config.analysis_nice,
            clock_state=lambda: self.clock.state,
        )
        self.metrics.registry.register(self.detect.collector())
        self.clock.on_owd = self.detect.feed_owd
        self.detect.on_pass = self.clock.pipeline.detector_pass
        reg = self.metrics.registry
        self._pace_gauges = (
            Gauge("clockmesh_ingest_advised_roll_seconds",
                  "Segment interval advised to collectors in every acknowledgement.",
                  registry=reg),
            Gauge("clockmesh_ingest_active_hosts",
                  "Hosts that sent a batch within the pacing window.", registry=reg),
            Gauge("clockmesh_ingest_requests_per_second",
                  "Batch requests per second (last second).", registry=reg),
        )  # fmt: skip
        self._pace_gauges[0].set(self.pacer.roll_s)
        self._interval = 0.0  # the interval the rollup grace and clock lateness were set for
        self.pacer.on_slower = lambda roll: self._wait_for(max(self.pacer.roll_s, roll))
        self.slabs = SlabPool()  # the records handed to the hot window and clock runner
        self.body_slabs = SlabPool(64 << 20)  # request bodies, until their commit is done
        reg.register(SlabCollector({"records": self.slabs, "bodies": self.body_slabs}))
        self.peaks = PeakTracker(
            {"records": self.slabs, "bodies": self.body_slabs}, self.writer.root / "_ingest"
        )
        self._stopping = threading.Event()  # ends the memory reserve early
        self._reserver: threading.Thread | None = None
        self._tasks: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None
        # live view and rollups: after acknowledgements (thread_priority.py)
        self._side_pool = concurrent.futures.ThreadPoolExecutor(
            1, "live", initializer=lower_thread_priority, initargs=(config.analysis_nice,)
        )
        # compaction on its own thread: a merge can take minutes on a loaded box, and the
        # live picture must not wait for it (it froze for 10 min in a loaded demo lab)
        self._compact_pool = concurrent.futures.ThreadPoolExecutor(
            1, "compact", initializer=lower_thread_priority, initargs=(config.analysis_nice,)
        )
        self._compacting: asyncio.Future | None = None
        self.commit = GroupCommit(
            config,
            self.writer,
            self.metrics,
            self.view,
            self.hot,
            self.clock,
            self.detect,
            self.slabs,
        )
        self.live = LiveDocument(
            self.view, self.hot, self.writer, self.metrics, self.clock, self.detect, self.commit,
            lambda: self.pacer.roll_s,
        )  # fmt: skip
        self.routes = Routes(
            config,
            fleet_key,
            self.commit,
            self.live,
            self.metrics,
            self.view,
            self.pacer,
            self.body_slabs,
        )

    # ---- lifecycle ---------------------------------------------------------------
    def open_store(self) -> None:
        self.writer.open()
        catalog.write_catalog(self.writer.root)
        self.commit.next_commit = self.writer.committed + 1
        self.metrics.recovered_orphans.set(self.writer.recovered_orphans)
        self.view.free_bytes = self.writer.free_bytes()
        self.view.table_sizes = self.writer.table_sizes()

    async def start(self) -> None:
        # The commit and live threads spend most of their time in C that drops the GIL
        # (Parquet, fsync, DuckDB) and need it back between calls; with the default 5 ms
        # switch interval each of those hand-overs waits for the busy event loop.
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
        self.open_store()
        # Each request makes ~100 tracked objects that live until its ack (0.2-5 s): at
        # the default gen-0 threshold (700) they were collected ~60 times a second and
        # aged into the older generations, ~7 % of the event loop's CPU (perf, docs/store.md
        # "Round 7"). Collect rarely, and never rescan what exists at start.
        gc.collect()
        gc.freeze()
        gc.set_threshold(_GC_THRESHOLD, 20, 10)
        self.clock.start()
        self.detect.start()
        self._start_reserve()
        ssl_ctx = None
        if self.config.tls_cert:
            ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_ctx.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        self._runner = web.AppRunner(
            self.routes.app(), access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_S
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.resolved.host,
            self.resolved.port,
            ssl_context=ssl_ctx,
            backlog=1024,
            reuse_address=True,
        )
        await site.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.commit.run(), name="committer"),
            loop.create_task(self._periodic(), name="periodic"),
        ]
        log.info(
            "event=listening address=%s:%d tls=%s store=%s next_commit=%d",
            self.resolved.host,
            self.resolved.port,
            bool(ssl_ctx),
            self.writer.root,
            self.commit.next_commit,
        )

    def _start_reserve(self) -> None:
        """Fault in the memory the previous run of this store peaked at (or
        ``reserve_bytes``), in the background: slabs.py."""
        peaks, problem = read_peaks(self.peaks.path.parent)
        if problem:
            log.warning("event=memory_peaks_unreadable error=%r (starting cold)", problem)
        plan = plan_reserve(self.config.reserve_bytes, peaks, mem_available())
        if not any(plan.values()):
            return
        log.info("event=memory_reserve records=%d bodies=%d remembered=%s",
                 plan["records"], plan["bodies"], bool(peaks))  # fmt: skip
        self._reserver = threading.Thread(
            target=self._reserve, args=(plan,), name="reserve", daemon=True
        )
        self._reserver.start()

    def _reserve(self, plan: dict[str, int]) -> None:
        started = time.monotonic()
        try:
            added = {
                "records": self.slabs.reserve(plan["records"], self._stopping),
                "bodies": self.body_slabs.reserve(plan["bodies"], self._stopping),
            }
        except MemoryError:
            log.warning("event=memory_reserve_failed error=MemoryError (the rest stays cold)")
            return
        log.info("event=memory_reserved records=%d bodies=%d seconds=%.1f",
                 added["records"], added["bodies"], time.monotonic() - started)  # fmt: skip

    def _save_peaks(self) -> None:
        try:
            self.peaks.save()
        except OSError as exc:
            log.warning("event=memory_peaks_not_saved error=%r", str(exc))

    async def stop(self) -> None:
        """Stop taking batches, answer every one received, then stop the work behind.

        The listener closes first and the committer keeps running while aiohttp waits for
        the requests in flight (up to ``_SHUTDOWN_S``): a batch received is committed and
        acknowledged, not left waiting on a committer already stopped (aiohttp then waited
        its default 60 s and the collectors' requests timed out)."""
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.commit.flush(10)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.commit.shutdown()
        self._side_pool.shutdown(wait=True)
        self._compact_pool.shutdown(wait=True)
        self.clock.stop()
        self.detect.stop()
        if self._reserver is not None:
            self._reserver.join()
        self.peaks.sample()
        self._save_peaks()

    def unavailable_reason(self) -> str:
        return self.commit.unavailable_reason()

    def _host_names(self) -> dict[int, str]:
        return {h.host_id: h.host for h in self.view.hosts.values()}

    # ---- background work ---------------------------------------------------------
    async def _periodic(self) -> None:
        loop = asyncio.get_running_loop()
        next_live = next_compact = next_peaks = time.monotonic()
        next_compact += self.config.compact_s
        while True:
            await asyncio.sleep(1.0)
            self.commit.check_space()
            self.peaks.sample()
            self._pace()
            self.metrics.pending_rows.set(self.commit.pending_rows)
            now = time.monotonic()
            if now >= next_peaks:
                next_peaks = now + _PEAKS_SAVE_S
                self._save_peaks()
            if now >= next_live:
                next_live = now + self.config.live_refresh_s
                try:
                    await loop.run_in_executor(self._side_pool, self.live.refresh)
                except Exception:
                    log.exception("event=live_refresh_failed")
            if now >= next_compact and (self._compacting is None or self._compacting.done()):
                next_compact = now + self.config.compact_s
                self._compacting = loop.run_in_executor(self._compact_pool, self._compact)
                self._compacting.add_done_callback(_log_compaction)

    def _pace(self) -> None:
        before = self.pacer.roll_s
        after = self.pacer.update()
        self._pace_gauges[0].set(after)
        self._pace_gauges[1].set(self.pacer.active_hosts)
        self._pace_gauges[2].set(self.pacer.request_rate)
        # the interval hosts ship at: the advice, or a collector's own longer spool.roll_s
        self._wait_for(max(after, self.pacer.slowest_roll_s), before)

    def _wait_for(self, interval: float, before: float | None = None) -> None:
        """Rollups and clock windows wait for rows ``interval`` seconds apart (event loop:
        once a second, and at once when a segment says a longer interval than any before
        — its rows may belong to windows that are due already)."""
        after = self.pacer.roll_s
        before = after if before is None else before
        if after != before or interval != self._interval:
            self._interval = interval
            # rows of one probe (probe_tx at the sender, probe_rx at the receiver) now
            # arrive up to one interval apart: the rollups wait that much longer
            self.hot.set_grace(max(self.config.rollup_grace_s, interval + 10.0))
            # ... and so does the clock solver before it solves a window
            self.clock.set_min_lateness(interval + 2.0)
            log.info(
                "event=pace roll_s=%.1f previous=%.1f slowest_host_roll_s=%.1f active_hosts=%d "
                "requests_per_s=%.0f max_requests_per_s=%.0f rollup_grace_s=%.1f "
                "clock_lateness_s=%.1f",
                after,
                before,
                self.pacer.slowest_roll_s,
                self.pacer.active_hosts,
                self.pacer.request_rate,
                self.config.max_requests_per_s,
                self.hot.grace_s,
                self.clock.lateness_ns / 1e9,
            )

    def _compact(self) -> None:
        before = self.compactor.stats.files_merged
        self.compactor.run()
        self.metrics.compactions.inc(self.compactor.stats.files_merged - before)


def _log_compaction(done: asyncio.Future) -> None:
    exc = None if done.cancelled() else done.exception()
    if exc is not None:
        log.error("event=compaction_failed", exc_info=exc)


def store_path(config: IngestConfig) -> Path:
    return Path(config.store_dir)
