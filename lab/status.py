"""What of a lab is up: its namespaces, bridge, nodes' sshd, links, FRR daemons, routing.

Read by :meth:`lab.fabric.Lab.status` (``clockmesh lab status``) from the lab's recorded
state and what the kernel shows now; :func:`link_states` (both ends of every link, their
root qdiscs) is also what faults and the build poll.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, NetlinkError

from lab import processes, routes, sshd
from lab.convergence import Convergence
from lab.topology import Topology, load


@dataclass
class NodeStatus:
    name: str
    namespace: str
    exists: bool
    sshd_pid: int | None = None
    sshd_alive: bool = False
    ssh_port_open: bool = False


@dataclass
class LinkStatus:
    name: str
    a_up: bool | None
    b_up: bool | None
    qdisc: list[str] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return bool(self.a_up and self.b_up)


@dataclass
class LabStatus:
    name: str
    state_dir: Path
    recorded: bool
    bridge: str | None
    bridge_exists: bool
    namespaces_expected: int
    namespaces_present: list[str]
    nodes: list[NodeStatus]
    links: list[LinkStatus]
    faults: list[dict[str, Any]]
    routing: Convergence | None = None
    routers: list[RouterStatus] = field(default_factory=list)
    netd_alive: bool | None = None  # the hosts' network manager (lab.netd); None: not recorded
    capacity: dict[str, Any] = field(default_factory=dict)  # lab capacity ({}: unlimited)


@dataclass
class RouterStatus:
    name: str
    daemons: dict[str, bool]  # FRR daemon -> alive


def collect(
    name: str, state_dir: Path, data: dict[str, Any], present: list[str], topology_path: Path
) -> LabStatus:
    """The status of lab ``name``: ``data`` its recorded state (``state.json``),
    ``present`` its namespaces that exist now, ``topology_path`` its topology file."""
    present_set = set(present)
    bridge = data.get("bridge")
    nodes: list[NodeStatus] = []
    links: list[LinkStatus] = []
    bridge_exists = False
    if bridge:
        with IPRoute() as root:
            bridge_exists = bool(root.link_lookup(ifname=bridge))
    try:
        topo: Topology | None = load(topology_path)
    except Exception:
        topo = None
    if topo is not None:
        sshd_recs = {r["node"]: r for r in data.get("processes", []) if r.get("what") == "sshd"}
        for node, ns, addr in [
            *((h.name, h.namespace, h.mgmt_address) for h in topo.hosts),
            *((b.name, b.namespace, b.mgmt_address) for b in topo.ops_boxes),
        ]:
            rec = sshd_recs.get(node)
            ns_ok = ns in present_set
            nodes.append(
                NodeStatus(
                    name=node,
                    namespace=ns,
                    exists=ns_ok,
                    sshd_pid=rec["pid"] if rec else None,
                    sshd_alive=bool(rec and processes.alive(rec)),
                    ssh_port_open=ns_ok and sshd.port_open(addr, 0.3),
                )
            )
        links = link_states(topo, present_set)
    expected = 0
    if topo is not None:
        expected = len(topo.hosts) + len(topo.leaves) + len(topo.spines) + len(topo.ops_boxes)
    faults = [
        dict(f, alive=processes.alive(f)) if "pid" in f else f for f in data.get("faults", [])
    ]
    routing = None
    routers: list[RouterStatus] = []
    if topo is not None and present:
        daemons: dict[str, dict[str, bool]] = {}
        for rec in data.get("processes", []):
            if rec.get("what") == "frr":
                daemons.setdefault(rec["node"], {})[rec["daemon"]] = processes.alive(rec)
        routers = [
            RouterStatus(r.name, daemons.get(r.name, {})) for r in (*topo.leaves, *topo.spines)
        ]
        routing = routes.routing(name, topo, {lk.name: lk.up for lk in links})
    netd = [r for r in data.get("processes", []) if r.get("what") == "netd"]
    return LabStatus(
        name=name,
        state_dir=state_dir,
        recorded=bool(data),
        bridge=bridge,
        bridge_exists=bridge_exists,
        namespaces_expected=expected,
        namespaces_present=present,
        nodes=nodes,
        links=links,
        faults=faults,
        routing=routing,
        routers=routers,
        netd_alive=processes.alive(netd[0]) if netd else None,
        capacity=dict(data.get("capacity") or {}),
    )


def link_states(topo: Topology, present: set[str]) -> list[LinkStatus]:
    """Operational state and root qdisc of both ends of every link."""
    by_ns: dict[str, dict[str, tuple[bool, list[str]]]] = {}
    for ns in {e.namespace for lk in topo.links for e in (lk.a, lk.b)} & present:
        info: dict[str, tuple[bool, list[str]]] = {}
        try:
            with IPRoute(netns=ns, flags=0) as ipr:
                names = {}
                for link in ipr.get_links():
                    ifname = link.get_attr("IFLA_IFNAME")
                    names[link["index"]] = ifname
                    up = link.get_attr("IFLA_OPERSTATE") == "UP"
                    info[ifname] = (up, [])
                for q in ipr.get_qdiscs():
                    kind = q.get_attr("TCA_KIND")
                    ifname = names.get(q["index"])
                    if (
                        ifname in info
                        and kind in {"tbf", "netem", "htb"}
                        and q["parent"] == 0xFFFFFFFF
                    ):
                        info[ifname][1].append(kind)
        except (OSError, NetlinkError):
            continue
        by_ns[ns] = info
    out = []
    for lk in topo.links:
        a = by_ns.get(lk.a.namespace, {}).get(lk.a.interface)
        b = by_ns.get(lk.b.namespace, {}).get(lk.b.interface)
        qd = [f"{lk.a.node}:{k}" for k in (a[1] if a else [])]
        qd += [f"{lk.b.node}:{k}" for k in (b[1] if b else [])]
        out.append(LinkStatus(lk.name, a[0] if a else None, b[0] if b else None, qd))
    return out
