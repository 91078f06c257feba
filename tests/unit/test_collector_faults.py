"""Fault tests: hostile datagrams and kill -9 (the 60 s ops-box outage is in
tests/integration/test_collector_outage.py: a minute by design).

The kill -9 test ships to the real ingest daemon (``clockmesh ingest run``) and read
back what it stored in its Parquet store with DuckDB.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from collector import records, wire
from collector.probe_packet import KIND_ECHO, KIND_PROBE, SIZE, PacketCodec
from tests.unit.collector_procs import (
    KEY,
    ROOT,
    CollectorProcess,
    free_udp_port,
    loopback_net,
    write_config,
)
from tests.unit.collector_receiver import Receiver


class Sink:
    """A buddy that only receives (so sends never hit ICMP port-unreachable)."""

    def __init__(self, address: str, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))

    def close(self) -> None:
        self.sock.close()


def _port_below_ephemeral() -> int:
    """A free TCP port below the kernel's ephemeral range: a daemon restarted on it finds
    it free again (in that range another test's outgoing connection may have taken it as
    its local port meanwhile: "address already in use")."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free TCP port below the ephemeral range")


class Ingest:
    """The real ingest daemon in a subprocess, restartable on the same store."""

    def __init__(self, tmp: Path) -> None:
        self.port = _port_below_ephemeral()
        self.store = tmp / "store"
        key = tmp / "fleet.key"
        if not key.exists():
            key.write_bytes(KEY + b"\n")
        self.config = tmp / "ingest.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "listen": f"127.0.0.1:{self.port}",
                    "store_dir": str(self.store),
                    "fleet_key_file": str(key),
                    "min_free_bytes": 1,
                    "live_refresh_s": 60.0,
                }
            )
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "ingest.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "clockmesh.cli",
                    "ingest",
                    "run",
                    "--config",
                    str(self.config),
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120  # generous: a shared 2-core machine, two tests at once
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"ingest exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("ingest did not start listening")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def probe_tx_seqs(self, host: str) -> np.ndarray:
        import duckdb

        glob = str(self.store / "probe_tx" / "**" / "*.parquet")
        con = duckdb.connect()
        try:
            rows = con.execute(
                f"SELECT seq FROM read_parquet('{glob}', union_by_name=true) WHERE src = ?",
                [records.host_id(host)],
            ).fetchall()
        finally:
            con.close()
        return np.array(sorted(r[0] for r in rows), dtype=np.uint64)


def _setup(tmp: Path, url: str, **extra: object) -> tuple[CollectorProcess, Sink, str]:
    net = loopback_net()
    addr, peer = f"{net}.1", f"{net}.2"
    port = free_udp_port(addr)
    sink = Sink(peer, port)
    peers = [
        {"name": "hx", "address": addr, "rack": "r1"},
        {"name": "hy", "address": peer, "rack": "r1"},
    ]
    cfg = write_config(
        tmp, "hx", addr, peers, url, port=port, base_sport=30000 + port % 20000, **extra
    )
    return CollectorProcess(cfg), sink, addr


def _spooled_probe_tx(spool: Path) -> set[int]:
    seqs: set[int] = set()
    for f in sorted(spool.glob("*.seg")) + sorted(spool.glob("*.open")):
        seg = wire.decode(f.read_bytes(), allow_torn_tail=True)
        seqs.update(int(s) for s in seg.table("probe_tx")["seq"])
    return seqs


def test_10000_hostile_datagrams_are_all_rejected_none_recorded(
    tmp_path: Path, receiver: Receiver
) -> None:
    col, sink, addr = _setup(tmp_path, receiver.url)
    rng = random.Random(7)
    me = records.host_id("hx")
    good = PacketCodec(KEY)
    forger = PacketCodec(b"not-the-fleet-key-0123456789")
    now = time.time_ns()
    kinds: list[bytes] = []
    for i in range(10_000):
        k = i % 6
        if k == 0:  # random bytes of random length
            kinds.append(rng.randbytes(rng.randint(1, 1400)))
        elif k == 1:  # right length, random content
            kinds.append(rng.randbytes(SIZE))
        elif k == 2:  # well-formed, forged (wrong key)
            kinds.append(forger.pack(KIND_PROBE, 0, 10**12 + i, 42, me, 20_000, now))
        elif k == 3:  # authentic but stale (an hour old)
            kinds.append(good.pack(KIND_PROBE, 0, 10**12 + i, 42, me, 20_000, now - 3600 * 10**9))
        elif k == 4:  # authentic but for another host
            kinds.append(good.pack(KIND_PROBE, 0, 10**12 + i, 42, me + 1, 20_000, time.time_ns()))
        else:  # authentic echo sent to the probe port, or truncated probe
            if i % 12 == 5:
                kinds.append(good.pack(KIND_ECHO, 0, 10**12 + i, me, 42, 20_000, time.time_ns()))
            else:
                kinds.append(good.pack(KIND_PROBE, 0, 10**12 + i, 42, me, 20_000, now)[:-1])
    try:
        col.start()
        before = col.status()
        attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i, data in enumerate(kinds):
            attacker.sendto(data, (addr, col.doc["backend"]["probe_port"]))
            if i % 200 == 199:
                time.sleep(0.01)  # stay under the socket buffer: count, do not lose
        st = col.wait_status(
            lambda s: sum(s["rejected"].values()) >= 10_000 + sum(before["rejected"].values()),
            timeout=30,
        )
        assert col.proc is not None and col.proc.poll() is None  # still running
        rej = st["rejected"]
        assert st["rx_kernel_drops"] == 0  # the kernel delivered every one of them
        assert sum(rej.values()) == 10_000
        assert rej["auth"] >= 1666 and rej["stale"] >= 1666 and rej["misdirected"] >= 1666
        assert rej["malformed"] >= 3333
        assert st["probes_received"] == 0
        sent = st["probes_sent"]
        col.wait_status(lambda s: s["probes_sent"] > sent + 8)  # and still probing
        assert col.stop() == 0
    finally:
        col.stop()
        sink.close()
    rx = [a for a in receiver.rows("probe_rx", "hx") if len(a)]
    assert not rx  # nothing recorded
    health = np.concatenate([a for a in receiver.rows("health", "hx") if len(a)])
    last = {n: int(v) for n, v in zip(health["name"], health["value"], strict=True)}
    assert sum(v for n, v in last.items() if n.startswith(b"probes_rejected_")) == 10_000


@pytest.fixture
def ingest(tmp_path: Path) -> Iterator[Ingest]:
    pytest.importorskip("duckdb")
    ing = Ingest(tmp_path)
    try:
        yield ing
    finally:
        ing.stop()


def test_kill_9_loses_no_acknowledged_record_and_duplicates_none(
    tmp_path: Path, ingest: Ingest
) -> None:
    ingest.start()
    col, sink, _ = _setup(tmp_path, ingest.url)
    spool = Path(col.doc["spool"]["dir"])
    try:
        col.start()
        col.wait_status(lambda s: s["shipping"]["segments_acked"] >= 3)
        ingest.stop()  # ops box gone: segments pile up in the spool
        col.wait_status(lambda s: s["spool"]["segments"] >= 3 and s["shipping"]["last_error"])
        col.kill9()
        on_disk = _spooled_probe_tx(spool)
        assert list(spool.glob("*.seg")), "nothing waiting in the spool at the kill"
        ingest.start()
        col.start()
        col.wait_status(
            lambda s: s["spool"]["segments"] == 0 and s["spool"]["recovered_segments"] >= 0,
            timeout=30,
        )
        col.wait_status(lambda s: s["shipping"]["segments_acked"] >= 2)
        assert col.stop() == 0
    finally:
        col.stop()
        sink.close()
    stored = ingest.probe_tx_seqs("hx")
    assert len(stored) == len(np.unique(stored)), "duplicated rows after ingest"
    missing = on_disk - set(stored.tolist())
    assert not missing, f"{len(missing)} spooled rows never arrived"
