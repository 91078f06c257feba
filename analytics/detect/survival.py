"""What a job survives of a link's outages, judged for each ``flapping_link`` observation
(host counters, :mod:`analytics.detect.flaps`; path tomography, :mod:`analytics.detect.paths`).

Each outage is judged (:func:`judge_outages`) against the jobs crossing the link while
it happened — a host link is crossed by the jobs on its host, a leaf gone as a whole by
the jobs on any of its hosts, a leaf–spine link by the jobs with hosts under that leaf and
in another rack — each with the outage its queue pairs survive, ``4.096 µs ×
2^NCCL_IB_TIMEOUT × (NCCL_IB_RETRY_CNT + 1)`` from the job's own settings or its NCCL
version's defaults (:mod:`collector.job_nccl`): "kills job J: outage 12.0 s > its 8.6 s".
With no job seen crossing the link, the current NCCL defaults are assumed and said so. A
job is judged on what its flows lost: a host link is its host's only path (the whole
outage); a leaf–spine link whose rack kept another spine is routed around, its flows lose
only the reroute's burst (``reroutes_s``, measured by :mod:`analytics.detect.paths`; "job
J survives the reroute"); a rack that lost every spine loses the outage.
"""

from __future__ import annotations

from typing import Any

from analytics.detect.anomalies import Observation
from analytics.detect.roce import JobLimit
from collector import job_nccl

# With no job seen crossing a link: what a job on current NCCL defaults survives
# (NCCL_IB_TIMEOUT 20 since 2.23, NCCL_IB_RETRY_CNT 7): 4.096 µs × 2^20 × 8 = 34.4 s.
ASSUMED_TIMEOUT, ASSUMED_RETRY = job_nccl.TIMEOUT_DEFAULTS[0][1], job_nccl.DEFAULT_RETRY_CNT
ASSUMED_LIMIT_S = job_nccl.qp_limit_s(ASSUMED_TIMEOUT, ASSUMED_RETRY)
_SINCE = ".".join(map(str, job_nccl.TIMEOUT_DEFAULTS[0][0]))
ASSUMED_WORDS = (
    f"NCCL >= {_SINCE} defaults: "
    f"NCCL_IB_TIMEOUT {ASSUMED_TIMEOUT}, NCCL_IB_RETRY_CNT {ASSUMED_RETRY}"
)
JOB_SLACK_NS = 10_000_000_000  # a job's snapshot trails its start (5-s scans, shipping)


def _reroute_verdict(
    r: float, limit: float | None, bounds: tuple[float, float] | list[float] | None
) -> str:
    """A job on a rerouted fabric link: its flows lost at most ``r`` s (an upper bound, so
    over the job's limit it *may* have killed it, never certainly)."""
    if limit is not None:
        return "survives" if r <= limit else "may kill"
    return "survives" if bounds is not None and r <= bounds[0] else "may kill"


def _verdict(
    d: float | None, limit: float | None, bounds: tuple[float, float] | None = None
) -> str | None:
    if d is None:
        return None  # shorter than one sample: not judged
    if limit is None:
        if bounds is not None and d < bounds[0]:
            return "survives"  # shorter than what any release's default survives
        if bounds is not None and d > bounds[1]:
            return "kills"  # longer than what any release's default survives
        return "may kill"
    return "kills" if d > limit else "survives"


def judge_outages(obs: Observation, jobs: list[JobLimit]) -> None:
    """Judge a ``flapping_link`` observation's finished outages against the jobs that
    crossed the link while each happened (``jobs``; none: the current NCCL defaults,
    assumed and said so): sets the summary's verdict, the score, and the evidence's
    ``job_verdicts``, ``outages_over_kill_s`` and ``collective_kill_s``.

    What a job loses is judged, not how long the link was out: a host link is its host's
    only path (the job loses the whole outage); a leaf–spine link whose rack kept another
    spine is routed around (the job's flows lose only the reroute's burst, ``reroutes_s``:
    over its limit that bound *may* kill it); a rack that lost every path loses the
    outage."""
    e = obs.evidence
    n = int(e.get("flaps") or 0)
    # keep a scale the caller applied (tomography's confidence when links are twins)
    before = 1.0 - 0.5 ** (n + (1 if e.get("outages_over_kill_s") else 0))
    scale = obs.score / before if "outages_over_kill_s" in e and before > 0 else 1.0
    durations: list[float | None] = list(e.get("outages_s") or [])
    spans: list[list[int]] = list(e.get("outages_ns") or [])
    fabric = "reroutes_s" in e
    reroutes: list[float | None] = list(e.get("reroutes_s") or [])
    reroutes += [None] * (len(durations) - len(reroutes))
    lost_all = [bool(x) for x in (e.get("every_path_lost") or [])][: len(durations)]
    lost_all += [False] * (len(durations) - len(lost_all))
    # A fabric link whose rack kept another spine but whose reroute was not measured: its
    # flows lost at most the outage, most likely only the reroute — over a job's limit it
    # *may* have killed it, never certainly.
    unmeasured = [fabric and r is None and not lost
                  for r, lost in zip(reroutes, lost_all, strict=True)]  # fmt: skip
    judged: list[dict[str, Any]] = []
    fatal: set[int] = set()
    for jl in sorted(jobs, key=lambda j: j.job):
        verdicts: list[str | None] = []
        for i, d in enumerate(durations):
            down, up = spans[i] if i < len(spans) else (0, 0)
            ran = jl.first_ns - JOB_SLACK_NS <= up and (not jl.last_ns or jl.last_ns >= down)
            r = reroutes[i]
            if not ran:
                verdicts.append(None)
            elif r is not None:
                verdicts.append(_reroute_verdict(r, jl.limit_s, jl.bounds))
            elif unmeasured[i]:
                v = _verdict(d, jl.limit_s, jl.bounds)
                verdicts.append("may kill" if v == "kills" else v)
            else:
                verdicts.append(_verdict(d, jl.limit_s, jl.bounds))
        fatal |= {i for i, v in enumerate(verdicts) if v == "kills"}
        judged.append({
            "job_id": jl.job,
            "survives_s": None if jl.limit_s is None else round(jl.limit_s, 3),
            "survives_range_s": None if jl.bounds is None else [round(b, 3) for b in jl.bounds],
            "survives_from": jl.words,
            "hosts": len(jl.hosts),
            "verdicts": verdicts,
        })  # fmt: skip
    if not jobs:
        fatal = {i for i, d in enumerate(durations) if reroutes[i] is None
                 and not unmeasured[i] and d is not None and d > ASSUMED_LIMIT_S}  # fmt: skip
    longest = e.get("longest_outage_s")
    # a spine every path through which went (analytics.detect.paths): all its links, or all
    # but one of them, which no trace tells apart — the summary claims only the paths
    where = (
        f"{obs.link} (all {len(e['hosts_cut_off'])} of its host links at once)"
        if e.get("hosts_cut_off")
        else f"{obs.link} (every path through it)"
        if e.get("switch")
        else obs.link
    )
    parts = [f"{where} flapped {n} time{'s' if n != 1 else ''} in "
             f"{(e.get('window_s') or 600) / 60:.0f} min"]  # fmt: skip
    if longest is not None and fabric:
        parts.append(f"out of service up to {longest:.1f} s{_how_routed(e, reroutes)}")
    elif longest is not None:
        parts.append(f"outages up to {longest:.1f} s")
    if e.get("down_now"):
        parts.append("down now")
    kills: list[str] = []
    unsure_parts: list[str] = []
    survives: list[str] = []
    for j in judged:
        limit = _secs(j["survives_s"], j["survives_range_s"])
        on_outage = [(d, v) for d, r, u, v in zip(durations, reroutes, unmeasured, j["verdicts"],
                                                   strict=True)
                     if r is None and not u and d is not None]  # fmt: skip
        on_unmeasured = [(d, v) for d, u, v in zip(durations, unmeasured, j["verdicts"],
                                                   strict=True) if u and d is not None]  # fmt: skip
        on_reroute = [(r, v) for r, v in zip(reroutes, j["verdicts"], strict=True)
                      if r is not None]  # fmt: skip
        worst = max((d for d, v in on_outage if v == "kills"), default=None)
        unsure = max((d for d, v in on_outage if v == "may kill"), default=None)
        unsure_r = max((r for r, v in on_reroute if v == "may kill"), default=None)
        unsure_u = max((d for d, v in on_unmeasured if v == "may kill"), default=None)
        if worst is not None:
            kills.append(f"kills job {j['job_id']}: outage {worst:.1f} s > its {limit}")
        elif unsure is not None:
            unsure_parts.append(f"job {j['job_id']} may not survive: outage {unsure:.1f} s, "
                                f"its limit unknown ({j['survives_from']})")  # fmt: skip
        elif unsure_u is not None:
            unsure_parts.append(f"job {j['job_id']} may not survive: out {unsure_u:.1f} s and "
                                f"its flows' reroute not measured, its {limit}")  # fmt: skip
        elif unsure_r is not None:
            unsure_parts.append(f"job {j['job_id']} may not survive the reroute: paths "
                                f"rerouted within {unsure_r:.2f} s, its {limit}")  # fmt: skip
        elif any(v == "survives" for _d, v in on_outage + on_unmeasured):
            survives.append(f"job {j['job_id']} survives (its {limit})")
        elif any(v == "survives" for _r, v in on_reroute):
            survives.append(f"job {j['job_id']} survives the reroute (its {limit})")
    parts += kills + unsure_parts + survives  # what kills first
    if not jobs and durations:
        over = len(fatal)
        rerouted = fabric and all(r is not None for r in reroutes)
        parts.append(
            ("judged on the reroute: " if rerouted else "")
            + (f"{over} longer than" if over else "none longer than")
            + f" the {ASSUMED_LIMIT_S:.1f} s a job survives on {ASSUMED_WORDS} "
            "(assumed: no job seen crossing it)"
        )
    obs.summary = "; ".join(parts)
    obs.score = (1.0 - 0.5 ** (n + (1 if fatal else 0))) * scale
    limits: list[float] = [j["survives_s"] for j in judged if j["survives_s"] is not None]
    e["job_verdicts"] = judged  # not "jobs": contention lists job ids there
    e["outages_over_kill_s"] = len(fatal)
    e["collective_kill_s"] = round(min(limits), 3) if limits else (
        None if judged else round(ASSUMED_LIMIT_S, 3))  # fmt: skip


def _how_routed(e: dict, reroutes: list[float | None]) -> str:
    """A fabric link's outages, as a job crossing it saw them: "(paths rerouted within
    0.32 s)", or every path of its rack lost, or the reroute not measured."""
    lost = list(e.get("every_path_lost") or [])
    words = []
    known = [r for r in reroutes if r is not None]
    if known:
        words.append(f"paths rerouted within {max(known):.2f} s")
    n_lost = sum(1 for x in lost if x)
    if n_lost:
        words.append(f"every path of {e.get('leaf') or 'its rack'} lost"
                     + (f" in {n_lost} of them" if known else ""))  # fmt: skip
    unmeasured = sum(1 for i, r in enumerate(reroutes) if r is None and not
                     (i < len(lost) and lost[i]))  # fmt: skip
    if unmeasured:
        words.append("reroute not measured" + (f" in {unmeasured}" if known or n_lost else ""))
    if n_lost or unmeasured:
        words[-1] += ": judged on the outage"
    return f" ({'; '.join(words)})" if words else ""


def _secs(s: float | None, bounds: list[float] | None = None) -> str:
    if s is None and bounds:
        return f"{_secs(bounds[0])} to {_secs(bounds[1])} (NCCL version unknown)"
    return "unknown" if s is None else f"{s:.2g} s" if s < 1 else f"{s:.1f} s"


class Survival:
    """Which jobs cross each flapping link, remembered while the link has an observation
    (a job killed by an outage and gone since still counts for that outage)."""

    def __init__(
        self, host_rack: dict[int, str], host_names: dict[int, str], window_s: float = 600.0
    ) -> None:
        self.host_rack = host_rack
        self.host_names = host_names
        self.window_ns = int(window_s * 1e9)  # as long as the link's outages are counted
        self.seen: dict[str, dict[str, JobLimit]] = {}

    def crossing(self, evidence: dict, jobs: dict[str, JobLimit]) -> list[JobLimit]:
        host = evidence.get("host")
        cut_off = set(evidence.get("hosts_cut_off") or [])  # a leaf gone as a whole
        if host or cut_off:  # a host's access link: the jobs on that host
            ids = {h for h, n in self.host_names.items() if n == host or n in cut_off}
            return [j for j in jobs.values() if j.hosts & ids]
        racks = set(evidence.get("racks_exposed") or [])
        if not racks:
            return []
        out = []
        for j in jobs.values():
            mine = {self.host_rack.get(h, "") for h in j.hosts}
            # a leaf-spine link carries the job's traffic between its rack and another
            if mine & racks and len(mine - {""}) > 1:
                out.append(j)
        return out

    def judge(self, observed: list[Observation], jobs: dict[str, JobLimit], now_ns: int) -> None:
        keys = set()
        for obs in observed:
            if obs.kind != "flapping_link":
                continue
            keys.add(obs.key)
            mem = self.seen.setdefault(obs.key, {})
            for j in self.crossing(obs.evidence, jobs):
                was = mem.get(j.job)
                mem[j.job] = JobLimit(j.job, j.limit_s, j.words, set(j.hosts),
                                      min(j.first_ns, was.first_ns) if was else j.first_ns,
                                      j.last_ns, j.bounds)  # fmt: skip
            judge_outages(obs, list(mem.values()))
        for key in set(self.seen) - keys:  # jobs are remembered as long as the outages
            mem = self.seen[key]
            for job in [j for j, jl in mem.items() if now_ns - jl.last_ns > self.window_ns]:
                del mem[job]
            if not mem:
                del self.seen[key]
