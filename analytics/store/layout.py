"""What the store holds: every table's Arrow schema, time column, retention class and paths.

Collector tables are derived from the numpy dtypes in :mod:`collector.records` (padding
dropped, fixed-width text turned into strings); the daemon's own tables and the tables
later components write (clock, owd, anomalies, ...) are declared here so their views
exist, typed, from the first start. docs/schema.md documents every column.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collector import records

# Bump when the on-disk layout or a column changes incompatibly. An older binary refuses
# a newer store with one line instead of misreading it.
STORE_SCHEMA = 1
NS_PER_HOUR = 3_600_000_000_000
NS_PER_MINUTE = 60_000_000_000
PLACEHOLDER_PARTITION = "date=1970-01-01/hour=00"
PLACEHOLDER_NAME = "_schema.parquet"
_FILE_RE = re.compile(r"^(?:c(?P<c>\d+)|m(?P<lo>\d+)-(?P<hi>\d+)|r(?P<r>\d+))\.parquet$")


class StoreError(Exception):
    """The store cannot be used as asked; ``str()`` is one line naming the path and why."""


@dataclass(frozen=True)
class TableSpec:
    name: str
    schema: pa.Schema
    time_column: str  # int64 ns column that decides the date/hour partition
    retention_class: str  # "raw" or "aggregate"
    writer: str  # who writes it: "collector", "ingest", "solver", "detector", "remediation", "lab"


def _arrow_type(dtype: np.dtype) -> pa.DataType:
    if dtype.kind == "S":
        return pa.string()
    return pa.from_numpy_dtype(dtype)


def _record_schema(dtype: np.dtype) -> pa.Schema:
    fields = []
    for name in dtype.names or ():
        if name.startswith("_"):
            continue
        fields.append(pa.field(name, _arrow_type(dtype[name]), nullable=False))
    return pa.schema(fields)


def _schema(*cols: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t) for n, t in cols])


i64, f64, s, u64, i32, b = (
    pa.int64(),
    pa.float64(),
    pa.string(),
    pa.uint64(),
    pa.int32(),
    pa.bool_(),
)

_RECORD_TIME = {"probe_tx": "tx_ns", "probe_rx": "rx_ns", "echo": "t1_ns"}
_RECORD_CLASS = {"rdma_config": "aggregate", "job_rdma": "aggregate", "job_nccl": "aggregate"}

TABLES: dict[str, TableSpec] = {}
for _name, _dtype in records.TABLES.items():
    TABLES[_name] = TableSpec(
        _name,
        _record_schema(_dtype),
        _RECORD_TIME.get(_name, "ts_ns"),
        _RECORD_CLASS.get(_name, "raw"),
        "collector",
    )

_DAEMON_TABLES = [
    TableSpec(
        "batches",
        _schema(
            ("commit", i64), ("received_ns", i64), ("host_id", i64), ("host", s),
            ("segment", i64), ("created_ns", i64), ("rows", i64), ("bytes", i64),
        ),
        "received_ns", "raw", "ingest",
    ),
    TableSpec(
        "probe_minute",
        _schema(
            ("minute_ns", i64), ("src", i64), ("dst", i64), ("paths", i64), ("sent", i64),
            ("received", i64), ("delay_min_ns", i64), ("delay_p50_ns", f64),
            ("delay_p90_ns", f64), ("delay_p99_ns", f64), ("delay_max_ns", i64),
            ("delay_mean_ns", f64),
        ),
        "minute_ns", "aggregate", "ingest",
    ),
    TableSpec(
        "path_minute",
        _schema(
            ("minute_ns", i64), ("src", i64), ("dst", i64), ("sport", i32), ("sent", i64),
            ("received", i64), ("delay_min_ns", i64), ("delay_p50_ns", f64),
            ("delay_p99_ns", f64), ("delay_max_ns", i64),
        ),
        "minute_ns", "aggregate", "ingest",
    ),
    TableSpec(
        "host_names",
        _schema(("ts_ns", i64), ("host_id", i64), ("host", s)),
        "ts_ns", "aggregate", "ingest",
    ),
    TableSpec(
        "links",
        _schema(
            ("ts_ns", i64), ("link", s), ("a_node", s), ("a_port", s), ("b_node", s),
            ("b_port", s), ("kind", s), ("a_host_id", i64), ("b_host_id", i64),
        ),
        "ts_ns", "aggregate", "lab",
    ),
    TableSpec(
        "clock",
        _schema(
            ("window_start_ns", i64), ("window_end_ns", i64), ("host", i64),
            ("offset_ns", f64), ("drift_ppm", f64), ("uncertainty_ns", f64),
            ("reference", i64), ("method", s),
        ),
        "window_start_ns", "aggregate", "solver",
    ),
    TableSpec(
        "owd",
        _schema(
            ("ts_ns", i64), ("src", i64), ("dst", i64), ("sport", i32), ("seq", u64),
            ("owd_ns", f64), ("uncertainty_ns", f64),
        ),
        "ts_ns", "raw", "solver",
    ),
    TableSpec(
        "anomalies",
        _schema(
            ("opened_ns", i64), ("closed_ns", i64), ("anomaly_id", s), ("kind", s),
            ("score", f64), ("src", i64), ("dst", i64), ("link", s), ("job_id", s),
            ("detail", s), ("updated_ns", i64),
        ),
        "opened_ns", "aggregate", "detector",
    ),
    TableSpec(
        "remediations",
        _schema(
            ("ts_ns", i64), ("remediation_id", s), ("anomaly_id", s), ("action", s),
            ("target", s), ("hosts", s), ("check_mode", b), ("status", s), ("actor", s),
            ("undo", s), ("detail", s),
        ),
        "ts_ns", "aggregate", "remediation",
    ),
    TableSpec(
        "audits",
        _schema(("ts_ns", i64), ("actor", s), ("action", s), ("target", s), ("detail", s)),
        "ts_ns", "aggregate", "remediation",
    ),
    TableSpec(
        "fleet_audit",
        _schema(
            ("ts_ns", i64), ("run_id", s), ("host", s), ("category", s), ("check", s),
            ("status", s), ("reason", s), ("value", s),
        ),
        "ts_ns", "aggregate", "audit",
    ),
]  # fmt: skip
for _spec in _DAEMON_TABLES:
    TABLES[_spec.name] = _spec

DEFAULT_RETENTION_S = {"raw": 7 * 86400, "aggregate": 180 * 86400}

# Parquet encoding (store_writer): dictionary pages only where a column has few distinct
# values per file; min/max statistics where readers filter (time, host ids, commit).
DICTIONARY_COLUMNS = frozenset(
    {"src", "dst", "host", "host_id", "sport", "dport", "port", "pair", "ts_kind", "transport",
     "ttl", "spacing_ns", "source", "device", "name", "gid_type", "ndev", "default_roce_mode",
     "job_id", "event", "kind", "link", "a_node", "b_node", "a_port", "b_port", "method",
     "reference", "paths", "commit", "rows", "bytes", "gid_index", "pid", "action", "target",
     "status", "actor", "check_mode", "anomaly_id", "remediation_id", "hosts", "undo", "detail"}
)  # fmt: skip
# Per-host monotonic integers (sequence numbers, nanosecond times): delta encoding makes
# them several times smaller than plain + lz4 at the same encode cost.
DELTA_COLUMNS = frozenset(
    {"seq", "tx_ns", "rx_ns", "t1_ns", "t2_ns", "t3_ns", "t4_ns", "ts_ns", "event_ns",
     "received_ns", "created_ns", "segment"}
)  # fmt: skip
STATISTICS_COLUMNS = frozenset(
    {"tx_ns", "rx_ns", "t1_ns", "ts_ns", "received_ns", "minute_ns", "window_start_ns",
     "window_end_ns", "opened_ns", "closed_ns", "created_ns", "commit", "segment", "src", "dst",
     "host", "host_id", "seq"}
)  # fmt: skip
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def table_glob(store: Path, table: str) -> str:
    """The Parquet files of a store table (every partition), as a pattern safe inside a
    single-quoted SQL string: ``read_parquet('{table_glob(store, "owd")}')``."""
    return str(Path(store) / table / "*" / "*" / "*.parquet").replace("'", "''")


def has_files(store: Path, table: str) -> bool:
    """Whether a store table has any Parquet file yet (in any partition)."""
    return any((Path(store) / table).glob("*/*/*.parquet"))


def parse_duration(text: str | float | int) -> float:
    """``"7d"``, ``"24h"``, ``"90m"``, ``"30s"`` or a number of seconds -> seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text < 0:
            raise ValueError("expected a duration >= 0")
        return float(text)
    match = _DURATION_RE.match(str(text))
    if not match:
        raise ValueError(f"expected a duration like 30s, 90m, 24h or 7d, got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def partition_of(hour_bucket: int) -> str:
    """``date=YYYY-MM-DD/hour=HH`` of an hour bucket (ns // NS_PER_HOUR), UTC."""
    when = dt.datetime.fromtimestamp(hour_bucket * 3600, tz=dt.UTC)
    return f"date={when:%Y-%m-%d}/hour={when:%H}"


def hour_bucket_of_partition(date_dir: str, hour_dir: str) -> int | None:
    """The inverse of :func:`partition_of`; None for a directory that is not a partition."""
    try:
        day = dt.datetime.strptime(date_dir.removeprefix("date="), "%Y-%m-%d")
        hour = int(hour_dir.removeprefix("hour="))
    except ValueError:
        return None
    return int(day.replace(tzinfo=dt.UTC).timestamp()) // 3600 + hour


def file_commit_range(name: str) -> tuple[str, int, int] | None:
    """Kind ('c', 'm' or 'r') and range of a data file name; None if not ours. ``c<N>``:
    commit N; ``r<K>``: the daemon's own output keyed K (a window's or pass's time), its
    range K-K, so merged outputs (``m<lo>-<hi>``) of a table's ``r`` files are named by
    their keys and never collide (commit numbers only mean something in ``c`` tables)."""
    match = _FILE_RE.match(name)
    if not match:
        return None
    if match.group("c") is not None:
        n = int(match.group("c"))
        return ("c", n, n)
    if match.group("lo") is not None:
        return ("m", int(match.group("lo")), int(match.group("hi")))
    key = int(match.group("r"))
    return ("r", key, key)


def strings_from_fixed(column: np.ndarray) -> pa.Array:
    """Fixed-width NUL-padded ASCII (numpy ``S<n>``) -> Arrow strings, vectorised.

    Raises ``pa.ArrowInvalid`` when a value is not valid UTF-8.
    """
    column = np.ascontiguousarray(column)
    width = column.dtype.itemsize
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(column), [None, pa.py_buffer(column.tobytes())]
    )
    # counter/health names and devices repeat: convert and validate each distinct value once
    encoded = fixed.dictionary_encode()
    text = pc.cast(pc.cast(encoded.dictionary, pa.binary()), pa.string())
    return pc.utf8_rtrim(text, characters="\x00").take(encoded.indices)


_BLOCK_BYTES = 1 << 20  # rows are columnised per block of this size (stays in L2 cache)


def arrow_to_records(table: str, data: pa.Table) -> np.ndarray:
    """The inverse of :func:`records_to_arrow`: a collector table's store columns back into
    its numpy records (padding zero, text re-encoded to its fixed width)."""
    dtype = records.TABLES[table]
    out = np.zeros(data.num_rows, dtype)
    for name in dtype.names or ():
        if name.startswith("_"):
            continue
        col = data.column(name)
        if dtype[name].kind == "S":  # each distinct text encoded once (a column repeats few)
            codes = pc.dictionary_encode(col.combine_chunks())
            words = [v.encode() for v in codes.dictionary.to_pylist()]
            if codes.indices.null_count or not words:
                out[name] = np.array([v.encode() for v in col.to_pylist()], dtype[name])
            else:
                out[name] = np.array(words, dtype[name])[codes.indices.to_numpy()]
        else:
            out[name] = col.to_numpy()
    return out


def records_to_arrow(
    table: str, rows: np.ndarray, columns: dict[str, np.ndarray] | None = None
) -> pa.Table:
    """A structured array of ``records.TABLES[table]`` -> an Arrow table of its store schema.

    Every column is a copy (never a view of ``rows``), so the caller may reuse the memory
    behind ``rows`` at once: the ingest daemon fills one long-lived scratch buffer per
    table and commit (docs/store.md, "Performance"). The copies go to Arrow's memory
    pool, or with ``columns`` (one such dict per table, kept by the caller) into
    long-lived byte buffers kept there per column and grown as needed: the table is then
    valid only until the next call with the same dict. The daemon's group commits do
    that; fresh pages cost far more than the copy on a VM that hands freed memory back
    to its host (docs/store.md, "Round 7").
    Numeric columns are filled block by block (all columns of ~1 MiB of rows, then the
    next): one pass over the records instead of one per column.
    """
    spec = TABLES[table]
    n = len(rows)
    arrays: dict[str, pa.Array] = {}
    fixed: list[tuple[np.ndarray, np.ndarray]] = []  # (destination, source column)
    for field in spec.schema:
        column = rows[field.name]
        if column.dtype.kind == "S":
            arrays[field.name] = strings_from_fixed(column)
        elif pa.types.is_boolean(field.type):  # Arrow packs bits: no byte-wise copy
            arrays[field.name] = pa.array(column, type=field.type)
        else:
            size = n * column.dtype.itemsize
            if columns is None:
                buf = pa.allocate_buffer(size)
                dst = np.frombuffer(buf, column.dtype)
            else:
                dst = scratch_bytes(columns, field.name, size).view(column.dtype)
                buf = pa.py_buffer(dst)
            fixed.append((dst, column))
            arrays[field.name] = pa.Array.from_buffers(field.type, n, [None, buf])
    step = max(1, _BLOCK_BYTES // max(rows.dtype.itemsize, 1))
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        for dst, src in fixed:
            np.copyto(dst[lo:hi], src[lo:hi])
    return pa.Table.from_arrays([arrays[f.name] for f in spec.schema], schema=spec.schema)


def scratch_bytes(buffers: dict[str, np.ndarray], key: str, size: int) -> np.ndarray:
    """The first ``size`` bytes of the long-lived buffer ``buffers[key]``, made or grown
    (by a quarter more than asked) when too small."""
    buf = buffers.get(key)
    if buf is None or len(buf) < size:
        buf = buffers[key] = np.empty(max(size, 1 << 16) * 5 // 4, np.uint8)
    return buf[:size]


def parquet_options(schema: pa.Schema, *, dictionary: bool = True) -> dict:
    """Encoding options of every store file (benchmarks/bench_ingest.py, docs/store.md).

    ``dictionary=False`` (the ingest daemon's group commits): no dictionary pages at all.
    They halve the encoding cost of probe tables and grow those files ~20 %; the
    compactor rewrites the commits of an hour with dictionaries (docs/store.md, "Round 4").
    """
    names = schema.names
    return {
        "use_dictionary": [c for c in names if c in DICTIONARY_COLUMNS] if dictionary else False,
        "write_statistics": [c for c in names if c in STATISTICS_COLUMNS],
        "column_encoding": {
            c: "DELTA_BINARY_PACKED"
            for c in names
            if c in DELTA_COLUMNS and pa.types.is_integer(schema.field(c).type)
        },
    }


def empty_table(table: str) -> pa.Table:
    return TABLES[table].schema.empty_table()


@dataclass(frozen=True)
class StoreInfo:
    store_schema: int
    created_ns: int


def read_store_info(store_dir: Path) -> StoreInfo | None:
    """The store's recorded schema; raises :class:`StoreError` if it is newer than ours."""
    path = store_dir / "store.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        info = StoreInfo(int(data["store_schema"]), int(data.get("created_ns", 0)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{path}: unreadable store metadata ({exc})") from None
    if info.store_schema > STORE_SCHEMA:
        raise StoreError(
            f"{path}: store schema {info.store_schema} is newer than this clockmesh "
            f"understands ({STORE_SCHEMA}); upgrade clockmesh on this machine"
        )
    return info


def require_store(store_dir: Path) -> StoreInfo:
    """For readers: the directory must be a store (with catalog) of a schema we know."""
    info = read_store_info(store_dir)
    if info is None or not (store_dir / "catalog.duckdb").exists():
        raise StoreError(
            f"{store_dir}: not a clockmesh store (no store.json/catalog.duckdb; "
            "has the ingest daemon run here?)"
        )
    return info


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs_durable(path: Path) -> None:
    """``mkdir -p`` that fsyncs the parent of every directory it created."""
    if path.is_dir():
        return
    missing = []
    cur = path
    while not cur.is_dir():
        missing.append(cur)
        cur = cur.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_dir(directory.parent)
