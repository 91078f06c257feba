"""The lab's topology: typed, stable, and readable by every other component.

``lab up`` writes ``topology.json``; the detector, the clock solver's ground truth and
the tests read it back with :func:`load`::

    topo = lab.topology.load(".lab/demo/topology.json")
    topo.host("h1-1").backend_address          # '198.18.1.1'
    topo.link("leaf1-spine2").a.interface      # 'spine2'
    topo.paths("h1-1", "h2-1")                 # one link-name tuple per spine

Link names are stable: ``h<L>-<N>-leaf<L>`` for a host's backend link and
``leaf<L>-spine<S>`` for a fabric link. End ``a`` is always the lower tier (host, then
leaf), end ``b`` the upper one (leaf, then spine).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from collector.configfile import ConfigError, convert

FORMAT_VERSION = 1


class LinkEnd(msgspec.Struct, frozen=True):
    """One end of a veth link: node, its namespace, the interface there, its address."""

    node: str
    namespace: str
    interface: str
    address: str
    prefixlen: int


class Link(msgspec.Struct, frozen=True):
    """A point-to-point backend link (a veth pair) with a stable name."""

    name: str
    kind: str  # "access" (host-leaf) or "fabric" (leaf-spine)
    a: LinkEnd
    b: LinkEnd


class LabClock(msgspec.Struct, frozen=True):
    """Ground-truth clock error of a lab host (``--clock-skew``)."""

    offset_ns: int
    drift_ppm: float


class Host(msgspec.Struct, frozen=True):
    """A GPU host: runs the collector, sits on the backend fabric and the mgmt network."""

    name: str
    rack: str  # the leaf it hangs off, e.g. "leaf1"
    namespace: str
    backend_address: str
    backend_interface: str
    mgmt_address: str
    mgmt_interface: str
    clock: LabClock | None = None


class Router(msgspec.Struct, frozen=True):
    """A leaf or spine switch (a namespace that forwards)."""

    name: str
    role: str  # "leaf" or "spine"
    namespace: str
    subnet: str | None = None  # a leaf's host subnet, e.g. "198.18.1.0/24"


class OpsBox(msgspec.Struct, frozen=True):
    name: str
    namespace: str
    mgmt_address: str
    mgmt_interface: str


class Mgmt(msgspec.Struct, frozen=True):
    """The management network: a bridge in the root namespace."""

    bridge: str
    subnet: str
    gateway: str  # the bridge's own address (the Ansible controller's side)


class Topology(msgspec.Struct, frozen=True):
    lab: str
    version: int
    hosts: list[Host]
    leaves: list[Router]
    spines: list[Router]
    ops: OpsBox
    mgmt: Mgmt
    links: list[Link]
    standby: OpsBox | None = None  # a second ops box (`lab up --ops 2`), on .3

    @property
    def ops_boxes(self) -> list[OpsBox]:
        """The ops box, then the standby when the lab has two."""
        return [self.ops] if self.standby is None else [self.ops, self.standby]

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host named {name!r} in lab {self.lab!r}")

    def link(self, name: str) -> Link:
        for link in self.links:
            if link.name == name:
                return link
        raise KeyError(f"no link named {name!r} in lab {self.lab!r}")

    def node_namespace(self, node: str) -> str:
        """The network namespace of a host, leaf, spine or the ops box."""
        for box in self.ops_boxes:
            if node == box.name:
                return box.namespace
        for host in self.hosts:
            if host.name == node:
                return host.namespace
        for router in (*self.leaves, *self.spines):
            if router.name == node:
                return router.namespace
        raise KeyError(f"no node named {node!r} in lab {self.lab!r}")

    @property
    def nodes(self) -> list[str]:
        return [
            *(h.name for h in self.hosts),
            *(r.name for r in self.leaves),
            *(r.name for r in self.spines),
            *(box.name for box in self.ops_boxes),
        ]

    @property
    def mgmt_nodes(self) -> list[Host | OpsBox]:
        """Every node on the management network (hosts, then the ops boxes)."""
        return [*self.hosts, *self.ops_boxes]

    def access_link(self, host: str) -> Link:
        """The host's link to its leaf."""
        h = self.host(host)
        return self.link(f"{h.name}-{h.rack}")

    def paths(self, src: str, dst: str) -> list[tuple[str, ...]]:
        """Every ECMP path between two hosts as a tuple of link names, in travel order.

        Hosts on the same leaf have one path (via the leaf); hosts on different leaves
        have one path per spine.
        """
        s, d = self.host(src), self.host(dst)
        first, last = self.access_link(s.name).name, self.access_link(d.name).name
        if s.rack == d.rack:
            return [(first, last)]
        return [
            (first, f"{s.rack}-{spine.name}", f"{d.rack}-{spine.name}", last)
            for spine in self.spines
        ]


def dumps(topology: Topology) -> bytes:
    """Serialise to stable, indented JSON."""
    return msgspec.json.format(msgspec.json.encode(topology), indent=2) + b"\n"


def load(path: str | Path) -> Topology:
    """Read a ``topology.json`` written by ``clockmesh lab up``.

    Raises :class:`ConfigError` (one line naming the file and key) if it is missing or
    malformed.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found (is the lab up?)") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ConfigError(path, None, f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(path, None, "expected a JSON object at the top level")
    topo = convert(data, Topology, path)
    if topo.version != FORMAT_VERSION:
        raise ConfigError(path, "version", f"expected {FORMAT_VERSION}, got {topo.version}")
    return topo
