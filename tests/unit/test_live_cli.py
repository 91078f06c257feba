"""`clockmesh live` against the real ingest daemon, over real HTTP."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from analytics.ingest import load as ingest_load
from tests.unit.ingest_daemon import ROOT, Daemon

HOSTS = 4


def live(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "live", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _post_fleet(daemon: Daemon, loss: float, first: int = 0) -> None:
    ids = ingest_load.host_ids(HOSTS)
    t0 = (time.time_ns() // 10**9 - 20) * 10**9  # inside the live window (lag 5 s, 60 s long)
    for second in range(first, first + 10):
        for i in range(HOSTS):
            body = ingest_load.fleet_segment(i, ids, second, t0_ns=t0, buddies=3, loss=loss)
            status, reply = daemon.post(body)
            assert status == 200, reply


@contextlib.contextmanager
def _shipping(daemon: Daemon) -> Iterator[None]:
    """The fleet keeps shipping a second of batches every second, as collectors do, while
    the block runs: a host whose newest batch is 5 s old is stale, and on a loaded machine
    `clockmesh live` alone can take that long to start."""
    stop = threading.Event()
    errors: list[str] = []

    def ship() -> None:
        ids = ingest_load.host_ids(HOSTS)
        k = 0
        while not stop.wait(1.0):
            second = 100 + k  # its own probe sequence numbers, sent 5 s ago
            t0 = (time.time_ns() // 10**9 - 5 - second) * 10**9
            for i in range(HOSTS):
                body = ingest_load.fleet_segment(i, ids, second, t0_ns=t0, buddies=3)
                status, reply = daemon.post(body)
                if status != 200:  # said by the test, not lost in the thread
                    errors.append(f"{status} {reply!r}")
                    return
            k += 1

    thread = threading.Thread(target=ship, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    assert errors == [], errors


def test_live_shows_every_host_healthy_and_waits(daemon: Daemon) -> None:
    _post_fleet(daemon, loss=0.0)
    with _shipping(daemon):
        ok = live("--url", daemon.url, "--wait-hosts", str(HOSTS), "--timeout", "20")
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    for i in range(HOSTS):
        row = next(line for line in lines if line.startswith(ingest_load.host_name(i) + " "))
        assert " ok " in row and " 3 " in row  # status ok, 3 buddies probed
    assert f"{HOSTS}/{HOSTS} hosts healthy" in ok.stdout

    _post_fleet(daemon, loss=0.0, first=10)  # fresh batches, so none is stale yet
    with _shipping(daemon):
        short = live("--url", daemon.url, "--wait-hosts", str(HOSTS + 1), "--timeout", "1")
    assert short.returncode == 1
    assert f"only {HOSTS} of {HOSTS + 1} hosts healthy" in short.stderr

    time.sleep(6)  # no batch for longer than the 5 s staleness bound
    stale = live("--url", daemon.url, "--json")
    assert {r["status"] for r in json.loads(stale.stdout)} == {"stale"}


def test_live_flags_lossy_hosts_as_json(daemon: Daemon) -> None:
    deadline = time.monotonic() + 30
    rows: list[dict] = []
    batch = 0
    while time.monotonic() < deadline:
        # Fresh batches while waiting: the live picture settles probes 5 s after they
        # arrive, the very age at which a host without a newer batch turns stale.
        _post_fleet(daemon, loss=0.5, first=10 * batch)
        batch += 1
        out = live("--url", daemon.url, "--json")
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        if len(rows) == HOSTS and all(r["sent"] for r in rows):
            break
        time.sleep(0.5)
    assert {r["status"] for r in rows} == {"lossy"}
    assert all(0.3 < r["loss"] < 0.7 for r in rows)


def test_live_unreachable_and_bad_inventory_are_one_line_errors(tmp_path: Path) -> None:
    down = live("--url", "http://127.0.0.1:9", "--timeout", "0")
    assert down.returncode == 1
    assert down.stderr.count("\n") == 1 and "/v1/live" in down.stderr

    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  vars:\n    clockmesh_ingest_url: 8470\n")
    bad = live("--inventory", str(inventory))
    assert bad.returncode == 1
    assert f"{inventory}: all.vars.clockmesh_ingest_url: expected" in bad.stderr
    assert "Traceback" not in bad.stderr
