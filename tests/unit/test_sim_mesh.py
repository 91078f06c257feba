"""The mesh simulator produces the collector's records, consistent with its ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.sim import MeshSimulator, SimConfig
from analytics.sim.mesh_simulator import Congestion
from collector.records import ECHO, PROBE_RX, PROBE_TX


def test_records_have_collector_dtypes_and_sane_structure() -> None:
    cfg = SimConfig(racks=2, hosts_per_rack=3, buddies_random=2, ports=4, seed=5)
    sim = MeshSimulator(cfg).run()
    assert sim.tx.dtype == PROBE_TX and sim.rx.dtype == PROBE_RX and sim.echoes.dtype == ECHO
    # per sender, seq is unique and pairs are (even, odd) with pair = seq % 2
    for src in np.unique(sim.tx["src"]):
        seq = sim.tx["seq"][sim.tx["src"] == src]
        assert len(np.unique(seq)) == len(seq)
    assert (sim.tx["pair"] == sim.tx["seq"] % 2).all()
    # every host probes own rack (2) + 2 random others on 4 ports, 1 pair/s for 2 s
    assert len(sim.tx) == cfg.hosts * 4 * 4 * 2 * 2
    assert len(sim.rx) == len(sim.tx)  # no loss
    assert (sim.echoes["t4_ns"] > sim.echoes["t1_ns"]).all()
    every = MeshSimulator(SimConfig(racks=2, hosts_per_rack=3, buddies_random=2, ports=4, seed=5, echo_every=1)).run()  # fmt: skip
    assert len(every.echoes) == len(every.tx)


def test_echoes_follow_the_collectors_one_in_n_rule() -> None:
    cfg = SimConfig(racks=2, hosts_per_rack=3, buddies_random=2, ports=8, rate_per_port=8.0, seed=5)
    assert cfg.echo_every == 8  # the collector's default
    sim = MeshSimulator(cfg).run()
    # both probes of an echoed pair come back; about 1 pair in 8 is echoed
    pairs = {
        (int(s), int(q) // 2) for s, q in zip(sim.echoes["src"], sim.echoes["seq"], strict=True)
    }
    assert len(sim.echoes) == 2 * len(pairs)
    assert abs(len(sim.echoes) / len(sim.tx) - 1 / 8) < 0.02
    # every (sender, receiver) is echoed on some port: the rule rotates over ports
    streams = {(int(a), int(b)) for a, b in zip(sim.tx["src"], sim.tx["dst"], strict=True)}
    echoed = {(int(a), int(b)) for a, b in zip(sim.echoes["src"], sim.echoes["dst"], strict=True)}
    assert echoed == streams


def test_timestamps_follow_the_truth_exactly_without_noise() -> None:
    cfg = SimConfig(ts_noise_ns=0.0, idle_util=0.0, seed=2)
    sim = MeshSimulator(cfg).run()
    t = sim.truth
    order = np.argsort(t.hosts)
    idx = lambda ids: order[np.searchsorted(t.hosts, ids, sorter=order)]  # noqa: E731
    tx_by = {
        (int(s), int(q)): int(v)
        for s, q, v in zip(sim.tx["src"], sim.tx["seq"], sim.tx["tx_ns"], strict=True)
    }
    tx_ns = np.array(
        [tx_by[(int(s), int(q))] for s, q in zip(sim.rx["src"], sim.rx["seq"], strict=True)]
    )
    # rx - tx = owd + offset change between the two clocks
    s, d = idx(sim.rx["src"]), idx(sim.rx["dst"])
    t_send = (tx_ns - cfg.start_ns - t.offset_ns[s]) / (1 + t.drift_ppm[s] * 1e-6)
    want = (
        t.rx_true_owd_ns
        + (t.offset_ns[d] - t.offset_ns[s])
        + (t.drift_ppm[d] - t.drift_ppm[s]) * 1e-6 * t_send
        + t.drift_ppm[d] * 1e-6 * t.rx_true_owd_ns
    )
    np.testing.assert_allclose(sim.rx["rx_ns"] - tx_ns, want, atol=1.5)


def test_loss_and_congestion_change_what_is_recorded() -> None:
    base = SimConfig(racks=2, hosts_per_rack=2, spines=1, buddies_random=2, seed=9)
    lossy = MeshSimulator(SimConfig(**{**base.__dict__, "loss": 0.3})).run()
    assert 0.6 < len(lossy.rx) / len(lossy.tx) < 0.8
    cong = (Congestion(leaf=0, spine=0, up=True, util=1.0, queue_ns=1e6),)
    hot = MeshSimulator(SimConfig(**{**base.__dict__, "congestion": cong})).run()
    cold = MeshSimulator(base).run()
    # rack 0 -> rack 1 traffic crosses the congested leaf0->spine0 direction only
    r0 = hot.truth.hosts[:2]
    up = np.isin(hot.rx["src"], r0) & ~np.isin(hot.rx["dst"], r0)
    down = ~np.isin(hot.rx["src"], r0) & np.isin(hot.rx["dst"], r0)
    assert np.median(hot.truth.rx_true_owd_ns[up]) > 100_000
    assert np.median(hot.truth.rx_true_owd_ns[down]) < 10_000
    assert np.median(cold.truth.rx_true_owd_ns[up]) < 10_000


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="congestion"):
        MeshSimulator(SimConfig(congestion=(Congestion(leaf=99, spine=0),)))
