"""Growable columnar buffers: rows of a records dtype, appended in place.

Rows live in one preallocated numpy structured array per table; ``take()``
hands the filled part to the spool and starts over. Nothing per row stays
alive as a Python object.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collector import records


class RecordBuffer:
    """Rows of one table (``records.TABLES[table]``) waiting for the spool."""

    def __init__(self, table: str, capacity: int = 1024) -> None:
        self.table = table
        self.dtype = records.TABLES[table]
        self._rows = np.zeros(capacity, dtype=self.dtype)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _reserve(self, extra: int) -> None:
        need = self._n + extra
        if need > len(self._rows):
            grown = np.zeros(max(need, 2 * len(self._rows)), dtype=self.dtype)
            grown[: self._n] = self._rows[: self._n]
            self._rows = grown

    def append(self, row: tuple[Any, ...]) -> None:
        """One row as a tuple in dtype field order (padding fields included)."""
        self._reserve(1)
        self._rows[self._n] = row
        self._n += 1

    def extend(self, rows: np.ndarray) -> None:
        if rows.dtype != self.dtype:
            raise TypeError(f"{self.table}: expected dtype {self.dtype}, got {rows.dtype}")
        self._reserve(len(rows))
        self._rows[self._n : self._n + len(rows)] = rows
        self._n += len(rows)

    def take(self) -> np.ndarray:
        """The buffered rows (a copy), leaving the buffer empty."""
        out = self._rows[: self._n].copy()
        self._n = 0
        return out
