"""ClockRunner: per-window solving inside the ingest daemon, with simulated probes.

(a) the runner alone on a real store directory, time driven by the test;
(b) the real daemon process fed simulated collector segments over HTTP.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics.clock import ClockState, clock_runner
from analytics.clock.clock_runner import ClockRunner
from analytics.sim.mesh_simulator import GroundTruth, MeshSimulator, SimConfig, SimResult
from analytics.store import catalog, layout
from analytics.store.compactor import Compactor
from analytics.store.store_writer import StoreWriter
from collector import wire
from tests.unit.ingest_daemon import ROOT, Daemon, assert_promtool_clean

W = 2_000_000_000


def arrow_tables(res: SimResult) -> dict[str, pa.Table]:
    return {
        "probe_tx": layout.records_to_arrow("probe_tx", res.tx),
        "probe_rx": layout.records_to_arrow("probe_rx", res.rx),
        "echo": layout.records_to_arrow("echo", res.echoes),
    }


def relative_error(
    truth: GroundTruth, hosts: np.ndarray, offsets: np.ndarray, ref_ns: int
) -> np.ndarray:
    """|solution - truth| with both made mean-zero over the compared hosts (the gauge)."""
    rel = truth.relative_offsets(ref_ns, hosts)
    return np.abs((offsets - offsets.mean()) - rel)


@pytest.fixture
def store(tmp_path: Path) -> StoreWriter:
    writer = StoreWriter(tmp_path / "store")
    writer.open()
    catalog.write_catalog(writer.root)
    return writer


def test_runner_solves_each_window_once_carries_prior_and_stores_parquet(
    store: StoreWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = MeshSimulator(SimConfig(racks=4, hosts_per_rack=4, offset_max_ns=2e6, seed=11))
    start = sim.config.start_ns
    now = [start]
    runner = ClockRunner(store, window_s=2.0, lateness_s=1.0, now_ns=lambda: now[0])
    priors: list[tuple[int, ClockState | None]] = []
    real_solve = clock_runner.solve_window

    def spy(*args, **kw):  # records what the runner passes, then solves for real
        priors.append((kw["window_start_ns"], kw["prior"]))
        sol = real_solve(*args, **kw)
        states.append(sol.state)
        return sol

    states: list[ClockState] = []
    monkeypatch.setattr(clock_runner, "solve_window", spy)
    truth = None
    for k in range(4):
        res = sim.run(start_offset_ns=k * W, duration_ns=W)
        truth = res.truth
        runner.feed(arrow_tables(res))
        now[0] = start + (k + 1) * W + 500_000_000  # before end + lateness: not yet
        runner.step()
        assert runner.snapshot.window_start_ns != start + k * W
        now[0] = start + (k + 1) * W + 1_000_000_000
        runner.step()
        snap = runner.snapshot
        assert snap.window_start_ns == start + k * W
        err = relative_error(res.truth, snap.hosts, snap.offset_ns, snap.window_start_ns + W // 2)
        assert len(snap.hosts) == 16 and err.max() < 50, err
    assert truth is not None
    # each window solved once; the prior is the previous solve's state
    starts = [s for s, _ in priors]
    assert len(starts) == len(set(starts))
    main = [i for i, s in enumerate(starts) if (s - start) % W == 0 and s >= start]
    assert [starts[i] for i in main] == [start + k * W for k in range(4)]
    for i in main[1:]:
        assert priors[i][1] is states[i - 1]
    assert runner.state is states[-1]
    assert runner.counters.windows_solved == len(starts) and runner.counters.windows_skipped == 0

    # durable Parquet, visible through the catalog (read-only, as an analyst opens it)
    con = duckdb.connect(str(store.root / "catalog.duckdb"), read_only=True)
    try:
        rows = con.execute(
            f"SELECT window_start_ns, host, offset_ns, uncertainty_ns, window_end_ns "
            f"FROM clock WHERE method = 'huygens' AND window_start_ns >= {start} "
            "ORDER BY window_start_ns, host"
        ).fetchnumpy()
        dup = con.execute(
            "SELECT count(*) FROM (SELECT window_start_ns, host, method, count(*) AS n "
            "FROM clock GROUP BY ALL HAVING n > 1)"
        ).fetchone()
        rtt2 = con.execute(
            f"SELECT host, offset_ns FROM clock WHERE method = 'rtt2' "
            f"AND window_start_ns = {start + 3 * W} ORDER BY host"
        ).fetchnumpy()
        true_owd = pa.table(  # noqa: F841 (read by DuckDB below)
            {"src": res.rx["src"], "seq": res.rx["seq"], "d": res.truth.rx_true_owd_ns}
        )
        owd = con.execute(
            "SELECT count(*), max(abs(o.owd_ns - t.d)), median(o.owd_ns) "
            "FROM owd o JOIN true_owd t ON o.src = t.src AND o.seq = t.seq"
        ).fetchone()
    finally:
        con.close()
    assert dup == (0,)
    assert len(rows["host"]) == 4 * 16
    assert (rows["window_end_ns"] - rows["window_start_ns"] == W).all()
    last = rows["window_start_ns"] == start + 3 * W
    err = relative_error(truth, rows["host"][last], rows["offset_ns"][last], start + 3 * W + W // 2)
    assert err.max() < 50
    assert np.isfinite(rows["uncertainty_ns"]).all()
    # the RTT/2 baseline is there too, coarser (no coded filter) but in the same microsecond
    assert len(rtt2["host"]) == 16
    err2 = relative_error(truth, rtt2["host"], rtt2["offset_ns"], start + 3 * W + W // 2)
    assert err2.max() < 5_000
    # corrected one-way delays of the last window agree with the simulated true delays
    n, worst, med = owd
    assert n > 0.95 * len(res.rx) and worst < 100 and 500 < med < 10_000, owd

    # a row for a window already solved is late: counted, not solved again
    late = sim.run(start_offset_ns=W, duration_ns=W // 4)
    before = runner.counters.windows_solved
    runner.feed(arrow_tables(late))
    now[0] += 10 * W
    runner.step()
    assert runner.counters.late_rows > 0 and runner.counters.windows_solved == before


def test_runner_skips_oldest_windows_when_behind(store: StoreWriter) -> None:
    sim = MeshSimulator(SimConfig(racks=2, hosts_per_rack=3, offset_max_ns=1e5, seed=5))
    start = sim.config.start_ns
    now = [start]
    runner = ClockRunner(store, window_s=2.0, lateness_s=0.5, max_backlog=2, now_ns=lambda: now[0])
    runner.feed(arrow_tables(sim.run(0, 6 * W)))
    now[0] = start + 7 * W
    solved = runner.step()
    k = runner.counters
    # six complete windows (+ maybe one sliver before start from negative offsets):
    # only the newest two are solved, the older ones are skipped and counted
    assert solved == 2 and k.windows_skipped >= 4
    assert runner.snapshot.window_start_ns == start + 5 * W
    live = runner.live({})
    assert live["windows_solved"] == 2 and live["windows_skipped"] == k.windows_skipped
    assert len(live["hosts"]) == 6 and {h["status"] for h in live["hosts"]} == {"solved"}


def test_longer_advised_segments_hold_windows_until_both_legs_are_in(
    store: StoreWriter,
) -> None:
    """With 10-s segments a probe's RX row can arrive ~10 s after its TX row: a runner
    told so (set_min_lateness) waits for both; one that is not solves half a window."""
    sim = MeshSimulator(SimConfig(racks=2, hosts_per_rack=3, offset_max_ns=1e5, seed=7))
    start = sim.config.start_ns
    res = sim.run(0, W)
    outcomes = {}
    for advised in (None, 12.0):
        writer = StoreWriter(store.root.parent / f"s{advised}")
        writer.open()
        now = [start]
        runner = ClockRunner(writer, window_s=2.0, lateness_s=3.0, now_ns=lambda now=now: now[0])
        if advised is not None:
            runner.set_min_lateness(1.0)  # never below the configured lateness
            assert runner.live({})["lateness_s"] == 3.0
            runner.set_min_lateness(advised)  # the latest advice counts
            assert runner.live({})["lateness_s"] == advised
        tables = arrow_tables(res)
        runner.feed({"probe_tx": tables["probe_tx"], "echo": tables["echo"]})
        now[0] = start + W + 4 * 10**9  # past the configured 3 s, RX rows still on the way
        runner.step()
        runner.feed({"probe_rx": tables["probe_rx"]})
        now[0] = start + W + 13 * 10**9
        runner.step()
        outcomes[advised] = (runner.counters.windows_solved, runner.counters.late_rows)
    solved, late = outcomes[None]
    assert late == len(res.rx)  # solved without its RX rows, which then came too late
    solved, late = outcomes[12.0]
    assert solved == 1 and late == 0
    assert runner.snapshot.pairs > 0


def _segments(res: SimResult, names: list[str], hosts: np.ndarray, n_seconds: int) -> list[bytes]:
    """Per host and second, a collector segment: its probe_tx, probe_rx and echo rows."""
    out = []
    t0 = res.truth.start_ns
    for s in range(n_seconds):
        lo, hi = t0 + s * 10**9, t0 + (s + 1) * 10**9
        for name, hid in zip(names, hosts.tolist(), strict=True):
            tx = res.tx[(res.tx["src"] == hid) & (res.tx["tx_ns"] >= lo) & (res.tx["tx_ns"] < hi)]
            rx = res.rx[(res.rx["dst"] == hid) & (res.rx["rx_ns"] >= lo) & (res.rx["rx_ns"] < hi)]
            e = res.echoes
            ec = e[(e["src"] == hid) & (e["t1_ns"] >= lo) & (e["t1_ns"] < hi)]
            out.append(
                wire.encode_header(name, hid, s, hi)
                + wire.encode_chunk("probe_tx", tx)
                + wire.encode_chunk("probe_rx", rx)
                + wire.encode_chunk("echo", ec)
            )
    return out


def test_daemon_solves_posted_windows_and_stores_clock_and_owd(tmp_path: Path) -> None:
    d = Daemon(tmp_path, clock_window_s=2.0, clock_lateness_s=10.0)
    d.start()
    try:
        # 3 windows of 2 s from (now - 4 s, now - 2 s]; each is solved 10 s after it ends
        # (clock_lateness_s), so all of a window's segments are in before it is solved
        start = (time.time_ns() // W - 1) * W
        cfg = SimConfig(
            racks=3, hosts_per_rack=4, offset_max_ns=3e6, start_ns=start, duration_ns=3 * W, seed=7
        )
        sim = MeshSimulator(cfg)
        res = sim.run()
        segs = _segments(res, sim.names, sim.host_ids, 6)
        per_second = len(sim.names)
        for i in range(0, len(segs), per_second):  # one body per second, as a backlog ships
            status, reply = d.post(b"".join(segs[i : i + per_second]))
            assert status == 200 and reply["status"] == "stored", reply
        deadline = time.monotonic() + 30
        live: dict = {}
        while time.monotonic() < deadline:
            live = json.loads(d.get("/v1/live"))["clock"]
            if live["window_start_ns"] >= start + 2 * W:
                break
            time.sleep(0.5)
        assert live["window_start_ns"] == start + 2 * W, live
        assert live["windows_skipped"] == 0 and live["windows_solved"] >= 3
        assert live["late_rows"] == 0, "a window was solved before its segments were posted"
        by_name = {h["host"]: h for h in live["hosts"]}
        assert set(by_name) == set(sim.names)
        assert all(h["status"] == "solved" and h["uncertainty_ns"] < 100 for h in by_name.values())
        metrics = d.get("/metrics")
        assert b'clockmesh_clock_offset_seconds{host="sim-h00000"}' in metrics
        assert b'clockmesh_clock_windows_total{outcome="solved"}' in metrics
        assert_promtool_clean(metrics)

        out = subprocess.run(
            [sys.executable, "-m", "clockmesh.cli", "sql", "--store", str(d.store), "--format",
             "json", f"SELECT window_start_ns, host, offset_ns FROM clock WHERE method = "
             f"'huygens' AND window_start_ns >= {start} ORDER BY window_start_ns, host"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        rows = json.loads(out)
        for k in range(3):
            got = [r for r in rows if r["window_start_ns"] == start + k * W]
            assert len(got) == len(sim.names), (k, got)
            hosts = np.array([r["host"] for r in got], np.int64)
            offsets = np.array([r["offset_ns"] for r in got])
            err = relative_error(res.truth, hosts, offsets, start + k * W + W // 2)
            assert err.max() < 100, (k, err)
        con = duckdb.connect(str(d.store / "catalog.duckdb"), read_only=True)
        try:
            true_owd = pa.table(  # noqa: F841 (read by DuckDB below)
                {"src": res.rx["src"], "seq": res.rx["seq"], "d": res.truth.rx_true_owd_ns}
            )
            n, worst, med = con.execute(
                "SELECT count(*), max(abs(o.owd_ns - t.d)), median(o.owd_ns) "
                "FROM owd o JOIN true_owd t ON o.src = t.src AND o.seq = t.seq"
            ).fetchone()
            n_rx = con.execute("SELECT count(*) FROM probe_rx").fetchone()[0]
        finally:
            con.close()
        # nearly every stored probe has a corrected delay, each within 200 ns of the truth
        assert n > 0.9 * n_rx and worst < 200 and 500 < med < 10_000, (n, n_rx, worst, med)
    finally:
        d.stop()


def test_numpy_records_feed_solves_exactly_like_arrow_tables(tmp_path: Path) -> None:
    """The daemon feeds the commit's numpy records (no Arrow -> numpy round trip): the
    same windows, solutions and stored rows as feeding the Arrow tables; a wrong dtype
    is refused at feed time."""
    sim = MeshSimulator(SimConfig(racks=3, hosts_per_rack=4, offset_max_ns=2e6, seed=5))
    start = sim.config.start_ns
    res = sim.run(0, 3 * W)
    out = {}
    for kind in ("arrow", "numpy"):
        writer = StoreWriter(tmp_path / kind)
        writer.open()
        runner = ClockRunner(writer, window_s=2.0, lateness_s=1.0, now_ns=lambda: start + 4 * W)
        if kind == "arrow":
            runner.feed(arrow_tables(res))
        else:
            runner.feed({"probe_tx": res.tx.copy(), "probe_rx": res.rx.copy(), "echo": res.echoes})
        assert runner.step() >= 2
        snap = runner.snapshot
        out[kind] = (snap, runner.counters.rows_written, sorted(
            (p.relative_to(writer.root).as_posix(), repr(pq.read_table(p).to_pylist()))
            for p in writer.root.glob("*/date=*/hour=*/r*.parquet")
        ))  # fmt: skip
    (a, a_rows, a_files), (b, b_rows, b_files) = out["arrow"], out["numpy"]
    assert a.window_start_ns == b.window_start_ns and a_rows == b_rows and a_rows["owd"] > 0
    for name in ("hosts", "offset_ns", "drift_ppm", "uncertainty_ns", "status"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a_files == b_files and len(a_files) >= 4  # repr: NaN (rtt2 uncertainty) == NaN
    with pytest.raises(TypeError, match="probe_rx: expected records of dtype"):
        runner.feed({"probe_rx": res.tx})


def test_a_window_fed_in_many_small_commits_solves_exactly_like_one_commit(
    tmp_path: Path,
) -> None:
    """A window's rows arriving over many commits (its buffer grows several times, each
    time keeping the rows already in) are solved and stored exactly as the same rows in
    one commit; after a skipped window the next windows' buffers start at its size."""
    sim = MeshSimulator(SimConfig(racks=3, hosts_per_rack=4, offset_max_ns=2e6, seed=7))
    start = sim.config.start_ns
    res = sim.run(0, 3 * W)
    tables = {"probe_tx": res.tx, "probe_rx": res.rx, "echo": res.echoes}
    out = {}
    for kind, chunk in (("one", 0), ("many", 300)):
        writer = StoreWriter(tmp_path / kind)
        writer.open()
        runner = ClockRunner(writer, window_s=2.0, lateness_s=1.0, now_ns=lambda: start + 4 * W)
        if not chunk:
            runner.feed({t: r.copy() for t, r in tables.items()})
        else:
            for i in range(0, max(len(r) for r in tables.values()), chunk):
                runner.feed({t: r[i : i + chunk].copy() for t, r in tables.items()})
        runner._drain()
        grown = {t: len(p.buf) for t, p in runner._windows[min(runner._windows)].parts.items()}
        assert runner.step() >= 2
        out[kind] = (runner.snapshot, sorted(
            (p.relative_to(writer.root).as_posix(), repr(pq.read_table(p).to_pylist()))
            for p in writer.root.glob("*/date=*/hour=*/r*.parquet")
        ))  # fmt: skip
        if chunk:  # the first window's probe buffers grew twice past their first 1,024 rows
            assert grown["probe_tx"] > 2 * 1024 and grown["probe_rx"] > 2 * 1024, grown
    (a, a_files), (b, b_files) = out["one"], out["many"]
    for name in ("hosts", "offset_ns", "drift_ppm", "uncertainty_ns", "status"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a_files == b_files and len(a_files) >= 4
    # a window skipped before any was solved sizes the buffers of the windows after it
    writer = StoreWriter(tmp_path / "skip")
    writer.open()
    runner = ClockRunner(writer, window_s=2.0, lateness_s=1.0, now_ns=lambda: start + 4 * W)
    w0 = min(int(r[clock_runner.SOURCES[t][1]].min()) // W for t, r in tables.items())
    first = {t: r[r[clock_runner.SOURCES[t][1]] // W == w0] for t, r in tables.items()}
    runner.feed({t: r.copy() for t, r in first.items()})
    runner._drain()
    runner._skip(min(runner._windows), "memory")
    assert runner._expect == {t: len(r) for t, r in first.items()}


@pytest.mark.parametrize("order", ["collector", "shuffled"])
def test_window_split_keeps_every_row_in_its_window_in_order(order: str) -> None:
    """A commit of 30 hosts' 21-s segments (time order per host, hosts back to back) or
    the same rows shuffled: each window gets exactly its rows, in commit order; in
    collector order as views of the commit (joined once, at solve time)."""
    rng = np.random.default_rng(5)
    per_host = 21 * 80
    ts = (np.arange(per_host) * (1_000_000_000 // 80))[None, :] + rng.integers(0, W, (30, 1))
    rows = np.zeros(ts.size, clock_runner.SOURCES["probe_tx"][0])
    rows["tx_ns"] = 1_700_000_000 * 10**9 + ts.ravel()
    rows["seq"] = np.arange(ts.size)
    if order == "shuffled":
        rows = rows[rng.permutation(len(rows))]
    widx = rows["tx_ns"] // W
    runs = clock_runner._window_runs(rows, widx)
    joined: dict[int, list[np.ndarray]] = {}
    for w, part in runs:
        joined.setdefault(w, []).append(part)
    assert sorted(joined) == np.unique(widx).tolist()
    for w, parts in joined.items():
        np.testing.assert_array_equal(np.concatenate(parts), rows[widx == w])
    if order == "collector":
        assert len(runs) <= 30 * 12 and all(np.shares_memory(p, rows) for _, p in runs)


def test_pipeline_health_judges_windows_fed_before_a_detector_pass_took_its_queue() -> None:
    from analytics.clock.clock_runner import PipelineHealth, WindowRecord

    s = 1_000_000_000
    health = PipelineHealth()
    first = WindowRecord(start_ns=0, end_ns=2 * s, outcome="solved", done_ns=6 * s, due_ns=5 * s)
    second = WindowRecord(start_ns=2 * s, end_ns=4 * s, outcome="solved", done_ns=8 * s,
                          due_ns=7 * s)  # fmt: skip
    health.add(first)
    health.fed(first, 6 * s)
    health.add(second)
    health.fed(second, 8 * s)
    health.detector_pass(taken_ns=7 * s, done_ns=int(7.5 * s))  # took its queue before 2nd
    assert first.judged_ns == int(7.5 * s) and second.judged_ns == 0
    health.add(WindowRecord(start_ns=4 * s, end_ns=6 * s, outcome="skipped", done_ns=9 * s,
                            due_ns=9 * s))  # fmt: skip
    health.detector_pass(taken_ns=9 * s, done_ns=10 * s)
    assert second.judged_ns == 10 * s
    summary = health.summary(now_ns=11 * s)
    assert (summary["windows"], summary["solved"], summary["skipped"], summary["judged"]) == (
        3, 2, 1, 2
    )  # fmt: skip
    assert summary["lag_solved_s"] == {"n": 2, "p50": 4.0, "p99": 4.0, "max": 4.0}
    assert summary["lag_judged_due_s"]["max"] == 3.0  # second: judged at 10 s, due at 7 s
    assert summary["picture_age_s"] == 7.0  # newest judged window ended at 4 s


def test_shorter_advised_segments_lower_the_lateness_one_old_interval_later(
    store: StoreWriter,
) -> None:
    """Collectors take up shorter segments at their next roll: segments of the old length
    are still in flight for one old lateness, so the runner keeps it until then."""
    now = [10**18]
    runner = ClockRunner(store, window_s=2.0, lateness_s=3.0, now_ns=lambda: now[0])
    runner.set_min_lateness(32.0)
    runner.set_min_lateness(5.0)  # the fleet went quiet: the advice fell
    runner.step()
    assert runner.live({})["lateness_s"] == 32.0
    now[0] += 32 * 10**9
    runner.step()
    assert runner.live({})["lateness_s"] == 5.0


def test_a_window_stored_then_compacted_is_not_stored_again_after_a_restart(
    store: StoreWriter,
) -> None:
    """A daemon restarted after a longer outage gets a solved window's late rows (the
    collectors' unacknowledged segments): that window's files were compacted meanwhile
    (``r`` files merged into an ``m`` file a minute on), yet it is stored once."""
    sim = MeshSimulator(SimConfig(racks=2, hosts_per_rack=2, offset_max_ns=2e6, seed=5))
    start = sim.config.start_ns
    now = [start]
    first = ClockRunner(store, window_s=2.0, lateness_s=1.0, now_ns=lambda: now[0])
    for k in range(3):
        first.feed(arrow_tables(sim.run(start_offset_ns=k * W, duration_ns=W)))
        now[0] = start + (k + 1) * W + 1_000_000_000
        first.step()
    assert first.counters.windows_solved >= 3
    compactor = Compactor(store, min_age_s=0.0)
    for table in ("clock", "owd"):
        for _bucket, part in list(store.partitions(table)):
            compactor.compact_partition(part, time.time())
        files = [layout.file_commit_range(p.name) for p in (store.root / table).rglob("*")]
        kinds = {f[0] for f in files if f is not None}
        assert kinds == {"m"}, (table, kinds)  # every window's file merged away

    def counts() -> tuple[int, int, int]:
        con = duckdb.connect()
        try:
            clock = con.execute(
                f"SELECT count(*), count(DISTINCT (window_start_ns, host, method)) "
                f"FROM read_parquet('{store.root}/clock/**/*.parquet')"
            ).fetchone()
            owd = con.execute(
                f"SELECT count(*) FROM read_parquet('{store.root}/owd/**/*.parquet')"
            ).fetchone()
        finally:
            con.close()
        assert clock is not None and owd is not None
        return int(clock[0]), int(clock[1]), int(owd[0])

    before = counts()
    assert before[0] == before[1] > 0
    restarted = ClockRunner(store, window_s=2.0, lateness_s=1.0, now_ns=lambda: now[0])
    restarted.feed(arrow_tables(sim.run(start_offset_ns=W, duration_ns=W // 2)))
    now[0] += 10 * W
    restarted.step()
    assert restarted.counters.windows_existing == 1
    assert counts() == before  # no second (partial) solution of that window, no owd twice
