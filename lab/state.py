"""``state.json``: everything a lab created, written *before* each thing is created.

``lab down`` trusts this file (plus a scan of namespaces and root links carrying the
lab's alias), so it can undo a lab after a crash or a SIGKILLed ``lab up``. Writes are
atomic (temp file + rename) under an exclusive lock on ``state.lock``, so background
fault injectors and a concurrent ``status`` never see a torn file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
MARKER_FILE = ".clockmesh-lab"


class LabState:
    """The state file of one lab, in its state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / STATE_FILE

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # A torn/corrupt file must not stop `down`: fall back to the scan.
            return {}
        return data if isinstance(data, dict) else {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "state.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write under the lock: ``with state.update() as s: s[...] = ...``."""
        with self.locked():
            data = self.read()
            yield data
            self._write(data)

    def add(self, key: str, *items: Any) -> None:
        """Append items to a list in the state (no duplicates)."""
        with self.update() as data:
            lst = data.setdefault(key, [])
            for item in items:
                if item not in lst:
                    lst.append(item)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
