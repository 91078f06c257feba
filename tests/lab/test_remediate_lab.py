"""Remediation end to end in the lab: a link flaps (plain ``ip link set`` on the spine
side, as a dying optic would), the live detector opens the anomaly, the real
``playbooks/remediate.yml`` takes the link out of service on both switches through FRR,
the anomaly closes, traffic stops suffering while the link goes on flapping, a re-run
changes nothing, `clockmesh remediate restore` leaves the link out while it still flaps
and puts the switches back exactly once it has been stable, and the blast-radius cap and
check mode never touch a switch."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.remediate import records
from lab import fleet, frr
from lab.fabric import Lab
from lab.traffic import Mesh
from tests.lab.helpers import opsbox_fleet, spine_for, wait_for

pytestmark = [pytest.mark.root, pytest.mark.lab]

LINK = "leaf1-spine2"
STABLE_S = 8.0  # restore once the link has been up this long (600 s by default)
ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).with_name("ansible-playbook"))


_wait = wait_for


@pytest.fixture(scope="module")
def site(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    lab = lab_factory("r", spines=2, leaves=3, hosts_per_leaf=1)
    base = tmp_path_factory.mktemp("remediate")
    # Three hosts: two routes cross each link one way (sixteen or more in a fleet of 16),
    # so each pair probes four times the default rate, as many probes over a link as a
    # rack of peers would send: at the default rate a route's half-second window held two
    # probe instants, and a spread link at 58 % load (queues of milliseconds at 3 Mbit/s)
    # read, now and then, as a standing queue on both its routes at once.
    with opsbox_fleet(lab, base, probe={"trace_interval_s": 1.0, "rate_per_port": 4.0},
                      detect_interval_s=0.2, detect_clear_s=30) as site:  # fmt: skip
        site["inventory"] = fleet.opsbox_inventory(lab, site["store"], base / "inventory.yml",
                                                   site["hosts"])  # fmt: skip
        yield site


def _playbook(site: dict[str, Any], name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ANSIBLE, "-i", str(site["inventory"]), str(ROOT / "playbooks" / name), *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip


def _clockmesh(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("clockmesh")), *argv],
        input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip


def _changed(out: str) -> dict[str, int]:
    recap = out[out.rindex("PLAY RECAP") :]
    return {
        line.split()[0]: int(line.split("changed=")[1].split()[0])
        for line in recap.splitlines()[1:]
        if "changed=" in line
    }


def _configs(lab: Lab) -> dict[str, str]:
    """Every router's running configuration (what a remediation may change)."""
    topo = lab.topology
    out = {}
    for r in (*topo.leaves, *topo.spines):
        res = subprocess.run(frr.vtysh_argv(topo.lab, r, "show running-config"),
                             capture_output=True, text=True, check=True)  # fmt: skip
        out[r.name] = res.stdout
    return out


def _open(live: Callable[[], dict[str, Any]], link: str) -> list[dict[str, Any]]:
    return [
        a for a in live()["anomalies"]["open"] if a["kind"] == "flapping_link" and a["link"] == link
    ]


class Optic(threading.Thread):
    """A dying optic on the spine side of a link: down 1.5 s, up 3 s, until stopped."""

    def __init__(self, namespace: str, interface: str) -> None:
        super().__init__(daemon=True)
        self.argv = ["ip", "-n", namespace, "link", "set", interface]
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            subprocess.run([*self.argv, "down"], check=True)
            self.halt.wait(1.5)
            subprocess.run([*self.argv, "up"], check=True)
            self.halt.wait(3.0)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        subprocess.run([*self.argv, "up"], check=True)


def test_flapping_link_is_taken_out_of_service_then_restored_exactly(
    site: dict[str, Any],
) -> None:
    lab, live = site["lab"], site["live"]
    link = lab.topology.link(LINK)
    original = _configs(lab)

    # Check mode before anything: previews both switches, changes nothing anywhere.
    preview = _playbook(site, "remediate.yml", "-e", "action=fabric_link_out",
                        "-e", f"target={LINK}", "--check", "--diff")  # fmt: skip
    assert preview.returncode == 0, preview.stdout[-3000:]
    assert "neighbor " in preview.stdout and " shutdown" in preview.stdout
    assert _changed(preview.stdout) == {
        "localhost": 0,
        "ops": 0,
        "switch-leaf1": 1,
        "switch-spine2": 1,
    }
    assert _configs(lab) == original, "check mode changed a switch"

    optic = Optic(link.b.namespace, link.b.interface)
    optic.start()
    try:
        (a,) = _wait(lambda: _open(live, LINK), 30, f"flapping_link anomaly on {LINK}")
        assert a["evidence"]["model"]["class"] == "flapping_link", a

        # What an operator at 3 a.m. types: the list names the fix; saying no changes nothing.
        listed = _clockmesh("remediate", "list", "--store", str(site["store"]),
                            "--topology", str(lab.topology_path))  # fmt: skip
        assert f"→ fabric_link_out: shut the BGP session of {LINK}" in listed.stdout, listed
        declined = _clockmesh("remediate", "run", a["anomaly_id"], "-i", str(site["inventory"]),
                              stdin="n\n")  # fmt: skip
        assert declined.returncode == 1, declined.stdout[-2000:]
        assert "== the real run would change: {'switch-leaf1': 1, 'switch-spine2': 1}" in (
            declined.stdout
        )
        assert "not confirmed: nothing changed" in declined.stderr
        assert _configs(lab) == original, "a declined remediation changed a switch"

        t0 = time.monotonic()
        run = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}")
        assert run.returncode == 0, run.stdout[-3000:]
        assert _changed(run.stdout) == {
            "localhost": 0,
            "ops": 0,
            "switch-leaf1": 1,
            "switch-spine2": 1,
        }

        def closed() -> dict[str, Any] | None:
            done = [c for c in live()["anomalies"]["recently_closed"]
                    if c["anomaly_id"] == a["anomaly_id"]]  # fmt: skip
            return done[0] if done else None

        _wait(closed, 10, "the anomaly closed after the remediation")
        (rem_id,) = [r.remediation_id for r in records.active(site["store"])
                     if r.action == "fabric_link_out"]  # fmt: skip

        def restore() -> subprocess.CompletedProcess[str]:
            return _clockmesh("remediate", "restore", "--store", str(site["store"]), "-i",
                              str(site["inventory"]), "--after", str(STABLE_S), "--yes")  # fmt: skip

        print(f"playbook start -> anomaly closed: {time.monotonic() - t0:.1f} s")

        # The symptom is gone while the optic goes on flapping: every flow is delivered.
        assert lab.wait_converged(timeout=5).converged
        with Mesh(lab.topology, ports=4) as mesh:
            time.sleep(12.0)  # more than two more flaps of the optic
            t_end = time.monotonic() - 0.3
        assert mesh.sent(0, t_end) > 1000
        assert mesh.lost(0, t_end) == {}, "loss while the flapping link is out of service"
        assert not _open(live, LINK), "the flapping link was reported again while out of service"

        # Idempotent: the same anomaly again changes nothing.
        again = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}")
        assert again.returncode == 0, again.stdout[-3000:]
        assert _changed(again.stdout) == {
            "localhost": 0,
            "ops": 0,
            "switch-leaf1": 0,
            "switch-spine2": 0,
        }

        # The cap: leaf1's other uplink would leave it cut off; refused before any switch.
        before = _configs(lab)
        capped = _playbook(site, "remediate.yml", "-e", "action=fabric_link_out",
                           "-e", "target=leaf1-spine1")  # fmt: skip
        assert capped.returncode != 0
        assert "blast-radius cap: leaf1 would have 2 of its 2 uplinks out" in capped.stdout
        assert "switch-leaf1" not in capped.stdout.split("PLAY RECAP")[-1]
        assert _configs(lab) == before

        # Restore once stable, as cron would run it: the optic still flaps, so the link
        # stays out (the switches' own records say when it last went down).
        early = restore()
        assert early.returncode == 0, early.stdout[-3000:] + early.stderr
        print(*[ln for ln in early.stdout.splitlines()
                if "not stable" in ln or ln.startswith(("==", "left out"))], sep="\n")  # fmt: skip
        (left,) = [ln for ln in early.stdout.splitlines() if ln.startswith("left out")]
        assert re.fullmatch(
            rf"left out  {rem_id} fabric_link_out {LINK}: {LINK} (last changed state \d+ s ago "
            rf"on (leaf1|spine2) \(\d+ link downs there\); restore needs {STABLE_S:.0f} s stable"
            rf"|is down now on (leaf1:spine2|spine2:leaf1)(, spine2:leaf1)?)",
            left,
        ), left
        assert _configs(lab) == before, "restored while the link still flapped"
    finally:
        optic.stop()
    t_stable = time.monotonic()

    history = _clockmesh("remediate", "history", "--json", "--store", str(site["store"]))
    rows = json.loads(history.stdout)
    real = [r for r in rows if r["action"] == "fabric_link_out" and not r["check_mode"]]
    assert len(real) == 1 and real[0]["status"] == "ok" and real[0]["anomaly_id"] == a["anomaly_id"]
    assert any(r["check_mode"] for r in rows), "the check-mode preview was not recorded"

    # Once the link has stayed up for --after seconds the restore puts it back, exactly.
    time.sleep(max(0.0, t_stable + STABLE_S + 1 - time.monotonic()))
    back = restore()
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr
    assert f"restored  {rem_id} fabric_link_out {LINK}" in back.stdout, back.stdout[-3000:]
    routing = lab.wait_converged(timeout=10)
    assert routing.converged and not routing.out_of_service, routing.problems
    assert _configs(lab) == original, "the restore did not put the switches back exactly"
    rows = {r["remediation_id"]: r for r in json.loads(_clockmesh(
        "remediate", "history", "--json", "--store", str(site["store"])).stdout)}  # fmt: skip
    assert rows[rem_id]["status"] == "undone"
    (undo,) = [r for r in rows.values() if r["detail"].get("undo_of") == rem_id
               and not r["check_mode"]]  # fmt: skip
    reading = undo["detail"]["stability"]
    assert reading["stable"] and reading["stable_for_s"] >= STABLE_S, reading
    assert {e["switch"] for e in reading["ends"]} == {"leaf1", "spine2"}
    assert "nothing to restore" in restore().stdout


def test_the_tui_runs_a_real_remediation_and_its_undo(site: dict[str, Any]) -> None:
    """The TUI against the live daemon: the flap appears in its anomaly list, the preview
    runs the real playbook in check mode, confirmation runs it for real, the anomaly
    closes; on the way, d opens the link's drill-down from the store; screenshots of the
    four screens go to docs/img/ (the README shows them)."""
    from textual.widgets import Button, DataTable, Log

    from tui.app import ClockmeshApp
    from tui.data import LiveSource, load_racks
    from tui.drill import LinkScreen
    from tui.remediation import ConfirmScreen, RemediationScreen

    lab, live = site["lab"], site["live"]
    link = lab.topology.link(LINK)
    # CLOCKMESH_SCREENSHOTS=docs/img refreshes the README's screenshots from this run.
    img = Path(os.environ.get("CLOCKMESH_SCREENSHOTS") or site["store"].parent / "screenshots")
    img.mkdir(parents=True, exist_ok=True)
    app = ClockmeshApp(LiveSource(site["url"]), racks=load_racks(lab.topology_path),
                       store=site["store"], inventory=site["inventory"],
                       topology=lab.topology_path)  # fmt: skip

    async def drive() -> str:
        async with app.run_test(size=(130, 36)) as pilot:
            for _ in range(150):
                await pilot.pause(0.2)
                if any(a["link"] == LINK for a in app.fleet.anomalies):
                    break
            (anomaly,) = [a for a in app.fleet.anomalies if a["link"] == LINK]
            (img / "tui-fleet.svg").write_text(app.export_screenshot(title="clockmesh tui"))
            await pilot.press("a")
            await pilot.pause(0.3)
            (img / "tui-anomalies.svg").write_text(app.export_screenshot(title="clockmesh tui"))
            table = app.query_one("#anomaly-table", DataTable)
            row = next(i for i in range(table.row_count) if str(table.get_row_at(i)[1]) == LINK)
            table.focus()
            table.move_cursor(row=row)

            async def until(pred, what: str, timeout: float = 120.0) -> None:
                for _ in range(int(timeout / 0.2)):
                    await pilot.pause(0.2)
                    if pred():
                        return
                # What the screen's log said (the remediation's output): a timeout alone
                # says nothing (a fresh-clone CI timed out on "the run", 2026-12-06).
                lines = [ln for log in app.screen.query(Log) for ln in log.lines][-25:]
                raise AssertionError(
                    f"timed out: {what}; on {type(app.screen).__name__}, "
                    f"its log's last lines: {lines}"
                )

            # d: the link's drill-down, read from the lab's store.
            await pilot.press("d")
            await pilot.pause(0.2)
            drill = app.screen
            assert isinstance(drill, LinkScreen) and drill.link == LINK
            note = drill.query_one("#hist-label")
            await until(lambda: "fabric link" in str(note.render()), "the link's drill-down", 30)
            assert f"{link.a.node}:{link.a.interface}" in str(note.render())
            stored = drill.query_one("#link-anomalies", DataTable)
            await until(lambda: any(str(stored.get_row_at(i)[0]) == anomaly["anomaly_id"]
                                    for i in range(stored.row_count)), "the stored anomaly", 40)  # fmt: skip
            (img / "tui-link.svg").write_text(app.export_screenshot(title="clockmesh tui: link"))
            await pilot.press("escape")
            # Back where the user was: the anomaly list, its row under the cursor (a loaded
            # machine restores the focus a few frames after the pop).
            await until(lambda: app.focused is table, "focus back on the anomaly list", 30)
            assert str(table.get_row_at(table.cursor_row)[1]) == LINK
            await pilot.press("enter")
            screen = app.screen
            assert isinstance(screen, RemediationScreen)

            preview = screen.query_one("#preview", Button)
            await until(lambda: not preview.disabled, "the plan")
            await pilot.click("#preview")
            output = screen.query_one("#output", Log)
            await until(lambda: any("the real run would change" in x for x in output.lines),
                        "the preview")  # fmt: skip
            assert any("'switch-leaf1': 1" in x for x in output.lines), output.lines[-20:]
            (img / "tui-remediation-preview.svg").write_text(
                app.export_screenshot(title="clockmesh tui: remediation preview"))  # fmt: skip
            await pilot.click("#run")
            await pilot.pause(0.3)
            assert isinstance(app.screen, ConfirmScreen)
            # Click once the button is laid out, as a user would. A fresh-clone CI timed out
            # on "the run" with no run recorded (2026-12-06): likely the click came before
            # the layout and landed on nothing (not shown).
            await until(lambda: app.screen.query_one("#yes", Button).region.area > 0,
                        "the confirmation's buttons", 30)  # fmt: skip
            assert await pilot.click("#yes"), "the click on 'Yes, run it' landed elsewhere"
            await until(lambda: any(x.startswith("== done") for x in output.lines), "the run")
            return str(anomaly["anomaly_id"])

    optic = Optic(link.b.namespace, link.b.interface)
    optic.start()
    try:
        anomaly_id = asyncio.run(drive())
        _wait(lambda: [c for c in live()["anomalies"]["recently_closed"]
                       if c["anomaly_id"] == anomaly_id], 10, "the anomaly closed")  # fmt: skip
        assert lab.wait_converged(timeout=5).out_of_service == {LINK}
    finally:
        optic.stop()
        rows = json.loads(_clockmesh("remediate", "history", "--json", "--store",
                                     str(site["store"])).stdout)  # fmt: skip
        for r in rows:
            if r["action"] == "fabric_link_out" and r["status"] == "ok" and not r["check_mode"]:
                _playbook(site, "undo.yml", "-e", f"remediation_id={r['remediation_id']}")
    assert not lab.wait_converged(timeout=10).out_of_service


def test_roce_v1_job_gets_the_v2_index_from_the_gid_table_then_restored_exactly(
    site: dict[str, Any],
) -> None:
    """A job that sets no GID index lands on NCCL's default, index 0: RoCE v1 in the lab's
    GID tables. The remediation writes each host's RoCE v2 index (read from its table) to
    its nccl.conf; the detector closes the anomaly and, the job now inheriting a v2 index,
    does not reopen it; the undo removes the nccl.conf it created."""
    from lab import jobgen

    lab, live = site["lab"], site["live"]
    hosts = [h.name for h in lab.topology.hosts][:2]
    confs = {h: lab.node_dir(h) / "etc" / "nccl.conf" for h in hosts}  # /etc/clockmesh inside
    assert not any(c.exists() for c in confs.values())
    jobgen.start_job(lab, "unsetjob", hosts, None, 20.0, 512, nccl_version="2.18.3")
    try:
        # the anomaly opens on the first host heard; the plan changes the hosts it names
        (a,) = _wait(lambda: [x for x in live()["anomalies"]["open"]
                              if x["job_id"] == "unsetjob"
                              and sorted(x["evidence"].get("hosts") or []) == sorted(hosts)],
                     30, "roce_v1_job anomaly naming both hosts")  # fmt: skip
        assert a["kind"] == "roce_v1_job"
        assert "NCCL 2.18.3 (before 2.21) uses its default index 0" in str(a["evidence"])
        # 2 of the lab's 3 hosts: past the default cap (half the fleet), refused untouched.
        capped = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}",
                           "-e", "clockmesh_remediate_max_hosts_share=0.5")  # fmt: skip
        assert capped.returncode != 0
        assert "blast-radius cap: 2 of 3 hosts would change; the cap is 1" in capped.stdout
        cap = ("-e", "clockmesh_remediate_max_hosts_share=0.7")
        preview = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}", *cap,
                            "--check", "--diff")  # fmt: skip
        assert preview.returncode == 0, preview.stdout[-3000:]
        assert "+NCCL_IB_GID_INDEX=3" in preview.stdout  # the diff: index 3 = v4-mapped v2 GID
        assert not any(c.exists() for c in confs.values()), "check mode wrote nccl.conf"
        run = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}", *cap)
        assert run.returncode == 0, run.stdout[-3000:]
        assert {h: n for h, n in _changed(run.stdout).items() if n} == dict.fromkeys(hosts, 1)
        assert all(c.read_text() == "NCCL_IB_GID_INDEX=3\n" for c in confs.values())
        _wait(lambda: not [x for x in live()["anomalies"]["open"] if x["job_id"] == "unsetjob"],
              10, "the anomaly closed")  # fmt: skip
        time.sleep(4.0)  # collectors re-read nccl.conf: the job now resolves to RoCE v2
        assert not [x for x in live()["anomalies"]["open"] if x["job_id"] == "unsetjob"]
        again = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}", *cap)
        assert again.returncode == 0, again.stdout[-3000:]
        assert not any(_changed(again.stdout).values()), "a re-run changed something"
    finally:
        jobgen.stop_job(lab, "unsetjob")
    rows = json.loads(_clockmesh("remediate", "history", "--json", "--store",
                                 str(site["store"])).stdout)  # fmt: skip
    (rem,) = [r for r in rows if r["action"] == "roce_v2_gid" and not r["check_mode"]]
    undo = _playbook(site, "undo.yml", "-e", f"remediation_id={rem['remediation_id']}")
    assert undo.returncode == 0, undo.stdout[-3000:]
    assert not any(c.exists() for c in confs.values()), "the undo left nccl.conf behind"
    assert {h: n for h, n in _changed(undo.stdout).items() if n} == dict.fromkeys(hosts, 1)


def test_a_job_that_sets_its_own_v1_index_is_refused_with_the_reason(
    site: dict[str, Any],
) -> None:
    from lab import jobgen

    lab, live = site["lab"], site["live"]
    hosts = [h.name for h in lab.topology.hosts][1:3]
    jobgen.start_job(lab, "envjob", hosts, 2, 20.0, 512)
    try:
        (a,) = _wait(lambda: [x for x in live()["anomalies"]["open"]
                              if x["job_id"] == "envjob"], 30, "roce_v1_job anomaly")  # fmt: skip
        run = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}")
        assert run.returncode != 0
        assert "sets NCCL_IB_GID_INDEX itself" in run.stdout, run.stdout[-2000:]
        assert "PLAY RECAP" in run.stdout and "collectors" not in run.stdout.split("PLAY RECAP")[1]
    finally:
        jobgen.stop_job(lab, "envjob")


def _colliding_ports(lab: Lab, h1: str, h2: str, qps: int) -> tuple[str, int, int]:
    """(spine, port A, port B): two job ports whose flows h1 -> h2 hash onto the same spine
    with one queue pair each, and with ``qps`` each (source ports port + 1000 k, to the
    port) split evenly over the spines both ways (h1 -> h2 and h2 -> h1: a job sends both
    ways, and a 3-1 split the other way is a link at 87 % after the spread)."""
    from lab import jobgen

    def even(port: int) -> bool:
        for src, dst in ((h1, h2), (h2, h1)):
            spines = [spine_for(lab, src, dst, port + 1000 * k, port) for k in range(qps)]
            if len(set(spines)) < 2 or spines.count(spines[0]) != qps // 2:
                return False
        return True

    candidates = (p for p in range(jobgen.PORT, jobgen.PORT + 300) if even(p))
    first = next(candidates)
    spine = spine_for(lab, h1, h2, first)
    second = next(p for p in candidates if spine_for(lab, h1, h2, p) == spine)
    return spine, first, second


def test_contention_between_two_jobs_is_spread_then_restored_exactly(
    site: dict[str, Any],
) -> None:
    """Fabric links at a capacity; two RoCE v2 jobs hashed onto one spine contend → the
    detector names the link and both jobs → remediate.yml previews, then sets
    NCCL_IB_QPS_PER_CONNECTION=4 on their hosts → the anomaly closes → the jobs restart
    (as a scheduler requeues them) on four queue pairs each, ECMP spreads them, the
    contention does not come back → a re-run changes nothing → the undo removes the
    nccl.conf files it created."""
    from lab import capacity, jobgen

    lab, live = site["lab"], site["live"]
    h1, h2 = (h.name for h in lab.topology.hosts[:2])
    confs = {h: lab.node_dir(h) / "etc" / "nccl.conf" for h in (h1, h2)}
    assert not any(c.exists() for c in confs.values())
    spine, port_a, port_b = _colliding_ports(lab, h1, h2, 4)
    link = f"{lab.topology.host(h1).rack}-{spine}"

    def start() -> None:
        for job, port in (("jobA", port_a), ("jobB", port_b)):
            jobgen.start_job(lab, job, [h1, h2], 3, 150.0, 1400, port=port)

    def stop() -> None:
        jobgen.stop_job(lab, "jobA")
        jobgen.stop_job(lab, "jobB")

    def contended() -> list[dict[str, Any]]:
        return [a for a in live()["anomalies"]["open"] if a["kind"] == "contention"]

    # Two jobs of 150 × 1442-byte frames a second each way (1.73 Mbit/s): 115 % of one
    # spine link together, 58 % of each once spread. At 2.5 Mbit/s (69 % once spread, a
    # frame 4.6 ms on the wire) a fresh-clone CI timed out waiting for no contention after
    # the spread (2026-12-06): likely two probes in three meeting a frame ahead of them on
    # the spread links, a window of them now and then a standing queue. At 3 Mbit/s one
    # did again (2026-12-06, spine1→leaf2 paged after the spread): the site's probe rate
    # (above) now gives each route's window enough instants, and the ports are split
    # evenly both ways (a 3-1 split back is 87 %: contention that stays, rightly).
    capacity.apply(lab, "3000kbit")
    try:
        time.sleep(6.0)
        start()
        a = _wait(
            lambda: [x for x in contended() if x["link"] == link], 45, f"contention on {link}"
        )[0]
        assert {"jobA", "jobB"} <= set(a["evidence"]["jobs"]), a["evidence"]
        cap = ("-e", "clockmesh_remediate_max_hosts_share=0.7")
        preview = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}", *cap,
                            "--check", "--diff")  # fmt: skip
        assert preview.returncode == 0, preview.stdout[-3000:]
        assert "+NCCL_IB_QPS_PER_CONNECTION=4" in preview.stdout
        assert not any(c.exists() for c in confs.values()), "check mode wrote nccl.conf"
        t0 = time.monotonic()
        run = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}", *cap)
        assert run.returncode == 0, run.stdout[-3000:]
        assert all(c.read_text() == "NCCL_IB_QPS_PER_CONNECTION=4\n" for c in confs.values())
        _wait(lambda: a["anomaly_id"] not in {x["anomaly_id"] for x in contended()},
              10 + (time.monotonic() - t0), "the contention anomaly closed")  # fmt: skip
        stop()
        start()  # the scheduler requeues the jobs: they read nccl.conf at start
        # The probes' delays come back to their floors within a few clock windows; the
        # anomalies close once that has held for detect_clear_s (30 s here).
        _wait(lambda: not contended(), 75, "no contention left after the spread", every=1.0,
              detail=lambda: f"open: {[x['summary'] for x in contended()]}")  # fmt: skip
        again = _playbook(site, "remediate.yml", "-e", f"anomaly_id={a['anomaly_id']}", *cap)
        assert again.returncode == 0, again.stdout[-3000:]
        assert not any(_changed(again.stdout).values()), "a re-run changed something"
    finally:
        stop()
        capacity.remove(lab)
    rows = json.loads(_clockmesh("remediate", "history", "--json", "--store",
                                 str(site["store"])).stdout)  # fmt: skip
    (rem,) = [r for r in rows if r["action"] == "spread_flows" and not r["check_mode"]
              and r["status"] == "ok"][:1]  # fmt: skip
    undo = _playbook(site, "undo.yml", "-e", f"remediation_id={rem['remediation_id']}")
    assert undo.returncode == 0, undo.stdout[-3000:]
    assert not any(c.exists() for c in confs.values()), "the undo left nccl.conf behind"
