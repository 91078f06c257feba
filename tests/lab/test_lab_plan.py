"""The lab's naming/addressing plan, topology file and inventory (no root needed)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from collector.configfile import ConfigError
from lab import inventory, plan, topology


def test_default_plan_names_and_addresses() -> None:
    topo = plan.build("demo", 37)
    assert [h.name for h in topo.hosts][:5] == ["h1-1", "h1-2", "h1-3", "h1-4", "h2-1"]
    assert len(topo.hosts) == 16 and len(topo.leaves) == 4 and len(topo.spines) == 2
    h = topo.host("h1-2")
    assert (h.namespace, h.rack, h.backend_address, h.backend_interface) == (
        "demo-h1-2",
        "leaf1",
        "198.18.1.3",
        "bk0",
    )
    assert topo.ops.mgmt_address == "198.19.37.2" and topo.mgmt.gateway == "198.19.37.1"
    assert topo.mgmt.bridge == "cmbr37"
    # every address unique, inside the lab ranges; every interface name fits IFNAMSIZ
    backend = [e.address for lk in topo.links for e in (lk.a, lk.b)]
    assert len(set(backend)) == len(backend)
    assert all(ipaddress.IPv4Address(a) in ipaddress.IPv4Network("198.18.0.0/16") for a in backend)
    mgmt = [h.mgmt_address for h in topo.hosts] + [topo.ops.mgmt_address]
    assert len(set(mgmt)) == len(mgmt)
    names = [e.interface for lk in topo.links for e in (lk.a, lk.b)]
    names += [plan.mgmt_root_iface(254, n) for n in topo.nodes]
    assert max(len(n) for n in names) <= 15
    # the /31 of each access link is inside the leaf's host subnet
    for host in topo.hosts:
        link = topo.access_link(host.name)
        subnet = ipaddress.IPv4Network(next(r.subnet for r in topo.leaves if r.name == host.rack))
        assert ipaddress.IPv4Address(link.b.address) in subnet
        assert link.name == f"{host.name}-{host.rack}"


def test_paths_one_per_spine() -> None:
    topo = plan.build("demo", 1, spines=3, leaves=2, hosts_per_leaf=1)
    assert topo.paths("h1-1", "h2-1") == [
        ("h1-1-leaf1", "leaf1-spine1", "leaf2-spine1", "h2-1-leaf2"),
        ("h1-1-leaf1", "leaf1-spine2", "leaf2-spine2", "h2-1-leaf2"),
        ("h1-1-leaf1", "leaf1-spine3", "leaf2-spine3", "h2-1-leaf2"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": "Demo"}, "--name"),
        ({"name": "a-b"}, "--name"),
        ({"spines": 0}, "--spines"),
        ({"leaves": 200}, "--leaves"),
        ({"leaves": 10, "hosts_per_leaf": 30}, "at most 245"),
    ],
)
def test_bad_parameters_name_the_option(kwargs: dict, fragment: str) -> None:
    args = {"name": "demo", "slot": 1, **kwargs}
    with pytest.raises(plan.PlanError, match=fragment):
        plan.build(**args)


def test_namespace_pattern_is_exact() -> None:
    pat = plan.namespace_pattern("a")
    assert pat.match("a-h1-1") and pat.match("a-leaf2") and pat.match("a-ops")
    assert not pat.match("ab-h1-1") and not pat.match("a-h1-h1-1") and not pat.match("a-foo")


def test_clock_skew_is_seeded_and_bounded() -> None:
    one = plan.build("demo", 1, clock_seed=7)
    two = plan.build("demo", 1, clock_seed=7)
    other = plan.build("demo", 1, clock_seed=8)
    clocks = [h.clock for h in one.hosts]
    assert clocks == [h.clock for h in two.hosts] != [h.clock for h in other.hosts]
    assert all(c is not None and abs(c.offset_ns) <= 5_000_000 for c in clocks)
    assert all(c is not None and abs(c.drift_ppm) <= 50 for c in clocks)
    assert len({c.offset_ns for c in clocks if c}) == len(clocks)


def test_topology_roundtrip_and_errors(tmp_path: Path) -> None:
    topo = plan.build("demo", 5, leaves=2, hosts_per_leaf=2, clock_seed=1)
    path = tmp_path / "topology.json"
    path.write_bytes(topology.dumps(topo))
    assert topology.load(path) == topo
    with pytest.raises(ConfigError, match="file not found"):
        topology.load(tmp_path / "missing.json")
    path.write_text('{"lab": "demo"}')
    with pytest.raises(ConfigError, match=r"topology.json: version: required key is missing"):
        topology.load(path)


def test_inventory_contract(tmp_path: Path) -> None:
    topo = plan.build("demo", 9, leaves=2, hosts_per_leaf=2, clock_seed=3)
    inv = inventory.build(topo, tmp_path / "id", tmp_path / "kh", "ab" * 32)
    path = tmp_path / "inventory.yml"
    inventory.write(path, inv, "demo")
    data = yaml.safe_load(path.read_text())
    allv = data["all"]["vars"]
    assert allv["ansible_user"] == "root" and allv["clockmesh_lab"] is True
    assert allv["clockmesh_ingest_url"] == "http://198.19.9.2:8470"
    assert "StrictHostKeyChecking=yes" in allv["ansible_ssh_common_args"]
    assert f"UserKnownHostsFile={tmp_path / 'kh'}" in allv["ansible_ssh_common_args"]
    assert len(allv["clockmesh_fleet_key"]) == 64
    racks = data["all"]["children"]["collectors"]["children"]
    assert sorted(racks) == ["leaf1", "leaf2"]
    h = racks["leaf2"]["hosts"]["h2-2"]
    assert h["clockmesh_rack"] == "leaf2" and h["clockmesh_backend_interface"] == "bk0"
    assert h["clockmesh_backend_address"] == "198.18.2.3"
    assert set(h["clockmesh_lab_clock"]) == {"offset_ns", "drift_ppm"}
    assert data["all"]["children"]["opsbox"]["hosts"]["ops"]["ansible_host"] == "198.19.9.2"
    assert path.stat().st_mode & 0o077 == 0  # holds the fleet key


def test_a_standby_ops_box_gets_its_namespace_address_and_the_inventory_lists_both(
    tmp_path: Path,
) -> None:
    topo = plan.build("demo", 9, leaves=2, hosts_per_leaf=2, ops=2)
    assert topo.standby is not None and [b.name for b in topo.ops_boxes] == ["ops", "ops2"]
    assert (topo.standby.namespace, topo.standby.mgmt_address) == ("demo-ops2", "198.19.9.3")
    assert topo.node_namespace("ops2") == "demo-ops2" and "ops2" in topo.nodes
    mgmt = [n.mgmt_address for n in topo.mgmt_nodes]
    assert len(set(mgmt)) == len(mgmt) == 6
    assert plan.namespace_pattern("demo").match("demo-ops2")
    path = tmp_path / "topology.json"
    path.write_bytes(topology.dumps(topo))
    assert topology.load(path) == topo
    inv = inventory.build(topo, tmp_path / "id", tmp_path / "kh", "ab" * 32)
    assert inv["all"]["vars"]["clockmesh_ingest_url"] == "http://198.19.9.2:8470"
    assert inv["all"]["vars"]["clockmesh_ingest_urls"] == [
        "http://198.19.9.2:8470",
        "http://198.19.9.3:8470",
    ]
    assert inv["all"]["children"]["opsbox"]["hosts"] == {
        "ops": {"ansible_host": "198.19.9.2"},
        "ops2": {"ansible_host": "198.19.9.3"},
    }
    one = inventory.build(plan.build("demo", 9), tmp_path / "id", tmp_path / "kh", "ab" * 32)
    assert "clockmesh_ingest_urls" not in one["all"]["vars"]  # one box: as before
    with pytest.raises(plan.PlanError, match="--ops: expected 1 or 2"):
        plan.build("demo", 9, ops=3)
