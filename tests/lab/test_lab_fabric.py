"""A real small lab: namespaces, routes, sshd with the lab key, private mounts."""

from __future__ import annotations

import json
import subprocess

import pytest

from lab.fabric import Lab
from lab.status import link_states

pytestmark = [pytest.mark.root, pytest.mark.lab]


def _ifindexes(namespace: str, interface: str) -> tuple[int, int]:
    """An interface's own ifindex and its peer's (``ip -j link``)."""
    out = subprocess.run(["ip", "-n", namespace, "-j", "link", "show", "dev", interface],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    info = json.loads(out)[0]
    return int(info["ifindex"]), int(info["link_index"])


def test_every_node_exists_and_links_are_up(small_lab: Lab) -> None:
    topo = small_lab.topology
    st = small_lab.status()
    assert st.namespaces_expected == 9 and len(st.namespaces_present) == 9
    assert st.bridge_exists
    assert all(lk.up for lk in link_states(topo, set(st.namespaces_present)))
    # no end of a link is numbered like its peer (the kernel would batch its carrier changes)
    for lk in topo.links:
        a, b = (_ifindexes(e.namespace, e.interface) for e in (lk.a, lk.b))
        assert a == b[::-1] and a[0] != a[1], (lk.name, a, b)
    # /sys/class/net inside a host shows that namespace's interfaces, not the root's
    out = small_lab.exec("h1-1", ["ls", "/sys/class/net"], capture_output=True, text=True)
    assert out.returncode == 0
    assert set(out.stdout.split()) == {"lo", "bk0", "mg0"}


def test_leaf_has_l4_ecmp_route_and_sysctls(small_lab: Lab) -> None:
    def sysctl(node: str, key: str) -> str:
        res = small_lab.exec(node, ["sysctl", "-n", key], capture_output=True, text=True)
        return res.stdout.strip()

    assert sysctl("leaf1", "net.ipv4.fib_multipath_hash_policy") == "1"
    assert sysctl("leaf1", "net.ipv4.ip_forward") == "1"
    assert sysctl("spine2", "net.ipv4.conf.all.ignore_routes_with_linkdown") == "1"
    route = small_lab.exec(
        "leaf1", ["ip", "route", "show", "198.18.2.0/24"], capture_output=True, text=True
    ).stdout
    assert route.count("nexthop via") == 2
    assert "dev spine1" in route and "dev spine2" in route


def test_ssh_with_lab_key_and_private_mounts(small_lab: Lab) -> None:
    topo = small_lab.topology
    for node in [*(h.name for h in topo.hosts), topo.ops.name]:
        res = subprocess.run(
            small_lab.ssh_command(node, ["true"]), capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0, f"{node}: {res.stderr}"
    marker = "written-on-h1-1"
    write = small_lab.ssh_command("h1-1", [f"echo {marker} > /etc/clockmesh/marker"])
    assert subprocess.run(write, timeout=30).returncode == 0
    read = subprocess.run(
        small_lab.ssh_command("h1-1", ["cat /etc/clockmesh/marker"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert read.stdout.strip() == marker
    other = subprocess.run(
        small_lab.ssh_command("h2-1", ["ls -A /etc/clockmesh"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert other.returncode == 0 and marker not in other.stdout and "marker" not in other.stdout
    # the file lives in h1-1's own directory, not in the machine's /etc/clockmesh
    assert (small_lab.node_dir("h1-1") / "etc" / "marker").read_text().strip() == marker
    assert not (small_lab.node_dir("h2-1") / "etc" / "marker").exists()
    with open("/proc/mounts") as fh:
        assert str(small_lab.dir) not in fh.read()
    # `lab exec` enters the same private mounts
    res = small_lab.exec("h1-1", ["cat", "/etc/clockmesh/marker"], capture_output=True, text=True)
    assert res.stdout.strip() == marker


def test_ssh_rejects_a_foreign_key(small_lab: Lab, tmp_path) -> None:  # type: ignore[no-untyped-def]
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cmd = small_lab.ssh_command("h1-1", ["true"])
    cmd[cmd.index("-i") + 1] = str(key)
    assert subprocess.run(cmd, capture_output=True, timeout=30).returncode != 0


def test_backend_reaches_other_leaf(small_lab: Lab) -> None:
    code = "import socket;s=socket.socket();s.settimeout(2);print(s.connect_ex(('198.18.2.1', 22)))"
    # nothing listens on the backend address: a fast RST (111) proves the path works
    res = small_lab.exec("h1-1", ["python3", "-c", code], capture_output=True, text=True)
    assert res.stdout.strip() == "111"


def test_cli_status_inventory_exec(small_lab: Lab) -> None:
    import json
    import sys

    base = [sys.executable, "-m", "clockmesh.cli", "lab"]
    where = ["--name", small_lab.name, "--state-dir", str(small_lab.dir)]
    st = subprocess.run([*base, "status", *where, "--json"], capture_output=True, text=True)
    data = json.loads(st.stdout)
    assert len(data["namespaces_present"]) == 9
    assert all(n["sshd_alive"] and n["ssh_port_open"] for n in data["nodes"])
    inv = subprocess.run([*base, "inventory", *where], capture_output=True, text=True)
    assert inv.stdout.strip() == str(small_lab.inventory_path)
    rc = subprocess.run([*base, "exec", *where, "h2-2", "--", "sh", "-c", "exit 3"])
    assert rc.returncode == 3
    bad = subprocess.run(
        [*base, "exec", *where, "h9-9", "--", "true"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "no node named 'h9-9'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_every_host_has_its_own_fake_rdma_tree(small_lab: Lab) -> None:
    """Right after `up`, each host sees an mlx5 GID table with RoCE v1 and v2 entries whose
    IPv4-mapped GIDs carry its own backend address (what the collector reports)."""
    port = "/var/lib/clockmesh/lab/sysfs/sys/class/infiniband/mlx5_0/ports/1"
    for host in small_lab.topology.hosts:
        res = small_lab.exec(
            host.name,
            ["sh", "-c", f"cat {port}/gid_attrs/types/2 {port}/gid_attrs/types/3 {port}/gids/3"],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        v1, v2, gid = res.stdout.split("\n")[:3]
        assert (v1, v2) == ("IB/RoCE v1", "RoCE v2")
        octets = [int(x) for x in host.backend_address.split(".")]
        assert gid.endswith(f"ffff:{octets[0]:02x}{octets[1]:02x}:{octets[2]:02x}{octets[3]:02x}")


def test_a_capacity_is_changed_in_place_and_a_one_frame_buffer_refused(small_lab: Lab) -> None:
    """`lab capacity` twice changes the queues (tc cannot change an htb root in place:
    the second call failed with tc's own words), each a buffer of the time's bytes; a
    buffer of one frame is refused before anything is touched."""
    import sys

    from lab import capacity

    base = [sys.executable, "-m", "clockmesh.cli", "lab", "capacity",
            "--name", small_lab.name, "--state-dir", str(small_lab.dir)]  # fmt: skip
    end = next(lk for lk in small_lab.topology.links if lk.kind == "fabric").a

    def queues() -> list[str]:
        out = subprocess.run(["ip", "netns", "exec", end.namespace, "tc", "qdisc", "show",
                              "dev", end.interface], capture_output=True, text=True).stdout  # fmt: skip
        return [ln.split(" limit ")[1].split()[0] for ln in out.splitlines() if "fifo" in ln]

    try:
        first = subprocess.run([*base, "--buffer", "500us"], capture_output=True, text=True)
        assert first.returncode == 0, first.stderr
        assert queues() == ["3125b", "3125b", "3125b"]  # 500 µs at 50 Mbit/s, in bytes
        again = subprocess.run([*base, "--buffer", "1ms"], capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        assert "queues of 6250 bytes (1ms at 50mbit, 4 full frames)" in again.stdout, again.stdout
        assert queues() == ["6250b", "6250b", "6250b"]
        tiny = subprocess.run([*base, "--buffer", "200us"], capture_output=True, text=True)
        assert tiny.returncode != 0 and "Traceback" not in tiny.stderr
        assert "--buffer: 200 µs holds 1 full frame at 50mbit" in tiny.stderr
        assert len(tiny.stderr.strip().splitlines()) == 1
        assert queues() == ["6250b", "6250b", "6250b"]  # left as it was
        assert capacity.current(small_lab)["buffer_bytes"] == 6250
    finally:
        capacity.remove(small_lab)
