"""The probe datagram: fixed size, authenticated with a truncated HMAC-SHA256.

Layout (little-endian, 88 bytes; see docs/collector.md)::

    off size field
      0    4 magic        b"CMPR"
      4    1 version      1
      5    1 kind         0 = probe, 1 = echo
      6    1 pair         0 or 1: position in the coded pair
      7    1 ts_kind      echo only: records.TsKind of t2 (the echoer's RX time)
      8    8 seq          u64, per-sender sequence number (monotonic, survives restarts)
     16    8 src          i64 host_id of the probe's sender
     24    8 dst          i64 host_id of the probe's receiver (the echoer, for an echo)
     32    8 spacing_ns   i64 intended TX spacing of the coded pair
     40    8 send_ns      i64 sender's recorded clock when the datagram was built
     48    8 t2_ns        i64 echo only: probe RX time on the echoer's clock
     56    8 t3_ns        i64 echo only: echo TX time on the echoer's clock
     64    2 sport        u16 echo only: UDP source port the probe came from
     66    1 flags        bit 0: the sender asks for an echo; bit 1: sent over RDMA UD
     67    1 reserved     zero
     68    4 qpn          u32, the sender's RDMA UD QP number (0: none), so buddies
                          learn where to send RDMA probes
     72   16 mac          HMAC-SHA256(fleet_key, bytes 0..71), first 16 bytes

A datagram of any other size, magic, version or kind is *malformed*; a wrong
MAC is *auth*. Staleness and replay are checked by the receiver
(:class:`ReplayWindow`).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

MAGIC = b"CMPR"
VERSION = 1
KIND_PROBE = 0
KIND_ECHO = 1
MAC_LEN = 16
_BODY = struct.Struct("<4sBBBBQqqqqqqHBxI")
FLAG_ECHO = 1
FLAG_RDMA = 2
SIZE = _BODY.size + MAC_LEN  # 88


class PacketError(ValueError):
    """A datagram was rejected; ``reason`` is the counter it is charged to."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class Probe:
    kind: int
    pair: int
    ts_kind: int
    seq: int
    src: int
    dst: int
    spacing_ns: int
    send_ns: int
    t2_ns: int = 0
    t3_ns: int = 0
    sport: int = 0
    flags: int = 0
    qpn: int = 0


class PacketCodec:
    """Packs and checks probe datagrams under one fleet key."""

    def __init__(self, key: bytes) -> None:
        if not key:
            raise ValueError("fleet key is empty")
        # HMAC-SHA256 (RFC 2104) with the padded-key states precomputed: per datagram
        # only two SHA-256 state copies, as hmac.HMAC.copy() does but cheaper.
        block = hashlib.sha256(key).digest() if len(key) > 64 else key
        block = block.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def _tag(self, body: bytes | memoryview) -> bytes:
        inner = self._inner.copy()
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:MAC_LEN]

    def pack(
        self,
        kind: int,
        pair: int,
        seq: int,
        src: int,
        dst: int,
        spacing_ns: int,
        send_ns: int,
        *,
        ts_kind: int = 0,
        t2_ns: int = 0,
        t3_ns: int = 0,
        sport: int = 0,
        flags: int = 0,
        qpn: int = 0,
    ) -> bytes:
        body = _BODY.pack(
            MAGIC, VERSION, kind, pair, ts_kind, seq, src, dst, spacing_ns, send_ns, t2_ns,
            t3_ns, sport, flags, qpn,
        )  # fmt: skip
        return body + self._tag(body)

    def unpack(self, data: bytes | memoryview) -> Probe:
        """Parse and authenticate; raises :class:`PacketError` ("malformed" or "auth")."""
        if len(data) != SIZE:
            raise PacketError("malformed")
        body = data[: _BODY.size]
        fields = _BODY.unpack(body)
        if fields[0] != MAGIC or fields[1] != VERSION or fields[2] not in (KIND_PROBE, KIND_ECHO):
            raise PacketError("malformed")
        if fields[3] > 1 or fields[4] > 3:
            raise PacketError("malformed")
        if not hmac.compare_digest(self._tag(body), bytes(data[_BODY.size :])):
            raise PacketError("auth")
        return Probe(
            kind=fields[2],
            pair=fields[3],
            ts_kind=fields[4],
            seq=fields[5],
            src=fields[6],
            dst=fields[7],
            spacing_ns=fields[8],
            send_ns=fields[9],
            t2_ns=fields[10],
            t3_ns=fields[11],
            sport=fields[12],
            flags=fields[13],
            qpn=fields[14],
        )


class ReplayWindow:
    """Per-sender anti-replay: a sliding bitmap of the last ``size`` sequence numbers.

    Like IPsec's window: a seq above the highest seen advances it; one inside the
    window is accepted once; one below the window (or seen before) is a replay.
    State is two integers per sender (highest seq, bitmap), not per-probe objects.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._full = (1 << size) - 1
        self._state: dict[int, list[int]] = {}  # src -> [highest seq, bitmap]

    def check_and_set(self, src: int, seq: int) -> bool:
        """True if ``seq`` from ``src`` is new (and remember it); False for a replay."""
        st = self._state.get(src)
        if st is None:
            self._state[src] = [seq, 1]
            return True
        top, bits = st
        if seq > top:
            # bit i of the bitmap stands for seq (top - i)
            st[0] = seq
            st[1] = ((bits << (seq - top)) | 1) & self._full if seq - top < self.size else 1
            return True
        back = top - seq
        if back >= self.size:
            return False
        mask = 1 << back
        if bits & mask:
            return False
        st[1] = bits | mask
        return True
