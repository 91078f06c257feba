"""The daemon's reused memory: slab pool for kept records, column buffers per table."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from analytics.ingest import load as ingest_load
from analytics.ingest.slabs import PeakTracker, SlabPool, plan_reserve, read_peaks
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


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_reserve_faults_in_free_slabs_that_take_then_uses() -> None:
    pool = SlabPool(8 << 20)
    before = _rss()
    assert pool.reserve(64 << 20, threading.Event()) == 64 << 20
    assert _rss() - before >= 60 << 20  # resident now, not at first use
    assert pool.slabs == 8 and pool.in_use() == 0
    kept = [pool.take(6 << 20) for _ in range(8)]  # one per slab: all reserved ones
    assert pool.slabs == 8 and pool.reused == 8 and pool.in_use_bytes() == 64 << 20
    assert pool.reserve(64 << 20, threading.Event()) == 0  # holds that much already
    stop = threading.Event()
    stop.set()
    assert pool.reserve(128 << 20, stop) == 0 and pool.slabs == 8  # stopping: nothing
    del kept


def test_plan_reserve_takes_the_larger_of_peak_and_share_within_half_the_memory() -> None:
    gib = 1 << 30
    # nothing remembered, nothing configured: nothing to do (a fresh store)
    assert plan_reserve(0, {}, 16 * gib) == {"records": 0, "bodies": 0}
    # reserve_bytes alone is split 80/20
    assert plan_reserve(6 * gib, {}, 32 * gib) == {
        "records": int(4.8 * gib),
        "bodies": int(1.2 * gib),
    }
    # a remembered peak above its share wins
    plan = plan_reserve(6 * gib, {"records": 6 * gib}, 64 * gib)
    assert plan == {"records": 6 * gib, "bodies": int(1.2 * gib)}
    # never more than half of the memory available now, in the same proportions
    plan = plan_reserve(0, {"records": 6 * gib, "bodies": 2 * gib}, 8 * gib)
    assert sum(plan.values()) <= 4 * gib and plan["records"] == 3 * plan["bodies"]


def test_peaks_are_remembered_and_a_damaged_file_means_a_cold_start(tmp_path: Path) -> None:
    records, bodies = SlabPool(1 << 20), SlabPool(1 << 20)
    tracker = PeakTracker({"records": records, "bodies": bodies}, tmp_path)
    held = [records.take(900_000) for _ in range(3)]
    tracker.sample()
    del held  # the peak stays
    tracker.sample()
    tracker.save()
    peaks, problem = read_peaks(tmp_path)
    assert problem == "" and peaks["records"] == 3 << 20 and "bodies" not in peaks  # 0: none
    assert read_peaks(tmp_path / "elsewhere") == ({}, "")  # a fresh store
    (tmp_path / "memory.json").write_text('{"records": 3')  # torn by a crash
    peaks, problem = read_peaks(tmp_path)
    assert peaks == {} and "memory.json" in problem
    (tmp_path / "memory.json").write_text(json.dumps({"records": "lots", "bodies": 5, "x": 9}))
    assert read_peaks(tmp_path) == ({"bodies": 5}, "")


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
