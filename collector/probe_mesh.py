"""The UDP probe mesh: coded pairs to every buddy on every source port, echoes, auth.

One socket per source port (``probe.base_sport + i``) sends probes and receives
their echoes; one socket on ``backend.probe_port`` receives probes from others
and echoes them. Each sent probe gets a slot in a ring of numpy arrays indexed
by ``seq % RING`` (no per-probe Python objects); kernel TX timestamps from the
error queue fill the slot, and :meth:`ProbeMesh.flush` turns finished slots into
PROBE_TX rows in bulk.

Path tracing (trace rounds, the watch, their answers) is collector/path_trace.py's
:class:`~collector.path_trace.PathTracer`, on this mesh's source-port sockets.

Over 500 lines: one job, the probes' sockets and rings (send, drain, echo, flush share them).
"""

from __future__ import annotations

import errno
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from collector import records, timestamping
from collector.config import CollectorConfig, Peer
from collector.datagram_batch import DatagramBatch, sockaddr_in
from collector.lab_clock import RecordingClock
from collector.path_trace import TRACE_MAGIC_U32, TRACE_SIZE, PathTracer
from collector.probe_packet import (
    BODY_SIZE,
    FLAG_ECHO,
    KIND_ECHO,
    KIND_PROBE,
    MAC_LEN,
    MAGIC_U32,
    PACKET,
    SIZE,
    VERSION,
    PacketCodec,
    ReplayWindow,
    packet_dtype,
)
from collector.record_buffer import RecordBuffer
from collector.records import Transport, TsKind
from collector.verbs_probe import ipv4_mapped_gid

RING = 1 << 16
_PENDING, _EMITTED, _FAILED = 1, 2, 3
TX_WAIT_NS = 500_000_000  # a probe without a kernel TX timestamp after this gets a USER one
_UDP = int(Transport.UDP)
_I64 = struct.Struct("<q")
DRAIN_ROWS = 1024  # datagrams handled per bulk pass
MAX_BATCHES = 8  # recvmmsg calls per socket and drain, so one busy socket cannot starve others
MAX_PAIRS = 1024  # coded pairs per tick: 10,240 pairs/s at 10 ticks/s
RX_SLOT = 128  # larger datagrams arrive truncated (MSG_TRUNC) and are malformed anyway
ERR_SLOT = 256  # error-queue messages carry the looped-back packet with its headers
_ARANGE4 = np.arange(4)
_ARANGE8_SEQ = np.arange(8, 16)
_ICMP_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN}
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: IntFlag arithmetic is slow per datagram
REJECT_REASONS = ("malformed", "auth", "stale", "replay", "misdirected", "unexpected_echo")


def _index(rows: np.ndarray) -> np.ndarray | slice:
    """``rows`` (ascending, distinct) as an index: a slice when they are consecutive
    (a view instead of a copy: the usual batch, where every row is valid)."""
    if len(rows) and int(rows[-1]) - int(rows[0]) + 1 == len(rows):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


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
        # Echo sampling: both probes of 1 coded pair in N per (buddy, port) carry the
        # echo flag (see _echo_wanted); the echoer echoes exactly the flagged probes.
        self.echo_every = cfg.probe.echo_ratio()
        self.echo_enabled = self.echo_every > 0
        self.stats: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter({r: 0 for r in REJECT_REASONS})
        self.replay = ReplayWindow()
        # Preallocated batches: received datagrams (probes or echoes), error-queue
        # messages, probes to send, echoes to send. Numpy views parse them in bulk.
        self._rxb = DatagramBatch(DRAIN_ROWS, RX_SLOT, timestamping.ANC_SIZE)
        self._errb = DatagramBatch(DRAIN_ROWS, ERR_SLOT, timestamping.ERR_ANC_SIZE)
        self._port_of = np.zeros(DRAIN_ROWS, np.intp)  # source-port socket of each row
        self._sock_drops = np.zeros(1, np.int64)  # (sized by open())
        self._txb = DatagramBatch(2 * MAX_PAIRS, SIZE)
        self._echob = DatagramBatch(DRAIN_ROWS, SIZE)
        self._echo_addrs: dict[int, tuple[str, int]] = {}
        self._rx_pkts = self._rxb.data.view(packet_dtype(RX_SLOT))[:, 0]
        self._tx_pkts = self._txb.data.view(packet_dtype(SIZE))[:, 0]
        self._echo_pkts = self._echob.data.view(packet_dtype(SIZE))[:, 0]
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
        self._tx_ids = np.zeros((0, RING), np.uint64)  # [socket, send counter % RING] -> seq
        self._tx_count = np.zeros(0, np.int64)  # per socket: datagrams the kernel took
        # Path tracing (collector/path_trace.py): on these source-port sockets, its
        # counters in these stats.
        self.tracer = PathTracer(cfg, clock, buffers, self.stats)
        self.set_buddies(buddies)
        self.next_due = time.monotonic()

    # ---- set-up ---------------------------------------------------------------------
    def set_buddies(self, buddies: list[Peer]) -> None:
        self.buddies = buddies
        self.tracer.set_buddies(buddies)
        self._dst = [(records.host_id(p.name), p.address) for p in buddies]
        self._dst_ids = np.array([d for d, _a in self._dst], np.int64)
        self._templates_qpn = -1  # rebuilt on the next send
        self._dst_names = np.zeros((len(buddies), 16), np.uint8)
        for j, p in enumerate(buddies):
            self._dst_names[j] = np.frombuffer(sockaddr_in(p.address, self.port), np.uint8)
        self._gid = [ipv4_mapped_gid(p.address) for p in buddies]
        ports = self.cfg.probe.ports_per_buddy
        # Port-major order: consecutive pairs go to different buddies.
        self.slots = [(b, p) for p in range(ports) for b in range(len(buddies))]
        self._slot_buds = np.array([b for b, _p in self.slots], np.intp)
        self._slot_ports = np.array([p for _b, p in self.slots], np.intp)
        self._slot = 0
        self._visits = np.zeros(len(buddies) * ports, np.int64)  # pairs sent per (buddy, port)
        per_s = len(self.slots) * self.cfg.probe.rate_per_port
        self.interval_s = 1.0 / per_s if per_s else 1.0

    def open(self) -> list[socket.socket]:
        addr = self.cfg.backend.address
        self.rx_sock = timestamping.udp_socket(addr, self.port, tx_timestamps=False)
        self.tracer.open()
        try:
            for i in range(self.cfg.probe.ports_per_buddy):
                sock = timestamping.udp_socket(
                    addr, self.cfg.probe.base_sport + i, tx_timestamps=True
                )
                self.tx_socks.append(sock)
            self._tx_ids = np.zeros((len(self.tx_socks), RING), np.uint64)
            self._tx_count = np.zeros(len(self.tx_socks), np.int64)
            # the kernel's drop count of each socket: the source-port ones, the probe one
            self._sock_drops = np.zeros(len(self.tx_socks) + 1, np.int64)
            self.tracer.socks = self.tx_socks
            # Probes, echoes and traces in the RDMA traffic class (RoCE v2's DSCP): they
            # measure the queue RDMA traffic sees, not the best-effort one.
            for sock in [self.rx_sock, *self.tx_socks]:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.cfg.probe.dscp << 2)
        except BaseException:
            self.close()
            raise
        return [self.rx_sock, *self.tx_socks]

    def close(self) -> None:
        for sock in [self.rx_sock, *self.tx_socks]:
            if sock is not None:
                sock.close()
        self.tracer.close()
        self.rx_sock = None
        self.tx_socks = []
        self._tx_count = np.zeros(0, np.int64)

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
        # How many pairs are due (the same float steps as taking them one by one); they
        # are the next k slots of the cyclic schedule.
        due_at, step, limit, k = self.next_due, self.interval_s, now + ahead, 0
        while due_at <= limit and k < MAX_PAIRS:
            due_at += step
            k += 1
        self.next_due = due_at
        if k:
            idx = np.arange(self._slot, self._slot + k) % len(self.slots)
            self._slot = (self._slot + k) % len(self.slots)
            self._send_batch(self._slot_buds[idx], self._slot_ports[idx])
        return self.next_due

    def _send_pairs(self, due: list[tuple[int, int]]) -> None:
        """:meth:`_send_batch` for a list of (buddy index, port index) pairs."""
        k = len(due)
        buds = np.fromiter((b for b, _p in due), np.intp, k)
        self._send_batch(buds, np.fromiter((p for _b, p in due), np.intp, k))

    def _send_batch(self, buds: np.ndarray, ports: np.ndarray) -> None:
        """Build, sign and send coded pairs, grouped per source-port socket.

        With a pair spacing, the first probes of all pairs go out (one ``sendmmsg``
        per socket), then, once ``pair_spacing_us`` has passed since the first of
        them, the second probes: every pair's gap is at least the spacing, and the
        busy-wait happens once per batch, not once per pair. With spacing 0 the two
        probes of a pair are adjacent in one ``sendmmsg``."""
        k = len(buds)
        if k == 0:
            return
        echo = self._echo_wanted(buds, ports)
        order = np.argsort(ports, kind="stable")
        ports, buds, echo = ports[order], buds[order], echo[order]
        seq0 = self.next_seq
        self.next_seq += 2 * k
        first = seq0 + 2 * np.arange(k, dtype=np.uint64)
        spaced = self.spacing_ns > 0
        # rows of the send batch: spaced: firsts 0..k-1, seconds k..2k-1; else interleaved
        seqs = (
            np.concatenate([first, first + 1])
            if spaced
            else np.stack([first, first + 1], 1).ravel()
        )
        bud_rows = np.concatenate([buds, buds]) if spaced else np.repeat(buds, 2)
        port_rows = np.concatenate([ports, ports]) if spaced else np.repeat(ports, 2)
        n = 2 * k
        qpn = self.rdma.qpn if self.rdma else 0
        if self._templates_qpn != qpn:
            self._build_templates(qpn)
        self._txb.data[:n] = self._templates[bud_rows]  # the fields fixed per buddy
        pk = self._tx_pkts[:n]
        pk["pair"] = seqs % 2
        pk["seq"] = seqs
        pk["flags"] = np.where(np.concatenate([echo, echo]) if spaced else np.repeat(echo, 2),
                               FLAG_ECHO, 0)  # fmt: skip
        pk["send_ns"] = self.clock.skew(time.time_ns())
        self._sign(self._txb, n)
        self._txb.names[:n] = self._dst_names[bud_rows]
        ring = (seqs % RING).astype(np.intp)
        self.r_seq[ring] = seqs
        self.r_dst[ring] = self._dst_ids[bud_rows]
        self.r_sport[ring] = self.cfg.probe.base_sport + port_rows
        self.r_tx[ring] = 0
        self.r_kind[ring] = TsKind.USER
        self.r_echoed[ring] = False
        bounds = np.flatnonzero(np.diff(ports)) + 1
        groups = list(zip([0, *bounds.tolist()], [*bounds.tolist(), k], strict=True))
        sock_of = ports.tolist()
        sent = bytearray(n)  # 1 = the kernel took it; plain Python while sending
        user = np.zeros(n, np.int64)
        if spaced:
            start = time.perf_counter_ns()
            for a, b in groups:
                self._send_rows(sock_of[a], range(a, b), sent, user, False)
            while time.perf_counter_ns() - start < self.spacing_ns:
                pass  # known spacing: spin (tens of microseconds, once per batch)
            for a, b in groups:
                if sent.find(0, a, b) < 0:  # every first went: every second goes
                    self._send_rows(sock_of[a], range(k + a, k + b), sent, user, False)
                    continue
                rows = [k + j for j in range(a, b) if sent[j]]  # no second without its first
                self._send_rows(sock_of[a], rows, sent, user, False)
        else:
            for a, b in groups:
                self._send_rows(sock_of[a], range(2 * a, 2 * b), sent, user, True)
        # Bookkeeping for the whole batch at once.
        self.r_user[ring] = user
        if sent.find(0) < 0:  # the usual case: the kernel took every probe
            self.r_state[ring] = _PENDING
            sock, done_seqs = port_rows, seqs
        else:
            ok = np.frombuffer(bytes(sent), bool)
            self.r_state[ring] = np.where(ok, _PENDING, _FAILED)
            done = np.flatnonzero(ok)
            sock, done_seqs = port_rows[done], seqs[done]
        if len(sock):
            # Each socket's send counter (OPT_ID) -> seq, in send order (= row order).
            by_sock = np.argsort(sock, kind="stable")
            sock, done_seqs = sock[by_sock], done_seqs[by_sock]
            counts = np.bincount(sock, minlength=len(self._tx_count))
            pos = np.arange(len(sock)) - (np.cumsum(counts) - counts)[sock]
            self._tx_ids[sock, (self._tx_count[sock] + pos) % RING] = done_seqs
            self._tx_count += counts
            self.stats["probes_sent"] += len(sock)
        if self.rdma is not None:
            self._send_rdma(list(zip(buds.tolist(), ports.tolist(), strict=True)))

    def _echo_wanted(self, buds: np.ndarray, ports: np.ndarray) -> np.ndarray:
        """Which of these coded pairs (in send order) ask for an echo.

        The v-th pair (v = 0, 1, ...) sent to buddy b on port p is echoed iff
        ``(v + b + p) % echo_every == 0``: every buddy gets 1 pair in N on every
        port, and the echoed ports rotate (with N = ports: one port per buddy and
        round), so echoes are spread evenly over buddies, paths and time. The flag
        is in the (authenticated) probe, so the echoer and the records need no rule.
        """
        n = self.echo_every
        if n <= 1:
            return np.full(len(buds), n == 1)
        slot = buds * self.cfg.probe.ports_per_buddy + ports
        # v of each pair: visits so far plus its occurrence among this batch's pairs
        order = np.argsort(slot, kind="stable")
        s = slot[order]
        idx = np.arange(len(s))
        first = np.ones(len(s), bool)
        first[1:] = s[1:] != s[:-1]
        occ = np.empty(len(s), np.int64)
        occ[order] = idx - np.maximum.accumulate(np.where(first, idx, 0))
        v = self._visits[slot] + occ
        self._visits += np.bincount(slot, minlength=len(self._visits))
        return (v + buds + ports) % n == 0

    def _build_templates(self, qpn: int) -> None:
        """One probe per buddy with every field that does not change per probe."""
        t = np.zeros(len(self._dst_ids), PACKET)
        t["magic"] = MAGIC_U32
        t["version"] = VERSION
        t["kind"] = KIND_PROBE
        t["src"] = self.me
        t["dst"] = self._dst_ids
        t["spacing_ns"] = self.spacing_ns
        t["flags"] = 0  # per probe: FLAG_ECHO on the sampled pairs
        t["qpn"] = qpn
        self._templates = t.view(np.uint8).reshape(len(t), SIZE)
        self._templates_qpn = qpn

    def _send_rdma(self, due: list[tuple[int, int]]) -> None:
        for b, p in due:
            dst_id = self._dst[b][0]
            if dst_id not in self.peer_qpn:
                continue
            rseq = self.next_seq
            self.next_seq += 2
            for q in (rseq, rseq + 1):
                self.r_seq[q % RING] = q
                self.r_state[q % RING] = _EMITTED  # rows come from the RDMA completions
            self.rdma.send_pair(rseq, dst_id, self._gid[b], self.peer_qpn[dst_id], p)

    def _send_rows(
        self,
        p: int,
        rows: range | list[int],
        sent: bytearray,
        user: np.ndarray,
        pairs_adjacent: bool,
    ) -> None:
        """Send batch rows (ascending) on socket ``p``: one sendmmsg per run of rows.

        ``rows`` is a ``range`` (one run) or a list. Marks ``sent`` and the raw
        realtime just before each call in ``user``."""
        sock = self.tx_socks[p]
        send = self._txb.send
        one_run = isinstance(rows, range)
        i, retried = 0, -1
        while i < len(rows):
            r0, j = rows[i], len(rows)
            if not one_run:
                j = i + 1
                while j < len(rows) and rows[j] == rows[j - 1] + 1:
                    j += 1
            t_user = time.time_ns()
            try:
                got = send(sock, r0, j - i)
            except OSError as exc:
                if exc.errno in _ICMP_ERRNOS and retried != r0:
                    # With IP_RECVERR the kernel reports an earlier probe's ICMP error
                    # (port/host/net unreachable) on this send instead of sending it:
                    # count it and retry once (a lasting failure fails that probe).
                    self.stats["icmp_errors"] += 1
                    retried = r0
                    continue
                name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
                self.stats[f"send_error_{name.lower()}"] += 1
                i += 1
                if pairs_adjacent and r0 % 2 == 0 and i < len(rows) and rows[i] == r0 + 1:
                    i += 1  # no second probe without its first
                continue
            user[r0 : r0 + got] = t_user
            sent[r0 : r0 + got] = b"\1" * got
            i += got

    def _sign(self, batch: DatagramBatch, n: int) -> None:
        """MAC of the first ``n`` packets of ``batch`` (slot size SIZE)."""
        macs = self.codec.macs(batch.buffer, list(range(0, n * SIZE, SIZE)))
        batch.data[:n, BODY_SIZE:SIZE] = np.frombuffer(macs, np.uint8).reshape(n, MAC_LEN)

    # ---- receiving ------------------------------------------------------------------
    def _reject(self, reason: str, count: int = 1) -> None:
        self.rejected[reason] += count

    def drain(self) -> None:
        """Read every probe socket and handle what arrived in bulk passes.

        Called once per drain interval, not per datagram: TX timestamps from the
        error queues of all source-port sockets first (echo rows need them), then the
        echoes arriving on those sockets and the probes from other collectors (which
        are echoed), received into one batch and checked together (echoes first).
        The kernel timestamps make the delay invisible in the data."""
        if self.rx_sock is None:
            return
        socks = list(enumerate(self.tx_socks))
        self._drain(self._errb, socks, timestamping.MSG_ERRQUEUE, self._on_tx_timestamps)
        self.tracer.drain()
        self._drain(self._rxb, [*socks, (-1, self.rx_sock)], 0, self._on_received)

    def _drain(
        self,
        batch: DatagramBatch,
        socks: list[tuple[int, socket.socket]],
        flags: int,
        handler: Callable[[int], None],
    ) -> None:
        n = 0
        for p, sock in socks:
            for _ in range(MAX_BATCHES):
                if n == batch.capacity:
                    handler(n)
                    n = 0
                try:
                    got = batch.recv(sock, flags, n)
                except OSError:
                    if flags:
                        break
                    self.stats["recv_errors"] += 1  # e.g. a queued ICMP error: read on
                    continue
                if got:
                    self._port_of[n : n + got] = p
                    n += got
                if n < batch.capacity:
                    break
        if n:
            handler(n)

    def _on_received(self, n: int) -> None:
        """A received batch: rows from the source-port sockets (echoes) come first,
        then the probe socket's (probes)."""
        m = int(np.count_nonzero(self._port_of[:n] >= 0))
        rows, ts, kind, ttl = self._checked(n, m)
        split = int(np.searchsorted(rows, m))
        if split:
            self._on_echoes(rows[:split], ts, kind)
        if split < len(rows):
            self._on_probes(n, rows[split:], ts, kind, ttl)

    def _checked(self, n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Rows of the RX batch that are well-formed, authentic and of the right kind
        (echoes in rows below ``m``, from the source-port sockets; probes from ``m``).

        Returns (rows, timestamp ns, TsKind, TTL) with the rejections counted."""
        b = self._rxb
        ts, kind, ttl, per_row = timestamping.rx_meta_rows(b, n)
        if per_row.max(initial=-1) >= 0:
            # Each socket's count (cumulative, the newest in this batch), summed: one
            # socket's alone, the count shipped went up and down as a drain read the
            # echo sockets or the probe socket, which the detector reads as a restart.
            newest = np.full(len(self._sock_drops), -1, np.int64)
            np.maximum.at(newest, self._port_of[:n], per_row)  # -1: the probe socket
            self._sock_drops = np.where(newest >= 0, newest, self._sock_drops)
            self.stats["rx_kernel_drops"] = int(self._sock_drops.sum())
        none = ts == 0
        if none.any():
            ts[none] = time.time_ns()
            kind[none] = TsKind.USER
        pk = self._rx_pkts[:n]
        ok = (b.lengths(n) == SIZE) & ((b.msg_flags(n) & _MSG_TRUNC) == 0)
        ok &= (pk["magic"] == MAGIC_U32) & (pk["version"] == VERSION) & (pk["kind"] <= KIND_ECHO)
        ok &= (pk["pair"] <= 1) & (pk["ts_kind"] <= 3)
        rows = np.flatnonzero(ok)
        if len(rows) < n:
            # A trace probe that reached this host (no router at its TTL on the way: its
            # sender traces a buddy of no known rack, or one within trace_ttl hops) is no
            # malformed probe: counted apart, so that a ``malformed`` count means one.
            traces = ~ok & (b.lengths(n) == TRACE_SIZE) & (pk["magic"] == TRACE_MAGIC_U32)
            arrived = int(traces[m:].sum())  # at the probe port, where traces are sent
            self.stats["traces_arrived"] += arrived
            if n - len(rows) - arrived:
                self._reject("malformed", n - len(rows) - arrived)
        if len(rows):
            # MACs of the whole batch, compared in one pass over all bytes (XOR, then
            # OR over each MAC: no early exit, so no timing difference per byte).
            sel = _index(rows)
            offsets = (
                range(sel.start * b.slot, sel.stop * b.slot, b.slot)
                if isinstance(sel, slice)
                else (rows * b.slot).tolist()
            )
            want = np.frombuffer(self.codec.macs(b.buffer, offsets), np.uint8)
            diff = want.reshape(len(rows), MAC_LEN) ^ b.data[sel, BODY_SIZE:SIZE]
            good = np.bitwise_or.reduce(diff, axis=1) == 0
            if not good.all():
                self._reject("auth", len(rows) - int(good.sum()))
                rows = rows[good]
        wrong = pk["kind"][_index(rows)] != np.where(rows < m, KIND_ECHO, KIND_PROBE)
        if wrong.any():
            self._reject("malformed", int(wrong.sum()))
            rows = rows[~wrong]
        return rows, ts, kind, ttl

    def _on_probes(
        self, n: int, rows: np.ndarray, ts: np.ndarray, kind: np.ndarray, ttl: np.ndarray
    ) -> None:
        pk = self._rx_pkts[:n]
        sel = _index(rows)  # rows to index with (a slice when they are consecutive)
        mis = pk["dst"][sel] != self.me
        if mis.any():
            self._reject("misdirected", int(mis.sum()))
            rows = sel = rows[~mis]
        rx_ns = self.clock.skew_array(ts[sel])
        stale = np.abs(rx_ns - pk["send_ns"][sel]) > self.max_age_ns
        if stale.any():
            self._reject("stale", int(stale.sum()))
            rows, rx_ns = rows[~stale], rx_ns[~stale]
            sel = rows
        fresh = self.replay.check_batch(pk["src"][sel], pk["seq"][sel])
        if not fresh.all():
            self._reject("replay", len(rows) - int(fresh.sum()))
            rows, rx_ns = rows[fresh], rx_ns[fresh]
            sel = rows
        if not len(rows):
            return
        p = pk[sel]
        self._learn_qpns(p["src"], p["qpn"])  # the prober's
        sports = self._rxb.ports(n)[sel]
        out = np.zeros(len(rows), records.PROBE_RX)
        out["seq"] = p["seq"]
        out["src"] = p["src"]
        out["dst"] = p["dst"]
        out["sport"] = sports
        out["dport"] = self.port
        out["pair"] = p["pair"]
        out["ts_kind"] = kind[sel]
        out["transport"] = _UDP
        out["ttl"] = ttl[sel]
        out["rx_ns"] = rx_ns
        out["spacing_ns"] = p["spacing_ns"]
        self.buffers["probe_rx"].extend(out)
        self.stats["probes_received"] += len(rows)
        if self.echo_enabled:
            want = (p["flags"] & FLAG_ECHO) != 0
            if want.any():
                self._echo(rows[want], kind[sel][want], rx_ns[want], sports[want])

    def _learn_qpns(self, hosts: np.ndarray, qpns: np.ndarray) -> None:
        """Remember the RDMA UD queue pair each peer announced (0: it has none)."""
        has_qpn = qpns != 0
        if has_qpn.any():
            for host, qpn in zip(hosts[has_qpn].tolist(), qpns[has_qpn].tolist(), strict=True):
                self.peer_qpn[host] = qpn

    def _echo(
        self,
        rows: np.ndarray,
        kind: np.ndarray,
        rx_ns: np.ndarray,
        sports: np.ndarray,
    ) -> None:
        """Send each echo right after stamping t3 (so t3 is its send time, as before)."""
        m = len(rows)
        eb = self._echob
        eb.data[:m] = self._rxb.data[rows, :SIZE]  # magic .. send_ns as the probe had them
        e = self._echo_pkts[:m]
        e["kind"] = KIND_ECHO
        e["ts_kind"] = kind
        e["t2_ns"] = rx_ns
        e["sport"] = sports
        e["flags"] = 0
        e["reserved"] = 0
        e["qpn"] = self.rdma.qpn if self.rdma else 0
        # One datagram per call (sendto: cheaper than a 1-message sendmmsg via ctypes),
        # to the probe's source address; address tuples are cached per (ip, port).
        names = self._rxb.names[rows]
        keys = (
            (names[:, 4:8].copy().view("<u4").ravel().astype(np.uint64) << 16) | sports
        ).tolist()
        addrs = self._echo_addrs
        if len(addrs) > 4096:
            addrs.clear()
        mv, mac, now, skew = eb.buffer, self.codec.mac, time.time_ns, self.clock.skew
        identity = self.clock.identity
        pack_t3 = _I64.pack_into
        sock = self.rx_sock
        assert sock is not None
        sendto = sock.sendto
        sent = errors = 0
        for j, key in enumerate(keys):
            addr = addrs.get(key)
            if addr is None:
                addr = addrs[key] = (socket.inet_ntoa(names[j, 4:8].tobytes()), key & 0xFFFF)
            off = j * SIZE
            t3 = now()  # t3: the echoer's clock just before the send
            pack_t3(mv, off + 56, t3 if identity else skew(t3))
            mv[off + BODY_SIZE : off + SIZE] = mac(mv[off : off + BODY_SIZE])
            try:
                sendto(mv[off : off + SIZE], addr)
                sent += 1
            except OSError:
                errors += 1
        self.stats["echoes_sent"] += sent
        if errors:
            self.stats["echo_send_errors"] += errors

    def _on_tx_timestamps(self, n: int) -> None:
        b = self._errb
        ident, ts, kind = timestamping.tx_meta_batch(b, n)
        rows = np.flatnonzero((ident >= 0) & (ts != 0))
        if not len(rows):
            return
        whole = len(rows) == n
        if not whole:
            ident, ts, kind = ident[rows], ts[rows], kind[rows]
        by_counter = self._tx_ids[self._port_of[_index(rows)], ident & (RING - 1)]  # >= 0
        # The looped-back packet ends with the probe: its seq says which one it was.
        length = b.lengths(n)[_index(rows)]
        first = int(length[0])
        if whole and first >= SIZE and (length == first).all():
            # the usual batch: every packet looped back with the same headers, so the
            # probe sits at the same offset in every slot (strided views, no copies)
            off = first - SIZE
            magic = np.ndarray((n,), "<u4", b.data, off, (b.slot,))
            seq_pkt = np.ndarray((n,), "<u8", b.data, off + 8, (b.slot,))
            own = magic == MAGIC_U32
        else:
            length = length.astype(np.intp)
            looped = length >= SIZE
            start = rows * b.slot + np.where(looped, length - SIZE, 0)
            flat = b.data.reshape(-1)
            magic = flat[start[:, None] + _ARANGE4].copy().view("<u4").ravel()
            seq_pkt = flat[start[:, None] + _ARANGE8_SEQ].copy().view("<u8").ravel()
            own = looped & (magic == MAGIC_U32)
        resync = own & (seq_pkt != by_counter)
        if resync.any():
            self.stats["tx_counter_resync"] += int(resync.sum())
        seq = np.where(own, seq_pkt, by_counter)  # no looped packet: trust the send counter
        i = (seq % RING).astype(np.intp)
        valid = (self.r_seq[i] == seq) & (self.r_state[i] != _FAILED)
        early = valid & (ts < self.r_user[i] - 1_000_000)
        if early.any():
            self.stats["tx_timestamp_mismatch"] += int(early.sum())
            valid &= ~early
        self.r_tx[i[valid]] = ts[valid]
        self.r_kind[i[valid]] = kind[valid]

    def _on_echoes(self, rows: np.ndarray, ts: np.ndarray, kind: np.ndarray) -> None:
        pk = self._rx_pkts
        mis = pk["src"][_index(rows)] != self.me
        if mis.any():
            self._reject("misdirected", int(mis.sum()))
            rows = rows[~mis]
        p = pk[_index(rows)]
        i = (p["seq"] % RING).astype(np.intp)
        ok = (self.r_seq[i] == p["seq"]) & (self.r_dst[i] == p["dst"]) & ~self.r_echoed[i]
        ok &= self.r_state[i] != _FAILED
        if len(i) > 1:  # a duplicate inside this batch is unexpected too (first one counts)
            by_slot = np.argsort(i, kind="stable")
            s = i[by_slot]
            repeat = by_slot[1:][s[1:] == s[:-1]]
            if len(repeat):
                ok[repeat] = False
        if not ok.all():
            self._reject("unexpected_echo", len(ok) - int(ok.sum()))
            rows, p, i = rows[ok], p[ok], i[ok]
        t4 = self.clock.skew_array(ts[rows])
        t1_raw = np.where(self.r_tx[i] != 0, self.r_tx[i], self.r_user[i])
        t1 = self.clock.skew_array(t1_raw)
        stale = t4 - t1 > self.max_age_ns
        if stale.any():
            self._reject("stale", int(stale.sum()))
            keep = ~stale
            rows, p, i, t4, t1 = rows[keep], p[keep], i[keep], t4[keep], t1[keep]
        if not len(rows):
            return
        self.r_echoed[i] = True
        self._learn_qpns(p["dst"], p["qpn"])  # the echoer's
        out = np.zeros(len(rows), records.ECHO)
        out["seq"] = p["seq"]
        out["src"] = self.me
        out["dst"] = p["dst"]
        out["sport"] = self.r_sport[i]
        out["ts_kind"] = np.minimum(np.minimum(kind[rows], self.r_kind[i]), p["ts_kind"])
        out["t1_ns"] = t1
        out["t2_ns"] = p["t2_ns"]
        out["t3_ns"] = p["t3_ns"]
        out["t4_ns"] = t4
        self.buffers["echo"].extend(out)
        self.stats["echoes_received"] += len(rows)

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
