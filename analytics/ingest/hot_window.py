"""The hot window: recent probes in memory, settled incrementally, summarised with DuckDB.

Every group commit hands its ``probe_tx``/``probe_rx`` records here (the numpy arrays
the clock runner keeps too, by reference; Arrow tables are accepted as well). Work is
proportional to what arrived, never to the whole window, so it keeps up at millions of
probes per second (docs/store.md, "Performance"):

* **settle** (each live refresh): the probe_tx rows that arrived more than ``lag_s`` ago
  are joined once (numpy, by dense (sender, seq) slots) with the probe_rx rows in
  memory; a probe without its probe_rx yet is
  kept aside and joined only with probe_rx that arrive later, until ``grace_s`` after its
  own arrival (then it is lost). The joined rows (src, dst, sport, delay), kept per
  minute, wait for their minute's rollup; per-pair stats of the slice go to the live view.
  A probe without its probe_rx goes into a slice (as lost) only once its destination
  has shipped a segment begun after it was sent, or at ``grace_s``: until then its
  probe_rx may be on its way (a large fleet ships every 30 s). With the daemon's fleet
  view, a probe sent to a host whose collector did not run then (not yet, or between
  two of its runs) counts nowhere.
* the **live** per-pair picture for ``/v1/live`` and ``/metrics`` combines the slices of
  the last ``live_s``: sent/received/loss and the minimum are exact; p50 is the median of
  the slices' medians and p99 the largest slice p99 (a slice is ``live_refresh_s`` of
  probes: a close, conservative estimate, and the exact figures are in the rollups);
* the per-minute rollups ``probe_minute`` (per host pair) and ``path_minute`` (per pair
  and UDP source port, i.e. ECMP path), exact quantiles over the joined rows
  (:func:`rollup_minute`), written once a minute is final (its end plus ``grace_s`` has
  passed on the ops box's clock).

"Raw" delay is ``rx_ns - tx_ns`` across two hosts' clocks: it contains their clock offset
until the clock solver has run (its corrected delays go to the ``owd`` table).
Minutes that began before this process started are not rolled up (their earlier part
may be missing from memory); the raw rows are in the store regardless.

Over 500 lines: settling, the live picture and the rollups share one state (slots, minutes).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics.clock import probe_samples
from analytics.clock.key_index import KeyIndex, dense_ids
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


_NEVER = np.iinfo(np.int64).max  # a destination not known to run: since never
# A probe's probe_rx is in a segment its destination began at most one drain (~0.45 s)
# after the probe was sent; its tx_ns is the sender's clock, created_ns the receiver's
HEARD_MARGIN_NS = 1_000_000_000
_TX_FIELDS = ("src", "dst", "seq", "sport", "tx_ns")
_RX_FIELDS = ("src", "seq", "rx_ns")
_MIN = layout.NS_PER_MINUTE
# Quantiles in the list form: one sorted state per group for all of them (one
# ``quantile_cont`` per fraction keeps and sorts a copy of the group's values for each).
_PAIR_STATS = """
    SELECT src, dst, sent, received, dmin, q[1] AS p50, q[2] AS p99
    FROM (SELECT src, dst, count(*) AS sent, count(d) AS received, min(d) AS dmin,
                 quantile_cont(d, [0.5, 0.99]) AS q
          FROM s_ GROUP BY src, dst)
"""
# The live picture from the slices of the last live_s (see the module docstring).
_LIVE = """
    SELECT src, dst, sum(sent)::BIGINT AS sent, sum(received)::BIGINT AS received,
           min(dmin)::DOUBLE AS dmin, median(p50)::DOUBLE AS p50, max(p99)::DOUBLE AS p99,
           greatest(0.0, 1.0 - sum(received) / sum(sent))::DOUBLE AS loss
    FROM sl GROUP BY src, dst ORDER BY src, dst
"""
# A final minute's rollups: per path (src, dst, sport) in one pass; per pair only what
# needs the pair's own values (its quantiles and mean), the rest summed from its paths
# (the pair's count(DISTINCT sport) alone cost as much as its quantiles).
_PATH_ROLLUP = """
    SELECT src, dst, sport::INTEGER AS sport, sent, received, delay_min_ns,
           q[1] AS delay_p50_ns, q[2] AS delay_p99_ns, delay_max_ns
    FROM (SELECT src, dst, sport, count(*) AS sent, count(d) AS received,
                 min(d) AS delay_min_ns, quantile_cont(d, [0.5, 0.99]) AS q,
                 max(d) AS delay_max_ns
          FROM j GROUP BY ALL)
    ORDER BY src, dst, sport
"""
_PAIR_ROLLUP = """
    SELECT src, dst, q[1] AS delay_p50_ns, q[2] AS delay_p90_ns, q[3] AS delay_p99_ns,
           delay_mean_ns
    FROM (SELECT src, dst, quantile_cont(d, [0.5, 0.9, 0.99]) AS q, avg(d) AS delay_mean_ns
          FROM j GROUP BY ALL)
    ORDER BY src, dst
"""

# collector records (``records.TABLES``) or store-schema Arrow
Rows: TypeAlias = np.ndarray | pa.Table
Cols: TypeAlias = dict[str, np.ndarray]  # columns of equal length


class HotWindow:
    def __init__(
        self,
        *,
        window_s: float = 150.0,
        max_rows: int = 20_000_000,
        max_bytes: int = 4 << 30,
        live_s: float = 60.0,
        lag_s: float = 5.0,
        grace_s: float = 20.0,
        start_ns: int | None = None,
        listening: Callable[[], Mapping[int, object]] | None = None,
    ) -> None:
        """``listening``: the hosts whose collector is known to run, by host id, each with
        ``since_ns`` (the daemon's fleet view). With it, a probe that never arrived counts
        as sent (and lost) only if its destination was known to run when it was sent: a
        collector starting, or not deployed yet, is no loss on the fabric.

        ``max_rows``/``max_bytes``: what the window may hold (the daemon passes its share
        of ``memory_budget_bytes``); past either, the oldest rows go first (:meth:`_evict`,
        counted in :attr:`evicted_rows`), so it is exceeded by at most one commit."""
        self.window_s = window_s
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.live_s = live_s
        self.lag_s = lag_s
        self.grace_s = grace_s
        self._listening = listening
        # probe_rx is needed until the last probe_tx it can match is final
        self.rx_keep_s = min(window_s, lag_s + grace_s + 10.0)
        start = time.time_ns() if start_ns is None else start_ns
        # the first minute that starts after this process did
        self.next_minute_ns = -(-start // _MIN) * _MIN
        self._lock = threading.Lock()  # add() runs in the commit thread, the rest in one other
        self._tx: deque[tuple[int, Rows]] = deque()  # (arrival, rows) not yet settled
        # probe_rx not matched yet: (arrival, rows) as added, or columns with "arrival"
        self._rx: deque[tuple[int, Rows] | Cols] = deque()
        self._unmatched: Cols | None = None  # settled probe_tx waiting for probe_rx
        self._joined: dict[int, list[pa.Table]] = {}  # minute -> (src, dst, sport, d)
        self._slices: deque[tuple[int, pa.Table]] = deque()  # (settled at, per-pair stats)
        self._rows = 0  # probe_tx + probe_rx rows held (pending, unmatched, joined)
        self._bytes = 0  # their bytes
        self.evicted_rows = 0
        self._con = duckdb.connect()  # used only by the thread that calls live()/rollup()
        self._con.execute("SET threads = 1")  # leave the other core to ingest
        # every output the live view and the rollups read is grouped/ordered explicitly
        self._con.execute("SET preserve_insertion_order = false")

    def set_grace(self, grace_s: float) -> None:
        """A new ``grace_s`` (the daemon raises it when collectors ship longer segments:
        a probe's partner row can then arrive up to one segment interval later)."""
        with self._lock:
            self.grace_s = grace_s
            self.rx_keep_s = min(self.window_s, self.lag_s + grace_s + 10.0)

    def add(self, arrival_ns: int, tables: Mapping[str, Rows]) -> None:
        """Queue a commit's ``probe_tx``/``probe_rx`` (O(1): kept as they are, columns
        are taken in :meth:`settle`). Numpy records are kept by reference: the caller
        must not change them afterwards (the daemon hands fresh arrays)."""
        with self._lock:
            for name in ("probe_tx", "probe_rx"):
                data = tables.get(name)
                if data is None or not _len(data):
                    continue
                (self._tx if name == "probe_tx" else self._rx).append((arrival_ns, data))
                self._rows += _len(data)
                self._bytes += data.nbytes
            self._evict()

    def _over(self) -> bool:
        return self._rows > self.max_rows or self._bytes > self.max_bytes

    def _evict(self) -> None:
        """Over ``max_rows`` or ``max_bytes``: drop the oldest joined minute (its rollup is
        then partial), then the oldest probe_tx not settled yet, those waiting for their
        probe_rx, and last the oldest probe_rx (the probes are then missing from the live
        picture and the rollups; the store has them). probe_tx go before probe_rx: a
        probe_tx whose probe_rx was dropped would count as lost."""
        while self._over() and self._joined:
            parts = self._joined.pop(min(self._joined))
            self._drop(sum(t.num_rows for t in parts), sum(t.nbytes for t in parts))
        while self._over() and self._tx:
            item = self._tx.popleft()
            self._drop(_item_len(item), _item_bytes(item))
        if self._over() and self._unmatched is not None:
            self._drop(len(self._unmatched["src"]), _cols_bytes(self._unmatched))
            self._unmatched = None
        while self._over() and self._rx:
            rx = self._rx.popleft()
            self._drop(_item_len(rx), _item_bytes(rx))

    def _drop(self, rows: int, nbytes: int) -> None:
        self._rows -= rows
        self._bytes -= nbytes
        self.evicted_rows += rows

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held (pending, unmatched, joined)."""
        return self._bytes

    # ---- settling ----------------------------------------------------------------------
    def settle(self, now_ns: int) -> None:
        """Join the probe_tx that became due with the probe_rx not matched yet.

        One join per call, in numpy without sorting (the clock solver's dense
        (sender, seq) slots: :class:`~analytics.clock.probe_samples.SeqLayout`), then
        masks split its result: matched pairs leave memory (to the minute they belong
        to), probe_tx still without probe_rx wait until ``grace_s`` after their arrival,
        probe_rx without probe_tx (the sender's batch is later) wait up to ``rx_keep_s``.
        Memory and work follow the arrival rate, not the window length.
        """
        cut = now_ns - int(self.lag_s * NS)
        final = now_ns - int(self.grace_s * NS)
        rx_horizon = now_ns - int(self.rx_keep_s * NS)
        with self._lock:
            new = []
            while self._tx and self._tx[0][0] < cut:
                new.append(self._tx.popleft())
            rx_items = list(self._rx)
            self._rx.clear()
            self._rows -= sum(_len(d) for _, d in new) + sum(_item_len(r) for r in rx_items)
            self._bytes -= sum(d.nbytes for _, d in new) + sum(_item_bytes(r) for r in rx_items)
            old, self._unmatched = self._unmatched, None
            if old is not None:
                self._rows -= len(old["src"])
                self._bytes -= _cols_bytes(old)
        rx = _gather(rx_items, _RX_FIELDS) if rx_items else None
        if old is None and not new:
            if rx is not None:
                self._put_back(_take(rx, rx["arrival"] >= rx_horizon, drop=("new",)), None)
            return
        tx = _gather(([] if old is None else [old]) + new, _TX_FIELDS)
        rx_ns = _match(tx, rx)  # per probe_tx: its rx_ns, _NONE where no probe_rx yet
        has_rx = rx_ns != _NONE
        d = rx_ns - tx["tx_ns"]  # meaningful where has_rx (null elsewhere)
        # None: every probe counts / is decided
        counted, decided = self._missing(tx, has_rx, final)
        # "new": not in a live slice yet (arrived since the last settle, or kept aside
        # undecided); it goes into this one once decided and counted
        fresh = tx["new"]
        if counted is not None:
            fresh = fresh & counted
        if decided is not None:
            fresh = fresh & decided
        everything = old is None and counted is None and decided is None
        if everything:
            self._slice(now_ns, tx["src"], tx["dst"], _nullable(d, has_rx))
        elif fresh.any():
            self._slice(
                now_ns, tx["src"][fresh], tx["dst"][fresh], _nullable(d[fresh], has_rx[fresh])
            )
        horizon = now_ns - int(self.live_s * NS)
        while self._slices and self._slices[0][0] <= horizon:
            self._slices.popleft()
        # matched, or lost for good: to their minute's rollup
        done = has_rx | (tx["arrival"] < final)
        # lost to no listener: out of the rollups as well
        done_counted = done if counted is None else done & counted
        minute = tx["tx_ns"] // _MIN * _MIN
        for m in _distinct_runs(minute).tolist():
            if m < self.next_minute_ns:
                continue  # began before this process, or rolled up already: late rows
            sel = done_counted & (minute == m)
            if not sel.any():
                continue
            part = _joined_part(
                tx["src"][sel], tx["dst"][sel], tx["sport"][sel], _nullable(d[sel], has_rx[sel])
            )
            with self._lock:
                self._joined.setdefault(m, []).append(part)
                self._rows += part.num_rows
                self._bytes += part.nbytes
        waiting = ~has_rx & (tx["arrival"] >= final)
        wait = _take(tx, waiting, drop=("new",))
        # kept aside undecided: still to go into a live slice (the rest are in one already,
        # or count nowhere)
        if decided is None:
            wait["new"] = np.zeros(len(wait["src"]), bool)
        else:
            # (whether it counts is judged once decided: what says so may not be here)
            wait["new"] = (tx["new"] & ~decided)[waiting]
        rx_left = None
        if rx is not None:
            rx_left = _take(
                rx, ~rx["matched"] & (rx["arrival"] >= rx_horizon), drop=("matched", "new")
            )
        self._put_back(rx_left, wait if len(wait["src"]) else None)

    def _missing(
        self, tx: Cols, has_rx: np.ndarray, final: int
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per probe_tx, for the probes not arrived (yet), from their destinations' state
        in the daemon's fleet view (one lookup per destination); (None, None) when every
        probe counts and is decided (no fleet view, or nothing missing).

        ``counted``: False where the destination's collector was not known to run when
        the probe was sent (unknown yet, started later, or between two of its runs:
        ``deaf``). ``decided``: False where the destination has shipped nothing begun
        since the probe was sent (plus :data:`HEARD_MARGIN_NS`) and ``final`` is not
        reached: its probe_rx may be on its way — a collector ships every ``roll_s``, 30 s
        on a large fleet, and a 5-s ``lag_s`` would call most probes lost. Decided once
        the destination's newest segment began later (it ships oldest first: the
        probe_rx would have come with it or before)."""
        lost = ~has_rx
        if self._listening is None or not lost.any():
            return None, None
        hosts = self._listening()
        inv, uniq = dense_ids(tx["dst"][lost])  # (np.unique sorts: ~2 s for 10 M rows)
        states = [hosts.get(int(h)) for h in uniq.tolist()]
        since = np.fromiter((getattr(h, "since_ns", _NEVER) for h in states), np.int64, len(uniq))
        newest = np.fromiter((getattr(h, "newest_ns", 0) for h in states), np.int64, len(uniq))
        tx_ns = tx["tx_ns"][lost]
        ok = tx_ns >= since[inv]
        # between two runs of its collector (a restart, a redeploy) nobody listened:
        # per destination its gaps as columns (a whole fleet redeployed: every host has
        # one), each row checked against its destination's, O(rows x gaps)
        deaf = [getattr(h, "deaf", ()) for h in states]
        width = max(map(len, deaf), default=0)
        if width:
            a = np.zeros((len(uniq), width), np.int64)
            b = np.zeros((len(uniq), width), np.int64)
            for i, gaps in enumerate(deaf):
                for j, (lo, hi) in enumerate(gaps):
                    a[i, j], b[i, j] = lo, hi
            for j in range(width):
                ok &= ~((tx_ns >= a[inv, j]) & (tx_ns < b[inv, j]))
        counted = np.ones(len(has_rx), bool)
        counted[lost] = ok
        decided = np.ones(len(has_rx), bool)
        decided[lost] = (tx["arrival"][lost] < final) | (tx_ns + HEARD_MARGIN_NS < newest[inv])
        return counted, decided

    def _slice(self, now_ns: int, src: np.ndarray, dst: np.ndarray, d: pa.Array) -> None:
        """Probes settled now (``d`` null: lost) into the live view, as per-pair stats."""
        s_ = pa.table({"src": src, "dst": dst, "d": d})
        (stats,) = query_over(self._con, "s_", s_, _PAIR_STATS)
        self._slices.append((now_ns, stats))

    def _put_back(self, rx_left: Cols | None, wait: Cols | None) -> None:
        with self._lock:
            if rx_left is not None and len(rx_left["src"]):
                self._rx.appendleft(rx_left)
                self._rows += len(rx_left["src"])
                self._bytes += _cols_bytes(rx_left)
            if wait is not None:
                self._unmatched = wait
                self._rows += len(wait["src"])
                self._bytes += _cols_bytes(wait)
            self._evict()

    # ---- queries -----------------------------------------------------------------------
    def live(self, now_ns: int | None = None) -> LiveSnapshot:
        """Loss and raw delay per (src, dst) over the probes settled in the last minute."""
        started = time.monotonic()
        now_ns = time.time_ns() if now_ns is None else now_ns
        self.settle(now_ns)
        table = None
        if self._slices:
            (table,) = query_over(
                self._con, "sl", pa.concat_tables([t for _, t in self._slices]), _LIVE
            )
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
        minutes: dict[int, list[pa.Table]] = {}
        lost = None
        with self._lock:
            # probes of these minutes still waiting for their probe_rx are lost now
            wait = self._unmatched
            if wait is not None:
                late = wait["tx_ns"] < final_end
                if late.any():
                    rest = _take(wait, ~late)
                    self._unmatched = rest if len(rest["src"]) else None
                    self._rows -= int(np.count_nonzero(late))
                    self._bytes -= _cols_bytes(wait) - _cols_bytes(rest)
                    lost = _take(wait, late)
            self.next_minute_ns = final_end
            for m in [m for m in self._joined if m < final_end]:
                parts = self._joined.pop(m)
                self._rows -= sum(t.num_rows for t in parts)
                self._bytes -= sum(t.nbytes for t in parts)
                minutes.setdefault(m, []).extend(parts)
        if lost is not None and len(lost["src"]):
            self._lost_at_rollup(now_ns, lost, lo, minutes)
        pairs, paths = [], []
        for m in sorted(minutes):
            pair, path = rollup_minute(self._con, m, _concat(minutes.pop(m)))
            pairs.append(pair)
            paths.append(path)
        pair_schema = layout.TABLES["probe_minute"].schema
        path_schema = layout.TABLES["path_minute"].schema
        return (
            lo // _MIN,
            pa.concat_tables(pairs) if pairs else pair_schema.empty_table(),
            pa.concat_tables(paths) if paths else path_schema.empty_table(),
        )

    def _lost_at_rollup(
        self, now_ns: int, lost: Cols, lo: int, minutes: dict[int, list[pa.Table]]
    ) -> None:
        """Probes still without probe_rx when their minute became final (their sender's
        segment came late): lost, as settle() would judge them — not where their
        destination's collector was not running when they were sent — into the rollups
        of the minutes from ``lo`` on, and into the live view where they were not yet
        (undecided until now)."""
        counted, _ = self._missing(lost, np.zeros(len(lost["src"]), bool), final=0)
        if counted is not None:
            lost = _take(lost, counted)
        fresh = lost["new"]
        if fresh.any():
            n = int(np.count_nonzero(fresh))
            self._slice(now_ns, lost["src"][fresh], lost["dst"][fresh], pa.nulls(n, pa.int64()))
        lost_minute = lost["tx_ns"] // _MIN * _MIN
        for m in np.unique(lost_minute[lost_minute >= lo]).tolist():
            sel = lost_minute == m
            n = int(np.count_nonzero(sel))
            minutes.setdefault(m, []).append(
                _joined_part(
                    lost["src"][sel], lost["dst"][sel], lost["sport"][sel], pa.nulls(n, pa.int64())
                )
            )


def rollup_minute(
    con: duckdb.DuckDBPyConnection, minute_ns: int, j: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """``probe_minute`` and ``path_minute`` rows of one minute's joined rows ``j`` (src,
    dst, sport, d: the delay, null for a probe lost), exact quantiles (``quantile_cont``).

    Per path in one grouped pass; per pair only what needs the pair's own values (its
    quantiles and mean); its path count, counts and extremes follow from its paths.
    """
    path, pair = query_over(con, "j", j, _PATH_ROLLUP, _PAIR_ROLLUP)
    # the pairs' counts and extremes from their paths (both outputs ordered by src, dst)
    src = path.column("src").to_numpy()
    dst = path.column("dst").to_numpy()
    heads = np.empty(0, np.intp)
    if len(src):
        new_pair = np.concatenate(([True], (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])))
        heads = np.flatnonzero(new_pair)
    if not (
        np.array_equal(src[heads], pair.column("src").to_numpy())
        and np.array_equal(dst[heads], pair.column("dst").to_numpy())
    ):
        raise RuntimeError("path and pair rollups disagree on the pairs")
    received = path.column("received").to_numpy()
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    dmin = pc.fill_null(path.column("delay_min_ns"), big).to_numpy()
    dmax = pc.fill_null(path.column("delay_max_ns"), small).to_numpy()
    pair_received = _reduce_runs(np.add, received, heads)
    pair_has = pair_received > 0
    n = len(heads)
    columns = {
        "minute_ns": _const(minute_ns, pa.int64(), n),
        "src": pair.column("src"),
        "dst": pair.column("dst"),
        "paths": pa.array(np.diff(np.append(heads, len(src))), pa.int64()),
        "sent": pa.array(_reduce_runs(np.add, path.column("sent").to_numpy(), heads), pa.int64()),
        "received": pa.array(pair_received, pa.int64()),
        "delay_min_ns": _nullable(_reduce_runs(np.minimum, dmin, heads), pair_has),
        "delay_p50_ns": pair.column("delay_p50_ns"),
        "delay_p90_ns": pair.column("delay_p90_ns"),
        "delay_p99_ns": pair.column("delay_p99_ns"),
        "delay_max_ns": _nullable(_reduce_runs(np.maximum, dmax, heads), pair_has),
        "delay_mean_ns": pair.column("delay_mean_ns"),
    }
    pair_table = pa.table(columns).cast(layout.TABLES["probe_minute"].schema)
    path = path.add_column(0, "minute_ns", _const(minute_ns, pa.int64(), path.num_rows))
    return pair_table, path.cast(layout.TABLES["path_minute"].schema)


def query_over(
    con: duckdb.DuckDBPyConnection, name: str, data: pa.Table, *queries: str
) -> list[pa.Table]:
    """The results of ``queries`` with ``data`` registered as view ``name`` meanwhile."""
    con.register(name, data)
    try:
        return [con.sql(q).to_arrow_table() for q in queries]
    finally:
        con.unregister(name)


# ---- columns -------------------------------------------------------------------------------
def _len(data: Rows) -> int:
    return len(data) if isinstance(data, np.ndarray) else data.num_rows


def _item_len(item: tuple[int, Rows] | Cols) -> int:
    """Rows of a queued item: ``(arrival, rows)`` as added, or columns kept by a settle."""
    return len(item["src"]) if isinstance(item, dict) else _len(item[1])


def _item_bytes(item: tuple[int, Rows] | Cols) -> int:
    return _cols_bytes(item) if isinstance(item, dict) else item[1].nbytes


def _cols_bytes(cols: Cols) -> int:
    return sum(c.nbytes for c in cols.values())


def _take(cols: Cols, mask: np.ndarray, drop: tuple[str, ...] = ()) -> Cols:
    """The rows of ``mask`` (no copy when that is every row; one scan of the mask when
    it is a few)."""
    keep = [k for k in cols if k not in drop]
    n = len(mask)
    picked = int(np.count_nonzero(mask))
    if picked == n:
        return {k: cols[k] for k in keep}
    if picked < n // 4:
        idx = np.flatnonzero(mask)
        return {k: cols[k].take(idx) for k in keep}
    return {k: cols[k][mask] for k in keep}


_DTYPES = {"src": np.int64, "dst": np.int64, "seq": np.int64, "sport": np.uint16,
           "tx_ns": np.int64, "rx_ns": np.int64}  # fmt: skip


def _gather(items: list, names: tuple[str, ...]) -> Cols:
    """One set of columns (``names`` + ``arrival`` + ``new``) from queued items: columns
    kept from an earlier settle (``new`` False) or ``(arrival, rows)`` as added (``new``
    True). Each field is copied once, straight into its place (no per-item columns
    joined afterwards)."""
    sizes = [_item_len(it) for it in items]
    total = sum(sizes)
    out = {name: np.empty(total, _DTYPES[name]) for name in names}
    targets = [out[name] for name in names]
    out["arrival"] = np.empty(total, np.int64)
    out["new"] = np.empty(total, bool)
    pos = 0
    for it, n in zip(items, sizes, strict=True):
        end = pos + n
        if isinstance(it, dict):
            for name in names:
                out[name][pos:end] = it[name]
            out["arrival"][pos:end] = it["arrival"]
            out["new"][pos:end] = it.get("new", False)
        else:
            arrival, data = it
            if isinstance(data, np.ndarray):  # the fields copied straight into place
                probe_samples.columns(data, names, out=targets, at=pos)
            else:  # Arrow: numpy views of its columns (seq is uint64 there)
                for name in names:
                    col = data.column(name).to_numpy()
                    out[name][pos:end] = col.view(np.int64) if col.dtype == np.uint64 else col
            out["arrival"][pos:end] = arrival
            out["new"][pos:end] = True
        pos = end
    return out


def _match(tx: Cols, rx: Cols | None) -> np.ndarray:
    """Each probe_tx row's ``rx_ns`` (``_NONE`` where no probe_rx matches); marks the
    probe_rx rows that matched in ``rx["matched"]``. Key (src, seq): a dense slot per
    (sender, seq) over the senders' seq ranges (O(n) scatter/gather; a sparse range,
    e.g. a collector restart, falls back to a sorted table inside ``SlotValues``)."""
    n = len(tx["src"])
    out = np.full(n, _NONE, np.int64)
    if rx is None:
        return out
    hosts = probe_samples.hosts_in(tx["src"])
    index = KeyIndex(hosts)
    t_host = probe_samples.host_index_of(index, tx["src"])
    seq_layout = probe_samples.SeqLayout(t_host, tx["seq"], len(hosts))
    slots = probe_samples.SlotValues(
        seq_layout, seq_layout.own_position(t_host, tx["seq"]), np.arange(n, dtype=np.int64)
    )
    r_host = probe_samples.host_index_of(index, rx["src"])
    row = slots.get(seq_layout.position(r_host, rx["seq"]))
    hit = row >= 0
    rx["matched"] = hit
    out[row[hit]] = rx["rx_ns"][hit]
    return out


def _nullable(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    return pa.array(values, type=pa.int64(), mask=~valid)


def _distinct_runs(values: np.ndarray) -> np.ndarray:
    """Distinct values of a column whose equal values come in runs (sorted)."""
    if len(values) == 0:
        return values
    heads = np.concatenate(([0], np.flatnonzero(values[1:] != values[:-1]) + 1))
    return np.unique(values[heads])


def _const(value: object, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` times ``value`` in Arrow's pool."""
    return pa.repeat(pa.scalar(value, type_), n)


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Concatenate chunks whose columns differ only in nullability (store vs query output)."""
    return pa.concat_tables(tables, promote_options="permissive")


_NONE = np.iinfo(np.int64).min


def _joined_part(src: np.ndarray, dst: np.ndarray, sport: np.ndarray, d: pa.Array) -> pa.Table:
    """Joined rows waiting for their minute's rollup (the minute is the dict key)."""
    return pa.table({"src": src, "dst": dst, "sport": sport.astype(np.uint16, copy=False), "d": d})


def _reduce_runs(ufunc: np.ufunc, values: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """``ufunc`` reduced over each run of ``values`` that starts at ``heads`` (none: empty)."""
    return ufunc.reduceat(values, heads) if len(heads) else values[:0]
