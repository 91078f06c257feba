"""Fault injectors: flap a link, congest a link, heal everything.

Every fault is recorded in ``state.json`` (``faults``) with the PID of the process that
keeps it going, so ``heal`` and ``down`` can stop it from another shell.

- flap: the leaf's port of the link is set administratively down, then both ends up,
  ``count`` times, as an operator's ``shutdown`` or a failing optic would. Nothing else:
  the fabric's own control plane (BGP with BFD, :mod:`lab.frr`) withdraws the dead next
  hop on both ends within a second and re-learns it when the link is back.
- congest: a ``tbf`` qdisc on the link's egress (per direction) plus a paced UDP load
  whose source port was found, by sending bursts and reading the link's packet counters,
  to hash onto that link.
- drop: a switch silently discards part of what it forwards while every link and BGP
  session stays up (a stale FIB entry, a bad line card): some destinations (a kernel
  ``blackhole`` /32 in the switch's own table, not through FRR, so BGP keeps
  advertising the rack; a blackhole sends no ICMP and answers no TTL expiry), or a share
  of the flows (nftables hashing the 5-tuple in the switch's forward hook: a dropped
  flow loses every packet, the others none; TTL expiry is answered before that hook).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from pyroute2 import IPRoute, NetlinkError, netns

from lab import capacity, processes
from lab.capacity import parse_rate
from lab.fabric import Lab, LabError
from lab.routes import restore_host_routes
from lab.status import link_states
from lab.topology import Host, Link, LinkEnd, Topology

PROBE_BURST = 64
PROBE_PORTS = range(42000, 42256)
LOAD_DPORT = 9  # discard
MAX_LOAD_PPS = 20000.0


class _Stop(Exception):
    pass


_OWNER_PID = [0]


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    # pyroute2 forks short-lived helpers (to open sockets in a namespace) and stops them
    # with SIGTERM; they inherit this handler and must just exit, not unwind our stack.
    if os.getpid() != _OWNER_PID[0]:
        os._exit(0)
    raise _Stop()


def _get_link(topo: Topology, name: str) -> Link:
    try:
        return topo.link(name)
    except KeyError:
        names = ", ".join(lk.name for lk in topo.links[:6])
        raise LabError(f"LINK: no link named {name!r} (e.g. {names}, ...)") from None


def leaf_end(link: Link) -> LinkEnd:
    """The end a flap sets down: always the leaf's port (see :func:`set_link`)."""
    return link.a if link.a.node.startswith("leaf") else link.b


def set_link(link: Link, up: bool, both: bool = False) -> None:
    """Take ``link`` down (or up) the way a cable pull looks to routing.

    Only the leaf's port is set administratively down; the far end (spine or host) sees
    its carrier go (``NO-CARRIER``). Routing reacts by itself: BGP on both ends drops the
    session at once (fast external failover, BFD as the backstop) and withdraws the path.
    Bringing it up sets both ends up (``both`` also takes both down); the sessions come
    back and the path is re-learned.
    """
    ends = (link.a, link.b) if (up or both) else (leaf_end(link),)
    for end in ends:
        with IPRoute(netns=end.namespace, flags=0) as ipr:
            found = ipr.link_lookup(ifname=end.interface)
            if not found:
                raise LabError(f"{link.name}: {end.interface} missing in {end.namespace}")
            ipr.link("set", index=found[0], state="up" if up else "down")


def tx_packets(end: LinkEnd) -> int:
    """Packets sent out of this end (its egress) so far."""
    with IPRoute(netns=end.namespace, flags=0) as ipr:
        link = ipr.get_links(ifname=end.interface)[0]
        stats = link.get_attr("IFLA_STATS64")
        return int(stats["tx_packets"])


def _remove_fault(lab: Lab, pid: int) -> None:
    with lab.state.update() as st:
        st["faults"] = [f for f in st.get("faults", []) if f.get("pid") != pid]


# ---------------------------------------------------------------------------- flap
def flap(lab: Lab, link_name: str, down_s: float, up_s: float, count: int) -> int:
    """Flap a link in the foreground. ``count`` 0 = until stopped. Returns flaps done.

    On SIGTERM/SIGINT the link is brought back up before returning.
    """
    topo = lab.topology
    link = _get_link(topo, link_name)
    me = processes.record(
        os.getpid(),
        kind="flap",
        link=link.name,
        down_s=down_s,
        up_s=up_s,
        count=count,
    )
    lab.state.add("faults", me)
    _OWNER_PID[0] = os.getpid()
    old_term = signal.signal(signal.SIGTERM, _raise_stop)
    done = 0
    try:
        while count == 0 or done < count:
            set_link(link, up=False)
            time.sleep(down_s)
            set_link(link, up=True)
            done += 1
            if count == 0 or done < count:
                time.sleep(up_s)
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, old_term)
        with contextlib.suppress(Exception):
            set_link(link, up=True)
        _remove_fault(lab, me["pid"])
    return done


def flap_background(lab: Lab, link_name: str, down_s: float, up_s: float, count: int) -> int:
    """Start ``flap`` in a detached process; return its PID once it is recorded."""
    _get_link(lab.topology, link_name)
    log = open(lab.dir / "faults.log", "ab")  # noqa: SIM115 - handed to the child
    cmd = [sys.executable, "-m", "clockmesh.cli", "lab", "flap", "--name", lab.name]
    cmd += ["--state-dir", str(lab.dir), link_name]
    cmd += ["--down", f"{down_s}s", "--up", f"{up_s}s", "--count", str(count)]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )
    log.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(f.get("pid") == proc.pid for f in lab.state.read().get("faults", [])):
            return proc.pid
        if proc.poll() is not None:
            raise LabError(
                f"flap {link_name} exited early (code {proc.returncode}); see {log.name}"
            )
        time.sleep(0.05)
    raise LabError(f"flap {link_name} did not start within 10s; see {log.name}")


# ------------------------------------------------------------------------- congest
def _tc(namespace: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True
    )


def _flow_for(topo: Topology, link: Link, direction: str) -> tuple[Host, Host, LinkEnd, bool]:
    """(source host, destination host, egress end, needs port search) for one direction."""
    egress = link.a if direction == "a2b" else link.b
    if link.kind == "access":
        host = topo.host(link.a.node)
        others = [h for h in topo.hosts if h.name != host.name]
        if not others:
            raise LabError(f"{link.name}: needs a second host to load it")
        peer = next((h for h in others if h.rack == host.rack), others[0])
        return (host, peer, egress, False) if direction == "a2b" else (peer, host, egress, False)
    leaf, spine = link.a.node, link.b.node
    local = [h for h in topo.hosts if h.rack == leaf]
    remote = [h for h in topo.hosts if h.rack != leaf]
    if not remote:
        raise LabError(f"{link.name}: needs a second leaf to send traffic over {spine}")
    if direction == "a2b":
        return local[0], remote[0], egress, len(topo.spines) > 1
    # spine -> leaf: the flow enters at the remote leaf, which must hash it onto `spine`.
    return remote[0], local[0], egress, len(topo.spines) > 1


def _siblings(topo: Topology, src: Host, egress: LinkEnd, link: Link) -> list[LinkEnd]:
    """Egress ends of the links the ECMP decision picks among (to compare counters)."""
    if link.kind == "access":
        return [egress]
    leaf = src.rack
    return [lk.a for lk in topo.links if lk.kind == "fabric" and lk.a.node == leaf]


def find_source_port(
    topo: Topology, src: Host, dst: Host, link: Link, egress: LinkEnd, dport: int = LOAD_DPORT
) -> int:
    """Send bursts from candidate source ports; keep the first whose burst crossed ``link``.

    The leaf hashes the whole 5-tuple (``fib_multipath_hash_policy=1``): the port found
    holds for this destination port only.
    """
    decision = _siblings(topo, src, egress, link)
    # For spine->leaf the choice is made at the source leaf: watch its uplink to our spine.
    watch = egress
    if link.kind == "fabric" and egress is link.b:
        watch = next(
            lk.a for lk in topo.links if lk.a.node == src.rack and lk.b.node == link.b.node
        )
    for sport in PROBE_PORTS:
        sock = netns.create_socket(src.namespace, socket.AF_INET, socket.SOCK_DGRAM)
        try:
            try:
                sock.bind((src.backend_address, sport))
            except OSError:
                continue  # port in use in that namespace
            before = {id(e): tx_packets(e) for e in decision if e is not watch}
            w0 = tx_packets(watch)
            for _ in range(PROBE_BURST):
                with contextlib.suppress(OSError):
                    sock.sendto(b"clockmesh-lab-probe", (dst.backend_address, dport))
            time.sleep(0.02)
            crossed = tx_packets(watch) - w0
            others = [tx_packets(e) - before[id(e)] for e in decision if e is not watch]
        finally:
            sock.close()
        if crossed >= PROBE_BURST and all(d < PROBE_BURST for d in others):
            return sport
    raise LabError(
        f"{link.name}: no source port in {PROBE_PORTS.start}-{PROBE_PORTS.stop - 1} hashed onto it"
    )


def congest(
    lab: Lab, link_name: str, rate: str, direction: str = "a2b", overload: float = 1.5,
    buffer_us: float | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Shape ``link`` with tbf and start load hashed onto it. Returns the fault records.
    ``buffer_us``: the queue holds that long at ``rate``, not 50 ms (a switch's shallow
    buffer the load's bursts fill and drain, dropping beyond)."""
    if buffer_us is not None and buffer_us <= 0:
        raise LabError(f"--buffer: expected a time above 0, got {buffer_us:g} µs")
    bps = parse_rate(rate)
    # tbf's queue in bytes: at least capacity's least queue of full frames
    least = capacity.MIN_QUEUE * capacity.MTU_BITS // 8
    limit = None if buffer_us is None else max(capacity.buffer_bytes(rate, buffer_us), least)
    size = ["latency", "50ms"] if limit is None else ["limit", str(limit)]  # fmt: skip
    topo = lab.topology
    link = _get_link(topo, link_name)
    directions = ["a2b", "b2a"] if direction == "both" else [direction]
    records = []
    for d in directions:
        src, dst, egress, search = _flow_for(topo, link, d)
        sport = find_source_port(topo, src, dst, link, egress) if search else PROBE_PORTS.start
        burst = max(int(bps / 8 / 250), 16 * 1514)  # bytes: one HZ tick at rate, >= 16 MTU
        res = _tc(
            egress.namespace,
            [
                *("qdisc", "replace", "dev", egress.interface, "root", "tbf"),
                *("rate", rate, "burst", str(burst), *size),
            ],
        )
        if res.returncode != 0:
            raise LabError(f"tc tbf on {egress.node}:{egress.interface}: {res.stderr.strip()}")
        rec = _start_load(
            lab, src, dst, sport, bps * overload, kind="congest", link=link.name,
            direction=d, rate=rate, node=egress.node, namespace=egress.namespace,
            interface=egress.interface, queue_us=limit and round(limit * 8 / bps * 1e6),
        )  # fmt: skip
        records.append(rec)
    return records


def _start_load(lab: Lab, src: Host, dst: Host, sport: int, bps: float, dscp: int = 0, *,
                ceiling_bps: float | None = None, **info: Any) -> dict[str, Any]:  # fmt: skip
    """A paced UDP load (``python -m lab.loadgen``, 1400-byte datagrams, best effort
    unless ``dscp``) of ``bps`` from src:sport to dst, recorded as a fault (``heal``
    stops it); catching up after a stall, never above ``ceiling_bps`` (default 4 × bps)."""
    size = 1400
    pps = min(bps / ((size + 42) * 8), MAX_LOAD_PPS)
    cmd = ["ip", "netns", "exec", src.namespace, sys.executable, "-m", "lab.loadgen"]
    cmd += ["--src", src.backend_address, "--sport", str(sport), "--dst", dst.backend_address]
    cmd += ["--dport", str(LOAD_DPORT), "--pps", f"{pps:.0f}", "--size", str(size)]
    cmd += ["--dscp", str(dscp)]
    if ceiling_bps is not None:
        cmd += ["--max-pps", f"{ceiling_bps / ((size + 42) * 8):.0f}"]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    rec = processes.record(proc.pid, **info, src=src.name, dst=dst.name, sport=sport,
                           pps=round(pps))  # fmt: skip
    lab.state.add("faults", rec)
    return rec


# ---------------------------------------------------------------------------- bulk
def bulk(
    lab: Lab, src_name: str, dst_name: str, rate: str, overload: float = 1.5, dscp: int = 0
) -> list[dict[str, Any]]:
    """Best-effort bulk traffic (DSCP 0) from ``src`` to ``dst`` over *every* spine: one
    paced UDP load per uplink of the source's leaf, each from a source port that hashes
    onto it, at ``overload`` × ``rate`` — with ``lab capacity`` at ``rate``, every path
    between the two racks has a full best-effort queue, and the RDMA class none."""
    topo = lab.topology
    by = {h.name: h for h in topo.hosts}
    if src_name not in by or dst_name not in by:
        raise LabError(f"bulk: no such lab host(s) among {src_name}, {dst_name}")
    src, dst = by[src_name], by[dst_name]
    if src.rack == dst.rack:
        raise LabError(f"bulk: {src_name} and {dst_name} share a leaf: no fabric link between")
    bps = parse_rate(rate)
    uplinks = [lk for lk in topo.links if lk.kind == "fabric" and lk.a.node == src.rack]
    # Every port first: a running load would crowd the counters the search watches.
    ports = [(link, find_source_port(topo, src, dst, link, link.a)) for link in uplinks]
    return [
        _start_load(lab, src, dst, sport, bps * overload, dscp, kind="bulk", link=link.name)
        for link, sport in ports
    ]


# ---------------------------------------------------------------------------- drop
DROP_TABLE = "clockmesh_drop"  # the nftables table a share-of-flows drop lives in
_BLACKHOLE_METRIC = "1"  # below any route FRR installs (zebra uses 20): this one forwards


def _run(namespace: str, argv: list[str], what: str, stdin: str | None = None) -> None:
    res = subprocess.run(["ip", "netns", "exec", namespace, *argv], input=stdin,
                         capture_output=True, text=True)  # fmt: skip
    if res.returncode != 0:
        raise LabError(f"{what}: {res.stderr.strip() or res.stdout.strip()}")


def _nft_rules(share: float, to: list[str], seed: int) -> str:
    """The nftables script of a share-of-flows drop (``nft -f -``): one rule in a forward
    hook, jhash over the 5-tuple (addresses, protocol, ports) mod 10000 below the share."""
    match = f"ip daddr {{ {', '.join(to)} }} " if to else ""
    cut = max(1, round(share * 10000))
    return (
        f"table ip {DROP_TABLE} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority -100; policy accept;\n"
        f"    {match}meta l4proto {{ udp, tcp }} jhash ip saddr . ip daddr . meta l4proto . "
        f"th sport . th dport mod 10000 seed {seed:#x} < {cut} counter drop\n"
        "  }\n"
        "}\n"
    )


def drop(
    lab: Lab, switch: str, to: list[str] | None = None, share: float = 1.0, seed: int = 0x5EED
) -> dict[str, Any]:
    """Make ``switch`` (a leaf or spine) silently drop what it forwards to the hosts ``to``
    (all of it: blackhole routes; a share: hashed flows), or ``share`` of all the flows
    it forwards. Links and routing stay up. Recorded as a fault; ``heal`` removes it."""
    topo = lab.topology
    routers = {r.name: r for r in (*topo.leaves, *topo.spines)}
    if switch not in routers:
        raise LabError(f"SWITCH: no leaf or spine named {switch!r} (e.g. {', '.join(routers)})")
    if not 0.0 < share <= 1.0:
        raise LabError(f"--share: expected a share of flows in (0, 1], got {share}")
    hosts = {h.name: h for h in topo.hosts}
    to = list(dict.fromkeys(to or []))
    unknown = [h for h in to if h not in hosts]
    if unknown:
        raise LabError(
            f"--to: no lab host named {unknown[0]!r} (e.g. {', '.join(list(hosts)[:4])})"
        )
    if not to and share >= 1.0:
        raise LabError("drop: give --to HOST (a destination) or --share below 1 (of the flows)")
    ns = routers[switch].namespace
    addresses = [hosts[h].backend_address for h in to]
    rec: dict[str, Any] = {"kind": "drop", "switch": switch, "namespace": ns, "to": to,
                           "addresses": addresses, "share": share}  # fmt: skip
    if share >= 1.0:
        for a in addresses:
            _run(ns, ["ip", "route", "replace", "blackhole", f"{a}/32", "metric",
                      _BLACKHOLE_METRIC], f"blackhole {a}/32 on {switch}")  # fmt: skip
        rec["how"] = "blackhole /32 in the switch's kernel table"
    else:
        if _has_drop_table(ns):
            raise LabError(f"{switch} drops a share of its flows already: `lab heal` first")
        _run(ns, ["nft", "-f", "-"], f"nft on {switch}", _nft_rules(share, addresses, seed))
        rec["how"] = f"nftables jhash of the 5-tuple, {share:.0%} of the flows"
        rec["seed"] = seed
    lab.state.add("faults", rec)
    return rec


def lossy_port(lab: Lab, switch: str, toward: str, share: float) -> dict[str, Any]:
    """Make ``switch`` (a leaf or spine) lose ``share`` of the packets it sends out its
    port to ``toward`` (its neighbour: a spine, a leaf or a host), at random — a bad optic,
    cable or port counting CRC errors: every flow through it loses some, none many in a
    row. nftables ``numgen random`` in the switch's forward hook (what it forwards; its
    own BGP and BFD are not), links and routing up. Recorded as a ``drop`` fault; ``heal``
    removes it."""
    topo = lab.topology
    routers = {r.name: r for r in (*topo.leaves, *topo.spines)}
    if switch not in routers:
        raise LabError(f"SWITCH: no leaf or spine named {switch!r} (e.g. {', '.join(routers)})")
    if not 0.0 < share < 1.0:
        raise LabError(f"--packets: expected a share of packets in (0, 1), got {share}")
    ends = [e for lk in topo.links for e, other in ((lk.a, lk.b), (lk.b, lk.a))
            if e.node == switch and other.node == toward]  # fmt: skip
    if not ends:
        near = sorted({o.node for lk in topo.links for e, o in ((lk.a, lk.b), (lk.b, lk.a))
                       if e.node == switch})  # fmt: skip
        raise LabError(f"--toward: {switch} has no port to {toward!r} (its neighbours: "
                       f"{', '.join(near)})")  # fmt: skip
    ns, port = routers[switch].namespace, ends[0].interface
    if _has_drop_table(ns):
        raise LabError(f"{switch} drops a share of its traffic already: `lab heal` first")
    cut = max(1, round(share * 10000))
    rules = (
        f"table ip {DROP_TABLE} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority -100; policy accept;\n"
        f'    oifname "{port}" numgen random mod 10000 < {cut} counter drop\n'
        "  }\n"
        "}\n"
    )
    _run(ns, ["nft", "-f", "-"], f"nft on {switch}", rules)
    rec: dict[str, Any] = {"kind": "drop", "switch": switch, "namespace": ns, "to": [],
                           "addresses": [], "share": share, "toward": toward, "port": port,
                           "how": f"nftables numgen, {share:.1%} of the packets out its port "
                           f"to {toward}, at random"}  # fmt: skip
    lab.state.add("faults", rec)
    return rec


def _has_drop_table(namespace: str) -> bool:
    res = subprocess.run(["ip", "netns", "exec", namespace, "nft", "list", "table", "ip",
                          DROP_TABLE], capture_output=True, text=True)  # fmt: skip
    return res.returncode == 0


def undo_drop(rec: dict[str, Any]) -> None:
    """Remove one ``drop`` fault (its blackhole routes or its nftables table)."""
    ns = rec["namespace"]
    if rec.get("share", 1.0) >= 1.0:
        for a in rec.get("addresses", []):
            subprocess.run(["ip", "-n", ns, "route", "del", "blackhole", f"{a}/32", "metric",
                            _BLACKHOLE_METRIC], capture_output=True)  # fmt: skip
    elif _has_drop_table(ns):
        _run(ns, ["nft", "delete", "table", "ip", DROP_TABLE], f"nft on {rec['switch']}")


# ---------------------------------------------------------------------------- heal
def heal(lab: Lab) -> dict[str, int]:
    """Remove every fault: stop injectors and loads, all links up, the faults' root qdiscs
    removed (a configured capacity, ``lab capacity``, is put back)."""
    data = lab.state.read()
    faults = data.get("faults", [])
    stopped = processes.terminate_records([f for f in faults if "pid" in f])
    topo = lab.topology
    present = set(lab._namespaces())
    drops = [f for f in faults if f.get("kind") == "drop" and f.get("namespace") in present]
    for f in drops:
        with contextlib.suppress(LabError, OSError):
            undo_drop(f)
    relinked = unshaped = 0
    for st in link_states(topo, present):
        link = topo.link(st.name)
        if not st.up:
            with contextlib.suppress(LabError, NetlinkError, OSError):
                set_link(link, up=True)
                relinked += 1
        faulted = False
        for end, qd in ((link.a, st.qdisc), (link.b, st.qdisc)):
            if any(q.startswith(f"{end.node}:") and not q.endswith(":htb") for q in qd):
                _tc(end.namespace, ["qdisc", "del", "dev", end.interface, "root"])
                unshaped += 1
                faulted = True
        if faulted:  # the link's configured capacity (lab capacity) comes back
            capacity.reapply(lab, link)
    with contextlib.suppress(NetlinkError, OSError):
        restore_host_routes(topo, present)
    with lab.state.update() as state:
        state["faults"] = []
    return {
        "stopped": len(stopped),
        "links_up": relinked,
        "qdiscs_removed": unshaped,
        "drops_removed": len(drops),
    }
