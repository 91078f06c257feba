"""The hot window: recent probes in memory, settled incrementally, queried with DuckDB.

Every group commit hands its ``probe_tx``/``probe_rx`` Arrow tables here (only the
columns the join needs are kept: no copy). Work is proportional to what arrived, never to
the whole window, so it keeps up at millions of probes per second
(docs/store.md, "Performance"):

* **settle** (each live refresh): the probe_tx rows that arrived more than ``lag_s`` ago
  are joined once with the probe_rx rows in memory; a probe without its probe_rx yet is
  kept aside and joined only with probe_rx that arrive later, until ``grace_s`` after its
  own arrival (then it is lost). The joined rows (minute, src, dst, sport, delay) wait for
  their minute's rollup; per-pair stats of the slice go to the live view.
* the **live** per-pair picture for ``/v1/live`` and ``/metrics`` combines the slices of
  the last ``live_s``: sent/received/loss and the minimum are exact; p50 is the median of
  the slices' medians and p99 the largest slice p99 (a slice is ``live_refresh_s`` of
  probes: a close, conservative estimate, and the exact figures are in the rollups);
* the per-minute rollups ``probe_minute`` (per host pair) and ``path_minute`` (per pair
  and UDP source port, i.e. ECMP path), exact quantiles over the joined rows, written once
  a minute is final (its end plus ``grace_s`` has passed on the ops box's clock).

"Raw" delay is ``rx_ns - tx_ns`` across two hosts' clocks: it contains their clock offset
until the clock solver has run (its corrected delays go to the ``owd`` table).
Minutes that began before this process started are not rolled up (their earlier part
may be missing from memory); the raw rows are in the store regardless.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics.store import layout

NS = 1_000_000_000


@dataclass
class PairLive:
    src: int
    dst: int
    sent: int
    received: int
    loss: float
    owd_raw_min_ns: float | None
    owd_raw_p50_ns: float | None
    owd_raw_p99_ns: float | None


@dataclass
class LiveSnapshot:
    generated_ns: int = 0
    window_s: float = 0.0
    pairs: list[PairLive] = field(default_factory=list)
    hot_rows: int = 0
    compute_s: float = 0.0


_TX_COLS = ["src", "dst", "seq", "sport", "tx_ns"]
_RX_COLS = ["src", "seq", "rx_ns"]
_MIN = layout.NS_PER_MINUTE
_PAIR_STATS = """
    SELECT src, dst, count(*) AS sent, count(d) AS received, min(d) AS dmin,
           quantile_cont(d, 0.5) AS p50, quantile_cont(d, 0.99) AS p99
    FROM s GROUP BY src, dst
"""


class HotWindow:
    def __init__(
        self,
        *,
        window_s: float = 150.0,
        max_rows: int = 20_000_000,
        live_s: float = 60.0,
        lag_s: float = 5.0,
        grace_s: float = 20.0,
        start_ns: int | None = None,
    ) -> None:
        self.window_s = window_s
        self.max_rows = max_rows
        self.live_s = live_s
        self.lag_s = lag_s
        self.grace_s = grace_s
        # probe_rx is needed until the last probe_tx it can match is final
        self.rx_keep_s = min(window_s, lag_s + grace_s + 10.0)
        start = time.time_ns() if start_ns is None else start_ns
        # the first minute that starts after this process did
        self.next_minute_ns = -(-start // _MIN) * _MIN
        self._lock = threading.Lock()  # add() runs in the commit thread, the rest in one other
        self._tx: deque[tuple[int, pa.Table]] = deque()  # (arrival, rows) not yet settled
        self._rx: deque[tuple[int, int, pa.Table]] = deque()  # (arrival, sequence, rows)
        self._rx_seq = 0
        self._rx_seen = 0  # probe_rx chunks up to this sequence were joined with _unmatched
        self._unmatched: pa.Table | None = None  # settled probe_tx waiting for probe_rx
        self._joined: dict[int, list[pa.Table]] = {}  # minute -> (minute, src, dst, sport, d)
        self._slices: deque[tuple[int, pa.Table]] = deque()  # (settled at, per-pair stats)
        self._rows = 0  # probe_tx + probe_rx rows held (pending, unmatched, joined)
        self.evicted_rows = 0
        self._con = duckdb.connect()  # used only by the thread that calls live()/rollup()
        self._con.execute("SET threads = 1")  # leave the other core to ingest

    def add(self, arrival_ns: int, tables: dict[str, pa.Table]) -> None:
        tx, rx = tables.get("probe_tx"), tables.get("probe_rx")
        with self._lock:
            if tx is not None and tx.num_rows:
                self._tx.append((arrival_ns, tx.select(_TX_COLS)))
                self._rows += tx.num_rows
            if rx is not None and rx.num_rows:
                self._rx_seq += 1
                self._rx.append((arrival_ns, self._rx_seq, rx.select(_RX_COLS)))
                self._rows += rx.num_rows
            self._evict()

    def _evict(self) -> None:
        """Over ``max_rows``: drop the oldest joined minute (its rollup is then partial)."""
        while self._rows > self.max_rows and self._joined:
            minute = min(self._joined)
            dropped = sum(t.num_rows for t in self._joined.pop(minute))
            self._rows -= dropped
            self.evicted_rows += dropped
        while self._rows > self.max_rows and len(self._rx) > 1:
            _, _, data = self._rx.popleft()
            self._rows -= data.num_rows
            self.evicted_rows += data.num_rows

    @property
    def rows(self) -> int:
        return self._rows

    # ---- settling ----------------------------------------------------------------------
    def settle(self, now_ns: int) -> None:
        """Join the probe_tx that became due with the probe_rx in memory (see module doc)."""
        cut = now_ns - int(self.lag_s * NS)
        final = now_ns - int(self.grace_s * NS)
        with self._lock:
            new = []
            while self._tx and self._tx[0][0] < cut:
                new.append(self._tx.popleft())
            rx_all = [(seq, data) for _, seq, data in self._rx]
        fresh = [d for seq, d in rx_all if seq > self._rx_seen]
        if rx_all:
            self._rx_seen = rx_all[-1][0]
        joined: list[pa.Table] = []
        pending: list[pa.Table] = []
        if self._unmatched is not None:
            old, self._unmatched = self._unmatched, None
            with self._lock:
                self._rows -= old.num_rows
            if fresh:  # only probe_rx that arrived since the last settle can match them
                old = self._join(old, pa.concat_tables(fresh))
            else:
                old = old.append_column("rx_ns", pa.nulls(old.num_rows, pa.int64()))
            got, wait = self._split(old, final)
            joined.append(got)
            pending.append(wait)
        if new:
            tx = pa.concat_tables(
                [d.append_column("arrival_ns", pa.array(np.full(d.num_rows, a, np.int64)))
                 for a, d in new]
            )  # fmt: skip
            with self._lock:
                self._rows -= tx.num_rows
            rx = pa.concat_tables([d for _, d in rx_all]) if rx_all else _EMPTY_RX_SLIM
            first = self._join(tx, rx)
            self._slice_stats(now_ns, first)
            got, wait = self._split(first, final)
            joined.append(got)
            pending.append(wait)
        with self._lock:  # every probe_tx that could match these has been joined now
            horizon = now_ns - int(self.rx_keep_s * NS)
            while self._rx and self._rx[0][0] < horizon:
                self._rows -= self._rx.popleft()[2].num_rows
        pending = [p for p in pending if p.num_rows]
        if pending:
            self._unmatched = pa.concat_tables(pending).drop_columns(["rx_ns"])
            with self._lock:
                self._rows += self._unmatched.num_rows
        self._keep_joined(joined)

    def _join(self, tx: pa.Table, rx: pa.Table) -> pa.Table:
        con = self._con
        con.register("t_", tx)
        con.register("r_", rx)
        try:
            return con.sql(
                "SELECT t.*, r.rx_ns FROM t_ t LEFT JOIN r_ r ON r.src = t.src AND r.seq = t.seq"
            ).to_arrow_table()
        finally:
            con.unregister("t_")
            con.unregister("r_")

    @staticmethod
    def _split(rows: pa.Table, final_ns: int) -> tuple[pa.Table, pa.Table]:
        """(matched or finally lost, still waiting for its probe_rx)."""
        has_rx = pc.is_valid(rows.column("rx_ns"))
        done = pc.or_(has_rx, pc.less(rows.column("arrival_ns"), final_ns))
        return rows.filter(done), rows.filter(pc.invert(done))

    def _keep_joined(self, parts: list[pa.Table]) -> None:
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return
        rows = pa.concat_tables(parts)
        tx_ns = rows.column("tx_ns").to_numpy()
        rx_ns = rows.column("rx_ns")
        minute = (tx_ns // _MIN) * _MIN
        delay = pc.subtract(rx_ns, rows.column("tx_ns"))
        j = pa.table(
            {
                "minute_ns": minute,
                "src": rows.column("src"),
                "dst": rows.column("dst"),
                "sport": rows.column("sport"),
                "d": delay,
            }
        )
        with self._lock:
            for m in np.unique(minute).tolist():
                if m < self.next_minute_ns:
                    continue  # began before this process, or rolled up already: late rows
                part = j.filter(pc.equal(j.column("minute_ns"), m))
                self._joined.setdefault(m, []).append(part)
                self._rows += part.num_rows
            self._evict()

    def _slice_stats(self, now_ns: int, first: pa.Table) -> None:
        con = self._con
        s = first.select(["src", "dst", "tx_ns", "rx_ns"])
        con.register("s0", s)
        try:
            stats = con.sql(
                _PAIR_STATS.replace("FROM s", "FROM (SELECT src, dst, rx_ns - tx_ns AS d FROM s0)")
            ).to_arrow_table()
        finally:
            con.unregister("s0")
        self._slices.append((now_ns, stats))
        horizon = now_ns - int(self.live_s * NS)
        while self._slices and self._slices[0][0] <= horizon:
            self._slices.popleft()

    # ---- queries -----------------------------------------------------------------------
    def live(self, now_ns: int | None = None) -> LiveSnapshot:
        """Loss and raw delay per (src, dst) over the probes settled in the last minute."""
        started = time.monotonic()
        now_ns = time.time_ns() if now_ns is None else now_ns
        self.settle(now_ns)
        pairs: list[PairLive] = []
        if self._slices:
            con = self._con
            con.register("sl", pa.concat_tables([t for _, t in self._slices]))
            try:
                rows = con.execute(
                    """
                    SELECT src, dst, sum(sent)::BIGINT, sum(received)::BIGINT, min(dmin),
                           median(p50), max(p99)
                    FROM sl GROUP BY src, dst ORDER BY src, dst
                    """
                ).fetchall()
            finally:
                con.unregister("sl")
            pairs = [
                PairLive(
                    src=src,
                    dst=dst,
                    sent=sent,
                    received=recv,
                    loss=max(0.0, 1.0 - recv / sent) if sent else 0.0,
                    owd_raw_min_ns=dmin,
                    owd_raw_p50_ns=p50,
                    owd_raw_p99_ns=p99,
                )
                for src, dst, sent, recv, dmin, p50, p99 in rows
            ]
        return LiveSnapshot(
            generated_ns=now_ns,
            window_s=self.live_s,
            pairs=pairs,
            hot_rows=self._rows,
            compute_s=time.monotonic() - started,
        )

    def rollup(self, now_ns: int | None = None) -> tuple[int, pa.Table, pa.Table] | None:
        """Rollups of every minute that became final since the last call.

        Returns (first minute index, probe_minute rows, path_minute rows), or None.
        """
        now_ns = time.time_ns() if now_ns is None else now_ns
        final_end = (now_ns - int(self.grace_s * NS)) // _MIN * _MIN
        lo = self.next_minute_ns
        if final_end <= lo:
            return None
        self.settle(now_ns)
        # probes of these minutes still waiting for their probe_rx are lost now
        if self._unmatched is not None:
            wait = self._unmatched
            late = pc.less(wait.column("tx_ns"), final_end)
            lost = wait.filter(late)
            if lost.num_rows:
                self._unmatched = wait.filter(pc.invert(late))
                with self._lock:
                    self._rows -= lost.num_rows
                self._keep_joined(
                    [lost.append_column("rx_ns", pa.nulls(lost.num_rows, pa.int64()))]
                )
        with self._lock:
            self.next_minute_ns = final_end
            parts = []
            for m in [m for m in self._joined if m < final_end]:
                for t in self._joined.pop(m):
                    parts.append(t)
                    self._rows -= t.num_rows
        j = pa.concat_tables(parts) if parts else _EMPTY_J
        con = self._con
        con.register("j", j)
        try:
            pair = con.sql(
                """
                SELECT minute_ns, src, dst, count(DISTINCT sport) AS paths,
                       count(*) AS sent, count(d) AS received, min(d) AS delay_min_ns,
                       quantile_cont(d, 0.5) AS delay_p50_ns,
                       quantile_cont(d, 0.9) AS delay_p90_ns,
                       quantile_cont(d, 0.99) AS delay_p99_ns, max(d) AS delay_max_ns,
                       avg(d) AS delay_mean_ns
                FROM j GROUP BY ALL ORDER BY minute_ns, src, dst
                """
            ).to_arrow_table()
            path = con.sql(
                """
                SELECT minute_ns, src, dst, sport::INTEGER AS sport, count(*) AS sent,
                       count(d) AS received,
                       min(d) AS delay_min_ns, quantile_cont(d, 0.5) AS delay_p50_ns,
                       quantile_cont(d, 0.99) AS delay_p99_ns, max(d) AS delay_max_ns
                FROM j GROUP BY ALL ORDER BY minute_ns, src, dst, sport
                """
            ).to_arrow_table()
        finally:
            con.unregister("j")
        pair = pair.cast(layout.TABLES["probe_minute"].schema)
        path = path.cast(layout.TABLES["path_minute"].schema)
        return lo // _MIN, pair, path


_EMPTY_RX_SLIM = layout.empty_table("probe_rx").select(_RX_COLS)
_EMPTY_J = pa.table(
    {
        "minute_ns": pa.array([], pa.int64()),
        "src": pa.array([], pa.int64()),
        "dst": pa.array([], pa.int64()),
        "sport": pa.array([], pa.uint16()),
        "d": pa.array([], pa.int64()),
    }
)
