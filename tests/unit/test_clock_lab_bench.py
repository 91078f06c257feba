"""benchmarks/bench_clock_lab.py reconstructs the lab truth correctly (checked on simulated
records written the way the lab would have them: inventory + lab_clock_t0_ns health rows)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from analytics.sim import MeshSimulator, SimConfig
from collector.records import HEALTH

ROOT = Path(__file__).resolve().parents[2]


def test_lab_bench_on_simulated_records(tmp_path: Path) -> None:
    cfg = SimConfig(ts_noise_ns=20.0, duration_ns=6_000_000_000, seed=11)
    sim = MeshSimulator(cfg).run()
    t = sim.truth
    health = np.zeros(len(t.hosts), HEALTH)
    health["host"] = t.hosts
    health["name"] = b"lab_clock_t0_ns"
    health["value"] = cfg.start_ns  # the simulator's skew is relative to start_ns
    for name, arr in (("probe_tx", sim.tx), ("probe_rx", sim.rx), ("echo", sim.echoes),
                      ("health", health)):  # fmt: skip
        np.save(tmp_path / f"{name}.npy", arr)
    hosts = {
        n: {"clockmesh_lab_clock": {"offset_ns": float(o), "drift_ppm": float(d)}}
        for n, o, d in zip(t.names, t.offset_ns, t.drift_ppm, strict=True)
    }
    inv = {"all": {"children": {"collectors": {"children": {"leaf1": {"hosts": hosts}}}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inv))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_clock_lab.py"),
         "--records", str(tmp_path), "--inventory", str(tmp_path / "inventory.yml"),
         "--seconds", "4", "--spacing-tol-ns", "200"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    last = next(line for line in out.splitlines() if line.startswith("last window"))
    median_ns = float(last.split("median |offset error| ")[1].split(" ns")[0])
    assert median_ns < 50, out


def test_lab_bench_errors_are_one_line(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_clock_lab.py"),
         "--records", str(tmp_path), "--inventory", str(tmp_path / "missing.yml")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "missing.yml" in r.stderr
