"""Path tracing: which spine each probed 5-tuple crosses, and when that changes.

Every ``probe.trace_interval_s`` one TTL-limited trace probe goes out per (buddy in
another rack, source port) on the probe mesh's own source-port sockets, so it takes the
ECMP path of that 5-tuple's probes; the router at hop ``probe.trace_ttl`` (the spine)
answers with ICMP time exceeded on a raw ICMP socket, and each answer becomes a
``path_hop`` row timed by the trace's send. Between rounds the *watch* traces, every
``probe.watch_interval_s``, the 5-tuples that tell an outage's ends (see
:meth:`PathTracer.watched`). A 5-tuple seen on another router than last time sets
``path_changed`` (the agent ships at once) and re-traces every path (at most once per
``RETRACE_S``).
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import time
from collections import Counter

from collector import records, timestamping
from collector.config import CollectorConfig, Peer
from collector.lab_clock import RecordingClock
from collector.record_buffer import RecordBuffer

log = logging.getLogger("clockmesh.collector.probe")
# A trace probe: magic, destination host_id, send time (raw ns). Not a probe: the router
# whose hop it is answers it, and it never reaches a collector (other racks only).
_TRACE = struct.Struct("<4sqq")
TRACE_MAGIC = b"CMTR"
TRACE_SIZE = _TRACE.size
TRACE_MAGIC_U32 = int.from_bytes(TRACE_MAGIC, "little")  # as a probe's ``magic`` field reads it
RETRACE_S = 0.5  # a path change re-traces every path at once, at most this often
MOVED_WATCH_S = 120.0  # a moved 5-tuple is watched this long at most (then: the rounds)
TRACE_AGE_NS = 10_000_000_000  # an answer's send time older than this is not believed
# Per packet: the TTL, and no TX timestamp (the socket's timestamp counter must count
# probes only; a trace would shift every probe's identity after it).
_NO_TIMESTAMP = struct.pack("i", 0)


class PathTracer:
    """Trace rounds, the watch, and the answers of one collector's path traces.

    It sends on the mesh's source-port sockets (``socks``, set by the mesh once open)
    and counts in the mesh's ``stats``, so its counters ship with the probes' health."""

    def __init__(
        self,
        cfg: CollectorConfig,
        clock: RecordingClock,
        buffers: dict[str, RecordBuffer],
        stats: Counter[str],
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.buffers = buffers
        self.stats = stats
        self.me = records.host_id(cfg.host)
        self.port = cfg.backend.probe_port
        self.socks: list[socket.socket] = []  # the mesh's source-port sockets, in port order
        self.trace_every = cfg.probe.trace_interval_s
        self.trace_ttl = cfg.probe.trace_ttl
        self.trace_note = ""
        self.icmp_sock: socket.socket | None = None
        self.next_trace = time.monotonic() + 1.0
        # Which router each traced (buddy, source port) crossed last: a change means the
        # fabric's ECMP group changed (a link went or came back). Then every path is traced
        # again at once and the answers ship without waiting for the next segment.
        self._hop_of: dict[tuple[int, int], str] = {}
        self.path_changed = False  # set by drain, taken by the agent (urgent ship)
        self._retrace_at = 0.0  # earliest next re-trace after a change
        self._retrace_due = False
        self.retraced = False  # a re-trace went out: the agent ships its answers promptly
        # The watch (every watch_interval_s): per rack traced, the 5-tuple towards it that
        # last crossed each uplink router (each rack's path through each spine: a leaf
        # drops a spine from its group towards one rack, not all, when a link at that
        # rack fails), and, while paths are away from a router, one moved 5-tuple per
        # (rack, router it left) until it crosses that router again (at most MOVED_WATCH_S).
        self.watch_every = cfg.probe.watch_interval_s if self.trace_every else 0.0
        self.next_watch = self.next_trace
        # (rack, router) -> (buddy, sport)
        self._sentinel: dict[tuple[str, str], tuple[int, int]] = {}
        self._moved: dict[tuple[str, str], tuple[int, int, float]] = {}
        self._left: dict[tuple[int, int], str] = {}  # moved 5-tuple -> the router it left
        self.set_buddies([])

    def set_buddies(self, buddies: list[Peer]) -> None:
        # Traced: buddies in other racks (in the own rack, hop 2 would be the buddy itself).
        self._trace_to = [
            (records.host_id(p.name), p.address)
            for p in buddies
            if not (p.rack and p.rack == self.cfg.rack)
        ]
        self._rack_of = {records.host_id(p.name): p.rack for p in buddies}
        self._address_of = dict(self._trace_to)

    def open(self) -> None:
        """The raw ICMP socket the answers arrive on (tracing goes off without one)."""
        if self.trace_every and self.icmp_sock is None:
            try:
                self.icmp_sock = timestamping.icmp_socket()
            except OSError as exc:  # no CAP_NET_RAW: probes go on, paths stay unknown
                self.trace_every = 0
                self.trace_note = f"path tracing off: no raw ICMP socket ({exc})"
                log.warning("event=trace_off reason=%r", str(exc))

    def close(self) -> None:
        if self.icmp_sock is not None:
            self.icmp_sock.close()
        self.icmp_sock = None
        self.socks = []

    # ---- sending --------------------------------------------------------------------
    def send_traces(self, now: float) -> None:
        """Every trace interval: one TTL-limited probe per (traced buddy, source port);
        every watch interval: the watched 5-tuples (see :meth:`watched`)."""
        if not self.trace_every or not self.socks:
            return
        if now >= self.next_trace:
            self.next_trace = now + self.trace_every
            self.stats["trace_rounds"] += 1
            if self._retrace_due:
                self._retrace_due = False
                self.retraced = True
            anc = self._trace_anc()
            for dst, address in self._trace_to:
                for sock in self.socks:
                    if not self._send_trace(sock, dst, address, anc):
                        return
            self.next_watch = now + self.watch_every  # this round traced them all
        if self.watch_every and now >= self.next_watch:
            self.next_watch = now + self.watch_every
            anc = self._trace_anc()
            base = self.cfg.probe.base_sport
            for dst, sport in self.watched(now):
                to = self._address_of.get(dst)
                i = sport - base
                if to is None or not 0 <= i < len(self.socks):
                    continue
                if not self._send_trace(self.socks[i], dst, to, anc):
                    return
                self.stats["watch_traces"] += 1

    def trace_due_at(self) -> float:
        """When the next trace (round or watch) is due, monotonic; inf when off. The watch
        counts only while it has something to watch: a host whose traces no router answers
        (or with no buddy in another rack) does not wake 5 times a second for nothing."""
        if not self.trace_every or not self.socks:
            return float("inf")
        watching = self.watch_every and (self._sentinel or self._moved)
        return min(self.next_trace, self.next_watch) if watching else self.next_trace

    def watched(self, now: float) -> list[tuple[int, int]]:
        """(buddy, sport) the watch traces: per rack, a 5-tuple towards it across each
        uplink router (the newest to cross it once the one before moved away), and one
        moved 5-tuple per (rack, router it left) until it is back (for at most
        MOVED_WATCH_S). Buddies of no known rack count as one rack."""
        for k in [k for k, (_d, _p, t) in self._moved.items() if now - t > MOVED_WATCH_S]:
            del self._moved[k]
        keys = {*self._sentinel.values(), *((d, p) for d, p, _t in self._moved.values())}
        return sorted(keys)

    def _trace_anc(self) -> list[tuple[int, int, bytes]]:
        return [
            (socket.IPPROTO_IP, timestamping.IP_TTL, struct.pack("i", self.trace_ttl)),
            (socket.SOL_SOCKET, timestamping.SO_TIMESTAMPING, _NO_TIMESTAMP),
        ]

    def _send_trace(
        self, sock: socket.socket, dst: int, address: str, anc: list[tuple[int, int, bytes]]
    ) -> bool:
        """One trace probe; False once the kernel refused tracing (then it is off)."""
        payload = _TRACE.pack(TRACE_MAGIC, dst, time.time_ns())
        try:
            sock.sendmsg([payload], anc, 0, (address, self.port))
            self.stats["traces_sent"] += 1
        except BlockingIOError:
            self.stats["trace_send_errors"] += 1
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOPROTOOPT):
                self.trace_every = 0
                self.trace_note = f"path tracing off: the kernel refused it ({exc})"
                log.warning("event=trace_off reason=%r", str(exc))
                return False
            self.stats["trace_send_errors"] += 1
        return True

    # ---- answers --------------------------------------------------------------------
    def drain(self) -> None:
        """Answers to trace probes from the raw ICMP socket: one path_hop row each, at
        the time the trace was sent (when the path was as its answer says)."""
        sock = self.icmp_sock
        if sock is None:
            return
        now = self.clock.now()
        raw = time.time_ns()
        base = self.cfg.probe.base_sport
        ports = range(base, base + len(self.socks))
        for _ in range(4096):
            try:
                packet = sock.recv(2048)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.stats["trace_recv_errors"] += 1
                return
            got = timestamping.parse_time_exceeded(packet)
            if got is None:
                continue
            router, _dst_addr, sport, dport, payload = got
            if dport != self.port or sport not in ports or len(payload) < _TRACE.size:
                continue
            magic, dst, sent = _TRACE.unpack_from(payload)
            if magic != TRACE_MAGIC:
                continue
            fresh = 0 <= raw - sent < TRACE_AGE_NS  # our own send time (else: drained now)
            self.buffers["path_hop"].append(
                self.clock.skew(sent) if fresh else now,
                self.me, dst, sport, self.trace_ttl, router.encode(), raw - sent,
            )  # fmt: skip
            self.stats["trace_answers"] += 1
            self._answered(dst, sport, router)

    def _answered(self, dst: int, sport: int, router: str) -> None:
        """Bookkeeping of one answer: the router this 5-tuple crosses now."""
        key = (dst, sport)
        before = self._hop_of.get(key)
        self._hop_of[key] = router
        rack = self._rack_of.get(dst, "")
        watching = self._sentinel.get((rack, router))
        if watching is None or self._hop_of.get(watching) != router:
            # the watch of this rack's path through the router: a 5-tuple that crosses it
            self._sentinel[(rack, router)] = key
        away = self._moved.get((rack, router))
        if away is not None and (away[0], away[1]) == key:
            del self._moved[(rack, router)]  # back across the router it had left
        if before is not None and before != router:
            if self._left.pop(key, None) != router and self.watch_every:
                self._left[key] = before  # it left this router (not: came back to one)
                self._moved.setdefault((rack, before), (dst, sport, time.monotonic()))
            self._path_moved()

    def _path_moved(self) -> None:
        """A traced 5-tuple crossed another spine than last time: ship now, and trace
        every path again at once (at most once per RETRACE_S) so the ops box sees the
        whole new picture, not one path of it."""
        if not self.path_changed:
            self.stats["path_changes"] += 1
        self.path_changed = True
        now = time.monotonic()
        if now >= self._retrace_at:
            self._retrace_at = now + RETRACE_S
            self.next_trace = now
            self._retrace_due = True
