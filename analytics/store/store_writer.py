"""The one writer of the store: durable group commits of Parquet files, and recovery.

A *commit* N writes, for every table with rows, one file per UTC hour it touches,
``<table>/date=D/hour=H/c<N>.parquet`` (temporary name, fsync, rename, directory fsync),
and then, last, the ``batches`` file ``c<N>.parquet`` naming every (host, segment) of the
commit. The batches file is the commit record: commits run one at a time, so after a
crash only commit ``H + 1`` (H = the highest commit in ``batches``) can be partial, and
recovery deletes every ``c<N>`` data file with ``N > H``. None of those rows was
acknowledged (acks go out only after the batches file is durable), so the collectors
send them again and each acknowledged row ends up in the store exactly once.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analytics.store import compactor, layout
from analytics.store.layout import TABLES, StoreError
from analytics.store.segment_ledger import SegmentLedger

log = logging.getLogger("clockmesh.ingest.store")
_T = TypeVar("_T")


class StoreWriteError(Exception):
    """A commit could not be made durable (nothing of it remains); ``str()`` says why."""


class StoreWriter:
    """Owns ``store_dir``: layout, commits, per-minute rollup files, recovery at open."""

    def __init__(
        self,
        store_dir: str | Path,
        *,
        compression: str = "zstd",
        dedup_window_s: float = 24 * 3600,
    ) -> None:
        self.root = Path(store_dir)
        self.compression = compression
        self.dedup_window_s = dedup_window_s
        self.ledger = SegmentLedger()
        self.committed = -1  # highest durable commit number
        self.recovered_orphans = 0
        # fsyncs of one commit run concurrently: ext4 folds them into one journal commit
        self._sync_pool = concurrent.futures.ThreadPoolExecutor(8, "fsync")

    # ---- opening -----------------------------------------------------------------
    def open(self) -> None:
        """Create or check the layout, undo a partial commit, rebuild the dedup ledger."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.root}: cannot create the store directory ({exc})") from None
        if layout.read_store_info(self.root) is None:
            self._write_json(
                self.root / "store.json",
                {"store_schema": layout.STORE_SCHEMA, "created_ns": time.time_ns()},
            )
        (self.root / "_ingest").mkdir(exist_ok=True)
        for name in TABLES:
            self.ensure_placeholder(name)
        compactor.recover(self.root)
        self.committed = self._highest_committed()
        self._remove_orphans()
        self._load_ledger()

    def ensure_placeholder(self, table: str) -> None:
        """The empty file that gives a table's view its columns, even with no data yet.

        A column added to a table since the store was created (an additive change, same
        store schema) is added here: the view reads every file with ``union_by_name``, so
        older files show it as NULL.
        """
        part = self.root / table / layout.PLACEHOLDER_PARTITION
        path = part / layout.PLACEHOLDER_NAME
        if path.exists():
            have = set(pq.read_schema(path).names)
            if set(TABLES[table].schema.names) <= have:
                return
            log.info("event=table_columns_added table=%s columns=%s", table,
                     sorted(set(TABLES[table].schema.names) - have))  # fmt: skip
        layout.make_dirs_durable(part)
        self._write_parquet(path, layout.empty_table(table))
        layout.fsync_dir(part)

    def _write_json(self, path: Path, data: dict) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        layout.fsync_dir(path.parent)

    # ---- walking -----------------------------------------------------------------
    def partitions(self, table: str) -> Iterator[tuple[int, Path]]:
        """(hour bucket, directory) of every real partition of ``table``, oldest first."""
        base = self.root / table
        try:
            dates = sorted(d.name for d in os.scandir(base) if d.is_dir())
        except FileNotFoundError:
            return
        for date in dates:
            if date == "date=1970-01-01":
                continue
            try:
                hours = sorted(h.name for h in os.scandir(base / date) if h.is_dir())
            except FileNotFoundError:
                continue
            for hour in hours:
                bucket = layout.hour_bucket_of_partition(date, hour)
                if bucket is not None:
                    yield bucket, base / date / hour

    def data_files(self, table: str, since_bucket: int | None = None) -> list[Path]:
        out: list[Path] = []
        for bucket, part in self.partitions(table):
            if since_bucket is not None and bucket < since_bucket:
                continue
            out.extend(
                part / f.name
                for f in os.scandir(part)
                if layout.file_commit_range(f.name) is not None
            )
        return sorted(out)

    def _highest_committed(self) -> int:
        high = -1
        parts = list(self.partitions("batches"))
        for _bucket, part in reversed(parts):
            for entry in os.scandir(part):
                rng = layout.file_commit_range(entry.name)
                if rng is not None:
                    high = max(high, rng[2])
            if high >= 0:
                break
        return high

    def _remove_orphans(self) -> None:
        for table in TABLES:
            for _bucket, part in self.partitions(table):
                removed = False
                for entry in os.scandir(part):
                    rng = layout.file_commit_range(entry.name)
                    stale_tmp = entry.name.endswith(".tmp")
                    orphan = rng is not None and rng[0] == "c" and rng[1] > self.committed
                    if stale_tmp or orphan:
                        os.unlink(part / entry.name)
                        removed = True
                        self.recovered_orphans += orphan
                if removed:
                    layout.fsync_dir(part)
        if self.recovered_orphans:
            log.warning(
                "event=recovered_partial_commit files=%d committed=%d "
                "(unacknowledged rows removed; collectors resend them)",
                self.recovered_orphans,
                self.committed,
            )

    def _load_ledger(self) -> None:
        since = int((time.time() - self.dedup_window_s) // 3600)
        files = [str(p) for p in self.data_files("batches", since_bucket=since)]
        if not files:
            return
        con = duckdb.connect()
        try:
            cols = con.execute("SELECT host_id, segment FROM read_parquet(?)", [files]).fetchnumpy()
        finally:
            con.close()
        self.ledger.add_many(np.asarray(cols["host_id"]), np.asarray(cols["segment"]))
        log.info(
            "event=ledger_loaded batches=%d hosts=%d intervals=%d",
            len(cols["host_id"]),
            self.ledger.hosts(),
            self.ledger.intervals(),
        )

    # ---- writing -----------------------------------------------------------------
    def free_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def _encode_parquet(self, path: Path, table: pa.Table, dictionary: bool = True) -> None:
        """Encode ``table`` to ``path`` (not yet durable).

        Settings chosen by benchmarks/bench_ingest.py's profile (docs/store.md,
        "Performance"): dictionary pages only on low-cardinality columns (on ids,
        sequence numbers and nanosecond times they cost time and save nothing), and none
        at all in group commits (``dictionary=False``: compaction adds them), delta
        encoding on monotonic integers, min/max statistics only where readers prune.
        """
        pq.write_table(
            table,
            path,
            compression=self.compression,
            row_group_size=1 << 22,
            **layout.parquet_options(table.schema, dictionary=dictionary),
        )

    def _write_parquet(self, path: Path, table: pa.Table) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            self._encode_parquet(tmp, table)
            layout.fsync_file(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _hour_groups(self, table: str, data: pa.Table) -> list[tuple[int, pa.Table]]:
        spec = TABLES[table]
        ts = data.column(spec.time_column).to_numpy()
        buckets = ts // layout.NS_PER_HOUR
        first = int(buckets[0])
        if (buckets == first).all():
            return [(first, data)]
        groups = []
        for bucket in np.unique(buckets).tolist():
            idx = np.flatnonzero(buckets == bucket)
            groups.append((int(bucket), data.take(pa.array(idx))))
        return groups

    def write_partitioned(self, table: str, data: pa.Table, name: str) -> list[Path]:
        """Write ``data`` as ``name`` into each hour partition its rows fall in (durably)."""
        return self._write_many([(table, data)], name)

    def _write_many(
        self, tables: list[tuple[str, pa.Table]], name: str, dictionary: bool = True
    ) -> list[Path]:
        """Durably write each table as ``name`` in the hour partitions its rows fall in.

        Encode every file under a temporary name, fsync them all concurrently, rename,
        fsync the directories concurrently. On error nothing of it remains.
        """
        staged: list[tuple[Path, Path]] = []
        written: list[Path] = []
        try:
            jobs: list[tuple[Path, pa.Table, bool]] = []
            for table, data in tables:
                for bucket, part_data in self._hour_groups(table, data):
                    part = self.root / table / layout.partition_of(bucket)
                    layout.make_dirs_durable(part)
                    path = part / name
                    tmp = path.with_name(name + ".tmp")
                    staged.append((tmp, path))
                    jobs.append((tmp, part_data, dictionary))
            # Parquet encoding runs without the GIL: the files of a commit are encoded
            # (and fsynced) side by side instead of one after the other
            self._parallel(self._encode_durable, jobs)
            for tmp, path in staged:
                os.replace(tmp, path)
                written.append(path)
            self._parallel(layout.fsync_dir, list({p.parent for p in written}))
        except BaseException:
            for tmp, path in staged:
                tmp.unlink(missing_ok=True)
                path.unlink(missing_ok=True)
            raise
        return written

    def _encode_durable(self, job: tuple[Path, pa.Table, bool]) -> None:
        self._encode_parquet(*job)
        layout.fsync_file(job[0])

    def _parallel(self, fn: Callable[[_T], None], items: list[_T]) -> None:
        """``fn`` on every item in the pool; returns once all are done (so nothing is
        still writing when the caller cleans up), raising the first error."""
        if len(items) == 1:
            fn(items[0])
            return
        futures = [self._sync_pool.submit(fn, item) for item in items]
        concurrent.futures.wait(futures)
        for fut in futures:
            fut.result()

    def commit(self, number: int, tables: dict[str, pa.Table], batches: pa.Table) -> int:
        """Durably write one group commit; returns bytes written. All-or-nothing."""
        if number <= self.committed:
            raise ValueError(f"commit {number} is not after {self.committed}")
        name = f"c{number:012d}.parquet"
        written: list[Path] = []
        try:
            data = [(t, d) for t, d in tables.items() if d.num_rows]
            written += self._write_many(data, name, dictionary=False)
            # the commit record goes last, once every data file is durable
            written += self._write_many([("batches", batches)], name)
        except OSError as exc:
            leftovers = self._rollback(written)
            reason = f"writing commit {number} failed: {exc.strerror or exc}"
            if leftovers:
                reason += f"; could not remove {leftovers} (restart the daemon to recover)"
            raise StoreWriteError(reason) from exc
        self.committed = number
        return sum(p.stat().st_size for p in written)

    def _rollback(self, written: list[Path]) -> list[str]:
        leftovers = []
        for path in written:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                leftovers.append(str(path))
        return leftovers

    def table_sizes(self) -> dict[str, tuple[int, int]]:
        """(files, bytes) per table, placeholders excluded. The compactor removes the files
        it merged while this runs (another thread): a file or partition gone between the
        listing and its ``stat`` is not counted (the merged file is)."""
        sizes = {}
        for table in TABLES:
            files = total = 0
            for _bucket, part in self.partitions(table):
                try:
                    entries = [e for e in os.scandir(part) if e.name.endswith(".parquet")]
                except FileNotFoundError:
                    continue
                for entry in entries:
                    try:
                        size = entry.stat().st_size
                    except FileNotFoundError:
                        continue
                    files += 1
                    total += size
            sizes[table] = (files, total)
        return sizes
