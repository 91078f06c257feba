"""A paced UDP load generator (``python -m lab.loadgen``), started inside a lab namespace.

``lab congest`` runs one per congested direction, with a fixed source port chosen so
the fabric's L4 ECMP hash puts the flow on the congested link; ``lab bulk`` one per
spine (:func:`lab.faults.bulk`, :func:`saturate`). It sends until killed. ``--dscp 26``
puts the load in the RDMA traffic class of ``lab capacity``: it contends with the RoCE v2
jobs and the probes, as another job's traffic does.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import time
from typing import Any

CATCH_UP_S = 0.05  # a paced sender late by more than this forgets the rest
# `saturate`'s flows catch up no faster than this share of the link's capacity: every
# other link a flow crosses has that capacity too, and keeps no standing queue
CEILING_SHARE = 0.9


class Pacer:
    """When a paced sender sends, and how many: ``batch`` packets every ``batch / pps``
    seconds — one batch per 0.2 ms at most (one packet at a time below 5 kpps): a
    millisecond's packets sent at once would fill a shallow buffer, drop and leave it
    idle till the next burst, no standing queue, unlike a paced sender at the same rate.

    Late by a whole batch or more (the CPU busy elsewhere), a wake-up sends one batch
    more, never all that is owed at once, half an interval after the last (up to four
    times its rate), or late enough never to outrun ``ceiling_pps`` when given; a
    deficit older than ``CATCH_UP_S`` is forgotten. Caught up at once, a stall's frames
    leave in one burst that a shallow buffer on the way drops; not caught up at all, a
    sender on a busy machine falls short of its rate and the queue it holds drains;
    caught up faster than the links it crosses carry, it fills one it was not meant to
    (docs/lab.md, "saturate", has the runs that showed each)."""

    def __init__(self, pps: float, now: float, ceiling_pps: float | None = None) -> None:
        self.batch = max(1, int(pps / 5000))
        self.interval = self.batch / pps
        # between wake-ups that send a pair: half an interval (up to 4 × the rate) unless
        # a ceiling is given, which it never outruns
        self.pair_gap = (
            self.interval / 2 if ceiling_pps is None else 2 * self.batch / max(ceiling_pps, pps)
        )
        self.next_send = now

    def due(self, now: float) -> int:
        """Packets to send at ``now`` (a wake-up); counts them as sent."""
        self.next_send = max(self.next_send, now - CATCH_UP_S)
        n = 2 * self.batch if now - self.next_send >= self.interval else self.batch
        self.next_send += self.interval * n / self.batch
        return n

    def wait(self, now: float) -> float:
        """Seconds to sleep before the next wake-up: till the next batch is due, or,
        while behind, the gap that keeps pairs under the ceiling."""
        delay = self.next_send - now
        return delay if delay > 0 else self.pair_gap


def run(
    src: str,
    sport: int,
    dst: str,
    dport: int,
    pps: float,
    size: int,
    dscp: int = 0,
    ceiling_pps: float | None = None,
) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if dscp:  # RoCE v2's class (26) with `lab capacity`: contends with the RDMA traffic
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    sock.bind((src, sport))
    sock.setblocking(False)
    payload = b"clockmesh-lab-load".ljust(size, b"\0")
    pacer = Pacer(pps, time.monotonic(), ceiling_pps)
    while True:
        for _ in range(pacer.due(time.monotonic())):
            # A full queue or an ICMP error (link down) is exactly what we cause.
            with contextlib.suppress(OSError):
                sock.sendto(payload, (dst, dport))
        time.sleep(pacer.wait(time.monotonic()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.loadgen", description=__doc__)
    parser.add_argument("--src", required=True, help="source address to bind")
    parser.add_argument("--sport", type=int, required=True)
    parser.add_argument("--dst", required=True)
    parser.add_argument("--dport", type=int, default=9)
    parser.add_argument("--pps", type=float, required=True, help="packets per second")
    parser.add_argument("--size", type=int, default=1400, help="UDP payload bytes")
    parser.add_argument("--dscp", type=int, default=0, help="DSCP of every packet (0-63)")
    parser.add_argument(
        "--max-pps",
        type=float,
        default=None,
        help="never faster than this while catching up after a stall (default: 4 x --pps)",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        run(
            args.src, args.sport, args.dst, args.dport, args.pps, args.size, args.dscp, args.max_pps
        )


if __name__ == "__main__":
    main()


def saturate(
    lab: Any,
    link_name: str,
    direction: str,
    rate: str,
    dscp: int = 26,
    overload: float = 1.3,
) -> list[dict[str, Any]]:
    """Fill one direction of one leaf–spine link, and only that one: the sub-millisecond
    contention of a fabric with shallow buffers (``lab capacity --buffer``).

    ``a2b`` (leaf→spine): a host under the leaf sends to hosts of up to two other racks,
    each flow hashed onto the spine; ``b2a`` (spine→leaf): hosts of up to two other racks
    send to a host under the leaf (incast). Together the flows carry ``overload`` × the
    link's capacity ``rate`` while each other link they cross carries at most
    ``overload`` / 2 × (with three racks or more: 0.65, idle a third of the time), and
    catching up after a stall at most ``CEILING_SHARE`` ×: the named direction's queue
    fills to its buffer and drops beyond, no other queue stands. Every flow is recorded as a fault
    (``lab heal`` stops them); DSCP 26 puts them in the RDMA class, as another job's
    RoCE v2 traffic."""
    from lab import faults

    topo = lab.topology
    link = faults._get_link(topo, link_name)
    if link.kind != "fabric" or direction not in ("a2b", "b2a"):
        raise faults.LabError(f"{link_name}: expected a leaf–spine link and a2b or b2a")
    bps = faults.parse_rate(rate)
    leaf, spine = link.a.node, link.b.node
    local = [h for h in topo.hosts if h.rack == leaf]
    others = sorted({h.rack for h in topo.hosts if h.rack != leaf})[:2]
    if not local or not others:
        raise faults.LabError(f"{link_name}: needs hosts under {leaf} and another leaf")
    remote = [next(h for h in topo.hosts if h.rack == r) for r in others]
    flows = (
        [(local[0], r) for r in remote] if direction == "a2b" else [(r, local[0]) for r in remote]
    )
    egress = link.a if direction == "a2b" else link.b
    ports = [(s, d, faults.find_source_port(topo, s, d, link, egress)) for s, d in flows]
    share = bps * overload / len(ports)
    return [
        faults._start_load(
            lab,
            s,
            d,
            sport,
            share,
            dscp,
            ceiling_bps=CEILING_SHARE * bps,
            kind="saturate",
            link=link.name,
            direction=direction,
            rate=rate,
            spine=spine,
        )
        for s, d, sport in ports
    ]
