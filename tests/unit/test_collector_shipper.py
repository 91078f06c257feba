from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from collector import records
from collector.shipper import Shipper
from collector.spool import Spool
from tests.unit.collector_procs import KEY
from tests.unit.collector_receiver import Receiver


def _fill(tmp_path: Path, n: int) -> Spool:
    sp = Spool(
        tmp_path / "spool",
        "h01",
        records.host_id("h01"),
        max_bytes=10**9,
        roll_s=3600,
        roll_bytes=10**9,
    )
    for i in range(n):
        rows = np.zeros(3, records.PROBE_TX)
        rows["seq"] = [3 * i, 3 * i + 1, 3 * i + 2]
        sp.write("probe_tx", rows)
        sp.roll()
    return sp


def test_ships_in_order_and_deletes_only_after_ack(tmp_path: Path, receiver: Receiver) -> None:
    sp = _fill(tmp_path, 4)
    sh = Shipper(sp, receiver.url, KEY)
    while sh.ship_one():
        pass
    assert [seg for _, seg in receiver.order] == [1, 2, 3, 4]
    assert not list((tmp_path / "spool").glob("*.seg"))
    assert sh.stats.segments_acked == 4 and sh.stats.rows_acked == 12
    seqs = np.concatenate([a["seq"] for a in receiver.rows("probe_tx")])
    assert seqs.tolist() == list(range(12))


def test_5xx_keeps_the_segment_and_backs_off(tmp_path: Path, receiver: Receiver) -> None:
    sp = _fill(tmp_path, 2)
    sh = Shipper(sp, receiver.url, KEY, retry_min_s=0.1, retry_max_s=0.4, max_segments=1)
    receiver.mode = "fail"
    backoffs = []
    for _ in range(4):
        assert sh.ship_one() is False
        backoffs.append(sh.stats.backoff_s)
    assert backoffs == [0.1, 0.2, 0.4, 0.4]
    assert sp.oldest_closed() == 1 and sh.stats.last_error == "HTTP 503"
    receiver.mode = "ok"
    assert sh.ship_one() is True and sh.stats.backoff_s == 0
    assert sp.oldest_closed() == 2


def test_lost_ack_is_retried_and_answered_as_duplicate(tmp_path: Path, receiver: Receiver) -> None:
    sp = _fill(tmp_path, 1)
    sh = Shipper(sp, receiver.url, KEY)
    receiver.mode = "drop_after_store"
    assert sh.ship_one() is False  # stored, but the connection died before the ack
    assert sp.oldest_closed() == 1
    assert sh.ship_one() is True
    assert receiver.duplicates == 1 and len(receiver.segments) == 1
    assert sh.stats.duplicates == 1


def test_4xx_moves_the_batch_aside_and_goes_on(tmp_path: Path, receiver: Receiver) -> None:
    sp = _fill(tmp_path, 2)
    body = sp.path_of(1).read_bytes()
    sp.path_of(1).write_bytes(body[:-5])  # a torn body: the receiver answers 400
    sh = Shipper(sp, receiver.url, KEY, max_segments=1)
    assert sh.ship_one() is True
    assert (tmp_path / "spool/rejected/0000000000000001.seg").exists()
    assert not sp.path_of(1).exists()
    assert sh.stats.rejected == 1 and sp.oldest_closed() == 2


def test_401_another_fleet_key_keeps_the_segments_and_retries(
    tmp_path: Path, receiver: Receiver
) -> None:
    sp = _fill(tmp_path, 2)
    sh = Shipper(sp, receiver.url, b"not-the-fleet-key-at-all", max_segments=1, retry_min_s=0.1)
    assert sh.ship_one() is False and sh.ship_one() is False  # refused: nothing set aside
    assert sh.stats.refused == 2 and sh.stats.rejected == 0 and sh.stats.backoff_s == 0.2
    assert "another fleet key" in sh.stats.last_error
    assert not list((tmp_path / "spool/rejected").iterdir()) and sp.oldest_closed() == 1
    sh.key = KEY  # the key is fixed: everything kept ships
    assert sh.ship_one() is True and sh.ship_one() is True
    assert [seg for _, seg in receiver.order] == [1, 2]


def test_unreachable_is_a_retry_not_a_crash(tmp_path: Path) -> None:
    sp = _fill(tmp_path, 1)
    sh = Shipper(sp, "http://127.0.0.1:9", KEY, timeout_s=1)
    assert sh.ship_one() is False
    assert "ConnectionRefused" in sh.stats.last_error
    assert sp.oldest_closed() == 1


def test_thread_ships_what_is_closed_and_stops(tmp_path: Path, receiver: Receiver) -> None:
    sp = _fill(tmp_path, 3)
    sh = Shipper(sp, receiver.url, KEY, max_segments=1)
    sh.start()
    try:
        deadline = time.monotonic() + 5
        while sp.oldest_closed() is not None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        sh.stop()
        sh.join(5)
    assert not sh.is_alive()
    assert len(receiver.segments) == 3


def test_idle_keepalive_closed_by_server_is_not_a_failure(
    tmp_path: Path, receiver: Receiver
) -> None:
    sp = _fill(tmp_path, 3)
    sh = Shipper(sp, receiver.url, KEY, max_segments=1)
    receiver.mode = "close_idle"
    assert [sh.ship_one() for _ in range(3)] == [True, True, True]
    assert sh.stats.failures == 0 and sh.stats.segments_acked == 3
