"""Small helpers the lab tests share."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """``pred()``'s first truthy value within ``timeout`` seconds, else AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s: {what}")


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
