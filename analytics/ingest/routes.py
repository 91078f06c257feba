"""The daemon's HTTP surface: the routes, the HMAC check and the answers.

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
``GET /metrics`` (Prometheus), ``GET /v1/live`` (:mod:`analytics.ingest.live`) and
``GET /healthz`` are read-only. A batch waits for its group commit
(:mod:`analytics.ingest.group_commit`) before it is answered.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time

from aiohttp import web

from analytics.ingest import body as ingest_body
from analytics.ingest.config import IngestConfig
from analytics.ingest.group_commit import GroupCommit, join_chunks
from analytics.ingest.live import LiveDocument
from analytics.ingest.metrics import FleetView, IngestMetrics
from analytics.ingest.pace import Pacer
from analytics.ingest.slabs import SlabPool
from collector import records, wire

log = logging.getLogger("clockmesh.ingest")

ROLL_HEADER = "X-Clockmesh-Roll-S"  # the advised segment interval, also "roll_s" in acks


def reply(status: int, payload: dict, roll_s: float | None = None) -> web.Response:
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


class Routes:
    """The handlers of the daemon's four routes; :meth:`app` is the aiohttp application."""

    def __init__(
        self,
        config: IngestConfig,
        fleet_key: bytes,
        commit: GroupCommit,
        live: LiveDocument,
        metrics: IngestMetrics,
        view: FleetView,
        pacer: Pacer,
        body_slabs: SlabPool,
    ) -> None:
        self.config = config
        self.key = fleet_key
        self.commit = commit
        self.live = live
        self.metrics = metrics
        self.view = view
        self.pacer = pacer
        self.body_slabs = body_slabs  # request bodies, until their commit is done
        self._host_ids: dict[str, int] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/batch", self.post_batch)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/v1/live", self.get_live)
        app.router.add_get("/healthz", self.get_health)
        return app

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
        return reply(status, {"status": kind, "error": error}, roll)

    async def post_batch(self, request: web.Request) -> web.Response:
        received = time.monotonic()
        reason = self.commit.unavailable_reason()
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
        self.pacer.seen([seg.host_id for seg in segs], received, [seg.roll_s for seg in segs])
        for seg in segs:
            if seg.host_id != self._host_id(seg.host):
                return self._reject(
                    422,
                    "schema",
                    f"header host_id {seg.host_id} is not the id of {seg.host!r}",
                    request,
                )
        status_of, waits, new = self.commit.enqueue(segs)
        for fut in waits:
            status, payload = await asyncio.shield(fut)
            if status != 200:
                if fut is waits[-1] and new:
                    self.metrics.rejected.labels("schema" if status == 422 else "unavailable").inc()
                return reply(status, dict(payload), self.pacer.roll_s if status == 503 else None)
        stored = status_of.count("stored")
        if stored:
            self.metrics.batches.labels("stored").inc(stored)
        if stored < len(status_of):
            self.metrics.batches.labels("duplicate").inc(len(status_of) - stored)
        if new:
            self.metrics.ack_seconds.observe(time.monotonic() - received)
        return reply(200, self._ack(segs, status_of), self.pacer.roll_s)

    async def _read_body(self, request: web.Request) -> memoryview:
        """The body, copied once it is complete into memory of the body slab pool
        (slabs.py): one copy per byte instead of aiohttp's three (a growing
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
        return join_chunks(chunks, self.body_slabs.take).data  # a memoryview; it refers to the slab

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

    async def get_metrics(self, request: web.Request) -> web.Response:
        self.view.unavailable_reason = self.commit.unavailable_reason()
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def get_live(self, request: web.Request) -> web.Response:
        return reply(200, self.live.document())

    async def get_health(self, request: web.Request) -> web.Response:
        reason = self.commit.unavailable_reason()
        return reply(503 if reason else 200, {"ok": not reason, "reason": reason})
