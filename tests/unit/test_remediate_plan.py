"""The remediation preflight: anomaly → action and targets, refusals, the blast-radius cap,
records, and the detector closing an anomaly a remediation dealt with."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from analytics.detect.anomalies import Observation
from analytics.detect.detect_runner import DetectRunner
from analytics.remediate import records
from analytics.remediate.cli import remediate
from analytics.remediate.plan import Caps, Refused, plan, plan_undo
from analytics.store.store_writer import StoreWriter

S = 1_000_000_000


def _topology(leaves: int = 3, spines: int = 2) -> dict[str, Any]:
    links, hosts, n = [], [], 0
    for li in range(1, leaves + 1):
        hosts.append({"name": f"h{li}-1", "rack": f"leaf{li}"})
        links.append({"name": f"h{li}-1-leaf{li}", "kind": "access",
                      "a": {"node": f"h{li}-1", "address": f"198.18.{li}.1"},
                      "b": {"node": f"leaf{li}", "address": f"198.18.{li}.254"}})  # fmt: skip
        for si in range(1, spines + 1):
            links.append({"name": f"leaf{li}-spine{si}", "kind": "fabric",
                          "a": {"node": f"leaf{li}", "address": f"198.18.128.{n}"},
                          "b": {"node": f"spine{si}", "address": f"198.18.128.{n + 1}"}})  # fmt: skip
            n += 2
    return {"hosts": hosts, "links": links}


def _anomaly(store: Path, aid: str, kind: str, link: str = "", closed_ns: int = 0,
             closed_by: str = "") -> None:  # fmt: skip
    book_row = {
        "opened_ns": 1_795_000_000 * S, "closed_ns": closed_ns, "anomaly_id": aid,
        "kind": kind, "score": 0.9, "src": 0, "dst": 0, "link": link, "job_id": "",
        "detail": json.dumps({"summary": "x", **({"closed_by": closed_by} if closed_by else {})}),
        "updated_ns": 1_795_000_000 * S + 1,
    }  # fmt: skip
    import pyarrow as pa

    from analytics.store import layout

    table = pa.table(
        {k: [v] for k, v in book_row.items()}, schema=layout.TABLES["anomalies"].schema
    )
    StoreWriter(store).write_partitioned("anomalies", table, f"{aid}.parquet")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    s = tmp_path / "store"
    s.mkdir()
    return s


def test_flapping_fabric_link_plans_both_ends(store: Path) -> None:
    _anomaly(store, "flapping-1", "flapping_link", "leaf2-spine1")
    p = plan(store, _topology(), anomaly_id="flapping-1")
    assert p.action == "fabric_link_out" and p.target == "leaf2-spine1"
    # Each end shuts its session to the *other* end's address.
    assert [(s.name, s.neighbor) for s in p.switches] == [
        ("leaf2", "198.18.128.5"), ("spine1", "198.18.128.4"),
    ]  # fmt: skip
    assert p.hosts == ["h2-1"]
    assert p.cap["leaf_out_after"] == 1 and p.cap["leaf_max_out"] == 1


@pytest.mark.parametrize(
    ("kind", "link", "closed", "message"),
    [
        ("flapping_link", "h9-9-leaf1", 0, "not a leaf–spine link of the topology"),
        ("contention", "leaf1-spine1", 0, "no job reports its traffic between these hosts"),
        ("roce_v1_job", "", 0, "names no hosts"),
        ("flapping_link", "leaf1-spine1", 5, "is closed \\(its condition cleared\\)"),
        # a spine that went as a whole: no link of it to take out
        ("flapping_link", "spine2", 0, "every leaf already routes around it"),
        # a leaf that went as a whole: its hosts have no other path, nothing to route
        (
            "flapping_link",
            "leaf2",
            0,
            "every host link under leaf2 went at once, and its 1 "
            "host has no other path: check leaf2 itself .*=host_drain target=HOST: h2-1\\); "
            "the cap drains 1 of them at once",
        ),
    ],
)
def test_refusals_name_the_reason(
    store: Path, kind: str, link: str, closed: int, message: str
) -> None:
    _anomaly(store, "a-1", kind, link, closed_ns=closed)
    with pytest.raises(Refused, match=message):
        plan(store, _topology(), anomaly_id="a-1")


def test_unknown_anomaly_is_refused(store: Path) -> None:
    _anomaly(store, "a-1", "flapping_link", "leaf1-spine1")
    with pytest.raises(Refused, match="anomaly nope: not in"):
        plan(store, _topology(), anomaly_id="nope")


def _in_force(store: Path, target: str, rid: str = "") -> records.Remediation:
    r = records.Remediation(rid or records.new_id("", "fabric_link_out", target), "",
                            "fabric_link_out", target, [], False, "ok", "test", "{}")  # fmt: skip
    records.write_remediation(store, r)
    return r


def test_cap_counts_what_is_already_out(store: Path) -> None:
    _in_force(store, "leaf1-spine1")
    with pytest.raises(Refused, match=r"leaf1 would have 2 of its 2 uplinks out .* cap is 1"):
        plan(store, _topology(), action="fabric_link_out", target="leaf1-spine2")
    # Another leaf is fine per leaf, but the fleet cap (0.25 of 6 links -> 1) is not.
    with pytest.raises(Refused, match=r"2 of 6 fabric links would be out"):
        plan(store, _topology(), action="fabric_link_out", target="leaf2-spine1")
    ok = plan(store, _topology(), action="fabric_link_out", target="leaf2-spine1",
              caps=Caps(max_fabric_links_out_share=0.5))  # fmt: skip
    assert ok.cap["fabric_out_after"] == 2


def test_rerun_on_a_link_already_out_is_the_same_remediation(store: Path) -> None:
    r = _in_force(store, "leaf1-spine1")
    _anomaly(
        store,
        "flapping-1",
        "flapping_link",
        "leaf1-spine1",
        closed_ns=9,
        closed_by=r.remediation_id,
    )
    p = plan(store, _topology(), anomaly_id="flapping-1")
    assert p.remediation_id == r.remediation_id


def test_undo_inverts_and_refuses_twice(store: Path) -> None:
    r = _in_force(store, "leaf3-spine2")
    u = plan_undo(store, _topology(), r.remediation_id)
    assert u.action == "fabric_link_in" and u.undo_of == r.remediation_id
    assert [s.name for s in u.switches] == ["leaf3", "spine2"]
    res = CliRunner().invoke(remediate, ["record", "--store", str(store), "--plan",
                                         json.dumps(u.as_dict()), "--results",
                                         json.dumps([{"switch": "leaf3"}, {"switch": "spine2"}]),
                                         "--real"])  # fmt: skip
    assert res.exit_code == 0, res.output
    with pytest.raises(Refused, match="is undone"):
        plan_undo(store, _topology(), r.remediation_id)


def test_record_marks_a_partial_run_failed_and_check_mode_apart(store: Path) -> None:
    p = plan(store, _topology(), action="fabric_link_out", target="leaf1-spine1")
    args = ["record", "--store", str(store), "--plan", json.dumps(p.as_dict())]
    res = CliRunner().invoke(remediate, [*args, "--results", '[{"switch": "leaf1"}]', "--real"])
    assert "failed" in res.output
    res = CliRunner().invoke(remediate, [*args, "--check"])
    rows = records.read_remediations(store)
    assert [(r.status, r.check_mode) for r in rows] == [("failed", False), ("failed", True)]
    assert records.active(store) == []
    assert len(list((store / "audits").glob("*/*/*.parquet"))) == 2


def test_plan_cli_refusal_is_one_line(store: Path, tmp_path: Path) -> None:
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(_topology()))
    args = ["plan", "--store", str(store), "--topology", str(topo), "--anomaly", "missing-1"]
    res = CliRunner().invoke(remediate, args)
    assert res.exit_code == 1 and "no anomalies table: is this an ops box store?" in res.output
    _anomaly(store, "a-1", "flapping_link", "leaf1-spine1")
    res = CliRunner().invoke(remediate, ["plan", "--store", str(store), "--topology", str(topo),
                                         "--anomaly", "missing-1"])  # fmt: skip
    assert res.exit_code == 1
    assert res.output.strip().count("\n") == 0 and "refused: anomaly missing-1" in res.output


def test_detector_closes_the_anomaly_a_remediation_dealt_with(store: Path) -> None:
    runner = DetectRunner(StoreWriter(store))
    obs = Observation("flapping_link", "leaf1-spine2", 0.9, "flapped", link="leaf1-spine2")
    a = runner.book.observe(obs, 10 * S)
    r = _in_force(store, "leaf1-spine2")
    runner.step(now_ns=11 * S)
    assert not runner.book.open
    closed = runner.book.closed[-1]
    assert closed.anomaly_id == a.anomaly_id and closed.closed_by == r.remediation_id
    assert runner.paths.maintenance == {"leaf1-spine2"}


@pytest.mark.parametrize(
    ("kind", "where", "action"),
    [
        ("flapping_link", "leaf1-spine2", "fabric_link_out"),
        ("roce_v1_job", "j7", "roce_v2_gid"),
        ("contention", "leaf1-spine2", "spread_flows"),
    ],
)
def test_the_other_boxs_remediation_closes_this_boxs_anomaly_for_the_same_condition(
    store: Path, kind: str, where: str, action: str
) -> None:
    """The other ops box fixed the condition under its own anomaly id; its record arrives
    here: this box's anomaly for the same link or job closes too, naming the remediation,
    and the one for another place stays open."""
    from analytics.remediate.plan import latest_anomalies

    runner = DetectRunner(StoreWriter(store))

    def seen(at: str, k: str = kind) -> Observation:
        if k == "roce_v1_job":
            return Observation(k, at, 0.9, "RoCE v1", job_id=at)
        return Observation(k, at, 0.9, k, link=at)

    mine = runner.book.observe(seen(where), 10 * S)
    other = "j8" if kind == "roce_v1_job" else "leaf2-spine1"
    elsewhere = runner.book.observe(seen(other), 10 * S)
    # a flap on the link a spread names is not the spread's to close
    flap = runner.book.observe(seen("leaf1-spine2", "flapping_link"), 10 * S)
    theirs = records.Remediation("rem-b1", "theirs-0123456789", action, where, ["h1-1"], False,
                                 "ok", "bob", "{}", {"box": "ops2"})  # fmt: skip
    records.write_remediation(store, theirs)
    runner.step(now_ns=11 * S)
    closed = {a.anomaly_id: a.closed_by for a in runner.book.closed}
    assert closed[mine.anomaly_id] == "rem-b1"
    assert elsewhere.anomaly_id in {a.anomaly_id for a in runner.book.open.values()}
    assert (flap.anomaly_id in closed) == (kind == "flapping_link")
    # as the store says it (the TUI, the report, remediate list read it there)
    stored = {a.anomaly_id: a for a in latest_anomalies(store)}
    assert stored[mine.anomaly_id].closed_ns and (
        stored[mine.anomaly_id].detail["closed_by"] == "rem-b1"
    )
    assert not stored[elsewhere.anomaly_id].closed_ns


def _roce(store: Path, source: str, hosts: list[str]) -> None:
    import pyarrow as pa

    from analytics.store import layout

    ev = {"hosts": hosts, "gid_indices": [0], "index_source": [source], "job_hosts": len(hosts)}
    row = {"opened_ns": 1_795_000_000 * S, "closed_ns": 0, "anomaly_id": "roce-1",
           "kind": "roce_v1_job", "score": 0.9, "src": 0, "dst": 0, "link": "", "job_id": "j1",
           "detail": json.dumps({"summary": "x", "evidence": ev}), "updated_ns": 1}  # fmt: skip
    table = pa.table({k: [v] for k, v in row.items()}, schema=layout.TABLES["anomalies"].schema)
    StoreWriter(store).write_partitioned("anomalies", table, "roce.parquet")


def test_roce_job_plans_its_hosts_and_undo_restores_what_was_there(store: Path) -> None:
    _roce(store, "not set; NCCL < 2.21 uses index 0 (assumed)", ["h1-1", "h2-1"])
    p = plan(store, _topology(), anomaly_id="roce-1", caps=Caps(max_hosts_share=1.0))
    assert (p.action, p.targets, p.switches) == ("roce_v2_gid", ["h1-1", "h2-1"], [])
    with pytest.raises(Refused, match="2 of 3 hosts would change; the cap is 1"):
        plan(store, _topology(), anomaly_id="roce-1")
    results = [{"target": h, "host": h, "index_before": -1, "roce_mode_before": "RoCE v2",
                "conf_existed": "False", "changed": "True"} for h in p.targets]  # fmt: skip
    res = CliRunner().invoke(remediate, ["record", "--store", str(store), "--plan",
                                         json.dumps(p.as_dict()), "--results",
                                         json.dumps(results), "--real"])  # fmt: skip
    assert "ok" in res.output, res.output
    u = plan_undo(store, _topology(), p.remediation_id)
    assert u.action == "roce_gid_restore" and u.targets == ["h1-1", "h2-1"]
    assert u.restore["h1-1"] == {"index": -1, "roce_mode": "RoCE v2", "conf_existed": False}


def test_a_job_that_sets_its_own_index_is_refused(store: Path) -> None:
    _roce(store, "set in environ", ["h1-1"])
    with pytest.raises(Refused, match=r"j1 sets NCCL_IB_GID_INDEX itself \(set in environ\)"):
        plan(store, _topology(), anomaly_id="roce-1")


def _topology_racks(hosts_per_rack: int = 2, racks: int = 2) -> dict[str, Any]:
    topo = _topology(leaves=racks)
    topo["hosts"], links = [], [lk for lk in topo["links"] if lk["kind"] == "fabric"]
    for li in range(1, racks + 1):
        for n in range(1, hosts_per_rack + 1):
            topo["hosts"].append({"name": f"h{li}-{n}", "rack": f"leaf{li}"})
            links.append({"name": f"h{li}-{n}-leaf{li}", "kind": "access",
                          "a": {"node": f"h{li}-{n}", "address": f"198.18.{li}.{n}"},
                          "b": {"node": f"leaf{li}", "address": f"198.18.{li}.254"}})  # fmt: skip
    topo["links"] = links
    return topo


def test_a_flapping_host_link_drains_its_host_within_the_rack_and_fleet_caps(store: Path) -> None:
    topo = _topology_racks(hosts_per_rack=2, racks=2)
    _anomaly(store, "flapping-h", "flapping_link", "h1-1-leaf1")
    p = plan(store, topo, anomaly_id="flapping-h")
    assert (p.action, p.target, p.targets) == ("host_drain", "h1-1", ["h1-1"])
    assert p.undo == {"action": "host_resume", "target": "h1-1"}
    assert p.cap == {"rack": "leaf1", "rack_drained_after": 1, "rack_max": 1,
                     "fleet_drained_after": 1, "fleet_max": 2}  # fmt: skip
    drained = records.Remediation(p.remediation_id, "flapping-h", "host_drain", "h1-1",
                                  ["h1-1"], False, "ok", "test", "{}")  # fmt: skip
    records.write_remediation(store, drained)
    # The same host again: the same remediation (an idempotent re-run), not a second drain.
    assert plan(store, topo, anomaly_id="flapping-h").remediation_id == p.remediation_id
    with pytest.raises(Refused, match=r"2 of the 2 hosts of leaf1 would be drained .* cap is 1"):
        plan(store, topo, action="host_drain", target="h1-2")
    ok = plan(store, topo, action="host_drain", target="h2-1")  # another rack: allowed
    assert ok.cap["fleet_drained_after"] == 2
    records.write_remediation(
        store,
        records.Remediation(
            ok.remediation_id, "", "host_drain", "h2-1", ["h2-1"], False, "ok", "test", "{}"
        ),
    )
    with pytest.raises(Refused, match=r"3 of 4 hosts would be drained .* cap is 2"):
        plan(store, topo, action="host_drain", target="h2-2",
             caps=Caps(max_rack_hosts_share=1.0))  # fmt: skip
    u = plan_undo(store, topo, p.remediation_id)
    assert (u.action, u.targets, u.undo_of) == ("host_resume", ["h1-1"], p.remediation_id)


def test_a_drained_hosts_flaps_are_not_reported_while_it_is_drained(store: Path) -> None:
    import numpy as np

    from collector import records as rec

    runner = DetectRunner(StoreWriter(store), host_names=lambda: {rec.host_id("h1-1"): "h1-1"})
    h = rec.host_id("h1-1")
    rows = np.array(
        [(t * S, h, b"bk0", 0, 0, (0,) * 5, b"operstate", oper, 0)
         for t, oper in ((1, 6), (2, 2), (3, 6))], rec.COUNTER,
    )  # fmt: skip
    runner.flaps.host_names.update({h: "h1-1"})
    runner.flaps.feed(rows)
    assert [o.kind for o in runner.flaps.observations(3 * S)] == ["flapping_link"]
    records.write_remediation(
        store,
        records.Remediation(
            "rem-x", "a", "host_drain", "h1-1", ["h1-1"], False, "ok", "test", "{}"
        ),
    )
    runner._sync_remediations(4 * S)
    assert runner.flaps.observations(4 * S) == []


def test_contention_at_a_hosts_own_port_offers_no_spreading(store: Path) -> None:
    """More queue pairs hash onto other spines, not onto another port of the host: the
    plan is refused in words, and the TUI's column says there is no fix."""
    from analytics.remediate.plan import recommended

    _anomaly(store, "contention-9", "contention", "h2-1-leaf2")
    with pytest.raises(Refused, match=r"contention on h2-1-leaf2\): a host's own port"):
        plan(store, _topology(), anomaly_id="contention-9")
    assert recommended(_topology(), "contention", "h2-1-leaf2") == ("", "")
    assert recommended(_topology(), "contention", "leaf2-spine1") == (
        "spread_flows",
        "leaf2-spine1",
    )


def test_contention_by_jobs_spreads_them_on_their_hosts_and_undo_restores(store: Path) -> None:
    import pyarrow as pa

    from analytics.store import layout

    detail = {"summary": "x", "evidence": {"jobs": ["jobA", "jobB"],
                                           "pairs": ["h1-1→h2-1", "h3-1→h2-1"],
                                           "job_hosts": ["h1-1", "h2-1"]}}  # fmt: skip
    row = {"opened_ns": 5 * S, "closed_ns": 0, "anomaly_id": "contention-1", "kind": "contention",
           "score": 0.9, "src": 0, "dst": 0, "link": "leaf1-spine2", "job_id": "",
           "detail": json.dumps(detail), "updated_ns": 5 * S}  # fmt: skip
    StoreWriter(store).write_partitioned(
        "anomalies", pa.table({k: [v] for k, v in row.items()},
                              schema=layout.TABLES["anomalies"].schema), "c.parquet")  # fmt: skip
    p = plan(store, _topology(), anomaly_id="contention-1", caps=Caps(max_hosts_share=0.7))
    assert (p.action, p.targets) == ("spread_flows", ["h1-1", "h2-1"])
    assert "NCCL_IB_QPS_PER_CONNECTION=4" in p.summary and "jobA, jobB" in p.summary
    with pytest.raises(Refused, match=r"2 of 3 hosts would change; the cap is 1 \(max_hosts"):
        plan(store, _topology(), anomaly_id="contention-1")
    results = [{"target": h, "host": h, "qps_before": -1, "conf_existed": False} for h in p.targets]
    res = CliRunner().invoke(remediate, ["record", "--store", str(store), "--plan",
                                         json.dumps(p.as_dict()), "--results",
                                         json.dumps(results), "--real"])  # fmt: skip
    assert res.exit_code == 0, res.output
    # A re-run is the same remediation, and its record keeps the state before the first run.
    again = plan(store, _topology(), anomaly_id="contention-1", caps=Caps(max_hosts_share=0.7))
    assert again.remediation_id == p.remediation_id
    rerun = [{"target": h, "host": h, "qps_before": 4, "conf_existed": True} for h in p.targets]
    res = CliRunner().invoke(remediate, ["record", "--store", str(store), "--plan",
                                         json.dumps(again.as_dict()), "--results",
                                         json.dumps(rerun), "--real"])  # fmt: skip
    assert res.exit_code == 0, res.output
    u = plan_undo(store, _topology(), p.remediation_id)
    assert u.action == "spread_restore" and u.targets == ["h1-1", "h2-1"]
    assert u.restore["h1-1"] == {"value": -1, "conf_existed": False}


# ---- two ops boxes (issue 29): the union of both stores, running rows, a second start ----


def _row(rid: str, target: str, status: str, ts_ns: int, box: str = "ops",
         check: bool = False, action: str = "fabric_link_out") -> records.Remediation:  # fmt: skip
    return records.Remediation(rid, "", action, target, [], check, status, "alice", "{}",
                               {"box": box}, ts_ns)  # fmt: skip


def test_merge_keeps_each_remediation_once_at_its_latest_row() -> None:
    a = [_row("rem-1", "leaf1-spine1", "running", 10), _row("rem-2", "leaf2-spine1", "ok", 5)]
    b = [_row("rem-1", "leaf1-spine1", "ok", 20), _row("rem-3", "leaf3-spine1", "failed", 7)]
    merged = records.merge(a, b)
    assert [(r.remediation_id, r.status) for r in merged] == [
        ("rem-2", "ok"), ("rem-3", "failed"), ("rem-1", "ok")
    ]  # fmt: skip
    assert records.merge(b, a) == merged  # the order of the stores does not matter
    # a tie: the real row over a preview, the settled outcome over running
    tie = records.merge([_row("rem-4", "x", "running", 30)], [_row("rem-4", "x", "ok", 30)])
    assert tie[0].status == "ok"


def test_counted_is_real_ok_or_running_only() -> None:
    rows = [
        _row("rem-1", "a", "ok", 1), _row("rem-2", "b", "running", 2),
        _row("rem-3", "c", "failed", 3), _row("rem-4", "d", "undone", 4),
        _row("rem-5", "e", "running", 5, check=True), _row("rem-6", "f", "ok", 6, check=True),
    ]  # fmt: skip
    assert [r.remediation_id for r in records.counted(rows)] == ["rem-1", "rem-2"]


def test_the_cap_counts_what_the_other_box_took_out_or_is_taking_out(store: Path) -> None:
    now = time.time_ns()
    other = [_row("rem-b1", "leaf1-spine1", "ok", now, box="ops2")]
    with pytest.raises(Refused, match=r"leaf1 would have 2 of its 2 uplinks out"):
        plan(store, _topology(), action="fabric_link_out", target="leaf1-spine2", also=other,
             box="ops")  # fmt: skip
    running = [_row("rem-b2", "leaf1-spine1", "running", now, box="ops2")]
    with pytest.raises(Refused, match=r"leaf1 would have 2 of its 2 uplinks out"):
        plan(store, _topology(), action="fabric_link_out", target="leaf1-spine2",
             also=running, box="ops")  # fmt: skip
    # without the other box's rows this store alone would allow it (what happens when the
    # other box is down: the plan names it)
    p = plan(store, _topology(), action="fabric_link_out", target="leaf1-spine2", box="ops",
             peers_down={"ops2": "unreachable: connection refused"})  # fmt: skip
    assert p.cap["leaf_out_after"] == 1
    assert "ops box ops2 is down (unreachable: connection refused)" in p.describe()
    # the other box's remediation undone there: no longer counted
    undone = [_row("rem-b1", "leaf1-spine1", "undone", now + 1, box="ops2")]
    assert plan(store, _topology(), action="fabric_link_out", target="leaf1-spine2",
                also=other + undone, box="ops").cap["leaf_out_after"] == 1  # fmt: skip


def test_a_second_start_from_the_other_box_is_refused_while_it_runs(store: Path) -> None:
    now = time.time_ns()
    records.write_remediation(store, _row("rem-a1", "leaf1-spine1", "running", now, box="ops"))
    with pytest.raises(Refused) as exc:
        plan(store, _topology(), action="fabric_link_out", target="leaf1-spine1", box="ops2")
    msg = str(exc.value)
    assert msg.startswith("rem-a1: fabric_link_out leaf1-spine1 is already running from ops "
                          "box ops (started by alice ")  # fmt: skip
    assert msg.endswith("nothing was touched") and "\n" not in msg
    # no box named (remediate list, the TUI): every running row is another's
    with pytest.raises(Refused, match="already running from ops box ops"):
        plan(store, _topology(), action="fabric_link_out", target="leaf1-spine1")
    # the box that started it (its run died): takes it over under the same id
    p = plan(store, _topology(), action="fabric_link_out", target="leaf1-spine1", box="ops")
    assert p.remediation_id == "rem-a1" and "this run takes it over under the same id" in p.summary
    # a start older than RUNNING_STALE_S (its box was lost mid-run): the other box may too
    stale = now - int((records.RUNNING_STALE_S + 1) * 1e9)
    assert records.running_elsewhere(
        [_row("rem-a1", "leaf1-spine1", "running", stale)], "fabric_link_out", "leaf1-spine1",
        "ops2", now,
    ) is None  # fmt: skip


def test_a_rerun_from_the_other_box_is_the_same_remediation_and_keeps_the_first_results(
    store: Path,
) -> None:
    first = _row("rem-a1", "leaf1-spine1", "ok", time.time_ns(), box="ops")
    first.detail["results"] = [{"switch": "leaf1", "changed": True}]
    p = plan(store, _topology(), action="fabric_link_out", target="leaf1-spine1",
             also=[first], box="ops2")  # fmt: skip
    assert p.remediation_id == "rem-a1"
    assert "Already in force: rem-a1, from ops box ops by alice" in p.summary
    assert "changes nothing" in p.summary
    args = ["record", "--store", str(store), "--plan", json.dumps(p.as_dict())]
    res = CliRunner().invoke(remediate, [*args, "--running", "--real"])
    assert "in force already: a re-run, no start record" in res.output
    res = CliRunner().invoke(remediate, [*args, "--real", "--results",
                                         '[{"switch": "leaf1", "changed": false}, '
                                         '{"switch": "spine1", "changed": false}]'])  # fmt: skip
    assert res.exit_code == 0, res.output
    (row,) = records.read_remediations(store)
    assert row.status == "ok" and row.box == "ops2"
    assert row.detail["results"] == first.detail["results"]  # the undo's state before


def test_undo_from_the_box_that_did_not_run_it(store: Path) -> None:
    """ops2 never recorded rem-a1 (it was down): it undoes it from ops's rows and marks it
    undone in its own store too."""
    first = _row("rem-a1", "leaf3-spine2", "ok", time.time_ns(), box="ops")
    u = plan_undo(store, _topology(), "rem-a1", also=[first], box="ops2")
    assert u.undo_of == "rem-a1" and u.original["remediation_id"] == "rem-a1"
    res = CliRunner().invoke(remediate, ["record", "--store", str(store), "--plan",
                                         json.dumps(u.as_dict()), "--results",
                                         json.dumps([{"switch": "leaf3"}, {"switch": "spine2"}]),
                                         "--real"])  # fmt: skip
    assert res.exit_code == 0, res.output
    states = {r.remediation_id: r.status for r in records.read_remediations(store)}
    assert states == {"rem-a1": "undone", u.remediation_id: "ok"}
    with pytest.raises(Refused, match="still running"):
        plan_undo(store, _topology(), "rem-x",
                  also=[_row("rem-x", "leaf2-spine2", "running", time.time_ns())])  # fmt: skip


def test_also_that_is_not_history_json_is_a_one_line_error(store: Path, tmp_path: Path) -> None:
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(_topology()))
    res = CliRunner().invoke(remediate, ["plan", "--store", str(store), "--topology", str(topo),
                                         "--action", "fabric_link_out", "--target",
                                         "leaf1-spine1", "--also", '{"x": 1}'])  # fmt: skip
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [
        "Error: --also: expected the JSON list of `clockmesh remediate history --json` (not a list)"
    ]


def test_sync_copies_what_this_store_lacks_or_holds_older_once(store: Path) -> None:
    now = time.time_ns()
    records.write_remediation(store, _row("rem-1", "leaf1-spine1", "running", now))
    theirs = [
        _row("rem-1", "leaf1-spine1", "ok", now + 5),
        _row("rem-2", "leaf2-spine1", "ok", now),
    ]
    assert [r.remediation_id for r in records.sync(store, theirs)] == ["rem-2", "rem-1"]
    assert {r.remediation_id: r.status for r in records.read_remediations(store)} == {
        "rem-1": "ok", "rem-2": "ok"
    }  # fmt: skip
    assert records.sync(store, theirs) == []  # nothing new: nothing written
    older = [_row("rem-2", "leaf2-spine1", "running", now - 5)]
    assert records.sync(store, older) == []  # an older state never replaces a newer one


def test_two_starts_at_once_only_the_one_recorded_first_everywhere_goes_ahead(
    tmp_path: Path,
) -> None:
    """Each box's store orders two simultaneous starts of one fix by when it wrote them:
    a run goes ahead only if no store holds the other's start before its own."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    now = time.time_ns()
    x = _row("rem-x", "leaf1-spine1", "running", now, box="ops")
    y = _row("rem-y", "leaf1-spine1", "running", now + 1, box="ops2")
    # store a wrote x first, store b wrote y first: neither may go ahead
    records.write_remediation(a, x)
    records.write_remediation(a, y)
    records.write_remediation(b, _row("rem-y", "leaf1-spine1", "running", now, box="ops2"))
    records.write_remediation(b, _row("rem-x", "leaf1-spine1", "running", now + 1, box="ops"))
    assert [r.remediation_id for r in records.started_before(a, "rem-x", "fabric_link_out",
                                                             "leaf1-spine1")] == []  # fmt: skip
    assert [r.remediation_id for r in records.started_before(b, "rem-x", "fabric_link_out",
                                                             "leaf1-spine1")] == ["rem-y"]  # fmt: skip
    assert [r.remediation_id for r in records.started_before(a, "rem-y", "fabric_link_out",
                                                             "leaf1-spine1")] == ["rem-x"]  # fmt: skip
    # another target, a preview, a refused run or a dead run's stale start never count
    stale = now - int((records.RUNNING_STALE_S + 5) * 1e9)
    c = tmp_path / "c"
    c.mkdir()
    for r in (
        _row("rem-o", "leaf2-spine1", "running", now - 9),
        _row("rem-p", "leaf1-spine1", "running", now - 9, check=True),
        _row("rem-q", "leaf1-spine1", "refused", now - 9),
        _row("rem-s", "leaf1-spine1", "running", stale),
        x,
    ):
        records.write_remediation(c, r)
    assert records.started_before(c, "rem-x", "fabric_link_out", "leaf1-spine1") == []

    # the CLI: one line naming the run it yielded to; the refused row written by --refused
    p: dict[str, Any] = {"remediation_id": "rem-y", "anomaly_id": "", "action": "fabric_link_out",
                         "target": "leaf1-spine1", "switches": [], "box": "ops2"}  # fmt: skip
    res = CliRunner().invoke(remediate, ["first", "--store", str(b), "--plan", json.dumps(p)])
    assert res.exit_code == 0, res.output
    p["remediation_id"] = "rem-x"
    res = CliRunner().invoke(remediate, ["first", "--store", str(b), "--plan", json.dumps(p)])
    assert res.exit_code == 1
    (line,) = res.output.strip().splitlines()
    assert line.startswith("Error: rem-x: yielded to rem-y, the same fabric_link_out "
                           "leaf1-spine1 started from ops box ops2 by alice")  # fmt: skip
    assert line.endswith("nothing was touched by rem-x; see clockmesh remediate history")
    res = CliRunner().invoke(remediate, ["record", "--real", "--store", str(b), "--plan",
                                         json.dumps(p), "--refused", line[7:]])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = {r.remediation_id: r for r in records.read_remediations(b)}
    assert (
        rows["rem-x"].status == "refused" and "yielded to rem-y" in rows["rem-x"].detail["refused"]
    )
    assert [r.remediation_id for r in records.counted(list(rows.values()))] == ["rem-y"]
