"""An ingest request body: one collector segment, or several closed segments back to back.

A segment (:mod:`collector.wire`) has no length field: its chunks run to the end of the
file. A body of several segments is their plain concatenation (``cat seg1 seg2 ...``):
where the next chunk header would start, a segment's magic ``CMSEG\\0`` starts the next
segment instead. That is unambiguous because the magic read as a chunk header is table
id 0x4d43, which no table has. One HMAC covers the whole body, so a shipper with a backlog
sends several segments in one request and the ops box pays the per-request cost once.
"""

from __future__ import annotations

import struct

from collector import records, wire

_PREAMBLE = struct.Struct("<6sHI")  # magic, format version, header length (collector.wire)
_CHUNK = struct.Struct("<HHII")  # table id, flags, rows, crc32
_ITEMSIZE = {tid: records.TABLES[name].itemsize for tid, name in records.TABLE_NAMES.items()}


def split(body: bytes | memoryview) -> list[memoryview]:
    """The segments of ``body``, each a view for :func:`collector.wire.decode`.

    Only boundaries are found here; ``wire.decode`` validates each segment (magic,
    version, header, chunk sizes, CRCs). A body that is not segments back to back is
    returned whole so that ``wire.decode`` names what is wrong with it.
    """
    view = memoryview(body)
    end = len(view)
    out: list[memoryview] = []
    start = 0
    while True:
        if end - start < _PREAMBLE.size:
            break
        magic, _version, hlen = _PREAMBLE.unpack_from(view, start)
        if magic != wire.MAGIC:
            break
        pos = start + _PREAMBLE.size + hlen
        while pos + _CHUNK.size <= end and view[pos : pos + 6] != wire.MAGIC:
            table_id, _flags, rows, _crc = _CHUNK.unpack_from(view, pos)
            size = _ITEMSIZE.get(table_id)
            if size is None:
                break
            pos += _CHUNK.size + rows * size
        if pos >= end or view[pos : pos + 6] != wire.MAGIC:
            break  # the last segment runs to the end of the body
        out.append(view[start:pos])
        start = pos
    out.append(view[start:])
    return out
