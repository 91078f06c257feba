"""The lab's routing control plane: FRR (zebra, bgpd, bfdd) in every leaf and spine.

The fabric routes the way AI back-end fabrics do (RFC 7938): eBGP on every leaf-spine
link, one private ASN per leaf (``65000 + L``) and one for the whole spine layer
(``65000``), ECMP multipath over every spine, and BFD on the fabric links, so a link that
dies is withdrawn in well under a second and re-learned when it comes back, whoever
pulled it. Hosts keep their static route to their leaf over the /31 access link.

Each router runs its own three daemons, started with ``ip netns exec`` in its namespace,
in the foreground (recorded by PID like every lab process). Logs live in the lab's state
dir (``nodes/<router>/frr/<daemon>.out``); config files and sockets in :func:`runtime_dir`
(``/run/clockmesh-lab/<lab>/<router>``, owned by the ``frr`` user the daemons drop to: a
Unix socket path must stay under 108 bytes, and the state dir may be one that user cannot
enter). ``vtysh --vty_socket DIR`` talks to
them; ``clockmesh lab exec leaf1 -- vtysh -c 'show bgp summary'`` adds that option.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.topology import Link, Router, Topology

FRR_LIBEXEC = Path("/usr/lib/frr")
VTYSH = "vtysh"
DAEMONS = ("zebra", "bgpd", "bfdd")
RUNTIME_BASE = Path("/run/clockmesh-lab")
FRR_USER = "frr"
SPINE_ASN = 65000

# BFD: 100 ms × 3 → a silent link is declared down within 0.3 s. BGP's own timers are only
# the backstop (keepalive 1 s, hold 3 s); a link whose carrier goes is withdrawn at once
# (fast external failover). A returned link is routed over again ~0.1 s after it is up
# (0.07–0.16 s from the leaves' FIBs, 3 racks under load): connect retry 1 s; no update-group
# coalescing (``coalesce-time 0``: FRR holds a returning session's first updates for its
# default 1 s, meant for routers with hundreds of peers); and only the spine connects
# (``neighbor passive`` on leaves): when both ends did, FRR 8.4 resolving the collision now
# and then tore the new session down again and re-made it ~0.5 s later. With FRR's defaults
# a returned link stayed unused 1.3–2.6 s after it was up. Still, now and then (3 of 120
# spine-side downs in the flap lab test), it comes back late, an FRR 8.4 race: the leaf
# accepts the spine's connection while an event of its own passive peer is queued (its
# next-hop update for the returned link, or its connect-retry timer); that event is applied
# to the session just moved onto the peer and tears it down ("No AFI/SAFI activated for
# peer", the stale reason of the accepting stub), and the spine re-makes it 0.6–0.9 s later.
BFD_INTERVAL_MS = 100
BFD_MULTIPLIER = 3
BGP_KEEPALIVE_S = 1
BGP_HOLD_S = 3
BGP_CONNECT_RETRY_S = 1
# The routers' daemons run at a higher priority than the lab's hosts (collectors, jobs, load):
# on a busy 2-core machine an unprioritised bgpd re-advertised a returned link up to ~0.4 s late
# (1 of 10 flaps under three busy loops; 0 of 14 reniced).
FRR_NICE = -10


class FrrError(RuntimeError):
    """FRR is missing or a daemon did not start; ``str()`` is one line."""


def asn(router: Router) -> int:
    """The router's BGP AS number: 65000 for every spine, 65000 + L for leaf L."""
    if router.role == "spine":
        return SPINE_ASN
    return SPINE_ASN + int(router.name.removeprefix("leaf"))


def runtime_dir(lab: str, node: str) -> Path:
    return RUNTIME_BASE / lab / node


def fabric_links(topo: Topology, node: str) -> list[Link]:
    return [lk for lk in topo.links if lk.kind == "fabric" and node in (lk.a.node, lk.b.node)]


def router(topo: Topology, name: str) -> Router:
    for r in (*topo.leaves, *topo.spines):
        if r.name == name:
            return r
    raise KeyError(f"no router named {name!r} in lab {topo.lab!r}")


def _head(r: Router) -> str:
    """The first lines of each daemon's config: its router's name, log times to the ms."""
    return f"hostname {r.name}\nlog timestamp precision 3\n"


def bgpd_config(topo: Topology, r: Router) -> str:
    """bgpd's configuration for one router (eBGP to every fabric neighbour, BFD, ECMP)."""
    links = fabric_links(topo, r.name)
    mine = [lk.a if lk.a.node == r.name else lk.b for lk in links]
    peers = [lk.b if lk.a.node == r.name else lk.a for lk in links]
    lines = [
        "frr defaults datacenter",
        *_head(r).splitlines(),
        "!",
        f"router bgp {asn(r)}",
        f" bgp router-id {mine[0].address}",
        " coalesce-time 0",
        " no bgp ebgp-requires-policy",
        " no bgp network import-check",
        " bgp bestpath as-path multipath-relax",
        " neighbor fabric peer-group",
        " neighbor fabric remote-as external",
        " neighbor fabric bfd",
        " neighbor fabric bfd profile fabric",
        f" neighbor fabric timers {BGP_KEEPALIVE_S} {BGP_HOLD_S}",
        f" neighbor fabric timers connect {BGP_CONNECT_RETRY_S}",
        " neighbor fabric advertisement-interval 0",
    ]
    if r.role == "leaf":  # the spine connects: no collision of two eager ends (see above)
        lines.append(" neighbor fabric passive")
    for peer in peers:
        lines.append(f" neighbor {peer.address} peer-group fabric")
        lines.append(f" neighbor {peer.address} description {peer.node}")
    lines.append(" !")
    lines.append(" address-family ipv4 unicast")
    if r.subnet:
        lines.append(f"  network {r.subnet}")
    lines.append("  maximum-paths 64")
    lines.append(" exit-address-family")
    lines.append("!")
    return "\n".join(lines) + "\n"


def bfdd_config(r: Router) -> str:
    return (
        _head(r) + "!\n"
        "bfd\n"
        " profile fabric\n"
        f"  detect-multiplier {BFD_MULTIPLIER}\n"
        f"  receive-interval {BFD_INTERVAL_MS}\n"
        f"  transmit-interval {BFD_INTERVAL_MS}\n"
        " exit\n"
        "exit\n"
        "!\n"
    )


def zebra_config(r: Router) -> str:
    # Routes go to the kernel as plain multipath routes, not nexthop objects: with kernel
    # nexthop groups, FRR 8.4 sometimes leaves a group shrunk after a link flap (the route
    # stays on one spine although BGP has both paths again).
    return _head(r) + "!\nno zebra nexthop kernel enable\n!\n"


def require_installed() -> None:
    missing = [d for d in DAEMONS if not (FRR_LIBEXEC / d).exists()]
    if missing or shutil.which(VTYSH) is None:
        raise FrrError(
            f"FRR is not installed ({', '.join(missing) or VTYSH} missing under {FRR_LIBEXEC}); "
            "install Debian's frr package (make deps does)"
        )


@dataclass(frozen=True)
class DaemonLaunch:
    node: str
    daemon: str
    argv: list[str]
    log: Path


def write_configs(topo: Topology, r: Router, conf_dir: Path, run_dir: Path) -> list[DaemonLaunch]:
    """Write one router's config files and return how to start its daemons (zebra first).

    Configs go to ``run_dir`` beside the sockets; each daemon logs to its ``<daemon>.out``
    in ``conf_dir``.
    """
    conf_dir.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    texts = {
        "zebra": zebra_config(r),
        "bgpd": bgpd_config(topo, r),
        "bfdd": bfdd_config(r),
    }
    # The daemons drop to the frr user (Debian's package creates it): it owns the socket dir.
    with contextlib.suppress(KeyError):
        pw = pwd.getpwnam(FRR_USER)
        os.chown(run_dir, pw.pw_uid, pw.pw_gid)
    zserv = run_dir / "zserv.api"
    out = []
    for daemon in DAEMONS:
        # The config lives beside the sockets: the daemons read it after dropping to the
        # frr user, who may not be able to enter the lab's state dir (a 0700 tmp dir).
        conf = run_dir / f"{daemon}.conf"
        conf.write_text(texts[daemon])
        conf.chmod(0o644)
        argv = [
            "ip",
            "netns",
            "exec",
            r.namespace,
            "nice",  # a switch's control plane has its own CPU; here it shares the hosts'
            "-n",
            str(FRR_NICE),
            str(FRR_LIBEXEC / daemon),
            "-f",
            str(conf),
            "-i",
            str(run_dir / f"{daemon}.pid"),
            "-z",
            str(zserv),
            "--vty_socket",
            str(run_dir),
            "--log",
            "stdout",
            "-A",
            "127.0.0.1",
            "-P",
            "0",
            "--limit-fds",
            "1024",
        ]
        if daemon == "bfdd":
            argv += ["--bfdctl", str(run_dir / "bfdd.sock")]
        if daemon == "bgpd":
            argv += ["-l", "0.0.0.0"]  # IPv4 only: the lab disables IPv6
        out.append(DaemonLaunch(r.name, daemon, argv, conf_dir / f"{daemon}.out"))
    return out


def wait_sockets(run_dirs: list[Path], names: tuple[str, ...], timeout: float = 10.0) -> list[str]:
    """Wait until these sockets exist in every run dir; return the ones still missing."""
    wanted = [d / name for d in run_dirs for name in names]
    deadline = time.monotonic() + timeout
    while True:
        missing = [str(p) for p in wanted if not p.exists()]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.05)


def vtysh_argv(lab: str, r: Router, command: str) -> list[str]:
    return [
        "ip",
        "netns",
        "exec",
        r.namespace,
        VTYSH,
        "--vty_socket",
        str(runtime_dir(lab, r.name)),
        "-c",
        command,
    ]


def vtysh_json(lab: str, r: Router, command: str, timeout: float = 5.0) -> Any:
    """Run a ``show ... json`` command on a router; None if its daemons do not answer."""
    try:
        proc = subprocess.run(
            vtysh_argv(lab, r, command), capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None


@dataclass(frozen=True)
class Session:
    """One BGP session as a router sees it."""

    router: str
    peer: str  # the neighbour's node name
    address: str
    state: str  # "Established", "Active", "Connect", ... or "no answer"
    bfd: str  # "up", "down", "init", "" (no BFD session)

    @property
    def up(self) -> bool:
        return self.state == "Established"


def sessions(lab: str, topo: Topology, r: Router) -> list[Session]:
    """BGP sessions (and their BFD state) of one router, one per fabric neighbour."""
    summary = vtysh_json(lab, r, "show bgp ipv4 unicast summary json")
    bfd = vtysh_json(lab, r, "show bfd peers json")
    bfd_state = {}
    if isinstance(bfd, list):
        bfd_state = {str(p.get("peer")): str(p.get("status", "")) for p in bfd}
    peers = summary.get("peers", {}) if isinstance(summary, dict) else {}
    out = []
    for lk in fabric_links(topo, r.name):
        peer = lk.b if lk.a.node == r.name else lk.a
        info = peers.get(peer.address)
        state = str(info.get("state", "unknown")) if isinstance(info, dict) else "no answer"
        out.append(Session(r.name, peer.node, peer.address, state, bfd_state.get(peer.address, "")))
    return out
