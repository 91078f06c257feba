"""Store internals without HTTP: commits, crash recovery, compaction, retention, views."""

from __future__ import annotations

import json
import os
import random
import time
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics.ingest import config as ingest_config
from analytics.ingest import load as ingest_load
from analytics.ingest.hot_window import HotWindow
from analytics.ingest.metrics import RESTART_MARGIN_NS, HostState
from analytics.store import layout
from analytics.store.catalog import VIEW_NAMES, write_catalog
from analytics.store.compactor import Compactor
from analytics.store.segment_ledger import SegmentLedger
from analytics.store.store_writer import StoreWriter
from collector import wire
from collector.configfile import ConfigError

IDS = ingest_load.host_ids(6)
# a minute into an hour that began 10-70 min ago: a test's seconds never straddle two hour
# partitions (run at 01:10:0x, six commits split 3 + 3 over hour=00 and hour=01)
T0 = ((time.time_ns() // 10**9 - 600) // 3600 * 3600 + 60) * 10**9


def _batches(number: int, host_ids: list[int], segs: list[int]) -> pa.Table:
    n = len(segs)
    return pa.table(
        {
            "commit": [number] * n,
            "received_ns": [time.time_ns()] * n,
            "host_id": host_ids,
            "host": ["h"] * n,
            "segment": segs,
            "created_ns": [0] * n,
            "rows": [1] * n,
            "bytes": [1] * n,
        },
        schema=layout.TABLES["batches"].schema,
    )


def _probe_tables(second: int) -> dict[str, pa.Table]:
    seg = wire.decode(ingest_load.fleet_segment(0, IDS, second, t0_ns=T0))
    return {t: layout.records_to_arrow(t, seg.table(t)) for t in ("probe_tx", "probe_rx")}


def _count(store: Path, table: str) -> int:
    write_catalog(store)
    con = duckdb.connect(str(store / "catalog.duckdb"), read_only=True)
    try:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        con.close()


def test_ledger_matches_a_plain_set() -> None:
    rnd = random.Random(3)
    ledger, truth = SegmentLedger(), set()
    for _ in range(3000):
        host, seg = rnd.randrange(3), rnd.randrange(400)
        ledger.add(host, seg)
        truth.add((host, seg))
    bulk = SegmentLedger()
    hosts = np.array([h for h, _ in truth])
    segs = np.array([s for _, s in truth])
    bulk.add_many(hosts, segs)
    for host in range(4):
        for seg in range(-2, 405):
            assert ((host, seg) in ledger) == ((host, seg) in truth)
            assert ((host, seg) in bulk) == ((host, seg) in truth)
    assert ledger.intervals() == bulk.intervals() < len(truth)


def test_partial_commit_is_removed_and_committed_ones_stay(tmp_path: Path) -> None:
    w = StoreWriter(tmp_path)
    w.open()
    w.commit(0, _probe_tables(0), _batches(0, [int(IDS[0])], [0]))
    # a crash after commit 1 wrote its data files but before its batches file
    for table, data in _probe_tables(1).items():
        w.write_partitioned(table, data, "c000000000001.parquet")
    stray = next((tmp_path / "probe_tx").glob("date=2*/hour=*")) / "c000000000001.parquet.tmp"
    stray.write_bytes(b"torn")
    assert _count(tmp_path, "probe_tx") == 160
    w2 = StoreWriter(tmp_path)
    w2.open()
    assert w2.committed == 0 and w2.recovered_orphans == 2 and not stray.exists()
    assert _count(tmp_path, "probe_tx") == 80
    assert (int(IDS[0]), 0) in w2.ledger and (int(IDS[0]), 1) not in w2.ledger
    with pytest.raises(ValueError):
        w2.commit(0, {}, _batches(0, [1], [1]))


def test_table_sizes_skip_a_file_the_compactor_removes_while_they_are_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v1/live's store sizes are read while compaction deletes the files it merged: in a
    lab run the live refresh failed with FileNotFoundError (and the picture went stale)
    whenever a listed file was gone before its stat."""
    w = StoreWriter(tmp_path)
    w.open()
    w.commit(0, _probe_tables(0), _batches(0, [int(IDS[0])], [0]))
    w.commit(1, _probe_tables(1), _batches(1, [int(IDS[0])], [1]))
    (files, size) = w.table_sizes()["probe_tx"]
    assert files == 2
    real_scandir = os.scandir

    def listed_then_merged(path: Path) -> list[os.DirEntry[str]]:
        entries = list(real_scandir(path))  # the listing, then the compactor's unlink
        for e in entries:
            if e.name == "c000000000001.parquet" and "probe_tx" in str(path):
                os.unlink(e.path)
        return entries

    monkeypatch.setattr("analytics.store.store_writer.os.scandir", listed_then_merged)
    after = w.table_sizes()
    assert after["probe_tx"][0] == 1 and 0 < after["probe_tx"][1] < size


def _has_dictionary(path: Path) -> bool:
    """Whether the ``src`` column of ``path`` has dictionary pages."""
    meta = pq.ParquetFile(path).metadata
    col = meta.schema.names.index("src")
    return any(
        meta.row_group(i).column(col).has_dictionary_page for i in range(meta.num_row_groups)
    )


def test_compaction_merges_and_survives_a_crash_midway(tmp_path: Path) -> None:
    w = StoreWriter(tmp_path)
    w.open()
    for n in range(6):
        w.commit(n, _probe_tables(n), _batches(n, [int(IDS[0])], [n]))
    c = Compactor(w, min_age_s=0)
    part = next((tmp_path / "probe_tx").glob("date=2*/hour=*"))
    assert len(list(part.glob("*.parquet"))) == 6
    assert not _has_dictionary(part / "c000000000000.parquet")  # commits: encoded fast
    c.run()
    assert [p.name for p in part.glob("*.parquet")] == ["m000000000000-000000000005.parquet"]
    assert _count(tmp_path, "probe_tx") == 6 * 80
    assert _has_dictionary(part / "m000000000000-000000000005.parquet")  # compacted: small
    # crash between "output renamed into place" and "sources deleted"
    for n in range(6, 9):
        w.commit(n, _probe_tables(n), _batches(n, [int(IDS[0])], [n]))
    sources = sorted(part.glob("*.parquet"))
    merged = part / "m000000000000-000000000008.parquet"
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * FROM read_parquet({[str(s) for s in sources]})) TO '{merged}' (FORMAT parquet)"
    )
    intent = tmp_path / "_ingest" / "compact-1-1.json"
    intent.write_text(
        json.dumps(
            {
                "output": str(merged.relative_to(tmp_path)),
                "sources": [str(s.relative_to(tmp_path)) for s in sources],
            }
        )
    )
    assert _count(tmp_path, "probe_tx") == 2 * 9 * 80  # a reader would see doubles now
    StoreWriter(tmp_path).open()  # recovery finishes the compaction
    assert [p.name for p in part.glob("*.parquet")] == [merged.name]
    assert _count(tmp_path, "probe_tx") == 9 * 80 and not intent.exists()


def test_the_analysis_tables_small_files_are_merged_at_every_pass_not_only_the_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon's own outputs (anomalies, owd, clock, minute rollups) are ``r<key>``
    files, one per window or pass. Every merge of them was named ``m0-0``: after an hour's
    first compaction the next found its output existing and skipped the partition — a
    6-host lab run kept ~1,700 owd files an hour and logged compaction_skipped every pass."""
    w = StoreWriter(tmp_path)
    w.open()
    hour = 1_796_175_000 // 3600 * 3600 * 10**9

    def anomalies(first: int, n: int) -> None:
        for k in range(first, first + n):
            t = hour + k * 10**9
            row = {"opened_ns": t, "closed_ns": 0, "anomaly_id": f"contention-{k}",
                   "kind": "contention", "score": 0.9, "src": 0, "dst": 0, "link": "l",
                   "job_id": "", "detail": "{}", "updated_ns": t}  # fmt: skip
            table = pa.table({c: [v] for c, v in row.items()},
                             schema=layout.TABLES["anomalies"].schema)  # fmt: skip
            w.write_partitioned("anomalies", table, f"r{t // 1_000_000}.parquet")

    part = tmp_path / "anomalies" / layout.partition_of(hour // layout.NS_PER_HOUR)
    c = Compactor(w, min_age_s=0)
    anomalies(0, 5)
    c.run()
    assert len(list(part.glob("*.parquet"))) == 1
    anomalies(5, 5)  # the next passes' files
    c.run()
    files = sorted(p.name for p in part.glob("*.parquet"))
    assert len(files) == 1 and files[0].startswith("m"), files
    assert _count(tmp_path, "anomalies") == 10
    assert "compaction_skipped" not in caplog.text
    anomalies(10, 1)
    c.run()  # one new file beside the merged one: merged again, every row once
    assert len(list(part.glob("*.parquet"))) == 1 and _count(tmp_path, "anomalies") == 11


def test_retention_drops_old_hours_but_keeps_the_commit_mark(tmp_path: Path) -> None:
    w = StoreWriter(tmp_path)
    w.open()
    old = _probe_tables(0)
    old_ts = T0 - 10 * 86400 * 10**9
    shifted = {
        t: d.set_column(d.schema.get_field_index(col), col, pa.compute.add(d[col], old_ts - T0))
        for (t, d), col in zip(old.items(), ("tx_ns", "rx_ns"), strict=True)
    }
    w.commit(0, shifted, _batches(0, [1], [0]))
    w.commit(1, _probe_tables(1), _batches(1, [1], [1]))
    dropped = Compactor(w).apply_retention(time.time())
    assert dropped == 2  # the old probe_tx and probe_rx hours; batches are recent
    assert _count(tmp_path, "probe_tx") == 80
    c = Compactor(w, retention_s={"batches": 1.0})
    c.apply_retention(time.time() + 7200)
    assert list(w.partitions("batches"))  # the newest batches hour always stays


def test_every_view_answers_on_an_empty_store(tmp_path: Path) -> None:
    StoreWriter(tmp_path).open()
    write_catalog(tmp_path)
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True)
    for view in VIEW_NAMES:
        rows = con.execute(f"SELECT count(*) FROM {view}").fetchone()[0]
        assert rows == (1 if view == "store_info" else 0), view


def test_newer_store_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "store.json").write_text(json.dumps({"store_schema": layout.STORE_SCHEMA + 1}))
    with pytest.raises(layout.StoreError) as info:
        StoreWriter(tmp_path).open()
    assert "newer than this clockmesh understands" in str(info.value)
    assert "\n" not in str(info.value)


def test_hot_window_rolls_up_final_minutes_with_loss_and_delay() -> None:
    start = (T0 // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE - 1
    hot = HotWindow(grace_s=20, start_ns=start)
    ids = ingest_load.host_ids(12)
    t0 = start + 1
    for second in range(60):
        for i in range(12):
            seg = wire.decode(
                ingest_load.fleet_segment(i, ids, second, t0_ns=t0, loss=0.25 if i == 4 else 0)
            )
            hot.add(
                t0 + second * 10**9,
                {t: layout.records_to_arrow(t, seg.table(t)) for t in seg.tables},
            )
    assert hot.rollup(now_ns=t0 + 70 * 10**9) is None  # minute not final yet (grace)
    first, pair, path = hot.rollup(now_ns=t0 + 81 * 10**9)
    assert first == t0 // layout.NS_PER_MINUTE
    assert pair.num_rows == 12 * 10 and path.num_rows == 12 * 10 * 8
    rows = pair.to_pylist()
    assert all(r["sent"] == 480 and r["paths"] == 8 for r in rows)
    to4 = [r for r in rows if r["dst"] == ids[4]]
    assert len(to4) == 10 and 0.15 < 1 - sum(r["received"] for r in to4) / 4800 < 0.35
    clean = [r for r in rows if r["dst"] != ids[4]]
    assert all(r["received"] == 480 and 5_000 <= r["delay_p50_ns"] <= 7_000 for r in clean)
    assert hot.rollup(now_ns=t0 + 82 * 10**9) is None  # each minute once


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "ingest.yml"
    cases = {
        "listen: 'nohost'\n": "listen: expected host:port",
        "retention: {probes: 7d}\n": "retention.probes: unknown table",
        "retention: {probe_tx: 7 days}\n": "retention.probe_tx: expected a duration",
        "roll_s: 0\n": "roll_s: expected a number > 0",
        "tls_cert: /x.pem\n": "tls_key: tls_cert and tls_key go together",
        "rol_s: 1\n": "rol_s: unknown key",
        "analysis_nice: 20\n": "analysis_nice: expected an integer 0-19",
        "hot_max_rows: -1\n": "hot_max_rows: expected a row count > 0, or 0",
        "reserve_bytes: -1\n": "reserve_bytes: expected a number >= 0",
    }
    for text, expected in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            ingest_config.load(path)
        assert str(info.value).startswith(f"{path}: ") and expected in str(info.value), text
    path.write_text("retention: {probe_tx: 3d, owd: 12h}\n")
    _cfg, resolved = ingest_config.load(path)
    assert resolved.retention_s["probe_tx"] == 3 * 86400
    assert resolved.retention_s["probe_minute"] == 180 * 86400
    # memory-based caps by default: a quarter of this machine's memory in 48-byte rows
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert ingest_config.auto_max_rows(0) == max(1_000_000, memory // 4 // 48)
    assert ingest_config.auto_max_rows(5_000) == 5_000
    key = tmp_path / "k"
    key.write_bytes(b"short\n")
    with pytest.raises(ConfigError, match=r"fleet_key_file: .* expected at least 16"):
        ingest_config.read_fleet_key(key, path)
    os.chmod(key, 0o600)


def test_hot_window_settles_incrementally_with_late_receivers_and_live_view() -> None:
    """As the daemon drives it: a commit per second, live() + rollup() every 5 s. Host 7's
    segments reach the ops box 8 s late (after lag_s, within grace_s): its probe_rx still
    match in the rollups; host 4 loses 25 %, which live and rollups both show."""
    start = (T0 // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE - 1
    t0 = start + 1
    hot = HotWindow(grace_s=20, lag_s=5, start_ns=start)
    ids = ingest_load.host_ids(12)
    late: dict[int, list] = {}
    rolled = []
    snap = None
    for now_s in range(0, 100):
        arrival = t0 + now_s * 10**9
        if now_s < 60:
            for i in range(12):
                seg = wire.decode(
                    ingest_load.fleet_segment(i, ids, now_s, t0_ns=t0, loss=0.25 if i == 4 else 0)
                )
                tables = {t: layout.records_to_arrow(t, seg.table(t)) for t in seg.tables}
                if i == 7:
                    late.setdefault(now_s + 8, []).append(tables)
                else:
                    hot.add(arrival, tables)
        for tables in late.pop(now_s, []):
            hot.add(arrival, tables)
        if now_s % 5 == 4:
            snap = hot.live(now_ns=arrival)
            if now_s == 59:
                by_dst = {}
                for p in snap.pairs:
                    by_dst.setdefault(p.dst, []).append(p)
                assert 0.15 < sum(p.loss for p in by_dst[ids[4]]) / 10 < 0.35
                assert all(p.loss == 0 for p in by_dst[ids[1]])
                assert all(5_000 <= p.owd_raw_p50_ns <= 7_000 for p in by_dst[ids[1]])
            got = hot.rollup(now_ns=arrival)
            if got is not None:
                rolled.append(got)
    assert len(rolled) == 1
    _first, pair, _path = rolled[0]
    rows = pair.to_pylist()
    assert len(rows) == 120 and all(r["sent"] == 480 for r in rows)
    to7 = [r for r in rows if r["dst"] == ids[7]]
    assert all(r["received"] == 480 for r in to7)  # late, but within grace
    clean = [r for r in rows if r["dst"] not in (ids[4],)]
    assert all(r["received"] == 480 for r in clean)
    assert hot.rows < 12 * 160 * 40  # settled probes do not pile up
    assert snap is not None


def test_hot_window_join_matches_sql_over_all_rows() -> None:
    """The settle join (numpy, by dense (sender, seq) slots) gives the rollups a plain SQL
    join over every row gives, fed as the daemon feeds it (numpy records, a commit per
    second): with loss, a collector restart (its seq jumps by 10^12 mid-minute, so the
    slots are no longer dense), and one host's segments 12 s late."""
    start = (T0 // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE - 1
    t0 = start + 1
    hot = HotWindow(grace_s=20, lag_s=5, start_ns=start)
    ids = ingest_load.host_ids(10)
    every: dict[str, list[np.ndarray]] = {"probe_tx": [], "probe_rx": []}
    late: dict[int, list[dict[str, np.ndarray]]] = {}
    rolled = []
    for now_s in range(100):
        for i in range(10) if now_s < 60 else ():
            seg = wire.decode(
                ingest_load.fleet_segment(i, ids, now_s, t0_ns=t0, loss=0.1 if i == 2 else 0)
            )
            recs = {t: seg.table(t).copy() for t in ("probe_tx", "probe_rx")}
            if now_s >= 30:  # host 3 restarted: its new seq range starts far ahead
                recs["probe_tx"]["seq"][recs["probe_tx"]["src"] == ids[3]] += 10**12
                recs["probe_rx"]["seq"][recs["probe_rx"]["src"] == ids[3]] += 10**12
            for t, rows in recs.items():
                every[t].append(rows)
            late.setdefault(now_s + (12 if i == 5 else 0), []).append(recs)
        for recs in late.pop(now_s, []):
            hot.add(t0 + now_s * 10**9, recs)
        if now_s % 5 == 4:
            hot.live(now_ns=t0 + now_s * 10**9)
            got = hot.rollup(now_ns=t0 + now_s * 10**9)
            if got is not None:
                rolled.append(got)
    assert len(rolled) == 1
    _first, pair, path = rolled[0]
    all_tx, all_rx = np.concatenate(every["probe_tx"]), np.concatenate(every["probe_rx"])
    tx = pa.table({c: all_tx[c] for c in ("src", "dst", "seq", "sport", "tx_ns")})  # noqa: F841
    rx = pa.table({c: all_rx[c] for c in ("src", "seq", "rx_ns")})  # noqa: F841 (SQL)
    minute = pair.column("minute_ns")[0].as_py()
    joined = f"""
        SELECT tx.src, tx.dst, tx.sport, rx.rx_ns - tx.tx_ns AS d
        FROM tx LEFT JOIN rx ON rx.src = tx.src AND rx.seq = tx.seq
        WHERE tx.tx_ns >= {minute} AND tx.tx_ns < {minute + layout.NS_PER_MINUTE}
    """
    want_pair = duckdb.sql(
        f"""
        SELECT src, dst, count(DISTINCT sport) AS paths, count(*) AS sent,
               count(d) AS received, min(d) AS delay_min_ns,
               quantile_cont(d, 0.5) AS delay_p50_ns, quantile_cont(d, 0.9) AS delay_p90_ns,
               quantile_cont(d, 0.99) AS delay_p99_ns, max(d) AS delay_max_ns,
               avg(d) AS delay_mean_ns
        FROM ({joined}) GROUP BY ALL ORDER BY src, dst
        """
    ).fetchall()
    want_path = duckdb.sql(
        f"""
        SELECT src, dst, sport, count(*) AS sent, count(d) AS received, min(d) AS delay_min_ns,
               quantile_cont(d, 0.5) AS delay_p50_ns, quantile_cont(d, 0.99) AS delay_p99_ns,
               max(d) AS delay_max_ns
        FROM ({joined}) GROUP BY ALL ORDER BY src, dst, sport
        """
    ).fetchall()
    got_pair = [tuple(r.values()) for r in pair.drop_columns(["minute_ns"]).to_pylist()]
    got_path = [tuple(r.values()) for r in path.drop_columns(["minute_ns"]).to_pylist()]
    assert got_pair == [tuple(r) for r in want_pair]
    assert got_path == [tuple(r) for r in want_path]
    assert len(got_pair) == 100 and {r[4] for r in got_pair} != {r[3] for r in got_pair}
    assert len(got_path) == 800


def test_live_snapshot_worst_pairs_match_a_full_sort() -> None:
    from analytics.ingest.hot_window import LiveSnapshot

    rng = np.random.default_rng(3)
    n = 500
    loss = rng.choice([0.0, 0.0, 0.1, 0.5], n)
    p99 = rng.integers(1_000, 90_000, n).astype(float)
    table = pa.table(
        {
            "src": np.arange(n), "dst": np.arange(n) + 1, "sent": np.full(n, 100),
            "received": (100 * (1 - loss)).astype(np.int64), "dmin": p99 / 2, "p50": p99 / 2,
            "p99": p99, "loss": loss,
        }
    )  # fmt: skip
    snap = LiveSnapshot(table=table)
    assert snap.pair_count == n and len(snap.pairs) == n
    full = sorted(snap.pairs, key=lambda p: (-p.loss, -(p.owd_raw_p99_ns or 0)))
    assert [(p.src, p.loss) for p in snap.worst(40)] == [(p.src, p.loss) for p in full[:40]]


def test_a_store_from_before_a_column_was_added_still_opens(tmp_path: Path) -> None:
    """anomalies gained updated_ns: a store created earlier opens, its old rows read NULL."""
    StoreWriter(tmp_path).open()
    old_schema = pa.schema([f for f in layout.TABLES["anomalies"].schema if f.name != "updated_ns"])
    placeholder = tmp_path / "anomalies" / layout.PLACEHOLDER_PARTITION / layout.PLACEHOLDER_NAME
    pq.write_table(old_schema.empty_table(), placeholder)
    part = tmp_path / "anomalies" / "date=2026-11-25" / "hour=10"
    part.mkdir(parents=True)
    row = {f.name: [0 if f.type != pa.string() else "x"] for f in old_schema}
    row["opened_ns"] = [1_795_000_000_000_000_000]
    row["anomaly_id"] = ["flap-old"]
    pq.write_table(pa.table(row, schema=old_schema), part / "r1.parquet")
    StoreWriter(tmp_path).open()  # adds the column to the placeholder
    assert "updated_ns" in pq.read_schema(placeholder).names
    con = duckdb.connect(str(write_catalog(tmp_path)), read_only=True)
    try:
        got = con.execute("SELECT anomaly_id, updated_ns FROM anomaly_current").fetchall()
    finally:
        con.close()
    assert got == [("flap-old", None)]


def _drive_a_minute(
    hot: HotWindow,
    t0: int,
    segment: Callable[[int, int], bytes | None],
    *,
    late_s: Mapping[int, int] | None = None,
    live_at: int = 59,
) -> tuple[Any, tuple[int, pa.Table, pa.Table]]:
    """As the daemon drives the hot window: each of 12 hosts' segments of seconds 0-59
    arrives in its second, or ``late_s[host]`` seconds later (``segment(host, second)``:
    the body, None when the host ships nothing then), rollup() every 5 s up to second 89,
    then live() at second ``live_at``. Returns that live snapshot and the last rollup."""
    snap = None
    rolled = None
    due: dict[int, list[bytes]] = {}
    for now_s in range(0, 90):
        arrival = t0 + now_s * 10**9
        for i in range(12) if now_s < 60 else ():
            body = segment(i, now_s)
            if body is not None:
                due.setdefault(now_s + (late_s or {}).get(i, 0), []).append(body)
        for body in due.pop(now_s, []):
            seg = wire.decode(body)
            hot.add(arrival, {t: layout.records_to_arrow(t, seg.table(t)) for t in seg.tables})
        if now_s % 5 == 4:
            rolled = hot.rollup(now_ns=arrival) or rolled
        if now_s == live_at:
            snap = hot.live(now_ns=arrival)
    assert snap is not None and rolled is not None
    return snap, rolled


def test_probes_to_a_collector_not_running_yet_are_no_loss_but_fabric_loss_is() -> None:
    """A deploy starts collectors one after another: the probes sent to a host before its
    collector ran never arrive, and that is no loss on the fabric — the live view and the
    rollups leave them out (the daemon's fleet view says since when each collector runs).
    A host that loses a quarter of what reaches it still shows it; a host never heard of
    is left out until it ships."""
    start = (T0 // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE - 1
    t0 = start + 1
    ids = ingest_load.host_ids(12)
    view: dict[int, object] = {}
    hot = HotWindow(grace_s=20, lag_s=5, start_ns=start, listening=lambda: view)
    late_start, never = 9, 11  # host 9's collector starts at second 20; host 11's never

    def segment(i: int, now_s: int) -> bytes | None:
        if i == never or (i == late_start and now_s < 20):
            return None
        view.setdefault(int(ids[i]), types.SimpleNamespace(since_ns=t0 + now_s * 10**9))
        return ingest_load.fleet_segment(i, ids, now_s, t0_ns=t0, loss=0.25 if i == 4 else 0)

    snap, rolled = _drive_a_minute(hot, t0, segment)
    live = {(p.src, p.dst): p for p in snap.pairs}
    to9 = [p for (_, dst), p in live.items() if dst == ids[late_start]]
    assert to9 and all(p.loss == 0 for p in to9), [p.loss for p in to9]
    to4 = [p for (_, dst), p in live.items() if dst == ids[4]]
    assert 0.15 < sum(p.loss for p in to4) / len(to4) < 0.35
    assert not [p for (_, dst), p in live.items() if dst == ids[never]]
    rows = rolled[1].to_pylist()
    to9_rolled = [r for r in rows if r["dst"] == ids[late_start] and r["src"] != ids[never]]
    # only what was sent once it ran (seconds 20-59 of the minute), all of it received
    assert to9_rolled and all(r["sent"] == r["received"] == 320 for r in to9_rolled)
    assert (
        0.15
        < 1
        - sum(r["received"] for r in rows if r["dst"] == ids[4])
        / sum(r["sent"] for r in rows if r["dst"] == ids[4])
        < 0.35
    )


def test_probes_to_a_collector_restarting_are_no_loss_but_a_host_gone_deaf_is() -> None:
    """A redeploy restarts each collector in turn: while one restarts nobody listens on
    its host, and every peer's probes to it are lost — no loss on the fabric. Its segments
    say when each run began to listen (``run_ns``), and the gap between two runs is left
    out of the live view and the rollups. A host that hears nothing for as long, with no
    restart in between (its link down), still shows the loss."""
    start = (T0 // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE - 1
    t0 = start + 1
    ids = ingest_load.host_ids(12)
    view: dict[int, HostState] = {}
    hot = HotWindow(grace_s=20, lag_s=5, start_ns=start, listening=lambda: view)
    restarts, deaf = 7, 3  # both hear nothing in seconds 20-23; only host 7 restarts
    run1, run2 = t0 - 10**9, t0 + 24 * 10**9

    def segment(i: int, now_s: int) -> bytes | None:
        if i in (restarts, deaf) and 20 <= now_s < 24:
            return None
        run, at = run2 if i == restarts and now_s >= 24 else run1, t0 + now_s * 10**9
        h = view.setdefault(int(ids[i]), HostState(f"h{i}", int(ids[i]), at, at))
        h.since_ns = min(h.since_ns, at)
        h.add_runs({run: at})
        body = ingest_load.fleet_segment(i, ids, now_s, t0_ns=t0, run_ns=run)
        assert wire.decode(body).run_ns == run
        return body

    snap, rolled = _drive_a_minute(hot, t0, segment)
    assert view[int(ids[restarts])].deaf == ((t0 + 19 * 10**9, run2 + RESTART_MARGIN_NS),)
    live = {(p.src, p.dst): p for p in snap.pairs}
    to7 = [p for (_, dst), p in live.items() if dst == ids[restarts]]
    assert to7 and all(p.loss == 0 for p in to7), [p.loss for p in to7]
    # 4 seconds of what each peer sent to it lost (but host 7's: it sent nothing then)
    to3 = [p for (src, dst), p in live.items() if dst == ids[deaf] and src != ids[restarts]]
    assert to3 and all(0.05 < p.loss < 0.08 for p in to3), [p.loss for p in to3]
    rows = rolled[1].to_pylist()
    to7_rolled = [r for r in rows if r["dst"] == ids[restarts]]
    # what was sent while it listened (seconds 0-18 and 24.5-59 of the minute): all received
    assert to7_rolled and all(r["sent"] == r["received"] for r in to7_rolled)
    assert all(r["sent"] < 480 for r in to7_rolled)
    to3_rolled = [r for r in rows if r["dst"] == ids[deaf] and r["src"] != ids[restarts]]
    assert to3_rolled and all(r["sent"] - r["received"] == 32 for r in to3_rolled)


def test_a_minute_rolled_up_before_a_late_senders_probes_are_due_counts_them_as_live_does() -> None:
    """A sender whose segments come 15 s late has probes still waiting for their
    probe_rx when their minute is rolled up (20 s after it ends); the rollup calls them
    lost. Those sent while their receiver's collector restarted are no loss there either
    (they counted as lost), and those to a host whose link died count in the live view as
    in the rollup (they reached neither)."""
    start = (T0 // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE - 1
    t0 = start + 1
    ids = ingest_load.host_ids(12)
    view: dict[int, HostState] = {}
    hot = HotWindow(grace_s=20, lag_s=5, start_ns=start, listening=lambda: view)
    late, restarts, dead = 2, 7, 3  # host 2 sends to both (its 8 buddies: 3 to 10)
    run1, run2 = t0 - 10**9, t0 + 54 * 10**9

    def segment(i: int, now_s: int) -> bytes | None:
        if (i == restarts and 50 <= now_s < 54) or (i == dead and now_s >= 50):
            return None
        run, at = run2 if i == restarts and now_s >= 54 else run1, t0 + now_s * 10**9
        h = view.setdefault(int(ids[i]), HostState(f"h{i}", int(ids[i]), at, at))
        h.since_ns, h.newest_ns = min(h.since_ns, at), max(h.newest_ns, at)
        h.add_runs({run: at})
        return ingest_load.fleet_segment(i, ids, now_s, t0_ns=t0, run_ns=run)

    snap, rolled = _drive_a_minute(hot, t0, segment, late_s={late: 15}, live_at=89)
    rows = {(r["src"], r["dst"]): r for r in rolled[1].to_pylist()}
    to7 = rows[(ids[late], ids[restarts])]
    assert to7["sent"] - to7["received"] == 0, to7
    to3 = rows[(ids[late], ids[dead])]
    assert to3["sent"] - to3["received"] == 80, to3  # seconds 50-59, 8 probes each
    live = {(p.src, p.dst): p for p in snap.pairs}
    assert live[(ids[late], ids[restarts])].loss == 0
    to3_live = live[(ids[late], ids[dead])]
    assert round(to3_live.loss * to3_live.sent) == 80, (to3_live.loss, to3_live.sent)


def test_a_probe_whose_receiver_ships_late_is_not_lost_until_its_receiver_has_shipped() -> None:
    """A large fleet ships every 30 s (the ops box's advice): a probe's probe_tx comes
    with its sender's segment and its probe_rx with the receiver's, up to 30 s later. The
    live view settles a probe 5 s after it arrived; a probe without its probe_rx then was
    counted lost, so every pair to a host that ships late read ~100 % loss. Now it waits
    until its receiver has shipped a segment begun after it was sent (then it is lost),
    or the rollups' grace. Host 4 really loses 25 %: that still shows."""
    start = (T0 // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE - 1
    t0 = start + 1
    ids = ingest_load.host_ids(12)
    view: dict[int, HostState] = {}
    hot = HotWindow(grace_s=40, lag_s=5, start_ns=start, listening=lambda: view)
    slow = 7  # ships its segments 20 s after they begin
    late: dict[int, list[tuple[int, dict]]] = {}
    snaps = {}
    for now_s in range(0, 100):
        arrival = t0 + now_s * 10**9
        for i in range(12) if now_s < 60 else ():
            seg = wire.decode(
                ingest_load.fleet_segment(i, ids, now_s, t0_ns=t0, loss=0.25 if i == 4 else 0)
            )
            tables = {t: layout.records_to_arrow(t, seg.table(t)) for t in seg.tables}
            late.setdefault(now_s + (20 if i == slow else 0), []).append((i, seg, tables))
        for i, seg, tables in late.pop(now_s, []):
            h = view.setdefault(int(ids[i]), HostState(f"h{i}", int(ids[i]), arrival, arrival))
            h.since_ns = min(h.since_ns, seg.created_ns)
            h.newest_ns = max(h.newest_ns, seg.created_ns)
            hot.add(arrival, tables)
        if now_s % 5 == 4:
            snaps[now_s] = hot.live(now_ns=arrival)
            hot.rollup(now_ns=arrival)
    for at in (29, 59, 79):  # the slow host's first probe_rx came at second 20
        pairs = snaps[at].pairs
        to_slow = [p for p in pairs if p.dst == ids[slow]]
        assert to_slow and all(p.loss == 0 for p in to_slow), (at, [p.loss for p in to_slow])
        to4 = [p for p in pairs if p.dst == ids[4]]
        assert 0.15 < sum(p.loss for p in to4) / len(to4) < 0.35, at
    # every probe sent to it in the minute reached the live view, none lost
    assert sum(p.sent for p in snaps[79].pairs if p.dst == ids[slow]) >= 8 * 55 * 8
