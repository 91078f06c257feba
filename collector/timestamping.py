"""Kernel timestamps for UDP sockets: SO_TIMESTAMPING on RX and the TX error queue.

RX: every datagram carries an ``SCM_TIMESTAMPING`` control message (three
timespecs: software, deprecated, raw hardware) and, with ``IP_RECVTTL``, its TTL.
TX: with ``SOF_TIMESTAMPING_TX_SOFTWARE | OPT_ID | OPT_TSONLY`` the kernel queues
one message per sent datagram on the socket's error queue (``MSG_ERRQUEUE``),
carrying the software TX timestamp and, in ``sock_extended_err.ee_data``, the
per-socket send counter (0, 1, 2, ... in send order) that ties it to the datagram.
Raw hardware timestamps are used whenever the kernel delivers them (a NIC with
hardware timestamping enabled); veths never do.
"""

from __future__ import annotations

import socket
import struct

from collector.records import TsKind

SO_TIMESTAMPING = 37
SCM_TIMESTAMPING = SO_TIMESTAMPING
SOF_TIMESTAMPING_TX_HARDWARE = 1 << 0
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_HARDWARE = 1 << 2
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_RAW_HARDWARE = 1 << 6
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
SO_RXQ_OVFL = 40  # cmsg: datagrams the kernel dropped on this socket so far
SO_RCVBUFFORCE = 33
RCVBUF_BYTES = 4 * 1024 * 1024
IP_RECVERR = 11
IP_RECVTTL = 12
IP_TTL = 2
SO_EE_ORIGIN_TIMESTAMPING = 4
MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)

RX_FLAGS = (
    SOF_TIMESTAMPING_RX_SOFTWARE
    | SOF_TIMESTAMPING_SOFTWARE
    | SOF_TIMESTAMPING_RX_HARDWARE
    | SOF_TIMESTAMPING_RAW_HARDWARE
)
# No OPT_TSONLY: the kernel loops the sent packet back with its timestamp, so the
# probe's own seq identifies it even if the OPT_ID counter and ours ever disagree
# (a send the kernel counted but failed). With net.core.tstamp_allow_data=0 the
# packet is left out and the OPT_ID counter is all there is.
TX_FLAGS = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_OPT_ID

_TS3 = struct.Struct("qqqqqq")  # three struct timespec
_EE = struct.Struct("IBBBBII")  # struct sock_extended_err (without the trailing sockaddr)
_INT = struct.Struct("i")
ANC_SIZE = socket.CMSG_SPACE(_TS3.size) + 2 * socket.CMSG_SPACE(_INT.size) + 64
ERR_ANC_SIZE = socket.CMSG_SPACE(_TS3.size) + socket.CMSG_SPACE(_EE.size + 16) + 64


def udp_socket(address: str, port: int, *, tx_timestamps: bool) -> socket.socket:
    """A non-blocking UDP socket bound to ``address:port`` with kernel timestamps on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        flags = RX_FLAGS | (TX_FLAGS if tx_timestamps else 0)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
        sock.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        try:  # a burst must not overflow the default ~200 KiB buffer (root may exceed rmem_max)
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        if tx_timestamps:
            sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def rx_meta(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int, int, int]:
    """(timestamp ns or 0, TsKind, TTL or 0, kernel drop count or -1) of a datagram."""
    ts, kind, ttl, drops = 0, TsKind.USER, 0, -1
    for level, ctype, data in ancdata:
        if level == socket.SOL_SOCKET and ctype == SCM_TIMESTAMPING and len(data) >= _TS3.size:
            sw_s, sw_ns, _, _, hw_s, hw_ns = _TS3.unpack_from(data)
            if hw_s or hw_ns:
                ts, kind = hw_s * 1_000_000_000 + hw_ns, TsKind.HW
            elif sw_s or sw_ns:
                ts, kind = sw_s * 1_000_000_000 + sw_ns, TsKind.SW
        elif level == socket.IPPROTO_IP and ctype == IP_TTL and len(data) >= 1:
            ttl = data[0] if len(data) < _INT.size else _INT.unpack_from(data)[0]
        elif level == socket.SOL_SOCKET and ctype == SO_RXQ_OVFL and len(data) >= 4:
            drops = struct.unpack_from("I", data)[0]
    return ts, int(kind), ttl, drops


def read_tx_timestamps(
    sock: socket.socket, tail: int = 0, limit: int = 4096
) -> list[tuple[int, int, int, bytes]]:
    """Drain the error queue: [(send counter, timestamp ns, TsKind, last ``tail`` bytes), ...].

    The bytes are the end of the looped-back packet (headers come first), i.e. the
    datagram's payload when ``tail`` is its size; empty if the kernel sent none.
    """
    out: list[tuple[int, int, int, bytes]] = []
    bufsize = tail + 128 if tail else 0
    for _ in range(limit):
        try:
            data, ancdata, _flags, _addr = sock.recvmsg(bufsize, ERR_ANC_SIZE, MSG_ERRQUEUE)
        except (BlockingIOError, InterruptedError):
            break
        ts, kind, ident = 0, TsKind.USER, -1
        for level, ctype, cdata in ancdata:
            if level == socket.SOL_SOCKET and ctype == SCM_TIMESTAMPING:
                sw_s, sw_ns, _, _, hw_s, hw_ns = _TS3.unpack_from(cdata)
                if hw_s or hw_ns:
                    ts, kind = hw_s * 1_000_000_000 + hw_ns, TsKind.HW
                else:
                    ts, kind = sw_s * 1_000_000_000 + sw_ns, TsKind.SW
            elif len(cdata) >= _EE.size:
                _errno, origin, _t, _c, _p, _info, ee_data = _EE.unpack_from(cdata)
                if origin == SO_EE_ORIGIN_TIMESTAMPING:
                    ident = ee_data
        if ident >= 0 and ts:
            out.append((ident, ts, int(kind), data[-tail:] if tail and len(data) >= tail else b""))
    return out
