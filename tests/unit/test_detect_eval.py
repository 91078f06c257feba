"""`clockmesh detector eval` on a hand-made run: truth.json against stored anomalies."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from analytics.detect.cli import detector
from analytics.detect.evaluate import evaluate
from analytics.store import layout

S = 1_000_000_000
T0 = 1_795_000_000 * S


def _run(tmp_path: Path, anomalies: list[dict]) -> Path:
    run = tmp_path / "run"
    faults = [
        {"kind": "fabric_flap", "label": "flapping_link", "where": "leaf1-spine2",
         "start_ns": T0, "end_ns": T0 + 10 * S, "detail": {}},
        {"kind": "roce_v1_job", "label": "roce_v1_job", "where": "job1",
         "start_ns": T0 + 60 * S, "end_ns": T0 + 80 * S, "detail": {}},
        {"kind": "contention", "label": "contention", "where": "leaf2-spine1",
         "start_ns": T0 + 120 * S, "end_ns": T0 + 140 * S, "detail": {}},
        {"kind": "clean", "label": "none", "where": "", "start_ns": T0 + 200 * S,
         "end_ns": T0 + 236 * S, "detail": {}},
    ]  # fmt: skip
    (run).mkdir()
    (run / "truth.json").write_text(json.dumps({"seed": 1, "faults": faults}))
    part = run / "store" / "anomalies" / "date=2026-11-18" / "hour=00"
    part.mkdir(parents=True)
    schema = layout.TABLES["anomalies"].schema
    rows = {f.name: [a.get(f.name, 0 if f.type != pa.string() else "") for a in anomalies]
            for f in schema}  # fmt: skip
    pq.write_table(pa.table(rows, schema=schema), part / "r1.parquet")
    return run


def test_matches_faults_counts_false_alarms_and_localisation(tmp_path: Path) -> None:
    detail = json.dumps({"evidence": {"candidates": ["leaf1-spine2", "leaf2-spine2"]}})
    run = _run(
        tmp_path,
        [
            {"anomaly_id": "a1", "kind": "flapping_link", "link": "leaf1-spine2 or leaf2-spine2",
             "opened_ns": T0 + 2 * S, "detail": detail},
            {"anomaly_id": "a2", "kind": "roce_v1_job", "job_id": "job1",
             "opened_ns": T0 + 61 * S, "detail": "{}"},
            {"anomaly_id": "a3", "kind": "flapping_link", "link": "h1-1-leaf1",
             "opened_ns": T0 + 210 * S, "detail": "{}"},  # in a clean stretch
            # the same false alarm, its place refined while open: still one
            {"anomaly_id": "a3", "kind": "flapping_link", "link": "h1-1-leaf1 or h1-2-leaf1",
             "opened_ns": T0 + 210 * S, "updated_ns": T0 + 212 * S, "detail": "{}"},
        ],
    )  # fmt: skip
    r = evaluate([run])
    assert r.confusion["flapping_link"]["flapping_link"] == 1
    assert r.confusion["roce_v1_job"]["roce_v1_job"] == 1
    assert r.confusion["contention"]["none"] == 1  # not detected
    assert r.confusion["none"]["flapping_link"] == 1  # the false alarm
    assert r.precision("flapping_link") == 0.5 and r.recall("flapping_link") == 1.0
    assert r.recall("contention") == 0.0 and r.precision("contention") is None
    assert r.as_dict()["localisation"] == {
        "flapping_link": 1.0, "roce_v1_job": 1.0, "contention": 0.0
    }  # fmt: skip
    assert r.latencies_s == {"flapping_link": [2.0], "roce_v1_job": [1.0]}
    out = CliRunner().invoke(detector, ["eval", str(run)])
    assert out.exit_code == 0, out.output
    assert "flapping_link         0.50    1.00     1.00  2.0, 2.0" in out.output
    assert "false alarms: 1" in out.output


def test_a_fault_of_two_places_is_localised_when_each_is_named_and_nothing_else(
    tmp_path: Path,
) -> None:
    """A spine black-holing two hosts of two racks (scenario ``multi_drop``): localised
    when both links are named — timed from when the second was — and not when the spine
    is also said to drop a share of its flows (the first anomaly alone was looked at)."""
    run = _run(tmp_path, [])
    truth = json.loads((run / "truth.json").read_text())
    truth["faults"] = [
        {"kind": "multi_drop", "label": "silent_drop", "where": "leaf1-spine2 and leaf3-spine2",
         "start_ns": T0, "end_ns": T0 + 20 * S,
         "detail": {"places": ["leaf1-spine2", "leaf3-spine2"]}},
    ]  # fmt: skip
    (run / "truth.json").write_text(json.dumps(truth))

    def store(*anomalies: dict) -> None:
        part = run / "store" / "anomalies" / "date=2026-11-18" / "hour=00" / "r1.parquet"
        schema = layout.TABLES["anomalies"].schema
        rows = {f.name: [a.get(f.name, 0 if f.type != pa.string() else "") for a in anomalies]
                for f in schema}  # fmt: skip
        pq.write_table(pa.table(rows, schema=schema), part)

    h1 = {"anomaly_id": "s1", "kind": "silent_drop", "link": "leaf1-spine2",
          "opened_ns": T0 + 4 * S, "detail": "{}"}  # fmt: skip
    h3 = {"anomaly_id": "s3", "kind": "silent_drop", "link": "leaf3-spine2",
          "opened_ns": T0 + 6 * S, "detail": "{}"}  # fmt: skip
    share = {"anomaly_id": "s9", "kind": "silent_drop", "link": "",
             "opened_ns": T0 + 5 * S, "detail": json.dumps({"evidence": {"candidates": ["spine2"]}})}  # fmt: skip
    store(h1, h3)
    r = evaluate([run])
    assert r.localised == {"silent_drop": [True]} and r.latencies_s == {"silent_drop": [6.0]}
    store(h1, h3, share)  # the spine's share beside them
    r = evaluate([run])
    assert r.localised == {"silent_drop": [False]}
    assert r.confusion["silent_drop"]["silent_drop"] == 1 and r.false_alarms() == 0
    store(h1)  # one of the two
    assert evaluate([run]).localised == {"silent_drop": [False]}


def test_a_directory_without_a_run_is_a_one_line_error(tmp_path: Path) -> None:
    out = CliRunner().invoke(detector, ["eval", str(tmp_path)])
    assert out.exit_code == 1
    assert "no store with an anomalies table" in out.output or "truth.json" in out.output
    assert "Traceback" not in out.output
