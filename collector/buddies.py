"""Who a collector probes: every host of its own rack plus K others, chosen stably.

The K others are the peers with the smallest BLAKE2b(host + "|" + peer) — the
same answer on every start, independent of the order of ``peers`` in the
config, and adding or removing one host changes at most one buddy.
"""

from __future__ import annotations

import hashlib

from collector.config import Peer


def _rank(host: str, peer: str) -> bytes:
    return hashlib.blake2b(f"{host}|{peer}".encode(), digest_size=8).digest()


def choose(host: str, rack: str, peers: list[Peer], k: int) -> list[Peer]:
    """Buddies of ``host``: own rack (when ``rack`` is set) first, then K stable others."""
    others = [p for p in peers if p.name != host]
    same = [p for p in others if rack and p.rack == rack]
    rest = [p for p in others if not (rack and p.rack == rack)]
    rest.sort(key=lambda p: _rank(host, p.name))
    return sorted(same, key=lambda p: p.name) + rest[:k]
