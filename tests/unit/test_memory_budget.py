"""The daemon's memory budget: the clock solver's buffers and the hot window stay within
their share of ``memory_budget_bytes`` by dropping their oldest rows, counted."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from analytics.clock.clock_runner import SOURCES, ClockRunner
from analytics.ingest import config as ingest_config
from analytics.ingest import load as ingest_load
from analytics.ingest.hot_window import HotWindow
from analytics.sim.mesh_simulator import MeshSimulator, SimConfig
from analytics.store import catalog, layout
from analytics.store.store_writer import StoreWriter
from collector import wire
from collector.configfile import ConfigError
from tests.unit.ingest_daemon import ROOT

W = 2_000_000_000
HALF_S = 500_000_000


def _batches(start: int, seconds: int) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Simulated probes of ``seconds`` as collectors ship them: per half second of their
    own clocks, each table in time order; (end of the half second, tables)."""
    sim = MeshSimulator(SimConfig(racks=2, hosts_per_rack=3, offset_max_ns=1e5, seed=5))
    res = sim.run(0, seconds * 10**9)
    rows = {"probe_tx": res.tx, "probe_rx": res.rx, "echo": res.echoes}
    out = []
    for end in range(start + HALF_S, start + seconds * 10**9 + 1, HALF_S):
        batch = {}
        for name, data in rows.items():
            t = data[SOURCES[name][1]]
            batch[name] = np.sort(data[(t >= end - HALF_S) & (t < end)], order=SOURCES[name][1])
        out.append((end, batch))
    return out


def test_clock_buffers_beyond_their_budget_skip_the_oldest_windows_counted(
    tmp_path: Path,
) -> None:
    """A solver far behind (segments long, every window held 8 s after its end): with
    room for ~2 windows' rows the oldest windows are dropped and counted as skipped,
    what is held never exceeds the budget by more than one batch, and the newest
    windows are still solved."""
    writer = StoreWriter(tmp_path / "store")
    writer.open()
    catalog.write_catalog(writer.root)
    start = SimConfig().start_ns
    batches = _batches(start, 16)
    per_window = sum(d.nbytes for _, b in batches[:4] for d in b.values())
    budget = 2 * per_window
    now = [start]
    runner = ClockRunner(
        writer, window_s=2.0, lateness_s=8.0, max_bytes=budget, now_ns=lambda: now[0]
    )
    held = []
    for end, batch in batches:
        now[0] = end
        runner.feed(batch)
        runner.step()
        held.append(runner.buffered_bytes)
        assert runner.buffered_bytes <= budget + sum(d.nbytes for d in batch.values())
    assert max(held) > budget // 2  # it did fill up to its budget
    now[0] = start + 40 * W  # the rest comes due (no more probes)
    runner.step()
    k = runner.counters
    assert k.skipped_memory >= 3 and k.windows_skipped == k.skipped_memory
    assert k.windows_solved >= 2 and runner.buffered_bytes == 0
    outcomes = {r.start_ns: r.outcome for r in runner.pipeline.windows}
    skipped = [s for s, o in outcomes.items() if o == "skipped"]
    solved = [s for s, o in outcomes.items() if o == "solved"]
    assert max(skipped) < min(solved)  # the oldest went, the newest were solved
    live = runner.live({})
    assert live["windows_skipped"] == live["windows_skipped_memory"] == k.skipped_memory
    assert live["pipeline"]["skipped"] == len(skipped) and live["max_bytes"] == budget
    samples = {
        m.name: m.samples[0].value
        for m in runner.collector(dict).collect()
        if m.name in ("clockmesh_clock_windows_skipped_memory", "clockmesh_clock_buffered_bytes")
    }
    assert samples == {
        "clockmesh_clock_windows_skipped_memory": k.skipped_memory,
        "clockmesh_clock_buffered_bytes": 0,
    }


def test_clock_solution_is_the_same_with_rows_copied_as_they_arrive(tmp_path: Path) -> None:
    """The rows a window holds are exactly the ones fed for it, in order."""
    writer = StoreWriter(tmp_path / "store")
    writer.open()
    start = SimConfig().start_ns
    batches = _batches(start, 4)
    runner = ClockRunner(writer, window_s=2.0, lateness_s=8.0, now_ns=lambda: start)
    for _, batch in batches:
        runner.feed(batch)
    runner.step()
    w = start // W
    got = runner._joined(runner._windows[w])
    for name, (_dtype, col) in SOURCES.items():
        fed = np.concatenate([b[name] for _, b in batches])
        np.testing.assert_array_equal(got[name], fed[fed[col] // W == w])


def test_hot_window_beyond_its_budget_drops_the_oldest_rows_counted() -> None:
    """A commit per second from 12 hosts, settled every 5 s: with room for ~25 s of
    probes the hot window never holds more than its budget plus one commit, counts what
    it dropped, and its live picture still has the newest probes."""
    t0 = (time.time_ns() // 10**9 - 600) * 10**9
    start = t0 // layout.NS_PER_MINUTE * layout.NS_PER_MINUTE
    ids = ingest_load.host_ids(12)

    def commit(second: int) -> dict[str, np.ndarray]:
        segs = [
            wire.decode(ingest_load.fleet_segment(i, ids, second, t0_ns=start)) for i in range(12)
        ]
        return {
            t: np.concatenate([s.table(t) for s in segs if t in s.tables])
            for t in ("probe_tx", "probe_rx")
        }

    one = sum(d.nbytes for d in commit(0).values())
    budget = 25 * one
    hot = HotWindow(grace_s=20, lag_s=5, start_ns=start - 1, max_bytes=budget)
    for second in range(100):
        tables = commit(second)
        arrival = start + second * 10**9
        hot.add(arrival, tables)
        assert hot.nbytes <= budget + sum(d.nbytes for d in tables.values())
        if second % 5 == 4:
            snap = hot.live(now_ns=arrival)
            hot.rollup(now_ns=arrival)
            assert hot.nbytes <= budget + one
            if second > 5:  # the newest probes are still judged, and none falsely lost
                assert snap.pair_count == 12 * 10
                assert all(p.loss == 0 and p.received > 0 for p in snap.pairs)
    assert hot.evicted_rows > 0
    # room for about lag_s of probes: unsettled rows go too, probe_tx before their
    # probe_rx (a probe_tx left without its probe_rx would count as lost)
    tight = HotWindow(grace_s=20, lag_s=5, start_ns=start - 1, max_bytes=8 * one)
    for second in range(20):
        tight.add(start + second * 10**9, commit(second))
        if second % 5 == 4:
            snap = tight.live(now_ns=start + second * 10**9)
            assert all(p.loss == 0 for p in snap.pairs)
    assert tight.evicted_rows > 0 and snap.pair_count > 0
    big = HotWindow(grace_s=20, lag_s=5, start_ns=start - 1)  # the default budget: room
    peak = 0
    for second in range(70):
        big.add(start + second * 10**9, commit(second))
        peak = max(peak, big.nbytes)
        if second % 5 == 4:
            big.live(now_ns=start + second * 10**9)
    assert big.evicted_rows == 0 and peak > budget


@pytest.mark.parametrize("value", ["-1", "1000", "10 GiB", str(1 << 60)])
def test_a_bad_memory_budget_is_a_one_line_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "ingest.yml"
    path.write_text(f"memory_budget_bytes: {value}\n")
    with pytest.raises(ConfigError) as info:
        ingest_config.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: memory_budget_bytes") and "\n" not in message
    run = subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "ingest", "check-config", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0 and "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "memory_budget_bytes" in lines[0], run.stderr


def test_memory_budget_default_is_a_share_of_the_machine_split_in_two() -> None:
    memory = ingest_config.physical_memory()
    auto = ingest_config.memory_budget(0)
    assert auto["hot"] + auto["clock"] == memory * 40 // 100
    assert abs(auto["hot"] - auto["clock"]) <= 1
    assert ingest_config.memory_budget(1 << 30) == {"hot": 1 << 29, "clock": 1 << 29}
