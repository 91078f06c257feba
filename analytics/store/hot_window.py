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
    """The live per-pair picture. ``table`` holds it columnar (src, dst, sent, received,
    dmin, p50, p99, loss); :attr:`pairs` builds Python objects only when asked (a large
    fleet has hundreds of thousands of pairs)."""

    generated_ns: int = 0
    window_s: float = 0.0
    table: pa.Table | None = None
    hot_rows: int = 0
    compute_s: float = 0.0
    _pairs: list[PairLive] | None = field(default=None, repr=False)

    @property
    def pair_count(self) -> int:
        return 0 if self.table is None else self.table.num_rows

    @property
    def pairs(self) -> list[PairLive]:
        if self._pairs is None:
            self._pairs = self._objects(self.table)
        return self._pairs

    def worst(self, n: int) -> list[PairLive]:
        """The ``n`` pairs with the highest loss (then highest p99), worst first."""
        if self.table is None or self.table.num_rows <= n:
            return sorted(self.pairs, key=lambda p: (-p.loss, -(p.owd_raw_p99_ns or 0)))
        loss = self.table.column("loss").to_numpy()
        p99 = pc.fill_null(self.table.column("p99"), 0.0).to_numpy()
        order = np.lexsort((-p99, -loss))[:n]
        return self._objects(self.table.take(pa.array(order)))

    @staticmethod
    def _objects(table: pa.Table | None) -> list[PairLive]:
        if table is None:
            return []
        cols = table.to_pydict()
        return [
            PairLive(
                src=src,
                dst=dst,
                sent=sent,
                received=recv,
                loss=loss,
                owd_raw_min_ns=dmin,
                owd_raw_p50_ns=p50,
                owd_raw_p99_ns=p99,
            )
            for src, dst, sent, recv, dmin, p50, p99, loss in zip(
                cols["src"], cols["dst"], cols["sent"], cols["received"], cols["dmin"],
                cols["p50"], cols["p99"], cols["loss"], strict=True,
            )
        ]  # fmt: skip


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
        self._rx: deque[pa.Table] = deque()  # probe_rx not matched yet (+ r_arrival_ns)
        self._unmatched: pa.Table | None = None  # settled probe_tx waiting for probe_rx
        self._joined: dict[int, list[pa.Table]] = {}  # minute -> (minute, src, dst, sport, d)
        self._slices: deque[tuple[int, pa.Table]] = deque()  # (settled at, per-pair stats)
        self._rows = 0  # probe_tx + probe_rx rows held (pending, unmatched, joined)
        self.evicted_rows = 0
        self._con = duckdb.connect()  # used only by the thread that calls live()/rollup()
        self._con.execute("SET threads = 1")  # leave the other core to ingest
        # keep freed blocks for the next settle instead of returning them to the kernel
        # (every settle materialises a join; re-faulting its pages cost more than the join)
        self._con.execute("SET allocator_flush_threshold = '4GB'")
        self._con.execute("SET block_allocator_memory = '1GB'")
        # the settle join's result is split by filters and every output the live view
        # and the rollups read is grouped/ordered explicitly: row order carries nothing
        self._con.execute("SET preserve_insertion_order = false")

    def set_grace(self, grace_s: float) -> None:
        """A new ``grace_s`` (the daemon raises it when collectors ship longer segments:
        a probe's partner row can then arrive up to one segment interval later)."""
        with self._lock:
            self.grace_s = grace_s
            self.rx_keep_s = min(self.window_s, self.lag_s + grace_s + 10.0)

    def add(self, arrival_ns: int, tables: dict[str, pa.Table]) -> None:
        tx, rx = tables.get("probe_tx"), tables.get("probe_rx")
        with self._lock:
            if tx is not None and tx.num_rows:
                self._tx.append((arrival_ns, tx.select(_TX_COLS)))
                self._rows += tx.num_rows
            if rx is not None and rx.num_rows:
                arrival = _const(arrival_ns, pa.int64(), rx.num_rows)
                self._rx.append(rx.select(_RX_COLS).append_column("r_arrival_ns", arrival))
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
            data = self._rx.popleft()
            self._rows -= data.num_rows
            self.evicted_rows += data.num_rows

    @property
    def rows(self) -> int:
        return self._rows

    # ---- settling ----------------------------------------------------------------------
    def settle(self, now_ns: int) -> None:
        """Join the probe_tx that became due with the probe_rx not matched yet.

        One full outer join per call, then DuckDB splits its result: matched pairs leave
        memory (to the minute they belong to), probe_tx still without probe_rx wait until
        ``grace_s`` after their arrival, probe_rx without probe_tx (the sender's batch is
        later) wait up to ``rx_keep_s``. Memory and work follow the arrival rate, not the
        window length.
        """
        cut = now_ns - int(self.lag_s * NS)
        final = now_ns - int(self.grace_s * NS)
        rx_horizon = now_ns - int(self.rx_keep_s * NS)
        with self._lock:
            new = []
            while self._tx and self._tx[0][0] < cut:
                new.append(self._tx.popleft())
            rx_chunks = list(self._rx)
            self._rx.clear()
            self._rows -= sum(d.num_rows for _, d in new) + sum(r.num_rows for r in rx_chunks)
            old, self._unmatched = self._unmatched, None
            if old is not None:
                self._rows -= old.num_rows
        parts = []
        if old is not None:
            parts.append(old.append_column("new", _const(False, pa.bool_(), old.num_rows)))
        for a, d in new:
            n = d.num_rows
            parts.append(
                d.append_column("arrival_ns", _const(a, pa.int64(), n)).append_column(
                    "new", _const(True, pa.bool_(), n)
                )
            )
        rx = _concat(rx_chunks) if rx_chunks else _EMPTY_RX_SLIM
        if not parts:
            keep = pc.greater_equal(rx.column("r_arrival_ns"), rx_horizon)
            self._put_back(rx.filter(keep), None)
            return
        con = self._con
        con.register("t_", _concat(parts))
        con.register("r_", rx)
        try:
            con.execute(
                """
                CREATE OR REPLACE TEMP TABLE o AS
                SELECT coalesce(t.src, r.src) AS src, t.dst, t.sport, t.tx_ns,
                       coalesce(t.seq, r.seq) AS seq,
                       coalesce(t.arrival_ns, r.r_arrival_ns) AS arrival_ns, t.new, r.rx_ns
                FROM t_ t FULL OUTER JOIN r_ r ON r.src = t.src AND r.seq = t.seq
                """
            )
        finally:
            con.unregister("t_")
            con.unregister("r_")
        if new:
            stats = con.sql(
                _PAIR_STATS.replace(
                    "FROM s", "FROM (SELECT src, dst, rx_ns - tx_ns AS d FROM o WHERE new)"
                )
            ).to_arrow_table()
            self._slices.append((now_ns, stats))
            horizon = now_ns - int(self.live_s * NS)
            while self._slices and self._slices[0][0] <= horizon:
                self._slices.popleft()
        # matched, or lost for good: to their minute's rollup
        done = f"tx_ns IS NOT NULL AND (rx_ns IS NOT NULL OR arrival_ns < {final})"
        minutes = con.execute(
            f"SELECT DISTINCT (tx_ns // {_MIN}) * {_MIN} FROM o WHERE {done}"
        ).fetchall()  # fmt: skip
        for (m,) in minutes:
            if m < self.next_minute_ns:
                continue  # began before this process, or rolled up already: late rows
            part = con.sql(
                f"""
                SELECT {m}::BIGINT AS minute_ns, src, dst, sport, rx_ns - tx_ns AS d FROM o
                WHERE {done} AND tx_ns >= {m} AND tx_ns < {m + _MIN}
                """
            ).to_arrow_table()
            with self._lock:
                self._joined.setdefault(m, []).append(part)
                self._rows += part.num_rows
        wait = con.sql(
            f"""
            SELECT src, dst, seq, sport, tx_ns, arrival_ns FROM o
            WHERE tx_ns IS NOT NULL AND rx_ns IS NULL AND arrival_ns >= {final}
            """
        ).to_arrow_table()
        rx_left = con.sql(
            f"""
            SELECT src, seq, rx_ns, arrival_ns AS r_arrival_ns FROM o
            WHERE tx_ns IS NULL AND arrival_ns >= {rx_horizon}
            """
        ).to_arrow_table()
        con.execute("DROP TABLE o")
        self._put_back(rx_left, wait if wait.num_rows else None)

    def _put_back(self, rx_left: pa.Table, wait: pa.Table | None) -> None:
        with self._lock:
            if rx_left.num_rows:
                self._rx.appendleft(rx_left)
                self._rows += rx_left.num_rows
            if wait is not None:
                self._unmatched = wait
                self._rows += wait.num_rows
            self._evict()

    # ---- queries -----------------------------------------------------------------------
    def live(self, now_ns: int | None = None) -> LiveSnapshot:
        """Loss and raw delay per (src, dst) over the probes settled in the last minute."""
        started = time.monotonic()
        now_ns = time.time_ns() if now_ns is None else now_ns
        self.settle(now_ns)
        table = None
        if self._slices:
            con = self._con
            con.register("sl", pa.concat_tables([t for _, t in self._slices]))
            try:
                table = con.sql(
                    """
                    SELECT src, dst, sum(sent)::BIGINT AS sent, sum(received)::BIGINT AS received,
                           min(dmin)::DOUBLE AS dmin, median(p50)::DOUBLE AS p50,
                           max(p99)::DOUBLE AS p99,
                           greatest(0.0, 1.0 - sum(received) / sum(sent))::DOUBLE AS loss
                    FROM sl GROUP BY src, dst ORDER BY src, dst
                    """
                ).to_arrow_table()
            finally:
                con.unregister("sl")
        return LiveSnapshot(
            generated_ns=now_ns,
            window_s=self.live_s,
            table=table,
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
        with self._lock:
            parts = []
            # probes of these minutes still waiting for their probe_rx are lost now
            wait = self._unmatched
            if wait is not None:
                late = pc.less(wait.column("tx_ns"), final_end)
                lost = wait.filter(late)
                if lost.num_rows:
                    rest = wait.filter(pc.invert(late))
                    self._unmatched = rest if rest.num_rows else None
                    self._rows -= lost.num_rows
                    tx_ns = lost.column("tx_ns")
                    parts.append(
                        pa.table(
                            {
                                "minute_ns": pc.multiply(pc.divide(tx_ns, _MIN), _MIN),
                                "src": lost.column("src"),
                                "dst": lost.column("dst"),
                                "sport": lost.column("sport"),
                                "d": pa.nulls(lost.num_rows, pa.int64()),
                            }
                        ).filter(pc.greater_equal(tx_ns, lo))
                    )
            self.next_minute_ns = final_end
            for m in [m for m in self._joined if m < final_end]:
                for t in self._joined.pop(m):
                    parts.append(t)
                    self._rows -= t.num_rows
        j = _concat(parts) if parts else _EMPTY_J
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


def _const(value: object, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` times ``value`` in Arrow's pool (which keeps freed pages; numpy's large
    temporaries come from fresh mmaps that fault in every page on every settle)."""
    return pa.repeat(pa.scalar(value, type_), n)


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Concatenate chunks whose columns differ only in nullability (store vs query output)."""
    return pa.concat_tables(tables, promote_options="permissive")


_EMPTY_RX_SLIM = (
    layout.empty_table("probe_rx")
    .select(_RX_COLS)
    .append_column("r_arrival_ns", pa.array([], pa.int64()))
)
_EMPTY_J = pa.table(
    {
        "minute_ns": pa.array([], pa.int64()),
        "src": pa.array([], pa.int64()),
        "dst": pa.array([], pa.int64()),
        "sport": pa.array([], pa.uint16()),
        "d": pa.array([], pa.int64()),
    }
)
