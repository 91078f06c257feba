"""Exact small cases for the clock solver, built by hand (no simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.clock import (
    HostStatus,
    PairFlag,
    SolverConfig,
    rtt2_baseline,
    solve_window,
    store_columns,
)
from collector.records import ECHO, PROBE_RX, PROBE_TX, host_id

START = 1_760_000_000_000_000_000
WIN = 2_000_000_000
REF = START + WIN // 2
SPACING = 20_000


class Mesh:
    """Hand-built records: true time t (ns since START), clock_h = t + off_h + drift_h * (t - WIN/2)."""

    def __init__(self, offsets: dict[str, float], drifts: dict[str, float] | None = None) -> None:
        self.names = list(offsets)
        self.off = offsets
        self.drift = drifts or dict.fromkeys(offsets, 0.0)
        self.seq = {n: 1000 * (i + 1) for i, n in enumerate(self.names)}
        self.tx: list[tuple] = []
        self.rx: list[tuple] = []
        self.echo: list[tuple] = []

    def clock(self, h: str, t: float) -> int:
        return START + round(t + self.off[h] + self.drift[h] * (t - WIN / 2))

    def pair(self, s: str, d: str, t: float, delay: float, delay2: float | None = None,
             echo_delay: float | None = None, sport: int = 40000) -> None:  # fmt: skip
        q = self.seq[s]
        self.seq[s] += 2
        for k, dl in enumerate((delay, delay if delay2 is None else delay2)):
            ts = t + k * SPACING
            tx_ns, rx_ns = self.clock(s, ts), self.clock(d, ts + dl)
            self.tx.append((q + k, host_id(s), host_id(d), sport, 7470, k, 1, 0, 0, tx_ns))
            self.rx.append(
                (q + k, host_id(s), host_id(d), sport, 7470, k, 1, 0, 61, rx_ns, SPACING)
            )
            if echo_delay is not None:
                t3 = ts + dl + 3000
                self.echo.append((q + k, host_id(s), host_id(d), sport, 1, (0,) * 5, tx_ns, rx_ns,
                                  self.clock(d, t3), self.clock(s, t3 + echo_delay)))  # fmt: skip

    def both_ways(self, a: str, b: str, fwd: float, rev: float, n: int = 16) -> None:
        for i in range(n):
            t = (i + 0.5) * WIN / n
            self.pair(a, b, t, fwd)
            self.pair(b, a, t + 1e6, rev)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tx = np.array(self.tx, dtype=PROBE_TX)
        rx = np.array(self.rx, dtype=PROBE_RX)
        ec = np.array(self.echo, dtype=ECHO) if self.echo else np.zeros(0, ECHO)
        return tx, rx, ec

    def relative(self, hosts: np.ndarray) -> np.ndarray:
        by_id = {host_id(n): self.off[n] for n in self.names}
        v = np.array([by_id[int(h)] for h in hosts])
        return v - v.mean()


def solve(mesh: Mesh, **kw) -> object:
    tx, rx, ec = mesh.arrays()
    return solve_window(tx, rx, ec, window_start_ns=START, window_ns=WIN, **kw)


def test_three_host_loop_recovers_known_offsets_exactly() -> None:
    m = Mesh({"a": 0.0, "b": 1_000.0, "c": -2_500.0})
    m.both_ways("a", "b", 5_000, 5_000)
    m.both_ways("b", "c", 7_000, 7_000)
    m.both_ways("a", "c", 6_000, 6_000)
    sol = solve(m)
    est = sol.clock["offset_ns"]
    assert (sol.clock["status"] == HostStatus.SOLVED).all()
    np.testing.assert_allclose(est - est.mean(), m.relative(sol.clock["host"]), atol=1.0)
    assert abs(est.mean()) < 1e-6  # gauge: mean zero
    assert (sol.pairs["flags"] & PairFlag.DISAGREE == 0).all()
    # corrected one-way delays are the true delays
    owd = sol.owd["owd_ns"][sol.owd["ok"]]
    assert set(np.round(owd).astype(int)) <= {5_000, 6_000, 7_000}
    assert sol.drops["pair_pure"] == 6 * 16


def test_drifting_clocks_offsets_and_drifts() -> None:
    m = Mesh({"a": 3e6, "b": -4e6, "c": 1e6}, {"a": 40e-6, "b": -35e-6, "c": 10e-6})
    m.both_ways("a", "b", 5_000, 5_000)
    m.both_ways("b", "c", 5_000, 5_000)
    m.both_ways("a", "c", 5_000, 5_000)
    sol = solve(m)
    # At ref the mean clock reads REF; with mean drift 5 ppm and mean offset 0 the true
    # instant is REF itself, so the truth is the offsets relative to their mean.
    est = sol.clock["offset_ns"]
    np.testing.assert_allclose(est - est.mean(), m.relative(sol.clock["host"]), atol=2.0)
    by_id = {host_id(n): m.drift[n] * 1e6 for n in m.names}
    want = np.array([by_id[int(h)] for h in sol.clock["host"]])
    got = sol.clock["drift_ppm"]
    # slopes are measured in host a's clock units: second order (drift^2 ~ 2e-3 ppm)
    np.testing.assert_allclose(got - got.mean(), want - want.mean(), atol=5e-3)


def test_asymmetric_pair_is_flagged_and_does_not_spoil_the_rest() -> None:
    names = [f"h{i}" for i in range(6)]
    offs = {n: float(i * 777 - 2000) for i, n in enumerate(names)}
    m = Mesh(offs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            asym = 3_000 if (a, b) == ("h1", "h4") else 0
            m.both_ways(a, b, 5_000 + asym, 5_000, n=8)
    sol = solve(m)
    est = sol.clock["offset_ns"]
    np.testing.assert_allclose(est - est.mean(), m.relative(sol.clock["host"]), atol=5.0)
    flagged = sol.pairs[(sol.pairs["flags"] & PairFlag.DISAGREE) > 0]
    assert len(flagged) == 1
    assert {int(flagged["host_a"][0]), int(flagged["host_b"][0])} == {host_id("h1"), host_id("h4")}
    assert abs(abs(flagged["residual_ns"][0]) - 1_500) < 5


def test_coded_filter_drops_pairs_whose_spacing_changed() -> None:
    m = Mesh({"a": 0.0, "b": 500.0})
    m.both_ways("a", "b", 5_000, 5_000, n=4)
    m.pair("a", "b", 1.5e9, 5_000, delay2=25_000)  # second probe queued 20 us
    sol = solve(m)
    assert sol.drops["pair_impure"] == 1
    assert sol.drops["pair_pure"] == 8
    # the impure pair still gets one-way delays, marked not pure
    owd = sol.owd["owd_ns"][sol.owd["ok"] & ~sol.owd["pure"]]
    assert np.isclose(owd.max(), 25_000, atol=1)


def test_disconnected_components_each_mean_zero() -> None:
    m = Mesh({"a": 100.0, "b": 300.0, "c": 5_000.0, "d": 9_000.0})
    m.both_ways("a", "b", 5_000, 5_000)
    m.both_ways("c", "d", 5_000, 5_000)
    sol = solve(m)
    comp = sol.clock["component"]
    assert sorted(set(comp.tolist())) == [0, 1]
    for c in (0, 1):
        sel = comp == c
        assert abs(sol.clock["offset_ns"][sel].sum()) < 1e-6
        assert np.ptp(sol.clock["offset_ns"][sel]) == pytest.approx(
            200.0 if host_id("a") in sol.clock["host"][sel] else 4_000.0, abs=1.0
        )


def test_one_way_pair_gives_no_offset_and_host_stays_unsolved() -> None:
    m = Mesh({"a": 0.0, "b": 500.0, "c": 42.0})
    m.both_ways("a", "b", 5_000, 5_000)
    for i in range(8):  # c only sends, nobody answers, no echoes
        m.pair("c", "a", i * 2e8 + 1e6, 5_000)
    sol = solve(m)
    row = sol.clock[sol.clock["host"] == host_id("c")][0]
    assert row["status"] == HostStatus.UNSOLVED
    assert np.isnan(row["offset_ns"])
    assert (sol.pairs["flags"][sol.pairs["n_rev"] == 0] & PairFlag.ONE_WAY).all() or (
        sol.pairs["flags"][sol.pairs["n_fwd"] == 0] & PairFlag.ONE_WAY
    ).all()


def test_echo_return_legs_complete_a_one_way_pair() -> None:
    m = Mesh({"a": 0.0, "b": 1_234.0})
    for i in range(16):
        m.pair("a", "b", (i + 0.5) * WIN / 16, 5_000, echo_delay=5_000)
    sol = solve(m)
    est = sol.clock["offset_ns"]
    np.testing.assert_allclose(est - est.mean(), m.relative(sol.clock["host"]), atol=1.0)
    none = solve(m, config=SolverConfig(echo_reverse="never"))
    assert (none.clock["status"] == HostStatus.UNSOLVED).all()


def test_prior_keeps_mesh_time_continuous_when_hosts_join_and_leave() -> None:
    offs = {"a": 0.0, "b": 1_000.0, "c": -700.0, "d": 4_000.0, "e": -9_000.0}
    m1 = Mesh(offs)
    for x, y in (("a", "b"), ("b", "c"), ("a", "c"), ("c", "d")):
        m1.both_ways(x, y, 5_000, 5_000)
    s1 = solve(m1)
    m2 = Mesh(offs)  # d left, e joined
    for x, y in (("a", "b"), ("b", "c"), ("a", "c"), ("c", "e")):
        m2.both_ways(x, y, 5_000, 5_000)
    s2 = solve(m2, prior=s1.state)
    o1 = dict(zip(s1.clock["host"].tolist(), s1.clock["offset_ns"].tolist(), strict=True))
    o2 = dict(zip(s2.clock["host"].tolist(), s2.clock["offset_ns"].tolist(), strict=True))
    for h in ("a", "b", "c"):  # zero drift: a continuing host reads the same offset
        assert o2[host_id(h)] == pytest.approx(o1[host_id(h)], abs=1.0)
    assert o2[host_id("e")] - o2[host_id("a")] == pytest.approx(-9_000.0, abs=1.0)
    assert host_id("d") in s2.state.hosts.tolist()  # carried forward, not forgotten


def test_host_without_pure_pairs_is_predicted_from_prior() -> None:
    offs = {"a": 0.0, "b": 1_000.0, "c": -700.0}
    m1 = Mesh(offs)
    for x, y in (("a", "b"), ("b", "c"), ("a", "c")):
        m1.both_ways(x, y, 5_000, 5_000)
    s1 = solve(m1)
    m2 = Mesh(offs)
    m2.both_ways("a", "b", 5_000, 5_000)
    for i in range(4):  # c's pairs all queued: impure
        m2.pair("c", "a", i * 4e8 + 1e6, 5_000, delay2=90_000)
        m2.pair("a", "c", i * 4e8 + 2e6, 5_000, delay2=90_000)
    s2 = solve(m2, prior=s1.state)
    row = s2.clock[s2.clock["host"] == host_id("c")][0]
    assert row["status"] == HostStatus.PREDICTED
    before = s1.clock[s1.clock["host"] == host_id("c")][0]["offset_ns"]
    assert row["offset_ns"] == pytest.approx(before, abs=1.0)
    assert s2.drops["pair_impure"] == 8


def test_rtt2_baseline_exact_when_symmetric_and_biased_when_not() -> None:
    m = Mesh({"a": 0.0, "b": 2_000.0})
    for i in range(8):
        m.pair("a", "b", (i + 0.5) * WIN / 8, 5_000, echo_delay=5_000)
    base = rtt2_baseline(m.arrays()[2], ref_ns=REF)
    sign = 1 if host_id("a") < host_id("b") else -1
    assert base["offset_ns"][0] == pytest.approx(sign * 2_000.0, abs=1.0)
    m2 = Mesh({"a": 0.0, "b": 2_000.0})
    for i in range(8):
        m2.pair("a", "b", (i + 0.5) * WIN / 8, 9_000, echo_delay=5_000)
    base2 = rtt2_baseline(m2.arrays()[2], ref_ns=REF, method="mean")
    assert base2["offset_ns"][0] == pytest.approx(sign * 4_000.0, abs=1.0)  # + asym/2


def test_bad_input_is_a_one_line_error() -> None:
    with pytest.raises(TypeError, match="tx: expected a numpy array"):
        solve_window(np.zeros(3), np.zeros(0, PROBE_RX), np.zeros(0, ECHO), window_start_ns=0)
    with pytest.raises(ValueError, match="echo_reverse"):
        SolverConfig(echo_reverse="sometimes")


def test_empty_window() -> None:
    sol = solve_window(
        np.zeros(0, PROBE_TX), np.zeros(0, PROBE_RX), np.zeros(0, ECHO), window_start_ns=START
    )
    assert len(sol.clock) == 0 and len(sol.pairs) == 0 and len(sol.owd["owd_ns"]) == 0


def test_store_columns_match_the_store_schema() -> None:
    m = Mesh({"a": 0.0, "b": 1_000.0, "c": -2_500.0})
    m.both_ways("a", "b", 5_000, 5_000)
    m.both_ways("b", "c", 7_000, 7_000)
    sol = solve(m, config=SolverConfig(gauge_host=host_id("a")))
    cols = store_columns(sol)
    clock, owd = cols["clock"], cols["owd"]
    assert list(clock) == [
        "window_start_ns", "window_end_ns", "host", "offset_ns", "drift_ppm",
        "uncertainty_ns", "reference", "method",
    ]  # fmt: skip
    assert list(owd) == ["ts_ns", "src", "dst", "sport", "seq", "owd_ns", "uncertainty_ns"]
    assert (clock["reference"] == host_id("a")).all()
    a = clock["offset_ns"][clock["host"] == host_id("a")][0]
    c = clock["offset_ns"][clock["host"] == host_id("c")][0]
    assert a == pytest.approx(0.0, abs=1e-6) and c == pytest.approx(-2_500.0, abs=1.0)
    assert len({len(v) for v in owd.values()}) == 1 and len(owd["owd_ns"]) == 4 * 16 * 2
    assert (np.abs(owd["ts_ns"] - START) < WIN + 10_000).all()


def test_hardware_timestamps_get_the_tight_spacing_tolerance() -> None:
    m = Mesh({"a": 0.0, "b": 500.0})
    m.both_ways("a", "b", 5_000, 5_000, n=4)
    m.pair("a", "b", 1.5e9, 5_000, delay2=6_000)  # spacing off by 1 us
    tx, rx, ec = m.arrays()
    sw = solve_window(tx, rx, ec, window_start_ns=START, window_ns=WIN)
    assert sw.drops["pair_impure"] == 0  # within the software tolerance (10 us)
    rx["ts_kind"] = 2  # TsKind.HW
    hw = solve_window(tx, rx, ec, window_start_ns=START, window_ns=WIN)
    assert hw.drops["pair_impure"] == 1  # beyond the hardware tolerance (200 ns)


def test_state_forgets_hosts_not_solved_for_too_long() -> None:
    offs = {"a": 0.0, "b": 1_000.0, "c": -700.0}
    m1 = Mesh(offs)
    for x, y in (("a", "b"), ("b", "c"), ("a", "c")):
        m1.both_ways(x, y, 5_000, 5_000)
    state = solve(m1).state
    m2 = Mesh(offs)
    m2.both_ways("a", "b", 5_000, 5_000)
    for i in range(2):  # c keeps sending, but only impure pairs
        m2.pair("c", "a", i * 4e8 + 1e6, 5_000, delay2=90_000)
    cfg = SolverConfig(state_max_age_ns=5 * WIN)
    statuses = []
    for _ in range(8):  # the same data, window after window
        tx, rx, ec = m2.arrays()
        sol = solve_window(tx, rx, ec, window_start_ns=START, window_ns=WIN, prior=state,
                           config=cfg)  # fmt: skip
        # pretend time moves on: age the state by one window
        state = sol.state
        state.last_seen_ns = state.last_seen_ns - WIN
        row = sol.clock[sol.clock["host"] == host_id("c")][0]
        statuses.append(int(row["status"]))
    assert statuses[0] == HostStatus.PREDICTED
    assert statuses[-1] == HostStatus.UNSOLVED


def test_collector_restart_inside_the_window_uses_the_sorting_join() -> None:
    m = Mesh({"a": 0.0, "b": 1_000.0, "c": -2_500.0})
    m.both_ways("a", "b", 5_000, 5_000, n=8)
    m.seq["a"] += 10**12  # a restarted: its seq jumps (time-based start)
    m.both_ways("a", "c", 6_000, 6_000, n=8)
    m.both_ways("b", "c", 7_000, 7_000, n=8)
    sol = solve(m)
    est = sol.clock["offset_ns"]
    np.testing.assert_allclose(est - est.mean(), m.relative(sol.clock["host"]), atol=1.0)
    assert sol.drops["pair_pure"] == 6 * 8 and sol.drops["rx_without_tx"] == 0
    from analytics.clock.probe_samples import SeqLayout

    tx = m.arrays()[0]
    ids = np.unique(tx["src"])
    layout = SeqLayout(np.searchsorted(ids, tx["src"]), tx["seq"].astype(np.int64), len(ids))
    assert not layout.dense
