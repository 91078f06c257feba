"""One remediation, one state: ``clockmesh remediate history``, the TUI and the report read
the catalog's ``remediation_current`` and say the same thing about every remediation.

Before the view they had copies of the query that disagreed: the report called a
remediation previewed in check mode and then run for real a "preview" (``bool_or``), the
history called it "ok" (its latest row).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from analytics.remediate import records
from analytics.remediate.cli import remediate
from analytics.report.report import Range, collect, write
from analytics.store.catalog import connect_views, write_catalog
from analytics.store.store_writer import StoreWriter
from tui import history

S = 1_000_000_000


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, int]:
    store = tmp_path / "store"
    StoreWriter(store).open()
    write_catalog(store)  # as the ingest daemon does at start
    t0 = time.time_ns() - 1800 * S

    def rem(rid: str, check: bool, status: str, dt_s: float, anomaly: str = "flapping-1",
            box: str = "") -> None:  # fmt: skip
        records.write_remediation(store, records.Remediation(
            rid, anomaly, "fabric_link_out", "leaf1-spine1", ["h1-1"], check, status, "alice",
            "{}", {"summary": rid, **({"box": box} if box else {})},
            t0 + int(dt_s * S)))  # fmt: skip

    rem("rem-previewed-then-run", True, "planned", 0)  # check mode, then the same id for real
    rem("rem-previewed-then-run", False, "ok", 10)
    rem("rem-run-then-undone", False, "ok", 20, "flapping-2")
    rem("rem-run-then-undone", False, "undone", 30, "flapping-2")
    rem("rem-preview-only", True, "ok", 40)
    rem("rem-failed", False, "failed", 50)
    rem("rem-same-instant", True, "ok", 60)  # a preview and a real run in one nanosecond
    rem("rem-same-instant", False, "ok", 60)
    rem("", False, "ok", 70)  # no id (a playbook without its plan): nobody shows it
    rem("rem-running", False, "running", 80, "flapping-3", box="ops2")  # the other box's run
    return store, t0


EXPECTED = {
    "rem-previewed-then-run": "ok",
    "rem-run-then-undone": "undone",
    "rem-preview-only": "preview",
    "rem-failed": "failed",
    "rem-same-instant": "ok",
    "rem-running": "running",
}


def test_history_tui_and_report_agree_on_every_remediation(
    store: tuple[Path, int], tmp_path: Path
) -> None:
    root, t0 = store
    res = CliRunner().invoke(remediate, ["history", "--json", "--store", str(root)])
    assert res.exit_code == 0, res.output
    from_history = {r["remediation_id"]: r["state"] for r in json.loads(res.output)}

    con = connect_views(root)
    try:
        from_tui = {r["remediation_id"]: r["state"] for r in history.remediations(con)}
    finally:
        con.close()

    facts = collect(root, Range(t0 - 60 * S, time.time_ns()))
    from_report = {r["remediation_id"]: r["state"] for r in facts["remediations"]}

    assert from_history == from_tui == from_report == EXPECTED

    # `remediate list` names the runs going on now: the same ones, in the same state, with
    # the box that started them and since when.
    topology = tmp_path / "topology.json"
    topology.write_text(json.dumps({"hosts": [{"name": "h1-1"}], "links": []}))
    args = ["list", "--store", str(root), "--topology", str(topology)]
    res = CliRunner().invoke(remediate, [*args, "--json"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)
    running = {rid for rid, state in EXPECTED.items() if state == "running"}
    assert (
        {r["remediation_id"]: r["state"] for r in listed["running"]}
        == {rid: from_tui[rid] for rid in running}
        == {rid: from_report[rid] for rid in running}
    )
    (r,) = listed["running"]
    assert (r["box"], r["actor"], r["started_ns"]) == ("ops2", "alice", t0 + 80 * S)
    assert r["started"] == time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0 / S + 80))
    assert listed["anomalies"] == []
    table = CliRunner().invoke(remediate, args).output
    assert (
        f"rem-running  running  fabric_link_out leaf1-spine1 from ops box ops2 by alice, "
        f"started 29 min ago ({r['started']}; anomaly flapping-3)" in table
    ), table
    text = CliRunner().invoke(remediate, ["history", "--store", str(root)]).output
    report_md = write(facts, tmp_path / "out")["md"].read_text(encoding="utf-8")
    for rid, state in EXPECTED.items():
        line = next(x for x in text.splitlines() if x.startswith(rid + " "))
        assert f" {state} " in line, line
        assert f"| {rid} | fabric_link_out | leaf1-spine1 | {state} | alice |" in report_md
    # What is in force (the preflight's caps, the restore) is the real runs that succeeded.
    assert {r.remediation_id for r in records.active(root)} == {
        "rem-previewed-then-run",
        "rem-same-instant",
    }


def test_the_tui_shows_an_anomalys_remediations_in_their_state(
    store: tuple[Path, int],
) -> None:
    from tui.app import ClockmeshApp

    root, _ = store
    app = ClockmeshApp(lambda: {}, store=root)
    shown = app._remediated("flapping-1").splitlines()
    assert [line.split(": ")[-1] for line in shown if line] == [
        "ok (by alice)",  # rem-previewed-then-run
        "preview (by alice)",
        "failed (by alice)",
        "ok (by alice)",  # rem-same-instant
    ]
    assert "rem-run-then-undone" not in "".join(shown)  # another anomaly's


def test_the_report_lists_a_remediation_that_spans_the_range(store: tuple[Path, int]) -> None:
    """A remediation started before the range and changed after it was in force during it."""
    root, t0 = store
    facts = collect(root, Range(t0 + 25 * S, t0 + 26 * S))
    assert [(r["remediation_id"], r["state"]) for r in facts["remediations"]] == [
        ("rem-run-then-undone", "undone")
    ]


def test_every_store_option_honours_clockmesh_store(store: tuple[Path, int]) -> None:
    """One ``--store`` option: every command that takes it defaults to $CLOCKMESH_STORE."""
    from analytics.audit.cli import audit
    from analytics.report.cli import report
    from analytics.sql_cli import sql
    from analytics.store.export import export
    from tui.cli import tui

    root, _ = store
    runner = CliRunner(env={"CLOCKMESH_STORE": str(root)})
    shown = json.loads(runner.invoke(remediate, ["history", "--json"]).output)
    assert {r["remediation_id"]: r["state"] for r in shown} == EXPECTED
    out = runner.invoke(sql, ["--format", "json", "SELECT count(*) AS n FROM remediation_current"])
    assert out.exit_code == 0 and json.loads(out.output) == [{"n": len(EXPECTED)}], out.output
    for command, args in ((remediate, ["history"]), (audit, ["show"]), (sql, []), (export, []),
                          (report, []), (tui, [])):  # fmt: skip
        helped = " ".join(CliRunner().invoke(command, [*args, "--help"]).output.split())
        assert "$CLOCKMESH_STORE or /var/lib/clockmesh/store" in helped, (command.name, helped)
