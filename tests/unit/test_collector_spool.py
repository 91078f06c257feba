from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from collector import records, wire
from collector.spool import ID_BLOCK, Spool


def _spool(tmp_path: Path, **kw: int | float) -> Spool:
    opts: dict = {"max_bytes": 10**9, "roll_s": 3600.0, "roll_bytes": 10**9} | kw
    return Spool(tmp_path / "spool", "h01", records.host_id("h01"), **opts)


def _tx(seqs: range) -> np.ndarray:
    rows = np.zeros(len(seqs), records.PROBE_TX)
    rows["seq"] = np.asarray(seqs)
    return rows


def test_roll_closes_a_decodable_segment_with_every_row(tmp_path: Path) -> None:
    sp = _spool(tmp_path)
    sp.write("probe_tx", _tx(range(10)))
    sp.write("probe_tx", _tx(range(10, 15)))
    seg_id = sp.roll()
    assert seg_id == 1 and sp.roll() is None
    seg = wire.decode(sp.path_of(seg_id).read_bytes())
    assert seg.table("probe_tx")["seq"].tolist() == list(range(15))
    assert (seg.host, seg.segment) == ("h01", 1)
    assert sp.depth() == (1, sp.path_of(1).stat().st_size, 15)


def test_write_many_appends_the_same_bytes_as_one_write_per_table(tmp_path: Path) -> None:
    health = np.zeros(3, records.HEALTH)
    health["value"] = [1, 2, 3]
    tables = [("probe_tx", _tx(range(4))), ("echo", np.zeros(0, records.ECHO)), ("health", health)]
    one = Spool(tmp_path / "one", "h01", 7, max_bytes=10**9, roll_s=3600.0, roll_bytes=10**9,
                now_ns=lambda: 42)  # fmt: skip
    many = Spool(tmp_path / "many", "h01", 7, max_bytes=10**9, roll_s=3600.0, roll_bytes=10**9,
                 now_ns=lambda: 42)  # fmt: skip
    for table, rows in tables:
        one.write(table, rows)
    many.write_many(tables)
    many.write_many([("echo", np.zeros(0, records.ECHO))])  # nothing to write: no-op
    assert one.roll() == many.roll() == 1
    assert one.path_of(1).read_bytes() == many.path_of(1).read_bytes()
    assert many.stats.rows_written == 7 and many.depth()[2] == 7
    seg = wire.decode(many.path_of(1).read_bytes())
    assert seg.table("health")["value"].tolist() == [1, 2, 3]


def test_ids_survive_restart_even_after_everything_was_shipped(tmp_path: Path) -> None:
    sp = _spool(tmp_path)
    for i in range(3):
        sp.write("probe_tx", _tx(range(i, i + 1)))
        sp.roll()
    for seg_id in (1, 2, 3):
        sp.acknowledged(seg_id)
    assert sp.oldest_closed() is None
    # No close (as after a kill -9): ids are reserved in blocks, so the next start
    # continues after the whole reserved block (a gap, never a reused id).
    again = _spool(tmp_path)
    again.write("probe_tx", _tx(range(1)))
    assert again.roll() == 1 + ID_BLOCK
    # A clean close stores the exact next id: no gap after a clean restart.
    again.close()
    third = _spool(tmp_path)
    third.write("probe_tx", _tx(range(1)))
    assert third.roll() == 2 + ID_BLOCK


def test_ids_stay_monotonic_across_block_boundaries_and_crashes(tmp_path: Path) -> None:
    sp = _spool(tmp_path)
    ids = []
    for i in range(ID_BLOCK + 3):  # crosses a block boundary: a second reservation
        sp.write("probe_tx", _tx(range(i, i + 1)))
        ids.append(sp.roll())
    assert ids == list(range(1, ID_BLOCK + 4))
    assert (tmp_path / "spool" / "next_segment").read_text() == f"{2 * ID_BLOCK + 1}\n"
    # Crash with a segment open (id 67): the restart never hands out 67 or below again.
    sp.write("probe_tx", _tx(range(1)))
    open_id = sp._open_id
    os.close(sp._fd)  # type: ignore[arg-type]
    sp._fd = None
    again = _spool(tmp_path)
    assert again.oldest_closed() == 1  # nothing acknowledged: all still there
    again.write("probe_tx", _tx(range(1)))
    new_id = again.roll()
    assert new_id is not None and new_id > open_id and new_id == 2 * ID_BLOCK + 1


def test_open_segment_is_cut_to_its_valid_prefix_on_start(tmp_path: Path) -> None:
    sp = _spool(tmp_path)
    sp.write("probe_tx", _tx(range(7)))
    sp.write("probe_tx", _tx(range(7, 9)))
    assert sp._fd is not None
    # Simulate a crash in the middle of a write: half a chunk at the end, no roll.
    os.write(sp._fd, wire.encode_chunk("probe_tx", _tx(range(9, 20)))[:-13])
    os.close(sp._fd)
    sp._fd = None
    recovered = _spool(tmp_path)
    assert recovered.stats.recovered_segments == 1
    assert recovered.stats.recovered_torn_bytes > 0
    seg_id = recovered.oldest_closed()
    seg = wire.decode(recovered.path_of(seg_id).read_bytes())  # strict decode: torn tail gone
    assert seg.table("probe_tx")["seq"].tolist() == list(range(9))
    assert not list((tmp_path / "spool").glob("*.open"))
    recovered.write("probe_tx", _tx(range(1)))
    # the crashed spool had reserved ids 1..ID_BLOCK: the next one is past that block
    assert recovered.roll() == 1 + ID_BLOCK


def test_headerless_open_file_is_discarded(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir()
    (d / "0000000000000005.open").write_bytes(b"CMS")
    sp = _spool(tmp_path)
    assert sp.oldest_closed() is None
    sp.write("probe_tx", _tx(range(1)))
    assert sp.roll() == 6


def test_bound_drops_oldest_and_counts_rows(tmp_path: Path) -> None:
    sp = _spool(tmp_path)
    for i in range(5):
        sp.write("probe_tx", _tx(range(i * 100, i * 100 + 100)))
        sp.roll()
    one = sp.path_of(1).stat().st_size
    sp.max_bytes = 2 * one + 10
    sp.write("probe_tx", _tx(range(100)))
    sp.roll()
    assert sp.stats.dropped_segments == 4
    assert sp.stats.dropped_rows == 400
    assert sp.oldest_closed() == 5
    assert sorted(p.name for p in (tmp_path / "spool").glob("*.seg")) == [
        "0000000000000005.seg",
        "0000000000000006.seg",
    ]


def test_segment_in_flight_is_never_dropped(tmp_path: Path) -> None:
    sp = _spool(tmp_path)
    for i in range(3):
        sp.write("probe_tx", _tx(range(i * 10, i * 10 + 10)))
        sp.roll()
    sp.in_flight = frozenset({1})
    sp.max_bytes = 1
    sp._enforce_bound()
    assert sp.oldest_closed() == 1
    assert sp.stats.dropped_segments == 2
