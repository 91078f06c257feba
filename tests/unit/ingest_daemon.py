"""The real ingest daemon as a separate process, over real HTTP on loopback (tests only).

Shared by the ingest, clock-runner and `clockmesh live` tests; the ``daemon`` fixture in
conftest.py starts one per test and always stops it.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import duckdb

from collector import wire

ROOT = Path(__file__).resolve().parents[2]
KEY = b"test-fleet-key-0123456789abcdef"


def assert_promtool_clean(metrics: bytes) -> None:
    """``promtool check metrics`` (Debian package prometheus) accepts ``metrics``."""
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=metrics, capture_output=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, tmp: Path, **overrides: object) -> None:
        self.tmp = tmp
        self.store = tmp / "store"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (tmp / "fleet.key").write_bytes(KEY + b"\n")
        self.log = tmp / "ingest.log"
        self.proc: subprocess.Popen | None = None
        self.write_config(**overrides)

    def write_config(self, **overrides: object) -> None:
        cfg = {
            "listen": f"127.0.0.1:{self.port}",
            "store_dir": str(self.store),
            "fleet_key_file": str(self.tmp / "fleet.key"),
            "log_level": "info",
            "roll_s": 0.05,
            "min_free_bytes": 0,
            "live_refresh_s": 1,
            "compact_s": 3600,
        }
        cfg.update(overrides)
        (self.tmp / "ingest.yml").write_text(json.dumps(cfg))

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "clockmesh.cli", "ingest", "run", "--config",
                 str(self.tmp / "ingest.yml")],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        # Generous: on a shared 2-core machine running the suite two at a time, importing
        # the ops box's libraries alone has taken over 30 s.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
                return
            except (OSError, urllib.error.HTTPError):
                time.sleep(0.1)
        raise AssertionError(f"daemon did not start in 120 s: {self.log.read_text()[-2000:]}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def post(self, body: bytes, auth: str | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(
            self.url + "/v1/batch",
            data=body,
            headers={"Authorization": auth if auth is not None else wire.sign(KEY, body)},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def post_chunked(self, body: bytes, parts: int = 3) -> tuple[int, dict]:
        """``post`` with ``Transfer-Encoding: chunked`` (no Content-Length)."""
        step = -(-len(body) // parts)
        req = urllib.request.Request(
            self.url + "/v1/batch",
            data=iter([body[i : i + step] for i in range(0, len(body), step)]),
            headers={"Authorization": wire.sign(KEY, body)},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return resp.read()

    def count(self, sql: str) -> int:
        """Query the store the way an analyst does: catalog opened read-only."""
        con = duckdb.connect(str(self.store / "catalog.duckdb"), read_only=True)
        try:
            return con.execute(sql).fetchone()[0]
        finally:
            con.close()
