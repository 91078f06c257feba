from __future__ import annotations

import numpy as np
import pytest

from collector import records, wire


def _segment(rows: int = 5) -> bytes:
    tx = np.zeros(rows, records.PROBE_TX)
    tx["seq"] = np.arange(rows)
    tx["tx_ns"] = np.arange(rows) * 1000
    hid = records.host_id("h01")
    return wire.encode_header("h01", hid, 42, 123) + wire.encode_chunk("probe_tx", tx)


def test_round_trip_keeps_every_row() -> None:
    seg = wire.decode(_segment())
    assert (seg.host, seg.segment, seg.created_ns) == ("h01", 42, 123)
    assert seg.table("probe_tx")["seq"].tolist() == [0, 1, 2, 3, 4]
    assert len(seg.table("echo")) == 0


def test_torn_tail_is_rejected_unless_recovering() -> None:
    extra = wire.encode_chunk("probe_tx", np.zeros(3, records.PROBE_TX))
    body = _segment() + extra[:-7]  # a second chunk, cut short as by a crash
    with pytest.raises(wire.WireError, match="truncated"):
        wire.decode(body)
    recovered = wire.decode(body, allow_torn_tail=True)
    assert recovered.rows() == 5
    assert recovered.torn_bytes > 0


def test_flipped_bit_fails_crc() -> None:
    body = bytearray(_segment())
    body[-3] ^= 0x40
    with pytest.raises(wire.WireError, match="CRC"):
        wire.decode(bytes(body))


def test_hmac_rejects_other_key_and_altered_body() -> None:
    body = _segment()
    auth = wire.sign(b"fleet-key", body)
    assert wire.verify(b"fleet-key", body, auth)
    assert not wire.verify(b"other-key", body, auth)
    assert not wire.verify(b"fleet-key", body + b"x", auth)
    assert not wire.verify(b"fleet-key", body, None)


def test_host_id_is_stable_and_positive() -> None:
    assert records.host_id("h01") == records.host_id("h01")
    assert records.host_id("h01") != records.host_id("h02")
    assert 0 <= records.host_id("gpu-node-9999") < 2**63


def test_a_segment_says_the_interval_its_collector_ships_at_and_an_older_one_reads_as_unsaid() -> (
    None
):
    from analytics.ingest import body as ingest_body

    rows = np.zeros(3, records.TABLES["probe_tx"])
    chunk = wire.encode_chunk("probe_tx", rows)
    said = wire.encode_header("h1", 7, 1, 10**18, run_ns=5, roll_s=7.25) + chunk
    unsaid = wire.encode_header("h1", 7, 2, 10**18) + chunk
    assert wire.decode(said).roll_s == 7.25 and wire.decode(unsaid).roll_s == 0.0
    (seg,) = ingest_body.decode(said)
    assert (seg.roll_s, seg.run_ns, seg.rows) == (7.25, 5, {"probe_tx": 3})
    assert ingest_body.decode(unsaid)[0].roll_s == 0.0
