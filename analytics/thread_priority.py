"""Per-thread CPU priority for the ops box's background analysis.

Linux keeps a nice value per thread, so the ingest daemon lowers only its analysis
threads (clock solver, live view and rollups, compaction): on a busy ops box the
scheduler then runs request handling, commits and acknowledgements first, and the
analysis uses what is left, skipping clock windows it cannot reach (counted in
``/metrics``) rather than delaying acknowledgements past the collectors' timeout.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("clockmesh.ingest")


def lower_thread_priority(nice: int) -> None:
    """Add ``nice`` to the calling thread's nice value (0: leave it). Never fails the
    caller: where the platform has no per-thread priority, it logs and goes on."""
    if nice <= 0:
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
    except OSError as exc:
        log.warning("event=thread_priority_unchanged thread=%s error=%s", tid, exc)
