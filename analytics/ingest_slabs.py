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
"""

from __future__ import annotations

import sys
import threading

import numpy as np

_ALIGN = 64


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

    def in_use(self) -> int:
        """Slabs that some array still refers to."""
        with self._lock:
            # the list, the generator's variable, getrefcount's argument (+ _current)
            return sum(sys.getrefcount(s) > 3 + (s is self._current) for s in self._slabs)
