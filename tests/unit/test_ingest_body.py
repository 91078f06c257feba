"""analytics.ingest.body: one or several segments per body, the same checks as wire.decode."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from analytics.ingest import body as ingest_body
from analytics.ingest import load as ingest_load
from collector import wire

IDS = ingest_load.host_ids(30)
T0 = 1_700_000_000 * 10**9


def test_single_segment_matches_wire_decode() -> None:
    body = ingest_load.host_seconds(3, IDS, 1, t0_ns=T0)[0]
    (seg,) = ingest_body.decode(body)
    ref = wire.decode(body)
    assert (seg.host, seg.host_id, seg.segment, seg.created_ns) == (
        ref.host, ref.host_id, ref.segment, ref.created_ns,
    )  # fmt: skip
    assert seg.nbytes == len(body)
    for name in ref.tables:
        assert seg.rows[name] == ref.rows(name)
        assert seg.table(name).tobytes() == ref.table(name).tobytes()


def test_concatenated_segments_split_at_each_magic() -> None:
    segs = ingest_load.host_seconds(7, IDS, 4, t0_ns=T0)
    out = ingest_body.decode(b"".join(segs))
    assert [s.segment for s in out] == [0, 1, 2, 3]
    assert [s.nbytes for s in out] == [len(s) for s in segs]
    tx = np.concatenate([wire.decode(s).table("probe_tx") for s in segs])
    got = np.concatenate([s.table("probe_tx") for s in out])
    assert np.array_equal(got, tx)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda b: b"XXXXXX" + b[6:], "bad magic"),
        (lambda b: b[:-3], "do not fit"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "fails its CRC"),
        (lambda b: b[:6] + struct.pack("<H", 9) + b[8:], "format version 9 is not supported"),
        (lambda b: b[:20], "header length"),
        (lambda b: b[:4], "too short"),
    ],
)
def test_same_errors_as_wire_decode(mangle, message: str) -> None:
    body = mangle(ingest_load.host_seconds(1, IDS, 1, t0_ns=T0)[0])
    with pytest.raises(wire.WireError, match=message) as ours:
        ingest_body.decode(body)
    with pytest.raises(wire.WireError) as theirs:
        wire.decode(body)
    assert str(ours.value) == str(theirs.value)


def test_error_in_a_later_segment_names_it() -> None:
    segs = ingest_load.host_seconds(2, IDS, 3, t0_ns=T0)
    bad = segs[2][:-1] + bytes([segs[2][-1] ^ 0xFF])
    with pytest.raises(wire.WireError, match=r"^segment 3 of the body: .*fails its CRC"):
        ingest_body.decode(segs[0] + segs[1] + bad)
