"""The ingest daemon's clock loop: buffer committed probes per window, solve, store.

After every durable group commit the daemon hands the commit's ``probe_tx``,
``probe_rx`` and ``echo`` rows to :meth:`ClockRunner.feed` (O(1): they are queued,
nothing is converted on the commit path). The daemon hands the collector's numpy
records it decoded the commit from (an array the runner may keep: no Arrow -> numpy
round trip); Arrow tables are accepted too and converted with
:func:`analytics.store.layout.arrow_to_records`.
One background thread drains that queue and buckets the records into windows
``[k·W, (k+1)·W)`` by their own time column (``tx_ns``, ``rx_ns``, ``t1_ns``: the
recording host's clock), as views of the runs of consecutive rows in one window
(collectors write in time order); a window's runs are joined once, when it is solved.

A window is *complete* once the ops-box clock is past its end plus ``lateness_s``
(collectors ship every ~1 s and are acknowledged within a commit, so 3 s covers a normal
shipping delay with margin; when the daemon advises collectors a longer segment
interval it raises this with :meth:`ClockRunner.set_min_lateness`). The thread then
solves it with :func:`analytics.clock.solve_window` (carrying
:class:`~analytics.clock.ClockState` as the prior), computes the RTT/2 baseline on the
same echoes, and writes the ``clock``
(method ``huygens`` and ``rtt2``) and ``owd`` rows as Parquet into the store's
``table/date=/hour=`` partitions with :meth:`StoreWriter.write_partitioned` (temporary
name, fsync, rename, directory fsync): ``r<window start ms>.parquet``.

Bounded: one solve at a time; when more than ``max_backlog`` complete windows wait, the
oldest are skipped (counted); rows for a window already solved or skipped are dropped as
late (counted); the rows held (windows and queue) are capped at ``max_rows`` and
``max_bytes`` (the daemon's share of ``memory_budget_bytes``): past either, the oldest
windows are skipped (counted), so the cap is exceeded by at most one commit, plus up to a
quarter of ``max_bytes`` of queue while the thread is in a solve or starved of CPU. A window's
rows are copied into memory it owns as they arrive (the one copy its solve needs), so
the cap counts what is really held.
docs/clock.md ("In the daemon") and docs/store.md describe it.

Over 500 lines: the clock loop, its pipeline health and the /metrics families over them.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from analytics.clock import (
    ClockState,
    HostStatus,
    PairFlag,
    SolverConfig,
    WindowSolution,
    rtt2_baseline,
    rtt2_host_offsets,
    solve_window,
    store_columns,
    tune_allocator,
)
from analytics.store import layout
from analytics.store.store_writer import StoreWriter
from analytics.thread_priority import lower_thread_priority
from collector import records

log = logging.getLogger("clockmesh.ingest.clock")

# table -> (numpy record dtype, time column deciding the window)
SOURCES: dict[str, tuple[np.dtype, str]] = {
    "probe_tx": (records.PROBE_TX, "tx_ns"),
    "probe_rx": (records.PROBE_RX, "rx_ns"),
    "echo": (records.ECHO, "t1_ns"),
}
DEFAULT_LATENESS_S = 3.0
DEFAULT_MAX_BACKLOG = 4
DEFAULT_MAX_ROWS = 30_000_000
DEFAULT_MAX_BYTES = 4 << 30  # the daemon passes its share of memory_budget_bytes
FUTURE_S = 60.0  # rows stamped further ahead of the ops-box clock are dropped
_MIN_RUN = 32  # fewer rows per run on average: split by mask instead (_window_runs)


def _window_runs(rows: np.ndarray, widx: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``rows`` split by window index: (window, rows) per run of consecutive rows in one
    window, as views (no copy; a window's runs are concatenated once, when it is solved).

    A collector writes its records in time order, so a commit of S-second segments from
    H hosts has about H·(S/W + 1) runs. Rows in no particular order (more than one run
    per ``_MIN_RUN`` rows) are split with one mask per window instead, copying."""
    cut = np.flatnonzero(widx[1:] != widx[:-1]) + 1
    if len(cut) > len(rows) // _MIN_RUN:
        return [(int(w), rows[widx == w]) for w in np.unique(widx)]
    bounds = [0, *cut.tolist(), len(rows)]
    wins = widx[bounds[:-1]].tolist()
    return [(w, rows[a:b]) for w, a, b in zip(wins, bounds[:-1], bounds[1:], strict=True)]


def _rows(data: pa.Table | np.ndarray) -> int:
    return len(data) if isinstance(data, np.ndarray) else data.num_rows


class _Rows:
    """One table's rows of one window, copied into memory the window owns as they arrive
    (the one copy the solver's joined array needs anyway): the commit's records are then
    free as soon as the hot window and the detector are done with them, and what the
    window holds is exactly its ``nbytes`` (views would keep every commit array a window
    took a run from alive until that window is solved: ~a segment interval of commits)."""

    __slots__ = ("buf", "n")

    def __init__(self, dtype: np.dtype, expect: int) -> None:
        # sized for what this table's last window held: pages are faulted in only as
        # rows are written, so the spare capacity costs address space, not memory
        self.buf = np.empty(max(expect + expect // 8, 1024), dtype)
        self.n = 0

    def append(self, part: np.ndarray) -> None:
        end = self.n + len(part)
        if end > len(self.buf):
            grown = np.empty(max(end, 2 * len(self.buf)), self.buf.dtype)
            grown[: self.n].view(np.uint8)[:] = self.buf[: self.n].view(np.uint8)
            self.buf = grown
        # as bytes: numpy copies a structured array field by field, ~7x slower
        self.buf[self.n : end].view(np.uint8)[:] = np.ascontiguousarray(part).view(np.uint8)
        self.n = end

    @property
    def rows(self) -> np.ndarray:
        return self.buf[: self.n]


@dataclass
class _Window:
    parts: dict[str, _Rows] = field(default_factory=dict)
    rows: int = 0
    nbytes: int = 0  # of the rows held (the memory budget counts these)


@dataclass(frozen=True)
class ClockSnapshot:
    """The latest solved window, read lock-free by /v1/live and /metrics."""

    window_start_ns: int = 0
    window_end_ns: int = 0
    hosts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    offset_ns: np.ndarray = field(default_factory=lambda: np.empty(0))
    drift_ppm: np.ndarray = field(default_factory=lambda: np.empty(0))
    uncertainty_ns: np.ndarray = field(default_factory=lambda: np.empty(0))
    status: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))
    pairs: int = 0
    disagreeing_pairs: int = 0
    solve_s: float = 0.0
    noise_ns: float = 0.0


@dataclass
class WindowRecord:
    """What became of one window, for the pipeline's health (wall-clock ns)."""

    start_ns: int
    end_ns: int
    outcome: str  # solved | skipped | failed | existing
    done_ns: int  # when it was solved, skipped or failed
    due_ns: int  # its end plus the lateness then in force: the earliest it may be solved
    fed_ns: int = 0  # when its one-way delays were handed to the detector (0: not)
    judged_ns: int = 0  # end of the first detector pass that had them (0: not yet)


class PipelineHealth:
    """The last ``keep`` windows: when each was solved (or skipped) and judged.

    The clock thread adds windows; the detector thread reports each pass
    (:meth:`detector_pass`: when it took its queue, when it finished), which judges every
    window fed before it took its queue. Read by /v1/live, /metrics and the ingest
    benchmark: lag from a window's end (and from when it was due: its end plus the
    lateness, which the daemon raises to the collectors' segment interval + 2 s) to its
    solution and to its detector pass, and the age of the live picture (now minus the end
    of the newest judged window)."""

    def __init__(self, keep: int = 1024) -> None:
        self._lock = threading.Lock()
        self.windows: collections.deque[WindowRecord] = collections.deque(maxlen=keep)

    def add(self, record: WindowRecord) -> None:
        with self._lock:
            self.windows.append(record)

    def fed(self, record: WindowRecord, now_ns: int) -> None:
        with self._lock:
            record.fed_ns = now_ns

    def detector_pass(self, taken_ns: int, done_ns: int) -> None:
        """A detector pass that took its input queue at ``taken_ns`` ended at ``done_ns``."""
        with self._lock:
            for rec in reversed(self.windows):
                if rec.judged_ns:
                    break
                if rec.fed_ns and rec.fed_ns <= taken_ns:
                    rec.judged_ns = done_ns

    def summary(self, now_ns: int, since_ns: int = 0) -> dict:
        """Counts and lags (median, p99, max, seconds) over the retained windows that
        start at or after ``since_ns``; the live picture's age now."""
        with self._lock:
            recs = [r for r in self.windows if r.start_ns >= since_ns]
            judged = [r for r in self.windows if r.judged_ns]
        outcomes = collections.Counter(r.outcome for r in recs)
        solved = [r for r in recs if r.outcome == "solved"]

        def stats(lags: list[float]) -> dict:
            if not lags:
                return {"n": 0, "p50": None, "p99": None, "max": None}
            a = np.sort(np.asarray(lags))
            return {
                "n": len(a),
                "p50": round(float(np.median(a)), 3),
                "p99": round(float(a[min(len(a) - 1, int(np.ceil(0.99 * len(a))) - 1)]), 3),
                "max": round(float(a[-1]), 3),
            }

        newest = max((r.end_ns for r in judged), default=0)
        return {
            "windows": len(recs),
            **{k: outcomes.get(k, 0) for k in ("solved", "skipped", "failed", "existing")},
            "judged": sum(1 for r in solved if r.judged_ns),
            # from the window's end (includes the collectors' shipping interval) ...
            "lag_solved_s": stats([(r.done_ns - r.end_ns) / 1e9 for r in solved]),
            "lag_judged_s": stats([(r.judged_ns - r.end_ns) / 1e9 for r in solved if r.judged_ns]),
            # ... and from when it was due (end + lateness: every probe could be in)
            "lag_solved_due_s": stats([(r.done_ns - r.due_ns) / 1e9 for r in solved]),
            "lag_judged_due_s": stats(
                [(r.judged_ns - r.due_ns) / 1e9 for r in solved if r.judged_ns]
            ),
            "picture_age_s": round((now_ns - newest) / 1e9, 3) if newest else None,
        }


@dataclass
class ClockCounters:
    windows_solved: int = 0
    windows_skipped: int = 0
    windows_failed: int = 0
    windows_existing: int = 0  # already in the store (daemon restarted inside a window)
    late_rows: int = 0
    future_rows: int = 0
    dropped_rows: int = 0  # queued past max_rows/max_bytes: their windows are skipped
    skipped_memory: int = 0  # windows skipped to stay within max_rows/max_bytes
    rows_written: dict[str, int] = field(default_factory=lambda: {"clock": 0, "owd": 0})


class ClockRunner:
    """Per-window clock solving inside the ingest daemon (see the module docstring)."""

    def __init__(
        self,
        writer: StoreWriter,
        *,
        window_s: float = 2.0,
        lateness_s: float = DEFAULT_LATENESS_S,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        config: SolverConfig | None = None,
        now_ns: Callable[[], int] = time.time_ns,
        nice: int = 0,
    ) -> None:
        if window_s <= 0 or lateness_s < 0 or max_backlog < 1 or max_rows < 1 or max_bytes < 1:
            raise ValueError(
                "window_s > 0, lateness_s >= 0, max_backlog >= 1, max_rows >= 1, max_bytes >= 1"
            )
        self.writer = writer
        self.window_ns = round(window_s * 1e9)
        self.lateness_ns = round(lateness_s * 1e9)
        self._base_lateness_ns = self.lateness_ns
        self._lower_lateness: tuple[int, int] | None = None  # (lateness, from when)
        self.max_backlog = max_backlog
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.config = config or SolverConfig()
        self.now_ns = now_ns
        self.nice = nice  # added to the solver thread's nice value (thread_priority.py)
        self.state: ClockState | None = None
        self.snapshot = ClockSnapshot()
        self.counters = ClockCounters()
        self._inbox: collections.deque[dict[str, pa.Table | np.ndarray]] = collections.deque()
        self._inbox_rows = 0
        self._inbox_bytes = 0
        self._cond = threading.Condition()
        self._windows: dict[int, _Window] = {}
        self._buffered = 0
        self._buffered_bytes = 0
        self._expect: dict[str, int] = dict.fromkeys(SOURCES, 0)  # rows of the last window
        # windows up to this one lost rows that were queued past the cap: skipped
        self._incomplete_upto = -(1 << 62)
        self._watermark = -(1 << 62)  # windows <= this were solved or skipped
        self._stop = False
        self._thread: threading.Thread | None = None
        # each solved window's owd table is handed here (the daemon's detector)
        self.on_owd: Callable[[pa.Table], None] | None = None
        # per window: when solved/skipped, when judged (the detector reports its passes)
        self.pipeline = PipelineHealth()

    # ---- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        tune_allocator()
        self._thread = threading.Thread(target=self._run, name="clock", daemon=True)
        self._thread.start()

    def set_min_lateness(self, seconds: float) -> None:
        """Wait at least ``seconds`` after a window's end before solving it (never less
        than the configured ``lateness_s``). The daemon calls it when it advises
        collectors a longer segment interval: a probe's TX row and its RX row then
        arrive up to one interval apart, and a window solved before both are in would
        lose its pairs. A shorter interval takes effect one current lateness later:
        collectors switch at their next roll, so segments of the old length are still
        in flight until then."""
        new = max(self._base_lateness_ns, round(seconds * 1e9))
        if new >= self.lateness_ns:
            self.lateness_ns = new
            self._lower_lateness = None
        else:
            self._lower_lateness = (new, self.now_ns() + self.lateness_ns)

    def _lateness_now(self, now: int) -> int:
        pending = self._lower_lateness
        if pending is not None and now >= pending[1]:
            self.lateness_ns = pending[0]
            self._lower_lateness = None
        return self.lateness_ns

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- commit thread ---------------------------------------------------------------
    def feed(self, tables: Mapping[str, pa.Table | np.ndarray]) -> None:
        """Queue a durable commit's rows (called on the commit path: O(1)).

        Per table either the collector's numpy records (``records.TABLES[table]``
        dtype; the runner keeps the array, so the caller must not reuse its memory)
        or an Arrow table of the store schema (converted in the clock thread)."""
        mine = {t: d for t, d in tables.items() if t in SOURCES and _rows(d)}
        if not mine:
            return
        for t, d in mine.items():
            if isinstance(d, np.ndarray) and d.dtype != SOURCES[t][0]:
                raise TypeError(f"{t}: expected records of dtype {SOURCES[t][0]}, got {d.dtype}")
        rows = sum(_rows(d) for d in mine.values())
        nbytes = sum(d.nbytes for d in mine.values())
        with self._cond:
            # the clock thread keeps queue + windows within max_bytes between its solves
            # (_within_budget); a quarter more is for the queue while it is in one
            if (
                self._inbox_rows + rows > self.max_rows
                or self._buffered_bytes + self._inbox_bytes + nbytes
                > self.max_bytes + self.max_bytes // 4
            ):
                # these rows are not kept, so no window they may belong to (any up to
                # now) is solved: it would be short of them
                self.counters.dropped_rows += rows
                self._incomplete_upto = self.now_ns() // self.window_ns
                return
            self._inbox.append(mine)
            self._inbox_rows += rows
            self._inbox_bytes += nbytes
            self._cond.notify()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of rows held for windows not solved yet (the queue not counted)."""
        return self._buffered_bytes

    # ---- worker ------------------------------------------------------------------------
    def _run(self) -> None:
        lower_thread_priority(self.nice)
        while True:
            with self._cond:
                if not self._stop and not self._inbox:
                    self._cond.wait(0.25)
                if self._stop:
                    return
            try:
                self.step()
            except Exception:  # keep solving later windows; the daemon keeps serving
                log.exception("event=clock_runner_failed")
                time.sleep(1.0)

    def step(self) -> int:
        """Drain the queue, then solve every complete window (oldest first, bounded
        backlog). Returns the number of windows solved. The worker thread calls this;
        tests call it directly."""
        self._drain()
        solved = 0
        while True:
            w = self._next_complete()
            if w is None:
                return solved
            self._solve(w, self._windows.pop(w))
            solved += 1
            self._drain()

    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._inbox:
                    return
                tables = self._inbox.popleft()
                self._inbox_rows -= sum(_rows(d) for d in tables.values())
                self._inbox_bytes -= sum(d.nbytes for d in tables.values())
            for name, data in tables.items():
                rows = data if isinstance(data, np.ndarray) else layout.arrow_to_records(name, data)
                self._bucket(name, rows)
            self._within_budget()

    def _within_budget(self) -> None:
        """Past ``max_rows`` or ``max_bytes`` (windows and queue): skip the oldest windows
        (counted) until the rows held fit again, so what is held exceeds the budget by at
        most one commit."""
        while self._windows and (
            self._buffered > self.max_rows
            or self._buffered_bytes + self._inbox_bytes > self.max_bytes
        ):
            self.counters.skipped_memory += 1
            self._skip(min(self._windows), "memory")

    def _bucket(self, name: str, rows: np.ndarray) -> None:
        """Add ``rows`` to their windows; rows of a window already solved or skipped
        (late) or stamped more than ``FUTURE_S`` ahead are counted and dropped."""
        if not len(rows):
            return
        widx = rows[SOURCES[name][1]] // self.window_ns
        if int(widx.max()) <= self._watermark:  # all late (a daemon behind skips windows)
            self.counters.late_rows += len(rows)
            return
        horizon = (self.now_ns() + int(FUTURE_S * 1e9)) // self.window_ns
        for w, part in _window_runs(rows, widx):
            if w <= self._watermark:
                self.counters.late_rows += len(part)
                continue
            if w > horizon:
                self.counters.future_rows += len(part)
                continue
            self._add(name, w, part)

    def _add(self, name: str, w: int, part: np.ndarray) -> None:
        buf = self._windows.get(w)
        if buf is None:
            buf = self._windows[w] = _Window()
        held = buf.parts.get(name)
        if held is None:
            held = buf.parts[name] = _Rows(SOURCES[name][0], self._expect[name])
        held.append(part)
        buf.rows += len(part)
        buf.nbytes += part.nbytes
        self._buffered += len(part)
        self._buffered_bytes += part.nbytes

    def _skip(self, w: int, reason: str) -> None:
        buf = self._windows.pop(w)
        for name, held in buf.parts.items():  # the next windows' buffers start this big
            self._expect[name] = max(self._expect[name], held.n)
        self._buffered -= buf.rows
        self._buffered_bytes -= buf.nbytes
        self._watermark = max(self._watermark, w)
        self.counters.windows_skipped += 1
        self._record(w, "skipped")
        log.warning(
            "event=clock_window_skipped window_start_ns=%d rows=%d reason=%s",
            w * self.window_ns,
            buf.rows,
            reason,
        )

    def _next_complete(self) -> int | None:
        now = self.now_ns()
        lateness = self._lateness_now(now)
        done = sorted(w for w in self._windows if (w + 1) * self.window_ns + lateness <= now)
        for w in [w for w in done if w <= self._incomplete_upto]:
            self._skip(w, "rows_dropped")
        done = [w for w in done if w > self._incomplete_upto]
        for w in done[: max(0, len(done) - self.max_backlog)]:
            self._skip(w, "behind")
        done = done[max(0, len(done) - self.max_backlog) :]
        return done[0] if done else None

    # ---- one window --------------------------------------------------------------------
    def _solve(self, w: int, buf: _Window) -> None:
        self._buffered -= buf.rows
        self._buffered_bytes -= buf.nbytes
        for name, held in buf.parts.items():
            self._expect[name] = held.n
        self._watermark = max(self._watermark, w)
        start_ns = w * self.window_ns
        arrays = self._joined(buf)
        started = time.monotonic()
        try:
            sol = solve_window(
                arrays["probe_tx"],
                arrays["probe_rx"],
                arrays["echo"],
                window_start_ns=start_ns,
                window_ns=self.window_ns,
                prior=self.state,
                config=self.config,
            )
            tables = self.window_tables(sol, arrays["echo"])
        except Exception:
            self.counters.windows_failed += 1
            self._record(w, "failed")
            log.exception("event=clock_solve_failed window_start_ns=%d", start_ns)
            return
        solve_s = time.monotonic() - started
        self.state = sol.state
        written = self._write(start_ns, tables)
        record = self._record(w, "solved" if written else "existing")
        if self.on_owd is not None:  # the detector's per-path delays (it copies what it keeps)
            try:
                self.on_owd(tables["owd"])
                self.pipeline.fed(record, time.time_ns())
            except Exception:
                log.exception("event=owd_consumer_failed window_start_ns=%d", start_ns)
        self.counters.windows_solved += 1
        self._publish(sol, solve_s)
        for host, step_ns in sol.stepped.items():  # chrony's makestep, a PTP servo re-locking
            log.warning(
                "event=clock_stepped window_start_ns=%d host_id=%d step_ns=%.0f (its one-way "
                "delays in the window not stored)",
                start_ns,
                host,
                step_ns,
            )
        log.info(
            "event=clock_window_solved window_start_ns=%d hosts=%d pairs=%d disagree=%d "
            "owd_rows=%d solve_s=%.3f",
            start_ns,
            len(sol.clock),
            len(sol.pairs),
            self.snapshot.disagreeing_pairs,
            tables["owd"].num_rows,
            solve_s,
        )

    def _record(self, w: int, outcome: str) -> WindowRecord:
        """Note what became of window ``w`` now (wall clock: its lag from its end)."""
        record = WindowRecord(
            start_ns=w * self.window_ns,
            end_ns=(w + 1) * self.window_ns,
            outcome=outcome,
            done_ns=time.time_ns(),
            due_ns=(w + 1) * self.window_ns + self.lateness_ns,
        )
        self.pipeline.add(record)
        return record

    @staticmethod
    def _joined(buf: _Window) -> dict[str, np.ndarray]:
        """The window's rows per table (already joined as they arrived: no copy here)."""
        return {
            name: buf.parts[name].rows if name in buf.parts else np.zeros(0, dtype)
            for name, (dtype, _) in SOURCES.items()
        }

    def window_tables(self, sol: WindowSolution, echoes: np.ndarray) -> dict[str, pa.Table]:
        """Arrow tables of one solution in the store schema: ``clock`` (huygens rows,
        then rtt2 baseline rows) and ``owd``."""
        cols = store_columns(sol)
        clock = cols["clock"]
        base = self._rtt2_columns(sol, echoes)
        if base is not None:
            clock = {k: np.concatenate((clock[k], base[k])) for k in clock}
        return {
            "clock": self._arrow("clock", clock),
            "owd": self._arrow("owd", cols["owd"]),
        }

    @staticmethod
    def _arrow(table: str, cols: dict[str, np.ndarray]) -> pa.Table:
        schema = layout.TABLES[table].schema
        arrays = [pa.array(cols[f.name], type=f.type) for f in schema]
        return pa.Table.from_arrays(arrays, schema=schema)

    @staticmethod
    def _rtt2_columns(sol: WindowSolution, echoes: np.ndarray) -> dict[str, np.ndarray] | None:
        """RTT/2 baseline per host (mean-zero, unweighted least squares over echo pairs);
        uncertainty NaN: the baseline has no error model."""
        if not len(echoes):
            return None
        pairs = rtt2_baseline(echoes, ref_ns=sol.ref_ns)
        if not len(pairs):
            return None
        hosts, offsets = rtt2_host_offsets(pairs)
        # drift per host: same least squares on the pair drifts
        as_offsets = pairs.copy()
        as_offsets["offset_ns"] = pairs["drift_ppm"]
        _, drifts = rtt2_host_offsets(as_offsets)
        n = len(hosts)
        return {
            "window_start_ns": np.full(n, sol.window_start_ns, np.int64),
            "window_end_ns": np.full(n, sol.window_start_ns + sol.window_ns, np.int64),
            "host": hosts.astype(np.int64),
            "offset_ns": offsets.astype(np.float64),
            "drift_ppm": drifts.astype(np.float64),
            "uncertainty_ns": np.full(n, np.nan),
            "reference": np.zeros(n, np.int64),
            "method": np.full(n, "rtt2", dtype=object),
        }

    def _write(self, start_ns: int, tables: dict[str, pa.Table]) -> bool:
        """owd first, clock last: a window's ``clock`` rows mean it is fully stored.
        False when it already was (not rewritten)."""
        key = start_ns // 1_000_000
        name = f"r{key:015d}.parquet"
        part = layout.partition_of(start_ns // layout.NS_PER_HOUR)
        if self._stored(self.writer.root / "clock" / part, name, key, start_ns):
            self.counters.windows_existing += 1
            log.warning("event=clock_window_exists window_start_ns=%d (not rewritten)", start_ns)
            return False
        for table in ("owd", "clock"):
            data = tables[table]
            if data.num_rows:
                self.writer.write_partitioned(table, data, name)
                self.counters.rows_written[table] += data.num_rows
        return True

    @staticmethod
    def _stored(part: Path, name: str, key: int, start_ns: int) -> bool:
        """Is this window's ``clock`` in the partition: its own file, or a merged one whose
        key range covers it and that holds the window (compaction merges ``r`` files a
        minute old: a daemon back from a longer outage gets late rows of such windows).
        The ``r`` file is looked for first: compaction writes its output before it
        deletes its sources."""
        if (part / name).exists():
            return True
        for path in part.glob("m*.parquet"):
            rng = layout.file_commit_range(path.name)
            if rng is None or not rng[1] <= key <= rng[2]:
                continue
            starts = pq.read_table(path, columns=["window_start_ns"]).column(0)
            if pc.any(pc.equal(starts, start_ns)).as_py():
                return True
        return False

    def _publish(self, sol: WindowSolution, solve_s: float) -> None:
        c = sol.clock
        keep = c["status"] != HostStatus.UNSOLVED
        c = c[keep]
        flags = sol.pairs["flags"]
        self.snapshot = ClockSnapshot(
            window_start_ns=sol.window_start_ns,
            window_end_ns=sol.window_start_ns + sol.window_ns,
            hosts=c["host"].copy(),
            offset_ns=c["offset_ns"].copy(),
            drift_ppm=c["drift_ppm"].copy(),
            uncertainty_ns=c["offset_sigma_ns"].copy(),
            status=c["status"].copy(),
            pairs=len(flags),
            disagreeing_pairs=int(np.count_nonzero(flags & int(PairFlag.DISAGREE))),
            solve_s=solve_s,
            noise_ns=float(sol.noise_ns),
        )

    # ---- read side -----------------------------------------------------------------------
    def live(self, names: dict[int, str]) -> dict:
        """The ``clock`` section of /v1/live."""
        s = self.snapshot
        k = self.counters
        status_names = {int(v): v.name.lower() for v in HostStatus}
        return {
            "window_s": self.window_ns / 1e9,
            "lateness_s": self.lateness_ns / 1e9,
            "window_start_ns": s.window_start_ns,
            "window_end_ns": s.window_end_ns,
            "windows_solved": k.windows_solved,
            "windows_skipped": k.windows_skipped,
            "windows_failed": k.windows_failed,
            "windows_skipped_memory": k.skipped_memory,
            "late_rows": k.late_rows,
            "dropped_rows": k.dropped_rows,
            "buffered_bytes": self._buffered_bytes + self._inbox_bytes,
            "max_bytes": self.max_bytes,
            "pairs": s.pairs,
            "disagreeing_pairs": s.disagreeing_pairs,
            "solve_s": round(s.solve_s, 4),
            "noise_ns": round(s.noise_ns, 2),
            "pipeline": self.pipeline.summary(self.now_ns()),
            "hosts": [
                {
                    "host": names.get(h, str(h)),
                    "host_id": h,
                    "offset_ns": _finite(off, 1),
                    "drift_ppm": _finite(drift, 4),
                    "uncertainty_ns": _finite(sig, 1),
                    "status": status_names.get(st, str(st)),
                    "window_end_ns": s.window_end_ns,
                }
                for h, off, drift, sig, st in zip(
                    s.hosts.tolist(),
                    s.offset_ns.tolist(),
                    s.drift_ppm.tolist(),
                    s.uncertainty_ns.tolist(),
                    s.status.tolist(),
                    strict=True,
                )
            ],
        }

    def collector(self, names: Callable[[], dict[int, str]]) -> Collector:
        """A prometheus collector of the runner's gauges and counters."""
        return _ClockCollector(self, names)


def _finite(value: float, digits: int) -> float | None:
    """Rounded, or None (JSON null) for NaN/inf."""
    return round(value, digits) if np.isfinite(value) else None


class _ClockCollector(Collector):
    def __init__(self, runner: ClockRunner, names: Callable[[], dict[int, str]]) -> None:
        self._runner = runner
        self._names = names

    def collect(self) -> Iterable[Metric]:
        r = self._runner
        s = r.snapshot
        k = r.counters
        names = self._names()
        offset = GaugeMetricFamily(
            "clockmesh_clock_offset_seconds",
            "Host clock minus mesh time at the middle of the last solved window.",
            labels=["host"],
        )
        sigma = GaugeMetricFamily(
            "clockmesh_clock_uncertainty_seconds",
            "One-sigma uncertainty of the host's clock offset (last solved window).",
            labels=["host"],
        )
        drift = GaugeMetricFamily(
            "clockmesh_clock_drift_ppm",
            "Host clock drift relative to mesh time, parts per million (last solved window).",
            labels=["host"],
        )
        for h, off, sig, d in zip(
            s.hosts.tolist(),
            s.offset_ns.tolist(),
            s.uncertainty_ns.tolist(),
            s.drift_ppm.tolist(),
            strict=True,
        ):
            label = [names.get(h, str(h))]
            offset.add_metric(label, off / 1e9)
            sigma.add_metric(label, sig / 1e9)
            drift.add_metric(label, d)
        yield offset
        yield sigma
        yield drift
        yield GaugeMetricFamily(
            "clockmesh_clock_solve_seconds",
            "Time to solve the last window.",
            value=s.solve_s,
        )
        yield GaugeMetricFamily(
            "clockmesh_clock_window_end_seconds",
            "End of the last solved window (mesh time, Unix seconds).",
            value=s.window_end_ns / 1e9,
        )
        yield GaugeMetricFamily(
            "clockmesh_clock_disagreeing_pairs",
            "Host pairs whose own estimate disagrees with the loop solution (last window).",
            value=s.disagreeing_pairs,
        )
        windows = CounterMetricFamily(
            "clockmesh_clock_windows",
            "Clock windows by outcome (solved, skipped when the solver fell behind, failed).",
            labels=["outcome"],
        )
        windows.add_metric(["solved"], k.windows_solved)
        windows.add_metric(["skipped"], k.windows_skipped)
        windows.add_metric(["failed"], k.windows_failed)
        yield windows
        health = r.pipeline.summary(r.now_ns())
        lag = GaugeMetricFamily(
            "clockmesh_clock_lag_seconds",
            "Lag from a window's end to its solution (stage=solved) and to the end of the "
            "detector pass that judged it (stage=judged), over the last 1,024 windows.",
            labels=["stage", "stat"],
        )
        due = GaugeMetricFamily(
            "clockmesh_clock_lag_due_seconds",
            "As clockmesh_clock_lag_seconds, from when the window was due (its end plus the "
            "lateness: every probe could be in) instead of its end.",
            labels=["stage", "stat"],
        )
        for family, suffix in ((lag, "_s"), (due, "_due_s")):
            for stage in ("solved", "judged"):
                q = health[f"lag_{stage}{suffix}"]
                for key in ("p50", "p99", "max"):
                    if q[key] is not None:
                        family.add_metric([stage, key], q[key])
        yield lag
        yield due
        if health["picture_age_s"] is not None:
            yield GaugeMetricFamily(
                "clockmesh_clock_picture_age_seconds",
                "Now minus the end of the newest window the detector has judged.",
                value=health["picture_age_s"],
            )
        yield GaugeMetricFamily(
            "clockmesh_clock_buffered_bytes",
            "Bytes of the rows the clock solver holds for windows not solved yet (its share "
            "of memory_budget_bytes caps them; past it the oldest windows are skipped).",
            value=r._buffered_bytes + r._inbox_bytes,
        )
        yield CounterMetricFamily(
            "clockmesh_clock_windows_skipped_memory",
            "Windows skipped to keep the clock solver within its memory budget (included in "
            'clockmesh_clock_windows_total{outcome="skipped"}).',
            value=k.skipped_memory,
        )
        yield CounterMetricFamily(
            "clockmesh_clock_late_rows",
            "Probe rows that arrived after their window was solved or skipped.",
            value=k.late_rows,
        )
