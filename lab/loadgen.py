"""A paced UDP load generator (``python -m lab.loadgen``), started inside a lab namespace.

``lab congest`` runs one per congested direction, with a fixed source port chosen so
the fabric's L4 ECMP hash puts the flow on the congested link. It sends until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import time


def run(src: str, sport: int, dst: str, dport: int, pps: float, size: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((src, sport))
    sock.setblocking(False)
    payload = b"clockmesh-lab-load".ljust(size, b"\0")
    batch = max(1, int(pps / 1000))  # one batch per millisecond
    interval = batch / pps
    next_send = time.monotonic()
    while True:
        for _ in range(batch):
            # A full queue or an ICMP error (link down) is exactly what we cause.
            with contextlib.suppress(OSError):
                sock.sendto(payload, (dst, dport))
        next_send += interval
        delay = next_send - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:
            next_send = time.monotonic()  # fell behind (CPU busy): do not burst to catch up


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.loadgen", description=__doc__)
    parser.add_argument("--src", required=True, help="source address to bind")
    parser.add_argument("--sport", type=int, required=True)
    parser.add_argument("--dst", required=True)
    parser.add_argument("--dport", type=int, default=9)
    parser.add_argument("--pps", type=float, required=True, help="packets per second")
    parser.add_argument("--size", type=int, default=1400, help="UDP payload bytes")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        run(args.src, args.sport, args.dst, args.dport, args.pps, args.size)


if __name__ == "__main__":
    main()
