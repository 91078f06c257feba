"""A small real HTTP receiver implementing the ingest batch contract (tests only).

Used by the collector's shipper tests until ``clockmesh ingest run`` exists:
``POST /v1/batch`` with a segment body, ``Authorization`` checked with
wire.verify, 200 ``{"status": "stored"|"duplicate", "segment": N, "rows": R}``
after "storing" (in memory), 400 for a bad signature or body, and switchable
failure modes (503, or store-then-drop-the-connection) to exercise retries.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from collector import wire


class Receiver:
    def __init__(self, key: bytes, host: str = "127.0.0.1", port: int = 0) -> None:
        self.key = key
        self.segments: dict[tuple[str, int], wire.Segment] = {}
        self.order: list[tuple[str, int]] = []
        self.arrived: dict[tuple[str, int], float] = {}  # time.time() when stored
        self.posts = 0
        self.duplicates = 0
        self.bad = 0
        # "ok" | "fail" (503) | "drop_after_store" (once per segment) |
        # "close_idle" (answer, then close the keep-alive connection without saying so) |
        # "hold" (a slow box: every request waits until ``release`` is set, then is served)
        self.mode = "ok"
        self.release = threading.Event()
        self._dropped: set[tuple[str, int]] = set()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                receiver.handle(self, body)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def handle(self, req: BaseHTTPRequestHandler, body: bytes) -> None:
        if self.mode == "hold":
            self.release.wait()
        with self.lock:
            self.posts += 1
            if req.path != "/v1/batch":
                return self._answer(req, 404, {"error": "not found"})
            if req.headers.get("Content-Type") != "application/x-clockmesh-segment":
                return self._answer(req, 415, {"error": "content type"})
            if not wire.verify(self.key, body, req.headers.get("Authorization")):
                self.bad += 1
                return self._answer(req, 401, {"error": "bad signature"})
            if self.mode == "fail":
                return self._answer(req, 503, {"error": "unavailable"})
            try:
                seg = wire.decode(body)
            except wire.WireError as exc:
                self.bad += 1
                return self._answer(req, 400, {"error": str(exc)})
            ident = (seg.host, seg.segment)
            status = "duplicate" if ident in self.segments else "stored"
            if status == "stored":
                self.segments[ident] = seg
                self.order.append(ident)
                self.arrived[ident] = time.time()
            else:
                self.duplicates += 1
            if self.mode == "drop_after_store" and ident not in self._dropped:
                self._dropped.add(ident)
                req.close_connection = True
                req.connection.close()  # stored, but the ack never arrives
                return None
            self._answer(req, 200, {"status": status, "segment": seg.segment, "rows": seg.rows()})
            if self.mode == "close_idle":
                req.close_connection = True
            return None

    @staticmethod
    def _answer(req: BaseHTTPRequestHandler, code: int, doc: dict[str, object]) -> None:
        data = json.dumps(doc).encode()
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def rows(self, table: str, host: str | None = None) -> list:
        """All stored rows of ``table`` (numpy arrays), in arrival order."""
        with self.lock:
            return [
                self.segments[i].table(table) for i in self.order if host is None or i[0] == host
            ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
