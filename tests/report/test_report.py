"""`clockmesh report` on stores a test can make: no store, an empty range, anomalies."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner

from analytics.report.cli import report
from analytics.store import layout
from analytics.store.store_writer import StoreWriter

S = 1_000_000_000
T0 = 1_795_000_000 * S


def _store(
    tmp_path: Path, anomalies: bool, jobs: list[dict] | None = None, extra: dict | None = None
) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    (store / "store.json").write_text(json.dumps({"schema": layout.STORE_SCHEMA}))
    w = StoreWriter(store)
    if anomalies:
        ev = {"outages_s": [2.0, 5.0], "racks_exposed": ["leaf1"], "flaps": 2}
        if jobs is not None:  # the detector judged the outages against these jobs
            ev["job_verdicts"] = jobs
        ev.update(extra or {})
        row = {"opened_ns": T0 + 60 * S, "closed_ns": T0 + 200 * S, "anomaly_id": "flapping-1",
               "kind": "flapping_link", "score": 0.9, "src": 0, "dst": 0, "link": "leaf1-spine2",
               "job_id": "", "detail": json.dumps({"summary": "leaf1-spine2 flapped 2 times",
                                                   "evidence": ev}), "updated_ns": T0 + 200 * S}  # fmt: skip
        w.write_partitioned("anomalies", pa.table({k: [v] for k, v in row.items()},
                            schema=layout.TABLES["anomalies"].schema), "a.parquet")  # fmt: skip
    minutes = [T0 + m * 60 * S for m in range(5)]
    pm = {"minute_ns": minutes, "src": [1] * 5, "dst": [2] * 5, "paths": [8] * 5,
          "sent": [600] * 5, "received": [600, 600, 570, 600, 600], "delay_min_ns": [5000] * 5,
          "delay_p50_ns": [5500.0] * 5, "delay_p90_ns": [6000.0] * 5, "delay_p99_ns": [9000.0] * 5,
          "delay_max_ns": [20000] * 5, "delay_mean_ns": [5600.0] * 5}  # fmt: skip
    w.write_partitioned("probe_minute", pa.table(pm, schema=layout.TABLES["probe_minute"].schema),
                        "p.parquet")  # fmt: skip
    names = {"ts_ns": [T0, T0], "host_id": [1, 2], "host": ["h1-1", "h2-1"]}
    w.write_partitioned("host_names", pa.table(names, schema=layout.TABLES["host_names"].schema),
                        "n.parquet")  # fmt: skip
    return store


def _topology(tmp_path: Path) -> Path:
    p = tmp_path / "topology.json"
    p.write_text(json.dumps({"hosts": [{"name": "h1-1", "rack": "leaf1"},
                                       {"name": "h1-2", "rack": "leaf1"},
                                       {"name": "h2-1", "rack": "leaf2"}]}))  # fmt: skip
    return p


def _run(tmp_path: Path, store: Path, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(report, ["--store", str(store), "--out", str(tmp_path / "out"),
                                       "--topology", str(_topology(tmp_path)), *args])  # fmt: skip


def test_report_lists_the_anomaly_plots_and_gpu_hours(tmp_path: Path) -> None:
    store = _store(tmp_path, anomalies=True)
    res = _run(tmp_path, store, "--since", "2026-11-18T00:00:00", "--until", "2026-11-19T00:00:00")
    assert res.exit_code == 0, res.output
    facts = json.loads((tmp_path / "out" / "report.json").read_text())
    (a,) = facts["anomalies"]
    assert (a["kind"], a["where"], a["outages_s"]) == ("flapping_link", "leaf1-spine2", [2.0, 5.0])
    # leaf1's 2 hosts x 7 s of outages x 8 GPUs = 112 GPU-seconds
    assert facts["gpu_hours_at_risk"] == round(2 * 7 * 8 / 3600, 3)
    # stored before jobs were judged: against current NCCL defaults (34.4 s), none fatal
    assert facts["flap_outages_over_kill"] == 0 and facts["fleet"]["hosts"] == 1
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("<svg") == 3 and "http://" not in html.split("<svg")[0]
    assert "leaf1-spine2" in html and "GPU-hours at risk" in html
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| flapping_link | leaf1-spine2 |" in md and "![timeline](report-timeline.svg)" in md
    assert facts["worst_links"] == [{"link": "leaf1-spine2", "anomalies": 1,
                                     "kinds": ["flapping_link"], "outage_s": 7.0,
                                     "open_s": 140.0}]  # fmt: skip
    assert "| leaf1-spine2 | 1 | flapping_link | 7.0 | 140.0 |" in md


def test_gpu_hours_follow_the_judgement_of_each_outage_per_job(tmp_path: Path) -> None:
    """One job with NCCL_IB_TIMEOUT=14 (0.54 s) killed by both outages, one on the defaults
    (34.4 s) that survives them: the first loses each outage plus --lost-min of work, the
    second stalls for the outages; both on 2 hosts x 8 GPUs."""
    jobs = [
        {"job_id": "tight", "survives_s": 0.537, "hosts": 2, "verdicts": ["kills", "kills"],
         "survives_from": "NCCL_IB_TIMEOUT 14 (environ)"},
        {"job_id": "loose", "survives_s": 34.36, "hosts": 2, "verdicts": ["survives", "survives"],
         "survives_from": "defaults"},
        {"job_id": "late", "survives_s": 0.537, "hosts": 2, "verdicts": [None, "kills"],
         "survives_from": "started after the first outage"},
    ]  # fmt: skip
    store = _store(tmp_path, anomalies=True, jobs=jobs)
    res = _run(tmp_path, store, "--since", "2026-11-18T00:00:00", "--until",
               "2026-11-19T00:00:00", "--lost-min", "10")  # fmt: skip
    assert res.exit_code == 0, res.output
    facts = json.loads((tmp_path / "out" / "report.json").read_text())
    tight = 16 * (2.0 + 600 + 5.0 + 600)
    loose = 16 * (2.0 + 5.0)
    late = 16 * (5.0 + 600)
    assert facts["gpu_hours_at_risk"] == round((tight + loose + late) / 3600, 3)
    assert facts["flap_outages_over_kill"] == 2
    assert sorted((k["job_id"], k["outage_s"]) for k in facts["jobs_killed"]) == [
        ("late", 5.0), ("tight", 2.0), ("tight", 5.0)]  # fmt: skip
    md = (tmp_path / "out" / "report.md").read_text()
    assert "kills job tight: outage 2.0 s on leaf1-spine2 > its 0.537 s (16 GPUs)" in md
    assert "10 min of work since its checkpoint" in md
    # judged, but no job crossed the link: nothing at risk
    (tmp_path / "none").mkdir()
    store2 = _store(tmp_path / "none", anomalies=True, jobs=[])
    res = _run(tmp_path / "none", store2, "--since", "2026-11-18T00:00:00", "--until",
               "2026-11-19T00:00:00")  # fmt: skip
    assert res.exit_code == 0, res.output
    facts = json.loads((tmp_path / "none" / "out" / "report.json").read_text())
    assert facts["gpu_hours_at_risk"] == 0 and facts["jobs_killed"] == []


def test_gpu_hours_of_a_fabric_link_routed_around_count_the_reroute(tmp_path: Path) -> None:
    """leaf1-spine2 out of service 2.0 s with leaf1 keeping spine1 (paths rerouted within
    0.2 s), then 5.0 s with every path of leaf1 lost: both jobs stall 0.2 s for the first;
    the second kills the tight job (the outage plus --lost-min) and stalls the loose one."""
    jobs = [
        {"job_id": "tight", "survives_s": 0.537, "hosts": 2, "verdicts": ["survives", "kills"],
         "survives_from": "NCCL_IB_TIMEOUT 14 (environ)"},
        {"job_id": "loose", "survives_s": 34.36, "hosts": 2, "verdicts": ["survives", "survives"],
         "survives_from": "defaults"},
    ]  # fmt: skip
    extra = {"reroutes_s": [0.2, None], "every_path_lost": [False, True]}
    store = _store(tmp_path, anomalies=True, jobs=jobs, extra=extra)
    res = _run(tmp_path, store, "--since", "2026-11-18T00:00:00", "--until",
               "2026-11-19T00:00:00", "--lost-min", "10")  # fmt: skip
    assert res.exit_code == 0, res.output
    facts = json.loads((tmp_path / "out" / "report.json").read_text())
    tight = 16 * (0.2 + 5.0 + 600)
    loose = 16 * (0.2 + 5.0)
    assert facts["gpu_hours_at_risk"] == round((tight + loose) / 3600, 3)
    assert facts["flap_outages_over_kill"] == 1
    assert [(k["job_id"], k["outage_s"]) for k in facts["jobs_killed"]] == [("tight", 5.0)]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "judged on its reroute, not its time out of service" in md


def test_empty_range_and_no_anomalies_give_a_clear_report(tmp_path: Path) -> None:
    store = _store(tmp_path, anomalies=False)
    res = _run(tmp_path, store, "--since", "2020-01-01T00:00:00", "--until", "2020-01-02T00:00:00")
    assert res.exit_code == 0, res.output
    md = (tmp_path / "out" / "report.md").read_text()
    assert "No anomaly was open in this range." in md and "No probe data in this range." in md
    assert "no anomalies" in res.output or "0 anomalies" in res.output


def test_missing_store_and_bad_range_are_one_line_and_keep_the_last_report(tmp_path: Path) -> None:
    store = _store(tmp_path, anomalies=True)
    assert _run(tmp_path, store).exit_code == 0
    before = (tmp_path / "out" / "report.json").read_text()
    res = _run(tmp_path, tmp_path / "nope")
    assert res.exit_code == 1 and "nope: not a clockmesh store" in res.output
    assert res.output.strip().count("\n") == 0
    res = _run(tmp_path, store, "--since", "yesterday")
    assert res.exit_code == 2 and "expected a duration ago" in res.output
    assert (tmp_path / "out" / "report.json").read_text() == before


def _owd(store: Path, rows: list[tuple[int, int, int, float]]) -> None:
    """The clock solver's corrected one-way delays: (ts_ns, src, dst, owd_ns)."""
    t = {"ts_ns": [r[0] for r in rows], "src": [r[1] for r in rows], "dst": [r[2] for r in rows],
         "sport": [40001] * len(rows), "seq": list(range(len(rows))),
         "owd_ns": [r[3] for r in rows], "uncertainty_ns": [40.0] * len(rows)}  # fmt: skip
    StoreWriter(store).write_partitioned("owd", pa.table(t, schema=layout.TABLES["owd"].schema),
                                         "o.parquet")  # fmt: skip


RANGE = ("--since", "2026-11-18T00:00:00", "--until", "2026-11-19T00:00:00")


def test_the_heatmap_shows_corrected_delay_and_a_pairs_loss_is_attributed(tmp_path: Path) -> None:
    """Raw delay is 5.5 µs plus whatever the two clocks disagree by; the heatmap shows the
    solver's corrected delay (4.0 µs here). The pair's only lost probes (minute 2) fall
    while the anomaly on its rack's uplink was open: affected by it, not unexplained."""
    store = _store(tmp_path, anomalies=True)
    _owd(store, [(T0 + m * 60 * S + k * S, 1, 2, 4000.0) for m in range(5) for k in range(10)])
    assert _run(tmp_path, store, *RANGE).exit_code == 0
    facts = json.loads((tmp_path / "out" / "report.json").read_text())
    assert facts["rack_heatmap_us"] == {"leaf1→leaf2": 4.0}
    (pair,) = facts["worst_pairs"]
    assert pair["corrected_p50_us"] == 4.0 and pair["p50_us"] == 5.5
    assert pair["affected_by"] == ["flapping_link leaf1-spine2"]
    assert facts["owd_series_kind"] == {"h1-1→h2-1": "corrected"}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| h1-1→h2-1 | 1.000 % | 4.0 | 5.5 | 9.0 | 3,000 | affected by flapping_link" in md
    # without the anomaly the same loss is the pair's own
    (tmp_path / "b").mkdir()
    store2 = _store(tmp_path / "b", anomalies=False)
    assert _run(tmp_path, store2, *RANGE).exit_code == 0
    facts = json.loads((tmp_path / "out" / "report.json").read_text())
    assert facts["worst_pairs"][0]["affected_by"] == []
    assert facts["rack_heatmap_us"] == {}  # no solver output: no corrected delay to show
    assert "| 3,000 | unexplained |" in (tmp_path / "out" / "report.md").read_text()


def test_one_slow_minute_does_not_flatten_the_other_pairs(tmp_path: Path) -> None:
    """Per-pair delay on a log axis with p50–p99 bands: a 100-ms minute on one pair leaves
    the 4-µs and 8-µs lines apart, not both squashed onto the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analytics.report.report import owd_plot

    minutes = [T0 + m * 60 * S for m in range(10)]
    facts = {"range": {"since_ns": T0, "until_ns": T0 + 600 * S},
             "owd_series_us": {"a→b": [(m, 4.0, 6.0) for m in minutes],
                               "c→d": [(m, 100_000.0 if i == 5 else 5.0, 120_000.0 if i == 5
                                        else 8.0) for i, m in enumerate(minutes)]},
             "owd_series_kind": {"a→b": "corrected", "c→d": "corrected"}}  # fmt: skip
    fig, ax = plt.subplots()
    owd_plot(ax, facts)
    assert ax.get_yscale() == "log"
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    import math

    # the 4-µs and 8-µs pairs' p50 and p99 are told apart by > 5 % of the plot's height
    # (on a linear axis: 4 / 120,000 of it, one line on the floor)
    apart = (math.log10(8.0) - math.log10(4.0)) / (math.log10(hi) - math.log10(lo))
    assert apart > 0.05
    assert len(ax.collections) == 2  # a p50–p99 band per pair
    plt.close(fig)


def test_a_spines_outages_are_counted_once_across_its_anomalies(tmp_path: Path) -> None:
    """spine2 went as a whole twice in 10 min. Its first anomaly holds the first outage
    (timed by one of its links); a link named on its own folded into the second, which
    carries the first outage again, timed by another link (15.1 s, not 15.5): the report
    counts 15.5 + 15.6 s for spine2 and nothing for the folded link."""
    store = _store(tmp_path, anomalies=False)
    w = StoreWriter(store)

    def anomaly(aid: str, link: str, opened_s: int, ev: dict) -> None:
        row = {"opened_ns": T0 + opened_s * S, "closed_ns": T0 + (opened_s + 80) * S,
               "anomaly_id": aid, "kind": "flapping_link", "score": 0.9, "src": 0, "dst": 0,
               "link": link, "job_id": "", "updated_ns": T0 + (opened_s + 80) * S,
               "detail": json.dumps({"summary": f"{link} flapped", "evidence": ev})}  # fmt: skip
        w.write_partitioned("anomalies", pa.table({k: [v] for k, v in row.items()},
                            schema=layout.TABLES["anomalies"].schema), f"{aid}.parquet")  # fmt: skip

    def span(a: float, b: float) -> list[int]:
        return [T0 + int(a * S), T0 + int(b * S)]

    racks = {"racks_exposed": ["leaf1", "leaf2"]}
    anomaly("f-1", "spine2", 100, {**racks, "outages_s": [15.5], "outages_ns": [span(100, 115.5)]})
    anomaly("f-2", "leaf1-spine2", 299, {**racks, "outages_s": [15.1], "folded_into": "f-3",
                                         "outages_ns": [span(100.2, 115.3)]})  # fmt: skip
    anomaly("f-3", "spine2", 300, {**racks, "outages_s": [15.1, 15.6],
                                   "outages_ns": [span(100.3, 115.4), span(300, 315.6)]})  # fmt: skip
    res = _run(tmp_path, store, "--since", "2026-11-18T00:00:00", "--until",
               "2026-11-19T00:00:00")  # fmt: skip
    assert res.exit_code == 0, res.output
    facts = json.loads((tmp_path / "out" / "report.json").read_text())
    links = {e["link"]: e["outage_s"] for e in facts["worst_links"]}
    assert links == {"spine2": 31.1, "leaf1-spine2": 0.0}
