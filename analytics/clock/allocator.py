"""Keep large numpy buffers in the heap between windows (glibc only).

A window at 10,000 hosts allocates and frees a few hundred MiB of temporaries. By
default glibc serves each large buffer with a fresh ``mmap`` and returns it on
free, so every window pays page faults on every page again (~20-25 % of the solve
time on the development VM). Raising the mmap and trim thresholds keeps freed
buffers in the heap for the next window. Long-running processes that call the
solver (the ingest daemon, the benchmark) call :func:`tune_allocator` once at
start; it is process-wide, so the solver never calls it by itself.

That alone only helps the main thread. A thread other than the first gets its own
glibc arena, made of 64 MiB heaps: a buffer larger than that is mmapped and
unmapped whatever the thresholds, so a solver in a worker thread (the daemon's
clock thread) still faulted in 2,000-4,000 pages a window. ``single_arena``
limits glibc to one arena (``M_ARENA_MAX = 1``), so threads started after the
call share the main heap and its kept buffers. numpy allocates while holding the
GIL, so the shared arena's lock is not contended by Python threads; DuckDB and
Arrow bring their own allocators.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where that is not glibc (looked up once)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def set_mmap_threshold(nbytes: int) -> bool:
    """Give every allocation above ``nbytes`` its own mapping, returned when freed (and
    stop glibc from raising the threshold by itself); False where that is not glibc."""
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_MMAP_THRESHOLD, min(nbytes, 2**31 - 1)) == 1


def tune_allocator(
    mmap_threshold: int = 1 << 30,
    trim_threshold: int = 4 << 30,
    top_pad: int = 256 << 20,
    single_arena: bool = True,
) -> bool:
    """Raise glibc's mmap/trim thresholds (and use one arena); False where that is
    not glibc. Call it before starting the threads that run the solver."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # M_MMAP_THRESHOLD is capped by glibc at HEAP_MAX (32 MiB on 64-bit for the
    # dynamic value, larger when set explicitly): retry smaller on refusal.
    ok = any(
        set_mmap_threshold(value) for value in (mmap_threshold, 512 << 20, 256 << 20, 32 << 20)
    )
    ok &= mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1)) == 1
    mallopt(_M_TOP_PAD, min(top_pad, 2**31 - 1))
    if single_arena:
        ok &= mallopt(_M_ARENA_MAX, 1) == 1
    return ok
