"""A report over a real labelled lab run: every injected fault is in it with its class and
place, nothing else is; the HTML renders in headless Chromium with no console error and
shows its plots."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.lab.conftest import unique_lab_name

pytestmark = [pytest.mark.root, pytest.mark.lab]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SEED = 55  # a training-range seed: 2 faults in 1.5 min (a fabric flap, a RoCE v1 job)


def test_report_over_a_scenario_run_matches_its_truth_and_renders(tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed (make deps installs it)")
    run = tmp_path / "run"
    scenario = subprocess.run(
        [str(BIN / "clockmesh"), "lab", "scenario", "run", "--seed", str(SEED), "--minutes",
         "1.5", "--kinds", "fabric_flap,roce_v1_job", "--out", str(run),
         "--name", unique_lab_name("rp")],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert scenario.returncode == 0, scenario.stdout[-3000:] + scenario.stderr[-3000:]
    truth = json.loads((run / "truth.json").read_text())
    faults = {(f["label"], f["where"]) for f in truth["faults"] if f["label"] != "none"}
    assert faults, "the seed injected nothing"
    # The routers' logs stay with the run (the lab is gone): the flap is in BGP's own words.
    bgp_logs = {p.parent.name: p.read_text(errors="replace") for p in run.glob("frr/*/bgpd.out")}
    assert {"spine1", "spine2", "leaf1"} <= set(bgp_logs), sorted(bgp_logs)
    assert any("ADJCHANGE" in t and "Down" in t for t in bgp_logs.values()), "no session went down"
    out = tmp_path / "report"
    rep = subprocess.run(
        [str(BIN / "clockmesh"), "report", "--since", "1h", "--out", str(out), "--store",
         str(run / "store"), "--topology", str(run / "topology.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    facts = json.loads((out / "report.json").read_text())
    listed = {(a["kind"], a["where"]) for a in facts["anomalies"]}
    assert listed == faults, f"report {listed} vs truth {faults}"

    shot = tmp_path / "report.png"
    page = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--window-size=1200,2600",
         f"--screenshot={shot}", (out / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert page.returncode == 0 and shot.exists(), page.stderr[-2000:]
    console = [ln for ln in page.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console
    import matplotlib.image

    img = matplotlib.image.imread(str(shot))[:, :, :3]
    # The timeline's bars are drawn in the classes' colours: the plots are on the page.
    for rgb in {"flapping_link": (214, 39, 40), "roce_v1_job": (148, 103, 189)}.values():
        near = np.all(np.abs(img * 255 - np.array(rgb)) < 8, axis=2)
        assert near.sum() > 20, f"no pixel of {rgb}: the timeline is not shown"
    keep = os.environ.get("CLOCKMESH_SCREENSHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / "report.png")
