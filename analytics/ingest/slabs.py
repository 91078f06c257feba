"""Memory for the records the ingest daemon keeps, reused once nothing refers to it.

Each group commit hands its probe_tx, probe_rx and echo records to the hot window and the
clock runner, which keep them for seconds (the hot window until it settles them, the
clock runner until their window is solved, ~30 s at long segment intervals). Fresh
memory for every commit costs more than the copy into it: the kernel zeroes each new
page, and on a VM with free-page reporting (virtio-balloon, as on this machine) a page
the process gave back is also faulted in again by the host. In bench_ingest.py's perf
profile 37 % of the daemon's CPU was ``clear_page_erms`` (docs/store.md, "Round 7").

:class:`SlabPool` carves those arrays out of large slabs it keeps for the life of the
process. A slab is reused when no array carved from it is alive any more, which numpy
tells exactly: every view of a slab holds a reference to it, so its reference count
falls back to the pool's own once the last view is gone. Memory then follows the peak
of what is held, pages are zeroed once, and the steady state touches no fresh memory.

A daemon that starts cold still pays for every page in its first minutes, exactly when a
restarted ops box takes the whole fleet's backlog: at 13,000 hosts its first round of
acks took 7-12 s instead of ~1 s (docs/store.md, "Round 8"). :func:`plan_reserve` and
:meth:`SlabPool.reserve` fault that memory in at start, in the background: as much as the
previous run of the same store held at its peak (:func:`read_peaks`, written by the
daemon every minute), or ``reserve_bytes`` of ingest.yml, whichever is more.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

_ALIGN = 64
PARTS = ("records", "bodies")
# reserve_bytes split when the store remembers no peaks (what a 13,000-host run held)
_SPLIT = {"records": 0.8, "bodies": 0.2}
PEAKS_FILE = "memory.json"  # in <store>/_ingest


def touch(buf: np.ndarray) -> None:
    """Fault in every page of ``buf`` now (the kernel zeroes each on its first write)."""
    buf[:: mmap.PAGESIZE] = 0


class SlabPool:
    """``take(nbytes)`` -> a byte array valid as long as the caller keeps a reference."""

    def __init__(self, slab_bytes: int = 256 << 20) -> None:
        if slab_bytes < _ALIGN:
            raise ValueError(f"slab_bytes must be at least {_ALIGN}")
        self.slab_bytes = slab_bytes
        self._slabs: list[np.ndarray] = []
        self._current: np.ndarray | None = None
        self._pos = 0
        self._lock = threading.Lock()
        self.reused = 0  # slabs taken again after every array in them had gone
        self.oversized_bytes = 0  # requests larger than a slab (plain allocations)

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` bytes (uint8, 64-byte aligned) from the current slab or a free one."""
        if nbytes > self.slab_bytes:
            with self._lock:
                self.oversized_bytes += nbytes
            return np.empty(nbytes, np.uint8)
        with self._lock:
            if self._current is None or self._pos + nbytes > len(self._current):
                self._current = None  # so that a full slab with no arrays left is free too
                self._current = self._free_slab()
                self._pos = -self._current.__array_interface__["data"][0] % _ALIGN
            out = self._current[self._pos : self._pos + nbytes]
            self._pos += -(-nbytes // _ALIGN) * _ALIGN
            return out

    def reserve(self, nbytes: int, stop: threading.Event) -> int:
        """Add free slabs, faulted in, until the pool holds ``nbytes`` (or ``stop`` is
        set); returns the bytes added. Safe while other threads take from the pool."""
        added = 0
        while not stop.is_set():
            with self._lock:
                if len(self._slabs) * self.slab_bytes >= nbytes:
                    break
            slab = np.empty(self.slab_bytes + _ALIGN, np.uint8)
            touch(slab)
            with self._lock:
                self._slabs.append(slab)
            del slab  # free for take() from here on
            added += self.slab_bytes
        return added

    def _free_slab(self) -> np.ndarray:
        # a slab nothing else refers to has 3 references here: the list, the loop
        # variable and getrefcount's argument
        for slab in self._slabs:
            if sys.getrefcount(slab) == 3:
                self.reused += 1
                return slab
        slab = np.empty(self.slab_bytes + _ALIGN, np.uint8)  # take() aligns the start
        self._slabs.append(slab)
        return slab

    @property
    def slabs(self) -> int:
        return len(self._slabs)

    @property
    def nbytes(self) -> int:
        return len(self._slabs) * self.slab_bytes

    def in_use_bytes(self) -> int:
        return self.in_use() * self.slab_bytes

    def in_use(self) -> int:
        """Slabs that some array still refers to."""
        with self._lock:
            # the list, the generator's variable, getrefcount's argument (+ _current)
            return sum(sys.getrefcount(s) > 3 + (s is self._current) for s in self._slabs)


def plan_reserve(configured: int, peaks: dict[str, int], available: int) -> dict[str, int]:
    """Bytes to reserve per pool (:data:`PARTS`): the remembered peak or the pool's share
    of ``configured``, whichever is more, all of it scaled down to at most half of
    ``available`` (:func:`mem_available`)."""
    plan = {p: max(int(configured * _SPLIT[p]), int(peaks.get(p, 0))) for p in PARTS}
    total = sum(plan.values())
    if total > available // 2:
        plan = {p: int(v * (available // 2) / total) for p, v in plan.items()}
    return plan


def mem_available() -> int:
    """Bytes this process could still get: MemAvailable of /proc/meminfo (physical memory
    where that is missing), or less where its cgroup (v2) has a ``memory.max``."""
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        group = next(line[3:] for line in lines if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / group.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit != "max":
            used = int((base / "memory.current").read_text())
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError, StopIteration):
        pass
    return available


class PeakTracker:
    """The most the record and body pools held in use since start, sampled
    (:meth:`sample`, once a second) and remembered in ``<store>/_ingest/memory.json``
    (:meth:`save`) for the next start's reserve."""

    def __init__(self, pools: dict[str, SlabPool], directory: Path) -> None:
        self.pools = pools
        self.path = directory / PEAKS_FILE
        self.peaks = dict.fromkeys(PARTS, 0)

    def sample(self) -> None:
        for name, pool in self.pools.items():  # reserved slabs are free: not counted
            self.peaks[name] = max(self.peaks[name], pool.in_use_bytes())

    def save(self) -> None:
        """Atomically replace the file (a hint: no fsync; a lost one costs a cold start)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({**self.peaks, "saved_unix": int(time.time())}) + "\n")
        os.replace(tmp, self.path)


def read_peaks(directory: Path) -> tuple[dict[str, int], str]:
    """The peaks a previous run remembered (empty when none), and why they were not
    readable ("" when they were or there are none)."""
    path = directory / PEAKS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as exc:
        return {}, f"{path}: {exc}"
    if not isinstance(data, dict):
        return {}, f"{path}: expected a JSON object"
    return {p: int(v) for p, v in data.items() if p in PARTS and isinstance(v, int) and v > 0}, ""
