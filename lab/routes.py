"""A lab's routes: the hosts' static route to the backend, and the fabric's routing state.

Hosts have one static route each (198.18.0.0/16 via their leaf), installed when the lab is
wired and re-added by the hosts' network manager (:mod:`lab.netd`) after an ifdown/ifup;
leaves and spines learn every route from BGP (:mod:`lab.frr`), and :func:`routing` reads
their FIBs and sessions to say whether the fabric has converged (:mod:`lab.convergence`).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from pyroute2 import IPRoute, NetlinkError

from lab import convergence, frr
from lab.convergence import Convergence
from lab.topology import Topology


def host_routes(topo: Topology) -> dict[str, list[dict[str, Any]]]:
    """Every host's static route: the backend 198.18.0.0/16 via its leaf (/31 access link).

    Leaves and spines have no static routes: BGP installs theirs (:mod:`lab.frr`).
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for host in topo.hosts:
        access = topo.access_link(host.name)
        out.setdefault(host.namespace, []).append(
            {"dst": convergence.HOST_ROUTE, "gateway": access.b.address}
        )
    return out


def restore_host_routes(topo: Topology, namespaces: set[str] | None = None) -> int:
    """Re-apply hosts' network configuration (what ``ifup`` does on a real host).

    The kernel deletes a host's static route when its own ``bk0`` is set administratively
    down; a host's network manager re-adds it when the interface comes back. Only hosts:
    leaves and spines learn every route from BGP. Returns routes added.
    """
    added = 0
    for ns, rts in host_routes(topo).items():
        if namespaces is not None and ns not in namespaces:
            continue
        with IPRoute(netns=ns, flags=0) as ipr:
            have = {
                f"{r.get_attr('RTA_DST')}/{r['dst_len']}"
                for r in ipr.get_routes(family=socket.AF_INET, table=254)
            }
            for rt in rts:
                if rt["dst"] not in have:
                    try:
                        ipr.route("replace", **rt)
                    except NetlinkError as exc:
                        # Its interface is still down: re-added when it comes back up.
                        if exc.code not in (errno.ENETUNREACH, errno.ENETDOWN):
                            raise
                        continue
                    added += 1
    return added


def routing(lab_name: str, topo: Topology, link_up: dict[str, bool]) -> Convergence:
    """The fabric's routing state against its links (``link_up``: link name -> both ends
    up): every router's FIB and BGP/BFD sessions, assessed by :mod:`lab.convergence`."""
    fibs = convergence.read_fibs(topo)
    sessions = []
    for r in (*topo.leaves, *topo.spines):
        sessions += frr.sessions(lab_name, topo, r)
    return convergence.assess(topo, link_up, fibs, sessions)
