"""``clockmesh detector replay``: a stored run through a fresh clock solver and detector on
the run's own time, judged by ``clockmesh detector eval`` as the live run is
(analytics/detect/replay.py)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from analytics.detect.cli import detector
from analytics.detect.evaluate import evaluate
from analytics.store import layout
from analytics.store.store_writer import StoreWriter
from collector import records
from tests.unit.topologies import leaf_spine

S = 1_000_000_000
T0 = 1_800_000_000 * S
NAMES = [f"h{r}-{i}" for r in (1, 2) for i in (1, 2)]


def _run_dir(tmp_path: Path, down: tuple[int, int]) -> Path:
    """A lab run's directory: 90 s of every host's bk0 operstate, one sample a second
    (unaligned), h2-1's link down from second ``down[0]`` to ``down[1]``; its truth."""
    run = tmp_path / "run"
    rows = []
    for sec in range(-30, 60):
        for n in NAMES:
            h = records.host_id(n)
            gone = n == "h2-1" and down[0] <= sec < down[1]
            went = 1 if n == "h2-1" and sec == down[0] else 0
            ts = T0 + sec * S + NAMES.index(n) * 170_000_000
            rows.append((ts, h, b"bk0", 0, 0, (0,) * 5, b"operstate", 2 if gone else 6, 0))
            rows.append((ts, h, b"bk0", 0, 0, (0,) * 5, b"carrier_down_count", went, went))
    counter = np.sort(np.array(rows, records.COUNTER), order="ts_ns")
    StoreWriter(run / "store").write_partitioned(
        "counter", layout.records_to_arrow("counter", counter), "c.parquet"
    )
    (run / "topology.json").write_text(json.dumps(leaf_spine({n: f"leaf{n[1]}" for n in NAMES})))
    fault = {"kind": "host_flap", "label": "flapping_link", "where": "h2-1-leaf2",
             "start_ns": T0 + down[0] * S, "end_ns": T0 + down[1] * S, "detail": {}}  # fmt: skip
    truth = {"seed": 1, "started_ns": T0, "ended_ns": T0 + 60 * S, "faults": [fault]}
    (run / "truth.json").write_text(json.dumps(truth))
    return run


def test_a_stored_flap_replayed_is_named_when_it_was_and_eval_judges_the_replay(
    tmp_path: Path,
) -> None:
    run = _run_dir(tmp_path, (20, 24))
    out = tmp_path / "replay"
    res = CliRunner().invoke(detector, ["replay", str(run), "--out", str(out)])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if "flapping_link" in x]
    # seen down by h2-1's sample at 20.34 s, shipped at once (0.15 s); h2-2 (its rack)
    # not sampled since: named LEAF_WAIT_NS (0.4 s) after it went, at the next pass (a
    # pass follows each group commit, every roll_s: 0.2 s)
    at = float(re.match(r"\s*([\d.]+) s", line).group(1))  # type: ignore[union-attr]
    assert 20.74 <= at < 20.94, line
    assert "h2-1-leaf2: h2-1-leaf2 flapped 1 time in 10 min; down now" in line, line
    assert "1 anomalies opened" in res.output and f"clockmesh detector eval {out}" in res.output
    report = evaluate([out])
    assert report.recall("flapping_link") == 1.0 and report.false_alarms() == 0
    assert report.latencies_s["flapping_link"] == [round(at - 20.0, 2)]
    # the daemon's log lines, quiet while it replayed, are as they were after (the
    # command ran in this process: a later test's caplog saw no warning once)
    assert logging.getLogger("clockmesh").getEffectiveLevel() <= logging.WARNING
    assert json.loads((out / "truth.json").read_text())["replayed_from"] == str(run)


def test_a_quiet_stretch_replays_to_no_anomaly_that_eval_reads(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, (20, 24))
    out = tmp_path / "replay"
    res = CliRunner().invoke(detector, ["replay", str(run), "--out", str(out), "--minutes", "0.25"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("replayed 15 s in ") and "0 anomalies opened" in res.output
    assert json.loads((out / "truth.json").read_text())["faults"] == []  # began after 15 s
    report = evaluate([out])
    assert report.runs == 1 and report.false_alarms() == 0 and report.unknown == 0


def test_a_run_that_cannot_be_replayed_gets_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, (20, 24))
    out = tmp_path / "replay"
    out.mkdir()
    res = CliRunner().invoke(detector, ["replay", str(run), "--out", str(out)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip() == f"Error: {out}: exists (expected a new directory for the replay)"
    (run / "topology.json").unlink()
    res = CliRunner().invoke(detector, ["replay", str(run), "--out", str(tmp_path / "new")])
    assert res.exit_code == 1 and "topology.json: not found" in res.output, res.output
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.tmp").exists()
    res = CliRunner().invoke(detector, ["replay", str(tmp_path), "--out", str(tmp_path / "new")])
    assert res.exit_code == 1 and "no store/" in res.output, res.output
    (run / "ingest.yml").write_text("detect_clear_s: soon\n")  # the run's settings: checked
    res = CliRunner().invoke(detector, ["replay", str(run), "--out", str(tmp_path / "new")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert (
        res.output.startswith(f"Error: {run / 'ingest.yml'}: ") and "detect_clear_s" in res.output
    )
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "new").exists()
