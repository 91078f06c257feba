"""Ships closed spool segments to each ops box, in order, exactly once after ingest.

Contract (docs/collector.md, "Shipping contract"): ``POST <ingest.url>/v1/batch`` with
the segment bytes as body (with a backlog: up to ``MAX_SEGMENTS_PER_REQUEST`` closed
segments back to back, oldest first; the ack then lists each),
``Authorization: wire.sign(key, body)`` and
``Content-Type: application/x-clockmesh-segment``. The ops box answers 200 with
``{"status": "stored"|"duplicate", "segment": N, "rows": R}`` only once the
batch is durable; only then is the file deleted. 4xx: the batch itself is bad:
it moves to ``spool/rejected/`` and shipping goes on. 5xx, connection errors,
timeouts or a 200 that does not acknowledge this segment: retry the same
segment with capped exponential back-off. A 4xx of a multi-segment body: the segments
go again one by one, so only the bad one is set aside. Every ack (and 503) carries the
segment interval the ops box wants (``roll_s``, header ``X-Clockmesh-Roll-S``); the
spool rolls at ``max(spool.roll_s, advised)``, capped by ``spool.max_roll_s``.

Several ops boxes (``ingest.urls``, docs/collector.md "Two ops boxes"): one
:class:`Shipper` thread per box, each with its own acknowledgement cursor in the
spool, so a box that is down, slow or refusing holds up no other. A 401/403 means the
box refuses this collector (another fleet key): nothing is set aside, the box is
retried with back-off and the refusal is logged once per box and counted.
:class:`Shippers` starts, wakes, stops and drains them together.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import logging
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from collector import wire
from collector.config import box_key
from collector.spool import Spool

log = logging.getLogger("clockmesh.collector.shipper")
CONTENT_TYPE = "application/x-clockmesh-segment"
ROLL_HEADER = "X-Clockmesh-Roll-S"  # the ops box's advised segment interval (seconds)
MAX_SEGMENTS_PER_REQUEST = 30  # a backlog goes out this many closed segments at a time
MAX_REQUEST_BYTES = 16 * 1024 * 1024  # ... and at most this many bytes (ops box: 64 MiB)


THREAD_NAME = b"cm-shipper"  # the OS thread name (top -H, /proc/<pid>/task/*/comm)


def _name_os_thread(name: bytes) -> None:
    """Name the calling OS thread (Linux ``prctl(PR_SET_NAME)``), so its CPU time can be
    told apart (benchmarks/bench_collector.py --ops); harmless where unsupported."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, name[:15], 0, 0, 0)


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
    requests_acked: int = 0
    advised_roll_s: float = 0.0
    refused: int = 0  # 401/403 answers: the box does not take this collector's key


class Shipper(threading.Thread):
    """Background thread for one ops box: oldest closed segment it has not acknowledged
    -> POST -> ack -> its cursor moves on (the spool deletes once every box is past)."""

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
        max_segments: int = MAX_SEGMENTS_PER_REQUEST,
        max_body_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self.url = url
        self.box = box_key(url)
        super().__init__(name=f"clockmesh-shipper-{self.box}", daemon=True)
        self.spool = spool
        spool.ensure_box(self.box)
        self.key = key
        self.timeout_s = timeout_s
        self.retry_max_s = retry_max_s
        self.retry_min_s = retry_min_s
        self.stats = ShipperStats()
        self.max_segments = max_segments
        self.max_body_bytes = max_body_bytes
        self._single_left = 0  # after a 4xx of a multi-segment body: this many one by one
        self._stopping = threading.Event()
        self._wake = threading.Event()
        parsed = urllib.parse.urlsplit(url)
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or ""
        self._port = parsed.port or (443 if self._https else 80)
        self._path = parsed.path.rstrip("/") + "/v1/batch"
        self._ssl = ssl.create_default_context(cafile=ca_file or None) if self._https else None
        self._conn: http.client.HTTPConnection | None = None
        self._retarget = False  # set_target happened: reconnect before the next request

    def set_target(self, url: str, timeout_s: float, retry_max_s: float) -> None:
        """Config reload: next request goes to the new URL (the same box: same key)."""
        self.url = url
        parsed = urllib.parse.urlsplit(url)
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or ""
        self._port = parsed.port or (443 if self._https else 80)
        self._path = parsed.path.rstrip("/") + "/v1/batch"
        self.timeout_s = timeout_s
        self.retry_max_s = retry_max_s
        # Called from the main thread: the shipper thread drops its connection itself
        # before its next request (closing it here could pull it out from under a post).
        self._retarget = True
        self._wake.set()

    def wake(self) -> None:
        """A segment was closed: ship it now rather than at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    # ---- HTTP -----------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._retarget:
            self._retarget = False
            self._drop_connection()
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

    def post(self, body: bytes) -> tuple[int, bytes, str | None]:
        """POST one body; (status, response body, advised roll_s header or None)."""
        headers = {
            "Authorization": wire.sign(self.key, body),
            "Content-Type": CONTENT_TYPE,
            "Content-Length": str(len(body)),
        }
        conn = self._connection()
        reused = conn.sock is not None  # an open keep-alive connection
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
        return resp.status, data, resp.getheader(ROLL_HEADER)

    # ---- one step -------------------------------------------------------------------
    def ship_one(self) -> bool | None:
        """Try the oldest closed segment(s) once: up to ``max_segments`` of them in one
        request when a backlog is waiting (docs/collector.md, "Shipping contract").

        Returns True when they were acknowledged or rejected (move on), False on a
        retryable failure, None when there is nothing to ship.
        """
        limit = 1 if self._single_left > 0 else self.max_segments
        ids = self.spool.pending(self.box, limit, self.max_body_bytes)
        if not ids:
            return None
        self.spool.set_in_flight(self.box, ids)
        try:
            return self._ship(ids)
        finally:
            self.spool.set_in_flight(self.box, ())

    def _ship(self, ids: list[int]) -> bool:
        bodies = []
        for seg_id in ids:
            try:
                bodies.append(self.spool.path_of(seg_id).read_bytes())
            except FileNotFoundError:
                # Dropped by the size bound between listing and reading (or removed by
                # hand): gone for every box, so the next step goes on with what is left.
                self.spool.acknowledged(seg_id)
                return True
        try:
            status, data, roll = self.post(b"".join(bodies))
        except (OSError, http.client.HTTPException) as exc:
            self._failed(ids[0], f"{type(exc).__name__}: {exc}")
            return False
        self._take_advice(roll)
        if 200 <= status < 300:
            return self._handle_ok(ids, status, data)
        if status in (401, 403):
            # The box refuses this collector itself (another fleet key), not a segment:
            # keep everything for it and retry; the other boxes go on meanwhile.
            self._refused(ids[0], status, data[:200].decode("utf-8", "replace").strip())
            return False
        if 400 <= status < 500 and len(ids) > 1:
            # Which segment is bad? Resend them one by one: only that one is set aside
            # (also what an ops box without multi-segment bodies needs).
            self._single_left = len(ids)
            self.stats.backoff_s = 0.0  # the ops box answered: no reason to wait
            log.info("event=batch_split segments=%d status=%d action=one_by_one", len(ids), status)
            return True
        if 400 <= status < 500:
            self._single_left = max(0, self._single_left - 1)
            seg_id = ids[0]
            reason = data[:200].decode("utf-8", "replace").strip()
            self.spool.box_done(self.box, seg_id, rejected=f"HTTP {status}: {reason}")
            self.stats.rejected += 1
            log.error(
                "event=batch_rejected box=%s segment=%d status=%d reason=%r",
                self.url, seg_id, status, reason,
            )  # fmt: skip
            return True
        self._failed(ids[0], f"HTTP {status}")
        return False

    def _take_advice(self, roll: str | None) -> None:
        """The ops box's advised segment interval (header, or ``roll_s`` in the ack)."""
        if roll is None:
            return
        try:
            value = float(roll)
        except ValueError:
            return
        if not 0 < value < 86400:  # NaN and nonsense are ignored
            return
        changed = value != self.spool.advised_roll_s
        self.stats.advised_roll_s = value
        self.spool.advise(value)
        if changed:
            log.info(
                "event=pace advised_roll_s=%.1f effective_roll_s=%.1f",
                value,
                self.spool.effective_roll_s(),
            )

    def _handle_ok(self, ids: list[int], status: int, data: bytes) -> bool:
        try:
            answer = json.loads(data)
            ack_status = answer["status"]
            ack_segment = int(answer["segment"])
            rows = int(answer.get("rows", 0))
            if len(ids) > 1:
                per = [(int(x["segment"]), x["status"]) for x in answer["segments"]]
            else:
                per = [(ack_segment, ack_status)]
        except (ValueError, KeyError, TypeError):
            self._failed(ids[0], f"HTTP {status} with an unreadable acknowledgement")
            return False
        if (
            ack_status not in ("stored", "duplicate")
            or ack_segment != ids[0]
            or [seg for seg, _ in per] != ids
            or any(st not in ("stored", "duplicate") for _, st in per)
        ):
            self._failed(ids[0], f"acknowledgement does not match: {answer!r}")
            return False
        self.spool.box_done(self.box, ids[-1])
        if self._single_left > 0:
            self._single_left -= 1
        self.stats.requests_acked += 1
        self.stats.segments_acked += len(ids)
        self.stats.rows_acked += rows
        self.stats.duplicates += sum(st == "duplicate" for _, st in per)
        self.stats.last_ack_segment = ids[-1]
        self.stats.last_ack_unix = time.time()
        self.stats.backoff_s = 0.0
        if self.stats.last_error:
            log.info("event=ingest_reachable box=%s segment=%d", self.url, ids[0])
        self.stats.last_error = ""
        log.debug(
            "event=batch_acked segments=%d-%d count=%d status=%s rows=%d",
            ids[0], ids[-1], len(ids), ack_status, rows,
        )  # fmt: skip
        return True

    def _refused(self, seg_id: int, status: int, reason: str) -> None:
        self.stats.refused += 1
        error = f"HTTP {status}: {reason} (another fleet key?)"
        if self.stats.last_error != error:  # once per box until it answers otherwise
            log.error(
                "event=box_refused box=%s segment=%d status=%d reason=%r "
                "hint='does this ops box use another fleet key?' action=retry",
                self.url, seg_id, status, reason,
            )  # fmt: skip
        self._back_off(error)

    def _failed(self, seg_id: int, error: str) -> None:
        self.stats.failures += 1
        if not self.stats.last_error:
            log.warning(
                "event=ship_failed box=%s segment=%d error=%r action=retry", self.url, seg_id, error
            )
        self._back_off(error)

    def _back_off(self, error: str) -> None:
        self.stats.last_error = error
        nxt = self.stats.backoff_s * 2 if self.stats.backoff_s else self.retry_min_s
        self.stats.backoff_s = min(self.retry_max_s, nxt)

    # ---- thread ---------------------------------------------------------------------
    def run(self) -> None:
        _name_os_thread(THREAD_NAME)
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


class Shippers:
    """One :class:`Shipper` per ops box over one spool: started, woken (an urgent
    segment goes to every box at once), stopped and drained together."""

    def __init__(
        self,
        spool: Spool,
        urls: list[str],
        key: bytes,
        *,
        timeout_s: float = 5.0,
        retry_max_s: float = 30.0,
        ca_file: str = "",
    ) -> None:
        self.spool = spool
        self.key = key
        self.ca_file = ca_file
        spool.set_boxes([box_key(url) for url in urls])
        self.all = [self._new(url, timeout_s, retry_max_s) for url in urls]
        self._started = False

    def _new(self, url: str, timeout_s: float, retry_max_s: float) -> Shipper:
        return Shipper(
            self.spool,
            url,
            self.key,
            timeout_s=timeout_s,
            retry_max_s=retry_max_s,
            ca_file=self.ca_file,
        )

    def start(self) -> None:
        self._started = True
        for sh in self.all:
            sh.start()

    def wake(self) -> None:
        for sh in self.all:
            sh.wake()

    def set_key(self, key: bytes) -> None:
        self.key = key
        for sh in self.all:
            sh.key = key

    def set_targets(self, urls: list[str], timeout_s: float, retry_max_s: float) -> None:
        """Config reload: keep the shippers of boxes still listed (their cursors and
        connections), start those of new boxes, stop those of boxes no longer listed."""
        old = {sh.box: sh for sh in self.all}
        new: list[Shipper] = []
        for url in urls:
            sh = old.pop(box_key(url), None)
            if sh is None:
                sh = self._new(url, timeout_s, retry_max_s)
                if self._started:
                    sh.start()
            else:
                sh.set_target(url, timeout_s, retry_max_s)
            new.append(sh)
        for sh in old.values():
            sh.stop()
        self.all = new
        self.spool.set_boxes([sh.box for sh in new])

    def stop(self, join_s: float) -> None:
        for sh in self.all:
            sh.stop()
        end = time.monotonic() + join_s
        for sh in self.all:
            if sh.is_alive():
                sh.join(max(0.0, end - time.monotonic()))

    def drain(self, deadline_s: float) -> None:
        """Every stopped box's shipper ships what is closed, side by side, for up to
        ``deadline_s`` (shutdown): a box that does not answer holds up no other."""
        threads = [
            threading.Thread(target=sh.drain, args=(deadline_s,), daemon=True)
            for sh in self.all
            if not sh.is_alive()
        ]
        for th in threads:
            th.start()
        end = time.monotonic() + deadline_s + 0.5
        for th in threads:
            th.join(max(0.0, end - time.monotonic()))

    @property
    def rejected(self) -> int:
        return sum(sh.stats.rejected for sh in self.all)
