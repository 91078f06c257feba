"""Sequenced UDP flows between lab hosts, to see exactly what the fabric delivers.

A :class:`Mesh` sends one small datagram per flow every ``interval_s`` from a thread,
each flow being (source host, destination host, source port): the leaf hashes the
5-tuple, so several source ports per pair spread a pair's traffic over every spine.
Receivers record arrivals by sequence number; :meth:`Mesh.lost` then answers "which
packets sent in this time window never arrived", per flow.

Sockets are opened inside the hosts' namespaces (:func:`pyroute2.netns.create_socket`),
so no process is started per host and nothing outlives :meth:`Mesh.stop`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from pyroute2 import netns

from lab.topology import Host, Topology

DPORT = 5599
_PKT = struct.Struct("!IId")  # flow id, sequence number, send time (monotonic)


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    sport: int

    def __str__(self) -> str:
        return f"{self.src}->{self.dst}:{self.sport}"


@dataclass
class _FlowLog:
    sent: list[float] = field(default_factory=list)  # send time by sequence number
    received: set[int] = field(default_factory=set)


class Mesh:
    """Flows from every host to every host in another rack, ``ports`` source ports each."""

    def __init__(
        self,
        topo: Topology,
        ports: int = 4,
        interval_s: float = 0.01,
        base_port: int = 44000,
        hosts: list[Host] | None = None,
    ) -> None:
        chosen = hosts if hosts is not None else list(topo.hosts)
        self.interval_s = interval_s
        self.flows = [
            Flow(s.name, d.name, base_port + i)
            for s in chosen
            for d in chosen
            if s.rack != d.rack
            for i in range(ports)
        ]
        self._hosts = {h.name: h for h in chosen}
        self._logs = [_FlowLog() for _ in self.flows]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rx_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tx: list[tuple[int, socket.socket, tuple[str, int]]] = []
        self._rx: list[socket.socket] = []

    def __enter__(self) -> Mesh:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        try:
            for name in sorted({f.dst for f in self.flows}):
                h = self._hosts[name]
                rx = netns.create_socket(h.namespace, socket.AF_INET, socket.SOCK_DGRAM)
                rx.bind((h.backend_address, DPORT))
                rx.setblocking(False)
                self._rx.append(rx)
            # One socket per (source host, source port), sending to each destination.
            bound: dict[tuple[str, int], socket.socket] = {}
            for i, f in enumerate(self.flows):
                s, d = self._hosts[f.src], self._hosts[f.dst]
                tx = bound.get((f.src, f.sport))
                if tx is None:
                    tx = netns.create_socket(s.namespace, socket.AF_INET, socket.SOCK_DGRAM)
                    tx.bind((s.backend_address, f.sport))
                    tx.setblocking(False)
                    bound[(f.src, f.sport)] = tx
                self._tx.append((i, tx, (d.backend_address, DPORT)))
        except BaseException:
            self._close()
            raise
        self._threads = [
            threading.Thread(target=self._receive, name="mesh-rx", daemon=True),
            threading.Thread(target=self._send, name="mesh-tx", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def stop(self, drain_s: float = 0.3) -> None:
        """Stop sending, give packets in flight ``drain_s`` to arrive, close every socket."""
        if self._threads:
            self._stop.set()
            self._threads[1].join()
            time.sleep(drain_s)
            self._rx_stop.set()
            self._threads[0].join()
            self._threads = []
        self._close()

    def _close(self) -> None:
        for _, tx, _ in self._tx:
            tx.close()  # closing a shared socket twice is harmless
        for rx in self._rx:
            rx.close()
        self._tx, self._rx = [], []

    def _send(self) -> None:
        seq = 0
        next_t = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                for i, _, _ in self._tx:
                    self._logs[i].sent.append(now)
            for i, tx, addr in self._tx:
                # An unreachable destination (no route yet) counts as sent and lost.
                with contextlib.suppress(OSError):
                    tx.sendto(_PKT.pack(i, seq, now), addr)
            seq += 1
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_t = time.monotonic()

    def _receive(self) -> None:
        while not self._rx_stop.is_set():
            ready, _, _ = select.select(self._rx, [], [], 0.05)
            for rx in ready:
                while True:
                    try:
                        data = rx.recv(64)
                    except (BlockingIOError, OSError):
                        break
                    if len(data) != _PKT.size:
                        continue
                    i, seq, _ = _PKT.unpack(data)
                    if 0 <= i < len(self._logs):
                        with self._lock:
                            self._logs[i].received.add(seq)

    def lost(self, since: float, until: float) -> dict[Flow, int]:
        """Packets sent in [since, until) (monotonic clock) that never arrived, per flow."""
        out: dict[Flow, int] = {}
        with self._lock:
            for f, log in zip(self.flows, self._logs, strict=True):
                n = sum(
                    1
                    for seq, t in enumerate(log.sent)
                    if since <= t < until and seq not in log.received
                )
                if n:
                    out[f] = n
        return out

    def sent(self, since: float, until: float) -> int:
        """Packets sent in [since, until) over all flows."""
        with self._lock:
            return sum(sum(1 for t in log.sent if since <= t < until) for log in self._logs)

    def last_loss(self, since: float, until: float) -> float | None:
        """Send time of the last packet lost in [since, until), or None if none was."""
        last: float | None = None
        with self._lock:
            for log in self._logs:
                for seq, t in enumerate(log.sent):
                    if since <= t < until and seq not in log.received:
                        last = t if last is None or t > last else last
        return last
