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

import functools
import socket
import struct
from typing import Any

import numpy as np

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
RCVBUF_BYTES = 8 * 1024 * 1024  # the collector drains its sockets every 0.3 s
IP_RECVERR = 11
IP_RECVTTL = 12
IP_TTL = 2
SO_EE_ORIGIN_TIMESTAMPING = 4
ICMP_TIME_EXCEEDED = 11
MSG_ERRQUEUE = int(getattr(socket, "MSG_ERRQUEUE", 0x2000))  # plain int: IntFlag | is slow

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
        # No IP_RECVERR: TX timestamps reach the error queue without it, and with it an
        # ICMP error (a trace probe's answer, an unreachable buddy) would fail the next
        # send on this socket. Trace answers are read from a raw ICMP socket instead.
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


# ---- whole batches (collector.datagram_batch) ---------------------------------------
# The kernel writes a UDP datagram's control messages in a fixed order:
# SCM_TIMESTAMPING (64 bytes), SO_RXQ_OVFL (24, only once drops happened), IP_TTL
# (24); on the error queue SCM_TIMESTAMPING then IP_RECVERR. These dtypes read
# that layout for a whole batch at once; rows in any other layout are parsed
# one by one (rx_meta / _tx_meta_one), so an unexpected kernel costs speed only.
_CMSG0 = [("c0_len", "=u8", 0), ("c0_level", "=i4", 8), ("c0_type", "=i4", 12),
          ("sw_s", "=i8", 16), ("sw_ns", "=i8", 24), ("hw_s", "=i8", 48), ("hw_ns", "=i8", 56),
          ("c1_len", "=u8", 64), ("c1_level", "=i4", 72), ("c1_type", "=i4", 76)]  # fmt: skip
_RX_EXTRA = [("c1_val", "=i4", 80), ("c2_len", "=u8", 88), ("c2_level", "=i4", 96),
             ("c2_type", "=i4", 100), ("c2_val", "=i4", 104)]  # fmt: skip
_ERR_EXTRA = [("ee_origin", "u1", 84), ("ee_data", "=u4", 92)]
_TS_SPACE = 64  # CMSG_SPACE(3 timespecs)
_INT_SPACE = 24  # CMSG_SPACE(int)
_INT_LEN = 20  # CMSG_LEN(int)
_ERR_LEN = 16 + _EE.size + 16  # CMSG_LEN(sock_extended_err + sockaddr_in)
_CMSG_HDR_PACK = struct.Struct("=Qii").pack  # struct cmsghdr: len, level, type
_SW, _USER = np.uint8(TsKind.SW), np.uint8(TsKind.USER)
# The usual layouts, checked for a whole batch in one comparison: the cmsg headers
# (bytes 0-15 and 64-79) and the total length; for TX also ee_origin (byte 84).
_HDR_COLS = np.r_[0:16, 64:80]
_ERR_HDR_COLS = np.r_[0:16, 64:80, 84]
_RX_USUAL = np.frombuffer(
    _CMSG_HDR_PACK(16 + _TS3.size, socket.SOL_SOCKET, SCM_TIMESTAMPING)
    + _CMSG_HDR_PACK(_INT_LEN, socket.IPPROTO_IP, IP_TTL),
    np.uint8,
)
_ERR_USUAL = np.frombuffer(
    _CMSG_HDR_PACK(16 + _TS3.size, socket.SOL_SOCKET, SCM_TIMESTAMPING)
    + _CMSG_HDR_PACK(_ERR_LEN, socket.IPPROTO_IP, IP_RECVERR)
    + bytes([SO_EE_ORIGIN_TIMESTAMPING]),
    np.uint8,
)


def _control_dtype(fields: list[tuple[str, str, int]], itemsize: int) -> np.dtype:
    return np.dtype(
        {
            "names": [f[0] for f in fields],
            "formats": [f[1] for f in fields],
            "offsets": [f[2] for f in fields],
            "itemsize": itemsize,
        }
    )


@functools.cache
def _rx_dtype(itemsize: int) -> np.dtype:
    return _control_dtype(_CMSG0 + _RX_EXTRA, itemsize)


@functools.cache
def _err_dtype(itemsize: int) -> np.dtype:
    return _control_dtype(_CMSG0 + _ERR_EXTRA, itemsize)


def _walk(control: bytes) -> list[tuple[int, int, bytes]]:
    """Control bytes in the kernel's cmsg format -> [(level, type, data), ...]."""
    out = []
    off = 0
    while off + 16 <= len(control):
        length, level, ctype = struct.unpack_from("=Qii", control, off)
        if length < 16 or off + length > len(control):
            break
        out.append((level, ctype, control[off + 16 : off + length]))
        off += (length + 7) & ~7
    return out


def _timestamp(
    sw_s: np.ndarray, sw_ns: np.ndarray, hw_s: np.ndarray, hw_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    if not (hw_s.any() or hw_ns.any()):  # the usual case: software timestamps only
        ts = sw_s * 1_000_000_000 + sw_ns
        return ts, np.where(ts != 0, _SW, _USER)
    hw = (hw_s != 0) | (hw_ns != 0)
    ts = np.where(hw, hw_s * 1_000_000_000 + hw_ns, sw_s * 1_000_000_000 + sw_ns)
    kind = np.where(hw, int(TsKind.HW), np.where(ts != 0, int(TsKind.SW), int(TsKind.USER)))
    return ts, kind.astype(np.uint8)


def rx_meta_batch(batch: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`rx_meta` for the first ``n`` datagrams of a received batch.

    Returns (timestamp ns or 0, TsKind, TTL, highest kernel drop count or -1)."""
    ts, kind, ttl, drops = rx_meta_rows(batch, n)
    return ts, kind, ttl, int(drops.max(initial=-1))


def rx_meta_rows(batch: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`rx_meta_batch` field by field, with the kernel drop count of every row
    (-1 where the datagram carried none)."""
    c = batch.control_view(_rx_dtype(batch.control.shape[1]))[:n]
    clen = batch.controllen(n)
    if (clen == _TS_SPACE + _INT_SPACE).all() and (
        batch.control[:n, _HDR_COLS] == _RX_USUAL
    ).all():  # every row: timestamps, then the TTL (no drops reported)
        ts, kind = _timestamp(c["sw_s"], c["sw_ns"], c["hw_s"], c["hw_ns"])
        return ts, kind, c["c1_val"].astype(np.uint8), np.full(n, -1, np.int64)
    ok = (c["c0_level"] == socket.SOL_SOCKET) & (c["c0_type"] == SCM_TIMESTAMPING)
    ok &= c["c0_len"] == 16 + _TS3.size
    ts, kind = _timestamp(c["sw_s"], c["sw_ns"], c["hw_s"], c["hw_ns"])
    ttl_first = (c["c1_level"] == socket.IPPROTO_IP) & (c["c1_type"] == IP_TTL)
    ttl_first &= (c["c1_len"] == _INT_LEN) & (clen == _TS_SPACE + _INT_SPACE)
    drops_first = (c["c1_level"] == socket.SOL_SOCKET) & (c["c1_type"] == SO_RXQ_OVFL)
    drops_first &= (c["c1_len"] == _INT_LEN) & (clen == _TS_SPACE + 2 * _INT_SPACE)
    drops_first &= (c["c2_level"] == socket.IPPROTO_IP) & (c["c2_type"] == IP_TTL)
    ok &= ttl_first | drops_first
    ttl = np.where(ttl_first, c["c1_val"], c["c2_val"]).astype(np.uint8)
    drops = np.where(drops_first, c["c1_val"].astype(np.int64), -1)
    if not ok.all():
        for i in np.flatnonzero(~ok):
            raw = batch.control[i, : int(clen[i])].tobytes()
            t, k, tl, d = rx_meta(_walk(raw))
            ts[i], kind[i], ttl[i] = t, k, tl & 0xFF
            drops[i] = max(int(drops[i]), d)
    return ts, kind, ttl, drops


def tx_meta_batch(batch: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Error-queue messages of a batch: (send counter or -1, timestamp ns or 0, TsKind)."""
    c = batch.control_view(_err_dtype(batch.control.shape[1]))[:n]
    clen = batch.controllen(n)
    if (clen == _TS_SPACE + ((_ERR_LEN + 7) & ~7)).all() and (
        batch.control[:n, _ERR_HDR_COLS] == _ERR_USUAL
    ).all():  # every row: timestamps, then a timestamping sock_extended_err
        ts, kind = _timestamp(c["sw_s"], c["sw_ns"], c["hw_s"], c["hw_ns"])
        return c["ee_data"].astype(np.int64), ts, kind
    ok = (c["c0_level"] == socket.SOL_SOCKET) & (c["c0_type"] == SCM_TIMESTAMPING)
    ok &= (c["c0_len"] == 16 + _TS3.size) & (clen == _TS_SPACE + ((_ERR_LEN + 7) & ~7))
    ok &= (c["c1_level"] == socket.IPPROTO_IP) & (c["c1_type"] == IP_RECVERR)
    ok &= c["c1_len"] == _ERR_LEN
    ts, kind = _timestamp(c["sw_s"], c["sw_ns"], c["hw_s"], c["hw_ns"])
    ident = np.where(c["ee_origin"] == SO_EE_ORIGIN_TIMESTAMPING, c["ee_data"].astype(np.int64), -1)
    if not ok.all():
        for i in np.flatnonzero(~ok):
            ident[i], ts[i], kind[i] = _tx_meta_one(
                _walk(batch.control[i, : int(clen[i])].tobytes())
            )
    return ident, ts, kind


def _tx_meta_one(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int, int]:
    ts, kind, ident = 0, int(TsKind.USER), -1
    for level, ctype, cdata in ancdata:
        if level == socket.SOL_SOCKET and ctype == SCM_TIMESTAMPING and len(cdata) >= _TS3.size:
            sw_s, sw_ns, _, _, hw_s, hw_ns = _TS3.unpack_from(cdata)
            if hw_s or hw_ns:
                ts, kind = hw_s * 1_000_000_000 + hw_ns, int(TsKind.HW)
            else:
                ts, kind = sw_s * 1_000_000_000 + sw_ns, int(TsKind.SW)
        elif len(cdata) >= _EE.size:
            _errno, origin, _t, _c, _p, _info, ee_data = _EE.unpack_from(cdata)
            if origin == SO_EE_ORIGIN_TIMESTAMPING:
                ident = ee_data
    return ident, ts, kind


def icmp_socket() -> socket.socket:
    """A raw ICMP socket (needs CAP_NET_RAW): answers to trace probes arrive here."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.setblocking(False)
    return sock


def parse_time_exceeded(packet: bytes) -> tuple[str, str, int, int, bytes] | None:
    """An ICMP time-exceeded packet (IP header included, as a raw socket reads it) ->
    (router address, original destination, original UDP source port, destination port,
    original UDP payload), or None for any other ICMP message."""
    if len(packet) < 20:
        return None
    ihl = (packet[0] & 0x0F) * 4
    if len(packet) < ihl + 8 + 20 or packet[ihl] != ICMP_TIME_EXCEEDED:
        return None
    inner = packet[ihl + 8 :]
    ihl2 = (inner[0] & 0x0F) * 4
    if len(inner) < ihl2 + 8 or inner[9] != socket.IPPROTO_UDP:
        return None
    sport, dport = struct.unpack_from("!HH", inner, ihl2)
    router = socket.inet_ntoa(packet[12:16])
    return router, socket.inet_ntoa(inner[16:20]), sport, dport, inner[ihl2 + 8 :]
