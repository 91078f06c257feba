"""Processes the lab starts, found and stopped by PID (never by name).

A recorded process is ``{"pid": int, "start": int, ...}`` where ``start`` is the
process start time from ``/proc/PID/stat``: a PID is only signalled if its start time
still matches, so a recycled PID of someone else's process is never killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

NETNS_DIR = Path("/run/netns")


def start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of ``pid``, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def record(pid: int, **info: Any) -> dict[str, Any]:
    return {"pid": pid, "start": start_time(pid) or 0, **info}


def alive(rec: dict[str, Any]) -> bool:
    start = start_time(int(rec["pid"]))
    return start is not None and start == rec.get("start", start)


def pids_in_namespaces(names: Iterable[str]) -> dict[str, list[int]]:
    """Like ``ip netns pids NS`` for several namespaces in one pass over /proc."""
    inodes: dict[tuple[int, int], str] = {}
    for name in names:
        try:
            st = os.stat(NETNS_DIR / name)
        except OSError:
            continue
        inodes[(st.st_dev, st.st_ino)] = name
    found: dict[str, list[int]] = {name: [] for name in inodes.values()}
    if not inodes:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue
        ns = inodes.get((st.st_dev, st.st_ino))
        if ns is not None:
            found[ns].append(int(entry.name))
    return found


def pids_running(argv_tail: list[str]) -> list[int]:
    """PIDs whose command line ends with exactly ``argv_tail`` (a lab's own file among its
    arguments: a process of that lab, found when its record was lost with state.json)."""
    want = [a.encode() for a in argv_tail]
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if args[-len(want) :] == want:
            found.append(int(entry.name))
    return found


def terminate(pids: Iterable[int], timeout: float = 3.0) -> list[int]:
    """SIGTERM the PIDs, wait up to ``timeout``, SIGKILL survivors. Returns signalled PIDs."""
    targets = {pid: start_time(pid) for pid in set(pids) if pid > 1 and pid != os.getpid()}
    targets = {pid: st for pid, st in targets.items() if st is not None}
    for pid in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(targets)
        if all(start_time(pid) != st for pid, st in targets.items()):
            break
        time.sleep(0.05)
    for pid, st in targets.items():
        if start_time(pid) == st:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    time.sleep(0.01)
    _reap(targets)
    return sorted(targets)


def terminate_records(records: Iterable[dict[str, Any]], timeout: float = 3.0) -> list[int]:
    """Terminate recorded processes whose PID still belongs to the same process."""
    return terminate([int(r["pid"]) for r in records if alive(r)], timeout)


def _reap(pids: Iterable[int]) -> None:
    # Reap only the processes we just signalled, if they are our children (sshd started
    # by this process): never waitpid(-1), which would steal other code's children.
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
