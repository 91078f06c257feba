"""`lab drop`: a switch silently discards part of what it forwards while its links and BGP
sessions stay up — no ICMP, no error on the sender's socket — and `lab heal` removes it."""

from __future__ import annotations

import socket
import time
from collections import Counter

import pytest
from pyroute2 import netns

from lab import faults, frr
from lab.fabric import Lab, LabError

pytestmark = [pytest.mark.root, pytest.mark.lab]

IP_RECVERR = 11  # linux/in.h; not exported by Python's socket module
PORTS = range(46000, 46128)


def _send(lab: Lab, src: str, dst: str, ttl: int = 64) -> tuple[set[int], int, Counter[str]]:
    """One datagram per source port in PORTS from src to dst: (ports delivered, socket
    errors the sender saw, ICMP answers by the router that sent them)."""
    topo = lab.topology
    s, d = topo.host(src), topo.host(dst)
    rx = netns.create_socket(d.namespace, socket.AF_INET, socket.SOCK_DGRAM)
    icmp = netns.create_socket(s.namespace, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    rx.bind((d.backend_address, 9998))
    rx.settimeout(0.5)
    icmp.settimeout(0.3)
    errors = 0
    try:
        for sport in PORTS:
            tx = netns.create_socket(s.namespace, socket.AF_INET, socket.SOCK_DGRAM)
            try:
                tx.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
                tx.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
                tx.bind((s.backend_address, sport))
                tx.sendto(str(sport).encode(), (d.backend_address, 9998))
                time.sleep(0.003)
                try:
                    tx.recvmsg(512, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                    errors += 1
                except BlockingIOError:
                    pass
            finally:
                tx.close()
        got: set[int] = set()
        try:
            while True:
                got.add(int(rx.recv(64)))
        except TimeoutError:
            pass
        answers: Counter[str] = Counter()
        try:
            while True:
                pkt = icmp.recv(2048)
                answers[socket.inet_ntoa(pkt[12:16])] += 1
        except TimeoutError:
            pass
        return got, errors, answers
    finally:
        rx.close()
        icmp.close()


def test_a_spine_drops_one_host_and_a_share_of_flows_silently_and_heal_undoes_it(
    small_lab: Lab,
) -> None:
    lab = small_lab
    topo = lab.topology
    src = next(h for h in topo.hosts if h.rack == "leaf1").name
    dst = next(h for h in topo.hosts if h.rack == "leaf2").name
    spine = topo.spines[1]
    via = {lk.b.node: lk.b.address for lk in topo.links
           if lk.kind == "fabric" and lk.a.node == "leaf1"}  # fmt: skip
    before, errors, _ = _send(lab, src, dst)
    assert before == set(PORTS) and errors == 0
    try:
        faults.drop(lab, spine.name, [dst])
        got, errors, answers = _send(lab, src, dst)
        assert 0.2 < len(got) / len(PORTS) < 0.8, len(got)  # the other spine's half arrives
        assert errors == 0 and not answers, (errors, answers)  # silent: no ICMP at all
        # traced (TTL 2): the blackholed flows get no answer from the spine either
        _, _, traced = _send(lab, src, dst, ttl=2)
        assert traced[via[topo.spines[0].name]] == len(got) and not traced[via[spine.name]]
        sessions = [s for r in topo.spines for s in frr.sessions(lab.name, topo, r)]
        assert sessions and all(s.up for s in sessions), sessions
        with pytest.raises(LabError, match="already"):
            faults.drop(lab, spine.name, [], 0.5)
            faults.drop(lab, spine.name, [], 0.5)
        faults.heal(lab)
        assert _send(lab, src, dst)[0] == set(PORTS)
        faults.drop(lab, spine.name, [], 0.5)  # half the flows of everything it forwards
        got, errors, answers = _send(lab, src, dst)
        lost = set(PORTS) - got
        assert 0.1 < len(lost) / len(PORTS) < 0.45, len(lost)  # ~half of its ~half
        assert errors == 0 and not answers
        assert _send(lab, src, dst)[0] == got  # the same flows each time: a hash, not chance
        _, _, traced = _send(lab, src, dst, ttl=2)  # answered before the forward hook
        assert sum(traced.values()) == len(PORTS), traced
    finally:
        res = faults.heal(lab)
    assert res["drops_removed"] >= 1
    assert _send(lab, src, dst)[0] == set(PORTS)
    assert not lab.state.read().get("faults")


def test_a_spine_port_loses_a_share_of_its_packets_at_random_and_heal_mends_it(
    small_lab: Lab,
) -> None:
    """`lab drop SPINE --toward LEAF --packets SHARE`: a bad optic. Every flow through the
    port loses some, by chance (not the same flows each time, as a hashed share); no ICMP,
    no socket error, BGP up; `lab heal` mends it."""
    lab = small_lab
    topo = lab.topology
    src = next(h for h in topo.hosts if h.rack == "leaf1").name
    dst = next(h for h in topo.hosts if h.rack == "leaf2").name
    spine = topo.spines[1]
    with pytest.raises(LabError, match=r"--toward: spine2 has no port to 'h1-1' \(its "):
        faults.lossy_port(lab, spine.name, "h1-1", 0.5)
    try:
        faults.lossy_port(lab, spine.name, "leaf2", 0.5)
        runs = []
        for _ in range(2):
            got, errors, answers = _send(lab, src, dst)
            assert errors == 0 and not answers, (errors, answers)
            runs.append(set(PORTS) - got)
        for lost in runs:  # half of the half that crosses spine2
            assert 0.08 < len(lost) / len(PORTS) < 0.45, len(lost)
        assert runs[0] != runs[1]  # chance, not a hash of the flow
        sessions = [s for r in topo.spines for s in frr.sessions(lab.name, topo, r)]
        assert sessions and all(s.up for s in sessions), sessions
        with pytest.raises(LabError, match="already"):
            faults.lossy_port(lab, spine.name, "leaf1", 0.1)
    finally:
        res = faults.heal(lab)
    assert res["drops_removed"] == 1
    assert _send(lab, src, dst)[0] == set(PORTS)
    assert not lab.state.read().get("faults")
