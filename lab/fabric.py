"""``Lab``: build, inspect, enter and tear down a leaf-spine fabric of network namespaces.

Python API used by the CLI, the tests and other components::

    lab = Lab("demo")                # state in ./.lab/demo/
    topo = lab.up(spines=2, leaves=4, hosts_per_leaf=4)
    lab.exec("h1-1", ["ip", "-br", "addr"])
    lab.down()

Netlink work (namespaces, veths, bridge, addresses, host routes) goes through
pyroute2; sysctls and process launches use ``ip netns exec`` (they need a process
inside the namespace anyway). Leaves and spines route with FRR (eBGP + BFD, see
:mod:`lab.frr`): no route between racks is ever installed by the lab itself.

What of a lab is up is read by :mod:`lab.status`; the hosts' static routes and the
fabric's routing state are :mod:`lab.routes`.

Over 500 lines: one lifecycle, the Lab class's: build (netlink, FRR, sshd), down, exec.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, NetlinkError, netns

from lab import fake_rdma, frr, inventory, plan, processes, routes, sshd
from lab.convergence import Convergence
from lab.state import MARKER_FILE, LabState
from lab.status import LabStatus, LinkStatus, collect, link_states
from lab.topology import Topology, dumps, load

GLOBAL_LOCK = Path("/run/lock/clockmesh-lab.lock")
ALIAS_PREFIX = "clockmesh-lab:"
CONVERGE_TIMEOUT_S = 30.0
ROUTER_SYSCTLS = [
    "net.ipv4.ip_forward=1",
    "net.ipv4.fib_multipath_hash_policy=1",
    # Collectors trace every (buddy, source port) path with TTL-limited probes; a switch
    # answers those in hardware or polices them generously, the kernel's default per-source
    # limit (1 answer/s after a burst of 6) would hide paths.
    "net.ipv4.icmp_ratelimit=0",
]
COMMON_SYSCTLS = [
    # No IPv6: router solicitations and MLD reports would pollute link counters.
    "net.ipv6.conf.all.disable_ipv6=1",
    "net.ipv6.conf.default.disable_ipv6=1",
    # ECMP makes paths asymmetric; strict reverse-path filtering would drop replies.
    "net.ipv4.conf.all.rp_filter=0",
    "net.ipv4.conf.default.rp_filter=0",
    "net.ipv4.conf.all.ignore_routes_with_linkdown=1",
    "net.ipv4.conf.default.ignore_routes_with_linkdown=1",
]


class LabError(RuntimeError):
    """A lab operation failed; ``str()`` is one line for the user."""


def default_state_dir(name: str) -> Path:
    return Path.cwd() / ".lab" / name


@dataclass
class DownReport:
    namespaces: list[str]
    root_links: list[str]
    pids: list[int]


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veths, mounts): run as root")


@contextlib.contextmanager
def _global_lock() -> Iterator[None]:
    GLOBAL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(GLOBAL_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ns_fd(name: str) -> int:
    return os.open(processes.NETNS_DIR / name, os.O_RDONLY)


def _existing_namespaces() -> list[str]:
    try:
        return sorted(os.listdir(processes.NETNS_DIR))
    except FileNotFoundError:
        return []


def _run_parallel(commands: list[list[str]], what: str) -> None:
    procs = [
        (cmd, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for cmd in commands
    ]
    errors = []
    for cmd, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"{' '.join(cmd[:5])}: {err.strip()}")
    if errors:
        raise LabError(f"{what} failed: {errors[0]}")


class Lab:
    """One named lab and its state directory."""

    def __init__(self, name: str, state_dir: str | Path | None = None) -> None:
        self.name = plan.check_name(name)
        self.dir = Path(state_dir) if state_dir is not None else default_state_dir(name)
        self.dir = self.dir.absolute()
        self.state = LabState(self.dir)

    # ------------------------------------------------------------------ paths
    @property
    def topology_path(self) -> Path:
        return self.dir / "topology.json"

    @property
    def netd_args(self) -> list[str]:
        """The lab's netd's arguments after the interpreter (how ``down`` finds it without
        its record)."""
        return ["-m", "lab.netd", str(self.topology_path)]

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def private_key(self) -> Path:
        return self.dir / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "ssh" / "known_hosts"

    def node_dir(self, node: str) -> Path:
        return self.dir / "nodes" / node

    @property
    def topology(self) -> Topology:
        return load(self.topology_path)

    def ssh_command(self, node: str, argv: list[str] | None = None) -> list[str]:
        """An ``ssh`` argv reaching ``node`` with the lab key and strict host key checking."""
        topo = self.topology
        boxes = {box.name: box.mgmt_address for box in topo.ops_boxes}
        addr = boxes[node] if node in boxes else topo.host(node).mgmt_address
        return [
            "ssh",
            "-i",
            str(self.private_key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"root@{addr}",
            *(argv or []),
        ]

    # --------------------------------------------------------------------- up
    def up(
        self,
        spines: int = 2,
        leaves: int = 4,
        hosts_per_leaf: int = 4,
        clock_seed: int | None = None,
        ops: int = 1,
    ) -> Topology:
        """Build the lab (``ops`` 2: with a standby ops box). On any failure everything
        created so far is torn down."""
        require_root()
        plan.build(self.name, 1, spines, leaves, hosts_per_leaf, clock_seed, ops)  # validate
        if self.state.exists():
            live = self._namespaces()
            if live:
                raise LabError(
                    f"lab {self.name!r} is already up ({len(live)} namespaces, state in "
                    f"{self.dir}); run `clockmesh lab down --name {self.name}` first"
                )
            self.down()  # stale state from a crash: clean it before rebuilding
        elsewhere = self._namespaces()
        if elsewhere:  # same name, another state dir: its namespaces are not ours to remove
            raise LabError(
                f"lab {self.name!r}: namespaces {', '.join(elsewhere[:3])}"
                f"{' ...' if len(elsewhere) > 3 else ''} already exist (a lab of that name is up "
                f"with its state outside {self.dir}); choose another name"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / MARKER_FILE).write_text(f"{self.name}\n")
        try:
            topo = self._build(spines, leaves, hosts_per_leaf, clock_seed, ops)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self.down(keep_files=True)
            if isinstance(exc, LabError | NetlinkError | OSError | sshd.SshError):
                raise LabError(f"lab up {self.name}: {exc}") from exc
            raise
        return topo

    def _build(
        self, spines: int, leaves: int, hosts_per_leaf: int, clock_seed: int | None, ops: int = 1
    ) -> Topology:
        t0 = time.monotonic()
        alias = ALIAS_PREFIX + self.name
        with _global_lock(), IPRoute() as root:
            slot = self._allocate_slot(root)
            topo = plan.build(self.name, slot, spines, leaves, hosts_per_leaf, clock_seed, ops)
            mgmt_nodes = topo.mgmt_nodes
            root_links = [plan.mgmt_root_iface(slot, n.name) for n in mgmt_nodes]
            with self.state.update() as st:
                st.clear()
                st.update(
                    name=self.name,
                    state_dir=str(self.dir),
                    slot=slot,
                    bridge=topo.mgmt.bridge,
                    params={
                        "spines": spines,
                        "leaves": leaves,
                        "hosts_per_leaf": hosts_per_leaf,
                        "clock_seed": clock_seed,
                        "ops": ops,
                    },
                    namespaces=[],
                    root_links=[topo.mgmt.bridge, *root_links],
                    processes=[],
                    faults=[],
                    complete=False,
                    started=time.time(),
                )
            root.link("add", ifname=topo.mgmt.bridge, kind="bridge")
            br = root.link_lookup(ifname=topo.mgmt.bridge)[0]
            root.link("set", index=br, ifalias=alias)
            root.addr("add", index=br, address=topo.mgmt.gateway, prefixlen=24)
            root.link("set", index=br, state="up")
        self.topology_path.write_bytes(dumps(topo))

        # Namespaces: recorded first, then created.
        all_ns = [h.namespace for h in topo.hosts]
        all_ns += [r.namespace for r in (*topo.leaves, *topo.spines)]
        all_ns += [box.namespace for box in topo.ops_boxes]
        self.state.add("namespaces", *all_ns)
        for ns in all_ns:
            netns.create(ns)
        routers = {r.namespace for r in (*topo.leaves, *topo.spines)}
        _run_parallel(
            [
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-q",
                    "-w",
                    *COMMON_SYSCTLS,
                    *(ROUTER_SYSCTLS if ns in routers else []),
                ]
                for ns in all_ns
            ],
            "sysctl",
        )

        handles: dict[str, IPRoute] = {}
        try:
            for ns in all_ns:
                handles[ns] = IPRoute(netns=ns, flags=0)
            self._wire(topo, handles, slot, alias)
        finally:
            for h in handles.values():
                h.close()
        self._wait_links_up(topo)
        t_net = time.monotonic() - t0
        self._start_frr(topo)
        self._start_sshd(topo)
        self._start_netd()
        t_ssh = time.monotonic() - t0 - t_net
        # Every host gets its fake RDMA sysfs tree (mlx5, RoCE v1 and v2 GIDs) at once, so a
        # collector deployed into a fresh lab reports RDMA config before any job runs.
        for h in topo.hosts:
            fake_rdma.write_tree(
                fake_rdma.tree_root(self.node_dir(h.name)),
                h.name,
                h.backend_interface,
                h.backend_address,
            )
        fleet_key = secrets.token_hex(32)
        inventory.write(
            self.inventory_path,
            inventory.build(
                topo, self.private_key, self.known_hosts, fleet_key, self.topology_path
            ),
            self.name,
        )
        t_conv = time.monotonic()
        routing = self.wait_converged(timeout=CONVERGE_TIMEOUT_S)
        if not routing.converged:
            raise LabError(
                f"the fabric did not converge within {CONVERGE_TIMEOUT_S:.0f}s: "
                f"{routing.problems[0]} (and {len(routing.problems) - 1} more); "
                f"FRR logs in {self.dir / 'nodes'}/<router>/frr/"
            )
        with self.state.update() as st:
            st["complete"] = True
            st["timing"] = {
                "network_s": round(t_net, 3),
                "sshd_s": round(t_ssh, 3),
                "converged_s": round(time.monotonic() - t_conv, 3),
                "total_s": round(time.monotonic() - t0, 3),
            }
        return topo

    def _wait_links_up(self, topo: Topology, timeout: float = 10.0) -> None:
        present = set(self._namespaces())
        deadline = time.monotonic() + timeout
        while True:
            down = [lk.name for lk in link_states(topo, present) if not lk.up]
            if not down:
                return
            if time.monotonic() > deadline:
                raise LabError(f"links still down after {timeout:.0f}s: {', '.join(down[:5])}")
            time.sleep(0.05)

    def _allocate_slot(self, root: IPRoute) -> int:
        used: set[int] = set()
        mgmt = ipaddress.IPv4Network("198.19.0.0/16")
        for link in root.get_links():
            ifname = link.get_attr("IFLA_IFNAME") or ""
            if ifname.startswith("cmbr") and ifname[4:].isdigit():
                used.add(int(ifname[4:]))
        for addr in root.get_addr(family=socket.AF_INET):
            ip = ipaddress.IPv4Address(addr.get_attr("IFA_ADDRESS"))
            if ip in mgmt:
                used.add(int(ip) >> 8 & 0xFF)
        start = zlib.crc32(self.name.encode()) % 254 + 1
        for i in range(254):
            slot = (start - 1 + i) % 254 + 1
            if slot not in used:
                return slot
        raise LabError("no free management /24 left in 198.19.0.0/16 (254 labs up?)")

    def _wire(self, topo: Topology, h: dict[str, IPRoute], slot: int, alias: str) -> None:
        # 1. veth pairs, created directly with their ends in the two namespaces, each end
        #    numbered so that the kernel reports its carrier at once (plan.link_ifindexes).
        #    pyroute2's ``peer=`` takes no ifindex: the link info is spelled out.
        for k, link in enumerate(topo.links):
            a_index, b_index = plan.link_ifindexes(k)
            fd = _ns_fd(link.a.namespace)
            try:
                peer_attrs = [("IFLA_IFNAME", link.a.interface), ("IFLA_NET_NS_FD", fd)]
                peer = {"index": a_index, "attrs": peer_attrs}
                info = {"attrs": [("VETH_INFO_PEER", peer)]}
                h[link.b.namespace].link(
                    "add",
                    ifname=link.b.interface,
                    index=b_index,
                    IFLA_LINKINFO={"attrs": [("IFLA_INFO_KIND", "veth"), ("IFLA_INFO_DATA", info)]},
                )
            finally:
                os.close(fd)
        with IPRoute() as root:
            br = root.link_lookup(ifname=topo.mgmt.bridge)[0]
            for node in topo.mgmt_nodes:
                ifname = plan.mgmt_root_iface(slot, node.name)
                fd = _ns_fd(node.namespace)
                try:
                    root.link(
                        "add",
                        ifname=ifname,
                        kind="veth",
                        peer={"ifname": node.mgmt_interface, "net_ns_fd": fd},
                    )
                finally:
                    os.close(fd)
                idx = root.link_lookup(ifname=ifname)[0]
                root.link("set", index=idx, master=br, ifalias=alias)
                root.link("set", index=idx, state="up")
        # 2. addresses, everything up (routes need live nexthops).
        for ipr in h.values():
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        ends = [end for link in topo.links for end in (link.a, link.b)]
        for end in ends:
            ipr = h[end.namespace]
            idx = ipr.link_lookup(ifname=end.interface)[0]
            ipr.addr("add", index=idx, address=end.address, prefixlen=end.prefixlen)
            ipr.link("set", index=idx, state="up")
        for node in topo.mgmt_nodes:
            ipr = h[node.namespace]
            idx = ipr.link_lookup(ifname=node.mgmt_interface)[0]
            ipr.addr("add", index=idx, address=node.mgmt_address, prefixlen=24)
            ipr.link("set", index=idx, state="up")
        # 3. routes.
        for ns, rts in routes.host_routes(topo).items():
            for rt in rts:
                h[ns].route("add", **rt)

    def _start_frr(self, topo: Topology) -> None:
        """Start zebra, bgpd and bfdd in every leaf and spine (recorded by PID)."""
        frr.require_installed()
        launches = []
        run_dirs = []
        for r in (*topo.leaves, *topo.spines):
            run_dir = frr.runtime_dir(self.name, r.name)
            if run_dir.exists():  # sockets of a crashed lab of the same name
                shutil.rmtree(run_dir, ignore_errors=True)
            run_dirs.append(run_dir)
            launches += frr.write_configs(topo, r, self.node_dir(r.name) / "frr", run_dir)
        # zebra first: bgpd and bfdd connect to its socket and retry only every few seconds.
        zebras = [la for la in launches if la.daemon == "zebra"]
        self._launch_frr(zebras)
        missing = frr.wait_sockets(run_dirs, ("zserv.api",))
        if not missing:
            self._launch_frr([la for la in launches if la.daemon != "zebra"])
            missing = frr.wait_sockets(run_dirs, tuple(f"{d}.vty" for d in frr.DAEMONS))
        if missing:
            raise LabError(f"FRR did not start: no {missing[0]} (logs under {self.dir}/nodes/)")

    def _launch_frr(self, launches: list[frr.DaemonLaunch]) -> None:
        recs = []
        try:
            for la in launches:
                recs.append(_spawn(la.argv, la.log, node=la.node, what="frr", daemon=la.daemon))
        finally:
            self.state.add("processes", *recs)

    def routing(self, links: list[LinkStatus] | None = None) -> Convergence:
        """The fabric's routing state against its links (:func:`lab.routes.routing`);
        ``links``: their states if the caller has just read them."""
        topo = self.topology
        if links is None:
            links = link_states(topo, set(self._namespaces()))
        return routes.routing(self.name, topo, {lk.name: lk.up for lk in links})

    def wait_converged(self, timeout: float = 10.0, interval: float = 0.1) -> Convergence:
        """Poll :meth:`routing` until the fabric is converged or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.routing()
            if state.converged or time.monotonic() >= deadline:
                return state
            time.sleep(interval)

    def _start_netd(self) -> None:
        """The hosts' network manager (:mod:`lab.netd`): re-adds routes after ifdown/ifup."""
        argv = [sys.executable, *self.netd_args]
        rec = _spawn(argv, self.dir / "netd.log", cwd=Path(__file__).resolve().parent.parent,
                     node="lab", what="netd")  # fmt: skip
        self.state.add("processes", rec)

    def _start_sshd(self, topo: Topology) -> None:
        for target in sshd.PRIVATE_MOUNTS:
            Path(target).mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        client_pub = sshd.keygen(self.private_key, f"clockmesh-lab-{self.name}")
        authorized = self.dir / "ssh" / "authorized_keys"
        authorized.write_text(client_pub + "\n")
        authorized.chmod(0o600)
        nodes = [(h.name, h.namespace, h.mgmt_address) for h in topo.hosts]
        nodes += [(box.name, box.namespace, box.mgmt_address) for box in topo.ops_boxes]
        # Host keys in parallel (ssh-keygen per node).
        keygens = []
        for node, _, _ in nodes:
            key = self.node_dir(node) / "ssh_host_ed25519_key"
            key.parent.mkdir(parents=True, exist_ok=True)
            for sub in sshd.PRIVATE_MOUNTS.values():
                (self.node_dir(node) / sub).mkdir(exist_ok=True)
            if not key.exists():
                keygens.append(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node, "-f", str(key)]
                )
        _run_parallel(keygens, "ssh-keygen")
        known = []
        for node, _, addr in nodes:
            key = self.node_dir(node) / "ssh_host_ed25519_key"
            key.chmod(0o600)
            pub = Path(f"{key}.pub").read_text().split()
            known.append(f"{addr} {pub[0]} {pub[1]}")
        self.known_hosts.write_text("\n".join(known) + "\n")
        recs = []
        for node, ns, addr in nodes:
            ndir = self.node_dir(node)
            conf = ndir / "sshd_config"
            conf.write_text(
                sshd.sshd_config(addr, ndir / "ssh_host_ed25519_key", authorized, ndir / "sshd.pid")
            )
            argv = sshd.launch_command(ns, ndir, conf)
            recs.append(_spawn(argv, ndir / "sshd.log", node=node, what="sshd"))
        self.state.add("processes", *recs)
        missing = sshd.wait_listening([addr for _, _, addr in nodes])
        if missing:
            node = next(n for n, _, a in nodes if a == missing[0])
            text = (self.node_dir(node) / "sshd.log").read_text(errors="replace").strip()
            last = text.splitlines()[-1] if text else "no log output"
            raise LabError(f"sshd on {node} ({missing[0]}:22) did not come up: {last}")

    # ------------------------------------------------------------------- down
    def _namespaces(self) -> list[str]:
        pattern = plan.namespace_pattern(self.name)
        return [ns for ns in _existing_namespaces() if pattern.match(ns)]

    def down(self, keep_files: bool = False) -> DownReport:
        """Remove every namespace, veth, bridge, mount and process of this lab.

        Idempotent; works from ``state.json`` plus a scan of namespaces matching the
        lab's name and root links carrying its alias, so it also cleans up after a
        crash or a SIGKILLed ``up``.
        """
        require_root()
        data = self.state.read()
        namespaces = sorted(set(data.get("namespaces", [])) | set(self._namespaces()))
        # 1. fault injectors and recorded processes (sshd ...), by PID + start time.
        recorded = list(data.get("processes", []))
        recorded += [f for f in data.get("faults", []) if "pid" in f]
        killed = processes.terminate_records(recorded)
        # 2. anything else running inside the lab's namespaces (collectors, loads), and
        # the lab's netd (root namespace) by its command line, its record lost with
        # state.json (it exits by itself once the namespaces are gone, up to 2 s later).
        in_ns = processes.pids_in_namespaces(namespaces)
        netd = processes.pids_running(self.netd_args)
        killed += processes.terminate([pid for pids in in_ns.values() for pid in pids] + netd)
        # 3. namespaces (their veth ends go with them).
        removed_ns = []
        for ns in namespaces:
            if (processes.NETNS_DIR / ns).exists():
                with contextlib.suppress(OSError):
                    netns.remove(ns)
                removed_ns.append(ns)
        # 4. root-namespace links: the bridge and the mgmt veth ends.
        alias = ALIAS_PREFIX + self.name
        wanted = set(data.get("root_links", []))
        removed_links = []
        with IPRoute() as root:
            for link in root.get_links():
                ifname = link.get_attr("IFLA_IFNAME")
                if ifname in wanted or link.get_attr("IFLA_IFALIAS") == alias:
                    try:
                        root.link("del", index=link["index"])
                        removed_links.append(ifname)
                    except NetlinkError as exc:
                        if exc.code != errno.ENODEV:
                            raise
        # 5. files: FRR's sockets, then the state dir.
        shutil.rmtree(frr.RUNTIME_BASE / self.name, ignore_errors=True)
        if not keep_files and (self.dir / MARKER_FILE).exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self.state.exists():
            with self.state.update() as st:
                st["namespaces"] = []
                st["processes"] = []
                st["faults"] = []
                st["complete"] = False
                st["down"] = True
        return DownReport(removed_ns, sorted(removed_links), sorted(set(killed)))

    @staticmethod
    def discover() -> set[str]:
        """Names of every lab with a namespace or root link on this machine."""
        # Lab names have no dashes, so a lab namespace's name starts with "<lab>-".
        names = {
            ns.split("-")[0] for ns in _existing_namespaces() if plan.ANY_LAB_NAMESPACE.match(ns)
        }
        with IPRoute() as root:
            for link in root.get_links():
                alias = link.get_attr("IFLA_IFALIAS") or ""
                if alias.startswith(ALIAS_PREFIX):
                    names.add(alias[len(ALIAS_PREFIX) :])
        return names

    @staticmethod
    def down_all(base: Path | None = None) -> list[tuple[str, DownReport]]:
        """Tear down every lab: state dirs under ``base`` plus any lab namespace/link found."""
        require_root()
        reports = []
        base = base if base is not None else Path.cwd() / ".lab"
        if base.is_dir():
            for state_file in sorted(base.glob("*/state.json")):
                name = state_file.parent.name
                with contextlib.suppress(plan.PlanError):
                    reports.append((name, Lab(name, state_file.parent).down()))
        names = Lab.discover()
        for name in sorted(names):
            with contextlib.suppress(plan.PlanError):
                lab = Lab(name, Path("/nonexistent-clockmesh-lab") / name)
                reports.append((name, lab.down(keep_files=True)))
        return reports

    # ------------------------------------------------------------------- exec
    def _sshd_record(self, node: str) -> dict[str, Any] | None:
        for rec in self.state.read().get("processes", []):
            if rec.get("node") == node and rec.get("what") == "sshd":
                return rec
        return None

    def command(self, node: str, argv: list[str]) -> list[str]:
        """argv running ``argv`` in ``node``'s network namespace (and private mounts)."""
        topo = self.topology
        try:
            ns = topo.node_namespace(node)
        except KeyError:
            raise LabError(
                f"node: no node named {node!r} in lab {self.name!r} "
                f"(expected one of {', '.join(topo.nodes)})"
            ) from None
        if node in {h.name for h in topo.hosts} or node in {b.name for b in topo.ops_boxes}:
            rec = self._sshd_record(node)
            if rec is None or not processes.alive(rec):
                raise LabError(
                    f"{node}: its sshd (which holds the private mounts) is not running; "
                    "run `clockmesh lab status`"
                )
            return [
                "nsenter",
                f"--net={processes.NETNS_DIR / ns}",
                f"--mount=/proc/{rec['pid']}/ns/mnt",
                "--",
                *argv,
            ]
        if argv and argv[0] == frr.VTYSH and "--vty_socket" not in argv:
            argv = [argv[0], "--vty_socket", str(frr.runtime_dir(self.name, node)), *argv[1:]]
        return ["ip", "netns", "exec", ns, *argv]

    def exec(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in ``node`` and wait (kwargs go to :func:`subprocess.run`)."""
        return subprocess.run(self.command(node, argv), **kwargs)

    def popen(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.command(node, argv), **kwargs)

    # ----------------------------------------------------------------- status
    def status(self) -> LabStatus:
        """What of this lab is up now (:mod:`lab.status`)."""
        require_root()
        return collect(
            self.name, self.dir, self.state.read(), self._namespaces(), self.topology_path
        )


def _spawn(argv: list[str], log: Path, cwd: Path | None = None, **info: Any) -> dict[str, Any]:
    """Start a lab daemon in its own session, output appended to ``log``; its record."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )
    return processes.record(proc.pid, **info)
