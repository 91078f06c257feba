"""The ingest daemon: HTTP batches in, durable Parquet out, live state and metrics.

HTTP contract (docs/store.md, "Batch contract"):

``POST /v1/batch``, body = one segment (:mod:`collector.wire`) or several closed segments
back to back (:mod:`analytics.ingest.body`), header
``Authorization: CLOCKMESH-HMAC-SHA256 <hex>`` = ``wire.sign(fleet_key, body)``.

=====  ==============================================================================
200    ``{"status": "stored"|"duplicate", "segment": N, "rows": R}`` - the rows are
       durable (fsynced Parquet + commit record); the collector may delete the segment.
       A body of several segments also gets ``"segments": [{"segment", "status",
       "rows"}, ...]``; 200 means every one of them is durable.
400    malformed body: bad magic, bad header, truncated chunk, CRC mismatch
401    missing or wrong HMAC (wrong fleet key, altered body)
413    body larger than ``max_body_bytes``
422    well-formed but not storable here: unsupported format/record schema version,
       header host_id that is not the host's id, text that is not UTF-8
503    not stored right now (disk below ``min_free_bytes``, write failure); retry later
=====  ==============================================================================

Every 4xx/5xx body is ``{"status": "rejected"|"unavailable", "error": "<one line>"}``.

Group commit: batches received while a commit is running (or within ``roll_s`` of the
previous one) are written together, fsynced once, and acknowledged together.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import hashlib
import hmac
import json
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiohttp import web
from prometheus_client import Gauge

from analytics.clock.clock_runner import SOURCES as CLOCK_SOURCES
from analytics.clock.clock_runner import ClockRunner
from analytics.detect import attribution
from analytics.detect.detect_runner import DetectConfig, DetectRunner
from analytics.ingest import body as ingest_body
from analytics.ingest.config import IngestConfig, ResolvedIngest, auto_max_rows
from analytics.ingest.metrics import FleetView, HostState, IngestMetrics, SlabCollector
from analytics.ingest.pace import Pacer
from analytics.ingest.slabs import (
    PeakTracker,
    SlabPool,
    mem_available,
    plan_reserve,
    read_peaks,
)
from analytics.store import catalog, layout
from analytics.store.compactor import Compactor
from analytics.store.hot_window import HotWindow
from analytics.store.store_writer import StoreWriteError, StoreWriter
from analytics.thread_priority import lower_thread_priority
from collector import records, wire

log = logging.getLogger("clockmesh.ingest")
_GC_THRESHOLD = 50_000
_PEAKS_SAVE_S = 60.0  # how often the memory peaks are remembered for the next start
_SWITCH_INTERVAL_S = float(os.environ.get("CLOCKMESH_INGEST_SWITCH_INTERVAL_S", "0.0005"))


@dataclass(eq=False)
class PendingBatch:
    """One request's new segments, waiting for their group commit."""

    segs: list[ingest_body.SegmentView]
    rows: int
    received_ns: int
    future: asyncio.Future


ROLL_HEADER = "X-Clockmesh-Roll-S"  # the advised segment interval, also "roll_s" in acks


def _reply(status: int, payload: dict, roll_s: float | None = None) -> web.Response:
    headers = None
    if roll_s is not None:
        payload["roll_s"] = roll_s
        headers = {ROLL_HEADER: str(roll_s)}
    return web.Response(
        status=status,
        body=json.dumps(payload, separators=(",", ":")).encode(),
        content_type="application/json",
        headers=headers,
    )


def _join(
    chunks: list[memoryview] | list[bytes], memory: Callable[[int], np.ndarray]
) -> np.ndarray:
    """The chunks' bytes back to back in ``memory(total)`` (a uint8 array of that size)."""
    out = memory(sum([len(c) for c in chunks]))
    if chunks:
        np.concatenate([np.frombuffer(c, np.uint8) for c in chunks], out=out)
    return out


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
        self.hot = HotWindow(
            window_s=config.hot_window_s,
            max_rows=auto_max_rows(config.hot_max_rows),
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
            nice=config.analysis_nice,
        )
        self.metrics.registry.register(self.clock.collector(self._host_names))
        self.detect = DetectRunner(
            self.writer,
            DetectConfig(
                interval_s=config.detect_interval_s,
                clear_s=config.detect_clear_s,
                flap_window_s=config.detect_flap_window_s,
                topology_file=config.topology_file,
                model_file=config.detect_model_file,
            ),
            host_names=self._host_names,
            nice=config.analysis_nice,
            clock_state=lambda: self.clock.state,
        )
        self.metrics.registry.register(self.detect.collector())
        self.clock.on_owd = self.detect.feed_owd
        self._attribution = attribution.LiveAttribution()  # /v1/live: culprit and victims
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
        self._pending: list[PendingBatch] = []
        self._pending_rows = 0
        self._inflight: dict[tuple[int, int], asyncio.Future] = {}
        self._wake = asyncio.Event()
        self._next_commit = 0
        self._last_commit_start = 0.0
        self._known_names: dict[int, str] = {}
        self._unavailable = ""
        self._broken = ""
        self._commit_pool = concurrent.futures.ThreadPoolExecutor(1, "commit")
        # live view, rollups, compaction: after acknowledgements (thread_priority.py)
        self._side_pool = concurrent.futures.ThreadPoolExecutor(
            1, "live", initializer=lower_thread_priority, initargs=(config.analysis_nice,)
        )
        self._convert_pool = concurrent.futures.ThreadPoolExecutor(4, "convert")
        self._host_ids: dict[str, int] = {}
        self._rejected: set[PendingBatch] = set()  # commit thread: batches answered 422
        # convert threads (one job per table): per table, the buffer its chunks are joined in
        self._scratch: dict[str, np.ndarray] = {}
        # convert threads: per table, its columns' buffers (one convert job per table)
        self._columns: dict[str, dict[str, np.ndarray]] = {name: {} for name in records.TABLES}
        self.slabs = SlabPool()  # the records handed to the hot window and clock runner
        self.body_slabs = SlabPool(64 << 20)  # request bodies, until their commit is done
        reg.register(SlabCollector({"records": self.slabs, "bodies": self.body_slabs}))
        self.peaks = PeakTracker(
            {"records": self.slabs, "bodies": self.body_slabs}, self.writer.root / "_ingest"
        )
        self._stopping = threading.Event()  # ends the memory reserve early
        self._reserver: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None
        self._prev_rates: tuple[float, dict[int, dict[str, int]]] = (time.monotonic(), {})
        self._evicted_seen = 0  # hot.evicted_rows already counted in /metrics

    # ---- lifecycle ---------------------------------------------------------------
    def open_store(self) -> None:
        self.writer.open()
        catalog.write_catalog(self.writer.root)
        self._next_commit = self.writer.committed + 1
        self.metrics.recovered_orphans.set(self.writer.recovered_orphans)
        self.view.free_bytes = self.writer.free_bytes()
        self.view.table_sizes = self.writer.table_sizes()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/batch", self.post_batch)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/v1/live", self.get_live)
        app.router.add_get("/healthz", self.get_health)
        return app

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
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
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
        self._loop = loop
        self._tasks = [
            loop.create_task(self._committer(), name="committer"),
            loop.create_task(self._periodic(), name="periodic"),
        ]
        log.info(
            "event=listening address=%s:%d tls=%s store=%s next_commit=%d",
            self.resolved.host,
            self.resolved.port,
            bool(ssl_ctx),
            self.writer.root,
            self._next_commit,
        )

    def _start_reserve(self) -> None:
        """Fault in the memory the previous run of this store peaked at (or
        ``reserve_bytes``), in the background: ingest_slabs.py."""
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
        self._stopping.set()
        # Flush what was received: those clients are waiting for their ack.
        deadline = time.monotonic() + 10
        while self._pending and time.monotonic() < deadline:
            self._wake.set()
            await asyncio.sleep(0.05)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        self._commit_pool.shutdown(wait=True)
        self._side_pool.shutdown(wait=True)
        self._convert_pool.shutdown(wait=True)
        self.clock.stop()
        self.detect.stop()
        if self._reserver is not None:
            self._reserver.join()
        self.peaks.sample()
        self._save_peaks()

    # ---- HTTP handlers -----------------------------------------------------------
    def _reject(self, status: int, reason: str, error: str, request: web.Request) -> web.Response:
        self.metrics.rejected.labels(reason).inc()
        log.warning(
            "event=batch_rejected status=%d reason=%s peer=%s error=%r",
            status,
            reason,
            request.remote,
            error,
        )
        kind = "unavailable" if status >= 500 else "rejected"
        roll = self.pacer.roll_s if status == 503 else None
        return _reply(status, {"status": kind, "error": error}, roll)

    def unavailable_reason(self) -> str:
        return self._broken or self._unavailable

    async def post_batch(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        reason = self.unavailable_reason()
        if reason:
            return self._reject(503, "unavailable", reason, request)
        try:
            body = await self._read_body(request)
        except web.HTTPRequestEntityTooLarge:
            return self._reject(
                413,
                "too_large",
                f"batch exceeds max_body_bytes ({self.config.max_body_bytes})",
                request,
            )
        if not self._authentic(body, request.headers.get("Authorization")):
            return self._reject(401, "auth", "missing or invalid HMAC for this body", request)
        try:
            segs = ingest_body.decode(body)
        except wire.WireError as exc:
            text = str(exc)
            if "not supported" in text:
                return self._reject(422, "schema", text, request)
            return self._reject(400, "malformed", text, request)
        self.pacer.seen([seg.host_id for seg in segs], received)
        for seg in segs:
            if seg.host_id != self._host_id(seg.host):
                return self._reject(
                    422,
                    "schema",
                    f"header host_id {seg.host_id} is not the id of {seg.host!r}",
                    request,
                )
        # per segment: already stored, in flight in another request, or new
        status_of: list[str] = []
        waits: list[asyncio.Future] = []
        new: list[ingest_body.SegmentView] = []
        seen: set[tuple[int, int]] = set()
        ledger = self.writer.ledger
        for seg in segs:
            key = (seg.host_id, seg.segment)
            existing = self._inflight.get(key)
            if key in ledger or key in seen:
                status_of.append("duplicate")
            elif existing is not None:
                status_of.append("duplicate")
                waits.append(existing)
            else:
                status_of.append("stored")
                new.append(seg)
            seen.add(key)
        if new:
            future: asyncio.Future = asyncio.get_running_loop().create_future()
            rows = sum([seg.total_rows for seg in new])
            for seg in new:
                self._inflight[(seg.host_id, seg.segment)] = future
            self._pending.append(PendingBatch(new, rows, time.time_ns(), future))
            self._pending_rows += rows  # the gauge is set per commit and per second
            self._wake.set()
            waits.append(future)
        for fut in waits:
            status, payload = await asyncio.shield(fut)
            if status != 200:
                if fut is waits[-1] and new:
                    self.metrics.rejected.labels("schema" if status == 422 else "unavailable").inc()
                return _reply(status, dict(payload), self.pacer.roll_s if status == 503 else None)
        stored = status_of.count("stored")
        if stored:
            self.metrics.batches.labels("stored").inc(stored)
        if stored < len(status_of):
            self.metrics.batches.labels("duplicate").inc(len(status_of) - stored)
        if new:
            self.metrics.ack_seconds.observe(time.monotonic() - received)
        return _reply(200, self._ack(segs, status_of), self.pacer.roll_s)

    async def _read_body(self, request: web.Request) -> memoryview:
        """The body, copied once it is complete into memory of the body slab pool
        (ingest_slabs.py): one copy per byte instead of aiohttp's three (a growing
        bytearray, then bytes), into memory reused once the body's commit is done instead
        of fresh pages. Until then only what arrived is held, as aiohttp's chunks: a
        client that announces a large body and sends it slowly reserves nothing more.
        The segment views of the body keep its slab in use until the commit."""
        limit = self.config.max_body_bytes
        if (request.content_length or 0) > limit:
            raise web.HTTPRequestEntityTooLarge(limit, request.content_length or 0)
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise web.HTTPRequestEntityTooLarge(limit, size)
            chunks.append(chunk)
        return _join(chunks, self.body_slabs.take).data  # a memoryview; it refers to the slab

    def _host_id(self, host: str) -> int:
        """``records.host_id`` (a BLAKE2b per call), remembered per fleet host name."""
        hid = self._host_ids.get(host)
        if hid is None:
            if len(self._host_ids) >= 1_000_000:
                self._host_ids.clear()
            hid = self._host_ids[host] = records.host_id(host)
        return hid

    def _authentic(self, body: bytes | memoryview, authorization: str | None) -> bool:
        """``wire.verify`` with the one-shot C HMAC (same scheme, same answer)."""
        prefix = wire.AUTH_SCHEME + " "
        if not authorization or not authorization.startswith(prefix):
            return False
        expected = hmac.digest(self.key, body, hashlib.sha256).hex()
        return hmac.compare_digest(expected, authorization[len(prefix) :].strip())

    @staticmethod
    def _ack(segs: list[ingest_body.SegmentView], status_of: list[str]) -> dict:
        if len(segs) == 1:
            return {"status": status_of[0], "segment": segs[0].segment, "rows": segs[0].total_rows}
        per: list[dict[str, int | str]] = [
            {"segment": seg.segment, "status": st, "rows": seg.total_rows}
            for seg, st in zip(segs, status_of, strict=True)
        ]
        overall = "stored" if "stored" in status_of else "duplicate"
        rows = sum(seg.total_rows for seg in segs)
        return {"status": overall, "segment": segs[0].segment, "rows": rows, "segments": per}

    def _host_names(self) -> dict[int, str]:
        return {h.host_id: h.host for h in self.view.hosts.values()}

    async def get_metrics(self, request: web.Request) -> web.Response:
        self.view.unavailable_reason = self.unavailable_reason()
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def get_live(self, request: web.Request) -> web.Response:
        return _reply(200, self.live_json())

    async def get_health(self, request: web.Request) -> web.Response:
        reason = self.unavailable_reason()
        return _reply(503 if reason else 200, {"ok": not reason, "reason": reason})

    def live_json(self) -> dict:
        now_ns = time.time_ns()
        names = {h.host_id: h.host for h in self.view.hosts.values()}
        live = self.view.live
        doc: dict[str, Any] = {
            "generated_ns": now_ns,
            "live_window_s": live.window_s,
            "live_computed_ns": live.generated_ns,
            "hosts": [
                {
                    "host": h.host,
                    "host_id": h.host_id,
                    "last_batch_age_s": round((now_ns - h.last_ns) / 1e9, 3),
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
                }
                for p in live.pairs
            ],
            "clock": self.clock.live(names),
            "anomalies": self.detect.live(),
            "jobs": self.detect.jobs(),
            "ingest": {
                "commits": self.writer.committed + 1,
                "pending_rows": self._pending_rows,
                "hot_window_rows": self.hot.rows,
            },
            "store": {
                "dir": str(self.writer.root),
                "free_bytes": self.view.free_bytes,
                "accepting": not self.unavailable_reason(),
                "reason": self.unavailable_reason(),
                "tables": {
                    t: {"files": f, "bytes": b} for t, (f, b) in self.view.table_sizes.items()
                },
            },
        }
        # Culprit and victims: which open anomaly explains each pair, each host's loss in
        # both directions and its verdict (analytics/detect/attribution.py).
        racks = {names[i]: r for i, r in self.detect.paths.host_rack.items() if i in names}
        link_leaf = {n: lk.leaf for n, lk in self.detect.paths.links.items()}
        since = live.generated_ns - int((live.window_s + 10) * 1e9)  # loss still counted
        ended = [a for a in doc["anomalies"]["recently_closed"] if a["closed_ns"] >= since]
        open_ = doc["anomalies"]["open"]
        self._attribution.annotate(live.generated_ns, doc["hosts"], doc["pairs"], open_, racks,
                                   link_leaf, ended)  # fmt: skip
        return doc

    # ---- group commit ------------------------------------------------------------
    async def _committer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            wait = self._last_commit_start + self.config.roll_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._wake.clear()
            group, rows = self._take_group()
            if not group:
                continue
            self._last_commit_start = time.monotonic()
            number = self._next_commit
            self._check_space()
            if self.unavailable_reason():
                self._finish(group, 503, self.unavailable_reason())
                continue
            try:
                nbytes = await loop.run_in_executor(
                    self._commit_pool, self._commit_group, number, group
                )
            except StoreWriteError as exc:
                self.metrics.commit_failures.inc()
                text = str(exc)
                log.error("event=commit_failed commit=%d error=%r", number, text)
                if "restart the daemon" in text:
                    self._broken = text
                else:
                    self._unavailable = text
                self._finish(group, 503, text)
                continue
            except Exception as exc:  # a bug must not leave clients hanging
                log.exception("event=commit_crashed commit=%d", number)
                self._broken = f"commit {number} failed unexpectedly: {exc!r}"
                self._finish(group, 503, self._broken)
                continue
            self._next_commit = number + 1
            self.metrics.commits.inc()
            for b in group:
                if b.future.done():  # answered already (rejected inside the commit)
                    continue
                for seg in b.segs:
                    self.writer.ledger.add(seg.host_id, seg.segment)
            self._finish(group, 200, "stored")
            log.debug("event=committed commit=%d batches=%d rows=%d bytes=%d",
                      number, len(group), rows, nbytes)  # fmt: skip
            if self._pending:
                self._wake.set()

    def _take_group(self) -> tuple[list[PendingBatch], int]:
        rows = cut = 0
        for cut, b in enumerate(self._pending, 1):  # noqa: B007
            rows += b.rows
            if rows >= self.config.max_commit_rows:
                break
        group, self._pending = self._pending[:cut], self._pending[cut:]
        self._pending_rows -= rows
        self.metrics.pending_rows.set(self._pending_rows)
        return group, rows

    def _finish(self, group: list[PendingBatch], status: int, text: str) -> None:
        payload = (
            {"status": "stored"} if status == 200 else {"status": "unavailable", "error": text}
        )
        for b in group:
            for seg in b.segs:
                self._inflight.pop((seg.host_id, seg.segment), None)
            if not b.future.done():
                b.future.set_result((status, payload))

    def _reject_in_commit(self, b: PendingBatch, error: str) -> None:
        """Answer one batch 422 from the commit thread (its text is not storable)."""
        host = b.segs[0].host
        log.warning("event=batch_rejected status=422 reason=schema host=%s error=%r", host, error)
        payload = {"status": "rejected", "error": error}
        loop = self._loop
        assert loop is not None

        def answer() -> None:
            for seg in b.segs:
                self._inflight.pop((seg.host_id, seg.segment), None)
            if not b.future.done():
                b.future.set_result((422, payload))

        loop.call_soon_threadsafe(answer)

    def _group_tables(
        self, group: list[PendingBatch]
    ) -> tuple[dict[str, pa.Table], dict[str, np.ndarray]]:
        """Every record table of the group as one Arrow table: one concatenation and one
        conversion per table and commit, not per request. A batch whose text is not
        UTF-8 is answered 422 and left out (found only when the group's conversion fails).

        Also returns the numpy records of the clock runner's tables (probe_tx, probe_rx,
        echo): those are joined into a fresh array it keeps, instead of the scratch
        buffer, so it needs no Arrow -> numpy conversion (docs/store.md, "Round 3").
        """
        while True:
            live = [b for b in group if not b.future.done() and b not in self._rejected]
            tables: dict[str, pa.Table] = {}
            recs: dict[str, np.ndarray] = {}
            bad: PendingBatch | None = None
            jobs = {}
            for name in records.TABLES:
                chunks = [c for b in live for seg in b.segs for c in seg.chunks.get(name, ())]
                if chunks:  # the tables are converted side by side (numpy copies drop the GIL)
                    jobs[name] = self._convert_pool.submit(self._convert, name, chunks)
            concurrent.futures.wait(jobs.values())
            failed = ""
            for name, job in jobs.items():
                try:
                    tables[name], rows = job.result()
                except (pa.ArrowInvalid, UnicodeDecodeError):
                    failed = failed or name
                    continue
                if rows is not None:
                    recs[name] = rows
            if failed:
                bad = self._find_bad_text(live, failed)
            if bad is None:
                return tables, recs
            self._rejected.add(bad)

    def _convert(self, name: str, chunks: list[memoryview]) -> tuple[pa.Table, np.ndarray | None]:
        """One table of a group commit as Arrow (plus, for the clock runner's and the hot
        window's tables, the numpy records they keep).

        The chunks are views of the request bodies: the clock runner's tables are joined
        into memory of the slab pool (ingest_slabs.py), the others into this table's
        long-lived scratch buffer. The Arrow columns are copied into this table's
        long-lived column buffers: valid until its next commit, and written by then.
        """
        columns = self._columns[name]
        dtype = records.TABLES[name]
        if name in CLOCK_SOURCES:  # kept by the clock runner and the hot window
            rows = _join(chunks, self.slabs.take).view(dtype)
            return layout.records_to_arrow(name, rows, columns), rows
        scratch = _join(chunks, lambda n: layout.scratch_bytes(self._scratch, name, n))
        return layout.records_to_arrow(name, scratch.view(dtype), columns), None

    def _find_bad_text(self, live: list[PendingBatch], name: str) -> PendingBatch:
        for b in live:
            for seg in b.segs:
                if name not in seg.chunks:
                    continue
                try:
                    layout.records_to_arrow(name, seg.table(name))
                except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                    self._reject_in_commit(
                        b, f"segment {seg.segment}: {name}: text is not UTF-8 ({exc})"
                    )
                    return b
        raise AssertionError(f"{name}: conversion failed but no batch is at fault")

    def _commit_group(self, number: int, group: list[PendingBatch]) -> int:
        """Runs in the commit thread: build columns, write, fsync; then feed the hot window."""
        started = time.monotonic()
        self._rejected = set()
        tables, clock_rows = self._group_tables(group)
        group = [b for b in group if b not in self._rejected]
        if not group:
            return 0
        segs = [(b, seg, seg.nbytes, seg.total_rows) for b in group for seg in b.segs]
        new_names = [
            (b.received_ns, seg.host_id, seg.host)
            for b, seg, _, _ in segs
            if self._known_names.get(seg.host_id) != seg.host
        ]
        if new_names:
            seen = {}
            for ts, hid, host in new_names:
                seen[hid] = (ts, host)
            tables["host_names"] = pa.table(
                {
                    "ts_ns": pa.array([v[0] for v in seen.values()], pa.int64()),
                    "host_id": pa.array(list(seen), pa.int64()),
                    "host": pa.array([v[1] for v in seen.values()], pa.string()),
                },
                schema=layout.TABLES["host_names"].schema,
            )
        n = len(segs)
        batches = pa.table(
            {
                "commit": pa.array(np.full(n, number, np.int64)),
                "received_ns": pa.array([x[0].received_ns for x in segs], pa.int64()),
                "host_id": pa.array([x[1].host_id for x in segs], pa.int64()),
                "host": pa.array([x[1].host for x in segs], pa.string()),
                "segment": pa.array([x[1].segment for x in segs], pa.int64()),
                "created_ns": pa.array([x[1].created_ns for x in segs], pa.int64()),
                "rows": pa.array([x[3] for x in segs], pa.int64()),
                "bytes": pa.array([x[2] for x in segs], pa.int64()),
            },
            schema=layout.TABLES["batches"].schema,
        )
        with self.metrics.commit_seconds.time():
            nbytes = self.writer.commit(number, tables, batches)
        # durable from here on
        for ts, hid, host in new_names:
            self._known_names[hid] = host
            del ts
        now_ns = time.time_ns()
        # copy-on-write: the event loop and the live thread read these without a lock
        per_host: dict[int, tuple[str, list[int], dict[str, int]]] = {}
        for b, seg, _, _ in segs:
            agg = per_host.get(seg.host_id)
            if agg is None:
                agg = per_host[seg.host_id] = (seg.host, [b.received_ns, 0, seg.created_ns], {})
            agg[1][0] = max(agg[1][0], b.received_ns)
            agg[1][1] += 1
            agg[1][2] = min(agg[1][2], seg.created_ns)
            counts = agg[2]
            for name, n in seg.rows.items():
                counts[name] = counts.get(name, 0) + n
        hosts = dict(self.view.hosts)
        for hid, (host, (last_ns, nbatches, created_ns), added) in per_host.items():
            h = hosts.get(hid)
            if h is None:
                h = hosts[hid] = HostState(host, hid, last_ns, last_ns)
            h.host = host
            h.last_ns = max(h.last_ns, last_ns)
            h.since_ns = min(h.since_ns, created_ns)
            h.batches += nbatches
            rows = dict(h.rows)
            for name, n in added.items():
                rows[name] = rows.get(name, 0) + n
            h.rows = rows
        self.view.hosts = hosts
        for name, data in tables.items():
            if name in records.TABLES:
                self.metrics.rows.labels(name).inc(data.num_rows)
        self.metrics.bytes.inc(sum(x[2] for x in segs))
        self.hot.add(now_ns, clock_rows)  # the fresh numpy records (kept, never changed)
        self.clock.feed(clock_rows)  # solved per window in the clock thread
        self.detect.feed(tables, clock_rows)  # judged every detect_interval_s (detector thread)
        self.metrics.hot_rows.set(self.hot.rows)
        log.debug("commit %d took %.3fs", number, time.monotonic() - started)
        return nbytes

    # ---- background work ---------------------------------------------------------
    def _check_space(self) -> None:
        free = self.writer.free_bytes()
        self.view.free_bytes = free
        if free < self.config.min_free_bytes:
            reason = (
                f"store filesystem has {free} bytes free, below min_free_bytes "
                f"{self.config.min_free_bytes}"
            )
            if self._unavailable != reason:
                log.error("event=store_full free_bytes=%d min_free_bytes=%d",
                          free, self.config.min_free_bytes)  # fmt: skip
            self._unavailable = reason
        elif self._unavailable:
            log.warning("event=store_accepting_again free_bytes=%d", free)
            self._unavailable = ""

    async def _periodic(self) -> None:
        loop = asyncio.get_running_loop()
        next_live = next_compact = next_peaks = time.monotonic()
        next_compact += self.config.compact_s
        while True:
            await asyncio.sleep(1.0)
            self._check_space()
            self.peaks.sample()
            self._pace()
            self.metrics.pending_rows.set(self._pending_rows)
            now = time.monotonic()
            if now >= next_peaks:
                next_peaks = now + _PEAKS_SAVE_S
                self._save_peaks()
            if now >= next_live:
                next_live = now + self.config.live_refresh_s
                try:
                    await loop.run_in_executor(self._side_pool, self._refresh_live)
                except Exception:
                    log.exception("event=live_refresh_failed")
            if now >= next_compact:
                next_compact = now + self.config.compact_s
                try:
                    await loop.run_in_executor(self._side_pool, self._compact)
                except Exception:
                    log.exception("event=compaction_failed")

    def _pace(self) -> None:
        before = self.pacer.roll_s
        after = self.pacer.update()
        self._pace_gauges[0].set(after)
        self._pace_gauges[1].set(self.pacer.active_hosts)
        self._pace_gauges[2].set(self.pacer.request_rate)
        if after != before:
            # rows of one probe (probe_tx at the sender, probe_rx at the receiver) now
            # arrive up to one interval apart: the rollups wait that much longer
            self.hot.set_grace(max(self.config.rollup_grace_s, after + 10.0))
            # ... and so does the clock solver before it solves a window
            self.clock.set_min_lateness(after + 2.0)
            log.info(
                "event=pace roll_s=%.1f previous=%.1f active_hosts=%d requests_per_s=%.0f "
                "max_requests_per_s=%.0f rollup_grace_s=%.1f clock_lateness_s=%.1f",
                after,
                before,
                self.pacer.active_hosts,
                self.pacer.request_rate,
                self.config.max_requests_per_s,
                self.hot.grace_s,
                self.clock.lateness_ns / 1e9,
            )

    def _refresh_live(self) -> None:
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

    def _compact(self) -> None:
        before = self.compactor.stats.files_merged
        self.compactor.run()
        self.metrics.compactions.inc(self.compactor.stats.files_merged - before)


def store_path(config: IngestConfig) -> Path:
    return Path(config.store_dir)
