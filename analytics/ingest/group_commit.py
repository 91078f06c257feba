"""Group commit: the batches of many requests written together, fsynced once, acknowledged
together.

Batches received while a commit is running (or within ``roll_s`` of the previous one) wait in
one queue; the commit thread converts every record table of the group once (the tables side
by side in the convert threads), writes and fsyncs them with one commit record, then feeds the
fresh records to the hot window, the clock runner and the detector. Whether the store accepts
commits at all (free space, a failed write) is decided here too: the HTTP surface
(:mod:`analytics.ingest.routes`) answers 503 with :meth:`GroupCommit.unavailable_reason`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from analytics.clock.clock_runner import SOURCES as CLOCK_SOURCES
from analytics.clock.clock_runner import ClockRunner
from analytics.detect.detect_runner import DetectRunner
from analytics.ingest import body as ingest_body
from analytics.ingest.config import IngestConfig
from analytics.ingest.hot_window import HotWindow
from analytics.ingest.metrics import FleetView, HostState, IngestMetrics
from analytics.ingest.slabs import SlabPool
from analytics.store import layout
from analytics.store.store_writer import StoreWriteError, StoreWriter
from collector import records

log = logging.getLogger("clockmesh.ingest")


@dataclass(eq=False)
class PendingBatch:
    """One request's new segments, waiting for their group commit."""

    segs: list[ingest_body.SegmentView]
    rows: int
    received_ns: int
    future: asyncio.Future


@dataclass
class _HostCommit:
    """What one commit's segments say of one host, merged into its :class:`HostState`."""

    host: str
    last_ns: int  # the newest of its batches arrived then
    since_ns: int  # its oldest segment began then
    newest_ns: int  # its newest segment began then
    batches: int = 0
    probes_ns: int = 0  # the newest of its batches with probes it sent arrived then
    rows: dict[str, int] = field(default_factory=dict)
    runs: dict[int, int] = field(default_factory=dict)  # run_ns -> its newest segment
    roll_s: float = 0.0  # its newest segment's shipping interval (0: not said)


def join_chunks(
    chunks: list[memoryview] | list[bytes], memory: Callable[[int], np.ndarray]
) -> np.ndarray:
    """The chunks' bytes back to back in ``memory(total)`` (a uint8 array of that size)."""
    out = memory(sum([len(c) for c in chunks]))
    if chunks:
        np.concatenate([np.frombuffer(c, np.uint8) for c in chunks], out=out)
    return out


class GroupCommit:
    """The commit queue and its loop: ``enqueue`` from a request, ``await run()`` as a task."""

    def __init__(
        self,
        config: IngestConfig,
        writer: StoreWriter,
        metrics: IngestMetrics,
        view: FleetView,
        hot: HotWindow,
        clock: ClockRunner,
        detect: DetectRunner,
        slabs: SlabPool,
    ) -> None:
        self.config = config
        self.writer = writer
        self.metrics = metrics
        self.view = view
        self.hot = hot
        self.clock = clock
        self.detect = detect
        self.slabs = slabs  # the records handed to the hot window and clock runner
        self.pending: list[PendingBatch] = []
        self.pending_rows = 0
        self._inflight: dict[tuple[int, int], asyncio.Future] = {}
        self._wake = asyncio.Event()
        self.next_commit = 0
        self._last_commit_start = 0.0
        self._known_names: dict[int, str] = {}
        self._unavailable = ""
        self._broken = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commit_pool = concurrent.futures.ThreadPoolExecutor(1, "commit")
        self._convert_pool = concurrent.futures.ThreadPoolExecutor(4, "convert")
        self._rejected: set[PendingBatch] = set()  # commit thread: batches answered 422
        # convert threads (one job per table): per table, the buffer its chunks are joined in
        self._scratch: dict[str, np.ndarray] = {}
        # convert threads: per table, its columns' buffers (one convert job per table)
        self._columns: dict[str, dict[str, np.ndarray]] = {name: {} for name in records.TABLES}

    # ---- availability ------------------------------------------------------------
    def unavailable_reason(self) -> str:
        return self._broken or self._unavailable

    def check_space(self) -> None:
        free = self.writer.free_bytes()
        self.view.free_bytes = free
        if free < self.config.min_free_bytes:
            reason = (
                f"store filesystem has {free} bytes free, below min_free_bytes "
                f"{self.config.min_free_bytes}"
            )
            if self._unavailable != reason:
                log.error("event=store_full free_bytes=%d min_free_bytes=%d",
                          free, self.config.min_free_bytes)  # fmt: skip
            self._unavailable = reason
        elif self._unavailable:
            log.warning("event=store_accepting_again free_bytes=%d", free)
            self._unavailable = ""

    # ---- the queue ---------------------------------------------------------------
    def enqueue(
        self, segs: list[ingest_body.SegmentView]
    ) -> tuple[list[str], list[asyncio.Future], bool]:
        """Per segment: already stored, in flight in another request, or new. The new ones
        join the queue as one batch. Returns each segment's status ("stored" or
        "duplicate"), the futures to await (the in-flight ones, then the new batch's, last),
        and whether there was a new batch."""
        status_of: list[str] = []
        waits: list[asyncio.Future] = []
        new: list[ingest_body.SegmentView] = []
        seen: set[tuple[int, int]] = set()
        ledger = self.writer.ledger
        for seg in segs:
            key = (seg.host_id, seg.segment)
            existing = self._inflight.get(key)
            if key in ledger or key in seen:
                status_of.append("duplicate")
            elif existing is not None:
                status_of.append("duplicate")
                waits.append(existing)
            else:
                status_of.append("stored")
                new.append(seg)
            seen.add(key)
        if new:
            future: asyncio.Future = asyncio.get_running_loop().create_future()
            rows = sum([seg.total_rows for seg in new])
            for seg in new:
                self._inflight[(seg.host_id, seg.segment)] = future
            self.pending.append(PendingBatch(new, rows, time.time_ns(), future))
            self.pending_rows += rows  # the gauge is set per commit and per second
            self._wake.set()
            waits.append(future)
        return status_of, waits, bool(new)

    async def flush(self, timeout_s: float) -> None:
        """Commit what was received, and answer it: those clients are waiting for their ack
        (``_inflight`` holds every batch received until it is answered, so a group being
        committed is waited for too)."""
        deadline = time.monotonic() + timeout_s
        while self._inflight and time.monotonic() < deadline:
            self._wake.set()
            await asyncio.sleep(0.05)

    def shutdown(self) -> None:
        self._commit_pool.shutdown(wait=True)
        self._convert_pool.shutdown(wait=True)

    # ---- the loop ----------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        while True:
            await self._wake.wait()
            wait = self._last_commit_start + self.config.roll_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._wake.clear()
            group, rows = self._take_group()
            if not group:
                continue
            self._last_commit_start = time.monotonic()
            number = self.next_commit
            self.check_space()
            if self.unavailable_reason():
                self._finish(group, 503, self.unavailable_reason())
                continue
            try:
                nbytes = await loop.run_in_executor(
                    self._commit_pool, self._commit_group, number, group
                )
            except StoreWriteError as exc:
                self.metrics.commit_failures.inc()
                text = str(exc)
                log.error("event=commit_failed commit=%d error=%r", number, text)
                if "restart the daemon" in text:
                    self._broken = text
                else:
                    self._unavailable = text
                self._finish(group, 503, text)
                continue
            except Exception as exc:  # a bug must not leave clients hanging
                log.exception("event=commit_crashed commit=%d", number)
                self._broken = f"commit {number} failed unexpectedly: {exc!r}"
                self._finish(group, 503, self._broken)
                continue
            self.next_commit = number + 1
            self.metrics.commits.inc()
            for b in group:
                if b.future.done():  # answered already (rejected inside the commit)
                    continue
                for seg in b.segs:
                    self.writer.ledger.add(seg.host_id, seg.segment)
            self._finish(group, 200, "stored")
            log.debug("event=committed commit=%d batches=%d rows=%d bytes=%d",
                      number, len(group), rows, nbytes)  # fmt: skip
            if self.pending:
                self._wake.set()

    def _take_group(self) -> tuple[list[PendingBatch], int]:
        rows = cut = 0
        for cut, b in enumerate(self.pending, 1):  # noqa: B007
            rows += b.rows
            if rows >= self.config.max_commit_rows:
                break
        group, self.pending = self.pending[:cut], self.pending[cut:]
        self.pending_rows -= rows
        self.metrics.pending_rows.set(self.pending_rows)
        return group, rows

    def _finish(self, group: list[PendingBatch], status: int, text: str) -> None:
        payload = (
            {"status": "stored"} if status == 200 else {"status": "unavailable", "error": text}
        )
        for b in group:
            for seg in b.segs:
                self._inflight.pop((seg.host_id, seg.segment), None)
            if not b.future.done():
                b.future.set_result((status, payload))

    def _reject_in_commit(self, b: PendingBatch, error: str) -> None:
        """Answer one batch 422 from the commit thread (its text is not storable)."""
        host = b.segs[0].host
        log.warning("event=batch_rejected status=422 reason=schema host=%s error=%r", host, error)
        payload = {"status": "rejected", "error": error}
        loop = self._loop
        assert loop is not None

        def answer() -> None:
            for seg in b.segs:
                self._inflight.pop((seg.host_id, seg.segment), None)
            if not b.future.done():
                b.future.set_result((422, payload))

        loop.call_soon_threadsafe(answer)

    def _group_tables(
        self, group: list[PendingBatch]
    ) -> tuple[dict[str, pa.Table], dict[str, np.ndarray]]:
        """Every record table of the group as one Arrow table: one concatenation and one
        conversion per table and commit, not per request. A batch whose text is not
        UTF-8 is answered 422 and left out (found only when the group's conversion fails).

        Also returns the numpy records of the clock runner's tables (probe_tx, probe_rx,
        echo): those are joined into a fresh array it keeps, instead of the scratch
        buffer, so it needs no Arrow -> numpy conversion (docs/store.md, "Round 3").
        """
        while True:
            live = [b for b in group if not b.future.done() and b not in self._rejected]
            tables: dict[str, pa.Table] = {}
            recs: dict[str, np.ndarray] = {}
            bad: PendingBatch | None = None
            jobs = {}
            for name in records.TABLES:
                chunks = [c for b in live for seg in b.segs for c in seg.chunks.get(name, ())]
                if chunks:  # the tables are converted side by side (numpy copies drop the GIL)
                    jobs[name] = self._convert_pool.submit(self._convert, name, chunks)
            concurrent.futures.wait(jobs.values())
            failed = ""
            for name, job in jobs.items():
                try:
                    tables[name], rows = job.result()
                except (pa.ArrowInvalid, UnicodeDecodeError):
                    failed = failed or name
                    continue
                if rows is not None:
                    recs[name] = rows
            if failed:
                bad = self._find_bad_text(live, failed)
            if bad is None:
                return tables, recs
            self._rejected.add(bad)

    def _convert(self, name: str, chunks: list[memoryview]) -> tuple[pa.Table, np.ndarray | None]:
        """One table of a group commit as Arrow (plus, for the clock runner's and the hot
        window's tables, the numpy records they keep).

        The chunks are views of the request bodies: the clock runner's tables are joined
        into memory of the slab pool (slabs.py), the others into this table's
        long-lived scratch buffer. The Arrow columns are copied into this table's
        long-lived column buffers: valid until its next commit, and written by then.
        """
        columns = self._columns[name]
        dtype = records.TABLES[name]
        if name in CLOCK_SOURCES:  # kept by the clock runner and the hot window
            rows = join_chunks(chunks, self.slabs.take).view(dtype)
            return layout.records_to_arrow(name, rows, columns), rows
        scratch = join_chunks(chunks, lambda n: layout.scratch_bytes(self._scratch, name, n))
        return layout.records_to_arrow(name, scratch.view(dtype), columns), None

    def _find_bad_text(self, live: list[PendingBatch], name: str) -> PendingBatch:
        for b in live:
            for seg in b.segs:
                if name not in seg.chunks:
                    continue
                try:
                    layout.records_to_arrow(name, seg.table(name))
                except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                    self._reject_in_commit(
                        b, f"segment {seg.segment}: {name}: text is not UTF-8 ({exc})"
                    )
                    return b
        raise AssertionError(f"{name}: conversion failed but no batch is at fault")

    def _commit_group(self, number: int, group: list[PendingBatch]) -> int:
        """Runs in the commit thread: build columns, write, fsync; then feed the hot window."""
        started = time.monotonic()
        self._rejected = set()
        tables, clock_rows = self._group_tables(group)
        group = [b for b in group if b not in self._rejected]
        if not group:
            return 0
        segs = [(b, seg, seg.nbytes, seg.total_rows) for b in group for seg in b.segs]
        new_names = [
            (b.received_ns, seg.host_id, seg.host)
            for b, seg, _, _ in segs
            if self._known_names.get(seg.host_id) != seg.host
        ]
        if new_names:
            seen = {}
            for ts, hid, host in new_names:
                seen[hid] = (ts, host)
            tables["host_names"] = pa.table(
                {
                    "ts_ns": pa.array([v[0] for v in seen.values()], pa.int64()),
                    "host_id": pa.array(list(seen), pa.int64()),
                    "host": pa.array([v[1] for v in seen.values()], pa.string()),
                },
                schema=layout.TABLES["host_names"].schema,
            )
        n = len(segs)
        batches = pa.table(
            {
                "commit": pa.array(np.full(n, number, np.int64)),
                "received_ns": pa.array([x[0].received_ns for x in segs], pa.int64()),
                "host_id": pa.array([x[1].host_id for x in segs], pa.int64()),
                "host": pa.array([x[1].host for x in segs], pa.string()),
                "segment": pa.array([x[1].segment for x in segs], pa.int64()),
                "created_ns": pa.array([x[1].created_ns for x in segs], pa.int64()),
                "rows": pa.array([x[3] for x in segs], pa.int64()),
                "bytes": pa.array([x[2] for x in segs], pa.int64()),
            },
            schema=layout.TABLES["batches"].schema,
        )
        with self.metrics.commit_seconds.time():
            nbytes = self.writer.commit(number, tables, batches)
        # durable from here on
        for ts, hid, host in new_names:
            self._known_names[hid] = host
            del ts
        now_ns = time.time_ns()
        # copy-on-write: the event loop and the live thread read these without a lock
        per_host: dict[int, _HostCommit] = {}
        for b, seg, _, _ in segs:
            agg = per_host.get(seg.host_id)
            if agg is None:
                agg = per_host[seg.host_id] = _HostCommit(
                    seg.host, b.received_ns, seg.created_ns, seg.created_ns
                )
            agg.last_ns = max(agg.last_ns, b.received_ns)
            agg.batches += 1
            agg.since_ns = min(agg.since_ns, seg.created_ns)
            if seg.created_ns >= agg.newest_ns:
                agg.newest_ns, agg.roll_s = seg.created_ns, seg.roll_s
            if seg.rows.get("probe_tx"):
                agg.probes_ns = max(agg.probes_ns, b.received_ns)
            for name, n in seg.rows.items():
                agg.rows[name] = agg.rows.get(name, 0) + n
            if seg.run_ns:  # the run it came from: its newest segment
                agg.runs[seg.run_ns] = max(agg.runs.get(seg.run_ns, 0), seg.created_ns)
        hosts = dict(self.view.hosts)
        for hid, agg in per_host.items():
            h = hosts.get(hid)
            if h is None:
                h = hosts[hid] = HostState(agg.host, hid, agg.last_ns, agg.last_ns)
            h.host = agg.host
            h.last_ns = max(h.last_ns, agg.last_ns)
            h.since_ns = min(h.since_ns, agg.since_ns)
            if agg.newest_ns >= h.newest_ns:
                h.newest_ns, h.roll_s = agg.newest_ns, agg.roll_s
            if agg.runs:
                h.add_runs(agg.runs)
            h.batches += agg.batches
            h.probes_ns = max(h.probes_ns, agg.probes_ns)
            rows = dict(h.rows)
            for name, n in agg.rows.items():
                rows[name] = rows.get(name, 0) + n
            h.rows = rows
        self.view.hosts = hosts
        for name, data in tables.items():
            if name in records.TABLES:
                self.metrics.rows.labels(name).inc(data.num_rows)
        self.metrics.bytes.inc(sum(x[2] for x in segs))
        self.hot.add(now_ns, clock_rows)  # the fresh numpy records (kept, never changed)
        self.clock.feed(clock_rows)  # solved per window in the clock thread
        self.detect.feed(tables, clock_rows)  # judged every detect_interval_s (detector thread)
        self.metrics.hot_rows.set(self.hot.rows)
        self.metrics.hot_bytes.set(self.hot.nbytes)
        log.debug("commit %d took %.3fs", number, time.monotonic() - started)
        return nbytes
