"""recvmmsg/sendmmsg batches on real loopback sockets, native and emulated alike."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from collector import datagram_batch, timestamping
from collector.datagram_batch import DatagramBatch
from collector.probe_packet import KIND_PROBE, SIZE, PacketCodec, packet_dtype
from collector.records import TsKind
from tests.unit.collector_procs import loopback_net

MODES = [
    pytest.param(True, id="native"),
    pytest.param(False, id="emulated"),
]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket, str]]:
    net = loopback_net()
    rx = timestamping.udp_socket(f"{net}.2", 0, tx_timestamps=False)
    tx = timestamping.udp_socket(f"{net}.1", 0, tx_timestamps=True)
    # The kernel turns RX timestamping on for the system with a deferred work item when
    # the first socket asks for it: datagrams right after that may carry none.
    time.sleep(0.2)
    try:
        yield tx, rx, f"{net}.2"
    finally:
        tx.close()
        rx.close()


def _wait_readable(sock: socket.socket) -> None:
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            return
        except BlockingIOError:
            time.sleep(0.005)


def test_native_path_is_available_here() -> None:
    assert datagram_batch.native_available()


@pytest.mark.parametrize("native", MODES)
def test_receive_a_batch_with_kernel_timestamps_ttl_and_ports(native: bool, pair) -> None:
    tx, rx, _addr = pair
    codec = PacketCodec(b"k" * 32)
    before = time.time_ns()
    pkts = [codec.pack(KIND_PROBE, i % 2, i, 1, 2, 0, before) for i in range(10)]
    for p in pkts:
        tx.sendto(p, rx.getsockname())
    tx.sendto(b"x" * 300, rx.getsockname())  # longer than a slot: truncated, flagged
    _wait_readable(rx)
    b = DatagramBatch(16, 128, timestamping.ANC_SIZE, native=native)
    assert b.native == native
    n = b.recv(rx)
    assert n == 11
    ts, kind, ttl, drops = timestamping.rx_meta_batch(b, n)
    assert (ts >= before).all() and (ts <= time.time_ns()).all()
    assert (kind == TsKind.SW).all()
    assert (ttl == 64).all()
    assert drops == -1
    assert (b.ports(n) == tx.getsockname()[1]).all()
    assert list(b.lengths(n)[:10]) == [SIZE] * 10
    assert b.msg_flags(n)[10] & socket.MSG_TRUNC
    view = b.data.view(packet_dtype(128))[:n, 0]
    assert list(view["seq"][:10]) == list(range(10))
    assert bytes(b.data[3, :SIZE]) == pkts[3]
    assert b.recv(rx) == 0  # drained: nothing queued is not an error


@pytest.mark.parametrize("native", MODES)
def test_error_queue_batch_gives_send_counters_and_looped_packets(native: bool, pair) -> None:
    tx, rx, _addr = pair
    payloads = [bytes([i]) * SIZE for i in range(5)]
    for p in payloads:
        tx.sendto(p, rx.getsockname())
    b = DatagramBatch(8, 256, timestamping.ERR_ANC_SIZE, native=native)
    n, deadline = 0, time.monotonic() + 2.0
    while n < 5 and time.monotonic() < deadline:  # the error queue cannot be peeked
        n += b.recv(tx, timestamping.MSG_ERRQUEUE, n)
        time.sleep(0.005)
    assert n == 5
    ident, ts, kind = timestamping.tx_meta_batch(b, n)
    assert list(ident) == [0, 1, 2, 3, 4]
    assert (ts > 0).all() and (kind == TsKind.SW).all()
    for i in range(n):
        length = int(b.lengths(n)[i])
        assert bytes(b.data[i, length - SIZE : length]) == payloads[i]


@pytest.mark.parametrize("native", MODES)
def test_send_a_batch_to_named_destinations(native: bool, pair) -> None:
    tx, rx, addr = pair
    b = DatagramBatch(4, SIZE, native=native)
    for i in range(3):
        b.data[i] = i + 1
        b.set_name(i, addr, rx.getsockname()[1])
    assert b.send(tx, 0, 3) == 3
    got = []
    deadline = time.monotonic() + 2.0
    while len(got) < 3 and time.monotonic() < deadline:
        try:
            got.append(rx.recv(2048))
        except BlockingIOError:
            time.sleep(0.005)
    assert got == [bytes([i + 1]) * SIZE for i in range(3)]


def test_unexpected_control_layout_is_parsed_one_by_one() -> None:
    """Control messages in another order than the kernel's usual one still parse."""
    b = DatagramBatch(2, 128, timestamping.ANC_SIZE, native=False)
    ts3 = timestamping._TS3.pack(5, 6, 0, 0, 0, 0)
    odd = datagram_batch._cmsg(socket.IPPROTO_IP, timestamping.IP_TTL, (61).to_bytes(4, "little"))
    odd += datagram_batch._cmsg(socket.SOL_SOCKET, timestamping.SCM_TIMESTAMPING, ts3)
    hw = timestamping._TS3.pack(1, 2, 0, 0, 7, 8)
    usual = datagram_batch._cmsg(socket.SOL_SOCKET, timestamping.SCM_TIMESTAMPING, hw)
    usual += datagram_batch._cmsg(
        socket.IPPROTO_IP, timestamping.IP_TTL, (62).to_bytes(4, "little")
    )
    for i, raw in enumerate((odd, usual)):
        b.control[i, : len(raw)] = np.frombuffer(raw, np.uint8)
        b.hdr["controllen"][i] = len(raw)
    ts, kind, ttl, _drops = timestamping.rx_meta_batch(b, 2)
    assert list(ts) == [5_000_000_006, 7_000_000_008]
    assert list(kind) == [TsKind.SW, TsKind.HW]
    assert list(ttl) == [61, 62]


@pytest.mark.parametrize("native", MODES)
def test_rows_reused_after_the_kernel_shrank_their_lengths(native: bool, pair) -> None:
    """The kernel writes each received row's real control length into its header;
    rows are reset lazily, so a later receive into the same rows must still offer
    full-size control buffers: here the later datagrams carry one more control
    message (the socket's drop counter, after an overflow) and must not be
    truncated (MSG_CTRUNC)."""
    tx, rx, _addr = pair
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    b = DatagramBatch(64, 128, timestamping.ANC_SIZE, native=native)
    for i in range(3):
        tx.sendto(bytes([i]) * SIZE, rx.getsockname())
    _wait_readable(rx)
    time.sleep(0.01)
    assert b.recv(rx) == 3
    assert timestamping.rx_meta_batch(b, 3)[3] == -1  # no drops yet: no counter message
    for i in range(200):  # overflows the small receive buffer
        tx.sendto(bytes([i]) * SIZE, rx.getsockname())
    _wait_readable(rx)
    with contextlib.suppress(BlockingIOError):
        while True:
            rx.recv(256, socket.MSG_DONTWAIT)
    for i in range(3):  # queued after the drops: they carry the drop counter
        tx.sendto(bytes([i]) * SIZE, rx.getsockname())
    _wait_readable(rx)
    time.sleep(0.01)
    got = b.recv(rx)
    assert got == 3
    assert (b.msg_flags(got) & socket.MSG_CTRUNC == 0).all()
    ts, _kind, ttl, drops = timestamping.rx_meta_batch(b, got)
    assert drops > 0 and (ts > 0).all() and (ttl == 64).all()


def test_usual_layout_shortcut_gives_what_the_field_by_field_check_gives(
    pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rx/tx_meta_batch answer a batch in the usual cmsg layout with one comparison;
    the general path (forced here by an impossible expected layout) must agree."""
    tx, rx, _addr = pair
    codec = PacketCodec(b"k" * 32)
    for i in range(6):
        tx.sendto(codec.pack(KIND_PROBE, i % 2, i, 1, 2, 0, time.time_ns()), rx.getsockname())
    _wait_readable(rx)
    time.sleep(0.01)
    b = DatagramBatch(8, 128, timestamping.ANC_SIZE)
    n = b.recv(rx)
    e = DatagramBatch(8, 256, timestamping.ERR_ANC_SIZE)
    m, deadline = 0, time.monotonic() + 2.0
    while m < 6 and time.monotonic() < deadline:
        m += e.recv(tx, timestamping.MSG_ERRQUEUE, m)
        time.sleep(0.005)
    assert n == 6 and m == 6
    usual_rx = (b.control[:n, timestamping._HDR_COLS] == timestamping._RX_USUAL).all()
    usual_tx = (e.control[:m, timestamping._ERR_HDR_COLS] == timestamping._ERR_USUAL).all()
    assert usual_rx and usual_tx  # this kernel's layout takes the shortcut
    fast_rx, fast_tx = timestamping.rx_meta_batch(b, n), timestamping.tx_meta_batch(e, m)
    monkeypatch.setattr(timestamping, "_RX_USUAL", timestamping._RX_USUAL ^ 0xFF)
    monkeypatch.setattr(timestamping, "_ERR_USUAL", timestamping._ERR_USUAL ^ 0xFF)
    slow_rx, slow_tx = timestamping.rx_meta_batch(b, n), timestamping.tx_meta_batch(e, m)
    for fast, slow in ((fast_rx[:3], slow_rx[:3]), (fast_tx, slow_tx)):
        for f, s in zip(fast, slow, strict=True):
            assert f.dtype == s.dtype and (f == s).all()
    assert fast_rx[3] == slow_rx[3] == -1
    assert list(fast_tx[0]) == [0, 1, 2, 3, 4, 5]
