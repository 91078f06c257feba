"""Fake RDMA sysfs trees for lab hosts: there are no RNICs here, so we write what one looks like.

Per lab host, under the host's ``/var/lib/clockmesh/lab/sysfs`` (on the lab
machine: ``<lab dir>/nodes/<host>/var/lab/sysfs``, the host's private mount), in
the kernel's formats (see tests/data/sysfs/README.md)::

    sys/class/infiniband/mlx5_0/ports/1/{state, phys_state, rate, link_layer, lid, ...}
    sys/class/infiniband/mlx5_0/ports/1/gids/0..15, gid_attrs/{types,ndevs}/0..3
    sys/class/infiniband/mlx5_0/ports/1/{counters,hw_counters}/*
    sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_mode     "RoCE v2"
    dev/infiniband/uverbs0        a plain file; lab jobs hold it open like a real verbs fd
    sys/class/infiniband_verbs/uverbs0/ibdev                       "mlx5_0"
    sys/class/net -> /sys/class/net   the host's real netdevs (its real veth counters)

GIDs like a Mellanox NIC with one IPv4 address: 0/1 the link-local GID as RoCE v1 /
RoCE v2, 2/3 the IPv4-mapped backend address as RoCE v1 / RoCE v2; the rest zero.
Point the collector at it with ``counters.sysfs_root: /var/lib/clockmesh/lab/sysfs``
and ``rdma.configfs_root: /var/lib/clockmesh/lab/sysfs/sys/kernel/config``.
The RDMA counters are static (nothing moves RDMA traffic here). ``clockmesh lab up``
writes every host's tree (lab/fabric.py); a job rewrites its hosts' (lab/jobgen.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path

DEVICE = "mlx5_0"
IN_HOST_PATH = "/var/lib/clockmesh/lab/sysfs"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
GID_SLOTS = 16

COUNTERS = [
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
]
HW_COUNTERS = [
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
]


def _gid_words(raw: bytes) -> str:
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def link_local_gid(host: str) -> str:
    """fe80::/64 + EUI-64 of a locally administered MAC derived from the host name."""
    mac = bytearray(hashlib.blake2b(host.encode(), digest_size=6).digest())
    mac[0] = (mac[0] | 0x02) & 0xFE
    eui = bytes([mac[0] ^ 0x02, *mac[1:3], 0xFF, 0xFE, *mac[3:6]])
    return _gid_words(b"\xfe\x80" + b"\0" * 6 + eui)


def ipv4_gid(address: str) -> str:
    return _gid_words(b"\0" * 10 + b"\xff\xff" + ipaddress.IPv4Address(address).packed)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def write_tree(root: str | Path, host: str, netdev: str, address: str) -> Path:
    """Write (or refresh) one host's fake RDMA tree under ``root``; returns ``root``."""
    root = Path(root)
    port = root / "sys/class/infiniband" / DEVICE / "ports/1"
    dev = root / "sys/class/infiniband" / DEVICE
    _write(dev / "node_type", "1: CA")
    _write(dev / "fw_ver", "16.35.2000")
    _write(dev / "hca_type", "MT4119")
    _write(port / "state", "4: ACTIVE")
    _write(port / "phys_state", "5: LinkUp")
    _write(port / "link_layer", "Ethernet")
    _write(port / "rate", "100 Gb/sec (4X EDR)")
    _write(port / "lid", "0x0")
    ll, v4 = link_local_gid(host), ipv4_gid(address)
    table = {0: (ll, "IB/RoCE v1"), 1: (ll, "RoCE v2"), 2: (v4, "IB/RoCE v1"), 3: (v4, "RoCE v2")}
    for n in range(GID_SLOTS):
        gid, kind = table.get(n, (ZERO_GID, ""))
        _write(port / "gids" / str(n), gid)
        if kind:
            _write(port / "gid_attrs/types" / str(n), kind)
            _write(port / "gid_attrs/ndevs" / str(n), netdev)
    for name in COUNTERS:
        if not (port / "counters" / name).exists():
            _write(port / "counters" / name, "0")
    for name in HW_COUNTERS:
        if not (port / "hw_counters" / name).exists():
            _write(port / "hw_counters" / name, "0")
    _write(root / "sys/kernel/config/rdma_cm" / DEVICE / "ports/1/default_roce_mode", "RoCE v2")
    uverbs = root / "dev/infiniband/uverbs0"
    uverbs.parent.mkdir(parents=True, exist_ok=True)
    uverbs.touch()
    _write(root / "sys/class/infiniband_verbs/uverbs0/ibdev", DEVICE)
    net = root / "sys/class/net"
    if not net.is_symlink():
        net.parent.mkdir(parents=True, exist_ok=True)
        net.symlink_to("/sys/class/net")
    return root


def tree_root(node_dir: Path) -> Path:
    """Where a lab host's tree lives on the lab machine (its /var/lib/clockmesh bind source)."""
    return node_dir / "var" / "lab" / "sysfs"
