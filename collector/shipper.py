"""Ships closed spool segments to the ops box, in order, exactly once after ingest.

Contract (docs/collector.md, "Shipping"): ``POST <ingest.url>/v1/batch`` with the
segment bytes as body, ``Authorization: wire.sign(key, body)`` and
``Content-Type: application/x-clockmesh-segment``. The ops box answers 200 with
``{"status": "stored"|"duplicate", "segment": N, "rows": R}`` only once the
batch is durable; only then is the file deleted. 4xx: the batch itself is bad:
it moves to ``spool/rejected/`` and shipping goes on. 5xx, connection errors,
timeouts or a 200 that does not acknowledge this segment: retry the same
segment with capped exponential back-off.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from collector import wire
from collector.spool import Spool

log = logging.getLogger("clockmesh.collector.shipper")
CONTENT_TYPE = "application/x-clockmesh-segment"


@dataclass
class ShipperStats:
    segments_acked: int = 0
    rows_acked: int = 0
    duplicates: int = 0
    rejected: int = 0
    failures: int = 0
    last_ack_segment: int = 0
    last_ack_unix: float = 0.0
    last_error: str = ""
    backoff_s: float = 0.0


class Shipper(threading.Thread):
    """Background thread: oldest closed segment -> POST -> ack -> delete."""

    def __init__(
        self,
        spool: Spool,
        url: str,
        key: bytes,
        *,
        timeout_s: float = 5.0,
        retry_max_s: float = 30.0,
        retry_min_s: float = 0.25,
        ca_file: str = "",
    ) -> None:
        super().__init__(name="clockmesh-shipper", daemon=True)
        self.spool = spool
        self.key = key
        self.timeout_s = timeout_s
        self.retry_max_s = retry_max_s
        self.retry_min_s = retry_min_s
        self.stats = ShipperStats()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        parsed = urllib.parse.urlsplit(url)
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or ""
        self._port = parsed.port or (443 if self._https else 80)
        self._path = parsed.path.rstrip("/") + "/v1/batch"
        self._ssl = ssl.create_default_context(cafile=ca_file or None) if self._https else None
        self._conn: http.client.HTTPConnection | None = None

    def set_target(self, url: str, timeout_s: float, retry_max_s: float) -> None:
        """Config reload: next request goes to the new URL."""
        parsed = urllib.parse.urlsplit(url)
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or ""
        self._port = parsed.port or (443 if self._https else 80)
        self._path = parsed.path.rstrip("/") + "/v1/batch"
        self.timeout_s = timeout_s
        self.retry_max_s = retry_max_s
        self._drop_connection()
        self._wake.set()

    def wake(self) -> None:
        """A segment was closed: ship it now rather than at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    # ---- HTTP -----------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout_s, context=self._ssl
                )
            else:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self.timeout_s
                )
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def post(self, body: bytes) -> tuple[int, bytes]:
        headers = {
            "Authorization": wire.sign(self.key, body),
            "Content-Type": CONTENT_TYPE,
            "Content-Length": str(len(body)),
        }
        reused = self._conn is not None
        conn = self._connection()
        try:
            conn.request("POST", self._path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            self._drop_connection()
            if not reused:
                raise
            # The server closed an idle keep-alive connection: one fresh attempt.
            # (Safe to repeat: ingest de-duplicates by (host, segment).)
            return self.post(body)
        except BaseException:
            self._drop_connection()
            raise
        if resp.getheader("Connection", "").lower() == "close":
            self._drop_connection()
        return resp.status, data

    # ---- one step -------------------------------------------------------------------
    def ship_one(self) -> bool | None:
        """Try the oldest closed segment once.

        Returns True when it was acknowledged or rejected (move on), False on a
        retryable failure, None when there is nothing to ship.
        """
        seg_id = self.spool.oldest_closed()
        if seg_id is None:
            return None
        with self.spool.lock:
            self.spool.in_flight = seg_id
        try:
            try:
                body = self.spool.path_of(seg_id).read_bytes()
            except FileNotFoundError:
                # Dropped by the size bound between listing and reading.
                self.spool.acknowledged(seg_id)
                return True
            try:
                status, data = self.post(body)
            except (OSError, http.client.HTTPException) as exc:
                self._failed(seg_id, f"{type(exc).__name__}: {exc}")
                return False
            if 200 <= status < 300:
                return self._handle_ok(seg_id, status, data)
            if 400 <= status < 500:
                reason = data[:200].decode("utf-8", "replace").strip()
                self.spool.rejected(seg_id, f"HTTP {status}: {reason}")
                self.stats.rejected += 1
                log.error(
                    "event=batch_rejected segment=%d status=%d reason=%r", seg_id, status, reason
                )
                return True
            self._failed(seg_id, f"HTTP {status}")
            return False
        finally:
            with self.spool.lock:
                self.spool.in_flight = None

    def _handle_ok(self, seg_id: int, status: int, data: bytes) -> bool:
        try:
            answer = json.loads(data)
            ack_status = answer["status"]
            ack_segment = int(answer["segment"])
            rows = int(answer.get("rows", 0))
        except (ValueError, KeyError, TypeError):
            self._failed(seg_id, f"HTTP {status} with an unreadable acknowledgement")
            return False
        if ack_status not in ("stored", "duplicate") or ack_segment != seg_id:
            self._failed(seg_id, f"acknowledgement does not match: {answer!r}")
            return False
        self.spool.acknowledged(seg_id)
        self.stats.segments_acked += 1
        self.stats.rows_acked += rows
        self.stats.duplicates += ack_status == "duplicate"
        self.stats.last_ack_segment = seg_id
        self.stats.last_ack_unix = time.time()
        self.stats.backoff_s = 0.0
        if self.stats.last_error:
            log.info("event=ingest_reachable segment=%d", seg_id)
        self.stats.last_error = ""
        log.debug("event=batch_acked segment=%d status=%s rows=%d", seg_id, ack_status, rows)
        return True

    def _failed(self, seg_id: int, error: str) -> None:
        self.stats.failures += 1
        if not self.stats.last_error:
            log.warning("event=ship_failed segment=%d error=%r action=retry", seg_id, error)
        self.stats.last_error = error
        nxt = self.stats.backoff_s * 2 if self.stats.backoff_s else self.retry_min_s
        self.stats.backoff_s = min(self.retry_max_s, nxt)

    # ---- thread ---------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopping.is_set():
            result = self.ship_one()
            if result is True:
                continue
            if result is False:
                # Wait on stop only: a newly closed segment must not cut the back-off short.
                self._stopping.wait(self.stats.backoff_s)
            else:
                self._wake.wait(1.0)
                self._wake.clear()
        self._drop_connection()

    def drain(self, deadline_s: float) -> None:
        """Ship what is closed until empty, a failure, or ``deadline_s`` (shutdown)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.ship_one() is not True:
                return
