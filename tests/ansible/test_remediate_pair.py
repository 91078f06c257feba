"""playbooks/remediate.yml with two ops boxes (issue 29), run for real by ansible-playbook.

Both ops boxes are this machine (local connection), each with its own store; the two
switches of leaf1-spine2 are local too, their FRR shell a small fake vtysh that keeps the
running configuration in a file. Before it changes anything, the fake vtysh asks the
*other* box (``clockmesh remediate list`` and ``history --json`` on its store) what it
sees: the evidence that the remediation was visible there before the first change. No
root, no lab: what is tested is the playbook's and the CLI's pair logic.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible.conftest import ROOT, recap, tool_env

CLI = str(Path(sys.executable).with_name("clockmesh"))
ANSIBLE = str(Path(sys.executable).with_name("ansible-playbook"))
LINK = "leaf1-spine2"

FAKE_VTYSH = """#!{python}
import json, subprocess, sys
conf, spy_store, spy_log = sys.argv[1:4]
cmds = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "-c"]
if cmds == ["show running-config"]:
    sys.stdout.write(open(conf).read())
    sys.exit(0)
# A change: first what the other ops box sees now, then the change.
seen = {{
    "list": subprocess.run([{cli!r}, "remediate", "list", "--store", spy_store,
                            "--topology", {topology!r}], capture_output=True, text=True).stdout,
    "history": json.loads(subprocess.run([{cli!r}, "remediate", "history", "--json",
                                          "--store", spy_store], capture_output=True,
                                         text=True).stdout or "[]"),
    "cmds": cmds,
}}
with open(spy_log, "a") as f:
    f.write(json.dumps(seen) + "\\n")
lines = open(conf).read().splitlines()
for c in cmds:
    if c.startswith("neighbor ") and c.endswith(" shutdown"):
        lines.append(" " + c)
    elif c.startswith("no neighbor "):
        lines = [ln for ln in lines if ln.strip() != c[3:]]
open(conf, "w").write("\\n".join(lines) + "\\n")
"""


def _topology() -> dict[str, Any]:
    links, hosts, n = [], [], 0
    for li in (1, 2):
        hosts.append({"name": f"h{li}-1", "rack": f"leaf{li}"})
        links.append({"name": f"h{li}-1-leaf{li}", "kind": "access",
                      "a": {"node": f"h{li}-1", "address": f"198.18.{li}.1"},
                      "b": {"node": f"leaf{li}", "address": f"198.18.{li}.254"}})  # fmt: skip
        for si in (1, 2):
            links.append({"name": f"leaf{li}-spine{si}", "kind": "fabric",
                          "a": {"node": f"leaf{li}", "address": f"198.18.128.{n}"},
                          "b": {"node": f"spine{si}", "address": f"198.18.128.{n + 1}"}})  # fmt: skip
            n += 2
    return {"hosts": hosts, "links": links}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed once this returns: connection refused


@pytest.fixture
def pair(tmp_path: Path) -> dict[str, Any]:
    topo = _topology()
    (tmp_path / "topology.json").write_text(json.dumps(topo))
    stores = {"ops": tmp_path / "a" / "store", "ops2": tmp_path / "b" / "store"}
    for s in stores.values():
        s.mkdir(parents=True)
    python = sys.executable
    fake = tmp_path / "vtysh.py"
    fake.write_text(FAKE_VTYSH.format(python=python, cli=CLI,
                                      topology=str(tmp_path / "topology.json")))  # fmt: skip
    fake.chmod(0o755)
    fabric: dict[str, Any] = {}
    for name, asn, peers in (("leaf1", 65001, ["198.18.128.1", "198.18.128.3"]),
                             ("spine2", 65100, ["198.18.128.2", "198.18.128.6"])):  # fmt: skip
        conf = tmp_path / f"{name}.conf"
        conf.write_text(f"router bgp {asn}\n"
                        + "".join(f" neighbor {p} remote-as external\n" for p in peers))  # fmt: skip
        fabric[name] = {
            "ansible_connection": "local", "ansible_python_interpreter": python,
            "clockmesh_switch_name": name, "clockmesh_fabric_link_save": False,
            # the other box's store is the one watched: ops acts in these tests
            "clockmesh_fabric_link_vtysh": [str(fake), str(conf), str(stores["ops2"]),
                                            str(tmp_path / "seen.jsonl")],
        }  # fmt: skip

    def inventory(ops2_down: bool = False) -> Path:
        ops2: dict[str, Any] = {"ansible_connection": "local", "ansible_python_interpreter": python,
                                "clockmesh_ops_store_dir": str(stores["ops2"])}  # fmt: skip
        if ops2_down:  # an SSH host nothing answers on: UNREACHABLE at once
            ops2 = {"ansible_host": "127.0.0.1", "ansible_port": _closed_port(),
                    "ansible_connection": "ssh", "clockmesh_ops_store_dir": str(stores["ops2"])}  # fmt: skip
        inv = {"all": {
            "vars": {"clockmesh_ops_cli": CLI,
                     "clockmesh_ops_topology_file": str(tmp_path / "topology.json")},
            "children": {
                "opsbox": {"hosts": {
                    "ops": {"ansible_connection": "local", "ansible_python_interpreter": python,
                            "clockmesh_ops_store_dir": str(stores["ops"])},
                    "ops2": ops2}},
                "fabric": {"hosts": fabric},
                "collectors": {"hosts": {}},
            },
        }}  # fmt: skip
        path = tmp_path / ("inventory-down.yml" if ops2_down else "inventory.yml")
        path.write_text(yaml.safe_dump(inv))
        return path

    return {"tmp": tmp_path, "stores": stores, "inventory": inventory}


def _play(inventory: Path, playbook: str, *extra: str) -> tuple[int, str]:
    env = {**tool_env(), "ANSIBLE_SSH_ARGS": "-o ConnectTimeout=5 -o BatchMode=yes"}
    res = subprocess.run(
        [ANSIBLE, "-i", str(inventory), str(ROOT / "playbooks" / playbook), *extra],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip
    return res.returncode, res.stdout + res.stderr


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _history(store: Path) -> list[dict[str, Any]]:
    out = _cli("remediate", "history", "--json", "--store", str(store))
    assert out.returncode == 0, out.stderr
    return [r for r in json.loads(out.stdout) if not r["check_mode"]]


def _seen(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "seen.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _plan(pair: dict[str, Any], box: str, *argv: str) -> subprocess.CompletedProcess[str]:
    other = "ops2" if box == "ops" else "ops"
    also = json.dumps(_history(pair["stores"][other]))
    return _cli("remediate", "plan", "--store", str(pair["stores"][box]), "--topology",
                str(pair["tmp"] / "topology.json"), "--box", box, "--also", also, *argv)  # fmt: skip


@pytest.mark.skipif(os.environ.get("CLOCKMESH_SKIP_ANSIBLE") == "1", reason="asked to skip")
def test_a_remediation_from_one_box_is_seen_and_counted_by_the_other_before_it_runs(
    pair: dict[str, Any],
) -> None:
    tmp, stores = pair["tmp"], pair["stores"]
    rc, out = _play(pair["inventory"](), "remediate.yml",
                    "-e", "action=fabric_link_out", "-e", f"target={LINK}")  # fmt: skip
    assert rc == 0, out[-3000:]

    # At the first change, the other box (ops2) already listed it as running from ops.
    seen = _seen(tmp)
    assert len(seen) == 2, seen  # leaf1 and spine2, each changed once
    first = seen[0]
    (row,) = first["history"]
    assert (row["action"], row["target"], row["status"]) == ("fabric_link_out", LINK, "running")
    assert row["detail"]["box"] == "ops"
    assert (
        f"{row['remediation_id']}  running  fabric_link_out {LINK} from ops box ops"
        in (first["list"])
    ), first["list"]

    # After: both stores hold the same outcome, by the same id.
    a, b = _history(stores["ops"]), _history(stores["ops2"])
    assert [(r["remediation_id"], r["status"], r["detail"]["box"]) for r in a] == [
        (row["remediation_id"], "ok", "ops")
    ]
    assert [(r["remediation_id"], r["status"]) for r in b] == [(row["remediation_id"], "ok")]
    assert a[0]["detail"]["results"] == b[0]["detail"]["results"]

    # ops2's cap counts what ops took out: leaf1's other uplink is refused from ops2 alone.
    refused = _cli("remediate", "plan", "--store", str(stores["ops2"]), "--topology",
                   str(tmp / "topology.json"), "--action", "fabric_link_out",
                   "--target", "leaf1-spine1")  # fmt: skip
    assert refused.returncode == 1
    assert "leaf1 would have 2 of its 2 uplinks out (leaf1-spine1, leaf1-spine2)" in (
        refused.stderr
    ), refused.stderr

    # The same remediation started again from ops2: the same id, a no-op that says so.
    rc, out = _play(pair["inventory"](), "remediate.yml", "-e", "clockmesh_remediate_box=ops2",
                    "-e", "action=fabric_link_out", "-e", f"target={LINK}")  # fmt: skip
    assert rc == 0, out[-3000:]
    assert f"Already in force: {row['remediation_id']}, from ops box ops" in out, out[-3000:]
    assert len(_seen(tmp)) == 2, "a re-run changed a switch"
    counts = recap(out)
    assert counts["leaf1"]["changed"] == 0 and counts["spine2"]["changed"] == 0, counts

    # Undone from ops2: both boxes record the undo, the original undone in both.
    rc, out = _play(pair["inventory"](), "undo.yml", "-e", "clockmesh_remediate_box=ops2",
                    "-e", f"remediation_id={row['remediation_id']}")  # fmt: skip
    assert rc == 0, out[-3000:]
    for store in stores.values():
        states = {r["remediation_id"]: r["status"] for r in _history(store)}
        assert states[row["remediation_id"]] == "undone", states
        assert sorted(states.values()) == ["ok", "undone"], states


def test_a_running_remediation_is_refused_from_the_other_box(pair: dict[str, Any]) -> None:
    """A start recorded by ops (as the playbook writes it) and not finished: ops2 refuses
    the same action on the same target, naming the run; ops itself may take it over."""
    stores, tmp = pair["stores"], pair["tmp"]
    planned = _plan(pair, "ops", "--json", "--action", "fabric_link_out", "--target", LINK)
    assert planned.returncode == 0, planned.stderr
    p = json.loads(planned.stdout)
    for store in stores.values():
        rec = _cli("remediate", "record", "--running", "--real", "--store", str(store),
                   "--plan", planned.stdout)  # fmt: skip
        assert rec.returncode == 0, rec.stderr
    refused = _plan(pair, "ops2", "--action", "fabric_link_out", "--target", LINK)
    assert refused.returncode == 1
    assert (
        f"{p['remediation_id']}: fabric_link_out {LINK} is already running from ops box ops"
        in refused.stderr
    ), refused.stderr
    assert "nothing was touched" in refused.stderr
    listed = _cli("remediate", "list", "--store", str(stores["ops2"]), "--topology",
                  str(tmp / "topology.json"))  # fmt: skip
    assert f"{p['remediation_id']}  running  fabric_link_out {LINK} from ops box ops" in (
        listed.stdout
    )
    again = _plan(pair, "ops", "--action", "fabric_link_out", "--target", LINK)
    assert again.returncode == 0, again.stderr
    assert p["remediation_id"] in again.stdout and "has not recorded how it ended" in again.stdout


def test_the_other_box_down_is_said_and_does_not_block_the_fix(pair: dict[str, Any]) -> None:
    stores, tmp = pair["stores"], pair["tmp"]
    rc, out = _play(pair["inventory"](ops2_down=True), "remediate.yml",
                    "-e", "action=fabric_link_out", "-e", f"target={LINK}")  # fmt: skip
    assert rc == 0, out[-3000:]
    assert "ops box ops2 is down (unreachable" in out, out[-3000:]
    assert len(_seen(tmp)) == 2  # the fix went ahead on both switches
    (row,) = _history(stores["ops"])
    assert row["status"] == "ok" and "ops2" in row["detail"]["peers_down"]
    assert _history(stores["ops2"]) == []  # it could not be told

    # ops2 is back: the next run (here a check-mode preview) copies it there first.
    rc, out = _play(pair["inventory"](), "remediate.yml", "--check", "--diff",
                    "-e", "action=fabric_link_out", "-e", f"target={LINK}")  # fmt: skip
    assert rc == 0, out[-3000:]
    assert [(r["remediation_id"], r["status"]) for r in _history(stores["ops2"])] == [
        (row["remediation_id"], "ok")
    ]
    assert len(_seen(tmp)) == 2  # the preview changed nothing


def test_two_starts_of_one_fix_at_once_from_both_boxes_never_both_go_ahead(
    pair: dict[str, Any],
) -> None:
    """Two operators start the same fix at the same moment, one from each box: at most one
    run goes ahead; the other is refused (the preflight saw the first running) or yields
    (both starts were recorded; the other was first), each in one clear line, before it
    touches anything. Both may yield: then a run again goes through."""
    stores, inventory = pair["stores"], pair["inventory"]()
    env = {**tool_env(), "ANSIBLE_SSH_ARGS": "-o ConnectTimeout=5 -o BatchMode=yes"}
    procs = [
        subprocess.Popen(
            [
                ANSIBLE,
                "-i",
                str(inventory),
                str(ROOT / "playbooks" / "remediate.yml"),
                "-e",
                f"clockmesh_remediate_box={box}",
                "-e",
                "action=fabric_link_out",
                "-e",
                f"target={LINK}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for box in ("ops", "ops2")
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    went = [out for p, out in zip(procs, outs, strict=True) if p.returncode == 0]
    stopped = [out for p, out in zip(procs, outs, strict=True) if p.returncode != 0]
    assert len(went) <= 1, "both starts went ahead"
    print(f"{len(went)} went ahead;", *[
        m[0] for out in stopped
        for m in [re.search(r"(yielded to|is already running from) [^:]*", out)] if m
    ])  # fmt: skip
    for out in stopped:
        assert re.search(r"yielded to rem-\w+, the same fabric_link_out leaf1-spine2 started "
                         r"from ops box ops2? |is already running from ops box ops2? ", out), (
            out[-3000:]
        )  # fmt: skip
        assert "nothing was touched" in out
    if not went:  # both yielded: the fix is run again, and goes through
        rc, out = _play(inventory, "remediate.yml", "-e", "action=fabric_link_out",
                        "-e", f"target={LINK}")  # fmt: skip
        assert rc == 0, out[-3000:]
    for store in stores.values():
        ok = [r for r in _history(store) if r["status"] == "ok"]
        running = [r for r in _history(store) if r["status"] == "running"]
        assert len(ok) == 1 and running == [], _history(store)
    assert _history(stores["ops"])[-1]["remediation_id"] in {
        r["remediation_id"] for r in _history(stores["ops2"]) if r["status"] == "ok"
    }


@pytest.mark.skipif(os.environ.get("CLOCKMESH_SKIP_ANSIBLE") == "1", reason="asked to skip")
def test_a_run_that_died_is_declared_dead_on_both_boxes_then_the_other_box_takes_it_over(
    pair: dict[str, Any],
) -> None:
    """ops's run died after writing its start to both stores (its box was lost): ops2's
    playbook is refused, naming the run, its box, its start and when it is taken for dead;
    `clockmesh remediate abandon` records it dead in both stores; then ops2's run goes
    ahead under the same id and both stores hold its outcome."""
    stores, inventory = pair["stores"], pair["inventory"]()
    # the `clockmesh remediate run` behind it: alive at first (its run is not dead yet)
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    me = f"{socket.gethostname()}:{controller.pid}"
    planned = _plan(pair, "ops", "--json", "--controller", me, "--action", "fabric_link_out",
                    "--target", LINK)  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    rid = json.loads(planned.stdout)["remediation_id"]
    for store in stores.values():
        rec = _cli("remediate", "record", "--running", "--real", "--store", str(store),
                   "--plan", planned.stdout)  # fmt: skip
        assert rec.returncode == 0, rec.stderr
    args = ["-e", "clockmesh_remediate_box=ops2", "-e", "action=fabric_link_out",
            "-e", f"target={LINK}"]  # fmt: skip

    rc, out = _play(inventory, "remediate.yml", *args)
    assert rc != 0
    said = " ".join(out.split())
    assert f"{rid}: fabric_link_out {LINK} is already running from ops box ops (started by " in (
        said
    ), out[-3000:]
    assert "taken for dead at " in said and f"clockmesh remediate abandon {rid} -i" in said
    assert _seen(pair["tmp"]) == []  # nothing touched

    def abandon() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, "remediate", "abandon", rid, "-i", str(inventory), "--yes", "--why", "ops lost"],
            capture_output=True, text=True, cwd=ROOT, env=tool_env(), timeout=300,
        )  # fmt: skip

    try:  # its controller alive on a box: refused there, nothing written on either box
        res = abandon()
        assert res.returncode == 1, res.stdout[-3000:]
        assert f"is still going: the clockmesh remediate that started it (pid {controller.pid}" in (
            " ".join(res.stdout.split())
        ), res.stdout[-3000:]
        assert [[r["status"] for r in _history(s)] for s in stores.values()] == [["running"]] * 2
    finally:
        controller.kill()
        controller.wait()

    res = abandon()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert f"recorded {rid}: fabric_link_out {LINK} (started from ops box ops" in " ".join(
        res.stdout.split()
    ), res.stdout[-3000:]
    for store in stores.values():
        (row,) = _history(store)
        assert (row["remediation_id"], row["status"]) == (rid, "abandoned"), row
        assert row["detail"]["abandoned"]["why"] == "ops lost"

    rc, out = _play(inventory, "remediate.yml", *args)
    assert rc == 0, out[-3000:]
    assert len(_seen(pair["tmp"])) == 2  # leaf1 and spine2, each changed once
    for store in stores.values():
        (row,) = _history(store)
        assert (row["remediation_id"], row["status"], row["detail"]["box"]) == (rid, "ok", "ops2")
