"""The hot window: the last minutes of probes, in memory, queried with an in-process DuckDB.

Every group commit hands its ``probe_tx``/``probe_rx`` Arrow tables here (the same
tables it just wrote to Parquet, so there is no extra copy). DuckDB scans them in place
(Arrow registration is zero-copy) to compute

* the live per-pair picture for ``/v1/live`` and ``/metrics`` (loss and raw one-way delay
  percentiles over the last minute), and
* the per-minute rollups ``probe_minute`` (per host pair) and ``path_minute`` (per pair
  and UDP source port, i.e. ECMP path), written to the store once a minute is final
  (its end plus ``grace_s`` has passed on the ops box's clock).

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
import pyarrow as pa

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


_EMPTY_TX = layout.empty_table("probe_tx")
_EMPTY_RX = layout.empty_table("probe_rx")


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
        start = time.time_ns() if start_ns is None else start_ns
        # the first minute that starts after this process did
        self.next_minute_ns = -(-start // layout.NS_PER_MINUTE) * layout.NS_PER_MINUTE
        self._chunks: deque[tuple[int, str, pa.Table]] = deque()
        self._rows = 0
        self._lock = threading.Lock()
        self.evicted_rows = 0
        self._con = duckdb.connect()  # used only by the thread that calls live()/rollup()

    def add(self, arrival_ns: int, tables: dict[str, pa.Table]) -> None:
        with self._lock:
            for name in ("probe_tx", "probe_rx"):
                data = tables.get(name)
                if data is not None and data.num_rows:
                    self._chunks.append((arrival_ns, name, data))
                    self._rows += data.num_rows
            self._evict(arrival_ns)

    def _evict(self, now_ns: int) -> None:
        horizon = now_ns - int(self.window_s * NS)
        while self._chunks:
            arrival, _, data = self._chunks[0]
            if arrival >= horizon and self._rows <= self.max_rows:
                break
            self._chunks.popleft()
            self._rows -= data.num_rows
            if arrival >= horizon:  # dropped for memory, not age: rollups are partial
                self.evicted_rows += data.num_rows

    @property
    def rows(self) -> int:
        return self._rows

    def _tables(self, tx_from_ns: int, tx_to_ns: int) -> tuple[pa.Table, pa.Table]:
        with self._lock:
            chunks = list(self._chunks)
        tx = [d for t, n, d in chunks if n == "probe_tx" and tx_from_ns <= t < tx_to_ns]
        rx = [d for _, n, d in chunks if n == "probe_rx"]
        return (
            pa.concat_tables(tx) if tx else _EMPTY_TX,
            pa.concat_tables(rx) if rx else _EMPTY_RX,
        )

    def live(self, now_ns: int | None = None) -> LiveSnapshot:
        """Loss and raw delay per (src, dst) over probes that arrived in the last minute."""
        started = time.monotonic()
        now_ns = time.time_ns() if now_ns is None else now_ns
        lag = int(self.lag_s * NS)
        tx, rx = self._tables(now_ns - lag - int(self.live_s * NS), now_ns - lag)
        con = self._con
        con.register("tx", tx)
        con.register("rx", rx)
        try:
            rows = con.execute(
                """
                SELECT t.src, t.dst, count(*) AS sent, count(r.rx_ns) AS received,
                       min(r.rx_ns - t.tx_ns) AS dmin,
                       quantile_cont(r.rx_ns - t.tx_ns, 0.5) AS p50,
                       quantile_cont(r.rx_ns - t.tx_ns, 0.99) AS p99
                FROM tx t LEFT JOIN rx r ON r.src = t.src AND r.seq = t.seq
                GROUP BY t.src, t.dst ORDER BY t.src, t.dst
                """
            ).fetchall()
        finally:
            con.unregister("tx")
            con.unregister("rx")
        pairs = [
            PairLive(
                src=src,
                dst=dst,
                sent=sent,
                received=recv,
                loss=1.0 - recv / sent if sent else 0.0,
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
        final_end = (now_ns - int(self.grace_s * NS)) // layout.NS_PER_MINUTE
        final_end *= layout.NS_PER_MINUTE
        lo = self.next_minute_ns
        if final_end <= lo:
            return None
        self.next_minute_ns = final_end
        tx, rx = self._tables(0, 2**63 - 1)
        con = self._con
        con.register("tx", tx)
        con.register("rx", rx)
        try:
            con.execute(
                f"""
                CREATE OR REPLACE TEMP TABLE j AS
                SELECT (t.tx_ns // {layout.NS_PER_MINUTE}) * {layout.NS_PER_MINUTE} AS minute_ns,
                       t.src, t.dst, t.sport::INTEGER AS sport, r.rx_ns - t.tx_ns AS d
                FROM tx t LEFT JOIN rx r ON r.src = t.src AND r.seq = t.seq
                WHERE t.tx_ns >= {lo} AND t.tx_ns < {final_end}
                """
            )
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
                SELECT minute_ns, src, dst, sport, count(*) AS sent, count(d) AS received,
                       min(d) AS delay_min_ns, quantile_cont(d, 0.5) AS delay_p50_ns,
                       quantile_cont(d, 0.99) AS delay_p99_ns, max(d) AS delay_max_ns
                FROM j GROUP BY ALL ORDER BY minute_ns, src, dst, sport
                """
            ).to_arrow_table()
            con.execute("DROP TABLE j")
        finally:
            con.unregister("tx")
            con.unregister("rx")
        pair = pair.cast(layout.TABLES["probe_minute"].schema)
        path = path.cast(layout.TABLES["path_minute"].schema)
        return lo // layout.NS_PER_MINUTE, pair, path
