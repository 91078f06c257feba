"""Property tests: injected clocks are recovered under random queueing and loss."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.clock import HostStatus, SolverConfig, network, pair_fit, probe_samples, solve_window
from analytics.clock.key_index import KeyIndex, dense_ids
from analytics.sim import MeshSimulator, SimConfig
from analytics.sim.mesh_simulator import Congestion
from collector.records import ECHO, PROBE_RX


def _errors(sim, sol, component: int | None = None) -> np.ndarray:
    """|offset error| of the SOLVED hosts (of one component: offsets of different
    components are not comparable), both sides mean-zero."""
    ok = sol.clock["status"] == HostStatus.SOLVED
    if component is not None:
        ok &= sol.clock["component"] == component
    hosts = sol.clock["host"][ok]
    est = sol.clock["offset_ns"][ok]
    return np.abs((est - est.mean()) - sim.truth.relative_offsets(sol.ref_ns, hosts))


def _solve(
    seed: int, offset_max: float, drift_max: float, util: float, queue_ns: float, loss: float,
    echo_every: int,
) -> tuple[SimConfig, Any, Any]:  # fmt: skip
    """One 2-s window of the 9-host test mesh, simulated with these draws and solved."""
    cfg = SimConfig(
        racks=3, hosts_per_rack=3, spines=2, buddies_random=2, ports=4, rate_per_port=4.0,
        offset_max_ns=offset_max, drift_max_ppm=drift_max, ts_noise_ns=5.0,
        idle_util=util, idle_queue_ns=queue_ns, loss=loss, seed=seed, echo_every=echo_every,
    )  # fmt: skip
    sim = MeshSimulator(cfg).run()
    sol = solve_window(
        sim.tx, sim.rx, sim.echoes, window_start_ns=cfg.start_ns,
        window_ns=cfg.duration_ns, config=SolverConfig(spacing_tol_ns=50),
    )  # fmt: skip
    return cfg, sim, sol


# Derandomized: the same examples on every run, so CI judges the code, not the draw. A
# random draw found the case pinned in test_known_error_at_moderate_load_with_short_queues.
# The parameters come from one 16-byte key, as below: drawn by st.floats/st.integers, a
# fresh clone's CI (2026-12-04) got seed 420 and 37.5 % load (420 is a constant of
# analytics/ingest/config.py: Hypothesis draws numbers found in the modules loaded so
# far, so the draws changed with the code), the case pinned in
# test_known_error_at_375_percent_load_*. Those draws had passed by luck: the solver is
# accurate to tens of ns on light load or long queues only. At moderate load with short
# queues (busy links, coded pairs delayed alike pass the purity filter) hosts are claimed
# SOLVED hundreds of ns off, within their stated uncertainty: every draw here is held to
# that honesty, and to tens of ns where the solver holds it (the weakness: issue 25).
@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(key=st.binary(min_size=16, max_size=16))
def test_offsets_recovered_under_random_queueing(key: bytes) -> None:
    rng = np.random.default_rng(list(key))
    seed = int(rng.integers(0, 2**31))
    offset_max = float(rng.uniform(0, 5e6))
    drift_max = float(rng.uniform(0, 50))
    util = float(rng.uniform(0.0, 0.5))
    queue_ns = float(rng.uniform(1_000, 50_000))
    loss = float(rng.uniform(0, 0.2))
    echo_every = int(rng.choice([1, 8]))
    cfg, sim, sol = _solve(seed, offset_max, drift_max, util, queue_ns, loss, echo_every)
    err = _errors(sim, sol, component=0)
    solved = sol.clock["status"] == HostStatus.SOLVED
    # With 1 echo in 8, a non-mutual pair gets ~4 echoed pairs per window here: in
    # ~1 draw in 9 a host then has no pair with both directions (unsolved, honestly).
    if util <= 0.2 and echo_every == 1:
        assert solved.sum() >= 7
        assert (sol.clock["component"][solved] == 0).sum() >= 7
    # Busy links (a probe queues on up to half the hops): few coded pairs stay pure and
    # hosts may not be solvable, but a host claimed SOLVED must be within its stated
    # uncertainty — and within tens of ns (timestamp noise 5 ns, per-cable asymmetry up
    # to 50 ns) where queues are long or links light.
    assert _violations(cfg, sim, sol) == []
    if len(err) and (util <= 0.2 or queue_ns >= 10_000):
        assert np.median(err) < 40.0, (np.median(err), sol.drops)
        assert err.max() < 200.0, (err, sol.clock["offset_sigma_ns"][solved])


def _honesty_violations(
    seed: int, offset_max: float, drift_max: float, util: float, queue_ns: float, loss: float,
    echo_every: int,
) -> list[str]:  # fmt: skip
    """Hosts claimed SOLVED (component 0) whose offset error exceeds 3x their stated
    uncertainty plus the 5-ns timestamp noise of one stamp (a floor: ~1,500 honest
    Gaussian host estimates over 200 draws would put a few beyond 3 sigma)."""
    return _violations(*_solve(seed, offset_max, drift_max, util, queue_ns, loss, echo_every))


def _violations(cfg: SimConfig, sim: Any, sol: Any) -> list[str]:
    """:func:`_honesty_violations` of one simulated and solved window."""
    ok = (sol.clock["status"] == HostStatus.SOLVED) & (sol.clock["component"] == 0)
    err = _errors(sim, sol, component=0)
    sigma = sol.clock["offset_sigma_ns"][ok]
    assert np.isfinite(sigma).all() and (sigma > 0).all(), sigma
    bad = ~(err <= 3.0 * sigma + cfg.ts_noise_ns)
    return [
        f"host {h}: off by {e:.1f} ns, stated sigma {s:.1f} ns"
        for h, e, s in zip(sol.clock["host"][ok][bad], err[bad], sigma[bad], strict=True)
    ]


def test_known_error_at_moderate_load_with_short_queues_is_within_its_stated_uncertainty() -> None:
    # The draw a random Hypothesis run found in CI on 2026-11-25: at ~31 % utilisation with
    # 1-us queues coded pairs delayed alike pass the filter and a host is 200-250 ns off.
    # The solver cannot see the error in the pair fit, but its pairs disagree around the
    # loops and tie it to the mesh weakly: its stated uncertainty must cover the error.
    assert _honesty_violations(
        seed=30, offset_max=0.0, drift_max=0.0, util=0.3125, queue_ns=1000.0, loss=0.0,
        echo_every=1,
    ) == []  # fmt: skip


# The draw Hypothesis 6.170.27 made of test_offsets_recovered_under_random_queueing on a
# fresh clone (2026-12-04): at 37.5 % utilisation with 1-us queues six hosts are claimed
# SOLVED 682-706 ns off. Their stated uncertainty covers it (honest), but the claim of
# tens of ns does not hold: the weakness above, larger. Strict: it fails the day it holds.
_AT_375 = dict(seed=420, offset_max=0.0, drift_max=0.0, util=0.375, queue_ns=1000.0, loss=0.0,
               echo_every=1)  # fmt: skip


def test_known_error_at_375_percent_load_is_within_its_stated_uncertainty() -> None:
    assert _honesty_violations(**_AT_375) == []  # type: ignore[arg-type]


@pytest.mark.xfail(strict=True, reason="solver weakness: hosts claimed SOLVED ~700 ns off at "
                   "37.5 % load with 1-us queues (issue 25)")  # fmt: skip
def test_known_error_at_375_percent_load_is_tens_of_ns() -> None:
    _cfg, sim, sol = _solve(**_AT_375)  # type: ignore[arg-type]
    err = _errors(sim, sol, component=0)
    assert len(err) and np.median(err) < 40.0, err


# 200 derandomized draws. The parameters come from one 16-byte key, not from
# st.floats/st.integers: Hypothesis (>= 6.131) sometimes draws numbers found in the
# source of the local modules loaded so far, so those draws change with the test files
# collected in the session (test_clock_runner.py); a 16-byte literal is unlikely there.
@settings(
    max_examples=200, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(key=st.binary(min_size=16, max_size=16))
def test_no_host_claimed_solved_beyond_three_times_its_stated_uncertainty(key: bytes) -> None:
    rng = np.random.default_rng(list(key))
    draw = dict(
        seed=int(rng.integers(0, 2**31)),
        offset_max=float(rng.uniform(0, 5e6)) if rng.random() < 0.8 else 0.0,
        drift_max=float(rng.uniform(0, 50)) if rng.random() < 0.8 else 0.0,
        util=float(rng.uniform(0.0, 0.5)),
        queue_ns=float(rng.uniform(1_000, 50_000)) if rng.random() < 0.7 else 1_000.0,
        loss=float(rng.uniform(0, 0.2)) if rng.random() < 0.7 else 0.0,
        echo_every=int(rng.choice([1, 8])),
    )
    assert _honesty_violations(**draw) == [], draw  # type: ignore[arg-type]


@settings(max_examples=6, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), leaf=st.integers(0, 3), up=st.booleans())
def test_congested_link_in_one_direction_hurts_rtt2_more_than_the_solver(
    seed: int, leaf: int, up: bool
) -> None:
    from analytics.clock import rtt2_baseline, rtt2_host_offsets

    cfg = SimConfig(
        racks=4, hosts_per_rack=3, spines=2, buddies_random=3, ports=8, ts_noise_ns=10.0,
        congestion=(Congestion(leaf=leaf, spine=0, up=up, util=0.95, queue_ns=200_000),),
        pair_queue_corr=0.05, seed=seed,
    )  # fmt: skip
    sim = MeshSimulator(cfg).run()
    sol = solve_window(
        sim.tx, sim.rx, sim.echoes, window_start_ns=cfg.start_ns,
        config=SolverConfig(spacing_tol_ns=100),
    )  # fmt: skip
    err = _errors(sim, sol)
    hosts, base = rtt2_host_offsets(rtt2_baseline(sim.echoes, ref_ns=sol.ref_ns, method="mean"))
    base_err = np.abs(base - sim.truth.relative_offsets(sol.ref_ns, hosts))
    assert np.median(err) < 100.0
    assert np.median(err) < np.median(base_err)


@given(st.lists(st.integers(-(2**62), 2**62), max_size=300))
def test_dense_ids_match_unique(keys: list[int]) -> None:
    k = np.array(keys, dtype=np.int64)
    ids, uniq = dense_ids(k)
    assert len(uniq) == len(set(keys))
    np.testing.assert_array_equal(uniq[ids], k)
    if len(uniq):
        idx = KeyIndex(uniq)
        np.testing.assert_array_equal(idx.lookup(k), ids)
        assert (idx.lookup(np.array([max(keys) + 1], np.int64)) == -1).all()


def test_two_threads_give_the_same_solution_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    # split even this small window in halves (samples and pairs), as at 10,000 hosts
    monkeypatch.setattr(pair_fit, "_MIN_SPLIT_ROWS", 1)
    monkeypatch.setattr(pair_fit, "_MIN_SPLIT_PAIRS", 1)
    cfg = SimConfig(racks=3, hosts_per_rack=3, buddies_random=2, seed=4, loss=0.05)
    mesh = MeshSimulator(cfg)
    sims = [mesh.run(start_offset_ns=w * 2_000_000_000, duration_ns=2_000_000_000) for w in (0, 1)]
    sols: list[list] = [[], []]
    for threads in (1, 2):
        config = SolverConfig(spacing_tol_ns=100, threads=threads)
        prior = None
        for w, sim in enumerate(sims):
            start = cfg.start_ns + w * 2_000_000_000
            sol = solve_window(
                sim.tx, sim.rx, sim.echoes, window_start_ns=start, prior=prior, config=config
            )
            sols[threads - 1].append(sol)
            prior = sol.state
    for one, two in zip(*sols, strict=True):
        np.testing.assert_array_equal(one.clock, two.clock)
        np.testing.assert_array_equal(one.pairs, two.pairs)
        for name, col in one.owd.items():
            np.testing.assert_array_equal(col, two.owd[name], err_msg=name)
        assert one.drops == two.drops
        assert one.noise_ns == two.noise_ns


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n=st.integers(0, 200), chunk=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_columns_equal_the_fields(n: int, chunk: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for dtype in (PROBE_RX, ECHO):
        rec = np.frombuffer(rng.bytes(n * dtype.itemsize), dtype=dtype)
        names = tuple(name for name in (dtype.names or ()) if not name.startswith("_"))
        old = probe_samples._CHUNK_ROWS
        probe_samples._CHUNK_ROWS = chunk  # chunk boundaries anywhere
        try:
            cols = probe_samples.columns(rec, names)
        finally:
            probe_samples._CHUNK_ROWS = old
        for name, col in zip(names, cols, strict=True):
            assert col.flags.c_contiguous
            want = rec[name].view(np.int64) if rec.dtype[name] == np.uint64 else rec[name]
            np.testing.assert_array_equal(col, want, err_msg=name)


def test_network_cache_gives_the_same_solution_and_handles_repeated_edges() -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 30, 200)
    b = rng.integers(0, 30, 200)  # repeated and self edges included
    m = rng.normal(size=200)
    w = rng.uniform(0.5, 2.0, 200)
    cache: dict = {}
    for weights in (w, w * 3, np.where(np.arange(200) % 7 == 0, 0.0, w)):
        plain = network.solve(a, b, m, weights, 30)
        cached = network.solve(a, b, m, weights, 30, cache=cache)
        np.testing.assert_allclose(cached.value, plain.value, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(cached.component, plain.component)
    distinct = np.unique(np.stack((np.minimum(a, b), np.maximum(a, b))), axis=1)
    da, db = distinct[0][distinct[0] != distinct[1]], distinct[1][distinct[0] != distinct[1]]
    dm = rng.normal(size=len(da))
    cache = {}
    for scale in (1.0, 2.0):
        plain = network.solve(da, db, dm, np.full(len(da), scale), 30)
        cached = network.solve(da, db, dm, np.full(len(da), scale), 30, cache=cache)
        np.testing.assert_array_equal(cached.value, plain.value)  # same matrix, same CG
        # distinct edges: one graph, its pattern reused
        assert len(cache["graphs"]) == 1 and cache["graphs"][0][4] is not None


def _joined(sim, rx_order: np.ndarray | None = None, tx_order: np.ndarray | None = None):
    """prepare() of a window's records (rows reordered as given): per original RX row
    its sender, receiver, TX time and match, and the set of pure first rows."""
    tx = sim.tx if tx_order is None else sim.tx[tx_order]
    rx = sim.rx if rx_order is None else sim.rx[rx_order]
    cols = probe_samples.extract(tx, rx, sim.echoes)
    hosts = probe_samples.hosts_in(cols.tx_src, cols.rx_dst, cols.e_src)
    ps = probe_samples.prepare(cols, KeyIndex(hosts), (100, 200))
    back = np.arange(len(rx)) if rx_order is None else rx_order  # row i is original back[i]
    per_row = np.empty(len(rx), [("s", "<i8"), ("d", "<i8"), ("t", "<i8"), ("m", "?")])
    per_row["s"][back] = np.where(ps.rx_src_i >= 0, hosts[ps.rx_src_i], -1)
    per_row["d"][back] = np.where(ps.rx_dst_i >= 0, hosts[ps.rx_dst_i], -1)
    per_row["t"][back] = np.where(ps.matched, ps.tx_ns, 0)
    per_row["m"][back] = ps.matched
    return per_row, np.sort(back[ps.pure_rows]), ps.drops


@pytest.mark.parametrize("block", [1, 3, 64])
def test_join_in_blocks_equals_the_join_in_any_record_order(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    # Rows as shipped (TX rows one run per sender: slots in place; a pair's probes on
    # adjacent RX rows) joined in blocks of any size, against the same records shuffled
    # (TX slots scattered, every pair split: found through the slot table).
    cfg = SimConfig(racks=3, hosts_per_rack=3, buddies_random=2, seed=7, loss=0.1)
    sim = MeshSimulator(cfg).run()
    rng = np.random.default_rng(1)
    shuffled = _joined(sim, rng.permutation(len(sim.rx)), rng.permutation(len(sim.tx)))
    monkeypatch.setattr(pair_fit, "BLOCK_ROWS", block)
    shipped = _joined(sim)
    np.testing.assert_array_equal(shipped[0], shuffled[0])
    np.testing.assert_array_equal(shipped[1], shuffled[1])
    assert shipped[2] == shuffled[2]
    assert shipped[2]["pair_pure"] > 0 and shipped[2]["pair_incomplete"] > 0  # loss
    # the two TX paths were taken
    for tx, in_place in ((sim.tx, True), (sim.tx[rng.permutation(len(sim.tx))], False)):
        cols = probe_samples.extract(tx, sim.rx, sim.echoes)
        hosts = probe_samples.hosts_in(cols.tx_src, cols.rx_dst, cols.e_src)
        slots = probe_samples._tx_slots_in_place(cols, KeyIndex(hosts), len(hosts))
        assert (slots is not None) == in_place


def test_solution_does_not_depend_on_the_block_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SimConfig(racks=3, hosts_per_rack=3, buddies_random=2, seed=5, loss=0.05)
    sim = MeshSimulator(cfg).run()
    config = SolverConfig(spacing_tol_ns=100)
    big = solve_window(sim.tx, sim.rx, sim.echoes, window_start_ns=cfg.start_ns, config=config)
    monkeypatch.setattr(pair_fit, "BLOCK_ROWS", 5)
    monkeypatch.setattr(pair_fit, "_BLOCK_PAIRS", 3)
    small = solve_window(sim.tx, sim.rx, sim.echoes, window_start_ns=cfg.start_ns, config=config)
    np.testing.assert_array_equal(big.clock, small.clock)
    np.testing.assert_array_equal(big.pairs, small.pairs)
    for name, col in big.owd.items():
        np.testing.assert_array_equal(col, small.owd[name], err_msg=name)
    assert big.drops == small.drops


def _nine_host_mesh(seed: int) -> tuple[SimConfig, MeshSimulator, SolverConfig]:
    """The 9-host mesh (3 racks, 2 spines, 4 ports, 5 ns timestamp noise) of the clock
    step and standing-queue tests, and its solver configuration."""
    cfg = SimConfig(racks=3, hosts_per_rack=3, spines=2, buddies_random=2, ports=4,
                    rate_per_port=4.0, offset_max_ns=1e6, drift_max_ppm=10, ts_noise_ns=5.0,
                    seed=seed)  # fmt: skip
    return cfg, MeshSimulator(cfg), SolverConfig(spacing_tol_ns=50)


def _stepped_window(
    step_ns: int, at: float, seed: int = 3, queue_ns: int = 0
) -> tuple[Any, Any, SimConfig]:
    """Two 2-s windows of the 9-host mesh, solved in turn; in the second, host 4's clock
    steps ``step_ns`` (a PTP servo re-locking, chrony or ntpd stepping) ``at`` that share
    of the window — or, with ``queue_ns``, a queue that deep forms then in front of it
    (every packet it receives after, incast). Returns the second window's records and
    solution."""
    cfg, mesh, config = _nine_host_mesh(seed)
    w = cfg.duration_ns
    warm = mesh.run(duration_ns=w)
    prior = solve_window(warm.tx, warm.rx, warm.echoes, window_start_ns=cfg.start_ns,
                         window_ns=w, config=config).state  # fmt: skip
    sim = mesh.run(start_offset_ns=w, duration_ns=w)
    tx, rx, echoes = sim.tx.copy(), sim.rx.copy(), sim.echoes.copy()
    host = int(sim.truth.hosts[4])
    t = cfg.start_ns + w + int(at * w)  # (on its clock: within its offset)
    if queue_ns:
        for rows, who, when in ((rx, "dst", "rx_ns"), (echoes, "dst", "t2_ns"),
                                (echoes, "src", "t4_ns")):  # fmt: skip
            rows[when][(rows[who] == host) & (rows[when] > t)] += queue_ns
        sim.truth.rx_true_owd_ns[(rx["dst"] == host) & (rx["rx_ns"] > t)] += queue_ns
    for rows, who, when in ((tx, "src", "tx_ns"), (rx, "dst", "rx_ns"), (echoes, "src", "t1_ns"),
                            (echoes, "dst", "t2_ns"), (echoes, "dst", "t3_ns"),
                            (echoes, "src", "t4_ns")):  # fmt: skip
        rows[when][(rows[who] == host) & (rows[when] > t)] += step_ns
    sol = solve_window(tx, rx, echoes, window_start_ns=cfg.start_ns + w, window_ns=w,
                       prior=prior, config=config)  # fmt: skip
    return sim, sol, cfg


def _off_rows(sim: Any, sol: Any, cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """Rows stored ``ok`` whose one-way delay is further from the truth than 3 sigma of
    their two hosts' stated uncertainty (and timestamp noise) allow; |error| per row."""
    sigma = dict(zip(sol.clock["host"].tolist(), sol.clock["offset_sigma_ns"].tolist(),
                     strict=True))  # fmt: skip
    o = sol.owd
    err = np.abs(o["owd_ns"] - sim.truth.rx_true_owd_ns)
    bound = 3 * np.array(
        [sigma[s] + sigma[d] for s, d in zip(o["src"].tolist(), o["dst"].tolist(), strict=True)]
    )
    return o["ok"] & (err > bound + 10 * cfg.ts_noise_ns), err


@pytest.mark.parametrize(
    ("step_ns", "at", "seed"),
    [
        (300_000, 0.9, 3),
        (300_000, 0.6, 3),
        (300_000, 0.3, 5),
        (20_000, 0.9, 5),
        (-20_000, 0.4, 5),
        (2_000, 0.5, 3),
    ],
)
def test_a_clock_step_within_a_window_leaves_no_one_way_delay_marked_ok_beyond_its_uncertainty(
    step_ns: int, at: float, seed: int
) -> None:
    """Seen while testing the detector's clock-step discount (2026-12-05): a host's clock
    stepping 300 µs at 90 % of a window, its pair fits rejected the last bin as a bad
    timestamp, the host was SOLVED with a stated uncertainty of ~3 ns, and the one-way
    delays of its probes after the step were stored ``ok``, 300 µs off (a report's delay
    plot, a DuckDB query); 2 µs and 20 µs steps likewise; at 60 %, ~10 µs stated and
    rows up to 179 µs off. Now the host is stated uncertain by the step and its delays in
    that window are not kept; everyone else's are."""
    sim, sol, cfg = _stepped_window(step_ns, at, seed)
    off, err = _off_rows(sim, sol, cfg)
    assert not off.any(), (
        f"{off.sum()} of {sol.owd['ok'].sum()} ok rows, up to {err[off].max():.0f} ns"
    )
    host = int(sim.truth.hosts[4])
    assert set(sol.stepped) == {host}, sol.stepped  # (the ops box logs it)
    assert sol.stepped[host] == pytest.approx(abs(step_ns), rel=0.1)
    c = sol.clock[sol.clock["host"] == host][0]
    assert c["offset_sigma_ns"] >= 0.9 * abs(step_ns), c
    o = sol.owd
    others = (o["src"] != host) & (o["dst"] != host) & np.isfinite(sim.truth.rx_true_owd_ns)
    assert o["ok"][others].mean() > 0.95, "the other hosts' delays are kept"


@pytest.mark.parametrize("at", [0.2, 0.3, 0.5, 0.9])
def test_a_queue_forming_in_front_of_a_host_is_not_taken_for_a_clock_step(at: float) -> None:
    """A queue only lengthens a round trip: 200 µs of incast into host 4 from ``at`` of
    the window on leaves every host's clock stated as tight as before and its delays
    kept, each within its uncertainty of the truth (the queue included)."""
    sim, sol, cfg = _stepped_window(0, at, seed=3, queue_ns=200_000)
    assert not sol.stepped and sol.stats["hosts_stepped"] == 0
    assert sol.clock["offset_sigma_ns"].max() < 1_000, sol.clock["offset_sigma_ns"]
    off, err = _off_rows(sim, sol, cfg)
    assert not off.any(), (
        f"{off.sum()} of {sol.owd['ok'].sum()} ok rows, up to {err[off].max():.0f} ns"
    )
    host = int(sim.truth.hosts[4])
    mine = sol.owd["dst"] == host
    assert sol.owd["ok"][mine].mean() > 0.95


def test_a_queue_standing_through_most_of_a_window_leaves_no_delay_marked_ok_beyond_its_uncertainty() -> (
    None
):
    """Seen while testing the clock-step finder (2026-12-05): 200 µs of incast into host 4
    from 10 % of the window on (7 of its 8 bins queued). Each of its pairs takes its
    second-least round trip as clean, a queued one, so the queue is not seen as excess;
    the midpoints sit half the queue off, alike on every pair of the host, and the loops
    agree: the host is SOLVED ~100 µs off with ~3 ns stated, its 704 delays stored ``ok``
    100 µs off (two-way time transfer's asymmetry, unseen). From 20 % on (two clean
    bins) it held. Now the excess is measured against the pairs' clean round trips of
    earlier windows (``steps.StandingQueue``): the one clean bin left carries the fit."""
    sim, sol, cfg = _stepped_window(0, 0.1, seed=3, queue_ns=200_000)
    off, err = _off_rows(sim, sol, cfg)
    assert not off.any(), (
        f"{off.sum()} of {sol.owd['ok'].sum()} ok rows, up to {err[off].max():.0f} ns"
    )


@pytest.mark.parametrize(
    ("queue_ns", "end", "seed"),
    [(200_000, 0.9, 3), (200_000, 0.3, 5), (2_000, 0.95, 3), (20_000, 0.9, 5)],
)
def test_a_queue_standing_through_whole_windows_is_carried_then_stated_and_its_end_is_no_step(
    queue_ns: int, end: float, seed: int
) -> None:
    """Sustained incast: a queue stands in front of host 4 through 35 whole windows (70 s;
    every bin of every pair of it queued), then ends at ``end`` of the next. Its pairs
    read its clock half the queue off, alike, and no loop sees that; judged against its
    pairs' clean round trips of the windows before, the host is carried on its previous
    clock (PREDICTED) for the solver's 60 s, then stated uncertain by about half the
    queue; no delay is kept ``ok`` beyond its uncertainty, and the queue ending is not
    taken for a clock step (before: ~3 ns stated and 576-704 delays half the queue off
    from the queue's first window on; its end late in a window logged a step of the 18
    µs the tracked round trip had risen)."""
    cfg, mesh, config = _nine_host_mesh(seed)
    w = cfg.duration_ns
    prior = None
    for i in range(40):
        sim = mesh.run(start_offset_ns=i * w, duration_ns=w)
        tx, rx, echoes = sim.tx, sim.rx.copy(), sim.echoes.copy()
        host = int(sim.truth.hosts[4])
        until = cfg.start_ns + i * w + (w + 1 if i < 38 else int(end * w))  # on its clock
        if 3 <= i <= 38:
            queued = (rx["dst"] == host) & (rx["rx_ns"] < until)
            rx["rx_ns"][queued] += queue_ns
            sim.truth.rx_true_owd_ns[queued] += queue_ns
            for who, when in (("dst", "t2_ns"), ("src", "t4_ns")):
                echoes[when][(echoes[who] == host) & (echoes[when] < until)] += queue_ns
        sol = solve_window(tx, rx, echoes, window_start_ns=cfg.start_ns + i * w, window_ns=w,
                           prior=prior, config=config)  # fmt: skip
        prior = sol.state
        off, err = _off_rows(sim, sol, cfg)
        assert not off.any(), (
            f"window {i}: {off.sum()} of {sol.owd['ok'].sum()} ok rows, "
            f"up to {err[off].max():.0f} ns"
        )
        assert not sol.stepped, f"window {i}: {sol.stepped}"
        into = sol.owd["dst"] == host
        assert sol.owd["ok"][into].mean() > 0.95, f"window {i}: the delays into it not kept"
        if 3 <= i < 38:
            mine = sol.clock["host"] == host
            carried = sol.clock["status"][mine][0] == HostStatus.PREDICTED
            sigma = sol.clock["offset_sigma_ns"][mine][0]
            if i < 3 + 30:  # on the clock it had before the queue
                assert carried, f"window {i}: not carried ({sigma:.0f} ns)"
            else:  # on its pairs again, or carried from them: uncertain by the queue
                assert sigma > queue_ns / 6, f"window {i}: {sigma:.0f} ns stated"
