"""A fleet report for a time range, from the store's views (DuckDB), with plots.

:func:`collect` queries the store (the same views ``clockmesh sql`` offers) for one range
and returns the facts as plain data; :func:`write` renders them as a self-contained HTML
page (plots inline as SVG: viewable with no network), Markdown (plots as SVG files beside
it) and JSON (the same facts). Plots with matplotlib.

GPU-hours at risk, stated with its assumption, follow the detector's judgement of each
outage against the jobs that crossed the link (``evidence.job_verdicts``, analytics/detect/survival.py:
each job's queue pairs survive 4.096 µs × 2^NCCL_IB_TIMEOUT × (NCCL_IB_RETRY_CNT + 1)): a
job that survives an outage stalls for it (its hosts × GPUs per host × the outage; on a
leaf–spine link routed around, × the reroute, ``evidence.reroutes_s``); a job it
kills loses the outage and the work since its last checkpoint plus the restart
(``lost_min`` minutes, stated). Anomalies stored before jobs were judged (no
``evidence.job_verdicts``) fall back to the hosts behind the link (its rack for a leaf–spine link,
the host for an access link) × the outage, judged against current NCCL defaults.

Over 500 lines: one report: its queries, its plots and three renderings of the same facts.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from analytics.detect import attribution
from analytics.detect.survival import ASSUMED_LIMIT_S, ASSUMED_WORDS
from analytics.store.catalog import connect_views
from analytics.topology import TopologyError, read_topology
from analytics.topology import racks as topology_racks

LOST_MIN = 30.0  # work a killed job loses: since its last checkpoint, and the restart
KIND_COLOURS = {"flapping_link": "#d62728", "roce_v1_job": "#9467bd", "contention": "#ff7f0e",
                "unknown": "#7f7f7f"}  # fmt: skip


class ReportError(Exception):
    """The report cannot be made; ``str()`` is one line naming the store or range."""


@dataclass
class Range:
    since_ns: int
    until_ns: int

    def label(self) -> str:
        f = "%Y-%m-%d %H:%M:%S UTC"
        a = dt.datetime.fromtimestamp(self.since_ns / 1e9, dt.UTC).strftime(f)
        b = dt.datetime.fromtimestamp(self.until_ns / 1e9, dt.UTC).strftime(f)
        return f"{a} – {b}"


def _when(ns: int | None) -> str:
    if not ns:
        return "—"
    return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _connect(store: Path) -> duckdb.DuckDBPyConnection:
    try:
        return connect_views(store)
    except FileNotFoundError as exc:
        raise ReportError(str(exc)) from None


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def collect(
    store: Path,
    rng: Range,
    topology: Path | None = None,
    gpus_per_host: int = 8,
    lost_min: float = LOST_MIN,
) -> dict[str, Any]:
    racks: dict[str, str] = {}
    link_leaf: dict[str, str] = {}
    if topology is not None:
        try:
            topo_doc = read_topology(topology)
            racks = topology_racks(topo_doc)
            link_leaf = attribution.link_leaves(topo_doc)
        except TopologyError as exc:
            raise ReportError(str(exc)) from None
    con = _connect(store)
    try:
        a, b = rng.since_ns, rng.until_ns
        days = "date BETWEEN CAST(make_timestamp(?::BIGINT // 1000) AS DATE) AND CAST(make_timestamp(?::BIGINT // 1000) AS DATE)"
        fleet = _rows(con, f"""
            SELECT count(DISTINCT src) AS hosts, coalesce(sum(sent), 0) AS sent,
                   coalesce(sum(received), 0) AS received
            FROM probe_minute WHERE {days} AND minute_ns >= ? AND minute_ns < ?""",
            [a, b, a, b])[0]  # fmt: skip
        names = {r["host_id"]: r["host"] for r in _rows(con, "SELECT host_id, host FROM hosts", [])}
        anomalies = _rows(con, """
            SELECT anomaly_id, kind, link, job_id, opened_ns, closed_ns, score, summary, detail
            FROM anomaly_current
            WHERE opened_ns < ? AND (closed_ns = 0 OR closed_ns >= ?)
            ORDER BY opened_ns""", [b, a])  # fmt: skip
        pairs = _rows(con, f"""
            SELECT src, dst, sum(sent) AS sent, sum(received) AS received,
                   1 - sum(received) / greatest(sum(sent), 1) AS loss,
                   quantile_cont(delay_p50_ns, 0.5) / 1e3 AS p50_us,
                   max(delay_p99_ns) / 1e3 AS p99_us
            FROM probe_minute WHERE {days} AND minute_ns >= ? AND minute_ns < ?
            GROUP BY src, dst ORDER BY loss DESC, p99_us DESC""", [a, b, a, b])  # fmt: skip
        minutes = _rows(con, f"""
            SELECT minute_ns, 1 - sum(received) / greatest(sum(sent), 1) AS loss
            FROM probe_minute WHERE {days} AND minute_ns >= ? AND minute_ns < ?
            GROUP BY minute_ns ORDER BY minute_ns""", [a, b, a, b])  # fmt: skip
        # Corrected one-way delay (the clock solver's owd rows): raw delays carry each
        # pair's clock offset, so pairs and racks are compared on corrected ones only.
        corrected = {(r["src"], r["dst"]): r["p50_us"] for r in _rows(con, f"""
            SELECT src, dst, quantile_cont(owd_ns, 0.5) / 1e3 AS p50_us FROM owd
            WHERE {days} AND ts_ns >= ? AND ts_ns < ? GROUP BY src, dst""", [a, b, a, b])}  # fmt: skip
        worst = pairs[:3]
        series: dict[str, list[tuple[int, float, float]]] = {}
        series_kind: dict[str, str] = {}
        for p in worst:
            key = f"{names.get(p['src'], p['src'])}→{names.get(p['dst'], p['dst'])}"
            pts = [(r["minute_ns"], r["p50"], r["p99"]) for r in _rows(con, f"""
                SELECT (ts_ns // 60000000000) * 60000000000 AS minute_ns,
                       quantile_cont(owd_ns, 0.5) / 1e3 AS p50,
                       quantile_cont(owd_ns, 0.99) / 1e3 AS p99 FROM owd
                WHERE {days} AND ts_ns >= ? AND ts_ns < ? AND src = ? AND dst = ?
                GROUP BY ALL ORDER BY minute_ns""", [a, b, a, b, p["src"], p["dst"]])]  # fmt: skip
            series_kind[key] = "corrected"
            if not pts:  # the clock solver has not run over this range: raw, said so
                series_kind[key] = "raw"
                pts = [(r["minute_ns"], r["p50"], r["p99"]) for r in _rows(con, f"""
                    SELECT minute_ns, delay_p50_ns / 1e3 AS p50, delay_p99_ns / 1e3 AS p99
                    FROM probe_minute
                    WHERE {days} AND minute_ns >= ? AND minute_ns < ? AND src = ? AND dst = ?
                    ORDER BY minute_ns""", [a, b, a, b, p["src"], p["dst"]])]  # fmt: skip
            series[key] = pts
        # Each worst pair's lost probes per minute: whether an anomaly open then explains them.
        pair_minutes: dict[tuple[int, int], list[tuple[int, int]]] = {}
        keys = [f"{p['src']}>{p['dst']}" for p in pairs[:10]]
        for r in _rows(con, f"""
                SELECT src, dst, minute_ns, sum(sent) - sum(received) AS lost FROM probe_minute
                WHERE {days} AND minute_ns >= ? AND minute_ns < ?
                  AND list_contains(?::VARCHAR[], src::VARCHAR || '>' || dst::VARCHAR)
                GROUP BY ALL HAVING sum(sent) > sum(received) ORDER BY minute_ns""",
                [a, b, a, b, keys]):  # fmt: skip
            pair_minutes.setdefault((r["src"], r["dst"]), []).append((r["minute_ns"], r["lost"]))
        clock = _rows(con, f"""
            SELECT count(DISTINCT host) AS hosts, count(*) AS estimates,
                   quantile_cont(uncertainty_ns, 0.5) AS median_ns,
                   quantile_cont(uncertainty_ns, 0.99) AS p99_ns
            FROM clock WHERE {days} AND window_start_ns >= ? AND window_start_ns < ?
              AND isfinite(uncertainty_ns)""", [a, b, a, b])[0]  # fmt: skip
        # The classic estimate beside the solver's: each echo's RTT/2 offset
        # ((t2 - t1) - (t4 - t3)) / 2 against the solver's offset difference in that window
        # (path asymmetry shows here: ECMP sends the echo back on another path).
        rtt = _rows(con, f"""
            WITH e AS (
                SELECT * FROM (
                    SELECT src, dst, t1_ns, ((t2_ns - t1_ns) - (t4_ns - t3_ns)) / 2.0 AS theta
                    FROM echo WHERE {days} AND t1_ns >= ? AND t1_ns < ?
                ) USING SAMPLE reservoir(200000 ROWS) REPEATABLE (7))
            SELECT count(*) AS echoes,
                   quantile_cont(abs(e.theta - (cd.offset_ns - cs.offset_ns)), 0.5) AS median_ns,
                   quantile_cont(abs(e.theta - (cd.offset_ns - cs.offset_ns)), 0.99) AS p99_ns
            FROM e
            JOIN clock cs ON cs.host = e.src AND e.t1_ns >= cs.window_start_ns
                         AND e.t1_ns < cs.window_end_ns
            JOIN clock cd ON cd.host = e.dst AND e.t1_ns >= cd.window_start_ns
                         AND e.t1_ns < cd.window_end_ns
            WHERE isfinite(cs.offset_ns) AND isfinite(cd.offset_ns)""", [a, b, a, b])[0]  # fmt: skip
        # Each remediation active in the range, in its state now (``remediation_current``).
        remediations = _rows(con, """
            SELECT remediation_id, action, target, status, check_mode, state, actor, anomaly_id,
                   first_ns AS ts_ns
            FROM remediation_current WHERE first_ns < ? AND ts_ns >= ?
            ORDER BY first_ns, remediation_id""", [b, a])  # fmt: skip
        audit = _rows(con, """
            SELECT run_id, status, count(*) AS n FROM fleet_audit_latest
            GROUP BY ALL ORDER BY status""", [])  # fmt: skip
        audit_fails = _rows(con, """
            SELECT host, category, "check", reason FROM fleet_audit_latest
            WHERE status = 'fail' ORDER BY category, "check", host LIMIT 50""", [])  # fmt: skip
    except duckdb.Error as exc:
        raise ReportError(f"{store}: cannot be read ({str(exc).splitlines()[0]})") from None
    finally:
        con.close()

    evidence: dict[str, dict[str, Any]] = {}
    for x in anomalies:
        doc = json.loads(x.pop("detail") or "{}")
        ev = doc.get("evidence") or {}
        evidence[x["anomaly_id"]] = ev
        x["where"] = x["link"] or x["job_id"]
        x["raw_outages"] = list(ev.get("outages_s") or [])
        x["outages_ns"] = list(ev.get("outages_ns") or [])  # [down, up] of each, when stored
        x["folded_into"] = ev.get("folded_into", "")  # a link's, into its switch's anomaly
        x["outages_s"] = [o for o in x["raw_outages"] if o is not None]
        x["jobs"] = ev.get("job_verdicts")  # None: stored before the detector judged jobs
        # a fabric link routed around: what its jobs lost per outage (null: the outage)
        x["reroutes_s"] = list(ev.get("reroutes_s") or [])
        x["closed_by"] = doc.get("closed_by", "")
        end = x["closed_ns"] or b
        x["duration_s"] = round(max(0, min(end, b) - max(x["opened_ns"], a)) / 1e9, 1)
        exposed = [h for h, r in racks.items() if r in (ev.get("racks_exposed") or [])]
        if not exposed and ev.get("host"):
            exposed = [ev["host"]]
        if not exposed and ev.get("hosts_cut_off"):  # a leaf gone as a whole: its hosts
            exposed = [str(h) for h in ev["hosts_cut_off"]]
        x["hosts_exposed"] = len(exposed)
    # A link's flap window (10 min) carries its earlier outages into a later anomaly on the
    # same place: count each outage once. One whose times overlap an outage counted for the
    # same place is that outage (a spine's later anomaly carries the earlier one timed by
    # another of its links); without stored times, a list that extends an earlier one
    # replaces it. A link's anomaly folded into its spine's counts none: its outages are
    # the spine's, or an earlier anomaly's.
    seen: dict[str, list[dict[str, Any]]] = {}
    counted: dict[str, list[tuple[int, int]]] = {}
    for x in anomalies:
        if x["kind"] != "flapping_link" and not x["raw_outages"]:
            continue
        mine = seen.setdefault(x["where"], [])
        prev = mine[-1] if mine else None
        raw, spans = x["raw_outages"], x["outages_ns"]
        if x["folded_into"]:
            x["new_index"] = []
        elif spans and len(spans) == len(raw):
            done = counted.setdefault(x["where"], [])
            x["new_index"] = [i for i, (d, u) in enumerate(spans)
                              if not any(d < u2 and d2 < u for d2, u2 in done)]  # fmt: skip
            done += [(spans[i][0], spans[i][1]) for i in x["new_index"]]
        elif prev is not None and raw[: len(prev["raw_outages"])] == prev["raw_outages"]:
            x["new_index"] = list(range(len(prev["raw_outages"]), len(raw)))
        else:
            x["new_index"] = list(range(len(raw)))
        x["new_outages_s"] = [raw[i] for i in x["new_index"] if raw[i] is not None]
        mine.append(x)
    killed: list[dict[str, Any]] = []
    fatal_outages = 0
    for x in anomalies:
        x["gpu_hours"] = 0.0
        if "new_index" not in x:
            continue
        raw = x["raw_outages"]
        if x["jobs"] is None:  # an older anomaly: the hosts behind the link, defaults assumed
            new = x["new_outages_s"]
            x["gpu_hours"] = round(x["hosts_exposed"] * sum(new) * gpus_per_host / 3600, 3)
            fatal_outages += sum(1 for o in new if o > ASSUMED_LIMIT_S)
            continue
        gpu_s = 0.0
        fatal = set()
        rr = x["reroutes_s"]
        for j in x["jobs"]:
            gpus = int(j.get("hosts") or 0) * gpus_per_host
            verdicts = j.get("verdicts") or []
            for i in x["new_index"]:
                d = raw[i]
                v = verdicts[i] if i < len(verdicts) else None
                if d is None or v is None:
                    continue  # not running then, or shorter than one sample
                if i < len(rr) and rr[i] is not None:  # routed around: the reroute's stall
                    gpu_s += gpus * rr[i]
                elif v == "kills":
                    gpu_s += gpus * (d + lost_min * 60)
                    fatal.add(i)
                    killed.append({"job_id": j["job_id"], "link": x["where"], "outage_s": d,
                                   "survives_s": j.get("survives_s"), "gpus": gpus})  # fmt: skip
                else:  # survives (or may not: its limit unknown): it stalls for the outage
                    gpu_s += gpus * d
        if not x["jobs"]:  # judged, and no job crossed it: nothing at risk
            fatal = {i for i in x["new_index"] if (raw[i] or 0) > ASSUMED_LIMIT_S
                     and not (i < len(rr) and rr[i] is not None)}  # fmt: skip
        fatal_outages += len(fatal)
        x["gpu_hours"] = round(gpu_s / 3600, 3)
    by_class: dict[str, int] = {}
    for x in anomalies:
        by_class[x["kind"]] = by_class.get(x["kind"], 0) + 1
    pair_rows = [
        {"pair": f"{names.get(p['src'], p['src'])}→{names.get(p['dst'], p['dst'])}",
         "loss": round(p["loss"], 5), "p50_us": round(p["p50_us"] or 0, 2),
         "p99_us": round(p["p99_us"] or 0, 2), "sent": p["sent"],
         "corrected_p50_us": None if (c := corrected.get((p["src"], p["dst"]))) is None
         else round(c, 2),
         "affected_by": _explained(anomalies, evidence, pair_minutes.get((p["src"], p["dst"]), []),
                                   names.get(p["src"], ""), names.get(p["dst"], ""), racks,
                                   link_leaf)}
        for p in pairs[:10]
    ]  # fmt: skip
    heat: dict[tuple[str, str], list[float]] = {}
    for (src, dst), c in corrected.items():  # corrected, never raw: offsets differ per pair
        s, d = names.get(src, ""), names.get(dst, "")
        if s in racks and d in racks and c is not None:
            heat.setdefault((racks[s], racks[d]), []).append(c)
    outages = sorted((o for x in anomalies for o in x.get("new_outages_s", [])), reverse=True)
    return {
        "range": {"since": _when(a), "until": _when(b), "since_ns": a, "until_ns": b},
        "fleet": {
            "hosts": fleet["hosts"],
            "probes_sent": int(fleet["sent"]),
            "loss": round(1 - fleet["received"] / fleet["sent"], 6) if fleet["sent"] else None,
        },
        "anomalies": anomalies,
        "anomalies_by_class": by_class,
        "worst_links": worst_links(anomalies),
        "worst_pairs": pair_rows,
        "loss_by_minute": [(m["minute_ns"], m["loss"]) for m in minutes],
        "owd_series_us": series,  # pair -> [(minute_ns, p50, p99)]
        "owd_series_kind": series_kind,  # pair -> corrected | raw (no solver output)
        "rack_heatmap_us": {f"{k[0]}→{k[1]}": sorted(v)[len(v) // 2] for k, v in heat.items()},
        "flap_outages_s": outages,
        "flap_outages_over_kill": fatal_outages,
        "jobs_killed": killed,
        "assumed_limit_s": round(ASSUMED_LIMIT_S, 1),
        "clock": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in clock.items()},
        "rtt_half": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in rtt.items()},
        "remediations": remediations,
        "audit": {
            "run_id": audit[0]["run_id"] if audit else "",
            "counts": {r["status"]: r["n"] for r in audit},
            "failures": audit_fails,
        },
        "gpu_hours_at_risk": round(sum(x["gpu_hours"] for x in anomalies), 3),
        "gpus_per_host": gpus_per_host,
        "lost_min": lost_min,
        "assumption": (
            "GPU-hours at risk = for each link outage, each job seen crossing the link then: "
            f"its hosts × {gpus_per_host} GPUs per host × the outage if it survives it (it "
            f"stalls), × (the outage + {lost_min:g} min of work since its checkpoint and the "
            "restart, assumed) if the outage kills it (longer than 4.096 µs × "
            "2^NCCL_IB_TIMEOUT × (NCCL_IB_RETRY_CNT + 1) of its own settings or NCCL "
            "version's defaults); a leaf–spine link whose rack kept another spine: × the "
            "reroute (its flows lose only that burst; the link's time out of service is "
            "not the job's); no job seen, nothing at risk; anomalies stored before jobs "
            "were judged: the hosts behind the link × the outage."
        ),
    }


def _explained(
    anomalies: list[dict[str, Any]],
    evidence: dict[str, dict[str, Any]],
    lost: list[tuple[int, int]],
    src: str,
    dst: str,
    racks: dict[str, str],
    link_leaf: dict[str, str],
) -> list[str]:
    """The anomalies (``kind where``) that explain a pair's lost probes: their place lies
    on the pair's path (analytics/detect/attribution.py) and they were open in every
    minute it lost probes (from a minute before opening to a minute after closing). Empty
    when the pair lost nothing, or lost probes no anomaly explains."""
    if not lost:
        return []
    out = []
    for x in anomalies:
        place = {"anomaly_id": x["anomaly_id"], "link": x["link"],
                 "evidence": evidence.get(x["anomaly_id"], {})}  # fmt: skip
        pl = attribution.places([place], link_leaf)
        if not pl.explained_by(src, dst, racks.get(src, ""), racks.get(dst, "")):
            continue
        start = x["opened_ns"] - 60_000_000_000
        end = (x["closed_ns"] or 2**62) + 60_000_000_000
        out.append((x, [m for m, _ in lost if start <= m <= end]))
    minutes = {m for m, _ in lost}
    covered = {m for _, ms in out for m in ms}
    if covered != minutes:  # some of its loss no anomaly explains: it is not only a victim
        return []
    return [f"{x['kind']} {x['where']}" for x, ms in out if ms]


def worst_links(anomalies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Links by what they cost: outage seconds (each once), then anomalies, then time open."""
    links: dict[str, dict[str, Any]] = {}
    for x in anomalies:
        if not x["link"]:
            continue
        e = links.setdefault(x["link"], {"link": x["link"], "anomalies": 0, "kinds": set(),
                                         "outage_s": 0.0, "open_s": 0.0})  # fmt: skip
        e["anomalies"] += 1
        e["kinds"].add(x["kind"])
        e["outage_s"] += sum(x.get("new_outages_s", []))
        e["open_s"] += x["duration_s"]
    out = sorted(links.values(), key=lambda e: (-e["outage_s"], -e["anomalies"], -e["open_s"]))
    for e in out:
        e["kinds"] = sorted(e["kinds"])
        e["outage_s"] = round(e["outage_s"], 1)
        e["open_s"] = round(e["open_s"], 1)
    return out[:10]


# ---- plots ---------------------------------------------------------------------------
def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def owd_plot(ax: Any, facts: dict[str, Any]) -> None:
    """The worst pairs' one-way delay per minute: p50 lines with a p50–p99 band each, on
    a log axis, so one 100-ms minute stays a spike instead of flattening every other
    line to the floor (corrected delays; raw where the solver has not run, said so)."""
    import matplotlib.dates as mdates

    a, b = facts["range"]["since_ns"], facts["range"]["until_ns"]

    def t(ns: int) -> float:
        return float(mdates.date2num(dt.datetime.fromtimestamp(ns / 1e9, dt.UTC)))

    # p50 lines with a p50–p99 band per pair, on a log axis: one 100-ms minute stays a
    # spike instead of flattening every other line to the floor.
    kinds = facts.get("owd_series_kind", {})
    values = []
    for name, pts in facts["owd_series_us"].items():
        pts = [p for p in pts if p[1] is not None]
        if pts:
            x = [t(p[0]) for p in pts]
            lo = [p[1] for p in pts]
            hi = [max(p[1], p[2] if p[2] is not None else p[1]) for p in pts]
            label = name + (" (raw)" if kinds.get(name) == "raw" else "")
            (line,) = ax.plot(x, lo, lw=1.2, marker="o", ms=2, label=label)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
            values += lo + hi
    if values and min(values) > 0:
        ax.set_yscale("log")
    elif values:  # raw delays carry clock offsets and can be negative
        ax.set_yscale("symlog", linthresh=10.0)
    ax.set_xlim(t(a), t(b))
    ax.xaxis_date()
    raw = any(k == "raw" for k in kinds.values())
    ax.set_ylabel("one-way delay (µs, " + ("corrected; raw where marked" if raw else "corrected")
                  + ", log)")  # fmt: skip
    ax.set_title("worst pairs: one-way delay per minute, p50 (line) to p99 (band)")


def plots(facts: dict[str, Any]) -> dict[str, str]:
    """name -> SVG text: the timeline, the worst pairs' delay, the rack heatmap."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "clockmesh"
    import matplotlib.pyplot as plt

    out = {}
    a, b = facts["range"]["since_ns"], facts["range"]["until_ns"]

    import matplotlib.dates as mdates

    def t(ns: int) -> float:  # matplotlib's date number (days), shown as UTC times
        return float(mdates.date2num(dt.datetime.fromtimestamp(ns / 1e9, dt.UTC)))

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True,
                                   gridspec_kw={"height_ratios": [1, 2]})  # fmt: skip
    lm = facts["loss_by_minute"]
    if lm:
        ax1.plot([t(m) for m, _ in lm], [100 * x for _, x in lm], color="#1f77b4", lw=1,
                 marker="o", ms=2)  # fmt: skip
    ax1.set_ylabel("probe loss %")
    ax1.set_title("loss and anomalies")
    rows = facts["anomalies"]
    for i, x in enumerate(rows):
        start, end = max(x["opened_ns"], a), (x["closed_ns"] or b)
        ax2.barh(i, (t(end) - t(start)), left=t(start), height=0.6,
                 color=KIND_COLOURS.get(x["kind"], "#333"))  # fmt: skip
    ax2.set_yticks(range(len(rows)), [f"{x['kind']} {x['where']}" for x in rows], fontsize=7)
    ax2.invert_yaxis()
    ax2.set_xlim(t(a), t(b))
    ax2.xaxis_date()
    if not rows:
        ax2.text(0.5, 0.5, "no anomalies in this range", transform=ax2.transAxes, ha="center")
    fig.autofmt_xdate()
    out["timeline"] = _svg(fig)

    fig, ax = plt.subplots(figsize=(10, 3.5))
    owd_plot(ax, facts)
    if facts["owd_series_us"]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no probe data in this range", transform=ax.transAxes, ha="center")
    fig.autofmt_xdate()
    out["owd"] = _svg(fig)

    heat = facts["rack_heatmap_us"]
    racks = sorted({k.split("→")[0] for k in heat} | {k.split("→")[1] for k in heat})
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    if racks:
        import numpy as np

        grid = np.full((len(racks), len(racks)), np.nan)
        for k, v in heat.items():
            s, d = k.split("→")
            grid[racks.index(s), racks.index(d)] = v
        im = ax.imshow(grid, cmap="viridis")
        ax.set_xticks(range(len(racks)), racks, rotation=45, fontsize=8)
        ax.set_yticks(range(len(racks)), racks, fontsize=8)
        ax.set_xlabel("to rack")
        ax.set_ylabel("from rack")
        fig.colorbar(im, ax=ax, label="median one-way delay p50 (µs, corrected)")
    else:
        ax.text(0.5, 0.5, "no rack data (give --topology; corrected delays need the clock "
                "solver)", transform=ax.transAxes, ha="center", wrap=True)  # fmt: skip
    ax.set_title("rack × rack delay")
    out["heatmap"] = _svg(fig)
    return out


# ---- rendering ------------------------------------------------------------------------
def markdown(facts: dict[str, Any], svg_names: dict[str, str]) -> str:
    f = facts
    loss = "—" if f["fleet"]["loss"] is None else f"{100 * f['fleet']['loss']:.3f} %"
    lines = [
        f"# clockmesh fleet report, {f['range']['since']} – {f['range']['until']} UTC",
        "",
        f"- hosts probing: {f['fleet']['hosts']}, probes: {f['fleet']['probes_sent']:,}, "
        f"loss: {loss}",
        f"- anomalies: {len(f['anomalies'])} "
        + (
            f"({', '.join(f'{k} {n}' for k, n in sorted(f['anomalies_by_class'].items()))})"
            if f["anomalies"]
            else "(none in this range)"
        ),
        f"- GPU-hours at risk: {f['gpu_hours_at_risk']} ({f['assumption']})",
        "",
        "## Anomalies",
        "",
    ]
    if f["anomalies"]:
        lines += ["| class | where | opened | closed | in range s | outages s | summary |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for x in f["anomalies"]:
            closed = _when(x["closed_ns"]) + (f" by {x['closed_by']}" if x["closed_by"] else "")
            outs = ", ".join(f"{o:.1f}" for o in x["outages_s"]) or "—"
            lines.append(f"| {x['kind']} | {x['where']} | {_when(x['opened_ns'])} | {closed} | "
                         f"{x['duration_s']} | {outs} | {x['summary']} |")  # fmt: skip
    else:
        lines.append("No anomaly was open in this range.")
    lines += [
        "",
        f"![timeline]({svg_names['timeline']})",
        "",
        "## Flap outages",
        "",
        f"{len(f['flap_outages_s'])} outage(s); {f['flap_outages_over_kill']} fatal to a "
        "job crossing the link (each job against its own limit, 4.096 µs × "
        "2^NCCL_IB_TIMEOUT × (NCCL_IB_RETRY_CNT + 1); with no job seen crossing it, the "
        f"{f['assumed_limit_s']} s of {ASSUMED_WORDS}; a leaf–spine link whose rack kept "
        "another spine judged on its reroute, not its time out of service): "
        + (", ".join(f"{o:.1f} s" for o in f["flap_outages_s"][:30]) or "none"),
        "",
    ]
    lines += [
        f"- kills job {k['job_id']}: outage {k['outage_s']:.1f} s on {k['link']} > its "
        f"{k['survives_s']} s ({k['gpus']} GPUs)"
        for k in f["jobs_killed"][:30]
    ]
    lines += ["", "## Worst links", ""]  # fmt: skip
    if f["worst_links"]:
        lines += ["| link | anomalies | classes | outage s | open s |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += [f"| {e['link']} | {e['anomalies']} | {', '.join(e['kinds'])} | "
                  f"{e['outage_s']} | {e['open_s']} |" for e in f["worst_links"]]  # fmt: skip
    else:
        lines.append("No link had an anomaly in this range.")
    lines += ["", "## Worst pairs", ""]
    if f["worst_pairs"]:
        lines += ["| pair | loss | corrected p50 µs | raw p50 µs | raw p99 µs | probes | "
                  "its loss |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += [f"| {p['pair']} | {100 * p['loss']:.3f} % | "
                  f"{'—' if p['corrected_p50_us'] is None else p['corrected_p50_us']} | "
                  f"{p['p50_us']} | {p['p99_us']} | {p['sent']:,} | "
                  + ("affected by " + ", ".join(p["affected_by"]) if p["affected_by"]
                     else "unexplained" if p["loss"] > 0 else "—") + " |"
                  for p in f["worst_pairs"]]  # fmt: skip
    else:
        lines.append("No probe data in this range.")
    c = f["clock"]
    lines += ["", f"![one-way delay]({svg_names['owd']})", "",
              f"![rack heatmap]({svg_names['heatmap']})", "", "## Clock sync", "",
              f"{c.get('estimates') or 0} host estimates for {c.get('hosts') or 0} hosts; solver "
              f"uncertainty median {c.get('median_ns') or '—'} ns, p99 {c.get('p99_ns') or '—'} ns. "
              + (f"Disagreement with RTT/2 over {r['echoes']:,} echoes: median "
                 f"{r['median_ns']} ns, p99 {r['p99_ns']} ns (RTT/2 assumes symmetric paths; "
                 "ECMP often returns an echo on another path)."
                 if (r := f["rtt_half"]).get("echoes") else "No echoes in this range to "
                 "compare the solver with RTT/2."),
              "", "## Remediations", ""]  # fmt: skip
    if f["remediations"]:
        lines += ["| id | action | target | status | by | anomaly |",
                  "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        lines += [f"| {r['remediation_id']} | {r['action']} | {r['target']} | "
                  f"{r['state']} | {r['actor']} | "
                  f"{r['anomaly_id'] or '—'} |" for r in f["remediations"]]  # fmt: skip
    else:
        lines.append("None in this range.")
    au = f["audit"]
    lines += ["", "## Latest fleet audit", ""]
    if au["run_id"]:
        lines.append(f"{au['run_id']}: " + ", ".join(f"{n} {s}" for s, n in au["counts"].items()))
        lines += [f"- {x['host']} {x['category']}/{x['check']}: {x['reason']}"
                  for x in au["failures"]]  # fmt: skip
    else:
        lines.append("No fleet audit in the store (ansible-playbook playbooks/audit.yml).")
    return "\n".join(lines) + "\n"


def to_html(md_text: str, svgs: dict[str, str], svg_names: dict[str, str]) -> str:
    """The Markdown as HTML, with the plots inline (no network, no external files)."""
    body: list[str] = []
    table: list[str] = []

    def flush() -> None:
        if table:
            rows = [r.strip("|").split(" | ") for r in table if not r.startswith("| ---")]
            body.append("<table><thead><tr>" + "".join(f"<th>{html.escape(c.strip())}</th>"
                        for c in rows[0]) + "</tr></thead><tbody>")  # fmt: skip
            for r in rows[1:]:
                body.append("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in r)
                            + "</tr>")  # fmt: skip
            body.append("</tbody></table>")
            table.clear()

    by_file = {v: k for k, v in svg_names.items()}
    for line in md_text.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("!["):
            name = line[line.index("(") + 1 : -1]
            body.append(
                f'<figure class="plot" id="plot-{by_file[name]}">{svgs[by_file[name]]}</figure>'
            )
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    flush()
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
             "padding:3px 6px;text-align:left}th{background:#f3f3f3}figure{margin:1em 0}"
             "figure svg{max-width:100%;height:auto}")  # fmt: skip
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>clockmesh fleet report</title><style>{style}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")  # fmt: skip


def write(facts: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write report.html, report.md (+ its SVGs) and report.json into ``out`` atomically:
    a new directory renamed over the old one, so a failed run leaves the last report."""
    svgs = plots(facts)
    names = {k: f"report-{k}.svg" for k in svgs}
    md_text = markdown(facts, names)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for k, text in svgs.items():
            (tmp / names[k]).write_text(text, encoding="utf-8")
        (tmp / "report.md").write_text(md_text, encoding="utf-8")
        (tmp / "report.html").write_text(to_html(md_text, svgs, names), encoding="utf-8")
        (tmp / "report.json").write_text(json.dumps(facts, indent=2, default=str), encoding="utf-8")
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            if old.exists():
                _rmtree(old)
            out.rename(old)
            tmp.rename(out)
            _rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        if tmp.exists():
            _rmtree(tmp)
        raise
    return {"html": out / "report.html", "md": out / "report.md", "json": out / "report.json"}


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)
