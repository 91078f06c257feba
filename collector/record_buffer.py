"""Record buffers: rows of a records dtype, packed into one growing byte buffer.

A row is packed with a ``struct`` whose layout is exactly the dtype's (fields in
order, little-endian, ``_pad*`` fields as zero padding), appended to a
``bytearray``, and ``take()`` hands the rows to the spool as a numpy structured
array (``np.frombuffer``) — no per-row Python objects stay alive, and appending
costs one ``struct.pack_into``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from collector import records

_CODES = {"<u8": "Q", "<i8": "q", "<u4": "I", "<i4": "i", "<u2": "H", "<i2": "h", "|u1": "B"}


def row_struct(dtype: np.dtype) -> struct.Struct:
    """A struct packing one row of ``dtype`` from its non-padding fields, in order."""
    fmt = "<"
    for name in dtype.names or ():
        field = dtype.fields[name][0]  # type: ignore[index]
        if name.startswith("_pad"):
            fmt += f"{field.itemsize}x"
        elif field.kind == "S":
            fmt += f"{field.itemsize}s"
        else:
            fmt += _CODES[field.str]
    packer = struct.Struct(fmt)
    if packer.size != dtype.itemsize:
        raise TypeError(f"cannot mirror dtype {dtype} with struct {fmt!r}")
    return packer


class RecordBuffer:
    """Rows of one table (``records.TABLES[table]``) waiting for the spool."""

    def __init__(self, table: str, capacity: int = 1024) -> None:
        self.table = table
        self.dtype = records.TABLES[table]
        self._row = row_struct(self.dtype)
        self._size = self.dtype.itemsize
        self._buf = bytearray(capacity * self._size)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _reserve(self, extra: int) -> None:
        need = (self._n + extra) * self._size
        if need > len(self._buf):
            self._buf.extend(bytes(max(need, 2 * len(self._buf)) - len(self._buf)))

    def append(self, *values: Any) -> None:
        """One row: the dtype's fields in order, *without* the ``_pad`` fields."""
        self._reserve(1)
        self._row.pack_into(self._buf, self._n * self._size, *values)
        self._n += 1

    def extend(self, rows: np.ndarray) -> None:
        if rows.dtype != self.dtype:
            raise TypeError(f"{self.table}: expected dtype {self.dtype}, got {rows.dtype}")
        self._reserve(len(rows))
        start = self._n * self._size
        data = np.ascontiguousarray(rows).tobytes()
        self._buf[start : start + len(data)] = data
        self._n += len(rows)

    def take(self) -> np.ndarray:
        """The buffered rows (a copy), leaving the buffer empty."""
        out = np.frombuffer(self._buf, dtype=self.dtype, count=self._n).copy()
        self._n = 0
        return out
