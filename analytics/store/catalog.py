"""``catalog.duckdb``: views only, over the store's Parquet globs. Readers open it read-only.

The daemon rebuilds the catalog at start into a temporary file and renames it into
place, so a reader holding the old catalog open never blocks the daemon and the daemon
never writes a file a reader has open. Every table has a typed empty placeholder file,
so views over tables nobody has written yet answer with zero rows instead of failing.
docs/sql.md describes the views and shows queries against them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import duckdb

from analytics.store import layout
from analytics.store.layout import TABLES

NS_PER_MIN = layout.NS_PER_MINUTE


def table_view_sql(root: Path, table: str) -> str:
    glob = "'" + layout.table_glob(root.resolve(), table) + "'"
    return (
        f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet({glob}, "
        "hive_partitioning = true, union_by_name = true, "
        "hive_types = {'date': DATE, 'hour': INTEGER})"
    )


def _ts(col: str) -> str:
    return f"make_timestamp(({col}) // 1000)"


# Views an SRE reaches for first. Times are UTC TIMESTAMPs, delays in microseconds.
DERIVED_VIEWS: dict[str, str] = {
    "store_info": f"SELECT {layout.STORE_SCHEMA} AS store_schema",
    "hosts": f"""
        SELECT host_id, arg_max(host, ts_ns) AS host, {_ts("min(ts_ns)")} AS first_seen,
               {_ts("max(ts_ns)")} AS name_seen
        FROM host_names GROUP BY host_id""",
    "probes": f"""
        SELECT t.src, t.dst, t.sport, t.seq, t.pair, {_ts("t.tx_ns")} AS tx_time, t.tx_ns,
               r.rx_ns, r.rx_ns - t.tx_ns AS owd_raw_ns, r.rx_ns IS NULL AS lost, r.ttl,
               t.ts_kind AS tx_kind, r.ts_kind AS rx_kind, t.transport, t.date, t.hour
        FROM probe_tx t LEFT JOIN probe_rx r ON r.src = t.src AND r.seq = t.seq""",
    "link_health_now": f"""
        WITH w AS (
            SELECT t.src, t.dst, t.sport, t.tx_ns, r.rx_ns - t.tx_ns AS d
            FROM probe_tx t LEFT JOIN probe_rx r ON r.src = t.src AND r.seq = t.seq
            WHERE t.date >= CAST(now() - INTERVAL 1 DAY AS DATE)
              AND t.tx_ns >= epoch_ns(now()) - 300 * 1000000000::BIGINT
              AND t.tx_ns < epoch_ns(now()) - 10 * 1000000000::BIGINT
        )
        SELECT hs.host AS src_host, hd.host AS dst_host, w.src, w.dst,
               count(DISTINCT w.sport) AS paths, count(*) AS sent, count(w.d) AS received,
               round(1 - count(w.d) / count(*), 4) AS loss,
               round(quantile_cont(w.d, 0.5) / 1000, 1) AS owd_raw_p50_us,
               round(quantile_cont(w.d, 0.99) / 1000, 1) AS owd_raw_p99_us,
               {_ts("max(w.tx_ns)")} AS last_probe,
               CASE WHEN count(w.d) = 0 THEN 'down'
                    WHEN 1 - count(w.d) / count(*) > 0.01 THEN 'lossy'
                    ELSE 'ok' END AS status
        FROM w LEFT JOIN hosts hs ON hs.host_id = w.src LEFT JOIN hosts hd ON hd.host_id = w.dst
        GROUP BY ALL""",
    "owd_minute": f"""
        SELECT {_ts("m.minute_ns")} AS minute, hs.host AS src_host, hd.host AS dst_host,
               m.src, m.dst, m.paths, m.sent, m.received,
               1 - m.received / m.sent AS loss,
               m.delay_min_ns / 1000 AS owd_raw_min_us, m.delay_p50_ns / 1000 AS owd_raw_p50_us,
               m.delay_p90_ns / 1000 AS owd_raw_p90_us, m.delay_p99_ns / 1000 AS owd_raw_p99_us,
               m.delay_max_ns / 1000 AS owd_raw_max_us, m.delay_mean_ns / 1000 AS owd_raw_mean_us,
               m.date, m.hour
        FROM probe_minute m
        LEFT JOIN hosts hs ON hs.host_id = m.src LEFT JOIN hosts hd ON hd.host_id = m.dst""",
    "path_owd_minute": f"""
        SELECT {_ts("m.minute_ns")} AS minute, hs.host AS src_host, hd.host AS dst_host,
               m.src, m.dst, m.sport, m.sent, m.received, 1 - m.received / m.sent AS loss,
               m.delay_p50_ns / 1000 AS owd_raw_p50_us, m.delay_p99_ns / 1000 AS owd_raw_p99_us,
               m.date, m.hour
        FROM path_minute m
        LEFT JOIN hosts hs ON hs.host_id = m.src LEFT JOIN hosts hd ON hd.host_id = m.dst""",
    "owd_corrected_minute": f"""
        SELECT {_ts(f"(o.ts_ns // {NS_PER_MIN}) * {NS_PER_MIN}")} AS minute,
               hs.host AS src_host, hd.host AS dst_host, o.src, o.dst, count(*) AS probes,
               quantile_cont(o.owd_ns, 0.5) / 1000 AS owd_p50_us,
               quantile_cont(o.owd_ns, 0.99) / 1000 AS owd_p99_us,
               avg(o.uncertainty_ns) / 1000 AS uncertainty_us
        FROM owd o
        LEFT JOIN hosts hs ON hs.host_id = o.src LEFT JOIN hosts hd ON hd.host_id = o.dst
        GROUP BY ALL""",
    "worst_pairs": """
        SELECT src_host, dst_host, src, dst, sum(sent) AS sent, sum(received) AS received,
               round(1 - sum(received) / sum(sent), 4) AS loss,
               round(median(owd_raw_p50_us), 1) AS owd_raw_p50_us,
               round(max(owd_raw_p99_us), 1) AS worst_minute_p99_us,
               min(minute) AS first_minute, max(minute) AS last_minute
        FROM owd_minute
        WHERE minute >= now()::TIMESTAMP - INTERVAL 1 HOUR
        GROUP BY ALL
        ORDER BY loss DESC, worst_minute_p99_us DESC""",
    "flaps": f"""
        WITH s AS (
            SELECT host, device, ts_ns,
                   max(CASE WHEN name = 'operstate' THEN value END) AS oper,
                   sum(CASE WHEN name IN ('carrier_down_count', 'link_downed')
                            THEN delta ELSE 0 END) AS downs
            FROM counter
            WHERE name IN ('operstate', 'carrier_down_count', 'link_downed')
            GROUP BY host, device, ts_ns
        ), t AS (
            SELECT host, device, ts_ns, downs, oper = 6 AS up,
                   lag(oper = 6) OVER (PARTITION BY host, device ORDER BY ts_ns) AS prev_up
            FROM s
        ), e AS (
            SELECT host, device, ts_ns, up,
                   lead(ts_ns) OVER (PARTITION BY host, device ORDER BY ts_ns) AS next_ns
            FROM t WHERE up IS NOT NULL AND prev_up IS NOT NULL AND up <> prev_up
        )
        SELECT h.host AS host_name, e.host, e.device, {_ts("e.ts_ns")} AS down_at,
               {_ts("e.next_ns")} AS up_at, (e.next_ns - e.ts_ns) / 1e9 AS outage_s,
               'operstate' AS seen_by
        FROM e LEFT JOIN hosts h ON h.host_id = e.host WHERE NOT e.up
        UNION ALL
        SELECT h.host, t.host, t.device, {_ts("t.ts_ns")}, {_ts("t.ts_ns")}, NULL,
               'carrier counter (shorter than one sample)'
        FROM t LEFT JOIN hosts h ON h.host_id = t.host
        WHERE t.downs > 0 AND coalesce(t.up, true) AND coalesce(t.prev_up, true)""",
    "job_roce": """
        SELECT j.job_id, h.host AS host_name, j.host, j.device, j.gid_index, j.source,
               c.gid_type, c.gid, c.default_roce_mode,
               c.gid_type LIKE '%v1%' AS roce_v1, make_timestamp(max(j.ts_ns) // 1000) AS seen
        FROM job_rdma j
        LEFT JOIN rdma_config c ON c.host = j.host AND c.device = j.device
             AND c.gid_index = j.gid_index
        LEFT JOIN hosts h ON h.host_id = j.host
        WHERE j.job_id <> ''
        GROUP BY ALL""",
    "job_delay": f"""
        WITH s AS (SELECT * FROM inband WHERE event = 0),
             r AS (SELECT * FROM inband WHERE event = 1),
             j AS (
                 SELECT s.job_id, s.host AS src, r.host AS dst,
                        (s.event_ns // {NS_PER_MIN}) * {NS_PER_MIN} AS minute_ns,
                        r.event_ns - s.event_ns AS d
                 FROM s JOIN r ON r.job_id = s.job_id AND r.flow_id = s.flow_id
                      AND r.seq = s.seq AND r.peer = s.host
             ), a AS (
                 SELECT job_id, src, dst, minute_ns, count(*) AS messages,
                        quantile_cont(d, 0.5) AS p50, quantile_cont(d, 0.99) AS p99
                 FROM j GROUP BY ALL
             )
        SELECT a.job_id, {_ts("a.minute_ns")} AS minute, hs.host AS src_host,
               hd.host AS dst_host, a.src, a.dst, a.messages,
               a.p50 / 1000 AS inband_p50_us, a.p99 / 1000 AS inband_p99_us,
               m.delay_p50_ns / 1000 AS probe_p50_us, m.delay_p99_ns / 1000 AS probe_p99_us,
               (a.p50 - m.delay_p50_ns) / 1000 AS inband_minus_probe_p50_us
        FROM a
        LEFT JOIN probe_minute m ON m.src = a.src AND m.dst = a.dst AND m.minute_ns = a.minute_ns
        LEFT JOIN hosts hs ON hs.host_id = a.src LEFT JOIN hosts hd ON hd.host_id = a.dst""",
    "anomaly_current": f"""
        SELECT anomaly_id, kind, link, job_id, src, dst, score,
               {_ts("opened_ns")} AS opened, opened_ns, closed_ns,
               CASE WHEN closed_ns = 0 THEN NULL ELSE {_ts("closed_ns")} END AS closed,
               closed_ns = 0 AS is_open, updated_ns,
               json_extract_string(detail, '$.summary') AS summary, detail
        FROM (
            SELECT *, row_number() OVER (
                PARTITION BY anomaly_id ORDER BY coalesce(updated_ns, 0) DESC, closed_ns DESC
            ) AS rn
            FROM anomalies
        ) WHERE rn = 1""",
    # Each remediation's latest row (a re-recorded row wins over an older one of the same id;
    # a check-mode preview and a real run recorded at the same nanosecond: the real run).
    # ``remediate history``, the report, the TUI and the preflight all read this one.
    "remediation_current": f"""
        SELECT remediation_id, anomaly_id, action, target, hosts, check_mode, status, actor,
               undo, detail, ts_ns, first_ns, {_ts("first_ns")} AS started,
               {_ts("ts_ns")} AS updated,
               CASE WHEN check_mode THEN 'preview' ELSE status END AS state
        FROM (
            SELECT *, min(ts_ns) OVER (PARTITION BY remediation_id) AS first_ns,
                   row_number() OVER (
                       PARTITION BY remediation_id ORDER BY ts_ns DESC, check_mode ASC, status
                   ) AS rn
            FROM remediations WHERE remediation_id <> ''
        ) WHERE rn = 1""",
    # The rows of the latest fleet audit run (``clockmesh audit show``, the report, the TUI).
    "fleet_audit_latest": """
        SELECT run_id, ts_ns, host, category, "check", status, reason, value
        FROM fleet_audit
        WHERE run_id = (SELECT arg_max(run_id, ts_ns) FROM fleet_audit WHERE run_id <> '')""",
    "ingest_rate_minute": f"""
        SELECT {_ts(f"(received_ns // {NS_PER_MIN}) * {NS_PER_MIN}")} AS minute,
               count(*) AS batches, count(DISTINCT host_id) AS hosts, sum(rows) AS rows,
               sum(bytes) AS bytes
        FROM batches GROUP BY ALL ORDER BY minute""",
}


def write_catalog(root: Path, path: Path | None = None) -> Path:
    """(Re)create the view catalog of the store at ``root``; atomic replace."""
    root = Path(root)
    path = path or root / "catalog.duckdb"
    tmp = path.with_name(path.name + ".tmp")
    for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
        leftover.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        for table in TABLES:
            con.execute(table_view_sql(root, table))
        for name, body in DERIVED_VIEWS.items():
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {body}")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    layout.fsync_file(tmp)
    os.replace(tmp, path)
    layout.fsync_dir(path.parent)
    return path


VIEW_NAMES = [*TABLES, *DERIVED_VIEWS]

_DUCK = {"int64": "BIGINT", "int32": "INTEGER", "double": "DOUBLE", "string": "VARCHAR",
         "bool": "BOOLEAN", "float": "FLOAT", "uint64": "UBIGINT", "int16": "SMALLINT",
         "uint8": "UTINYINT", "int8": "TINYINT", "uint16": "USMALLINT", "uint32": "UINTEGER"}  # fmt: skip


def _needs(names: Iterable[str]) -> set[str]:
    """``names`` and every view they read, transitively (a word match over the bodies: a
    column that shares a view's name only adds a view that is not used)."""
    out: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        body = DERIVED_VIEWS.get(name, "")
        todo += [v for v in VIEW_NAMES if v not in out and re.search(rf"\b{v}\b", body)]
    return out


def connect_views(store: Path, only: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with the catalog's views over the store at ``store`` as
    this process sees it (``catalog.duckdb`` holds the paths the daemon saw: another
    mount of the same store — a lab node's, an NFS export, a copy — reads through this).
    A table with no file yet (an older or fresh store) is an empty view of its schema.

    ``only``: just these views and what they read (a reader that needs one view opens in
    milliseconds instead of binding every table's files).

    Raises FileNotFoundError (one line) when ``store`` is not a clockmesh store: neither the
    daemon's ``store.json`` nor a table directory (``clockmesh remediate record`` and
    ``audit record`` write their tables into a directory of their own as well)."""
    store = Path(store)
    if not store.is_dir() or not (
        (store / "store.json").exists() or any((store / t).is_dir() for t in TABLES)
    ):
        raise FileNotFoundError(f"{store}: not a clockmesh store (no store.json)")
    want = set(VIEW_NAMES) if only is None else _needs(only)
    con = duckdb.connect()
    for table, spec in TABLES.items():
        if table not in want:
            continue
        if layout.has_files(store, table):
            con.execute(table_view_sql(store, table))
        else:
            cols = ", ".join(
                f'CAST(NULL AS {_DUCK.get(str(f.type), "VARCHAR")}) AS "{f.name}"'
                for f in spec.schema
            )
            con.execute(f"CREATE VIEW {table} AS SELECT {cols}, CAST(NULL AS DATE) AS date, "
                        "CAST(NULL AS INTEGER) AS hour WHERE false")  # fmt: skip
    for name, body in DERIVED_VIEWS.items():
        if name in want:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {body}")
    return con
