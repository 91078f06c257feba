"""The segment format: what a collector spools to disk and ships to the ops box.

A segment file *is* the HTTP batch body, byte for byte, so shipping is "POST the
file" and the ops box validates exactly what was fsynced.

Layout (all little-endian)::

    magic    8 bytes  b"CMSEG\\x00" + u16 format version (1)
    hlen     u32      length of the JSON header
    header   hlen     UTF-8 JSON: {"host", "host_id", "segment", "schema", "created_ns"},
                      and "run_ns" (when the collector that wrote it began to listen for
                      probes) and "roll_s" (how long it was to stay open: the interval at
                      which that collector ships), both absent from segments of
                      collectors older than them
    chunk*            repeated until end of file:
      table  u16      records.TABLE_IDS[...]
      flags  u16      0
      rows   u32      number of rows
      crc    u32      zlib.crc32 of the payload
      payload         rows * TABLES[table].itemsize bytes of that structured dtype

Chunks are appended as records accumulate; a crash can leave a torn last chunk,
which :func:`decode` can skip (``allow_torn_tail=True``) when the collector
recovers its own open segment, and which the ops box always rejects.

Batches are authenticated with HMAC-SHA256 over the whole body under the fleet
key, sent in the ``Authorization: CLOCKMESH-HMAC-SHA256 <hex>`` header.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from collector.records import SCHEMA_VERSION, TABLE_IDS, TABLE_NAMES, TABLES

MAGIC = b"CMSEG\x00"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<6sHI")  # magic, format version, header length
_CHUNK = struct.Struct("<HHII")  # table id, flags, rows, crc32
MAX_HEADER = 64 * 1024
AUTH_SCHEME = "CLOCKMESH-HMAC-SHA256"


class WireError(ValueError):
    """A segment or batch is malformed; the message says which part and why."""


@dataclass
class Segment:
    host: str
    host_id: int
    segment: int
    schema: int
    created_ns: int
    run_ns: int = 0  # its collector began to listen for probes then (0: not said)
    roll_s: float = 0.0  # its collector ships every that many seconds (0: not said)
    tables: dict[str, list[np.ndarray]] = field(default_factory=dict)
    torn_bytes: int = 0  # bytes dropped from a torn tail (collector recovery only)

    def rows(self, table: str | None = None) -> int:
        names = [table] if table else list(self.tables)
        return sum(len(a) for n in names for a in self.tables.get(n, []))

    def table(self, name: str) -> np.ndarray:
        """All rows of one table, concatenated (empty array of the right dtype if none)."""
        parts = self.tables.get(name, [])
        if not parts:
            return np.empty(0, dtype=TABLES[name])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def encode_header(
    host: str, host_id: int, segment: int, created_ns: int, run_ns: int = 0, roll_s: float = 0.0
) -> bytes:
    """``run_ns``: when the collector writing the segment began to listen for probes
    (its run; 0: not said). The ops box tells a collector's restart from it: probes sent
    to the host between its runs were lost to no listener, not to the fabric.
    ``roll_s``: how long the segment is to stay open (the collector's shipping interval;
    0: not said). The ops box waits that long for its rows before it solves a window and
    before it calls the host silent."""
    fields: dict[str, object] = {
        "host": host,
        "host_id": host_id,
        "segment": segment,
        "schema": SCHEMA_VERSION,
        "created_ns": created_ns,
    }
    if run_ns:
        fields["run_ns"] = run_ns
    if roll_s:
        fields["roll_s"] = round(roll_s, 3)
    header = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    return _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header)) + header


def encode_chunk(table: str, rows: np.ndarray) -> bytes:
    """One chunk of ``rows`` (a structured array of ``TABLES[table]``)."""
    dtype = TABLES[table]
    if rows.dtype != dtype:
        raise TypeError(f"chunk for {table}: expected dtype {dtype}, got {rows.dtype}")
    payload = np.ascontiguousarray(rows).tobytes()
    return _CHUNK.pack(TABLE_IDS[table], 0, len(rows), zlib.crc32(payload)) + payload


def decode(body: bytes | memoryview, *, allow_torn_tail: bool = False) -> Segment:
    """Parse a whole segment. Raises :class:`WireError` naming what is wrong."""
    view = memoryview(body)
    if len(view) < _PREAMBLE.size:
        raise WireError(f"segment too short ({len(view)} bytes) for its preamble")
    magic, version, hlen = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireError("not a clockmesh segment (bad magic)")
    if version != FORMAT_VERSION:
        raise WireError(
            f"segment format version {version} is not supported (expected {FORMAT_VERSION})"
        )
    if hlen > MAX_HEADER or _PREAMBLE.size + hlen > len(view):
        raise WireError(f"segment header length {hlen} exceeds the body")
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : _PREAMBLE.size + hlen]))
        seg = Segment(
            host=str(header["host"]),
            host_id=int(header["host_id"]),
            segment=int(header["segment"]),
            schema=int(header["schema"]),
            created_ns=int(header["created_ns"]),
            run_ns=int(header.get("run_ns", 0)),
            roll_s=float(header.get("roll_s", 0.0)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"segment header is not valid: {exc!r}") from None
    if seg.schema != SCHEMA_VERSION:
        raise WireError(f"record schema {seg.schema} is not supported (expected {SCHEMA_VERSION})")
    pos = _PREAMBLE.size + hlen
    end = len(view)
    while pos < end:
        try:
            pos = _decode_chunk(view, pos, seg)
        except WireError:
            if not allow_torn_tail:
                raise
            seg.torn_bytes = end - pos
            break
    return seg


def _decode_chunk(view: memoryview, pos: int, seg: Segment) -> int:
    if pos + _CHUNK.size > len(view):
        raise WireError(f"truncated chunk header at byte {pos}")
    table_id, _flags, rows, crc = _CHUNK.unpack_from(view, pos)
    name = TABLE_NAMES.get(table_id)
    if name is None:
        raise WireError(f"unknown table id {table_id} at byte {pos}")
    dtype = TABLES[name]
    start = pos + _CHUNK.size
    stop = start + rows * dtype.itemsize
    if stop > len(view):
        raise WireError(f"truncated {name} chunk at byte {pos}: {rows} rows do not fit")
    payload = view[start:stop]
    if zlib.crc32(payload) != crc:
        raise WireError(f"{name} chunk at byte {pos} fails its CRC")
    seg.tables.setdefault(name, []).append(np.frombuffer(payload, dtype=dtype))
    return stop


def sign(key: bytes, body: bytes | memoryview) -> str:
    """The Authorization header value for ``body`` under the fleet key."""
    return f"{AUTH_SCHEME} {hmac.new(key, body, hashlib.sha256).hexdigest()}"


def verify(key: bytes, body: bytes | memoryview, authorization: str | None) -> bool:
    if not authorization or not authorization.startswith(AUTH_SCHEME + " "):
        return False
    expected = hmac.new(key, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, authorization[len(AUTH_SCHEME) + 1 :].strip())
