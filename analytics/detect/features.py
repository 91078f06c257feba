"""The detector's features: one fixed-length numeric vector per candidate anomaly.

The rules (:mod:`~analytics.detect.flaps`, :mod:`~analytics.detect.paths`,
:mod:`~analytics.detect.contention`, :mod:`~analytics.detect.roce`) find *where* something
is wrong and put what they measured in an observation's evidence; this module turns that
evidence into the vector the models score and classify (:mod:`~analytics.detect.model`).
The same function reads a live observation and a stored ``anomalies`` row, so a model is
trained on exactly what the daemon computes.

Every feature has words, for the evidence an operator reads ("longest outage 4.2 s,
healthy 0"), and a *healthy scale*: the smallest change that means something, used by the
baseline when the fleet's healthy data does not vary at all in that feature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

# Bump when FEATURES changes: a model trained on another layout is refused at load.
FEATURES_VERSION = 1


class Feature(NamedTuple):
    name: str
    words: str  # "<words> <value><unit>" reads as evidence
    unit: str
    healthy_scale: float


FEATURES: tuple[Feature, ...] = (
    Feature("flaps", "outages in the window", "", 1.0),
    Feature("longest_outage_s", "longest outage", " s", 0.5),
    Feature("outages_over_kill", "outages fatal to a job crossing it", "", 1.0),
    Feature("down_now", "link down now", "", 1.0),
    Feature("missing_paths", "probe paths with no answer through it", "", 1.0),
    Feature("candidates", "links that explain it equally", "", 1.0),
    Feature("slow_paths", "paths slower than their baseline", "", 1.0),
    Feature("median_excess_ms", "median one-way delay over baseline", " ms", 0.2),
    Feature("max_excess_ms", "largest one-way delay over baseline", " ms", 0.2),
    Feature("v1_hosts", "job hosts on a RoCE v1 GID", "", 1.0),
    Feature("v1_share", "share of the job's hosts on RoCE v1", "", 0.25),
    Feature("index_default", "GID index left to the library default", "", 1.0),
    Feature("from_probes", "seen only by probes (no host counter)", "", 1.0),
)
NAMES = tuple(f.name for f in FEATURES)


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if np.isfinite(v) else 0.0


def vector(evidence: Mapping[str, Any]) -> np.ndarray:
    """The feature vector of one observation's evidence (missing fields count 0)."""
    e = evidence
    hosts = e.get("hosts") or []
    job_hosts = _num(e.get("job_hosts"))
    sources = " ".join(e.get("index_source") or [])
    out = (
        _num(e.get("flaps")),
        _num(e.get("longest_outage_s")),
        _num(e.get("outages_over_kill_s")),
        1.0 if e.get("down_now") else 0.0,
        _num(e.get("missing_paths")),
        float(len(e.get("candidates") or [])),
        _num(e.get("slow_paths")),
        _num(e.get("median_excess_ms")),
        _num(e.get("max_excess_ms")),
        float(len(hosts)) if "gid_indices" in e else 0.0,
        len(hosts) / job_hosts if "gid_indices" in e and job_hosts else 0.0,
        1.0 if "default" in sources else 0.0,
        1.0 if "path traces" in str(e.get("source", "")) or "one-way" in str(e.get("source", ""))
        else 0.0,
    )  # fmt: skip
    return np.asarray(out, dtype=np.float64)


def matrix(evidences: list[Mapping[str, Any]]) -> np.ndarray:
    if not evidences:
        return np.zeros((0, len(FEATURES)))
    return np.vstack([vector(e) for e in evidences])


def healthy_scales() -> np.ndarray:
    return np.asarray([f.healthy_scale for f in FEATURES], dtype=np.float64)


def describe(i: int, value: float, healthy: float) -> str:
    """One feature's value in words, against its healthy value."""
    f = FEATURES[i]

    def fmt(x: float) -> str:
        return f"{x:.3g}"

    return f"{f.words} {fmt(value)}{f.unit} (healthy {fmt(healthy)}{f.unit})"
