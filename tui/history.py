"""What the drill-downs read from the store: read-only, through the catalog's views.

Each function takes an open read-only connection and ``now_s`` (the TUI's clock, so a
window is the same for every query of one screen) and returns plain rows; no Textual here.
Delays are µs; a minute series is (minutes before now, value) so a chart's x axis reads
"minutes ago" whatever the time zone of the terminal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb

# Counters that tell a link's state, shown first and always (the rest when they moved).
LINK_STATE = ("operstate", "carrier", "carrier_changes", "carrier_down_count", "carrier_up_count",
              "link_downed")  # fmt: skip
# Names of counters that count trouble (errors, drops, retransmissions, congestion marks).
TROUBLE = ("err", "drop", "discard", "downed", "seq", "retry", "timeout", "cnp", "ecn", "fcs")


@dataclass
class Series:
    """One line of a chart: x = minutes before now (negative), y = value."""

    label: str
    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)


def _since(now_s: float, minutes: float) -> int:
    """The window's start as the views' naive-UTC TIMESTAMP, in µs since the epoch."""
    return int((now_s - minutes * 60) * 1e6)


def _series(rows: list[tuple[Any, ...]], now_s: float, labels: list[str]) -> list[Series]:
    """Rows of (epoch µs of the minute, value, value, ...) as one Series per value column."""
    out = [Series(label) for label in labels]
    for row in rows:
        ago = (row[0] / 1e6 - now_s) / 60
        for s, v in zip(out, row[1:], strict=True):
            if v is not None:
                s.x.append(round(ago, 2))
                s.y.append(float(v))
    return out


def host_delay(con: duckdb.DuckDBPyConnection, host: str, now_s: float,
               minutes: float = 60) -> list[Series]:  # fmt: skip
    """Per minute, over the pairs the host sends or receives: the worst corrected p50
    one-way delay and the loss % (a host's raw delays differ by its peers' clock offsets:
    raw is compared per pair, in :func:`pair_delay`)."""
    rows = con.execute(
        """WITH raw AS (
               SELECT minute, 1 - sum(received) / sum(sent) AS loss FROM owd_minute
               WHERE (src_host = $h OR dst_host = $h) AND minute >= make_timestamp($since)
               GROUP BY minute
           ), cor AS (
               SELECT minute, max(owd_p50_us) AS cor_us FROM owd_corrected_minute
               WHERE (src_host = $h OR dst_host = $h) AND minute >= make_timestamp($since)
               GROUP BY minute
           )
           SELECT epoch_us(coalesce(raw.minute, cor.minute)) AS m, cor.cor_us, raw.loss * 100
           FROM raw FULL JOIN cor ON cor.minute = raw.minute ORDER BY m""",
        {"h": host, "since": _since(now_s, minutes)},
    ).fetchall()
    return _series(rows, now_s, ["corrected p50, worst pair", "loss %"])


def pair_delay(con: duckdb.DuckDBPyConnection, src: str, dst: str, now_s: float,
               minutes: float = 60) -> list[Series]:  # fmt: skip
    """Per minute, one direction of a pair: corrected p50, raw p50 and p99, loss %."""
    rows = con.execute(
        """WITH raw AS (
               SELECT minute, owd_raw_p50_us, owd_raw_p99_us, loss FROM owd_minute
               WHERE src_host = $s AND dst_host = $d AND minute >= make_timestamp($since)
           ), cor AS (
               SELECT minute, owd_p50_us FROM owd_corrected_minute
               WHERE src_host = $s AND dst_host = $d AND minute >= make_timestamp($since)
           )
           SELECT epoch_us(coalesce(raw.minute, cor.minute)) AS m, cor.owd_p50_us,
                  raw.owd_raw_p50_us, raw.owd_raw_p99_us, raw.loss * 100
           FROM raw FULL JOIN cor ON cor.minute = raw.minute ORDER BY m""",
        {"s": src, "d": dst, "since": _since(now_s, minutes)},
    ).fetchall()
    return _series(rows, now_s, ["corrected p50", "raw p50", "raw p99", "loss %"])


@dataclass
class PathRow:
    sport: int
    via: str  # the fabric link (or the spine's address) the 5-tuple crossed last
    sent: int
    loss: float
    p50_us: float | None  # raw (this pair's two clocks: the same offset on every path)
    p99_us: float | None
    corrected_p50_us: float | None


def pair_paths(con: duckdb.DuckDBPyConnection, src: str, dst: str, now_s: float,
               hops: dict[str, str] | None = None, minutes: float = 10) -> list[PathRow]:  # fmt: skip
    """The spread across ECMP paths of one direction of a pair over the last ``minutes``:
    per UDP source port (one 5-tuple, one path), probes sent, loss, raw p50 and worst
    p99, corrected p50, and the spine link it crossed at its last trace (``hops``: spine address →
    fabric link name, from the topology)."""
    since_ns = int((now_s - minutes * 60) * 1e9)
    rows = con.execute(
        """WITH p AS (
               SELECT sport, sum(sent) AS sent, sum(received) AS received,
                      median(owd_raw_p50_us) AS p50, max(owd_raw_p99_us) AS p99
               FROM path_owd_minute
               WHERE src_host = $s AND dst_host = $d AND minute >= make_timestamp($since)
               GROUP BY sport
           ), ids AS (
               SELECT (SELECT host_id FROM hosts WHERE host = $s) AS sid,
                      (SELECT host_id FROM hosts WHERE host = $d) AS did
           ), h AS (
               SELECT sport, arg_max(hop, ts_ns) AS hop FROM path_hop, ids
               WHERE src = sid AND dst = did AND ttl = 2 AND ts_ns >= $since_ns
               GROUP BY sport
           ), c AS (
               SELECT sport, median(owd_ns) / 1000 AS p50 FROM owd, ids
               WHERE src = sid AND dst = did AND ts_ns >= $since_ns
               GROUP BY sport
           )
           SELECT coalesce(p.sport, h.sport) AS port, h.hop, coalesce(p.sent, 0),
                  coalesce(p.received, 0), p.p50, p.p99, c.p50
           FROM p FULL JOIN h ON h.sport = p.sport
           LEFT JOIN c ON c.sport = coalesce(p.sport, h.sport)
           ORDER BY port""",
        {
            "s": src,
            "d": dst,
            "since": _since(now_s, minutes),
            "since_ns": since_ns,
        },
    ).fetchall()
    hops = hops or {}
    return [
        PathRow(
            int(sport),
            "" if hop is None else hops.get(hop, hop),
            int(sent),
            (1 - received / sent) if sent else 0.0,
            p50,
            p99,
            corrected,
        )
        for sport, hop, sent, received, p50, p99, corrected in rows
    ]


@dataclass
class CounterRow:
    device: str
    name: str
    value: int
    delta: int  # change over the window
    age_s: float  # since its last sample


def host_counters(con: duckdb.DuckDBPyConnection, host: str, now_s: float,
                  minutes: float = 10, device: str | None = None) -> list[CounterRow]:  # fmt: skip
    """The host's NIC and RDMA counters sampled in the last ``minutes``: the link-state
    ones always, the others when they moved; link state first, then trouble, then the rest."""
    rows = con.execute(
        """SELECT device, name, arg_max(value, ts_ns), sum(delta), max(ts_ns)
           FROM counter
           WHERE host IN (SELECT host_id FROM hosts WHERE host = $h) AND ts_ns >= $since_ns
             AND ($dev IS NULL OR device = $dev)
           GROUP BY device, name""",
        {"h": host, "since_ns": int((now_s - minutes * 60) * 1e9), "dev": device},
    ).fetchall()
    out = [
        CounterRow(dev, name, int(value), int(delta), max(0.0, now_s - ts / 1e9))
        for dev, name, value, delta, ts in rows
        if name in LINK_STATE or delta
    ]

    def rank(c: CounterRow) -> tuple[int, str, str]:
        trouble = any(t in c.name for t in TROUBLE)
        return (0 if c.name in LINK_STATE else 1 if trouble else 2, c.device, c.name)

    return sorted(out, key=rank)


@dataclass
class LinkView:
    link: str
    kind: str  # "fabric", "access" or "" (not in the topology)
    ends: str
    anomalies: list[tuple[Any, ...]]  # (id, kind, opened, closed or None, summary, outages)
    host: str = ""  # access link: the host end and its interface
    interface: str = ""
    counters: list[CounterRow] = field(default_factory=list)
    flaps: list[tuple[Any, ...]] = field(
        default_factory=list
    )  # (down_at, outage_s, seen_by), newest first
    paths_now: int = 0  # fabric link: 5-tuples whose last trace crossed it
    delay: list[Series] = field(default_factory=list)


def link_view(con: duckdb.DuckDBPyConnection, link: str, topology: dict[str, Any] | None,
              now_s: float, minutes: float = 60) -> LinkView:  # fmt: skip
    """A link: the anomalies that named it; an access link's host counters and outages;
    a fabric link's paths crossing it and their delay against the other paths'."""
    lk = next((x for x in (topology or {}).get("links", []) if x.get("name") == link), None)
    hosts = {h["name"] for h in (topology or {}).get("hosts", [])}
    view = LinkView(link, "" if lk is None else str(lk.get("kind", "")), "", [])
    if lk is not None:
        a, b = lk["a"], lk["b"]
        view.ends = f"{a['node']}:{a.get('interface', '?')} — {b['node']}:{b.get('interface', '?')}"
        end = a if a["node"] in hosts else b if b["node"] in hosts else None
        if end is not None:
            view.kind = view.kind or "access"
            view.host, view.interface = end["node"], str(end.get("interface", ""))
    since = _since(now_s, minutes)
    for row in con.execute(
        """SELECT anomaly_id, kind, epoch_us(opened), epoch_us(closed), summary, detail
           FROM anomaly_current
           WHERE link = $l OR list_contains(string_split(link, ' or '), $l)
           ORDER BY opened DESC LIMIT 20""",
        {"l": link},
    ).fetchall():
        outages = (json.loads(row[5] or "{}").get("evidence") or {}).get("outages_s") or []
        view.anomalies.append((*row[:5], outages))
    if view.host:
        view.counters = host_counters(con, view.host, now_s, minutes, view.interface)
        view.flaps = con.execute(
            """SELECT epoch_us(down_at), outage_s, seen_by FROM flaps
               WHERE host_name = $h AND device = $d AND down_at >= make_timestamp($since)
               ORDER BY down_at DESC""",
            {"h": view.host, "d": view.interface, "since": since},
        ).fetchall()
    elif lk is not None and view.kind == "fabric":
        hop = str(lk["b"].get("address", ""))
        since_ns = int((now_s - minutes * 60) * 1e9)
        (view.paths_now,) = con.execute(
            """SELECT count(*) FROM (
                   SELECT src, dst, sport, arg_max(hop, ts_ns) AS hop FROM path_hop
                   WHERE ttl = 2 AND ts_ns >= $since_ns GROUP BY ALL
               ) WHERE hop = $hop""",
            {"hop": hop, "since_ns": int((now_s - 60) * 1e9)},
        ).fetchone() or (0,)
        # Corrected delays: paths of different pairs mix clocks, raw ones cannot be pooled.
        rows = con.execute(
            """WITH via AS (
                   SELECT DISTINCT src, dst, sport FROM path_hop
                   WHERE ttl = 2 AND hop = $hop AND ts_ns >= $since_ns
               )
               SELECT (o.ts_ns // 60000000000) * 60000000 AS m,
                      median(o.owd_ns) FILTER (WHERE v.sport IS NOT NULL) / 1000,
                      median(o.owd_ns) FILTER (WHERE v.sport IS NULL) / 1000
               FROM owd o
               LEFT JOIN via v ON v.src = o.src AND v.dst = o.dst AND v.sport = o.sport
               WHERE o.ts_ns >= $since_ns
               GROUP BY m ORDER BY m""",
            {"hop": hop, "since_ns": since_ns},
        ).fetchall()
        view.delay = _series(rows, now_s, ["corrected p50, paths via this link",
                                           "corrected p50, other paths"])  # fmt: skip
    return view


@dataclass
class JobView:
    job: str
    hosts: list[tuple[Any, ...]]  # (host, device, gid_index, gid_type, source, roce_v1)
    flows: list[tuple[Any, ...]]  # (src, dst, messages, in-band p50, probe p50, excess)
    delay: list[Series] = field(default_factory=list)


def job_view(con: duckdb.DuckDBPyConnection, job: str, now_s: float,
             minutes: float = 30) -> JobView:  # fmt: skip
    """A job: each host's RDMA device, GID index and its type (the latest the collectors
    reported); its flows' in-band delay (the workload's own send/receive timestamps)
    against the probes' (out-of-band) delay between the same hosts, per pair and per
    minute."""
    hosts = con.execute(
        """SELECT host_name, device, gid_index, gid_type, source, roce_v1 FROM (
               SELECT *, row_number() OVER (PARTITION BY host ORDER BY seen DESC) AS rn
               FROM job_roce WHERE job_id = $j)
           WHERE rn = 1 ORDER BY host_name""",
        {"j": job},
    ).fetchall()
    since = _since(now_s, minutes)
    flows = con.execute(
        """SELECT src_host, dst_host, sum(messages), median(inband_p50_us),
                  median(probe_p50_us), median(inband_minus_probe_p50_us)
           FROM job_delay WHERE job_id = $j AND minute >= make_timestamp($since)
           GROUP BY ALL ORDER BY 6 DESC NULLS LAST, 1, 2""",
        {"j": job, "since": since},
    ).fetchall()
    # Raw delays of different pairs carry different clock offsets; their difference on
    # the same pair does not: the chart is the excess, median over the job's flows.
    rows = con.execute(
        """SELECT epoch_us(minute), median(inband_minus_probe_p50_us)
           FROM job_delay WHERE job_id = $j AND minute >= make_timestamp($since)
           GROUP BY minute ORDER BY minute""",
        {"j": job, "since": since},
    ).fetchall()
    series = _series(rows, now_s, ["in-band − probes p50, median over its flows"])
    return JobView(job, hosts, flows, series)


def remediations(con: duckdb.DuckDBPyConnection, anomaly_id: str = "") -> list[dict[str, Any]]:
    """Each remediation in its state now, oldest first (the catalog's
    ``remediation_current``: the rows ``clockmesh remediate history`` and the report show);
    one anomaly's, or every one."""
    cur = con.execute(
        """SELECT remediation_id, anomaly_id, action, target, check_mode, status, state, actor,
                  ts_ns
           FROM remediation_current WHERE $a = '' OR anomaly_id = $a
           ORDER BY ts_ns, remediation_id""",
        {"a": anomaly_id},
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
