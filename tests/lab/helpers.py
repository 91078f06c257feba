"""Small helpers the lab tests share, and the one way they start an ops box and a fleet."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lab import fleet


def wait_for(
    pred: Callable[[], Any],
    timeout: float,
    what: str,
    every: float = 0.1,
    detail: Callable[[], Any] | None = None,
) -> Any:
    """``pred()``'s first truthy value within ``timeout`` seconds, else AssertionError
    (with ``detail()``, what stood in the way, when given: a timeout alone says nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    said = f"; {detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout}s: {what}{said}")


def spine_for(lab: Any, src: str, dst: str, sport: int, dport: int | None = None) -> str:
    """The spine the source's leaf hashes the UDP flow src:sport -> dst:dport onto
    (``ip route get`` with the flow's ports: the kernel's own multipath hash)."""
    topo = lab.topology
    by = {h.name: h for h in topo.hosts}
    access = next(lk for lk in topo.links if lk.kind == "access" and lk.a.node == src)
    leaf = access.b
    out = subprocess.run(
        ["ip", "netns", "exec", leaf.namespace, "ip", "route", "get", by[dst].backend_address,
         "from", by[src].backend_address, "iif", leaf.interface, "ipproto", "udp",
         "sport", str(sport), "dport", str(sport if dport is None else dport)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    dev = out.split(" dev ", 1)[1].split()[0]
    return str(
        next(
            lk.b.node
            for lk in topo.links
            if lk.kind == "fabric" and lk.a.node == leaf.node and lk.a.interface == dev
        )
    )


def routes_over(lab: Any, link: Any) -> bool:
    """Does the fabric route over this leaf–spine link (ground truth, from the lab's own
    FIBs, read with ``ip route``: ~10 ms a read)? Its leaf reaches another rack through its
    spine, or another leaf reaches its rack through that spine."""
    topo = lab.topology
    leaves = {r.name: r for r in topo.leaves}
    leaf = leaves[link.a.node]

    def via(namespace: str, prefix: str, gateway: str) -> bool:
        out = subprocess.run(["ip", "-n", namespace, "-4", "route", "show", prefix],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return any(
            f"via {gateway} " in line and "linkdown" not in line and "dead" not in line
            for line in out.splitlines()
        )

    others = [r for r in topo.leaves if r is not leaf]
    if any(via(leaf.namespace, r.subnet or "", link.b.address) for r in others):
        return True
    return any(
        via(leaves[lk.a.node].namespace, leaf.subnet or "", lk.b.address)
        for lk in topo.links
        if lk.kind == "fabric" and lk.b.node == link.b.node and lk.a.node != leaf.name
    )


@contextlib.contextmanager
def opsbox_fleet(
    lab: Any,
    base: Path,
    *,
    probe: dict[str, Any] | None = None,
    ship_timeout_s: float = 30.0,
    **opsbox: Any,
) -> Iterator[dict[str, Any]]:
    """An ops box beside ``lab`` (the real ``clockmesh ingest run`` on its management
    bridge, store in ``base/store``; ``opsbox``: its config, e.g. ``detect_clear_s``) and a
    collector in every host (config and spool under ``base/hosts``; ``probe``: their probe
    settings) shipping to it under a fresh fleet key. Yields once every host has shipped
    (within ``ship_timeout_s``) ``{"lab", "url", "live", "store", "hosts"}`` (``live()``:
    the daemon's ``/v1/live``); stops the collectors, then the ops box, on the way out,
    also on failure."""
    key = secrets.token_hex(16).encode()
    box = None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        box, url = fleet.start_opsbox(lab, base, key, **opsbox)
        procs = fleet.start(lab, base / "hosts", key, url, probe)

        def live() -> dict[str, Any]:
            with urllib.request.urlopen(url + "/v1/live", timeout=10) as resp:
                return dict(json.load(resp))

        n = len(lab.topology.hosts)
        wait_for(lambda: len(live()["hosts"]) == n, ship_timeout_s, "every host shipping")
        # "procs": host -> its collector process (a test that restarts one puts the new
        # process here: it is stopped on the way out with the rest)
        yield {"lab": lab, "url": url, "live": live, "store": base / "store",
               "hosts": base / "hosts", "procs": procs}  # fmt: skip
    finally:
        fleet.stop(procs)
        fleet.stop_opsbox(box)
