"""A run that died mid-way with two ops boxes: the stale-running rule said in the refusal,
the operator's declaration that it is dead (``clockmesh remediate record --abandoned``, run
on every box by playbooks/abandon.yml), and never two live runs of one fix."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from analytics.remediate import records
from analytics.remediate.cli import remediate
from analytics.remediate.plan import Refused, plan, plan_undo
from tests.unit.test_remediate_plan import _row, _topology

S = 1_000_000_000
LINK = "leaf1-spine1"


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    return a, b


def _abandon(store: Path, rid: str, *extra: str) -> Any:
    return CliRunner().invoke(
        remediate, ["record", "--store", str(store), "--abandoned", rid, "--why", "ops lost",
                    *extra],
    )  # fmt: skip


def test_the_refusal_names_the_run_its_box_its_start_and_when_it_is_taken_for_dead(
    pair: tuple[Path, Path],
) -> None:
    a, _ = pair
    started = time.time_ns() - 60 * S
    records.write_remediation(a, _row("rem-a1", LINK, "running", started, box="ops"))
    with pytest.raises(Refused) as exc:
        plan(a, _topology(), action="fabric_link_out", target=LINK, box="ops2")
    msg = str(exc.value)
    assert "\n" not in msg and msg.endswith("nothing was touched"), msg
    assert msg.startswith(f"rem-a1: fabric_link_out {LINK} is already running from ops box ops "
                          f"(started by alice at {records.utc(started)}, 60 s ago)")  # fmt: skip
    dead = started + int(records.RUNNING_STALE_S * S)
    assert f"taken for dead at {records.utc(dead)} (in 14 min)" in msg, msg
    assert "declare it dead now: clockmesh remediate abandon rem-a1 -i INVENTORY" in msg, msg


def test_declared_dead_on_both_boxes_the_other_box_may_take_it_over(
    pair: tuple[Path, Path],
) -> None:
    a, b = pair
    now = time.time_ns()
    started = now - 60 * S
    run = _row("rem-a1", LINK, "running", started, box="ops")
    records.write_remediation(a, run)  # box b was down when it started: it lacks the row
    res = _abandon(b, "rem-a1")
    assert res.exit_code == 1
    assert res.output.strip() == f"Error: refused: remediation rem-a1: not in {b}/remediations"

    res = _abandon(a, "rem-a1")
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"recorded rem-a1: fabric_link_out {LINK} (started from ops "
                                 f"box ops by alice at {records.utc(started)}) declared dead by ")  # fmt: skip
    # the other box learns it from the first's rows (the playbook's --also), once
    history_a = CliRunner().invoke(remediate, ["history", "--json", "--store", str(a)]).output
    res = _abandon(b, "rem-a1", "--also", history_a)
    assert res.exit_code == 0 and res.output.startswith("recorded rem-a1"), res.output
    assert _abandon(b, "rem-a1", "--also", history_a).output.startswith("already recorded")
    for store in (a, b):
        (row,) = records.read_remediations(store)
        assert (row.status, row.state, row.box) == ("abandoned", "abandoned", "ops")
        assert row.detail["abandoned"]["why"] == "ops lost"
    audits = [json.loads(d) for d in _audits(a, "abandon")]
    assert [(d["remediation_id"], d["box"], d["started_ns"]) for d in audits] == [
        ("rem-a1", "ops", started)
    ]

    # the other box may start now, taking it over under the same id; the cap still counts
    # it (its change may be half in place), and it cannot be undone before it is settled
    p = plan(b, _topology(), action="fabric_link_out", target=LINK, box="ops2")
    assert p.remediation_id == "rem-a1" and "declared dead by" in p.summary
    assert "this run takes it over under the same id" in p.summary
    with pytest.raises(Refused, match="leaf1 would have 2 of its 2 uplinks out"):
        plan(b, _topology(), action="fabric_link_out", target="leaf1-spine2", box="ops2")
    with pytest.raises(Refused, match=f"run fabric_link_out {LINK} again to settle it"):
        plan_undo(b, _topology(), "rem-a1")


@pytest.mark.parametrize(
    ("status", "check", "message"),
    [
        ("ok", False, "remediation rem-a1 is ok (recorded 10 s ago): its run ended"),
        ("running", True, "remediation rem-a1 was a check-mode preview: it never ran"),
    ],
)
def test_only_a_real_run_still_running_is_declared_dead(
    pair: tuple[Path, Path], status: str, check: bool, message: str
) -> None:
    a, b = pair
    now = time.time_ns()
    records.write_remediation(a, _row("rem-a1", LINK, "running", now - 20 * S, check=check))
    # the other box saw it end: never declared dead here either
    records.write_remediation(b, _row("rem-a1", LINK, status, now - 10 * S, check=check))
    also = json.dumps([r.as_dict() for r in records.read_remediations(b)])
    res = _abandon(a, "rem-a1", "--also", also)
    assert res.exit_code == 1
    (line,) = res.output.strip().splitlines()
    assert line.startswith(f"Error: refused: {message}"), line
    assert [r.status for r in records.read_remediations(a)] == ["running"]
    res = _abandon(a, "rem-a1", "--also", "{}")
    assert res.output.strip() == (
        "Error: --also: expected the JSON list of `clockmesh remediate history --json` (not a list)"
    )


def test_two_boxes_taking_over_one_dead_run_at_once_never_both_go_ahead(
    pair: tuple[Path, Path],
) -> None:
    """After the declaration both boxes start the same fix (same id): each store orders the
    two starts; a box goes ahead only if no store holds the other's start first."""
    a, b = pair
    now = time.time_ns()
    for store in (a, b):
        records.write_remediation(store, _row("rem-a1", LINK, "abandoned", now - 9 * S))
    mine = _row("rem-a1", LINK, "running", now, box="ops")
    theirs = _row("rem-a1", LINK, "running", now + 1, box="ops2")
    for r in (mine, theirs):  # a wrote ops's start first
        records.write_remediation(a, r)
    for r in (
        _row("rem-a1", LINK, "running", now, box="ops2"),
        _row("rem-a1", LINK, "running", now + 1, box="ops"),
    ):  # b: ops2's first
        records.write_remediation(b, r)  # fmt: skip

    def first(store: Path, box: str) -> list[str]:
        return [r.box for r in records.started_before(store, "rem-a1", "fabric_link_out", LINK,
                                                      box=box)]  # fmt: skip

    assert (first(a, "ops"), first(b, "ops"), first(a, "ops2"), first(b, "ops2")) == (
        [], ["ops2"], ["ops"], []
    )  # fmt: skip
    # each yields; the yield is audited but never hides the other box's live start
    p = {"remediation_id": "rem-a1", "action": "fabric_link_out", "target": LINK,
         "switches": [], "box": "ops"}  # fmt: skip
    res = CliRunner().invoke(remediate, ["first", "--store", str(b), "--plan", json.dumps(p)])
    assert res.exit_code == 1 and "yielded to rem-a1" in res.output and "ops2" in res.output
    res = CliRunner().invoke(remediate, ["record", "--real", "--store", str(b), "--plan",
                                         json.dumps(p), "--refused", "yielded"])  # fmt: skip
    assert res.exit_code == 0 and "its running row kept" in res.output, res.output
    (row,) = records.read_remediations(b)
    assert (row.status, row.box) == ("running", "ops")  # the latest live start, not refused
    assert records.running_elsewhere(records.read_remediations(b), "fabric_link_out", LINK,
                                     "ops3") is not None  # fmt: skip
    assert _audits(b, "remediate (yielded)")


def test_list_says_when_a_run_with_no_outcome_is_taken_for_dead(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = pair
    now = time.time_ns()
    old = now - int((records.RUNNING_STALE_S + 60) * S)
    records.write_remediation(a, _row("rem-old", LINK, "running", old, box="ops"))
    records.write_remediation(a, _row("rem-new", "leaf2-spine1", "running", now, box="ops2"))
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(_topology()))
    args = ["list", "--store", str(a), "--topology", str(topo)]
    shown = json.loads(CliRunner().invoke(remediate, [*args, "--json"]).output)["running"]
    assert [(r["remediation_id"], r["dead"], r["dead_at"]) for r in shown] == [
        ("rem-old", True, records.utc(old + int(records.RUNNING_STALE_S * S))),
        ("rem-new", False, records.utc(now + int(records.RUNNING_STALE_S * S))),
    ]
    text = CliRunner().invoke(remediate, args).output
    assert "taken for dead since" in next(x for x in text.splitlines() if "rem-old" in x)
    assert "no outcome: dead at" in next(x for x in text.splitlines() if "rem-new" in x)


def _audits(store: Path, action: str) -> list[str]:
    import pyarrow.parquet as pq

    out = []
    for f in sorted((store / "audits").glob("*/*/*.parquet")):
        t = pq.read_table(f).to_pylist()
        out += [r["detail"] for r in t if r["action"] == action]
    return out


def test_a_run_whose_controller_is_alive_here_is_never_declared_dead(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """`clockmesh remediate run` names itself (host:pid) in the plan, so in the run's
    records; while that process lives on the box, the run is not dead: refused, nothing
    written, also by the playbook's first pass (--check)."""
    import socket
    import subprocess
    import sys

    a, _ = pair
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(_topology()))
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.05)
        me = f"{socket.gethostname()}:{controller.pid}"
        planned = CliRunner().invoke(remediate, [
            "plan", "--json", "--store", str(a), "--topology", str(topo), "--box", "ops",
            "--controller", me, "--action", "fabric_link_out", "--target", LINK,
        ])  # fmt: skip
        assert planned.exit_code == 0, planned.output
        res = CliRunner().invoke(remediate, ["record", "--running", "--real", "--store", str(a),
                                             "--plan", planned.output])  # fmt: skip
        assert res.exit_code == 0, res.output
        (row,) = records.read_remediations(a)
        assert row.detail["controller"] == me
        for extra in (["--check"], []):
            res = _abandon(a, row.remediation_id, *extra)
            assert res.exit_code == 1
            assert res.output.strip() == (
                f"Error: refused: remediation {row.remediation_id} is still going: the "
                f"clockmesh remediate that started it (pid {controller.pid} on "
                f"{socket.gethostname()}) is alive; end it first (kill {controller.pid}) or "
                "wait for its outcome"
            )
        assert [r.status for r in records.read_remediations(a)] == ["running"]
    finally:
        controller.kill()
        controller.wait()
    res = _abandon(a, row.remediation_id, "--check")
    assert res.exit_code == 0 and "may be declared dead" in res.output, res.output
    assert [r.status for r in records.read_remediations(a)] == ["running"]  # only checked
    assert _abandon(a, row.remediation_id).exit_code == 0
    assert [r.status for r in records.read_remediations(a)] == ["abandoned"]


def test_a_pid_that_is_not_the_runs_controller_does_not_keep_it_alive() -> None:
    """A live process under the recorded pid that started after the run did (the pid was
    reused, the box rebooted), or a controller on another host, says nothing here."""
    import os
    import socket

    here = socket.gethostname()
    old = time.time_ns() - 3600 * S  # long before this test process started
    later = _row("rem-1", LINK, "running", old)
    later.detail["controller"] = f"{here}:{os.getpid()}"
    assert records.controller_alive(later) == ""
    now = _row("rem-1", LINK, "running", time.time_ns())
    now.detail["controller"] = f"{here}:{os.getpid()}"
    assert records.controller_alive(now) == f"pid {os.getpid()} on {here}"
    now.detail["controller"] = f"not-{here}:{os.getpid()}"
    assert records.controller_alive(now) == ""
