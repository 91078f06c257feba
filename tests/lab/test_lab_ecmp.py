"""ECMP hashing, link flaps and congestion on a real namespace fabric."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time

import pytest
from pyroute2 import netns

from lab import faults
from lab.fabric import Lab
from lab.status import link_states
from lab.topology import LinkEnd

pytestmark = [pytest.mark.root, pytest.mark.lab]

BURST = 20


def _sock(namespace: str, addr: str, port: int) -> socket.socket:
    sock = netns.create_socket(namespace, socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((addr, port))
    return sock


def _send(lab: Lab, src: str, dst: str, sport: int, n: int = BURST, dport: int = 5555) -> None:
    topo = lab.topology
    s, d = topo.host(src), topo.host(dst)
    sock = _sock(s.namespace, s.backend_address, sport)
    try:
        for _ in range(n):
            with contextlib.suppress(OSError):
                sock.sendto(b"ecmp-test", (d.backend_address, dport))
    finally:
        sock.close()
    time.sleep(0.05)


def _drain(sock: socket.socket) -> int:
    sock.setblocking(False)
    got = 0
    while True:
        try:
            sock.recv(2048)
            got += 1
        except BlockingIOError:
            return got


def _uplinks(lab: Lab, leaf: str) -> dict[str, LinkEnd]:
    return {
        lk.b.node: lk.a for lk in lab.topology.links if lk.kind == "fabric" and lk.a.node == leaf
    }


def _counts(ends: dict[str, LinkEnd]) -> dict[str, int]:
    return {name: faults.tx_packets(end) for name, end in ends.items()}


def _spine_for(lab: Lab, sport: int) -> str:
    ups = _uplinks(lab, "leaf1")
    before = _counts(ups)
    _send(lab, "h1-1", "h2-1", sport)
    after = _counts(ups)
    delta = {s: after[s] - before[s] for s in ups}
    carried = [s for s, d in delta.items() if d >= BURST]
    assert len(carried) == 1, f"sport {sport}: burst split or lost: {delta}"
    assert all(d < BURST for s, d in delta.items() if s != carried[0])
    return carried[0]


def test_source_ports_spread_over_spines_and_stick(small_lab: Lab) -> None:
    chosen = {sport: _spine_for(small_lab, sport) for sport in range(43000, 43024)}
    assert set(chosen.values()) == {"spine1", "spine2"}, chosen
    for sport in list(chosen)[:6]:
        assert _spine_for(small_lab, sport) == chosen[sport]


def _wait(pred, timeout: float, step: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def test_lab_flap_reroutes_both_directions_and_recovers(small_lab: Lab) -> None:
    """``lab flap`` takes leaf1's port down; BGP moves both directions onto spine1."""
    topo = small_lab.topology
    link = topo.link("leaf1-spine2")
    h11, h21 = topo.host("h1-1"), topo.host("h2-1")
    # Source ports that hash onto spine2 for *this* destination port (the hash is L4).
    fwd = faults.find_source_port(topo, h11, h21, link, link.a, dport=5555)
    rev_link = topo.link("leaf2-spine2")
    rev = faults.find_source_port(topo, h21, h11, rev_link, rev_link.a, dport=5555)
    rx_h21 = _sock(h21.namespace, h21.backend_address, 5555)
    rx_h11 = _sock(h11.namespace, h11.backend_address, 5555)
    ups1, ups2 = _uplinks(small_lab, "leaf1"), _uplinks(small_lab, "leaf2")
    present = set(small_lab._namespaces())
    try:
        _drain(rx_h21), _drain(rx_h11)
        # Held down long enough to measure both directions, even on a loaded CI machine.
        pid = faults.flap_background(small_lab, "leaf1-spine2", 10.0, 0.5, 1)
        assert _wait(
            lambda: not {s.name: s for s in link_states(topo, present)}["leaf1-spine2"].up, 5
        )
        routing = small_lab.wait_converged(timeout=2.0)
        assert routing.converged, routing.problems
        groups = {(g.router, g.rack): g for g in routing.groups}
        assert groups[("leaf1", "leaf2")].have == ("spine1",)
        assert groups[("leaf2", "leaf1")].have == ("spine1",)  # spine2 withdrew rack 1
        # forward: leaf1 rehashes onto spine1; delivered.
        before = _counts(ups1)
        _send(small_lab, "h1-1", "h2-1", fwd)
        after = _counts(ups1)
        assert after["spine2"] == before["spine2"]
        assert after["spine1"] - before["spine1"] >= BURST
        assert _drain(rx_h21) == BURST
        # reverse: leaf2 learnt from BGP that spine2 no longer reaches rack 1; delivered.
        before2 = _counts(ups2)
        _send(small_lab, "h2-1", "h1-1", rev)
        after2 = _counts(ups2)
        assert after2["spine2"] - before2["spine2"] < BURST
        assert after2["spine1"] - before2["spine1"] >= BURST
        assert _drain(rx_h11) == BURST
        st = {s.name: s for s in link_states(topo, present)}
        assert not st["leaf1-spine2"].up, "the flap ended before the reverse burst was measured"
        # after the flap the link is up again and both flows use spine2 once more
        assert _wait(
            lambda: not any(f.get("pid") == pid for f in small_lab.state.read().get("faults", [])),
            20,
        )
        routing = small_lab.wait_converged(timeout=10.0)
        assert routing.converged, routing.problems
        before = _counts(ups1)
        _send(small_lab, "h1-1", "h2-1", fwd)
        assert _counts(ups1)["spine2"] - before["spine2"] >= BURST
        assert _drain(rx_h21) == BURST
        before2 = _counts(ups2)
        _send(small_lab, "h2-1", "h1-1", rev)
        assert _counts(ups2)["spine2"] - before2["spine2"] >= BURST
        assert _drain(rx_h11) == BURST
    finally:
        rx_h21.close()
        rx_h11.close()
        faults.heal(small_lab)
        small_lab.wait_converged(timeout=10.0)


def test_congest_shapes_the_link_and_heal_removes_it(small_lab: Lab) -> None:
    topo = small_lab.topology
    try:
        recs = faults.congest(small_lab, "leaf2-spine1", "5mbit", "a2b")
        assert len(recs) == 1
        rec = recs[0]
        end = topo.link("leaf2-spine1").a
        time.sleep(1.0)
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                end.namespace,
                "tc",
                "-s",
                "qdisc",
                "show",
                "dev",
                end.interface,
            ],
            capture_output=True,
            text=True,
        ).stdout
        assert "tbf" in out and "rate 5Mbit" in out
        dropped = int(out.split("dropped ")[1].split(",")[0])
        assert dropped > 0, out  # the load really hashed onto this link and overflowed it
        assert faults.tx_packets(end) > 0
        st = small_lab.status()
        assert any(f["kind"] == "congest" and f["alive"] for f in st.faults)
    finally:
        res = faults.heal(small_lab)
    assert res["stopped"] == 1 and res["qdiscs_removed"] == 1
    st = small_lab.status()
    assert st.faults == [] and not any(lk.qdisc for lk in st.links)
    from lab import processes

    assert not processes.alive(rec)


def test_congest_says_the_queue_it_holds_and_raises_a_buffer_under_two_frames(
    small_lab: Lab,
) -> None:
    from click.testing import CliRunner

    from lab.cli import lab

    args = ["congest", "--name", small_lab.name, "--state-dir", str(small_lab.dir)]
    try:
        # 100 µs at 50 Mbit/s is 625 bytes, under one full frame: tbf gets two (484 µs)
        res = CliRunner().invoke(lab, [*args, "leaf2-spine1", "--rate", "50mbit",
                                       "--buffer", "100us"])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "tbf 50mbit" in res.output, res.output
        assert "queue 484 µs (raised to the least: 2 full frames)" in res.output, res.output
        end = small_lab.topology.link("leaf2-spine1").a
        out = subprocess.run(
            ["ip", "netns", "exec", end.namespace, "tc", "qdisc", "show", "dev", end.interface],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "limit 3028b" in out, out
        faults.heal(small_lab)
        res = CliRunner().invoke(lab, [*args, "leaf2-spine1", "--rate", "50mbit",
                                       "--buffer", "1ms"])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "queue 1000 µs, load" in res.output, res.output
    finally:
        faults.heal(small_lab)


def test_cli_help_everywhere() -> None:
    from click.testing import CliRunner

    from lab.cli import lab

    runner = CliRunner()
    assert runner.invoke(lab, ["--help"]).exit_code == 0
    for sub in ("up", "down", "status", "exec", "inventory", "flap", "congest", "heal"):
        res = runner.invoke(lab, [sub, "--help"])
        assert res.exit_code == 0 and "Usage" in res.output, sub
