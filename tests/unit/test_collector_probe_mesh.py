"""Two probe meshes in one process on loopback: batched sending, draining and records.

Runs the recvmmsg/sendmmsg path and the per-datagram fallback (no libc functions)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from collector import config as config_mod
from collector import datagram_batch, path_trace, records
from collector.config import Peer
from collector.lab_clock import RecordingClock
from collector.probe_mesh import ProbeMesh
from collector.probe_packet import KIND_ECHO, KIND_PROBE, PacketCodec
from collector.record_buffer import RecordBuffer
from tests.unit.collector_procs import free_udp_port, loopback_net

KEY = b"m" * 32


def _mesh(
    tmp: Path, name: str, me: str, other: str, other_addr: str, port: int, **probe: object
) -> ProbeMesh:
    (tmp / "key").write_bytes(KEY)
    doc = {
        "host": name,
        "fleet_key_file": str(tmp / "key"),
        "backend": {"address": me, "probe_port": port},
        "peers": [{"name": other, "address": other_addr}],
        "probe": {"base_sport": port + 1, "rate_per_port": 10.0, **probe},
        "ingest": {"url": "http://127.0.0.1:1"},
        "spool": {"dir": str(tmp / name)},
        "inband": {"socket": str(tmp / f"{name}.sock")},
        "status_file": str(tmp / f"{name}.json"),
    }
    (tmp / f"{name}.yml").write_text(yaml.safe_dump(doc))
    cfg = config_mod.load(tmp / f"{name}.yml")
    buffers = {t: RecordBuffer(t) for t in records.TABLES}
    mesh = ProbeMesh(
        cfg, [Peer(name=other, address=other_addr)], PacketCodec(KEY), RecordingClock(None), buffers
    )
    mesh.open()
    return mesh


@pytest.fixture(params=[True, False], ids=["native", "emulated"])
def meshes(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ProbeMesh, ProbeMesh]]:
    if not request.param:
        monkeypatch.setattr(datagram_batch, "_LIBC", None)
    net = loopback_net()
    a_addr, b_addr = f"{net}.1", f"{net}.2"
    port = free_udp_port(a_addr)
    a = _mesh(tmp_path, "ma", a_addr, "mb", b_addr, port)
    b = _mesh(tmp_path, "mb", b_addr, "ma", a_addr, port)
    try:
        assert a._txb.native == request.param
        yield a, b
    finally:
        a.close()
        b.close()


def test_pairs_echoes_and_tx_timestamps_in_bulk(meshes: tuple[ProbeMesh, ProbeMesh]) -> None:
    a, b = meshes
    time.sleep(0.2)  # RX timestamping is switched on by deferred kernel work
    pairs = [a.slots[i % len(a.slots)] for i in range(50)]
    for _ in range(3):
        a._send_pairs(pairs)
    assert a.stats["probes_sent"] == 300
    time.sleep(0.1)
    b.drain()  # probes: recorded and echoed
    time.sleep(0.1)
    a.drain()  # TX timestamps, then echoes
    a.flush()
    tx = a.buffers["probe_tx"].take()
    rx = b.buffers["probe_rx"].take()
    echo = a.buffers["echo"].take()
    assert len(tx) == len(rx) == 300
    # Default echo sampling: both probes of the v-th pair on port p echoed iff
    # (v + p) % 8 == 0 (one buddy, index 0): 150 pairs over 8 ports -> 18 pairs.
    firsts = np.sort(tx["seq"][tx["seq"] % 2 == 0])
    sport_first = {int(q): int(sp) for q, sp in zip(tx["seq"], tx["sport"], strict=True)}
    visits: dict[int, int] = {}
    want = set()
    for q in firsts.tolist():
        p = sport_first[q] - a.cfg.probe.base_sport
        v = visits.get(p, 0)
        visits[p] = v + 1
        if (v + p) % 8 == 0:
            want |= {q, q + 1}
    assert a.echo_every == 8 and len(want) == 36
    assert sorted(echo["seq"].tolist()) == sorted(want)
    assert b.stats["echoes_sent"] == 36
    assert (tx["ts_kind"] == records.TsKind.SW).all()  # every probe got its kernel TX time
    assert sorted(tx["seq"].tolist()) == sorted(rx["seq"].tolist())
    assert set(tx["sport"].tolist()) == {a.cfg.probe.base_sport + p for p in range(8)}
    by_seq = dict(zip(tx["seq"].tolist(), tx["tx_ns"].tolist(), strict=True))
    sport_of = dict(zip(tx["seq"].tolist(), tx["sport"].tolist(), strict=True))
    assert [sport_of[s] for s in rx["seq"].tolist()] == rx["sport"].tolist()
    # Coded pairs: the second probe leaves after the first, about the spacing later.
    gaps = np.array([by_seq[s + 1] - by_seq[s] for s in by_seq if s % 2 == 0])
    assert len(gaps) == 150 and (gaps > 0).all()
    assert np.median(gaps) >= a.spacing_ns
    # Echo rows: t1 is the probe's kernel TX time, t2/t3 from the echoer, t4 on return.
    assert [by_seq[s] for s in echo["seq"].tolist()] == echo["t1_ns"].tolist()
    assert (echo["t3_ns"] >= echo["t2_ns"]).all() and (echo["t4_ns"] > echo["t1_ns"]).all()
    assert (echo["t2_ns"] > echo["t1_ns"]).all()  # one clock here
    assert (echo["ts_kind"] == records.TsKind.SW).all()
    assert sum(a.rejected.values()) == sum(b.rejected.values()) == 0


def test_replayed_and_forged_datagrams_in_a_batch_are_counted(
    meshes: tuple[ProbeMesh, ProbeMesh],
) -> None:
    a, b = meshes
    time.sleep(0.2)
    a._send_pairs([a.slots[0]])
    time.sleep(0.05)
    b.drain()
    assert b.stats["probes_received"] == 2
    # The same two authentic datagrams again (replay), plus a forged one.
    pkt = bytes(a._txb.data[0])
    forged = bytearray(pkt)
    forged[80] ^= 1
    sock = a.tx_socks[0]
    for data in (pkt, bytes(a._txb.data[1]), bytes(forged)):
        sock.sendto(data, (b.cfg.backend.address, b.port))
    time.sleep(0.05)
    b.drain()
    assert b.rejected["replay"] == 2 and b.rejected["auth"] == 1
    assert b.stats["probes_received"] == 2


def test_echoes_and_probes_checked_in_one_batch_keep_their_sockets_apart(
    meshes: tuple[ProbeMesh, ProbeMesh],
) -> None:
    """Echoes (source-port sockets) and probes (probe socket) are received into one
    batch: an authentic probe sent to a source-port socket, or an echo sent to the
    probe socket, is malformed there; the valid ones in the same batch are recorded."""
    a, b = meshes
    time.sleep(0.2)
    codec = PacketCodec(KEY)
    me, other = records.host_id("mb"), records.host_id("ma")
    now = time.time_ns()
    probe_to_sport = codec.pack(KIND_PROBE, 0, 10, other, me, 0, now)
    echo_to_port = codec.pack(KIND_ECHO, 0, 12, me, other, 0, now, t2_ns=now, t3_ns=now)
    a.tx_socks[0].sendto(probe_to_sport, (b.cfg.backend.address, b.cfg.probe.base_sport))
    a.tx_socks[0].sendto(echo_to_port, (b.cfg.backend.address, b.port))
    a._send_pairs([a.slots[0], a.slots[1]])  # four valid probes in the same drain
    time.sleep(0.05)
    b.drain()
    assert b.rejected["malformed"] == 2
    assert sum(b.rejected.values()) == 2
    assert b.stats["probes_received"] == 4
    assert len(b.buffers["probe_rx"].take()) == 4
    assert len(b.buffers["echo"].take()) == 0


def test_the_kernel_drop_count_is_every_sockets_and_never_goes_back(
    meshes: tuple[ProbeMesh, ProbeMesh],
) -> None:
    """The kernel drops datagrams at b's probe socket and at one of its echo sockets
    (nothing read while a flood arrives at each): b's ``rx_kernel_drops`` is both
    sockets' drops, whichever socket a drain reads — one socket's alone, the count went
    up and down, which the detector reads as a collector restart, and a count that
    moves as a socket dropping."""
    a, b = meshes
    time.sleep(0.2)
    assert b.rx_sock is not None
    flood = bytes(PacketCodec(KEY).pack(KIND_PROBE, 0, 1, 7, 8, 0, time.time_ns()))
    to_probe, to_echo = (
        (b.cfg.backend.address, b.port),
        (b.cfg.backend.address, b.cfg.probe.base_sport),
    )
    for sock, to, n in ((b.rx_sock, to_probe, 300), (b.tx_socks[0], to_echo, 100)):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a few datagrams
        for _ in range(n):
            a.tx_socks[0].sendto(flood, to)
    for _ in range(3):
        b.drain()  # the floods read: the next datagram at each socket carries its count
    counts = []
    for to in (to_probe, to_echo, to_probe, to_echo):
        a.tx_socks[0].sendto(flood, to)
        time.sleep(0.05)
        b.drain()
        counts.append(b.stats["rx_kernel_drops"])
    # the first drain read the probe socket's count alone: the echo socket's is known
    # from the next on
    assert counts[1] > counts[0] > 0
    assert counts[1:] == [counts[1]] * 3, counts


def test_a_trace_probe_that_reaches_a_collector_is_counted_apart_not_as_malformed(
    meshes: tuple[ProbeMesh, ProbeMesh],
) -> None:
    """A trace probe no router stopped (a buddy of no known rack, or within the trace's
    TTL) arrives at the probe port: ``traces_arrived``, while a datagram of the same size
    without the trace's magic stays ``malformed`` — an operator reading the rejections
    sees only real ones."""
    a, b = meshes
    time.sleep(0.2)
    trace = path_trace._TRACE.pack(path_trace.TRACE_MAGIC, records.host_id("mb"), time.time_ns())
    a.tx_socks[0].sendto(trace, (b.cfg.backend.address, b.port))
    a.tx_socks[0].sendto(b"XXXX" + trace[4:], (b.cfg.backend.address, b.port))
    a._send_pairs([a.slots[0]])  # two valid probes in the same drain
    time.sleep(0.05)
    b.drain()
    assert b.stats["traces_arrived"] == 1
    assert b.rejected["malformed"] == 1 and sum(b.rejected.values()) == 1
    assert b.stats["probes_received"] == 2


def test_echo_every_probe_and_none(tmp_path: Path) -> None:
    net = loopback_net()
    a_addr, b_addr = f"{net}.1", f"{net}.2"
    for every, expect in ((1, 100), (0, 0)):
        port = free_udp_port(a_addr)
        a = _mesh(tmp_path, "ea", a_addr, "eb", b_addr, port, echo_every=every)
        b = _mesh(tmp_path, "eb", b_addr, "ea", a_addr, port, echo_every=every)
        try:
            time.sleep(0.2)
            a._send_pairs([a.slots[i % len(a.slots)] for i in range(50)])
            time.sleep(0.1)
            b.drain()
            time.sleep(0.1)
            a.drain()
            assert b.stats["probes_received"] == 100
            assert len(a.buffers["echo"].take()) == expect == b.stats["echoes_sent"]
        finally:
            a.close()
            b.close()


def test_echo_sampling_is_even_over_buddies_ports_and_time(tmp_path: Path) -> None:
    """16 buddies x 8 ports, 1 pair/s each, 1 in 8 echoed: every buddy gets exactly
    one echoed pair per second (a rotating port), every port of every buddy one in
    8 seconds, and the ticks of one second share the echoes evenly."""
    peers = [Peer(name=f"p{i}", address=f"198.18.0.{i + 1}") for i in range(16)]
    (tmp_path / "key").write_bytes(KEY)
    doc = {
        "host": "me",
        "fleet_key_file": str(tmp_path / "key"),
        "backend": {"address": "127.0.0.1"},
        "ingest": {"url": "http://127.0.0.1:1"},
    }
    (tmp_path / "c.yml").write_text(yaml.safe_dump(doc))
    cfg = config_mod.load(tmp_path / "c.yml")
    buffers = {t: RecordBuffer(t) for t in records.TABLES}
    mesh = ProbeMesh(cfg, peers, PacketCodec(KEY), RecordingClock(None), buffers)
    per_s = len(mesh.slots)  # 128 pairs per second, 10 ticks of 12-13 pairs
    echoed = np.zeros((8, 16, 8), bool)  # [second, buddy, port]
    per_tick = []
    for sec in range(8):
        for tick in range(10):
            lo, hi = sec * per_s + tick * per_s // 10, sec * per_s + (tick + 1) * per_s // 10
            due = [mesh.slots[i % per_s] for i in range(lo, hi)]
            buds = np.array([b for b, _p in due])
            ports = np.array([p for _b, p in due])
            want = mesh._echo_wanted(buds, ports)
            echoed[sec, buds[want], ports[want]] = True
            per_tick.append(int(want.sum()))
    assert (echoed.sum(axis=2) == 1).all()  # one pair per buddy and second
    assert (echoed.sum(axis=0) == 1).all()  # each (buddy, port) once in 8 seconds
    assert max(per_tick) - min(per_tick) <= 2 and sum(per_tick) == 8 * 16


@pytest.mark.parametrize(
    ("probe", "ratio"),
    [({}, 8), ({"echo_every": 1}, 1), ({"echo_every": 0}, 0), ({"echo": True}, 1),
     ({"echo": False}, 0), ({"echo_every": 3}, 3)],
)  # fmt: skip
def test_echo_setting(tmp_path: Path, probe: dict[str, object], ratio: int) -> None:
    doc = {"host": "h", "backend": {"address": "127.0.0.1"}, "probe": probe,
           "ingest": {"url": "http://127.0.0.1:1"}}  # fmt: skip
    (tmp_path / "c.yml").write_text(yaml.safe_dump(doc))
    assert config_mod.load(tmp_path / "c.yml").probe.echo_ratio() == ratio


@pytest.mark.parametrize(
    ("probe", "message"),
    [({"echo_every": -1}, "probe.echo_every: expected an int >= 0"),
     ({"echo": True, "echo_every": 4}, "probe.echo: deprecated"),
     ({"echo_every": "often"}, "probe.echo_every: expected int | null, got str"),
     ({"watch_interval_s": -0.2}, "probe.watch_interval_s: expected a number >= 0")],
)  # fmt: skip
def test_echo_setting_errors(tmp_path: Path, probe: dict[str, object], message: str) -> None:
    doc = {"host": "h", "backend": {"address": "127.0.0.1"}, "probe": probe,
           "ingest": {"url": "http://127.0.0.1:1"}}  # fmt: skip
    (tmp_path / "c.yml").write_text(yaml.safe_dump(doc))
    with pytest.raises(config_mod.configfile.ConfigError) as err:
        config_mod.load(tmp_path / "c.yml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_watch_follows_each_router_and_a_moved_path_until_it_is_back(
    tmp_path: Path,
) -> None:
    """Between rounds the watch traces a 5-tuple across each uplink router, and one that
    moved off a router until it crosses that router again."""
    net = loopback_net()
    a_addr, b_addr = f"{net}.1", f"{net}.2"
    port = free_udp_port(a_addr)
    a = _mesh(tmp_path, "wa", a_addr, "wb", b_addr, port, watch_interval_s=0.2)
    t = a.tracer
    try:
        dst, base = records.host_id("wb"), port + 1
        p0, p1, p2, p3 = ((dst, base + p) for p in range(4))
        now = time.monotonic()
        for p in range(4):  # a round: ports 0, 2 on spine A, 1, 3 on spine B
            t._answered(dst, base + p, "10.9.0.1" if p % 2 == 0 else "10.9.0.3")
        assert t.watched(now) == [p0, p1]
        assert not t.path_changed
        t._answered(*p2, "10.9.0.3")  # spine A left the group
        assert t.path_changed and t.stats["path_changes"] == 1
        assert t.watched(now) == [p0, p1, p2]  # p2 is watched until it is back on A
        t._answered(*p0, "10.9.0.3")  # a second moved 5-tuple: one per router is enough
        assert t.watched(now) == [p0, p1, p2]
        t._answered(*p2, "10.9.0.1")  # back: A's watch is p2 now, p0 no longer moved
        t._answered(*p0, "10.9.0.1")
        assert t._moved == {} and t.watched(now) == [p1, p2]
        t._answered(*p1, "10.9.0.1")  # off B: B's watch moves on to a 5-tuple on B
        t._answered(*p3, "10.9.0.3")
        assert t.watched(now) == [p1, p2, p3]
        assert t.watched(now + 121.0) == [p2, p3]  # a moved 5-tuple: 120 s at most
        assert t.trace_due_at() == min(t.next_trace, t.next_watch)
    finally:
        a.close()
