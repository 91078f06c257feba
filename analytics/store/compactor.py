"""Compaction (many small commit files -> few large ones) and retention, crash-safe.

Compacting a group of files in one partition:

1. write an intent ``_ingest/compact-<id>.json`` naming the output and its sources (fsync);
2. stream the sources into the output (temporary name, fsync, rename, directory fsync);
3. delete the sources (directory fsync), then the intent.

Recovery (at daemon start, before anything else): for each intent, if its output exists
the sources are deleted (step 3 is finished), otherwise the temporary output is removed.
Either way every row is in exactly one file afterwards. Readers that list a partition
between steps 2 and 3 can see a row twice for that instant; the daemon never does.

Retention removes whole hour partitions older than the table's retention (the newest
``batches`` partition is always kept: it carries the commit high-water mark).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from analytics.store import layout
from analytics.store.layout import TABLES

if TYPE_CHECKING:  # the writer hands itself in; it imports this module for recover()
    from analytics.store.store_writer import StoreWriter

log = logging.getLogger("clockmesh.ingest.compactor")


def recover(root: Path) -> None:
    """Finish or undo the compaction a crash interrupted (its intent file in ``_ingest/``):
    the writer calls this when it opens the store, before anything else touches it."""
    intent_dir = root / "_ingest"
    for intent in sorted(intent_dir.glob("compact-*.json")):
        try:
            data = json.loads(intent.read_text(encoding="utf-8"))
            output = root / data["output"]
            sources = [root / s for s in data["sources"]]
        except (OSError, ValueError, KeyError, TypeError):
            # The intent itself was torn: nothing was done after it (step 1 fsyncs
            # before step 2 starts), so it is safe to drop.
            intent.unlink()
            continue
        if output.exists():
            for src in sources:
                src.unlink(missing_ok=True)
            log.warning("event=compaction_finished_on_recovery output=%s", data["output"])
        else:
            output.with_name(output.name + ".tmp").unlink(missing_ok=True)
        layout.fsync_dir(output.parent)
        intent.unlink()
    layout.fsync_dir(intent_dir)


@dataclass
class CompactionStats:
    runs: int = 0
    files_merged: int = 0
    files_written: int = 0
    partitions_dropped: int = 0
    seconds: float = 0.0


class Compactor:
    def __init__(
        self,
        writer: StoreWriter,
        *,
        retention_s: dict[str, float] | None = None,
        min_age_s: float = 60.0,
        target_rows: int = 8_000_000,
    ) -> None:
        self.writer = writer
        self.root = writer.root
        self.retention_s = retention_s or {
            name: layout.DEFAULT_RETENTION_S[spec.retention_class] for name, spec in TABLES.items()
        }
        self.min_age_s = min_age_s
        self.target_rows = target_rows
        self.stats = CompactionStats()
        self._intent_seq = 0

    @property
    def _intent_dir(self) -> Path:
        return self.root / "_ingest"

    # ---- recovery ----------------------------------------------------------------
    def recover(self) -> None:
        recover(self.root)

    # ---- compaction --------------------------------------------------------------
    def run(self, now: float | None = None) -> None:
        """One pass: retention, then compaction of every partition with small files."""
        started = time.monotonic()
        now = time.time() if now is None else now
        self.apply_retention(now)
        for table in TABLES:
            for _bucket, part in list(self.writer.partitions(table)):
                self.compact_partition(part, now)
        self.stats.runs += 1
        self.stats.seconds = time.monotonic() - started

    def _candidates(self, part: Path, now: float) -> list[tuple[str, int, int, int]]:
        out = []
        for entry in os.scandir(part):
            rng = layout.file_commit_range(entry.name)
            if rng is None:
                continue
            kind, lo, hi = rng
            if kind == "c" and hi > self.writer.committed:
                continue  # its commit is not durable yet
            if now - entry.stat().st_mtime < self.min_age_s:
                continue
            rows = pq.ParquetFile(part / entry.name).metadata.num_rows
            out.append((entry.name, lo, hi, rows))
        return sorted(out, key=lambda c: (c[1], c[2]))

    def compact_partition(self, part: Path, now: float) -> int:
        """Merge the small files of one partition; returns files merged."""
        files = [c for c in self._candidates(part, now) if c[3] < self.target_rows]
        merged = 0
        group: list[tuple[str, int, int, int]] = []
        rows = 0
        for cand in [*files, None]:
            if cand is not None and rows + cand[3] <= self.target_rows:
                group.append(cand)
                rows += cand[3]
                continue
            if len(group) >= 2:
                merged += self._merge(part, group)
            group = [cand] if cand is not None else []
            rows = cand[3] if cand is not None else 0
        return merged

    def _merge(self, part: Path, group: list[tuple[str, int, int, int]]) -> int:
        lo = min(g[1] for g in group)
        hi = max(g[2] for g in group)
        output = part / f"m{lo:012d}-{hi:012d}.parquet"
        if output.exists():
            log.warning("event=compaction_skipped partition=%s reason=output_exists", part)
            return 0
        self._intent_seq += 1
        intent = self._intent_dir / f"compact-{os.getpid()}-{self._intent_seq}.json"
        rel = lambda p: str(p.relative_to(self.root))  # noqa: E731
        sources = [part / g[0] for g in group]
        payload = {"output": rel(output), "sources": [rel(s) for s in sources]}
        with open(intent, "w", encoding="utf-8") as fh:
            json.dump(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        layout.fsync_dir(self._intent_dir)
        tmp = output.with_name(output.name + ".tmp")
        try:
            schema = pq.read_schema(sources[0])
            with pq.ParquetWriter(
                tmp, schema, compression=self.writer.compression, **layout.parquet_options(schema)
            ) as out:
                for src in sources:
                    out.write_table(pq.read_table(src, schema=schema))
            layout.fsync_file(tmp)
            os.replace(tmp, output)
            layout.fsync_dir(part)
        except BaseException:
            tmp.unlink(missing_ok=True)
            intent.unlink(missing_ok=True)
            raise
        for src in sources:
            src.unlink()
        layout.fsync_dir(part)
        intent.unlink()
        self.stats.files_merged += len(sources)
        self.stats.files_written += 1
        return len(sources)

    # ---- retention ---------------------------------------------------------------
    def apply_retention(self, now: float) -> int:
        dropped = 0
        for table in TABLES:
            keep_s = self.retention_s.get(table)
            if keep_s is None or keep_s <= 0:
                continue
            cutoff = int((now - keep_s) // 3600)
            parts = list(self.writer.partitions(table))
            if table == "batches" and parts:
                parts = parts[:-1]
            for bucket, part in parts:
                if bucket + 1 > cutoff:
                    break
                shutil.rmtree(part)
                dropped += 1
                date_dir = part.parent
                if not any(date_dir.iterdir()):
                    date_dir.rmdir()
                layout.fsync_dir(date_dir.parent)
        self.stats.partitions_dropped += dropped
        if dropped:
            log.info("event=retention_applied partitions=%d", dropped)
        return dropped
