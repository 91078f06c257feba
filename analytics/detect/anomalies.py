"""Open, update and close anomalies; their rows in the ``anomalies`` table.

An anomaly is one condition at one place: a link that flaps, a job on RoCE v1. Rules find
candidates, the model (:mod:`~analytics.detect.model`) judges their class, and they
*observe* conditions every analysis pass (:meth:`AnomalyBook.observe`); the book
opens an anomaly the first time a key is seen, updates it while it is seen again, and
closes it once nothing has observed it for ``clear_s`` (the condition has cleared for
that long). Every change is a row (of evidence alone, at most every ``EVIDENCE_ROW_S``):
the ``anomalies`` table is aggregate and append-only,
the latest row of an ``anomaly_id`` (highest ``updated_ns``) is its state, and the
``anomaly_current`` view picks it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from analytics.store import layout

KINDS = ("flapping_link", "roce_v1_job", "contention", "silent_drop", "unknown")


@dataclass
class Observation:
    """What a rule saw this pass: the kind, where, how sure, and why (in words)."""

    kind: str
    key: str  # stable identity of the place: link name, job id, ...
    score: float  # 0..1
    summary: str  # one line an operator reads first
    link: str = ""
    job_id: str = ""
    src: int = 0
    dst: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    rule: str = ""  # the rule that found it, when a model has re-judged its kind

    @property
    def book_key(self) -> tuple[str, str]:
        return (self.rule or self.kind, self.key)


@dataclass
class Anomaly:
    anomaly_id: str
    kind: str
    key: str
    opened_ns: int
    updated_ns: int
    last_seen_ns: int
    score: float
    summary: str
    link: str = ""
    job_id: str = ""
    src: int = 0
    dst: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    closed_ns: int = 0
    book_key: tuple[str, str] = ("", "")
    closed_by: str = ""  # the remediation that dealt with it, when one did
    written_ns: int = 0  # when its last row was taken (AnomalyBook.take_changes)

    @property
    def open(self) -> bool:
        return self.closed_ns == 0

    def detail(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "key": self.key,
            "last_seen_ns": self.last_seen_ns,
            "evidence": self.evidence,
            **({"closed_by": self.closed_by} if self.closed_by else {}),
        }

    def live(self, now_ns: int) -> dict[str, Any]:
        return {
            "anomaly_id": self.anomaly_id,
            "kind": self.kind,
            "link": self.link,
            "job_id": self.job_id,
            "score": round(self.score, 3),
            "summary": self.summary,
            "opened_ns": self.opened_ns,
            "last_seen_ns": self.last_seen_ns,
            "closed_ns": self.closed_ns,
            "age_s": round((now_ns - self.opened_ns) / 1e9, 1),
            "quiet_s": round(max(0, now_ns - self.last_seen_ns) / 1e9, 1),
            "evidence": self.evidence,
        }


# An open anomaly the detector has not observed for this long is said to be quiet: its
# passes run every 0.2-0.5 s (up to ~1.4 s late at the rated size), so it is not a lag.
QUIET_SHOWN_S = 5.0


def quiet_note(live: dict[str, Any], clear_s: float | None) -> str:
    """How ``clockmesh live`` and the TUI say that an open anomaly (as in ``/v1/live``)
    has not been seen for a while and when it closes, in brackets beside its summary; ""
    while it is still being seen."""
    quiet = live.get("quiet_s")
    if not isinstance(quiet, int | float) or quiet < QUIET_SHOWN_S:
        return ""
    closes = f", closes at {clear_s:.0f} s" if clear_s else ""
    return f"[not seen for {quiet:.0f} s{closes}]"


def anomaly_id(kind: str, key: str, opened_ns: int) -> str:
    """Short, stable, unique id: kind prefix + hash of place and opening time."""
    digest = hashlib.blake2b(f"{kind}|{key}|{opened_ns}".encode(), digest_size=5).hexdigest()
    return f"{kind.split('_')[0]}-{digest}"


# A change of evidence alone (counters that grow every pass: probes lost, paths judged) is
# stored at most this often; a change of what is said (kind, summary, score, link), an
# open and a close at once. A standing silent drop wrote a row every pass (~240 a minute
# on the demo lab); the live picture shows every change as it comes.
EVIDENCE_ROW_S = 5.0


class AnomalyBook:
    """The detector's open anomalies, and the rows to store for every change."""

    def __init__(self, clear_s: float = 60.0, keep_closed: int = 50) -> None:
        self.clear_ns = int(clear_s * 1e9)
        self.keep_closed = keep_closed
        self.open: dict[tuple[str, str], Anomaly] = {}
        self.closed: list[Anomaly] = []  # most recent last
        self._changed: list[Anomaly] = []

    def observe(self, obs: Observation, now_ns: int) -> Anomaly:
        key = obs.book_key
        a = self.open.get(key)
        if a is None:
            a = Anomaly(
                anomaly_id(obs.kind, obs.key, now_ns),
                obs.kind,
                obs.key,
                opened_ns=now_ns,
                updated_ns=now_ns,
                last_seen_ns=now_ns,
                score=obs.score,
                summary=obs.summary,
                link=obs.link,
                job_id=obs.job_id,
                src=obs.src,
                dst=obs.dst,
                evidence=obs.evidence,
                book_key=key,
            )
            self.open[key] = a
            self._changed.append(a)
            return a
        a.last_seen_ns = now_ns
        said = (a.kind, a.summary, round(a.score, 3), a.link) != (
            obs.kind,
            obs.summary,
            round(obs.score, 3),
            obs.link,
        )
        if said or a.evidence != obs.evidence:
            a.kind, a.summary, a.evidence, a.score = obs.kind, obs.summary, obs.evidence, obs.score
            a.link = obs.link  # named more precisely as evidence comes in
            a.updated_ns = now_ns
        due = a.updated_ns > a.written_ns and (
            said or now_ns - a.written_ns >= int(EVIDENCE_ROW_S * 1e9)
        )
        if due and a not in self._changed:
            self._changed.append(a)
        return a

    def expire(self, now_ns: int) -> list[Anomaly]:
        """Close every anomaly not observed for ``clear_s``; returns those closed."""
        done = [a for a in self.open.values() if now_ns - a.last_seen_ns >= self.clear_ns]
        for a in done:
            self.close(a, now_ns)
        return done

    def close(self, a: Anomaly, now_ns: int, closed_by: str = "") -> None:
        """Close ``a`` now (cleared, or dealt with by the remediation ``closed_by``)."""
        del self.open[a.book_key]
        a.closed_ns = a.updated_ns = now_ns
        a.closed_by = closed_by
        self.closed.append(a)
        if a not in self._changed:
            self._changed.append(a)
        del self.closed[: max(0, len(self.closed) - self.keep_closed)]

    def take_changes(self) -> pa.Table | None:
        """Rows for every anomaly opened, updated or closed since the last call."""
        changed, self._changed = self._changed, []
        for a in changed:
            a.written_ns = a.updated_ns
        if not changed:
            return None
        cols: dict[str, list[Any]] = {
            "opened_ns": [a.opened_ns for a in changed],
            "closed_ns": [a.closed_ns for a in changed],
            "anomaly_id": [a.anomaly_id for a in changed],
            "kind": [a.kind for a in changed],
            "score": [float(a.score) for a in changed],
            "src": [a.src for a in changed],
            "dst": [a.dst for a in changed],
            "link": [a.link for a in changed],
            "job_id": [a.job_id for a in changed],
            "detail": [json.dumps(a.detail(), sort_keys=True) for a in changed],
            "updated_ns": [a.updated_ns for a in changed],
        }
        return pa.table(cols, schema=layout.TABLES["anomalies"].schema)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for a in self.open.values():
            out[a.kind] = out.get(a.kind, 0) + 1
        return out
