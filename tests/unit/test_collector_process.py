"""Two real collector processes on loopback addresses, shipping to a real HTTP receiver."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from collector import records
from collector.inband import EVENT_SEND, pack_report
from tests.unit.collector_procs import (
    CollectorProcess,
    free_udp_port,
    loopback_net,
    write_config,
)
from tests.unit.collector_receiver import Receiver

OFFSET_NS = 5_000_000
DRIFT_PPM = 200.0


@pytest.fixture
def pair(tmp_path: Path, receiver: Receiver) -> Iterator[tuple[CollectorProcess, CollectorProcess]]:
    net = loopback_net()
    a_addr, b_addr = f"{net}.1", f"{net}.2"
    port = free_udp_port(a_addr)
    peers = [
        {"name": "ha", "address": a_addr, "rack": "r1"},
        {"name": "hb", "address": b_addr, "rack": "r1"},
    ]
    # 1 coded pair in 2 echoed (default 1 in 8): 8 echoes/s, so the echo checks below
    # do not wait long; the sampling rule itself: test_collector_probe_mesh.py.
    common = {"port": port, "base_sport": 41000 + (port % 20000), "probe": {"echo_every": 2}}
    a = CollectorProcess(
        write_config(
            tmp_path,
            "ha",
            a_addr,
            peers,
            receiver.url,
            lab=True,
            lab_clock={"offset_ns": OFFSET_NS, "drift_ppm": DRIFT_PPM},
            **common,
        )
    )
    b = CollectorProcess(write_config(tmp_path, "hb", b_addr, peers, receiver.url, **common))
    try:
        yield a.start(), b.start()
    finally:
        for c in (a, b):
            with contextlib.suppress(Exception):
                c.stop()


def _table(receiver: Receiver, table: str, host: str) -> np.ndarray:
    parts = [p for p in receiver.rows(table, host) if len(p)]
    return np.concatenate(parts) if parts else np.zeros(0, records.TABLES[table])


def test_probe_mesh_end_to_end(
    pair: tuple[CollectorProcess, CollectorProcess], receiver: Receiver
) -> None:
    a, b = pair
    a.wait_status(lambda s: s["echoes_received"] >= 40 and s["shipping"]["segments_acked"] >= 2)
    b.wait_status(lambda s: s["probes_received"] >= 40 and s["shipping"]["segments_acked"] >= 2)
    st = a.status()
    assert st["buddies"] == ["hb"] and st["ports_per_buddy"] == 8
    assert sum(st["rejected"].values()) == 0
    # SIGHUP with a broken config: logged, old config kept, still probing.
    good = a.config.read_text()
    a.config.write_text(good.replace("probe_port", "probe_prot"))
    a.signal(signal.SIGHUP)
    st = a.wait_status(lambda s: s["reload_errors"] == 1)
    sent = st["probes_sent"]
    a.wait_status(lambda s: s["probes_sent"] > sent + 10)
    # A good config on SIGHUP is applied (sockets reopened, probing goes on).
    a.config.write_text(good.replace("rate_per_port", "rate_per_port") + "log_level: debug\n")
    a.signal(signal.SIGHUP)
    st = a.wait_status(lambda s: s["reloads"] == 1)
    a.wait_status(
        lambda s: (
            s["probes_sent"] > st["probes_sent"] + 10
            and s["echoes_received"] > st["echoes_received"]
        )
    )
    a.config.write_text(good)
    assert a.stop() == 0 and b.stop() == 0
    assert a.status()["state"] == "stopped"
    assert "event=reload_failed" in a.log.read_text()
    # A clean stop flushes, rolls and ships the last segment while ingest answers.
    assert not list(Path(a.doc["spool"]["dir"]).glob("*.seg"))
    assert not list(Path(a.doc["spool"]["dir"]).glob("*.open"))

    a_id, b_id = records.host_id("ha"), records.host_id("hb")
    tx = _table(receiver, "probe_tx", "ha")
    rx = _table(receiver, "probe_rx", "hb")
    assert set(tx["dst"].tolist()) == {b_id}
    assert set(tx["sport"].tolist()) == set(
        range(a.doc["probe"]["base_sport"], a.doc["probe"]["base_sport"] + 8)
    )
    assert (tx["ts_kind"] == records.TsKind.SW).mean() > 0.95  # kernel TX timestamps
    assert len(np.unique(tx["seq"])) == len(tx)
    # Every probe sent has a row: consecutive seqs, except one jump forward at the
    # successful reload (a new probe mesh starts its seqs from the clock).
    steps = np.diff(tx["seq"].astype(np.int64))
    assert (steps >= 1).all() and (steps > 1).sum() <= 1
    assert set(rx["src"].tolist()) == {a_id} and (rx["ts_kind"] == records.TsKind.SW).all()
    assert (rx["spacing_ns"] == 20_000).all() and (rx["ttl"] == 64).all()
    # Coded pairs: both halves arrive, pair index = seq % 2.
    assert (rx["pair"] == rx["seq"] % 2).all()
    echo = _table(receiver, "echo", "ha")
    assert len(echo) >= 40 and (echo["dst"] == b_id).all()
    assert (echo["t4_ns"] > echo["t1_ns"]).all() and (echo["t3_ns"] >= echo["t2_ns"]).all()
    rtt = (echo["t4_ns"] - echo["t1_ns"]) - (echo["t3_ns"] - echo["t2_ns"])
    assert 0 < np.median(rtt) < 2_000_000
    assert (np.isin(echo["seq"] ^ 1, echo["seq"])).mean() > 0.9  # whole coded pairs
    counters = _table(receiver, "counter", "ha")
    assert {b"rx_bytes", b"port_xmit_data", b"np_cnp_sent", b"rate_mbps"} <= set(
        counters["name"].tolist()
    )
    cfg_rows = _table(receiver, "rdma_config", "ha")
    assert sorted(set(cfg_rows["gid_type"].tolist())) == [b"IB/RoCE v1", b"RoCE v2"]
    jobs = _table(receiver, "job_rdma", "ha")
    assert (b"nccl.conf", 3) in {(r["source"], int(r["gid_index"])) for r in jobs}
    health = _table(receiver, "health", "hb")
    assert b"probes_rejected_auth" in set(health["name"].tolist())


def test_lab_clock_skew_is_exact(
    pair: tuple[CollectorProcess, CollectorProcess], receiver: Receiver
) -> None:
    a, b = pair
    st = a.status()
    t0 = st["lab_clock"]["t0_ns"]
    assert st["lab_clock"]["offset_ns"] == OFFSET_NS
    # 1) Exact: a timestamp we hand in through the in-band hook comes out skewed by the formula.
    raw = [time.time_ns() + d for d in (0, 1_000_000_007, 3_600 * 10**9)]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for i, t in enumerate(raw):
        sock.sendto(
            pack_report(EVENT_SEND, "clock-test", 1, i, 0, 64, t), a.doc["inband"]["socket"]
        )
    a.wait_status(lambda s: s["inband"]["received"] >= 3 and s["echoes_received"] >= 40)
    b.wait_status(lambda s: s["probes_received"] >= 40)
    a.stop()
    b.stop()
    inband = _table(receiver, "inband", "ha")
    expected = [t + OFFSET_NS + round(DRIFT_PPM * 1e-6 * (t - t0)) for t in raw]
    assert sorted(inband["event_ns"].tolist()) == sorted(expected)
    # 2) Kernel timestamps: A's recorded TX times vs B's unskewed RX times of the same probes.
    tx = _table(receiver, "probe_tx", "ha")
    rx = _table(receiver, "probe_rx", "hb")
    common, ti, ri = np.intersect1d(tx["seq"], rx["seq"], return_indices=True)
    assert len(common) >= 40
    a_tx = tx["tx_ns"][ti].astype(np.int64)
    b_rx = rx["rx_ns"][ri].astype(np.int64)
    # Undo A's skew (drift term evaluated at B's time: error = drift * one-way delay, < 1 ns).
    delay = b_rx - (a_tx - OFFSET_NS - np.rint(DRIFT_PPM * 1e-6 * (b_rx - t0)).astype(np.int64))
    assert (delay > 0).all() and np.median(delay) < 1_000_000, delay[:10]
    # Without undoing it, the offset is plainly there.
    assert np.median(a_tx - b_rx) > OFFSET_NS - 1_000_000
    # Reverse direction: B (unskewed) sends, A records skewed RX times.
    btx = _table(receiver, "probe_tx", "hb")
    arx = _table(receiver, "probe_rx", "ha")
    common, ti, ri = np.intersect1d(btx["seq"], arx["seq"], return_indices=True)
    b_tx = btx["tx_ns"][ti].astype(np.int64)
    a_rx = arx["rx_ns"][ri].astype(np.int64)
    delay = (a_rx - OFFSET_NS - np.rint(DRIFT_PPM * 1e-6 * (b_tx - t0)).astype(np.int64)) - b_tx
    assert len(common) >= 40 and (delay > 0).all() and np.median(delay) < 1_000_000


def test_bad_config_and_missing_key_are_one_line_errors(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.unit.collector_procs import ROOT

    cfg = tmp_path / "c.yml"
    cfg.write_text(
        "host: h\nbackend: {address: 127.0.0.1}\ningest: {url: 'http://127.0.0.1:1'}\nfleet_key_file: /nonexistent/key\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "collector", "run", "--config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert (
        out.stderr.strip().splitlines()[-1]
        == f"Error: {cfg}: fleet_key_file: cannot read /nonexistent/key: No such file or directory"
    )
    cfg.write_text(
        "host: h\nbackend: {address: 127.0.0.1, probe_port: x}\ningest: {url: 'http://x'}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "collector", "run", "--config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"{cfg}: backend.probe_port: expected int" in out.stderr


def test_each_run_says_when_it_began_to_listen_and_its_first_segment_ships_at_once(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A restarted collector's segments carry the new run's ``run_ns`` (when it began to
    listen for probes; before its first probe), and the run's first segment ships at
    once, not a roll interval later: the ops box learns of the restart before it judges
    what peers lost to the host meanwhile (test_store_writer, test_ingest_daemon)."""
    net = loopback_net()
    port = free_udp_port(f"{net}.1")
    peers = [{"name": "ha", "address": f"{net}.1", "rack": "r1"},
             {"name": "hb", "address": f"{net}.2", "rack": "r1"}]  # fmt: skip
    a = CollectorProcess(write_config(
        tmp_path, "ha", f"{net}.1", peers, receiver.url, port=port,
        base_sport=41000 + (port % 20000), spool={"roll_s": 6.0},
        lab=True, lab_clock={"offset_ns": OFFSET_NS, "drift_ppm": DRIFT_PPM},
    ))  # fmt: skip
    runs: list[tuple[float, int]] = []  # (time.time() it was started, its run_ns)

    def run_ns() -> set[int]:
        with receiver.lock:
            return {receiver.segments[i].run_ns for i in receiver.order if i[0] == "ha"}

    try:
        for _ in range(2):
            started = time.time()
            seen = run_ns()
            a.start()
            deadline = time.monotonic() + 4.0  # well inside the 6-s roll
            while not run_ns() - seen and time.monotonic() < deadline:
                time.sleep(0.05)
            new = run_ns() - seen
            assert len(new) == 1, (new, a.log.read_text()[-2000:])
            first = min(
                t for i, t in receiver.arrived.items() if receiver.segments[i].run_ns in new
            )
            assert first - started < 4.0
            runs.append((started, new.pop()))
            time.sleep(1.0)
            assert a.stop() == 0
    finally:
        with contextlib.suppress(Exception):
            a.stop()
    (s1, r1), (s2, r2) = runs
    assert s1 * 1e9 < r1 < s2 * 1e9 < r2 < time.time_ns()
    with receiver.lock:
        segs = [receiver.segments[i] for i in receiver.order if i[0] == "ha"]
    for seg in segs:  # every segment of a run carries it, and no probe precedes it
        tx = seg.table("probe_tx")
        assert seg.run_ns in (r1, r2)
        # (tx_ns is the lab clock's: up to OFFSET_NS + drift ahead of the real one)
        assert not len(tx) or int(tx["tx_ns"].min()) >= seg.run_ns + OFFSET_NS
    # the lab clock's error goes on across the restart, as a real clock's does: the
    # second run reports the first run's t0 (its drift term does not jump back)
    t0s = {
        (seg.run_ns, int(h["value"]))
        for seg in segs
        for h in seg.table("health")
        if h["name"] == b"lab_clock_t0_ns"
    }
    assert {r for r, _ in t0s} == {r1, r2} and len({t for _, t in t0s}) == 1, t0s
    assert s1 * 1e9 < next(iter(t0s))[1] < r1
