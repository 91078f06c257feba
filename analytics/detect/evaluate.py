"""Score the detector against labelled runs: confusion matrix, precision, recall,
localisation, latency.

A run directory (``clockmesh lab scenario run``) holds ``truth.json`` (the faults, each
with its class, place and wall-clock start/end) and ``store/`` (what the ops box wrote,
anomalies included). Matching, per run:

- a fault's *window* is [start − 2 s, end + ``grace_s``];
- the fault is *detected as* the class of the first anomaly opened in its window (or
  ``none``); it is *localised* if anomalies of its class in the window name each of its
  places (the link, among the candidates of an ambiguous one, or the job; a fault with
  several, ``detail.places``: each) and every such anomaly names one of them — a second
  verdict elsewhere (a spine said to drop 12 % of its flows beside the two hosts it
  black-holed) is not localised;
- an anomaly opened in no fault's window, or of another class than every fault whose
  window it falls in, is a false alarm of its class (row ``none`` of the matrix);
- precision of a class = its anomalies matched to a fault of that class / all its
  anomalies; recall = its faults detected as that class / its faults;
- latency = first anomaly of the right class opened − fault start (a fault with several
  places: once each was named).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analytics.detect.anomalies import KINDS
from analytics.store.catalog import connect_views

CLASSES = ("flapping_link", "roce_v1_job", "contention", "silent_drop")
LABELS = (*CLASSES, "none")
BEFORE_NS = 2_000_000_000
GRACE_NS = 15_000_000_000  # an anomaly this long after a fault's end still counts for it


class EvalError(Exception):
    """A run directory cannot be evaluated; ``str()`` is one line naming it."""


@dataclass
class Report:
    runs: int = 0
    hours_clean: float = 0.0
    unknown: int = 0  # anomalies the model would not name, outside every fault they explain
    confusion: dict[str, dict[str, int]] = field(
        default_factory=lambda: {t: dict.fromkeys(LABELS, 0) for t in LABELS}
    )
    localised: dict[str, list[bool]] = field(default_factory=dict)
    latencies_s: dict[str, list[float]] = field(default_factory=dict)

    def precision(self, cls: str) -> float | None:
        predicted = sum(self.confusion[t][cls] for t in LABELS)
        return self.confusion[cls][cls] / predicted if predicted else None

    def recall(self, cls: str) -> float | None:
        actual = sum(self.confusion[cls][p] for p in LABELS)
        return self.confusion[cls][cls] / actual if actual else None

    def false_alarms(self) -> int:
        return sum(self.confusion["none"][c] for c in CLASSES)

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "confusion": self.confusion,
            "precision": {c: self.precision(c) for c in CLASSES},
            "recall": {c: self.recall(c) for c in CLASSES},
            "localisation": {
                c: (sum(v) / len(v) if v else None) for c, v in self.localised.items()
            },
            "latency_s": {c: sorted(v) for c, v in self.latencies_s.items()},
            "false_alarms": self.false_alarms(),
            "unknown": self.unknown,
            "clean_hours": round(self.hours_clean, 3),
        }


def stored_anomalies(run: Path) -> list[dict[str, Any]]:
    """Every anomaly of a run's store, as counted: per (anomaly, class), placed and timed
    (``opened_ns``) where it was first said."""
    store = run / "store"
    if not (store / "anomalies").is_dir():
        raise EvalError(f"{run}: no store with an anomalies table (store/anomalies/)")
    try:
        con = connect_views(store, only=["anomalies"])
    except FileNotFoundError as exc:
        raise EvalError(str(exc)) from None
    try:
        rows = con.execute(
            # An anomaly the model re-judged counts in each class from the first row that
            # carried it (opened as unknown at t0, contention at t1: contention from t1);
            # one whose place was refined while open ("leaf1-spine1", then "leaf1-spine1 or
            # leaf2-spine1") counts once, placed where it was first said.
            """WITH said AS (
                   SELECT *, greatest(opened_ns, coalesce(updated_ns, 0)) AS said_ns
                   FROM anomalies WHERE opened_ns > 0 AND closed_ns = 0)
               SELECT anomaly_id, kind, arg_min(link, said_ns) AS link,
                      arg_min(job_id, said_ns) AS job_id, min(said_ns) AS opened_ns,
                      arg_max(detail, coalesce(updated_ns, 0)) AS detail
               FROM said GROUP BY anomaly_id, kind ORDER BY 5"""
        ).fetchall()
    finally:
        con.close()
    out = []
    for anomaly_id, kind, link, job_id, opened_ns, detail in rows:
        try:
            evidence = json.loads(detail or "{}").get("evidence", {})
        except ValueError:
            evidence = {}
        out.append(
            {"id": anomaly_id, "kind": kind, "link": link, "job_id": job_id,
             "opened_ns": opened_ns, "evidence": evidence}
        )  # fmt: skip
    return out


def _names(a: dict[str, Any]) -> set[str]:
    return {a["link"], a["job_id"], *a["evidence"].get("candidates", [])} - {""}


def fault_window(fault: dict[str, Any], grace_ns: int = GRACE_NS) -> tuple[int, int]:
    """The span in which an anomaly counts for a fault of ``truth.json`` (ns): from
    ``BEFORE_NS`` before its start to ``grace_ns`` after its end."""
    return fault["start_ns"] - BEFORE_NS, (fault["end_ns"] or fault["start_ns"]) + grace_ns


def evaluate(runs: list[Path], grace_s: float = GRACE_NS / 1e9) -> Report:
    report = Report()
    grace_ns = int(grace_s * 1e9)
    for run in runs:
        try:
            truth = json.loads((run / "truth.json").read_text())
            faults = truth["faults"]
        except (OSError, ValueError, KeyError) as exc:
            raise EvalError(f"{run}: no readable truth.json ({exc})") from None
        anomalies = [a for a in stored_anomalies(run) if a["kind"] in KINDS]
        report.runs += 1
        used: set[str] = set()
        for f in faults:
            lo, hi = fault_window(f, grace_ns)
            inside = [a for a in anomalies if lo <= a["opened_ns"] <= hi]
            label = f["label"]
            if label == "none":
                report.hours_clean += (hi - grace_ns - f["start_ns"]) / 3.6e12
                continue  # anomalies here are false alarms, counted below
            named = [a for a in inside if a["kind"] in CLASSES]
            predicted = named[0]["kind"] if named else "none"
            report.confusion[label][predicted] += 1
            right = [a for a in inside if a["kind"] == label]
            used |= {a["id"] for a in right}
            if right:
                places = list((f.get("detail") or {}).get("places") or [f["where"]])
                naming = [[a["opened_ns"] for a in right if p in _names(a)] for p in places]
                said = max(min(t) for t in naming) if len(places) > 1 and all(naming) else None
                report.latencies_s.setdefault(label, []).append(
                    round(((said or right[0]["opened_ns"]) - f["start_ns"]) / 1e9, 2)
                )
                report.localised.setdefault(label, []).append(
                    all(naming) and all(_names(a) & set(places) for a in right)
                )
            else:
                report.localised.setdefault(label, []).append(False)
        for a in anomalies:
            if a["id"] in used:
                continue
            if a["kind"] in CLASSES:
                report.confusion["none"][a["kind"]] += 1
            else:
                report.unknown += 1  # shown to operators as "unknown", not a named class
    return report


def render(report: Report) -> str:
    d = report.as_dict()
    w = max(len(x) for x in LABELS) + 2
    lines = [f"{report.runs} run(s); rows: truth, columns: detected"]
    lines.append("".ljust(w) + "".join(p.rjust(w) for p in LABELS))
    for t in LABELS:
        lines.append(t.ljust(w) + "".join(str(report.confusion[t][p]).rjust(w) for p in LABELS))
    lines.append("")

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines.append(
        f"{'class':<16}{'precision':>10}{'recall':>8}{'located':>9}  latency s (median, max)"
    )
    for c in CLASSES:
        lat = d["latency_s"].get(c) or []
        med = f"{lat[len(lat) // 2]:.1f}, {lat[-1]:.1f}" if lat else "-"
        lines.append(
            f"{c:<16}{fmt(d['precision'][c]):>10}{fmt(d['recall'][c]):>8}"
            f"{fmt(d['localisation'].get(c)):>9}  {med}"
        )
    lines.append(
        f"false alarms: {d['false_alarms']} over {d['clean_hours']:.3f} h of clean stretches "
        "(and every anomaly outside a fault's window)"
    )
    lines.append(f"unknown (not named, not matched to a fault): {d['unknown']}")
    return "\n".join(lines)
