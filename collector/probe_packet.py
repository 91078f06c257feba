"""The probe datagram: fixed size, authenticated with a keyed BLAKE2b MAC.

Layout (little-endian, 88 bytes; see docs/collector.md)::

    off size field
      0    4 magic        b"CMPR"
      4    1 version      2 (1 was the same layout with HMAC-SHA256)
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
     72   16 mac          BLAKE2b-128 keyed with the fleet key (RFC 7693 keyed mode,
                          personalisation "clockmesh-probe") over bytes 0..71

A datagram of any other size, magic, version or kind is *malformed*; a wrong
MAC is *auth*. Staleness and replay are checked by the receiver
(:class:`ReplayWindow`).

The MAC is BLAKE2b in its keyed mode, a standard MAC (RFC 7693 section 2.5), not
HMAC: it costs one hash state copy per datagram instead of HMAC's two SHA-256
passes, which matters at thousands of datagrams per second in Python. Keys longer
than BLAKE2b's 64-byte key limit are first hashed to 64 bytes. ``PACKET`` is the
numpy view of the layout, for checking whole batches of datagrams at once.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

MAGIC = b"CMPR"
VERSION = 2
KIND_PROBE = 0
KIND_ECHO = 1
MAC_LEN = 16
_BODY = struct.Struct("<4sBBBBQqqqqqqHBxI")
FLAG_ECHO = 1
FLAG_RDMA = 2
SIZE = _BODY.size + MAC_LEN  # 88
BODY_SIZE = _BODY.size  # 72: the MAC covers these bytes
PERSON = b"clockmesh-probe"
_FIELDS = [
    ("magic", "<u4", 0),
    ("version", "u1", 4),
    ("kind", "u1", 5),
    ("pair", "u1", 6),
    ("ts_kind", "u1", 7),
    ("seq", "<u8", 8),
    ("src", "<i8", 16),
    ("dst", "<i8", 24),
    ("spacing_ns", "<i8", 32),
    ("send_ns", "<i8", 40),
    ("t2_ns", "<i8", 48),
    ("t3_ns", "<i8", 56),
    ("sport", "<u2", 64),
    ("flags", "u1", 66),
    ("reserved", "u1", 67),
    ("qpn", "<u4", 68),
]
MAGIC_U32 = int.from_bytes(MAGIC, "little")


def packet_dtype(itemsize: int = SIZE) -> np.dtype:
    """The packet layout as a numpy dtype whose rows are ``itemsize`` bytes apart."""
    return np.dtype(
        {
            "names": [f[0] for f in _FIELDS],
            "formats": [f[1] for f in _FIELDS],
            "offsets": [f[2] for f in _FIELDS],
            "itemsize": itemsize,
        }
    )


PACKET = packet_dtype()


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
        if len(key) > hashlib.blake2b.MAX_KEY_SIZE:
            key = hashlib.blake2b(key, digest_size=64, person=PERSON).digest()
        # The keyed state after the key block, copied per datagram.
        self._keyed = hashlib.blake2b(key=key, digest_size=MAC_LEN, person=PERSON)

    def mac(self, body: bytes | memoryview) -> bytes:
        """The 16-byte MAC of the first 72 bytes of a packet."""
        h = self._keyed.copy()
        h.update(body)
        return h.digest()

    def macs(self, buf: memoryview, offsets: Iterable[int]) -> bytes:
        """The MACs of the packets starting at ``offsets`` in ``buf``, concatenated
        (16 bytes each): one loop for a whole batch, no per-packet method calls."""
        copy = self._keyed.copy
        out = []
        for o in offsets:
            h = copy()
            h.update(buf[o : o + BODY_SIZE])
            out.append(h.digest())
        return b"".join(out)

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
        return body + self.mac(body)

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
        if not hmac.compare_digest(self.mac(body), bytes(data[_BODY.size :])):
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

    def check_batch(self, srcs: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """:meth:`check_and_set` of every (src, seq) in order, as a bool array.

        Same answers and same final state as the one-by-one loop. Per sender, the
        usual batch (every seq new: distinct, above the sender's highest seen, and
        each within the window of the highest seen before it) is done with a few
        numpy operations; any other batch (a replay, a seq at or below the highest
        seen, a jump of more than the window inside the batch) goes one by one.
        """
        n = len(seqs)
        if n == 0:
            return np.zeros(0, bool)
        first = int(srcs[0])
        if (srcs == first).all():
            groups: list[tuple[int, np.ndarray | None]] = [(first, None)]
        else:
            groups = [(int(v), np.flatnonzero(srcs == v)) for v in np.unique(srcs)]
        out = np.empty(n, bool)
        for src, where in groups:
            q = seqs if where is None else seqs[where]
            fresh = self._new_run(src, q.astype(np.uint64, copy=False))
            if fresh is None:
                check = self.check_and_set
                fresh = np.fromiter((check(src, x) for x in q.tolist()), bool, len(q))
            if where is None:
                out[:] = fresh
            else:
                out[where] = fresh
        return out

    def _new_run(self, src: int, q: np.ndarray) -> np.ndarray | None:
        """All-True (state updated) if every seq of ``q`` is new in the way that the
        one-by-one loop would accept all of them; None (state untouched) otherwise."""
        st = self._state.get(src)
        lo, hi = int(q.min()), int(q.max())
        if st is not None and lo <= st[0]:
            return None  # at or below the highest seen: needs the bitmap, one by one
        if hi - lo >= self.size:
            # a seq may fall below the window of a higher one accepted before it
            running = np.maximum.accumulate(q)
            below = running[:-1] > q[1:]  # uint64: compare before subtracting
            if (below & ((running[:-1] - q[1:]) >= self.size)).any():
                return None
        if len(q) > 1:
            s = np.sort(q)
            if (s[1:] == s[:-1]).any():
                return None  # a replay inside the batch
        # Final state as the loop leaves it: highest = hi, bit i = seq (hi - i) seen.
        back = hi - q
        back = back[back < self.size]
        marks = np.zeros(self.size, bool)
        marks[back.astype(np.intp)] = True
        new_bits = int.from_bytes(np.packbits(marks, bitorder="little").tobytes(), "little")
        if st is None:
            self._state[src] = [hi, new_bits]
        else:
            top, bits = st
            shift = hi - top
            old = (bits << shift) & self._full if shift < self.size else 0
            st[0], st[1] = hi, old | new_bits
        return np.ones(len(q), bool)
