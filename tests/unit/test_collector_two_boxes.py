"""Shipping to two ops boxes (issue 29): per-box cursors, one box down, slow or refusing
never holding up the other, restarts resuming per box; real HTTP receivers on loopback,
and real ingest daemons with a real collector process for the end-to-end case."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from collector import records
from collector.config import box_key
from collector.shipper import Shippers
from collector.spool import Spool
from tests.unit.collector_procs import KEY, ROOT, free_udp_port
from tests.unit.collector_receiver import Receiver
from tests.unit.test_collector_faults import Ingest, _setup


def _spool(tmp_path: Path, boxes: list[str], **kw: int) -> Spool:
    opts: dict = {"max_bytes": 10**9, "roll_s": 3600.0, "roll_bytes": 10**9} | kw
    return Spool(tmp_path / "spool", "h01", records.host_id("h01"), boxes=boxes, **opts)


def _fill(sp: Spool, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        rows = np.zeros(10, records.PROBE_TX)
        rows["seq"] = np.arange(10 * i, 10 * i + 10)
        sp.write("probe_tx", rows)
        sp.roll()


def _wait(pred: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _seqs(rcv: Receiver) -> list[int]:
    return sorted(int(s) for a in rcv.rows("probe_tx") for s in a["seq"])


@pytest.fixture
def second() -> Iterator[Receiver]:
    r = Receiver(KEY)
    try:
        yield r
    finally:
        r.release.set()
        r.close()


# ---- the spool's per-box cursors ------------------------------------------------------
def test_a_segment_leaves_the_spool_only_once_every_box_acknowledged_it(tmp_path: Path) -> None:
    sp = _spool(tmp_path, ["a", "b"])
    _fill(sp, 3)
    sp.box_done("a", 3)
    assert sp.depth()[0] == 3 and sp.pending("a", 30, 10**9) == []
    assert sp.pending("b", 30, 10**9) == [1, 2, 3]
    sp.box_done("b", 2)
    assert sp.oldest_closed() == 3 and sp.box_depth("b")[0] == 1 and sp.box_depth("a")[0] == 0
    assert (tmp_path / "spool/ack-a").read_text() == "3\n"
    # a restart (kill -9: no close) resumes each box at its own cursor
    again = _spool(tmp_path, ["a", "b"])
    assert again.pending("a", 30, 10**9) == [] and again.pending("b", 30, 10**9) == [3]
    # a box added later starts at the oldest segment still held
    again.set_boxes(["a", "b", "c"])
    assert again.pending("c", 30, 10**9) == [3]


def test_cursor_stored_but_files_not_yet_deleted_are_deleted_at_start(tmp_path: Path) -> None:
    sp = _spool(tmp_path, ["a", "b"])
    _fill(sp, 2)
    (tmp_path / "spool/ack-a").write_text("2\n")  # as if a crash came between the two steps
    (tmp_path / "spool/ack-b").write_text("1\n")
    again = _spool(tmp_path, ["a", "b"])
    assert again.oldest_closed() == 2 and not again.path_of(1).exists()


def test_bound_drops_oldest_and_counts_per_box_that_had_not_acknowledged(tmp_path: Path) -> None:
    sp = _spool(tmp_path, ["a", "b"])
    _fill(sp, 4)
    sp.box_done("a", 3)  # b is down: it acknowledged nothing
    sp.max_bytes = 2 * sp.path_of(1).stat().st_size + 10
    _fill(sp, 1, start=4)
    assert sp.stats.dropped_segments == 3 and sp.stats.dropped_rows == 30
    assert (sp.boxes["a"].dropped_segments, sp.boxes["a"].dropped_rows) == (0, 0)
    assert (sp.boxes["b"].dropped_segments, sp.boxes["b"].dropped_rows) == (3, 30)
    assert sp.pending("a", 30, 10**9) == [4, 5] and sp.pending("b", 30, 10**9) == [4, 5]


# ---- shipping threads, real HTTP --------------------------------------------------------
def test_both_boxes_get_every_segment_once_and_the_spool_empties(
    tmp_path: Path, receiver: Receiver, second: Receiver
) -> None:
    sp = _spool(tmp_path, [])
    ships = Shippers(sp, [receiver.url, second.url], KEY)
    _fill(sp, 5)
    ships.start()
    try:
        _wait(lambda: sp.depth()[0] == 0, "both boxes to acknowledge")
    finally:
        ships.stop(5)
    assert _seqs(receiver) == _seqs(second) == list(range(50))
    assert receiver.duplicates == second.duplicates == 0
    assert [s.stats.segments_acked for s in ships.all] == [5, 5]


def test_urgent_segment_goes_to_both_boxes_at_once(
    tmp_path: Path, receiver: Receiver, second: Receiver
) -> None:
    sp = _spool(tmp_path, [])
    ships = Shippers(sp, [receiver.url, second.url], KEY)
    ships.start()
    try:
        time.sleep(0.2)  # both shippers idle, waiting (1 s) for a wake-up
        receiver.mode = second.mode = "hold"
        _fill(sp, 1)
        ships.wake()
        # each box's request is in progress at the same moment: neither waits for the other
        _wait(lambda: receiver.posts == 0 and _in_flight(sp) == 2, "both posts in flight", 5)
        receiver.release.set()
        second.release.set()
        _wait(lambda: sp.depth()[0] == 0, "both acknowledgements")
    finally:
        receiver.release.set()
        second.release.set()
        ships.stop(5)
    assert len(receiver.segments) == len(second.segments) == 1


def _in_flight(sp: Spool) -> int:
    with sp.lock:
        return sum(1 for cur in sp.boxes.values() if cur.in_flight)


def test_unreachable_box_is_retried_while_the_other_gets_everything(
    tmp_path: Path, receiver: Receiver
) -> None:
    port = free_udp_port()  # nothing listens there yet
    down = f"http://127.0.0.1:{port}"
    sp = _spool(tmp_path, [])
    ships = Shippers(sp, [down, receiver.url], KEY, retry_max_s=0.5)
    _fill(sp, 4)
    ships.start()
    late: Receiver | None = None
    try:
        _wait(lambda: len(receiver.segments) == 4, "the good box to get every segment")
        assert ships.all[0].stats.failures >= 1
        assert "ConnectionRefused" in ships.all[0].stats.last_error
        assert sp.depth()[0] == 4  # kept for the box that is down
        late = Receiver(KEY, port=port)  # the box comes back
        _wait(lambda: sp.depth()[0] == 0, "the box that came back to catch up")
        assert _seqs(late) == _seqs(receiver) == list(range(40))
    finally:
        ships.stop(5)
        if late is not None:
            late.close()


def test_slow_box_never_stalls_the_other(
    tmp_path: Path, receiver: Receiver, second: Receiver
) -> None:
    sp = _spool(tmp_path, [])
    second.mode = "hold"  # answers nothing until released
    ships = Shippers(sp, [second.url, receiver.url], KEY, timeout_s=30)
    _fill(sp, 3)
    ships.start()
    try:
        _wait(lambda: len(receiver.segments) == 3, "the fast box to get every segment")
        _fill(sp, 2, start=3)
        ships.wake()
        _wait(lambda: len(receiver.segments) == 5, "the fast box to get the new ones too")
        assert len(second.segments) == 0 and sp.depth()[0] == 5
        second.release.set()
        _wait(lambda: sp.depth()[0] == 0, "the slow box to catch up")
    finally:
        second.release.set()
        ships.stop(5)
    assert _seqs(second) == list(range(50)) and second.duplicates == 0


def test_box_with_another_fleet_key_is_logged_once_and_the_other_continues(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    other = Receiver(b"another-fleet-key-0123456789abcdef")
    sp = _spool(tmp_path, [])
    ships = Shippers(sp, [other.url, receiver.url], KEY, retry_max_s=0.2)
    _fill(sp, 3)
    caplog.set_level(logging.INFO, "clockmesh.collector.shipper")
    ships.start()
    try:
        _wait(lambda: len(receiver.segments) == 3, "the good box to get every segment")
        _wait(lambda: ships.all[0].stats.refused >= 3, "several refusals")
    finally:
        ships.stop(5)
        other.close()
    refusals = [r.getMessage() for r in caplog.records if "event=box_refused" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert other.url in refusals[0] and "status=401" in refusals[0] and "\n" not in refusals[0]
    assert not list((tmp_path / "spool/rejected").iterdir())  # nothing set aside
    assert sp.box_depth(box_key(other.url))[0] == 3 and sp.box_depth(box_key(receiver.url))[0] == 0


def test_restart_resumes_each_box_at_its_own_cursor(
    tmp_path: Path, receiver: Receiver, second: Receiver
) -> None:
    sp = _spool(tmp_path, [])
    second.mode = "fail"  # 503: the second box is away
    ships = Shippers(sp, [receiver.url, second.url], KEY, retry_max_s=0.2)
    _fill(sp, 3)
    ships.start()
    try:
        _wait(lambda: len(receiver.segments) == 3, "the first box to get every segment")
    finally:
        ships.stop(5)
    posts_first = receiver.posts
    second.mode = "ok"
    again = _spool(tmp_path, [])  # a new process over the same spool
    ships = Shippers(again, [receiver.url, second.url], KEY)
    ships.start()
    try:
        _wait(lambda: again.depth()[0] == 0, "the second box to catch up")
    finally:
        ships.stop(5)
    assert _seqs(second) == list(range(30))
    assert receiver.posts == posts_first, "the first box was sent what it had acknowledged"


def test_a_segment_both_boxes_refuse_is_kept_once_in_rejected(
    tmp_path: Path, receiver: Receiver, second: Receiver
) -> None:
    sp = _spool(tmp_path, [])
    _fill(sp, 2)
    sp.path_of(1).write_bytes(sp.path_of(1).read_bytes()[:-5])  # a torn body: 400
    ships = Shippers(sp, [receiver.url, second.url], KEY)
    ships.start()
    try:
        _wait(lambda: sp.depth()[0] == 0, "both boxes to be past both segments")
    finally:
        ships.stop(5)
    assert [p.name for p in (tmp_path / "spool/rejected").iterdir()] == ["0000000000000001.seg"]
    assert [s.stats.rejected for s in ships.all] == [1, 1]
    assert list(receiver.segments) == list(second.segments) == [("h01", 2)]


def test_reload_drops_a_box_no_longer_listed_and_a_new_one_gets_what_is_held(
    tmp_path: Path, receiver: Receiver, second: Receiver
) -> None:
    port = free_udp_port()
    down = f"http://127.0.0.1:{port}"  # never answers
    sp = _spool(tmp_path, [])
    ships = Shippers(sp, [receiver.url, down], KEY, retry_max_s=0.2)
    _fill(sp, 3)
    ships.start()
    try:
        _wait(lambda: len(receiver.segments) == 3, "the first box to get every segment")
        assert sp.depth()[0] == 3  # held for the box that is down
        ships.set_targets([receiver.url, second.url], 5.0, 0.2)  # SIGHUP: the list changed
        _wait(lambda: sp.depth()[0] == 0, "the new box to get what was held")
    finally:
        ships.stop(5)
    assert _seqs(second) == list(range(30)) and receiver.duplicates == 0
    assert [s.url for s in ships.all] == [receiver.url, second.url]
    assert sorted(sp.boxes) == sorted([box_key(receiver.url), box_key(second.url)])


# ---- config ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ingest", "expected"),
    [
        (
            {"urls": ["http://198.19.0.1:8470", "http://198.19.0.1:8470/"]},
            "ingest.urls[1]: http://198.19.0.1:8470/ is the same ops box as "
            "http://198.19.0.1:8470: list each ops box once",
        ),
        (
            {"urls": ["http://ops-a:80", "http://OPS-A"]},
            "ingest.urls[1]: http://OPS-A is the same ops box as http://ops-a:80",
        ),
        (
            {"url": "http://a:8470", "urls": ["http://b:8470"]},
            "ingest.url: expected exactly one of ingest.url (one ops box) and ingest.urls",
        ),
        ({"urls": ["http://a:8470", "ftp://b"]}, "ingest.urls[1]: expected an http:// or https://"),
    ],
)
def test_bad_ingest_lists_are_one_line_errors(
    tmp_path: Path, ingest: dict[str, object], expected: str
) -> None:
    doc = {
        "host": "h01",
        "backend": {"address": "198.18.0.1"},
        "ingest": ingest,
        "fleet_key_file": str(tmp_path / "fleet.key"),
    }
    cfg = tmp_path / "collector.yml"
    cfg.write_text(yaml.safe_dump(doc))
    out = subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "collector", "check-config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert expected in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_single_url_and_a_list_of_one_are_both_valid(tmp_path: Path) -> None:
    from collector import config

    for ingest in ({"url": "http://a:8470"}, {"urls": ["http://a:8470", "http://b:8470"]}):
        cfg = tmp_path / "collector.yml"
        cfg.write_text(
            yaml.safe_dump({"host": "h", "backend": {"address": "198.18.0.1"}, "ingest": ingest})
        )
        loaded = config.load(cfg)
        assert loaded.ingest.targets() == ingest.get("urls", [ingest.get("url")])


# ---- end to end: a real collector, two real ingest daemons ----------------------------
@pytest.mark.timeout(240)
def test_collector_ships_to_two_ingest_daemons_one_killed_and_back_every_record_once(
    tmp_path: Path,
) -> None:
    pytest.importorskip("duckdb")
    (tmp_path / "a").mkdir(exist_ok=True)
    (tmp_path / "b").mkdir(exist_ok=True)
    a, b = Ingest(tmp_path / "a"), Ingest(tmp_path / "b")
    a.start()
    b.start()
    col, sink, _ = _setup(tmp_path, "", ingest={"urls": [a.url, b.url], "retry_max_s": 1.0})
    try:
        col.start()
        col.wait_status(lambda s: all(x["segments_acked"] >= 2 for x in s["shipping"]["boxes"]))
        assert a.proc is not None
        a.proc.kill()  # kill -9 of the primary's daemon
        a.proc.wait()
        col.wait_status(lambda s: s["shipping"]["boxes"][0]["last_error"] != "")
        acked_b = col.status()["shipping"]["boxes"][1]["segments_acked"]
        col.wait_status(
            lambda s: (
                s["shipping"]["boxes"][1]["segments_acked"] >= acked_b + 4
                and s["shipping"]["boxes"][0]["waiting_segments"] >= 4
            ),
            timeout=30,
        )  # the standby keeps getting everything while the primary is gone
        a.start()
        col.wait_status(lambda s: s["shipping"]["boxes"][0]["waiting_segments"] <= 1, timeout=60)
        assert col.stop() == 0
        final = col.status()
    finally:
        col.stop()
        sink.close()
        a.stop()
        b.stop()
    assert final["spool"]["segments"] == 0 and final["spool"]["dropped_rows"] == 0
    seq_a, seq_b = a.probe_tx_seqs("hx"), b.probe_tx_seqs("hx")
    for stored in (seq_a, seq_b):
        assert len(stored) == len(np.unique(stored)), "duplicates"
        assert (np.diff(stored.astype(np.int64)) == 1).all(), "gaps: records lost"
        assert len(stored) == final["probes_sent"]
    assert seq_a.tolist() == seq_b.tolist()
