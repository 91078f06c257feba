"""An ingest request body: one collector segment, or several closed segments back to back.

A segment (:mod:`collector.wire`) has no length field: its chunks run to the end of the
file. A body of several segments is their plain concatenation (``cat seg1 seg2 ...``):
where the next chunk header would start, a segment's magic ``CMSEG\\0`` starts the next
segment instead. That is unambiguous because the magic read as a chunk header is table
id 0x4d43, which no table has. One HMAC covers the whole body, so a shipper with a backlog
sends several segments in one request and the ops box pays the per-request cost once.

:func:`decode` checks exactly what :func:`collector.wire.decode` checks (magic, versions,
header, chunk bounds, CRC32 of every chunk; same messages) but keeps each chunk as a view
of the body's bytes instead of a numpy array: the daemon joins the chunks of a whole group
commit and converts them once (docs/store.md, "Performance"). The CRC32 is zlib-ng's when
installed (the same checksum, ~10x faster than zlib's on this machine).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import msgspec
import numpy as np

from collector import records, wire

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - the opsbox extra installs zlib-ng
    from zlib import crc32

_PREAMBLE = struct.Struct("<6sHI")  # magic, format version, header length (collector.wire)
_CHUNK = struct.Struct("<HHII")  # table id, flags, rows, crc32
_MAGIC_AS_TABLE_ID = struct.unpack_from("<H", wire.MAGIC)[0]  # 0x4d43, no table's id
_TABLES = {tid: (name, records.TABLES[name].itemsize) for tid, name in records.TABLE_NAMES.items()}


class _Header(msgspec.Struct):
    host: str
    host_id: int
    segment: int
    schema: int
    created_ns: int
    run_ns: int = 0  # when its collector began to listen for probes (0: not said)
    roll_s: float = 0.0  # its collector ships every that many seconds (0: not said)


_header_decoder = msgspec.json.Decoder(_Header)


@dataclass(eq=False, slots=True)
class SegmentView:
    """One validated segment of a body; chunk payloads are views of the body's bytes."""

    host: str
    host_id: int
    segment: int
    created_ns: int
    nbytes: int
    run_ns: int = 0  # when its collector began to listen for probes (0: not said)
    roll_s: float = 0.0  # its collector ships every that many seconds (0: not said)
    chunks: dict[str, list[memoryview]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def table(self, name: str) -> np.ndarray:
        """All rows of one table (a copy; empty array of the right dtype if none)."""
        return np.frombuffer(b"".join(self.chunks.get(name, ())), records.TABLES[name])


def decode(body: bytes | memoryview) -> list[SegmentView]:
    """Every segment of ``body``; raises :class:`collector.wire.WireError` naming what is
    wrong (with "segment K of the body" when it is not the first)."""
    view = memoryview(body).cast("B")
    end = len(view)
    out: list[SegmentView] = []
    start = 0
    while True:
        try:
            seg, start = _decode_one(view, start, end)
        except wire.WireError as exc:
            if out:
                raise wire.WireError(f"segment {len(out) + 1} of the body: {exc}") from None
            raise
        out.append(seg)
        if start >= end:
            return out


def _decode_one(view: memoryview, start: int, end: int) -> tuple[SegmentView, int]:
    if end - start < _PREAMBLE.size:
        raise wire.WireError(f"segment too short ({end - start} bytes) for its preamble")
    magic, version, hlen = _PREAMBLE.unpack_from(view, start)
    if magic != wire.MAGIC:
        raise wire.WireError("not a clockmesh segment (bad magic)")
    if version != wire.FORMAT_VERSION:
        raise wire.WireError(
            f"segment format version {version} is not supported (expected {wire.FORMAT_VERSION})"
        )
    pos = start + _PREAMBLE.size
    if hlen > wire.MAX_HEADER or pos + hlen > end:
        raise wire.WireError(f"segment header length {hlen} exceeds the body")
    try:
        header = _header_decoder.decode(view[pos : pos + hlen])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise wire.WireError(f"segment header is not valid: {exc!r}") from None
    if header.schema != records.SCHEMA_VERSION:
        raise wire.WireError(
            f"record schema {header.schema} is not supported (expected {records.SCHEMA_VERSION})"
        )
    seg = SegmentView(header.host, header.host_id, header.segment, header.created_ns, 0,
                      header.run_ns, header.roll_s)  # fmt: skip
    chunks, counts = seg.chunks, seg.rows
    pos += hlen
    while pos < end:
        if pos + _CHUNK.size > end:
            if view[pos : pos + 6] == wire.MAGIC:
                break  # a (too short) next segment: decoded and rejected as such
            raise wire.WireError(f"truncated chunk header at byte {pos - start}")
        table_id, _flags, rows, crc = _CHUNK.unpack_from(view, pos)
        if table_id == _MAGIC_AS_TABLE_ID and view[pos : pos + 6] == wire.MAGIC:
            break  # the next segment of the body starts here
        spec = _TABLES.get(table_id)
        if spec is None:
            raise wire.WireError(f"unknown table id {table_id} at byte {pos - start}")
        name, itemsize = spec
        first = pos + _CHUNK.size
        stop = first + rows * itemsize
        if stop > end:
            raise wire.WireError(
                f"truncated {name} chunk at byte {pos - start}: {rows} rows do not fit"
            )
        payload = view[first:stop]
        if crc32(payload) != crc:
            raise wire.WireError(f"{name} chunk at byte {pos - start} fails its CRC")
        if name in chunks:
            chunks[name].append(payload)
            counts[name] += rows
        else:
            chunks[name] = [payload]
            counts[name] = rows
        pos = stop
    seg.nbytes = pos - start
    return seg, pos
