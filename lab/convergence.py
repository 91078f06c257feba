"""Is the fabric converged? The kernel FIB of every leaf and spine against the topology.

A fabric is converged when every router forwards exactly over the paths the physical
links allow:

- a leaf reaches every other rack over each spine whose links to *both* leaves are up
  (its ECMP group), and over no other spine (that would be a black hole);
- a spine reaches each leaf's subnet over its link to that leaf iff that link is up;
- every BGP session on a link that is up is Established, with its BFD session up;
- a link whose BGP session an operator shut on both ends (``neighbor ... shutdown``: a
  remediation) is *out of service*: no path is expected over it and its sessions are not
  problems (shut on one end only, it is named like any session down);
- every host whose access link is up has its route to the backend via its leaf.

:func:`assess` is pure (tests feed it tables); :func:`read_fib` reads one namespace's
main routing table with pyroute2.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyroute2 import IPRoute, NetlinkError

from lab.frr import Session
from lab.topology import Topology

RTNH_F_DEAD = 1
HOST_ROUTE = "198.18.0.0/16"  # every host's static route to the backend, via its leaf
RTNH_F_LINKDOWN = 16

Fib = dict[str, set[str]]  # prefix "198.18.2.0/24" -> usable gateway addresses


@dataclass(frozen=True)
class EcmpGroup:
    """One router's next hops towards one rack, against what the links allow."""

    router: str
    rack: str  # the destination leaf
    have: tuple[str, ...]  # next-hop nodes (spines for a leaf, the leaf for a spine)
    want: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.have == self.want


@dataclass
class Convergence:
    groups: list[EcmpGroup] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    out_of_service: set[str] = field(default_factory=set)  # links with BGP shut by an operator

    @property
    def converged(self) -> bool:
        return not self.problems


def read_fib(namespace: str) -> Fib:
    """Usable IPv4 routes of a namespace's main table: prefix -> gateway addresses.

    Next hops the kernel flags dead or linkdown are left out: they carry no traffic.
    """
    out: Fib = {}
    with IPRoute(netns=namespace, flags=0) as ipr:
        for rt in ipr.get_routes(family=socket.AF_INET, table=254):
            dst = rt.get_attr("RTA_DST")
            if dst is None:
                continue
            prefix = f"{dst}/{rt['dst_len']}"
            gws: set[str] = set()
            multipath = rt.get_attr("RTA_MULTIPATH")
            if multipath:
                for nh in multipath:
                    gw = nh.get_attr("RTA_GATEWAY")
                    if gw and not nh["flags"] & (RTNH_F_DEAD | RTNH_F_LINKDOWN):
                        gws.add(gw)
            else:
                gw = rt.get_attr("RTA_GATEWAY")
                if gw and not rt["flags"] & (RTNH_F_DEAD | RTNH_F_LINKDOWN):
                    gws.add(gw)
            if gws:
                out.setdefault(prefix, set()).update(gws)
    return out


def read_fibs(topo: Topology) -> dict[str, Fib]:
    """The FIB of every host, leaf and spine (an absent namespace gives an empty table)."""
    fibs: dict[str, Fib] = {}
    nodes = [(h.name, h.namespace) for h in topo.hosts]
    nodes += [(r.name, r.namespace) for r in (*topo.leaves, *topo.spines)]
    for name, ns in nodes:
        try:
            fibs[name] = read_fib(ns)
        except (OSError, NetlinkError):
            fibs[name] = {}
    return fibs


def assess(
    topo: Topology,
    link_up: Mapping[str, bool],
    fibs: Mapping[str, Fib],
    sessions: list[Session],
) -> Convergence:
    """Compare the routers' FIBs and BGP sessions with what the links allow.

    ``link_up`` maps fabric link names to True when both ends are operationally up.
    """
    fabric = {(lk.a.node, lk.b.node): lk for lk in topo.links if lk.kind == "fabric"}
    result = Convergence(sessions=list(sessions))
    # A link whose session an operator shut on *both* ends (a remediation taking it out of
    # service) is not a fault: it carries no traffic on purpose and the ECMP groups go
    # without it. Shut on one end only, it is a half-done change and stays a problem.
    admin_ends: dict[str, set[str]] = {}
    for sess in sessions:
        on = fabric.get((sess.router, sess.peer)) or fabric.get((sess.peer, sess.router))
        if on is not None and "admin" in sess.state.lower():
            admin_ends.setdefault(on.name, set()).add(sess.router)
    for lk in fabric.values():
        if admin_ends.get(lk.name, set()) >= {lk.a.node, lk.b.node}:
            result.out_of_service.add(lk.name)

    def up(leaf: str, spine: str) -> bool:
        name = fabric[(leaf, spine)].name
        return bool(link_up.get(name, False)) and name not in result.out_of_service

    for leaf in topo.leaves:
        gw_to_spine = {fabric[(leaf.name, s.name)].b.address: s.name for s in topo.spines}
        for other in topo.leaves:
            if other.name == leaf.name or other.subnet is None:
                continue
            gws = fibs.get(leaf.name, {}).get(other.subnet, set())
            have = tuple(sorted(gw_to_spine.get(gw, gw) for gw in gws))
            want = tuple(
                sorted(
                    s.name for s in topo.spines if up(leaf.name, s.name) and up(other.name, s.name)
                )
            )
            group = EcmpGroup(leaf.name, other.name, have, want)
            result.groups.append(group)
            for via in sorted(set(have) - set(want)):
                result.problems.append(
                    f"black hole: {leaf.name} sends {other.name}'s traffic via {via}, "
                    f"which cannot deliver it"
                )
            for via in sorted(set(want) - set(have)):
                result.problems.append(
                    f"missing path: {leaf.name} has no route to {other.name} via {via} "
                    "(both links up)"
                )
    for spine in topo.spines:
        for leaf in topo.leaves:
            if leaf.subnet is None:
                continue
            lk = fabric[(leaf.name, spine.name)]
            gws = fibs.get(spine.name, {}).get(leaf.subnet, set())
            have = (leaf.name,) if lk.a.address in gws else ()
            want = (leaf.name,) if up(leaf.name, spine.name) else ()
            result.groups.append(EcmpGroup(spine.name, leaf.name, have, want))
            if have and not want:
                result.problems.append(
                    f"black hole: {spine.name} routes {leaf.name} over {lk.name}, which is down"
                )
            elif want and not have:
                result.problems.append(
                    f"missing path: {spine.name} has no route to {leaf.name} ({lk.name} is up)"
                )
    for host in topo.hosts:
        access = topo.access_link(host.name)
        if not link_up.get(access.name, False):
            continue
        gws = fibs.get(host.name, {}).get(HOST_ROUTE, set())
        if access.b.address not in gws:
            result.problems.append(
                f"missing path: {host.name} has no route to the fabric ({HOST_ROUTE} via "
                f"{access.b.node}) although {access.name} is up"
            )
    for sess in sessions:
        on = fabric.get((sess.router, sess.peer)) or fabric.get((sess.peer, sess.router))
        if on is None or not link_up.get(on.name, False) or on.name in result.out_of_service:
            continue
        if not sess.up:
            result.problems.append(
                f"BGP {sess.router}–{sess.peer} is {sess.state} on {on.name}, which is up"
            )
        elif sess.bfd != "up":
            result.problems.append(
                f"BFD {sess.router}–{sess.peer} is {sess.bfd or 'absent'} on {on.name}, "
                "which is up (a silent failure would not be detected)"
            )
    return result
