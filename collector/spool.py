"""The local append-only spool: segment files in the :mod:`collector.wire` format.

Directory layout (``spool.dir``)::

    next_segment            the next segment id (decimal), replaced atomically
    0000000000000042.open   the segment being written: header, then chunks appended
    0000000000000041.seg    closed (fsynced) segments, shipped in id order
    ack-<box>               per ops box: the highest segment id it acknowledged (all lower
                            ones too), replaced atomically with fsync after each ack
    rejected/               segments an ops box refused with a 4xx (kept for humans)

Life of a segment: its id is reserved durably (``next_segment`` written with
fsync *before* the file exists, so ids are monotonic per host across restarts
and crashes). Ids are reserved in blocks of ``ID_BLOCK``: ``next_segment`` holds
the first id of the next block and is rewritten once per block, not once per
segment; after a crash the next id is that value, so ids jump forward by up to
``ID_BLOCK`` (gaps are harmless: the ops box dedups by (host, segment id)); a
clean :meth:`Spool.close` stores the exact next id, so a restart leaves no gap.
Chunks are appended with plain ``write`` (no user-space buffer, so a ``kill -9``
loses nothing the kernel has); on roll (every ``roll_s`` or ``roll_bytes``) the
file is fsynced and renamed to ``.seg`` (directory fsynced too). The interval is
``max(roll_s, advised)``, never above ``max(roll_s, max_roll_s)``: the ops box
advises a longer one in its acknowledgements when its fleet sends more requests
than it budgets for (docs/collector.md, "Shipping contract"). On start, a
left-over ``.open`` file is cut back to its valid prefix
(``wire.decode(allow_torn_tail=True)``) and closed. Past ``max_bytes`` the
oldest closed segments are deleted and their rows counted as dropped (per ops box
that had not acknowledged them yet, too).

Several ops boxes (docs/collector.md, "Two ops boxes"): each box has its own
acknowledgement cursor (``ack-<box>``); a box's shipper takes the oldest closed
segments above its cursor, and a segment is deleted once every box's cursor is at
or past it. Closed segments have increasing ids and each box's shipper goes oldest
first, so "everything up to the cursor is done for that box" holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collector import wire

log = logging.getLogger("clockmesh.collector.spool")
_NAME = re.compile(r"^(\d{16})\.(seg|open)$")
# Segment ids reserved per fsynced ``next_segment`` rewrite (one per ~100 s of
# 1.5-s segments instead of one per segment).
ID_BLOCK = 64


@dataclass
class BoxCursor:
    """One ops box's progress through the spool."""

    acked: int = 0  # every closed id <= this is done (acknowledged or rejected) for the box
    in_flight: frozenset[int] = frozenset()  # ids its shipper is posting; never dropped
    dropped_segments: int = 0  # dropped by the size bound before this box acknowledged them
    dropped_rows: int = 0
    rejected_segments: int = 0


@dataclass
class SpoolStats:
    segments_closed: int = 0
    rows_written: int = 0
    dropped_segments: int = 0
    dropped_rows: int = 0
    recovered_segments: int = 0
    recovered_torn_bytes: int = 0
    rejected_segments: int = 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segment_name(seg_id: int, suffix: str) -> str:
    return f"{seg_id:016d}.{suffix}"


class Spool:
    """Writer side of the spool (one per collector; the shipper reads closed files)."""

    def __init__(
        self,
        directory: str | Path,
        host: str,
        host_id: int,
        *,
        max_bytes: int,
        roll_s: float,
        roll_bytes: int,
        max_roll_s: float = 30.0,
        now_ns: Callable[[], int] = time.time_ns,
        boxes: Sequence[str] = (),
    ) -> None:
        self.dir = Path(directory)
        self.host = host
        self.host_id = host_id
        self.max_bytes = max_bytes
        self.roll_s = roll_s
        self.max_roll_s = max_roll_s
        self.advised_roll_s = 0.0  # the ops box's advice (shipper thread sets it)
        self.roll_bytes = roll_bytes
        self._now_ns = now_ns
        # when this collector began to listen for probes (its run; 0 until it says):
        # written into each segment's header (collector.wire.encode_header)
        self.run_ns = 0
        self.stats = SpoolStats()
        self.lock = threading.Lock()  # guards the closed-segment map (shipper vs. dropper)
        self._closed: dict[int, tuple[int, int]] = {}  # id -> (bytes, rows)
        self.in_flight: frozenset[int] = frozenset()  # ids being posted; never dropped
        self.boxes: dict[str, BoxCursor] = {}  # ops box key -> its cursor
        self._fd: int | None = None
        self._open_id = 0
        self._open_bytes = 0
        self._open_rows = 0
        self._opened_mono = 0.0
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rejected").mkdir(exist_ok=True)
        self._next_id = self._read_next_id()
        self._reserved = self._next_id  # ids below this are durably reserved
        for box in boxes:
            self.boxes[box] = BoxCursor(acked=self._read_cursor(box))
        self._recover()
        self._collect()

    # ---- start-up -------------------------------------------------------------------
    def _read_next_id(self) -> int:
        path = self.dir / "next_segment"
        try:
            stored = int(path.read_text().strip() or "1")
        except FileNotFoundError:
            stored = 1
        except ValueError:
            log.warning("event=spool_bad_next_segment path=%s action=rescan", path)
            stored = 1
        highest = 0
        for entry in self.dir.iterdir():
            m = _NAME.match(entry.name)
            if m:
                highest = max(highest, int(m.group(1)))
        return max(stored, highest + 1)

    def _recover(self) -> None:
        for entry in sorted(self.dir.iterdir()):
            m = _NAME.match(entry.name)
            if not m:
                continue
            seg_id = int(m.group(1))
            if m.group(2) == "open":
                self._recover_open(entry, seg_id)
            else:
                try:
                    seg = wire.decode(entry.read_bytes())
                    self._closed[seg_id] = (entry.stat().st_size, seg.rows())
                except wire.WireError as exc:
                    self._reject_local(entry, f"unreadable closed segment: {exc}")
        self._enforce_bound()

    def _recover_open(self, path: Path, seg_id: int) -> None:
        body = path.read_bytes()
        try:
            seg = wire.decode(body, allow_torn_tail=True)
        except wire.WireError as exc:
            # Not even a header: nothing in it was ever shippable.
            log.warning("event=spool_recover_discard path=%s reason=%r", path, str(exc))
            path.unlink()
            return
        valid = len(body) - seg.torn_bytes
        if seg.rows() == 0:
            path.unlink()
            log.info("event=spool_recover_empty segment=%d", seg_id)
            return
        with open(path, "r+b") as fh:
            fh.truncate(valid)
            fh.flush()
            os.fsync(fh.fileno())
        closed = path.with_name(segment_name(seg_id, "seg"))
        os.replace(path, closed)
        _fsync_dir(self.dir)
        self._closed[seg_id] = (valid, seg.rows())
        self.stats.recovered_segments += 1
        self.stats.recovered_torn_bytes += seg.torn_bytes
        log.info(
            "event=spool_recovered segment=%d rows=%d torn_bytes=%d",
            seg_id,
            seg.rows(),
            seg.torn_bytes,
        )

    def _reject_local(self, path: Path, reason: str) -> None:
        target = self.dir / "rejected" / path.name
        os.replace(path, target)
        self.stats.rejected_segments += 1
        log.warning("event=spool_rejected path=%s reason=%r", target, reason)

    # ---- writing --------------------------------------------------------------------
    def _store_next_id(self, value: int) -> None:
        """``next_segment`` = ``value``, durably (fsynced file, then atomic rename)."""
        tmp = self.dir / "next_segment.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, f"{value}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.dir / "next_segment")

    def _reserve_id(self) -> int:
        seg_id = self._next_id
        if seg_id >= self._reserved:
            # Reserve a block before the first of its ids is used: a crash anywhere
            # in it restarts past the block, never below an id already handed out.
            self._store_next_id(seg_id + ID_BLOCK)
            self._reserved = seg_id + ID_BLOCK
        self._next_id += 1
        return seg_id

    def _open(self) -> None:
        seg_id = self._reserve_id()
        path = self.dir / segment_name(seg_id, "open")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o640)
        header = wire.encode_header(
            self.host, self.host_id, seg_id, self._now_ns(), self.run_ns, self.effective_roll_s()
        )
        os.write(fd, header)
        self._fd = fd
        self._open_id = seg_id
        self._open_bytes = len(header)
        self._open_rows = 0
        self._opened_mono = time.monotonic()

    def write(self, table: str, rows: np.ndarray) -> None:
        """Append one chunk to the open segment (opening one if needed)."""
        self.write_many([(table, rows)])

    def write_many(self, tables: list[tuple[str, np.ndarray]]) -> None:
        """Append one chunk per (table, rows), in order, with one ``write`` call (the
        same bytes as :meth:`write` of each; a flush costs one system call)."""
        tables = [(table, rows) for table, rows in tables if len(rows)]
        if not tables:
            return
        if self._fd is None:
            self._open()
        data = b"".join([wire.encode_chunk(table, rows) for table, rows in tables])
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)  # type: ignore[arg-type]
            view = view[written:]
        rows_in = sum(len(rows) for _table, rows in tables)
        self._open_bytes += len(data)
        self._open_rows += rows_in
        self.stats.rows_written += rows_in

    def due(self) -> bool:
        """True when the open segment should be rolled (by age or size)."""
        if self._fd is None:
            return False
        age = time.monotonic() - self._opened_mono
        return age >= self.effective_roll_s() or self._open_bytes >= self.roll_bytes

    def advise(self, roll_s: float) -> None:
        """The ops box wants segments of ``roll_s`` seconds (from its last ack)."""
        self.advised_roll_s = roll_s

    def effective_roll_s(self) -> float:
        """``max(roll_s, advised)``, capped at ``max(roll_s, max_roll_s)``."""
        return min(max(self.roll_s, self.advised_roll_s), max(self.roll_s, self.max_roll_s))

    def roll(self) -> int | None:
        """Close the open segment durably; returns its id (None if nothing was open)."""
        if self._fd is None:
            return None
        fd, seg_id = self._fd, self._open_id
        self._fd = None
        os.fsync(fd)
        os.close(fd)
        os.replace(self.dir / segment_name(seg_id, "open"), self.dir / segment_name(seg_id, "seg"))
        _fsync_dir(self.dir)
        with self.lock:
            self._closed[seg_id] = (self._open_bytes, self._open_rows)
        self.stats.segments_closed += 1
        self._enforce_bound()
        return seg_id

    def _enforce_bound(self) -> None:
        with self.lock:
            total = sum(size for size, _ in self._closed.values())
            for seg_id in sorted(self._closed):
                if total <= self.max_bytes:
                    break
                if seg_id in self.in_flight or any(
                    seg_id in cur.in_flight for cur in self.boxes.values()
                ):
                    continue
                size, rows = self._closed.pop(seg_id)
                for cur in self.boxes.values():
                    if cur.acked < seg_id:
                        cur.dropped_segments += 1
                        cur.dropped_rows += rows
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / segment_name(seg_id, "seg")).unlink()
                total -= size
                self.stats.dropped_segments += 1
                self.stats.dropped_rows += rows
                log.warning(
                    "event=spool_dropped_oldest segment=%d rows=%d bytes=%d", seg_id, rows, size
                )

    # ---- shipper side ---------------------------------------------------------------
    def oldest_closed(self) -> int | None:
        with self.lock:
            return min(self._closed) if self._closed else None

    def path_of(self, seg_id: int) -> Path:
        return self.dir / segment_name(seg_id, "seg")

    def acknowledged(self, seg_id: int) -> None:
        """The ops box stored ``seg_id`` durably: forget it."""
        with self.lock:
            self._closed.pop(seg_id, None)
            with contextlib.suppress(FileNotFoundError):
                self.path_of(seg_id).unlink()

    # ---- several ops boxes ------------------------------------------------------------
    def _cursor_path(self, box: str) -> Path:
        return self.dir / f"ack-{box}"

    def _read_cursor(self, box: str) -> int:
        path = self._cursor_path(box)
        try:
            return int(path.read_text().strip() or "0")
        except FileNotFoundError:
            return 0
        except ValueError:
            # Unreadable: start from the oldest segment (the box answers "duplicate").
            log.warning("event=spool_bad_ack_cursor path=%s action=resend", path)
            return 0

    def _store_cursor(self, box: str, value: int) -> None:
        """``ack-<box>`` = ``value``, durably (fsynced file, then atomic rename)."""
        path = self._cursor_path(box)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, f"{value}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def set_boxes(self, boxes: Sequence[str]) -> None:
        """The ops boxes segments go to (all at once: a segment is deleted only when every
        box listed here is past it). A new box starts at its stored cursor, or at the
        oldest segment; a box no longer listed stops holding segments back."""
        with self.lock:
            self.boxes = {
                box: self.boxes.get(box) or BoxCursor(acked=self._read_cursor(box)) for box in boxes
            }
        self._collect()

    def ensure_box(self, box: str) -> None:
        """Register ``box`` if unknown (a lone shipper; several go through set_boxes)."""
        with self.lock:
            if box not in self.boxes:
                self.boxes[box] = BoxCursor(acked=self._read_cursor(box))

    def pending(self, box: str, limit: int, max_bytes: int) -> list[int]:
        """The oldest closed ids ``box`` has not acknowledged, at most ``limit`` and
        ``max_bytes`` together (at least one when any is waiting)."""
        with self.lock:
            cur = self.boxes.get(box)
            if cur is None:  # no longer listed (a reload removed it): nothing to ship
                return []
            acked = cur.acked
            out: list[int] = []
            total = 0
            for seg_id in sorted(i for i in self._closed if i > acked)[:limit]:
                size = self._closed[seg_id][0]
                if out and total + size > max_bytes:
                    break
                out.append(seg_id)
                total += size
            return out

    def set_in_flight(self, box: str, ids: Sequence[int]) -> None:
        with self.lock:
            cur = self.boxes.get(box)
            if cur is not None:
                cur.in_flight = frozenset(ids)

    def box_done(self, box: str, upto: int, rejected: str = "") -> None:
        """``box`` stored every segment up to ``upto`` durably (``rejected``: it refused
        ``upto`` with that reason; a copy goes to ``rejected/``). The cursor is stored
        before any file is deleted, so a crash in between only re-sends."""
        cur = self.boxes.get(box)
        if cur is None or upto <= cur.acked:  # a box no longer listed holds nothing back
            return
        if rejected:
            self._keep_rejected(upto, rejected)
            cur.rejected_segments += 1
        self._store_cursor(box, upto)
        with self.lock:
            cur.acked = upto
        self._collect()

    def _keep_rejected(self, seg_id: int, reason: str) -> None:
        target = self.dir / "rejected" / segment_name(seg_id, "seg")
        try:
            os.link(self.path_of(seg_id), target)
        except FileExistsError:
            return  # another box refused it too
        except FileNotFoundError:
            return  # dropped by the bound meanwhile
        with self.lock:
            self.stats.rejected_segments += 1
        log.warning("event=spool_rejected path=%s reason=%r", target, reason)

    def _collect(self) -> None:
        """Delete the closed segments every box is past."""
        with self.lock:
            if not self.boxes:
                return
            upto = min(cur.acked for cur in self.boxes.values())
            for seg_id in [i for i in self._closed if i <= upto]:
                del self._closed[seg_id]
                with contextlib.suppress(FileNotFoundError):
                    self.path_of(seg_id).unlink()

    def box_depth(self, box: str) -> tuple[int, int, int]:
        """(closed segments, bytes, rows) waiting for ``box``."""
        with self.lock:
            acked = self.boxes[box].acked
            waiting = [v for i, v in self._closed.items() if i > acked]
            return len(waiting), sum(s for s, _ in waiting), sum(r for _, r in waiting)

    def depth(self) -> tuple[int, int, int]:
        """(closed segments, their bytes, their rows) waiting to be shipped."""
        with self.lock:
            return (
                len(self._closed),
                sum(s for s, _ in self._closed.values()),
                sum(r for _, r in self._closed.values()),
            )

    def close(self) -> None:
        """Roll the open segment; store the exact next id (a clean restart leaves no gap)."""
        self.roll()
        if self._reserved > self._next_id:
            try:
                self._store_next_id(self._next_id)
            except OSError as exc:  # the reserved block stays valid: ids just jump
                log.warning("event=spool_next_segment_failed error=%r", exc.strerror)
                return
            self._reserved = self._next_id
