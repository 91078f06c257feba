"""``clockmesh detector replay``: a stored run through a fresh clock solver and detector,
on the run's own time, to see what the detector of today's code would have said.

The store's rows (probes, echoes, counters, path traces, RDMA configuration, jobs,
in-band messages) are fed in the order they were taken, each ``lag_s`` after its own
timestamp (what shipping costs: a segment interval and the trip; link counters and path
traces ``urgent_lag_s``, as a link event or a moved path ships them at once), to the same
:class:`ClockRunner` and :class:`DetectRunner` the ingest daemon runs, with a pass every
``step_s``. What they write — anomalies, solved
clocks and one-way delays — goes to a new store under ``out``; with the run's
``truth.json`` copied beside it, ``clockmesh detector eval OUT`` judges the replay as it
judges the live run. Not replayed: remediations run during the run, and the arrival
order within one segment interval (a faster or slower shipper shifts latencies by up to
``lag_s``). The detector's and solver's settings are the run's (its ingest.yml, read by
the command): an anomaly closes after the run's ``detect_clear_s``, a pass follows each
group commit (``roll_s``), as in the daemon.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from analytics.clock.clock_runner import SOURCES as CLOCK_TABLES
from analytics.clock.clock_runner import ClockRunner
from analytics.detect.detect_runner import DetectConfig, DetectRunner
from analytics.store.catalog import connect_views
from analytics.store.store_writer import StoreWriter

# each table the daemon hands its clock runner or detector, and its time column
TIME_COLUMNS = {
    "probe_tx": "tx_ns",
    "probe_rx": "rx_ns",
    "echo": "t1_ns",
    "counter": "ts_ns",
    "health": "ts_ns",
    "path_hop": "ts_ns",
    "rdma_config": "ts_ns",
    "job_rdma": "ts_ns",
    "job_nccl": "ts_ns",
    "inband": "ts_ns",
}
# shipped at once when a link changes state or a path moves (collector/agent.py's urgent
# rolls), not at the next segment interval: they arrive ``urgent_lag_s`` after their time
URGENT = ("counter", "path_hop")
WARM_UP_S = 30.0  # fed before the run's start: routes learn their healthy delay
CHUNK_NS = 60_000_000_000  # rows read from the store this much at a time


class ReplayError(Exception):
    """A run that cannot be replayed: one line naming the file and what was expected."""


@dataclass
class Replayed:
    start_ns: int
    end_ns: int
    passes: int = 0
    opened: list[dict[str, Any]] = field(default_factory=list)  # /v1/live rows, as opened
    wall_s: float = 0.0
    rejected: int = 0  # input the detector refused (one log line each)


def _span(
    run: Path, con: duckdb.DuckDBPyConnection, store: Path, minutes: float | None
) -> tuple[int, int]:
    truth = run / "truth.json"
    if truth.exists():
        try:
            doc = json.loads(truth.read_text(encoding="utf-8"))
            start, end = int(doc["started_ns"]), int(doc["ended_ns"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ReplayError(f"{truth}: expected started_ns and ended_ns ({exc})") from None
    else:
        start, end = _stored_span(con, store)
    if minutes is not None:
        end = min(end, start + int(minutes * 60e9))
    return start, end


def _stored_span(con: duckdb.DuckDBPyConnection, store: Path) -> tuple[int, int]:
    lo, hi = con.execute("SELECT min(ts_ns), max(ts_ns) FROM counter").fetchone() or (None, None)
    if lo is None:
        raise ReplayError(f"{store}: no counter rows to take the run's span from")
    return int(lo) + int(WARM_UP_S * 1e9), int(hi)


def _chunks(
    con: duckdb.DuckDBPyConnection, lo: int, hi: int
) -> Iterator[tuple[int, dict[str, tuple[pa.Table, np.ndarray]]]]:
    """The store's rows from ``lo`` to ``hi``, a chunk at a time (up to where it ends),
    each table in time order (the catalog's views: a table with no file is empty)."""
    for a in range(lo, hi, CHUNK_NS):
        b = min(a + CHUNK_NS, hi)
        out = {}
        for table, col in TIME_COLUMNS.items():
            data = con.sql(
                f"SELECT * EXCLUDE (date, hour) FROM {table} "
                f"WHERE {col} >= {a} AND {col} < {b} ORDER BY {col}"
            ).to_arrow_table()
            if data.num_rows:
                out[table] = (data, data.column(col).to_numpy())
        yield b, out


def replay(
    run: Path,
    out: Path,
    *,
    topology: Path | None = None,
    detect: DetectConfig | None = None,
    clock: dict[str, float] | None = None,
    step_s: float = 0.5,
    lag_s: float = 0.6,
    urgent_lag_s: float = 0.15,
    minutes: float | None = None,
    on_open: Callable[[float, dict[str, Any]], None] | None = None,
) -> Replayed:
    """Replay ``run`` (a `clockmesh lab scenario run` directory, or any directory with a
    ``store/``) into ``out``, which must not exist: the detector with ``detect`` (its
    topology ``topology``), the clock runner with ``clock`` (``window_s``,
    ``lateness_s``). ``on_open(seconds_since_start, row)`` is told of each anomaly as it
    opens."""
    store = run / "store"
    if not store.is_dir():
        raise ReplayError(f"{run}: no store/ (expected a `clockmesh lab scenario run` directory)")
    topology = topology or run / "topology.json"
    if not topology.is_file():
        raise ReplayError(f"{topology}: not found (the fabric's topology; give --topology)")
    if out.exists():
        raise ReplayError(f"{out}: exists (expected a new directory for the replay)")
    try:
        con = connect_views(store, only=[*TIME_COLUMNS, "hosts"])
    except FileNotFoundError as exc:
        raise ReplayError(str(exc)) from None
    with con:
        start, end = _span(run, con, store, minutes)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "store").mkdir(parents=True)
        try:
            lags = (round(lag_s * 1e9), round(urgent_lag_s * 1e9))
            config = dataclasses.replace(detect or DetectConfig(), topology_file=str(topology))
            result = _run(con, tmp / "store", config, clock or {}, (start, end), step_s, lags,
                          on_open)  # fmt: skip
            shutil.copy(topology, tmp / "topology.json")
            if (run / "truth.json").exists():  # `detector eval OUT` judges the replay
                doc = json.loads((run / "truth.json").read_text(encoding="utf-8"))
                doc["ended_ns"] = min(int(doc["ended_ns"]), end)
                doc["faults"] = [f for f in doc.get("faults", []) if int(f["start_ns"]) < end]
                doc["replayed_from"] = str(run)
                (tmp / "truth.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return result


def _run(
    con: duckdb.DuckDBPyConnection,
    into: Path,
    config: DetectConfig,
    clock_settings: dict[str, float],
    span: tuple[int, int],
    step_s: float,
    lags: tuple[int, int],
    on_open: Callable[[float, dict[str, Any]], None] | None,
) -> Replayed:
    started = time.monotonic()
    start, end = span
    now = [start]
    writer = StoreWriter(into)
    for table in ("anomalies", "owd", "clock"):  # typed even if nothing is written
        writer.ensure_placeholder(table)
    clock = ClockRunner(writer, now_ns=lambda: now[0], **clock_settings)  # type: ignore[arg-type]
    names = {int(h): str(n) for h, n in con.execute("SELECT host_id, host FROM hosts").fetchall()}
    detect = DetectRunner(writer, config, host_names=lambda: names,
                          clock_state=lambda: clock.state)  # fmt: skip
    clock.on_owd = detect.feed_owd
    result = Replayed(start, end)
    step, (lag, urgent_lag) = round(step_s * 1e9), lags
    seen: set[str] = set()
    t = start - round(WARM_UP_S * 1e9)
    pending: dict[str, list[tuple[pa.Table, np.ndarray]]] = {}

    def advance(until: int) -> None:  # passes while every row that has arrived is read
        nonlocal t
        while t + step < until:
            t += step
            now[0] = t
            batch = _arrived(pending, t - lag, t - urgent_lag)
            if batch:
                clock.feed({k: v for k, v in batch.items() if k in CLOCK_TABLES})
                detect.feed(batch)
            clock.step()
            detect.step(t)
            result.passes += 1
            for row in detect.live()["open"]:
                if row["anomaly_id"] not in seen:
                    seen.add(row["anomaly_id"])
                    result.opened.append(row)
                    if on_open is not None:
                        on_open((t - start) / 1e9, row)

    # a pass takes rows up to its time less a lag: every such row must have been read
    for read_to, chunk in _chunks(con, t - max(lags), end):
        for table, part in chunk.items():
            pending.setdefault(table, []).append(part)
        advance(min(read_to + min(lags), end))
    advance(end)
    result.wall_s = time.monotonic() - started
    result.rejected = detect.errors
    return result


def _arrived(
    pending: dict[str, list[tuple[pa.Table, np.ndarray]]], upto: int, urgent_upto: int
) -> dict[str, pa.Table]:
    """Take from ``pending`` every row whose time is at most ``upto`` (``urgent_upto``
    for the :data:`URGENT` tables)."""
    out: dict[str, pa.Table] = {}
    for table, parts in pending.items():
        limit = urgent_upto if table in URGENT else upto
        taken = []
        while parts:
            data, ts = parts[0]
            j = int(np.searchsorted(ts, limit, side="right"))
            if j == 0:
                break
            taken.append(data.slice(0, j))
            if j < len(ts):
                parts[0] = (data.slice(j), ts[j:])
                break
            parts.pop(0)
        if taken:
            out[table] = pa.concat_tables(taken) if len(taken) > 1 else taken[0]
    return out
