"""The lab's control plane on paper: FRR configs and the convergence verdict (no root)."""

from __future__ import annotations

from lab import convergence, frr, plan
from lab.convergence import HOST_ROUTE, Fib
from lab.frr import Session
from lab.topology import Topology


def _topo() -> Topology:
    return plan.build("unit", 1, spines=2, leaves=3, hosts_per_leaf=1)


def _healthy(topo: Topology) -> tuple[dict[str, bool], dict[str, Fib], list[Session]]:
    """What a converged fabric looks like: every link up, full ECMP, every session up."""
    fabric = {(lk.a.node, lk.b.node): lk for lk in topo.links if lk.kind == "fabric"}
    link_up = {lk.name: True for lk in topo.links}
    fibs: dict[str, Fib] = {}
    for leaf in topo.leaves:
        fibs[leaf.name] = {
            str(o.subnet): {fabric[(leaf.name, s.name)].b.address for s in topo.spines}
            for o in topo.leaves
            if o.name != leaf.name
        }
    for s in topo.spines:
        fibs[s.name] = {str(lf.subnet): {fabric[(lf.name, s.name)].a.address} for lf in topo.leaves}
    for h in topo.hosts:
        fibs[h.name] = {HOST_ROUTE: {topo.access_link(h.name).b.address}}
    sessions = [
        Session(end.node, other.node, other.address, "Established", "up")
        for lk in fabric.values()
        for end, other in ((lk.a, lk.b), (lk.b, lk.a))
    ]
    return link_up, fibs, sessions


def test_asns_follow_rfc7938_one_per_leaf_one_for_the_spines() -> None:
    topo = _topo()
    assert {frr.asn(s) for s in topo.spines} == {65000}
    assert [frr.asn(lf) for lf in topo.leaves] == [65001, 65002, 65003]


def test_bgpd_config_peers_every_fabric_neighbour_with_bfd_and_ecmp() -> None:
    topo = _topo()
    leaf = frr.router(topo, "leaf2")
    text = frr.bgpd_config(topo, leaf)
    assert "router bgp 65002" in text
    assert " neighbor fabric remote-as external" in text
    assert " neighbor fabric bfd profile fabric" in text
    assert "  maximum-paths 64" in text
    assert f"  network {leaf.subnet}" in text
    uplinks = [lk for lk in topo.links if lk.kind == "fabric" and lk.a.node == "leaf2"]
    for lk in uplinks:
        assert f" neighbor {lk.b.address} peer-group fabric" in text
    spine = frr.bgpd_config(topo, frr.router(topo, "spine1"))
    assert "router bgp 65000" in spine and "  network" not in spine  # spines originate nothing
    assert spine.count("peer-group fabric\n") == 3
    # a returned link is re-learned at once: no update coalescing, and only the spine
    # connects (two eager ends collide, and FRR sometimes re-makes the session ~0.5 s later)
    assert " coalesce-time 0" in text and " coalesce-time 0" in spine
    assert " neighbor fabric passive" in text and "passive" not in spine
    bfd = frr.bfdd_config(leaf)
    assert "receive-interval 100" in bfd and "detect-multiplier 3" in bfd


def test_zebra_installs_plain_multipath_routes() -> None:
    assert "no zebra nexthop kernel enable" in frr.zebra_config(_topo().leaves[0])


def test_healthy_fabric_is_converged() -> None:
    topo = _topo()
    result = convergence.assess(topo, *_healthy(topo))
    assert result.converged, result.problems
    leaf_groups = [g for g in result.groups if g.router.startswith("leaf")]
    assert len(leaf_groups) == 6 and all(g.have == ("spine1", "spine2") for g in leaf_groups)


def test_down_link_with_stale_route_is_a_black_hole() -> None:
    topo = _topo()
    link_up, fibs, sessions = _healthy(topo)
    link_up["leaf1-spine2"] = False
    result = convergence.assess(topo, link_up, fibs, sessions)
    assert not result.converged
    # leaf2 and leaf3 still send rack 1's traffic to spine2, which lost its link to leaf1;
    # leaf1 still uses spine2 itself; spine2 still routes rack 1 over the dead link.
    assert "black hole: leaf2 sends leaf1's traffic via spine2, which cannot deliver it" in (
        result.problems
    )
    assert "black hole: leaf1 sends leaf3's traffic via spine2, which cannot deliver it" in (
        result.problems
    )
    assert "black hole: spine2 routes leaf1 over leaf1-spine2, which is down" in result.problems
    # sessions on the dead link are not expected to be up
    assert not any(p.startswith("BGP") for p in result.problems)


def test_withdrawn_link_is_converged_and_missing_path_is_named() -> None:
    topo = _topo()
    link_up, fibs, sessions = _healthy(topo)
    link_up["leaf1-spine2"] = False
    spine2_leaf1 = topo.link("leaf1-spine2").b.address
    for other in ("leaf2", "leaf3"):
        fibs[other][str(topo.leaves[0].subnet)] -= {topo.link(f"{other}-spine2").b.address}
    for o in topo.leaves[1:]:
        fibs["leaf1"][str(o.subnet)] -= {spine2_leaf1}
    del fibs["spine2"][str(topo.leaves[0].subnet)]
    result = convergence.assess(topo, link_up, fibs, sessions)
    assert result.converged, result.problems
    # the link comes back but leaf3 never re-learns rack 1 via spine2
    link_up["leaf1-spine2"] = True
    for other in ("leaf1", "leaf2"):
        fibs[other] = _healthy(topo)[1][other]
    fibs["spine2"] = _healthy(topo)[1]["spine2"]
    result = convergence.assess(topo, link_up, fibs, sessions)
    assert result.problems == [
        "missing path: leaf3 has no route to leaf1 via spine2 (both links up)"
    ]


def test_sessions_down_on_an_up_link_and_missing_host_route_are_named() -> None:
    topo = _topo()
    link_up, fibs, sessions = _healthy(topo)
    sessions[0] = Session(sessions[0].router, sessions[0].peer, sessions[0].address, "Idle", "")
    sessions[1] = Session(
        sessions[1].router, sessions[1].peer, sessions[1].address, "Established", "down"
    )
    del fibs["h2-1"][HOST_ROUTE]
    problems = convergence.assess(topo, link_up, fibs, sessions).problems
    assert any(
        p.startswith(f"BGP {sessions[0].router}–{sessions[0].peer} is Idle") for p in problems
    )
    assert any(
        p.startswith(f"BFD {sessions[1].router}–{sessions[1].peer} is down") for p in problems
    )
    assert any(p.startswith("missing path: h2-1 has no route to the fabric") for p in problems)


def test_link_shut_on_both_ends_is_out_of_service_on_one_end_a_problem() -> None:
    import dataclasses

    topo = _topo()
    link_up, fibs, sessions = _healthy(topo)
    lk = topo.link("leaf1-spine2")
    # Routed around, as after the remediation: nobody uses the link.
    for other in ("leaf2", "leaf3"):
        fibs[other][str(topo.leaves[0].subnet)] -= {topo.link(f"{other}-spine2").b.address}
    for o in topo.leaves[1:]:
        fibs["leaf1"][str(o.subnet)] -= {lk.b.address}
    del fibs["spine2"][str(topo.leaves[0].subnet)]

    def shut(on: set[str]) -> list:
        return [
            dataclasses.replace(s, state="Idle (Admin)")
            if {s.router, s.peer} == {"leaf1", "spine2"} and s.router in on
            else dataclasses.replace(s, state="Active")
            if {s.router, s.peer} == {"leaf1", "spine2"}
            else s
            for s in sessions
        ]

    both = convergence.assess(topo, link_up, fibs, shut({"leaf1", "spine2"}))
    assert both.converged, both.problems
    assert both.out_of_service == {"leaf1-spine2"}
    one = convergence.assess(topo, link_up, fibs, shut({"leaf1"}))
    assert not one.converged and not one.out_of_service
    assert any(p.startswith("BGP leaf1–spine2 is Idle (Admin)") for p in one.problems)
