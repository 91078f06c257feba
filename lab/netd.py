"""The lab hosts' network manager: put a host's routes back when its interface returns.

On a real host, ``systemd-networkd`` (or ifupdown's hooks, or NetworkManager) re-applies
an interface's static routes when it comes back up; the kernel itself deletes them when
the interface goes administratively down and never re-adds them. Leaves and spines have
FRR for that; the lab's hosts have this: one process per lab, in the root namespace,
listening for link events in every host namespace (one netlink socket each, no polling),
so a plain ``ip -n <lab>-h1-1 link set bk0 down`` and ``up`` heals by itself.

Run by ``clockmesh lab up`` (recorded by PID, stopped by ``lab down``)::

    python -m lab.netd /path/to/topology.json

It exits by itself when the lab's namespaces are gone.
"""

from __future__ import annotations

import argparse
import contextlib
import select
import signal
import socket
import sys
import time
from pathlib import Path

from pyroute2 import netns

from lab.processes import NETNS_DIR
from lab.routes import host_routes, restore_host_routes
from lab.topology import load

RTMGRP_LINK = 0x1
BACKSTOP_S = 2.0  # re-check every host this often anyway (a missed event costs ≤ 2 s)


def serve(topology_file: Path) -> int:
    topo = load(topology_file)
    namespaces = sorted(host_routes(topo))
    socks: dict[socket.socket, str] = {}
    for ns in namespaces:
        sock = netns.create_socket(ns, socket.AF_NETLINK, socket.SOCK_RAW, 0)
        sock.bind((0, RTMGRP_LINK))
        sock.setblocking(False)
        socks[sock] = ns
    stop = False

    def _term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    print(f"netd: watching {len(namespaces)} hosts of {topology_file}", flush=True)
    last_sweep = 0.0
    while not stop:
        if not all((NETNS_DIR / ns).exists() for ns in namespaces):
            print("netd: the lab's namespaces are gone; exiting", flush=True)
            return 0
        try:
            ready, _, _ = select.select(list(socks), [], [], BACKSTOP_S)
        except InterruptedError:
            continue
        dirty = set()
        for sock in ready:
            with contextlib.suppress(BlockingIOError, OSError):
                while sock.recv(65536):
                    dirty.add(socks[sock])
        now = time.monotonic()
        if now - last_sweep >= BACKSTOP_S:
            dirty = set(namespaces)
            last_sweep = now
        for ns in sorted(dirty):
            try:
                added = restore_host_routes(topo, {ns})
            except Exception as exc:  # a namespace going away under us: the check above exits
                print(f"netd: {ns}: {exc}", flush=True)
                continue
            if added:
                print(f"netd: {ns}: re-added {added} route(s)", flush=True)
    for sock in socks:
        sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.netd",
        description="Re-apply lab hosts' static routes when their interfaces come back up.",
    )
    parser.add_argument("topology", type=Path, help="the lab's topology.json")
    args = parser.parse_args(argv)
    if not args.topology.is_file():
        print(f"netd: {args.topology}: no such topology file", file=sys.stderr)
        return 2
    return serve(args.topology)


if __name__ == "__main__":
    sys.exit(main())
