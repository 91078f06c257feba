"""Two ops boxes (issue 29): the primary's ingest daemon is killed with kill -9 in the
middle of a host-link flap; the standby names the flap; the primary comes back and
catches up from the collectors' spools: over a 10-minute window spanning the outage
(issue 29's acceptance) each box's store holds every probe record exactly once (counts and
keys compared with DuckDB), and no collector dropped or still holds a segment.

Collectors run in the lab hosts' namespaces and ship to both daemons over the management
network; the flap is a plain ``ip link set`` on the leaf side of a host's link.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml

from analytics.remediate import records as remediations
from collector import records
from lab import fleet, frr
from lab.fabric import Lab
from tests.lab.helpers import wait_for

pytestmark = [pytest.mark.root, pytest.mark.lab]

DETECT = {"detect_interval_s": 0.2, "detect_clear_s": 10}
ROOT = Path(__file__).resolve().parents[2]
OUTAGE_S = 45.0  # the primary stays down this long: ~90 segments per collector to catch up
WINDOW_S = 600.0  # the checked window: 10 minutes, both boxes up at its start and its end
KILL_AT_S = 240.0  # the primary dies this long into the window (4 min of both boxes before)


def _all_hosts_on(url: str, n: int) -> Callable[[], bool]:
    return lambda: len(_live(url)["hosts"]) == n


def _live(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/v1/live", timeout=10) as resp:
        return json.load(resp)


def _open_flaps(url: str) -> list[dict[str, Any]]:
    return [a for a in _live(url)["anomalies"]["open"] if a["kind"] == "flapping_link"]


def _statuses(hosts: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in names:
        try:
            out[name] = json.loads((hosts / name / "status.json").read_text())
        except (OSError, ValueError):
            out[name] = {}
    return out


def _window(store: Path, table: str, time_col: str, t0: int, t1: int) -> dict[str, Any]:
    """Count, distinct (src, seq) keys and the keys of ``table`` in [t0, t1) of one store."""
    glob = str(store / table / "**" / "*.parquet")
    con = duckdb.connect()
    try:
        rel = (
            f"SELECT src, seq FROM read_parquet('{glob}', union_by_name=true) "
            f"WHERE {time_col} >= {t0} AND {time_col} < {t1}"
        )
        count, distinct = con.execute(
            f"SELECT count(*), count(DISTINCT (src, seq)) FROM ({rel})"
        ).fetchone()  # type: ignore[misc]
        gaps = con.execute(
            f"SELECT src, max(seq) - min(seq) + 1 - count(DISTINCT seq) FROM ({rel}) GROUP BY src"
        ).fetchall()
        keys = set(con.execute(rel).fetchall())
    finally:
        con.close()
    return {"count": count, "distinct": distinct, "gaps": dict(gaps), "keys": keys}


@pytest.mark.timeout(1500)
def test_standby_names_a_flap_while_the_primary_is_killed_and_both_end_up_complete(
    lab_factory: Callable[..., Lab], tmp_path: Path
) -> None:
    lab = lab_factory("sb", spines=2, leaves=3, hosts_per_leaf=1)
    topo = lab.topology
    names = [h.name for h in topo.hosts]
    key = b"standby-lab-fleet-key-0123456789"
    hosts = tmp_path / "hosts"
    primary = standby = None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    link = topo.link("h2-1-leaf2")
    leaf = link.b  # the switch side: the host sees its carrier go

    def ip(state: str) -> None:
        subprocess.run(["ip", "-n", leaf.namespace, "link", "set", leaf.interface, state],
                       check=True)  # fmt: skip

    try:
        primary, url_a = fleet.start_opsbox(lab, tmp_path / "a", key, **DETECT)
        standby, url_b = fleet.start_opsbox(lab, tmp_path / "b", key, **DETECT)
        procs = fleet.start(lab, hosts, key, [url_a, url_b], {"trace_interval_s": 1.0})
        for url in (url_a, url_b):
            wait_for(_all_hosts_on(url, len(names)), 60, f"every host shipping to {url}")
        time.sleep(3.0)
        t0 = time.time_ns()  # the window opens: both boxes up
        t_open = time.monotonic()
        # Both boxes take the fleet's records for KILL_AT_S: a standing fleet, not a cold one.
        wait_for(
            lambda: time.monotonic() - t_open >= KILL_AT_S
            and all(
                st and [b["last_error"] for b in st["shipping"]["boxes"]] == ["", ""]
                for st in _statuses(hosts, names).values()
            ),
            KILL_AT_S + 60,
            f"{KILL_AT_S:.0f} s of every collector shipping to both boxes",
            every=1.0,
        )  # fmt: skip

        ip("down")  # the flap starts ...
        primary.kill()  # ... and the primary dies in the middle of it (kill -9)
        primary.wait()
        t_down = time.monotonic()
        (flap,) = wait_for(lambda: _open_flaps(url_b), 15, "the standby names the flap")
        latency = time.monotonic() - t_down
        print(f"standby: link down -> open anomaly in /v1/live: {latency:.2f} s")
        assert flap["link"] == "h2-1-leaf2" and "down now" in flap["summary"], flap
        assert latency < 5.0
        time.sleep(3.0)
        ip("up")
        # The collectors keep shipping to the standby and keep the primary's segments.
        wait_for(
            lambda: all(
                st and st["shipping"]["boxes"][1]["last_error"] == ""
                and st["shipping"]["boxes"][0]["waiting_segments"] >= 10
                for st in _statuses(hosts, names).values()
            ),
            60,
            "every collector shipping to the standby, holding segments for the primary",
        )  # fmt: skip
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - t_down)))
        down_for = time.monotonic() - t_down

        primary = fleet.restart_opsbox(tmp_path / "a", url_a)  # same store, same port
        wait_for(
            lambda: all(
                st and st["shipping"]["boxes"][0]["waiting_segments"] <= 1
                for st in _statuses(hosts, names).values()
            ),
            120,
            "the primary caught up from the spools",
        )
        print(f"primary down for {down_for:.1f} s, caught up after the restart")
        t1 = t0 + int(WINDOW_S * 1e9)  # the window closes WINDOW_S after it opened
        assert time.time_ns() < t1, "the outage and catch-up overran the 10-minute window"
        # Both boxes keep up to the window's end: every collector acknowledged by both.
        wait_for(
            lambda: time.time_ns() >= t1 + 3_000_000_000
            and all(
                st and [b["last_error"] for b in st["shipping"]["boxes"]] == ["", ""]
                and max(b["waiting_segments"] for b in st["shipping"]["boxes"]) <= 1
                for st in _statuses(hosts, names).values()
            ),
            WINDOW_S + 60,
            "the window's end with every collector shipping to both boxes",
            every=1.0,
        )  # fmt: skip
        fleet.stop(procs)  # SIGTERM: flush, roll, ship what is left to both
        procs = {}
        final = _statuses(hosts, names)
    finally:
        ip("up")
        fleet.stop(procs)
        fleet.stop_opsbox(primary)
        fleet.stop_opsbox(standby)

    for st in final.values():  # nothing dropped, nothing left for either box
        assert st["spool"]["dropped_rows"] == 0 and st["spool"]["segments"] == 0, st["spool"]
        assert [b["waiting_segments"] for b in st["shipping"]["boxes"]] == [0, 0]
    for table, col in (("probe_tx", "tx_ns"), ("probe_rx", "rx_ns")):
        a = _window(tmp_path / "a" / "store", table, col, t0, t1)
        b = _window(tmp_path / "b" / "store", table, col, t0, t1)
        print(
            f"{table}: primary {a['count']} rows, standby {b['count']} rows over {WINDOW_S:.0f} s"
        )
        assert a["count"] > 10_000, a["count"]
        for box in (a, b):
            assert box["count"] == box["distinct"], f"{table}: a record stored twice"
        assert a["keys"] == b["keys"], f"{table}: the boxes disagree"
        if table == "probe_tx":  # each sender's seqs are consecutive: none missing (the
            # flapping host's sends may fail while its link is down: left out)
            flapping = records.host_id("h2-1")
            assert all(g == 0 for src, g in a["gaps"].items() if src != flapping), a["gaps"]
            assert set(a["gaps"]) == set(b["gaps"]) and len(a["gaps"]) == len(names)


SPY = """#!/bin/sh
# The fabric's vtysh, and before any change what the OTHER ops box (ops2) sees right now.
case "$*" in
  *"configure terminal"*)
    {{ echo "== change: $*"
      {cli} remediate list --store {store} --topology {topology} 2>&1
      {cli} remediate plan --store {store} --topology {topology} \\
          --action fabric_link_out --target leaf1-spine1 2>&1
    }} > {seen}/$$.txt ;;  # one file per change: the switches change in parallel
esac
exec "$@"
"""


def _bgp_shut(lab: Lab) -> dict[str, list[str]]:
    """Each router's BGP neighbours shut now (FRR's running configuration)."""
    out = {}
    for r in (*lab.topology.leaves, *lab.topology.spines):
        conf = subprocess.run(frr.vtysh_argv(lab.topology.lab, r, "show running-config"),
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        out[r.name] = sorted(ln.split()[1] for ln in conf.splitlines()
                             if ln.strip().startswith("neighbor ") and ln.endswith(" shutdown"))  # fmt: skip
    return out


@pytest.mark.timeout(900)
def test_a_remediation_from_one_box_is_listed_and_capped_on_the_other_before_it_runs(
    lab_factory: Callable[..., Lab], tmp_path: Path
) -> None:
    """Box ops takes leaf1-spine2 out through FRR with the real playbook; at the first
    switch change, box ops2's `remediate list` already shows the run and ops2's cap
    refuses leaf1's other uplink; afterwards both stores hold the outcome, and ops2
    undoes it (the switches as before, the remediation undone in both stores)."""
    lab = lab_factory("sr", spines=2, leaves=2, hosts_per_leaf=1)
    key = b"standby-remediate-fleet-key-0123"
    box_a = box_b = None
    stores = [tmp_path / "a" / "store", tmp_path / "b" / "store"]
    cli = Path(sys.executable).with_name("clockmesh")
    seen = tmp_path / "seen"
    seen.mkdir()
    try:
        box_a, _ = fleet.start_opsbox(lab, tmp_path / "a", key, **DETECT)
        box_b, _ = fleet.start_opsbox(lab, tmp_path / "b", key, **DETECT)
        inv_path = fleet.opsbox_inventory(lab, stores, tmp_path / "inventory.yml")
        spy = tmp_path / "spy.sh"
        spy.write_text(SPY.format(cli=cli, store=stores[1], topology=lab.topology_path,
                                  seen=seen))  # fmt: skip
        spy.chmod(0o755)
        inv = yaml.safe_load(inv_path.read_text())
        for hv in inv["all"]["children"]["fabric"]["hosts"].values():
            hv["clockmesh_fabric_link_vtysh"] = [str(spy), *hv["clockmesh_fabric_link_vtysh"]]
        inv_path.write_text(yaml.safe_dump(inv))
        original = _bgp_shut(lab)
        assert not any(original.values()), original

        def play(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(cli.with_name("ansible-playbook")), "-i", str(inv_path),
                 str(ROOT / "playbooks" / name), *extra],
                capture_output=True, text=True, cwd=ROOT, timeout=300,
            )  # fmt: skip

        run = play("remediate.yml", "-e", "action=fabric_link_out", "-e", "target=leaf1-spine2")
        assert run.returncode == 0, run.stdout[-3000:]
        (rem,) = [r for r in remediations.read_remediations(stores[0]) if not r.check_mode]
        assert (rem.status, rem.box) == ("ok", "ops")
        changes = [f.read_text() for f in sorted(seen.iterdir())]
        assert len(changes) == 2, changes  # leaf1 and spine2, each seen before its change
        print("ops2 at a switch change:", changes[0], sep="\n")
        for change in changes:
            assert (
                f"{rem.remediation_id}  running  fabric_link_out leaf1-spine2 from ops box ops"
                in change
            ), change
            assert "blast-radius cap: leaf1 would have 2 of its 2 uplinks out " in change
        shut = _bgp_shut(lab)
        assert [n for n, v in shut.items() if v] == ["leaf1", "spine2"], shut

        # Afterwards ops2 holds the same outcome under the same id, and counts it.
        (theirs,) = [r for r in remediations.read_remediations(stores[1]) if not r.check_mode]
        assert (theirs.remediation_id, theirs.status, theirs.box) == (
            rem.remediation_id, "ok", "ops"
        )  # fmt: skip
        capped = subprocess.run(
            [str(cli), "remediate", "plan", "--store", str(stores[1]), "--topology",
             str(lab.topology_path), "--action", "fabric_link_out", "--target", "leaf1-spine1"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert capped.returncode == 1
        assert "leaf1 would have 2 of its 2 uplinks out (leaf1-spine1, leaf1-spine2)" in (
            capped.stderr
        )

        # ops2 undoes what ops did: the switches as before, undone in both stores.
        undo = play("undo.yml", "-e", "clockmesh_remediate_box=ops2",
                    "-e", f"remediation_id={rem.remediation_id}")  # fmt: skip
        assert undo.returncode == 0, undo.stdout[-3000:]
        assert _bgp_shut(lab) == original
        for store in stores:
            states = {r.remediation_id: r.status for r in remediations.read_remediations(store)
                      if not r.check_mode}  # fmt: skip
            assert states[rem.remediation_id] == "undone", (store, states)
    finally:
        fleet.stop_opsbox(box_a)
        fleet.stop_opsbox(box_b)
