"""`clockmesh live` against the real ingest daemon, over real HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
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
    # seconds first.. of a fleet that started `first` s before 20 s ago: whatever `first`,
    # the probes fall inside the live window (lag 5 s, 60 s long) and the segments are new
    t0 = (time.time_ns() // 10**9 - 20 - first) * 10**9
    for second in range(first, first + 10):
        for i in range(HOSTS):
            body = ingest_load.fleet_segment(i, ids, second, t0_ns=t0, buddies=3, loss=loss)
            status, reply = daemon.post(body)
            assert status == 200, reply


def test_live_shows_every_host_healthy_and_waits(daemon: Daemon) -> None:
    _post_fleet(daemon, loss=0.0)
    ok = live("--url", daemon.url, "--wait-hosts", str(HOSTS), "--timeout", "20")
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    for i in range(HOSTS):
        row = next(line for line in lines if line.startswith(ingest_load.host_name(i) + " "))
        assert " ok " in row and " 3 " in row  # status ok, 3 buddies probed
    assert f"{HOSTS}/{HOSTS} hosts healthy" in ok.stdout

    _post_fleet(daemon, loss=0.0, first=10)  # fresh batches, so none is stale yet
    last_batch = time.monotonic()
    short = live("--url", daemon.url, "--wait-hosts", str(HOSTS + 1), "--timeout", "1")
    assert short.returncode == 1
    assert f"only {HOSTS} of {HOSTS + 1} hosts healthy" in short.stderr

    # No batch any more: every host turns stale, and not before the 5 s staleness bound.
    statuses: set[str] = set()
    while time.monotonic() < last_batch + 60:
        statuses = {r["status"] for r in json.loads(live("--url", daemon.url, "--json").stdout)}
        if statuses == {"stale"}:
            break
        time.sleep(0.5)
    assert statuses == {"stale"}
    assert time.monotonic() - last_batch > 5.0


def test_live_flags_lossy_hosts_as_json(daemon: Daemon) -> None:
    deadline = time.monotonic() + 60
    rows: list[dict] = []
    shipped = 0
    while time.monotonic() < deadline:
        # the fleet keeps shipping, as a real one does: on a loaded machine one `live` run
        # can take longer than the 5 s after which a host that stopped shipping is stale
        _post_fleet(daemon, loss=0.5, first=shipped)
        shipped += 10
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
