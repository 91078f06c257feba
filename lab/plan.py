"""Names and addresses of a lab, computed (pure functions, no root needed).

Addressing plan (also in docs/lab.md):

- Backend fabric, 198.18.0.0/16, identical in every lab (each lab's fabric lives only
  inside its own namespaces, so labs never see each other's backend):
  - leaf L owns the host subnet 198.18.L.0/24 (L = 1..127); host N on leaf L has the
    point-to-point /31 198.18.L.(2N-2)/31: leaf side .2N-2, host side .2N-1.
    So h1-1 = 198.18.1.1, h1-2 = 198.18.1.3, h2-1 = 198.18.2.1.
  - leaf L to spine S is the /31 number k = (L-1)*spines + (S-1) in 198.18.128.0/17:
    leaf side 198.18.128.0 + 2k, spine side + 2k + 1.
- Management network, 198.19.0.0/16, one /24 per lab ("slot" 1..254 picked at ``up`` so
  labs never overlap): the root-namespace bridge ``cmbr<slot>`` is .1, the ops box .2,
  the standby ops box (``--ops 2``, node ``ops2``) .3,
  host number i (1-based, leaf-major order) is .(9+i).

Interface names: a host has ``bk0`` (backend) and ``mg0`` (mgmt); a leaf names its ports
after the peer (``h1-2``, ``spine1``), a spine too (``leaf3``); the root side of a mgmt
veth is ``cm<slot>-<node>`` (e.g. ``cm37-h1-1``, at most 12 characters).

Interface indexes: link k of the topology (fabric and access) has ifindex 1000 + 2k on its
``b`` end and 1001 + 2k on its ``a`` end (``link_ifindexes``), so no end of a link has its
peer's ifindex. Linux (``linkwatch_urgent_event``) takes a device whose ifindex equals its
peer's for an unstacked one and reports its carrier changes in its once-a-second batch: left
to the kernel's numbering, spine1's ``leaf2`` (ifindex 3, peer 3) was seen up by the routers
0.3-1 s after it was, and a 1-s flap of that link stayed unrouted 0.47-0.97 s after it was up
(0.07-0.18 s numbered apart).
"""

from __future__ import annotations

import ipaddress
import random
import re

from lab.topology import (
    FORMAT_VERSION,
    Host,
    LabClock,
    Link,
    LinkEnd,
    Mgmt,
    OpsBox,
    Router,
    Topology,
)

NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
# A namespace belongs to lab NAME iff it matches this with the lab's name in front.
NODE_RE = r"(?:h\d+-\d+|leaf\d+|spine\d+|ops2?)"
BACKEND_IFACE = "bk0"
MGMT_IFACE = "mg0"
MAX_LEAVES = 127
MAX_HOSTS_PER_LEAF = 128
MAX_SPINES = 64
MAX_MGMT_NODES = 245  # .10 .. .254 for hosts
OFFSET_NS_MAX = 5_000_000
DRIFT_PPM_MAX = 50.0


class PlanError(ValueError):
    """Parameters that cannot make a lab (message names the option)."""


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise PlanError(
            f"--name: expected 1-12 lowercase letters/digits starting with a letter, got {name!r}"
        )
    return name


def namespace_pattern(name: str) -> re.Pattern[str]:
    """Regex matching exactly the namespaces of lab ``name``."""
    return re.compile(rf"^{re.escape(name)}-{NODE_RE}$")


ANY_LAB_NAMESPACE = re.compile(rf"^[a-z][a-z0-9]{{0,11}}-{NODE_RE}$")


def bridge_name(slot: int) -> str:
    return f"cmbr{slot}"


def mgmt_root_iface(slot: int, node: str) -> str:
    return f"cm{slot}-{node}"


FIRST_LINK_IFINDEX = 1000


def link_ifindexes(k: int) -> tuple[int, int]:
    """The ifindexes of link number ``k``'s ``a`` and ``b`` ends (never equal; see above)."""
    return FIRST_LINK_IFINDEX + 2 * k + 1, FIRST_LINK_IFINDEX + 2 * k


def mgmt_subnet(slot: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"198.19.{slot}.0/24")


def _fabric_link_addresses(leaf: int, spine: int, spines: int) -> tuple[str, str]:
    k = (leaf - 1) * spines + (spine - 1)
    base = int(ipaddress.IPv4Address("198.18.128.0")) + 2 * k
    return str(ipaddress.IPv4Address(base)), str(ipaddress.IPv4Address(base + 1))


def clocks(seed: int, hosts: list[str]) -> dict[str, LabClock]:
    """Seeded ground-truth clock errors: offsets within ±5 ms, drifts within ±50 ppm."""
    rng = random.Random(seed)
    out = {}
    for host in hosts:
        offset = rng.randint(-OFFSET_NS_MAX, OFFSET_NS_MAX)
        drift = round(rng.uniform(-DRIFT_PPM_MAX, DRIFT_PPM_MAX), 3)
        out[host] = LabClock(offset_ns=offset, drift_ppm=drift)
    return out


def build(
    name: str,
    slot: int,
    spines: int = 2,
    leaves: int = 4,
    hosts_per_leaf: int = 4,
    clock_seed: int | None = None,
    ops: int = 1,
) -> Topology:
    """The full topology of a lab: every node, address, interface and link; ``ops`` 2 adds
    a standby ops box (``ops2``)."""
    check_name(name)
    if ops not in (1, 2):
        raise PlanError(f"--ops: expected 1 or 2 ops boxes, got {ops}")
    if not 1 <= spines <= MAX_SPINES:
        raise PlanError(f"--spines: expected 1..{MAX_SPINES}, got {spines}")
    if not 1 <= leaves <= MAX_LEAVES:
        raise PlanError(f"--leaves: expected 1..{MAX_LEAVES}, got {leaves}")
    if not 1 <= hosts_per_leaf <= MAX_HOSTS_PER_LEAF:
        raise PlanError(f"--hosts-per-leaf: expected 1..{MAX_HOSTS_PER_LEAF}, got {hosts_per_leaf}")
    if leaves * hosts_per_leaf > MAX_MGMT_NODES:
        raise PlanError(
            f"--leaves x --hosts-per-leaf: at most {MAX_MGMT_NODES} hosts fit a lab's "
            f"management /24, got {leaves * hosts_per_leaf}"
        )
    if not 1 <= slot <= 254:
        raise PlanError(f"management slot: expected 1..254, got {slot}")
    subnet = mgmt_subnet(slot)
    mgmt_ip = list(subnet.hosts())  # .1 .. .254

    host_names = [f"h{lf}-{n}" for lf in range(1, leaves + 1) for n in range(1, hosts_per_leaf + 1)]
    truth = clocks(clock_seed, host_names) if clock_seed is not None else {}

    hosts: list[Host] = []
    links: list[Link] = []
    leaf_routers: list[Router] = []
    spine_routers = [
        Router(name=f"spine{s}", role="spine", namespace=f"{name}-spine{s}")
        for s in range(1, spines + 1)
    ]
    for lf in range(1, leaves + 1):
        leaf = f"leaf{lf}"
        leaf_ns = f"{name}-{leaf}"
        leaf_routers.append(
            Router(name=leaf, role="leaf", namespace=leaf_ns, subnet=f"198.18.{lf}.0/24")
        )
        for n in range(1, hosts_per_leaf + 1):
            host = f"h{lf}-{n}"
            index = (lf - 1) * hosts_per_leaf + n  # 1-based
            leaf_side, host_side = f"198.18.{lf}.{2 * n - 2}", f"198.18.{lf}.{2 * n - 1}"
            hosts.append(
                Host(
                    name=host,
                    rack=leaf,
                    namespace=f"{name}-{host}",
                    backend_address=host_side,
                    backend_interface=BACKEND_IFACE,
                    mgmt_address=str(mgmt_ip[8 + index]),
                    mgmt_interface=MGMT_IFACE,
                    clock=truth.get(host),
                )
            )
            links.append(
                Link(
                    name=f"{host}-{leaf}",
                    kind="access",
                    a=LinkEnd(host, f"{name}-{host}", BACKEND_IFACE, host_side, 31),
                    b=LinkEnd(leaf, leaf_ns, host, leaf_side, 31),
                )
            )
    for lf in range(1, leaves + 1):
        for s in range(1, spines + 1):
            leaf_side, spine_side = _fabric_link_addresses(lf, s, spines)
            links.append(
                Link(
                    name=f"leaf{lf}-spine{s}",
                    kind="fabric",
                    a=LinkEnd(f"leaf{lf}", f"{name}-leaf{lf}", f"spine{s}", leaf_side, 31),
                    b=LinkEnd(f"spine{s}", f"{name}-spine{s}", f"leaf{lf}", spine_side, 31),
                )
            )
    return Topology(
        lab=name,
        version=FORMAT_VERSION,
        hosts=hosts,
        leaves=leaf_routers,
        spines=spine_routers,
        ops=OpsBox(
            name="ops",
            namespace=f"{name}-ops",
            mgmt_address=str(mgmt_ip[1]),
            mgmt_interface=MGMT_IFACE,
        ),
        mgmt=Mgmt(bridge=bridge_name(slot), subnet=str(subnet), gateway=str(mgmt_ip[0])),
        links=links,
        standby=(
            OpsBox(
                name="ops2",
                namespace=f"{name}-ops2",
                mgmt_address=str(mgmt_ip[2]),
                mgmt_interface=MGMT_IFACE,
            )
            if ops == 2
            else None
        ),
    )
