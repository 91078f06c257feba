"""The ops box sets the shipping pace; a backlog goes out several segments per request.

Real processes: `clockmesh ingest run` and `clockmesh collector run` on loopback.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from analytics.ingest.pace import Pacer
from collector import records
from collector.shipper import Shipper
from collector.spool import Spool
from tests.lab.helpers import wait_for
from tests.unit.collector_procs import (
    CollectorProcess,
    free_udp_port,
    loopback_net,
    write_config,
)
from tests.unit.ingest_daemon import KEY, Daemon


def _collectors(
    tmp: Path, url: str, caps: dict[str, float], roll_s: float = 0.5
) -> list[CollectorProcess]:
    net = loopback_net()
    addrs = {h: f"{net}.{i + 1}" for i, h in enumerate(caps)}
    port = free_udp_port(next(iter(addrs.values())))
    peers = [{"name": h, "address": a, "rack": "r1"} for h, a in addrs.items()]
    key = tmp / "fleet.key"
    key.write_bytes(KEY + b"\n")  # the daemon's fleet key (write_config keeps an existing one)
    out = []
    for h, cap in caps.items():
        extra: dict = {"spool": {"roll_s": roll_s}}
        if cap:
            extra["spool"]["max_roll_s"] = cap
        cfg = write_config(
            tmp, h, addrs[h], peers, url, port=port, base_sport=41000 + port % 20000, **extra
        )
        out.append(CollectorProcess(cfg))
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Daemon, list[CollectorProcess]]]:
    # a budget of 0.5 requests/s: two hosts make the daemon advise 4-s segments
    (tmp_path / "ops").mkdir()
    d = Daemon(tmp_path / "ops", max_requests_per_s=0.5)
    d.start()
    procs = _collectors(tmp_path, d.url, {"pa": 0.0, "pb": 1.0})
    try:
        for p in procs:
            p.start()
        yield d, procs
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop()
        d.stop()


def _gaps_s(d: Daemon, host: str, since_segment: int = 0) -> list[float]:
    """Seconds between consecutive segments of ``host`` in the store (created_ns)."""
    import duckdb

    con = duckdb.connect(str(d.store / "catalog.duckdb"), read_only=True)
    try:
        created = con.execute(
            "SELECT created_ns FROM batches WHERE host = ? AND segment > ? ORDER BY segment",
            [host, since_segment],
        ).fetchnumpy()["created_ns"]
    finally:
        con.close()
    return (np.diff(np.asarray(created)) / 1e9).tolist()


def test_segments_get_longer_when_the_ops_box_asks(
    fleet: tuple[Daemon, list[CollectorProcess]],
) -> None:
    d, (a, b) = fleet
    # advice reaches the collectors with their next ack: 2 hosts / 0.5 per s = 4 s
    st_a = a.wait_status(lambda s: s["spool"]["advised_roll_s"] == 4.0, timeout=20)
    st_b = b.wait_status(lambda s: s["spool"]["advised_roll_s"] == 4.0, timeout=20)
    assert st_a["spool"]["roll_s"] == 4.0  # max(0.5, 4) under the default cap of 30
    assert st_b["spool"]["roll_s"] == 1.0  # its own spool.max_roll_s caps the advice
    first_a = st_a["shipping"]["last_ack_segment"]
    first_b = st_b["shipping"]["last_ack_segment"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(_gaps_s(d, "pa", first_a + 1)) >= 3 and len(_gaps_s(d, "pb", first_b + 1)) >= 8:
            break
        time.sleep(0.5)
    early_a = _gaps_s(d, "pa")[:1]
    later_a = _gaps_s(d, "pa", first_a + 1)
    later_b = _gaps_s(d, "pb", first_b + 1)
    assert early_a and max(early_a) < 2.0  # 1-s segments (the least advice) at first
    assert len(later_a) >= 3 and all(3.5 <= g <= 5.6 for g in later_a), later_a
    # (a segment rolls at the collector's first flush after the interval: +0.5 s at most)
    assert len(later_b) >= 8 and all(0.9 <= g <= 2.1 for g in later_b), later_b
    metrics = d.get("/metrics").decode()
    assert "clockmesh_ingest_advised_roll_seconds 4.0" in metrics
    assert "clockmesh_ingest_active_hosts 2.0" in metrics
    # rollups wait for rows that now arrive up to one interval apart (20 s default grace)
    assert "event=pace roll_s=4.0" in d.log.read_text()
    # the clock solver waits for rows one interval apart too: 4 s + 2 s (default 3 s)
    assert json.loads(d.get("/v1/live"))["clock"]["lateness_s"] == 6.0


def test_backlog_after_restart_goes_in_multi_segment_requests_exactly_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "ops").mkdir()
    d = Daemon(tmp_path / "ops")
    d.start()
    procs = _collectors(tmp_path, d.url, {"pc": 0.0})
    (c,) = procs
    try:
        c.start()
        c.wait_status(lambda s: s["shipping"]["segments_acked"] >= 3, timeout=20)
        d.kill9()
        c.wait_status(lambda s: s["spool"]["segments"] >= 6, timeout=20)  # a backlog
        d.start()
        c.wait_status(lambda s: s["spool"]["segments"] <= 1 and not s["shipping"]["last_error"],
                      timeout=30)  # fmt: skip
        c.stop()  # the final roll is shipped on the way out
    finally:
        with contextlib.suppress(Exception):
            c.stop()
        d.stop()
    d.start()
    try:
        segs = d.count("SELECT count(*) FROM batches WHERE host = 'pc'")
        distinct = d.count("SELECT count(DISTINCT segment) FROM batches WHERE host = 'pc'")
        top = d.count("SELECT max(segment) FROM batches WHERE host = 'pc'")
        # every closed segment is in the store exactly once, none lost
        assert segs == distinct == top, (segs, distinct, top)
        # segments that shared a request share its receive time: the backlog went in bulk
        bulk = d.count(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM batches WHERE host = 'pc' "
            "GROUP BY received_ns)"
        )
        assert bulk >= 5, bulk
        rows = d.count("SELECT count(*) FROM health WHERE host = (SELECT any_value(host_id) "
                       "FROM batches WHERE host = 'pc')")  # fmt: skip
        once = d.count("SELECT count(*) FROM (SELECT DISTINCT host, ts_ns, name FROM health "
                       "WHERE host = (SELECT any_value(host_id) FROM batches WHERE host = 'pc'))")  # fmt: skip
        assert rows == once > 0
    finally:
        d.stop()


def test_bad_segment_in_a_backlog_is_the_only_one_set_aside(daemon: Daemon, tmp_path: Path) -> None:
    """A 4xx for a multi-segment body: the shipper resends one by one."""
    host = "bk01"
    sp = Spool(tmp_path / "spool", host, records.host_id(host), max_bytes=10**9, roll_s=3600,
               roll_bytes=10**9)  # fmt: skip
    for i in range(5):
        rows = np.zeros(4, records.PROBE_TX)
        rows["seq"] = np.arange(4 * i, 4 * i + 4)
        rows["src"] = records.host_id(host)
        rows["tx_ns"] = time.time_ns()
        sp.write("probe_tx", rows)
        sp.roll()
    bad = sp.path_of(3)
    data = bytearray(bad.read_bytes())
    data[-1] ^= 1  # CRC mismatch in segment 3
    bad.write_bytes(bytes(data))
    sh = Shipper(sp, daemon.url, KEY)
    while sh.ship_one():
        pass
    assert sh.stats.rejected == 1 and sh.stats.segments_acked == 4
    assert [p.name for p in (tmp_path / "spool" / "rejected").iterdir()] == [bad.name]
    assert daemon.count(f"SELECT count(*) FROM batches WHERE host = '{host}'") == 4
    assert daemon.count(f"SELECT count(*) FROM probe_tx WHERE src = {records.host_id(host)}") == 16
    assert sh.stats.advised_roll_s < 1.0  # one host: far under budget, no longer segments


def test_pacer_advice_follows_active_hosts() -> None:
    p = Pacer(1250)
    assert p.update(0.0) == 0.0  # no hosts: no advice beyond the collectors' own roll_s
    for h in range(300):
        p.seen([h], 0.5)
    assert p.update(0.5) == 0.3  # 300 hosts, 1,250 requests/s: under budget
    for h in range(12_500):
        p.seen([h], 1.0)
    assert p.update(1.0) == 10.0 and p.active_hosts == 12_500
    for h in range(100_000):
        p.seen([h], 2.0)
    assert p.update(2.0) == 30.0  # clamped at max_s
    assert p.update(2.0 + p.window_s + 1) == 0.0  # everyone went quiet


def test_the_pacer_knows_the_longest_interval_an_active_host_ships_at() -> None:
    """Each segment says the interval it was written for; the longest of the active hosts'
    (up to ``max_s``) is what the daemon waits for, whatever the advice — from the request
    that raised it: its rows may belong to windows already due at the shorter lateness."""
    p = Pacer(1250, max_s=30.0)
    raised: list[float] = []  # the daemon raises its lateness at once (not at its next tick)
    p.on_slower = raised.append
    p.seen([1, 2], 0.0, [1.0, 0.0])  # host 2: an older collector, which does not say
    p.update(0.0)
    assert p.slowest_roll_s == 1.0
    p.seen([3], 0.5, [8.0])
    assert p.slowest_roll_s == 8.0
    p.seen([4], 1.0, [600.0])  # never beyond the longest interval the acks may advise
    assert p.slowest_roll_s == 30.0
    # hosts 3 and 4 ship more often now, and 1 goes quiet: at the next pass over the hosts
    p.seen([3, 4], 20.0, [2.0, 2.0])
    p.update(p.window_s + 1)
    assert p.slowest_roll_s == 2.0
    assert raised == [1.0, 8.0, 30.0]


def test_a_collector_shipping_less_often_than_advised_is_waited_for_and_not_called_stale(
    tmp_path: Path,
) -> None:
    """A collector may be set to ship less often than the ops box advises (its own
    ``spool.roll_s``: here 7 s, against an advice of 0.1 s on a fleet of two). Its segments
    say so (header ``roll_s``): the clock solver waits that long plus 2 s for a probe's
    other half, and the host is not called stale 5 s after each batch — before, its
    verdict flipped to ``stale`` for the last 2 s of every interval, and the solver
    solved each window 3 s after its end, without the rows still on their way."""
    from analytics.detect import attribution

    (tmp_path / "ops").mkdir()
    d = Daemon(tmp_path / "ops")
    d.start()
    procs = _collectors(tmp_path, d.url, {"pa": 0.0, "pb": 0.0}, roll_s=7.0)
    try:
        for p in procs:
            p.start()

        def live() -> dict:
            return json.loads(d.get("/v1/live"))

        def both_ok() -> dict | None:
            doc = live()
            verdicts = {h["host"]: h["verdict"] for h in doc["hosts"]}
            return doc if verdicts == {"pa": "ok", "pb": "ok"} else None

        doc = wait_for(both_ok, 60, "pa and pb ok in /v1/live", every=0.5)
        assert [h["roll_s"] for h in doc["hosts"]] == [7.0, 7.0]
        assert doc["ingest"]["advised_roll_s"] < 1.0
        assert doc["clock"]["lateness_s"] == 9.0  # 7 s + 2 s (the configured 3 s before)
        assert "slowest_host_roll_s=7.0" in d.log.read_text()
        verdicts, oldest = set(), 0.0
        until = time.monotonic() + 16  # two intervals and more
        while time.monotonic() < until:
            for h in live()["hosts"]:
                verdicts.add(h["verdict"])
                oldest = max(oldest, h["last_batch_age_s"])
            time.sleep(0.5)
        assert oldest > attribution.STALE_S  # the fleet-wide 5 s was passed...
        assert verdicts == {"ok"}, verdicts  # ...and nobody was called stale for it
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop()
        d.stop()
