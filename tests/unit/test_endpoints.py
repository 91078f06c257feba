"""Readers given two ops boxes (issue 29): `clockmesh live`, `clockmesh remediate` and the
TUI read from the first box that answers and say which, and which is down; the real
ingest daemon over real HTTP, a port nothing listens on for the box that is down."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from analytics.ingest import endpoints
from analytics.remediate import records
from tests.tui.sample import T0, sample_live, sample_racks
from tests.unit.ingest_daemon import ROOT, Daemon
from tests.unit.test_live_cli import HOSTS, _post_fleet, _shipping


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_split_takes_comma_lists_and_repeats_each_once() -> None:
    assert endpoints.split("http://a, http://b,,http://a") == ["http://a", "http://b"]
    assert endpoints.split(["http://a", "http://b,http://c"]) == [
        "http://a",
        "http://b",
        "http://c",
    ]


def test_first_answering_prefers_the_first_and_skips_a_box_down_for_a_while() -> None:
    now = [0.0]
    down = {"a"}
    calls: list[str] = []

    def fetch(t: str) -> str:
        calls.append(t)
        if t in down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return f"doc from {t}"

    notes: list[str] = []
    pick = endpoints.FirstAnswering(["a", "b"], fetch, on_change=notes.append, clock=lambda: now[0])
    assert pick() == "doc from b" and calls == ["a", "b"]
    assert pick.note() == "b (a is down: [Errno 111] Connection refused)"
    calls.clear()
    now[0] = 5.0  # within retry_down_s: a is not tried again, b is read at once
    assert pick() == "doc from b" and calls == ["b"]
    down.clear()
    now[0] = 11.0  # a answers again and is tried first again
    calls.clear()
    assert pick() == "doc from a" and calls == ["a"] and pick.note() == "a"
    assert notes == ["b (a is down: [Errno 111] Connection refused)", "a"]
    down.update({"a", "b"})
    now[0] = 30.0
    with pytest.raises(ConnectionError, match=r"a: .*refused; b: .*refused \(none answers\)"):
        pick()


def test_live_with_two_urls_reads_the_one_that_answers_and_names_the_one_down(
    daemon: Daemon,
) -> None:
    _post_fleet(daemon, loss=0.0)
    dead = _dead_url()
    with _shipping(daemon):
        out = cli(
            "live", "--url", f"{dead},{daemon.url}", "--wait-hosts", str(HOSTS), "--timeout", "20"
        )
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith(f"fleet health from {daemon.url} ({dead} is down: ")
    assert "refused" in first
    assert f"{HOSTS}/{HOSTS} hosts healthy" in out.stdout
    # repeated option, the answering box first: no word about the other (not tried)
    out = cli("live", "--url", daemon.url, "--url", dead, "--json")
    assert out.returncode == 0 and out.stderr.strip() == f"read from {daemon.url}"


def test_live_reads_both_boxes_from_an_inventory_that_lists_them(
    daemon: Daemon, tmp_path: Path
) -> None:
    _post_fleet(daemon, loss=0.0)
    dead = _dead_url()
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        f"all:\n  vars:\n    clockmesh_ingest_url: {dead}\n"
        f"    clockmesh_ingest_urls: [{dead}, {daemon.url}]\n"
    )
    out = cli("live", "--inventory", str(inventory))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"fleet health from {daemon.url} ({dead} is down: ")
    inventory.write_text("all:\n  vars:\n    clockmesh_ingest_urls: [8470]\n")
    bad = cli("live", "--inventory", str(inventory))
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert f"{inventory}: all.vars.clockmesh_ingest_urls: expected a list of http(s)" in bad.stderr


def test_live_with_both_boxes_down_is_a_one_line_error_naming_each() -> None:
    a, b = _dead_url(), _dead_url()
    out = cli("live", "--url", f"{a},{b}")
    assert out.returncode == 1
    err = out.stderr.strip()
    assert err.startswith("Error: no ops box answers /v1/live: ") and len(err.splitlines()) == 1
    assert f"{a}: " in err and f"{b}: " in err and "Traceback" not in out.stderr


def test_remediate_with_two_stores_reads_the_first_that_answers(tmp_path: Path) -> None:
    good = tmp_path / "b-store"
    good.mkdir()
    rem = records.Remediation(
        "rem-1", "an-1", "fabric_link_out", "leaf1-spine1", [], False, "ok", "tester", "{}", {}
    )
    records.write_remediation(good, rem)
    gone = tmp_path / "a-store"  # the lost box's mount: not there
    out = cli("remediate", "history", "--store", f"{gone},{good}")
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().startswith(f"store: {good} ({gone} is down: ")
    assert "rem-1" in out.stdout and "fabric_link_out" in out.stdout
    none = cli("remediate", "history", "--store", f"{gone},{tmp_path / 'c'}")
    assert none.returncode == 1 and "Error: --store: " in none.stderr
    assert len(none.stderr.strip().splitlines()) == 1


class Box:
    """One ops box's /v1/live for the TUI; ``down`` refuses."""

    def __init__(self) -> None:
        self.down = False

    def __call__(self) -> dict[str, Any]:
        if self.down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return sample_live()


async def test_tui_with_two_urls_says_which_box_it_reads_and_fails_over(tmp_path: Path) -> None:
    from tui.app import ClockmeshApp

    boxes = {"http://a:8470": Box(), "http://b:8470": Box()}
    source, store, say = endpoints.tui_sources(
        "http://a:8470,http://b:8470", tmp_path / "none", lambda u: boxes[u]
    )
    assert store == tmp_path / "none"  # one store: as given (the app says none is there)
    app = ClockmeshApp(source, racks=sample_racks(), refresh_s=0.2, now=lambda: T0 / 1e9)
    say(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.sub_title == "live: http://a:8470")
        boxes["http://a:8470"].down = True
        await _until(
            pilot,
            lambda: (
                app.sub_title
                == "live: http://b:8470 (http://a:8470 is down: [Errno 111] Connection refused)"
            ),
        )
        assert not app.query_one("#banner").display  # the standby answers: nothing stale
        assert "12 NICs" in str(app.query_one("#summary").render()).replace("/", " ")


async def _until(pilot: Any, check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out; subtitle {pilot.app.sub_title!r}")
