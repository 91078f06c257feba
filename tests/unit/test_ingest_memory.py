"""The daemon's reused memory: slab pool for kept records, column buffers per table."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from analytics import ingest_load
from analytics.ingest_slabs import SlabPool
from analytics.store import layout
from collector import records, wire


def test_slab_is_reused_only_once_no_record_refers_to_it() -> None:
    pool = SlabPool(1 << 20)
    kept = pool.take(400_000).view(records.PROBE_TX)[:10]  # a view of a view, as kept
    kept["seq"] = 7
    pool.take(400_000)  # dropped at once
    held = pool.take(400_000)  # does not fit: a second slab
    assert pool.slabs == 2 and pool.in_use() == 2  # ``kept`` and ``held`` refer to them
    pool.take(700_000)  # the second slab is full and neither is free: a third
    assert pool.slabs == 3 and pool.reused == 0
    del held
    assert pool.in_use() == 1
    pool.take(700_000)  # the third is full: the second, full but free, is taken again
    assert pool.slabs == 3 and pool.reused == 1
    assert (kept["seq"] == 7).all()  # never handed out again while referred to
    del kept
    assert pool.in_use() == 0
    again = pool.take(900_000)  # the second is full: the first is free again
    assert pool.slabs == 3 and pool.reused == 2
    again[:] = 1
    big = pool.take(2 << 20)  # larger than a slab: its own memory
    assert len(big) == 2 << 20 and pool.slabs == 3 and pool.oversized_bytes == 2 << 20


def test_slab_arrays_are_aligned_and_disjoint() -> None:
    pool = SlabPool(1 << 20)
    parts = [pool.take(n) for n in (1, 40, 63, 64, 1000)]
    addresses = [p.__array_interface__["data"][0] for p in parts]
    assert all(a % 64 == 0 for a in addresses)
    for p, v in zip(parts, range(1, 6), strict=True):
        p[:] = v
    assert [int(p[0]) for p in parts] == [1, 2, 3, 4, 5]  # none overwrote another


def test_records_to_arrow_with_column_buffers_matches_and_reuses_them() -> None:
    ids = ingest_load.host_ids(4)
    t0 = time.time_ns() // 10**9 * 10**9
    columns: dict[str, np.ndarray] = {}
    for second in range(3):
        seg = wire.decode(ingest_load.fleet_segment(1, ids, second, t0_ns=t0))
        rows = seg.table("probe_rx")
        got = layout.records_to_arrow("probe_rx", rows, columns)
        want = layout.records_to_arrow("probe_rx", rows)
        assert got.equals(want)
        assert got.column("rx_ns").to_pylist() == rows["rx_ns"].tolist()
        if second == 0:
            first = {k: v.__array_interface__["data"][0] for k, v in columns.items()}
    # same buffers every commit (the rows fit): no fresh memory per commit
    assert {k: v.__array_interface__["data"][0] for k, v in columns.items()} == first
    assert isinstance(got.column("seq").chunk(0), pa.UInt64Array)
