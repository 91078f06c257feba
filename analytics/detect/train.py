"""Fit the detector's models on labelled lab runs (and simulated candidates).

Training data, per run directory (``clockmesh lab scenario run``: ``truth.json`` and the
ops box's ``store/``):

- **candidates**: every row the live daemon wrote to the ``anomalies`` table (the rules'
  evidence at that moment → :func:`analytics.detect.features.vector`), labelled with the
  class of the injected fault whose window holds the row *and* whose place the row names;
  a row in no fault's window is ``unknown`` (what the rules saw on a clean fabric); a row
  in a fault's window that names another place is left out (a side effect, not a cause);
- **healthy vectors** for the baseline: from the ``owd`` table in the run's clean
  stretches, per second the median and largest excess of the inter-rack paths' one-way
  delay over each path's own floor and the number of paths over 1 ms — the fleet's own
  healthy delay noise; every other feature is 0 on a healthy fabric.

The lab makes few faults per hour, so a feature-level simulator (:func:`simulate`) adds
candidates drawn from the ranges real faults span (outages 0.1–30 s, 1–64 v1 hosts,
queues of 1.5–150 ms) and the ``unknown`` class's borderline delay blips. Evaluation
seeds (1000 and above) are refused: never train on what the detector is judged on.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from analytics.detect import features
from analytics.detect.evaluate import BEFORE_NS
from analytics.detect.model import Detector, FaultClassifier, HealthyBaseline, today
from analytics.detect.survival import ASSUMED_LIMIT_S
from analytics.store.catalog import connect_views

EVAL_SEEDS_FROM = 1000
CLASSES = ("flapping_link", "roce_v1_job", "contention", "unknown")


class TrainError(Exception):
    """Training cannot go on; ``str()`` is one line naming the run or file."""


@dataclass
class TrainingSet:
    X: list[np.ndarray] = field(default_factory=list)
    y: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)  # "lab" or "sim"
    healthy: list[np.ndarray] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)

    def add(self, x: np.ndarray, label: str, source: str) -> None:
        self.X.append(x)
        self.y.append(label)
        self.source.append(source)


def _names(row_link: str, row_job: str, evidence: dict[str, Any]) -> set[str]:
    return {row_link, row_job, *evidence.get("candidates", [])} - {""}


def read_run(run: Path, into: TrainingSet, grace_s: float = 15.0, allow_eval: bool = False) -> None:
    try:
        truth = json.loads((run / "truth.json").read_text())
        faults = truth["faults"]
        seed = int(truth["seed"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainError(f"{run}: no readable truth.json ({exc})") from None
    if seed >= EVAL_SEEDS_FROM and not allow_eval:
        raise TrainError(
            f"{run}: seed {seed} is an evaluation seed (>= {EVAL_SEEDS_FROM}); never train on it"
        )
    if not (run / "store" / "anomalies").is_dir():
        raise TrainError(f"{run}: no store with an anomalies table (store/anomalies/)")
    into.seeds.append(seed)
    grace_ns = int(grace_s * 1e9)
    windows = [
        (f["start_ns"] - BEFORE_NS, (f["end_ns"] or f["start_ns"]) + grace_ns, f) for f in faults
    ]
    try:
        con = connect_views(run / "store", only=["anomalies", "owd"])
    except FileNotFoundError as exc:
        raise TrainError(str(exc)) from None
    try:
        rows = con.execute(
            """SELECT link, job_id, coalesce(updated_ns, opened_ns), detail
               FROM anomalies WHERE opened_ns > 0 AND closed_ns = 0"""
        ).fetchall()
        for link, job, t, detail in rows:
            try:
                evidence = json.loads(detail or "{}").get("evidence", {})
            except ValueError:
                continue
            inside = [f for lo, hi, f in windows if lo <= t <= hi and f["label"] != "none"]
            if not inside:
                into.add(features.vector(evidence), "unknown", "lab")
                continue
            names = _names(link, job, evidence)
            match = [f for f in inside if f["where"] in names]
            if match:
                into.add(features.vector(evidence), match[0]["label"], "lab")
        clean = [(f["start_ns"], f["end_ns"]) for f in faults if f["label"] == "none"]
        if clean and (run / "store" / "owd").is_dir():
            into.healthy.extend(_healthy_vectors(con, run, clean))
    finally:
        con.close()


def _healthy_vectors(
    con: duckdb.DuckDBPyConnection, run: Path, clean: list[tuple[int, int]]
) -> list[np.ndarray]:
    where = " OR ".join(f"(ts_ns BETWEEN {int(a)} AND {int(b)})" for a, b in clean)
    rows = con.execute(
        f"""WITH w AS (
                SELECT src, dst, sport, ts_ns // 1000000000 AS sec, median(owd_ns) AS m
                FROM owd WHERE {where} GROUP BY ALL),
            b AS (SELECT src, dst, sport, min(m) AS floor FROM w GROUP BY ALL)
            SELECT sec, median((m - floor) / 1e6), max((m - floor) / 1e6),
                   count(*) FILTER (WHERE m - floor > 1e6)
            FROM w JOIN b USING (src, dst, sport) GROUP BY sec"""
    ).fetchall()
    idx = {n: i for i, n in enumerate(features.NAMES)}
    out = []
    for _, med, mx, slow in rows:
        v = np.zeros(len(features.FEATURES))
        v[idx["median_excess_ms"]], v[idx["max_excess_ms"]] = med, mx
        v[idx["slow_paths"]] = slow
        out.append(v)
    return out


def simulate(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates as the rules would report them, drawn from the ranges real faults span."""
    rng = np.random.default_rng(seed)
    idx = {n: i for i, n in enumerate(features.NAMES)}
    X, y = [], []

    def vec(**kw: float) -> np.ndarray:
        v = np.zeros(len(features.FEATURES))
        for k, val in kw.items():
            v[idx[k]] = val
        return v

    for _ in range(n_per_class):
        # A flapping link: host counters, or only probes (spine side), maybe still down.
        flaps = int(rng.integers(1, 12))
        finished = rng.random() > 0.25 or flaps > 1
        outs: Any = rng.lognormal(np.log(2.0), 1.0, size=flaps).clip(0.05, 60) if finished else []
        longest = float(np.max(outs)) if len(outs) else 0.0
        probes = rng.random() < 0.5
        X.append(vec(
            flaps=flaps, longest_outage_s=longest,
            outages_over_kill=float(np.sum(np.asarray(outs) > ASSUMED_LIMIT_S)),  # no job
            down_now=float(rng.random() < 0.4 or not finished),
            missing_paths=float(rng.integers(1, 16)) if probes else 0.0,
            candidates=float(rng.integers(1, 3)) if probes else 0.0,
            from_probes=float(probes),
        ))  # fmt: skip
        y.append("flapping_link")
        # A job on RoCE v1 on some or all of its hosts.
        job_hosts = int(rng.integers(1, 65))
        v1 = int(rng.integers(1, job_hosts + 1))
        X.append(vec(v1_hosts=v1, v1_share=v1 / job_hosts, index_default=float(rng.random() < 0.5)))
        y.append("roce_v1_job")
        # Contention: a queue on one link in one direction, many paths slower.
        med = float(rng.lognormal(np.log(20.0), 1.0)) + 1.5
        X.append(vec(
            slow_paths=float(rng.integers(2, 80)), median_excess_ms=med,
            max_excess_ms=med * float(rng.uniform(1.0, 2.0)), from_probes=1.0,
        ))  # fmt: skip
        y.append("contention")
        # Unknown: a delay blip at the edge of the threshold on a path or two.
        med = float(rng.uniform(1.0, 1.4))
        X.append(vec(
            slow_paths=float(rng.integers(2, 4)), median_excess_ms=med,
            max_excess_ms=med + float(rng.uniform(0.0, 0.4)), from_probes=1.0,
        ))  # fmt: skip
        y.append("unknown")
    return np.vstack(X), np.asarray(y)


def train(
    runs: list[Path],
    sim_per_class: int = 400,
    seed: int = 0,
    allow_eval: bool = False,
) -> tuple[Detector, dict[str, Any]]:
    """Fit baseline and classifier; returns the detector and its model card's facts."""
    data = TrainingSet()
    for run in runs:
        read_run(run, data, allow_eval=allow_eval)
    sx, sy = (
        simulate(sim_per_class, seed)
        if sim_per_class
        else (np.zeros((0, len(features.FEATURES))), np.zeros(0, dtype=object))
    )
    for x, label in zip(list(sx), sy.tolist(), strict=True):
        data.add(x, str(label), "sim")
    if not data.X:
        raise TrainError("no labelled candidates: give lab runs or --sim > 0")
    X, y = np.vstack(data.X), np.asarray(data.y)
    healthy = np.vstack(data.healthy) if data.healthy else np.zeros((1, X.shape[1]))
    baseline = HealthyBaseline(min_scale=features.healthy_scales(), contamination=0.01).fit(healthy)
    classifier = FaultClassifier(random_state=seed).fit(X, y)
    lab = [lab for lab, s in zip(data.y, data.source, strict=True) if s == "lab"]
    card: dict[str, Any] = {
        "trained": today(),
        "seed": seed,
        "runs": [str(r) for r in runs],
        "run_seeds": data.seeds,
        "lab_candidates": dict(Counter(lab)),
        "sim_candidates": dict(Counter(y[len(lab) :].tolist())) if len(y) > len(lab) else {},
        "healthy_vectors": len(data.healthy),
        "features": list(features.NAMES),
        "importances": {
            n: round(float(w), 3)
            for n, w in zip(features.NAMES, classifier.feature_importances_, strict=True)
        },
    }
    if lab:  # how the model reads the real candidates it was trained with (not held out)
        real = np.asarray(data.source) == "lab"
        pred = classifier.predict(X[real])
        card["lab_training_accuracy"] = round(float(np.mean(pred == y[real])), 4)
    return Detector(baseline, classifier, card), card


def model_card(card: dict[str, Any], name: str) -> str:
    lines = [
        f"# Model card: {name}",
        "",
        "The clockmesh detector's models (`analytics/detect/model.py`): a `HealthyBaseline`",
        "outlier score fitted on the fleet's healthy delay noise and a `FaultClassifier`",
        "(random forest) naming `flapping_link`, `roce_v1_job`, `contention` or `unknown`",
        "for each candidate the rules find. Format: skops (never pickle).",
        "",
        "## Training data",
        "",
        f"- trained {card['trained']}, seed {card['seed']}",
        f"- lab runs (`clockmesh lab scenario run`), seeds: "
        f"{', '.join(map(str, card['run_seeds'])) or 'none'} "
        f"(evaluation seeds are >= {EVAL_SEEDS_FROM} and never used here)",
        f"- candidates from the lab runs' anomalies tables: {card['lab_candidates']}",
        f"- simulated candidates (`analytics.detect.train.simulate`): {card['sim_candidates']}",
        f"- healthy vectors for the baseline (clean stretches, per second): "
        f"{card['healthy_vectors']}",
        "",
        "## Figures",
        "",
        f"- accuracy on the lab candidates it was trained on: "
        f"{card.get('lab_training_accuracy', '-')} (not a held-out figure: "
        "`clockmesh detector eval` on evaluation seeds gives that; see docs/detect.md)",
        "- feature importances: "
        + ", ".join(
            f"{k} {v}" for k, v in sorted(card["importances"].items(), key=lambda kv: -kv[1])
        ),
        "",
        "## Limits",
        "",
        "- Trained on a 3-rack, 2-spine lab on one machine and simulated candidates; a",
        "  production fabric's own runs (`clockmesh detector train`) should replace it.",
        "- The classifier sees the rules' evidence, so it names only what a rule found;",
        "  it cannot find a fault no rule looks for.",
    ]
    return "\n".join(lines) + "\n"
