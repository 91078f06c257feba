from __future__ import annotations

from collector.buddies import choose
from collector.config import Peer


def _peers(n: int) -> list[Peer]:
    return [Peer(name=f"h{i:02d}", address=f"198.18.0.{i}", rack=f"r{i // 4}") for i in range(n)]


def test_own_rack_plus_k_stable_others() -> None:
    peers = _peers(16)
    chosen = choose("h05", "r1", peers, 3)
    names = [p.name for p in chosen]
    assert names[:3] == ["h04", "h06", "h07"]  # own rack, without self
    assert len(names) == 6 and "h05" not in names
    assert choose("h05", "r1", list(reversed(peers)), 3) == chosen  # order-independent
    # Adding a host changes at most one of the K others.
    more = choose("h05", "r1", [*peers, Peer(name="h99", address="198.18.0.99", rack="r9")], 3)
    assert len(set(p.name for p in more[3:]) - set(names[3:])) <= 1
