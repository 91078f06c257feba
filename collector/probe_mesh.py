"""The UDP probe mesh: coded pairs to every buddy on every source port, echoes, auth.

One socket per source port (``probe.base_sport + i``) sends probes and receives
their echoes; one socket on ``backend.probe_port`` receives probes from others
and echoes them. Each sent probe gets a slot in a ring of numpy arrays indexed
by ``seq % RING`` (no per-probe Python objects); kernel TX timestamps from the
error queue fill the slot, and :meth:`ProbeMesh.flush` turns finished slots into
PROBE_TX rows in bulk.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import time
from collections import Counter
from typing import Any

import numpy as np

from collector import records, timestamping
from collector.config import CollectorConfig, Peer
from collector.lab_clock import RecordingClock
from collector.probe_packet import (
    FLAG_ECHO,
    KIND_ECHO,
    KIND_PROBE,
    MAGIC,
    SIZE,
    PacketCodec,
    PacketError,
    ReplayWindow,
)
from collector.record_buffer import RecordBuffer
from collector.records import Transport, TsKind
from collector.verbs_probe import ipv4_mapped_gid

log = logging.getLogger("clockmesh.collector.probe")
RING = 1 << 16
_PENDING, _EMITTED, _FAILED = 1, 2, 3
TX_WAIT_NS = 500_000_000  # a probe without a kernel TX timestamp after this gets a USER one
_UDP = int(Transport.UDP)
_SEQ = struct.Struct("<Q")
_ICMP_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN}
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: IntFlag arithmetic is slow per datagram
REJECT_REASONS = ("malformed", "auth", "stale", "replay", "misdirected", "unexpected_echo")


class ProbeMesh:
    """Sockets, schedule and bookkeeping of one collector's probes."""

    def __init__(
        self,
        cfg: CollectorConfig,
        buddies: list[Peer],
        codec: PacketCodec,
        clock: RecordingClock,
        buffers: dict[str, RecordBuffer],
    ) -> None:
        self.cfg = cfg
        self.codec = codec
        self.clock = clock
        self.buffers = buffers
        self.me = records.host_id(cfg.host)
        self.port = cfg.backend.probe_port
        self.max_age_ns = int(cfg.probe.max_age_s * 1e9)
        self.spacing_ns = int(cfg.probe.pair_spacing_us * 1000)
        self.flags = FLAG_ECHO if cfg.probe.echo else 0
        self.echo_enabled = cfg.probe.echo
        self.stats: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter({r: 0 for r in REJECT_REASONS})
        self.replay = ReplayWindow()
        self._buf = bytearray(2048)
        # Ring of sent probes, indexed by seq % RING.
        self.r_seq = np.zeros(RING, np.uint64)
        self.r_dst = np.zeros(RING, np.int64)
        self.r_sport = np.zeros(RING, np.uint16)
        self.r_user = np.zeros(RING, np.int64)  # raw realtime just before sendto
        self.r_tx = np.zeros(RING, np.int64)  # raw kernel TX timestamp, 0 until known
        self.r_kind = np.zeros(RING, np.uint8)
        self.r_state = np.zeros(RING, np.uint8)
        self.r_echoed = np.zeros(RING, bool)
        # Sequence numbers: even start from the microsecond clock, so they keep
        # increasing across restarts without any state (we send far fewer than
        # one probe per microsecond).
        self.next_seq = (time.time_ns() // 1000) & ~1
        self.emit_seq = self.next_seq
        self.rdma: Any = None  # verbs_probe.UdProber when RDMA probing is on
        self.peer_qpn: dict[int, int] = {}  # host_id -> its UD QPN (from its probes/echoes)
        self.rx_sock: socket.socket | None = None
        self.tx_socks: list[socket.socket] = []
        self._tx_ids: list[np.ndarray] = []  # per socket: send counter % RING -> seq
        self._tx_count: list[int] = []
        self.set_buddies(buddies)
        self.next_due = time.monotonic()

    # ---- set-up ---------------------------------------------------------------------
    def set_buddies(self, buddies: list[Peer]) -> None:
        self.buddies = buddies
        self._dst = [(records.host_id(p.name), p.address) for p in buddies]
        self._gid = [ipv4_mapped_gid(p.address) for p in buddies]
        ports = self.cfg.probe.ports_per_buddy
        # Port-major order: consecutive pairs go to different buddies.
        self.slots = [(b, p) for p in range(ports) for b in range(len(buddies))]
        self._slot = 0
        per_s = len(self.slots) * self.cfg.probe.rate_per_port
        self.interval_s = 1.0 / per_s if per_s else 1.0

    def open(self) -> list[socket.socket]:
        addr = self.cfg.backend.address
        self.rx_sock = timestamping.udp_socket(addr, self.port, tx_timestamps=False)
        try:
            for i in range(self.cfg.probe.ports_per_buddy):
                sock = timestamping.udp_socket(
                    addr, self.cfg.probe.base_sport + i, tx_timestamps=True
                )
                self.tx_socks.append(sock)
                self._tx_ids.append(np.zeros(RING, np.uint64))
                self._tx_count.append(0)
        except BaseException:
            self.close()
            raise
        return [self.rx_sock, *self.tx_socks]

    def close(self) -> None:
        for sock in [self.rx_sock, *self.tx_socks]:
            if sock is not None:
                sock.close()
        self.rx_sock = None
        self.tx_socks, self._tx_ids, self._tx_count = [], [], []

    # ---- sending --------------------------------------------------------------------
    def send_due(self, now: float, ahead: float = 0.0) -> float:
        """Send every coded pair due by ``now + ahead``; returns when the next is due.

        The main loop wakes once per tick and sends the pairs of the coming tick in
        one go (the average rate is unchanged; every probe carries its own kernel
        timestamp, so sending a few ms early costs no accuracy).
        """
        if not self.slots or not self.tx_socks:
            self.next_due = now + 1.0
            return self.next_due
        if self.next_due < now - 1.0:
            self.next_due = now  # far behind (stopped/suspended): do not burst a backlog
        sent = 0
        while self.next_due <= now + ahead and sent < 256:
            b, p = self.slots[self._slot]
            self._slot = (self._slot + 1) % len(self.slots)
            self._send_pair(b, p)
            self.next_due += self.interval_s
            sent += 1
        return self.next_due

    def _send_pair(self, b: int, p: int) -> None:
        dst_id, addr = self._dst[b]
        sock = self.tx_socks[p]
        sport = self.cfg.probe.base_sport + p
        seq0 = self.next_seq
        self.next_seq += 2
        start = 0
        for pair in (0, 1):
            seq = seq0 + pair
            i = seq % RING
            if pair == 1:
                # Known spacing: spin (it is tens of microseconds) rather than sleep.
                while time.perf_counter_ns() - start < self.spacing_ns:
                    pass
            t_user = time.time_ns()
            pkt = self.codec.pack(
                KIND_PROBE, pair, seq, self.me, dst_id, self.spacing_ns,
                self.clock.skew(t_user), flags=self.flags, qpn=self.rdma.qpn if self.rdma else 0,
            )  # fmt: skip
            if pair == 0:
                start = time.perf_counter_ns()
            self.r_seq[i] = seq
            self.r_dst[i] = dst_id
            self.r_sport[i] = sport
            self.r_user[i] = t_user
            self.r_tx[i] = 0
            self.r_kind[i] = TsKind.USER
            self.r_echoed[i] = False
            try:
                try:
                    sock.sendto(pkt, (addr, self.port))
                except OSError as first:
                    if first.errno not in _ICMP_ERRNOS:
                        raise
                    # With IP_RECVERR the kernel reports an earlier probe's ICMP error
                    # (port/host/net unreachable) on this send instead of sending it:
                    # count it and retry once (a lasting failure raises again).
                    self.stats["icmp_errors"] += 1
                    sock.sendto(pkt, (addr, self.port))
            except OSError as exc:
                self.r_state[i] = _FAILED
                name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
                self.stats[f"send_error_{name.lower()}"] += 1
                if pair == 0:
                    self.r_state[(seq + 1) % RING] = _FAILED
                    self.r_seq[(seq + 1) % RING] = seq + 1
                    break
                continue
            self.r_state[i] = _PENDING
            k = self._tx_count[p]
            self._tx_ids[p][k % RING] = seq
            self._tx_count[p] = k + 1
            self.stats["probes_sent"] += 1
        if self.rdma is not None and dst_id in self.peer_qpn:
            rseq = self.next_seq
            self.next_seq += 2
            for q in (rseq, rseq + 1):
                self.r_seq[q % RING] = q
                self.r_state[q % RING] = _EMITTED  # rows come from the RDMA completions
            self.rdma.send_pair(rseq, dst_id, self._gid[b], self.peer_qpn[dst_id], p)

    # ---- receiving ------------------------------------------------------------------
    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1

    def on_probe_socket(self) -> None:
        """Probes from other collectors: authenticate, record, echo."""
        sock = self.rx_sock
        if sock is None:
            return
        view = memoryview(self._buf)
        for _ in range(4096):
            try:
                n, anc, flags, addr = sock.recvmsg_into([self._buf], timestamping.ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.stats["recv_errors"] += 1
                continue
            ts, kind, ttl, drops = timestamping.rx_meta(anc)
            if drops >= 0:
                self.stats["rx_kernel_drops"] = drops
            if not ts:
                ts, kind = time.time_ns(), int(TsKind.USER)
            if n != SIZE or flags & _MSG_TRUNC:
                self._reject("malformed")
                continue
            try:
                pr = self.codec.unpack(view[:n])
            except PacketError as exc:
                self._reject(exc.reason)
                continue
            if pr.kind != KIND_PROBE:
                self._reject("malformed")
                continue
            if pr.dst != self.me:
                self._reject("misdirected")
                continue
            rx_ns = self.clock.skew(ts)
            if abs(rx_ns - pr.send_ns) > self.max_age_ns:
                self._reject("stale")
                continue
            if not self.replay.check_and_set(pr.src, pr.seq):
                self._reject("replay")
                continue
            if pr.qpn:
                self.peer_qpn[pr.src] = pr.qpn
            self.buffers["probe_rx"].append(
                pr.seq, pr.src, pr.dst, addr[1], self.port, pr.pair, kind, _UDP, ttl, rx_ns,
                pr.spacing_ns,
            )  # fmt: skip
            self.stats["probes_received"] += 1
            if pr.flags & FLAG_ECHO and self.echo_enabled:
                echo = self.codec.pack(
                    KIND_ECHO, pr.pair, pr.seq, pr.src, pr.dst, pr.spacing_ns, pr.send_ns,
                    ts_kind=kind, t2_ns=rx_ns, t3_ns=self.clock.now(), sport=addr[1],
                    qpn=self.rdma.qpn if self.rdma else 0,
                )  # fmt: skip
                try:
                    sock.sendto(echo, addr)
                    self.stats["echoes_sent"] += 1
                except OSError:
                    self.stats["echo_send_errors"] += 1

    def on_tx_socket(self, p: int) -> None:
        """Error queue (TX timestamps) first, then echoes of our probes."""
        sock = self.tx_socks[p]
        ids = self._tx_ids[p]
        for ident, ts, kind, packet in timestamping.read_tx_timestamps(sock, SIZE):
            if packet[:4] == MAGIC:
                seq = _SEQ.unpack_from(packet, 8)[0]  # the probe itself says which it was
                if seq != ids[ident % RING]:
                    self.stats["tx_counter_resync"] += 1
            else:
                seq = int(ids[ident % RING])  # no looped packet: trust the send counter
            i = seq % RING
            if self.r_seq[i] != seq or self.r_state[i] == _FAILED:
                continue
            if ts < self.r_user[i] - 1_000_000:
                self.stats["tx_timestamp_mismatch"] += 1
                continue
            self.r_tx[i] = ts
            self.r_kind[i] = kind
        view = memoryview(self._buf)
        for _ in range(4096):
            try:
                n, anc, flags, _addr = sock.recvmsg_into([self._buf], timestamping.ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.stats["recv_errors"] += 1
                continue
            ts, kind, _ttl, _drops = timestamping.rx_meta(anc)
            if not ts:
                ts, kind = time.time_ns(), int(TsKind.USER)
            if n != SIZE or flags & _MSG_TRUNC:
                self._reject("malformed")
                continue
            try:
                pr = self.codec.unpack(view[:n])
            except PacketError as exc:
                self._reject(exc.reason)
                continue
            if pr.kind != KIND_ECHO:
                self._reject("malformed")
                continue
            if pr.src != self.me:
                self._reject("misdirected")
                continue
            i = pr.seq % RING
            if (
                self.r_seq[i] != pr.seq
                or self.r_dst[i] != pr.dst
                or self.r_echoed[i]
                or self.r_state[i] == _FAILED
            ):
                self._reject("unexpected_echo")
                continue
            t4 = self.clock.skew(ts)
            t1_raw = int(self.r_tx[i]) or int(self.r_user[i])
            t1 = self.clock.skew(t1_raw)
            if t4 - t1 > self.max_age_ns:
                self._reject("stale")
                continue
            self.r_echoed[i] = True
            if pr.qpn:
                self.peer_qpn[pr.dst] = pr.qpn
            weakest = min(kind, int(self.r_kind[i]), pr.ts_kind)
            self.buffers["echo"].append(
                pr.seq, self.me, pr.dst, int(self.r_sport[i]), weakest, t1, pr.t2_ns, pr.t3_ns, t4
            )
            self.stats["echoes_received"] += 1

    # ---- records --------------------------------------------------------------------
    def flush(self, now_raw_ns: int | None = None) -> None:
        """PROBE_TX rows for every sent probe whose TX timestamp is in (or overdue)."""
        if self.next_seq == self.emit_seq:
            return
        now_raw_ns = time.time_ns() if now_raw_ns is None else now_raw_ns
        seqs = np.arange(self.emit_seq, self.next_seq, dtype=np.uint64)
        idx = (seqs % RING).astype(np.intp)
        state = self.r_state[idx]
        done = (
            (state != _PENDING)
            | (self.r_tx[idx] != 0)
            | (now_raw_ns - self.r_user[idx] > TX_WAIT_NS)
        )
        upto = len(seqs) if done.all() else int(np.argmin(done))
        if upto == 0:
            return
        idx = idx[:upto]
        emit = idx[self.r_state[idx] == _PENDING]
        if len(emit):
            tx = self.r_tx[emit]
            kind = self.r_kind[emit]
            have = tx != 0
            raw = np.where(have, tx, self.r_user[emit])
            rows = np.zeros(len(emit), records.PROBE_TX)
            rows["seq"] = self.r_seq[emit]
            rows["src"] = self.me
            rows["dst"] = self.r_dst[emit]
            rows["sport"] = self.r_sport[emit]
            rows["dport"] = self.port
            rows["pair"] = self.r_seq[emit] % 2
            rows["ts_kind"] = np.where(have, kind, TsKind.USER)
            rows["transport"] = Transport.UDP
            rows["tx_ns"] = self.clock.skew_array(raw)
            self.buffers["probe_tx"].extend(rows)
            self.stats["tx_ts_kernel"] += int(have.sum())
            self.stats["tx_ts_user"] += int((~have).sum())
            self.r_state[emit] = _EMITTED
        self.emit_seq += upto
