"""Detector rules on hand-made telemetry: flaps from counters, RoCE v1 jobs, the book."""

from __future__ import annotations

import collections
import json

import numpy as np

from analytics.detect.anomalies import AnomalyBook, Observation
from analytics.detect.flaps import LinkFlaps
from analytics.detect.roce import JobLimit, RoceJobs
from analytics.detect.survival import Survival
from collector import records
from collector.job_nccl import qp_limit_s

S = 1_000_000_000
H1 = records.host_id("h1-1")
H2 = records.host_id("h2-1")


def _counters(samples: list[tuple[int, int, int]], host: int = H1) -> np.ndarray:
    """(second, operstate, carrier_down_count delta) per sample of bk0."""
    rows = []
    total = 0
    for sec, oper, down in samples:
        total += down
        rows.append((sec * S, host, b"bk0", 0, 0, (0,) * 5, b"operstate", oper, 0))
        rows.append((sec * S, host, b"bk0", 0, 0, (0,) * 5, b"carrier_down_count", total, down))
        rows.append((sec * S, host, b"bk0", 0, 0, (0,) * 5, b"rx_bytes", 10 * sec, 10))
    return np.array(rows, records.COUNTER)


def _flaps() -> LinkFlaps:
    return LinkFlaps(600, {(H1, "bk0"): "h1-1-leaf1"}, {H1: "h1-1"})


def test_a_port_going_down_is_a_flapping_link_at_once_named_after_its_link() -> None:
    flaps = _flaps()
    flaps.feed(_counters([(1, 6, 0), (2, 6, 0), (3, 2, 1)]))
    (obs,) = flaps.observations(3 * S)
    assert obs.kind == "flapping_link" and obs.link == "h1-1-leaf1"
    assert obs.evidence["down_now"] is True and obs.evidence["flaps"] == 1
    assert "h1-1-leaf1 flapped 1 time in 10 min" in obs.summary and "down now" in obs.summary


def test_outage_durations_and_sub_sample_flaps_are_counted() -> None:
    flaps = _flaps()
    # down at 3 s, up at 8 s (5 s: kills a collective); a sub-second flap at 12 s
    samples = [(1, 6, 0), (2, 6, 0), (3, 2, 1), (4, 2, 0), (8, 6, 0), (12, 6, 1), (13, 6, 0)]
    flaps.feed(_counters(samples))
    (obs,) = flaps.observations(13 * S)
    assert obs.evidence["flaps"] == 2
    assert obs.evidence["outages_s"] == [5.0, None]
    # no job crosses it: judged against current NCCL defaults, and the summary says so
    assert obs.evidence["outages_over_kill_s"] == 0 and obs.evidence["job_verdicts"] == []
    assert "outages up to 5.0 s" in obs.summary
    assert (
        "none longer than the 34.4 s a job survives on NCCL >= 2.23 defaults: "
        "NCCL_IB_TIMEOUT 20, NCCL_IB_RETRY_CNT 7 (assumed: no job seen crossing it)" in obs.summary
    ), obs.summary
    # once up and quiet the rule stops observing it (the book then closes it)
    assert flaps.observations(30 * S) == []


def test_each_outage_is_judged_against_the_jobs_crossing_the_link() -> None:
    """Two jobs on h1-1, one with NCCL_IB_TIMEOUT=14 (0.54 s), one on 2.23's defaults
    (34.4 s): a 2-s outage of h1-1's link kills the first, the second survives it; a job
    elsewhere is not judged, and one that started after the outage is not either."""
    flaps = _flaps()
    flaps.feed(_counters([(1, 6, 0), (2, 6, 0), (3, 2, 1), (5, 6, 0)]))
    (obs,) = flaps.observations(5 * S)
    tight, loose = qp_limit_s(14, 7), qp_limit_s(20, 7)
    jobs = {
        "tight": JobLimit("tight", tight, "NCCL_IB_TIMEOUT 14 (environ)", {H1, H2}, 0, 5 * S),
        "loose": JobLimit("loose", loose, "defaults", {H1, H2}, 0, 5 * S),
        "elsewhere": JobLimit("elsewhere", qp_limit_s(14, 7), "", {H2}, 0, 5 * S),
        "later": JobLimit("later", qp_limit_s(14, 7), "", {H1}, 30 * S, 40 * S),
    }
    surv = Survival({H1: "leaf1", H2: "leaf2"}, {H1: "h1-1", H2: "h2-1"})
    surv.judge([obs], jobs, 5 * S)
    assert "kills job tight: outage 2.0 s > its 0.54 s" in obs.summary, obs.summary
    assert "job loose survives (its 34.4 s)" in obs.summary, obs.summary
    assert "elsewhere" not in obs.summary and "later" not in obs.summary
    by_job = {j["job_id"]: j for j in obs.evidence["job_verdicts"]}
    assert by_job["tight"]["verdicts"] == ["kills"] and by_job["loose"]["verdicts"] == ["survives"]
    assert by_job["later"]["verdicts"] == [None] and "elsewhere" not in by_job
    assert obs.evidence["outages_over_kill_s"] == 1
    assert obs.evidence["collective_kill_s"] == round(tight, 3)
    # the link flaps again after the tight job died: its verdict on the first outage stays
    flaps.feed(_counters([(20, 2, 1), (21, 6, 0)]))
    (obs,) = flaps.observations(21 * S)
    del jobs["tight"]
    jobs["loose"].last_ns = 21 * S  # still running
    surv.judge([obs], jobs, 21 * S)
    by_job = {j["job_id"]: j for j in obs.evidence["job_verdicts"]}
    assert by_job["tight"]["verdicts"] == ["kills", None], by_job
    assert by_job["loose"]["verdicts"] == ["survives", "survives"]


def test_a_job_of_unknown_nccl_version_is_judged_within_what_any_release_survives() -> None:
    """No version, no NCCL_IB_TIMEOUT: its limit lies between 0.54 s (timeout 14) and
    34.4 s (20): shorter outages survive, longer ones kill, the rest may kill."""
    roce = RoceJobs({H1: "h1-1"})
    roce.feed_gids(_gids(H1))
    roce.feed_jobs(_jobs(H1, [(b"dunno", -1)]))
    roce.feed_nccl(_nccl(H1, b"dunno", "", 0, -1, timeout=-1))
    jl = roce.limits(3 * S)["dunno"]
    assert jl.limit_s is None and jl.bounds == (qp_limit_s(14, 7), qp_limit_s(20, 7))
    for secs, verdict, words in ((0.3, "survives", "job dunno survives"),
                                 (2, "may kill", "job dunno may not survive: outage 2.0 s"),
                                 (40, "kills", "kills job dunno: outage 40.0 s > its 0.54 s "
                                               "to 34.4 s (NCCL version unknown)")):  # fmt: skip
        flaps = _flaps()
        down, up = 10 * S, 10 * S + int(secs * S)
        flaps.feed(_counters([(1, 6, 0), (2, 6, 0)]))
        rows = _counters([(10, 2, 1)])
        up_rows = _counters([(11, 6, 0)])
        up_rows["ts_ns"] = up
        rows["ts_ns"] = down
        flaps.feed(np.concatenate([rows, up_rows]))
        (obs,) = flaps.observations(up)
        jl.first_ns, jl.last_ns = 0, up
        Survival({}, {H1: "h1-1"}).judge([obs], {"dunno": jl}, up)
        (j,) = obs.evidence["job_verdicts"]
        assert j["verdicts"] == [verdict], (secs, j)
        assert words in obs.summary, obs.summary


def test_a_fabric_link_is_crossed_by_jobs_between_its_rack_and_another() -> None:
    surv = Survival({H1: "leaf1", H2: "leaf2", 7: "leaf1"}, {})
    jobs = {
        "across": JobLimit("across", 1.0, "", {H1, H2}, 0),
        "in-rack": JobLimit("in-rack", 1.0, "", {H1, 7}, 0),
        "other": JobLimit("other", 1.0, "", {H2, 8}, 0),
    }
    got = surv.crossing({"racks_exposed": ["leaf1"]}, jobs)
    assert [j.job for j in got] == ["across"]


def test_a_carrier_loss_counted_before_operstate_shows_it_is_one_outage() -> None:
    flaps = _flaps()
    # sysfs read race: the counter already counted the loss, operstate still read "up"
    flaps.feed(_counters([(1, 6, 0), (2, 6, 1), (3, 2, 0), (5, 6, 0), (6, 6, 0)]))
    (obs,) = flaps.observations(6 * S)
    assert obs.evidence["flaps"] == 1 and obs.evidence["outages_s"] == [3.0]


def test_unknown_port_is_named_host_and_device_and_order_does_not_matter() -> None:
    flaps = LinkFlaps(600, {}, {H2: "h2-1"})
    rows = _counters([(1, 6, 0), (2, 7, 1), (3, 6, 0)], host=H2)
    flaps.feed(rows[::-1].copy())
    (obs,) = flaps.observations(3 * S)
    assert obs.link == "h2-1:bk0" and obs.evidence["outages_s"] == [1.0]


def _gids(host: int, ts: int = 1) -> np.ndarray:
    types = {0: b"IB/RoCE v1", 1: b"RoCE v2", 2: b"IB/RoCE v1", 3: b"RoCE v2"}
    return np.array(
        [
            (ts * S, host, b"mlx5_0", 1, i, (0,) * 4, b"fe80::1", t, b"bk0", b"RoCE v2")
            for i, t in types.items()
        ],
        records.RDMA_CONFIG,
    )


def _jobs(host: int, jobs: list[tuple[bytes, int]], ts: int = 2) -> np.ndarray:
    return np.array(
        [(ts * S, host, j, 100, idx, b"environ", b"mlx5_0") for j, idx in jobs],
        records.JOB_RDMA,
    )


def test_a_job_on_a_roce_v1_index_is_found_and_a_v2_job_is_not() -> None:
    roce = RoceJobs({H1: "h1-1", H2: "h2-1"})
    roce.feed_gids(np.concatenate([_gids(H1), _gids(H2)]))
    roce.feed_jobs(_jobs(H1, [(b"train-a", 2), (b"train-b", 3)]))
    roce.feed_jobs(_jobs(H2, [(b"train-a", 3), (b"train-b", 3)]))
    (obs,) = roce.observations(3 * S)
    assert obs.kind == "roce_v1_job" and obs.job_id == "train-a"
    assert obs.evidence["hosts"] == ["h1-1"] and obs.evidence["job_hosts"] == 2
    assert "on 1 of its 2 hosts" in obs.summary


def _nccl(
    host: int,
    job: bytes,
    version: str,
    rule: int,
    index: int,
    ts: int = 2,
    timeout: int = 20,
    timeout_from: int = 0,
    roce: int = 0,
    roce_from: int = 0,
) -> np.ndarray:
    row = np.zeros(1, records.JOB_NCCL)
    row["ts_ns"], row["host"], row["job_id"], row["pid"] = ts * S, host, job, 100
    row["library"], row["version"], row["version_from"] = b"nccl" if version else b"", version, 1
    row["gid_rule"], row["gid_index"], row["device"] = rule, index, b"mlx5_0"
    row["roce_version"], row["roce_version_from"], row["addr_family"] = roce, roce_from, 4
    row["ib_timeout"], row["ib_timeout_from"], row["ib_retry_cnt"] = timeout, timeout_from, 7
    return row


def test_a_job_that_sets_no_index_is_judged_by_its_nccl_version() -> None:
    roce = RoceJobs({H1: "h1-1"})
    roce.feed_gids(_gids(H1))
    rows = _jobs(H1, [(b"old", -1), (b"new", -1), (b"v1num", -1), (b"dunno", -1)])
    roce.feed_jobs(rows)
    roce.feed_nccl(np.concatenate([
        _nccl(H1, b"old", "2.18.3", 3, 0, timeout=18),  # < 2.21: index 0 (RoCE v1 here)
        _nccl(H1, b"new", "2.23.4", 2, 3, roce=2),  # auto selection picked the v2 GID
        _nccl(H1, b"v1num", "2.23.4", 2, 2, roce=1, roce_from=1),  # ROCE_VERSION_NUM=1
        _nccl(H1, b"dunno", "", 0, -1, timeout=-1),
    ]))  # fmt: skip
    got = {o.job_id: o for o in roce.observations(3 * S)}
    assert set(got) == {"old", "v1num"}  # neither the v2 job nor the unknown one
    assert "NCCL 2.18.3" in got["old"].summary and got["old"].evidence["gid_indices"] == [0]
    assert got["old"].evidence["index_source"] == [
        "not set; NCCL 2.18.3 (before 2.21) uses its default index 0"
    ]
    assert "NCCL_IB_ROCE_VERSION_NUM 1 (environ)" in got["v1num"].evidence["index_source"][0]
    live = {j["job_id"]: j["hosts"][0] for j in roce.live(3 * S)}
    assert live["new"]["gid_type"] == "RoCE v2" and live["new"]["gid_index"] == 3
    assert live["new"]["index_source"].startswith(
        "not set; NCCL 2.23.4 selects index 3 by default (NCCL_IB_ROCE_VERSION_NUM 2 (default)"
    )
    assert live["dunno"]["gid_type"] == (
        "unknown (NCCL version unknown: no libnccl.so (or UCX) in its /proc/PID/maps and no "
        "NCCL_VERSION in its environment)"
    )
    assert live["old"]["survives_s"] == round(4.096e-6 * 2**18 * 8, 3)  # 8.59 s
    assert live["new"]["survives_from"] == (
        "NCCL_IB_TIMEOUT 20 (NCCL 2.23.4 default), NCCL_IB_RETRY_CNT 7 (NCCL 2.23.4 default)"
    )
    assert live["dunno"]["survives_s"] is None


def test_a_job_reported_by_an_older_collector_with_no_index_is_unknown_not_v1() -> None:
    roce = RoceJobs({H1: "h1-1"})
    roce.feed_gids(_gids(H1))
    roce.feed_jobs(_jobs(H1, [(b"no-index", -1)]))
    assert roce.observations(3 * S) == []
    (job,) = roce.live(3 * S)
    assert job["hosts"][0]["gid_type"] == (
        "unknown (the collector did not report the job's NCCL version)"
    )


def test_a_job_that_sets_no_index_takes_the_hosts_nccl_conf() -> None:
    roce = RoceJobs({H1: "h1-1"})
    roce.feed_gids(_gids(H1))
    rows = _jobs(H1, [(b"", 3), (b"no-index", -1)])
    rows["source"][0] = b"nccl.conf"  # the collector's host-level row
    roce.feed_jobs(rows)
    assert roce.observations(3 * S) == []  # nccl.conf's index 3 is RoCE v2
    rows = _jobs(H1, [(b"", 2), (b"no-index", -1)], ts=4)
    rows["source"][0] = b"nccl.conf"
    roce.feed_jobs(rows)
    (obs,) = roce.observations(5 * S)
    assert obs.evidence["gid_indices"] == [2]
    assert obs.evidence["index_source"] == ["not set by the job; the host's nccl.conf sets 2"]
    # nccl.conf gone, and no NCCL version reported: unknown, not assumed
    roce.feed_jobs(_jobs(H1, [(b"no-index", -1)], ts=6))
    assert roce.observations(7 * S) == []


def test_a_finished_job_and_a_missing_gid_entry_raise_nothing(caplog) -> None:  # type: ignore[no-untyped-def]
    roce = RoceJobs({H1: "h1-1"})
    roce.feed_gids(_gids(H1))
    roce.feed_jobs(_jobs(H1, [(b"train-a", 2)]))
    assert len(roce.observations(3 * S)) == 1
    roce.feed_jobs(_jobs(H1, [(b"", -1)], ts=5))  # the collector's "no jobs" snapshot
    assert roce.observations(6 * S) == []
    roce.feed_jobs(_jobs(H1, [(b"odd", 9)], ts=7))  # no GID at index 9
    assert roce.observations(8 * S) == []
    assert "no GID entry at index 9 in h1-1's GID table" in caplog.text


def test_book_opens_updates_and_closes_after_the_condition_cleared() -> None:
    book = AnomalyBook(clear_s=5)
    obs = Observation("flapping_link", "h1-1-leaf1", 0.5, "flapped once", link="h1-1-leaf1")
    a = book.observe(obs, 1 * S)
    assert book.observe(obs, 2 * S) is a  # same condition: same anomaly, no new row
    first = book.take_changes()
    assert first is not None and first.num_rows == 1
    assert book.take_changes() is None
    obs2 = Observation("flapping_link", "h1-1-leaf1", 0.75, "flapped twice", link="h1-1-leaf1")
    book.observe(obs2, 3 * S)
    assert book.expire(7 * S) == []  # seen 4 s ago: not cleared yet
    assert book.expire(8 * S) == [a] and not book.open
    rows = book.take_changes().to_pylist()  # type: ignore[union-attr]
    assert [r["closed_ns"] for r in rows] == [8 * S]  # the update and the close: one row
    assert json.loads(rows[0]["detail"])["summary"] == "flapped twice"
    assert rows[0]["anomaly_id"] == a.anomaly_id and rows[0]["updated_ns"] == 8 * S
    again = book.observe(obs, 9 * S)  # it flaps again later: a new anomaly
    assert again.anomaly_id != a.anomaly_id


def test_a_standing_anomaly_whose_counters_grow_every_pass_is_not_stored_every_pass() -> None:
    """A silent drop standing for a minute wrote a row every pass (~240 a minute on the
    demo lab): its lost-probe counter grows each time. A change of what is said is stored
    at once; of counters alone, every EVIDENCE_ROW_S; the close stores the latest."""
    from analytics.detect.anomalies import EVIDENCE_ROW_S

    book = AnomalyBook(clear_s=5)
    ms = S // 1000
    rows: list[dict] = []

    def obs(t_ms: int, summary: str = "spine2 towards h1-2 silently drops traffic") -> None:
        o = Observation("silent_drop", "spine2 → h1-2", 0.9, summary,
                        evidence={"lost_probes": t_ms})  # fmt: skip
        book.observe(o, t_ms * ms)
        changes = book.take_changes()
        rows.extend(changes.to_pylist() if changes is not None else [])

    for t in range(0, 60_000, 250):  # four passes a second for a minute
        obs(t)
    assert book.open[("silent_drop", "spine2 → h1-2")].evidence == {"lost_probes": 59_750}
    every = int(EVIDENCE_ROW_S * 1000)
    assert len(rows) == 60_000 // every, len(rows)  # not 240
    assert [r["updated_ns"] // ms for r in rows] == list(range(0, 60_000, every))
    obs(60_000, "spine2 silently drops traffic")  # said otherwise: stored at once
    assert rows[-1]["updated_ns"] == 60_000 * ms
    assert json.loads(rows[-1]["detail"])["summary"] == "spine2 silently drops traffic"
    obs(60_250, "spine2 silently drops traffic")  # a counter: held back ...
    assert rows[-1]["updated_ns"] == 60_000 * ms
    assert len(book.expire(65_250 * ms)) == 1  # ... until it closes, with the latest evidence
    (last,) = book.take_changes().to_pylist()  # type: ignore[union-attr]
    assert last["closed_ns"] == 65_250 * ms
    assert json.loads(last["detail"])["evidence"] == {"lost_probes": 60_250}


def _fabric(racks: int) -> tuple[list, dict[int, str], dict[str, list[int]]]:
    from analytics.detect.paths import FabricLink

    links, host_rack, hosts = [], {}, {}
    for leaf in range(1, racks + 1):
        for spine in (1, 2):
            k = (leaf - 1) * 2 + (spine - 1)
            addr = f"198.18.128.{2 * k + 1}"
            links.append(
                FabricLink(f"leaf{leaf}-spine{spine}", f"leaf{leaf}", f"spine{spine}", addr)
            )
        hosts[f"leaf{leaf}"] = [records.host_id(f"h{leaf}-{n}") for n in (1, 2)]
        for h in hosts[f"leaf{leaf}"]:
            host_rack[h] = f"leaf{leaf}"
    return links, host_rack, hosts


def _round(
    links: list, hosts: dict[str, list[int]], sec: float, down: set[str], every: bool = False
) -> np.ndarray:
    """One trace round of every host: 4 ports to one host of every other rack (``every``:
    to each of its hosts), each port on the spine it hashes to, or on the other one when
    that path is gone."""
    spine_of = {(lk.leaf, lk.spine): lk for lk in links}
    rows = []
    for rack, members in hosts.items():
        for src in members:
            for other, dsts in hosts.items():
                if other == rack:
                    continue
                for port in range(4):
                    want = f"spine{1 + port % 2}"
                    ok = [
                        s
                        for s in (want, "spine2" if want == "spine1" else "spine1")
                        if spine_of[(rack, s)].name not in down
                        and spine_of[(other, s)].name not in down
                    ]
                    if not ok:
                        continue
                    hop = spine_of[(rack, ok[0])].hop.encode()
                    for dst in dsts if every else dsts[:1]:
                        ts = int(sec * S) + len(rows)
                        rows.append((ts, src, dst, 40000 + port, 2, (0,) * 5, hop, 50_000))
    return np.array(rows, records.PATH_HOP)


def test_tomography_names_the_one_fabric_link_that_explains_the_missing_paths() -> None:
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    for sec in (0, 2):
        paths.feed(_round(links, hosts, sec, set()))
    assert paths.observations(3 * S) == []
    paths.feed(_round(links, hosts, 4, {"leaf1-spine2"}))
    (obs,) = paths.observations(5 * S)
    assert obs.link == "leaf1-spine2" and obs.evidence["down_now"] is True
    assert obs.evidence["confidence"] == 1.0 and obs.evidence["racks_exposed"] == ["leaf1"]
    paths.feed(_round(links, hosts, 7, set()))
    (obs,) = paths.observations(8 * S)
    # Down after the round at 2 s and by the one at 4 s; back after 4 s and by 7 s: the
    # middles of those bounds, each known to half its width.
    assert obs.evidence["down_now"] is False and obs.evidence["outages_s"] == [2.5]
    assert obs.evidence["outage_error_s"] == 2.5
    assert "leaf1-spine2 flapped 1 time" in obs.summary


def test_with_two_racks_the_two_ends_cannot_be_told_apart_and_both_are_named() -> None:
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(2)
    paths = FabricPaths(links, host_rack)
    paths.feed(_round(links, hosts, 0, set()))
    paths.feed(_round(links, hosts, 2, {"leaf2-spine2"}))
    (obs,) = paths.observations(3 * S)
    assert obs.evidence["candidates"] == ["leaf1-spine2", "leaf2-spine2"]
    assert obs.evidence["confidence"] == 0.5
    assert obs.summary.startswith("leaf1-spine2 or leaf2-spine2 flapped 1 time")
    paths.feed(_round(links, hosts, 5, set()))
    (obs,) = paths.observations(6 * S)  # back: still one anomaly for the pair, not two
    assert obs.key == "leaf1-spine2 or leaf2-spine2" and obs.evidence["down_now"] is False


SPINE2 = [f"leaf{n}-spine2" for n in range(1, 5)]


def test_a_spine_that_loses_every_path_is_named_once_as_the_spine() -> None:
    """Every link of spine2 out at once, four racks: no trace tells which links (a rack's
    paths through spine2 all end at another rack whose link is out too), but every path
    through spine2 went — one anomaly naming spine2, not three links and an "or"."""
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(4)
    paths = FabricPaths(links, host_rack)
    for sec in (0, 2):
        paths.feed(_round(links, hosts, sec, set()))
    paths.feed(_round(links, hosts, 4, set(SPINE2)))
    (obs,) = paths.observations(5 * S)
    assert obs.link == "spine2" and obs.evidence["switch"] == "spine2"
    assert obs.evidence["candidates"] == SPINE2 and obs.evidence["confidence"] == 1.0
    assert obs.evidence["racks_exposed"] == ["leaf1", "leaf2", "leaf3", "leaf4"]
    assert obs.summary.startswith(
        "spine2 (every path through it) flapped 1 time in 10 min; down now"
    )
    assert "all but at most one of its 4 links" in obs.evidence["switch_note"]
    paths.feed(_round(links, hosts, 7, set()))
    (back,) = paths.observations(8 * S)
    assert back.key == obs.key and back.link == "spine2" and not back.evidence["down_now"]
    assert back.evidence["outages_s"] == [2.5]


def test_a_spine_going_after_one_of_its_links_flapped_alone_counts_only_its_own_outage() -> None:
    """leaf2-spine2 flapped on its own; 10 s later every link of spine2 goes. The spine's
    anomaly is its own and says 1 time (the link's earlier outage is the link's); the
    link's anomaly, which last said it was back, is left as it is to clear."""
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(4)
    paths = FabricPaths(links, host_rack)
    for sec in (0, 2):
        paths.feed(_round(links, hosts, sec, set()))
    paths.feed(_round(links, hosts, 4, {"leaf2-spine2"}))
    (link,) = paths.observations(5 * S)
    paths.feed(_round(links, hosts, 6, set()))
    (link,) = paths.observations(7 * S)
    assert link.link == "leaf2-spine2" and not link.evidence["down_now"]
    paths.feed(_round(links, hosts, 14, set()))
    paths.observations(15 * S)  # no longer recent: not observed, its anomaly clears
    paths.feed(_round(links, hosts, 16, set(SPINE2)))
    (obs,) = paths.observations(17 * S)
    assert obs.link == "spine2" and obs.key == "spine2" and obs.evidence["flaps"] == 1
    assert obs.summary.startswith(
        "spine2 (every path through it) flapped 1 time in 10 min; down now"
    )
    assert paths.take_folded() == []
    paths.feed(_round(links, hosts, 19, set()))
    (obs,) = paths.observations(20 * S)
    assert obs.key == "spine2" and obs.evidence["outages_s"] == [2.5]


def test_one_link_of_each_of_two_spines_is_not_a_spine() -> None:
    """Two links out, of different spines (four racks): each is named, no spine is."""
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(4)
    paths = FabricPaths(links, host_rack)
    for sec in (0, 2):
        paths.feed(_round(links, hosts, sec, set()))
    paths.feed(_round(links, hosts, 4, {"leaf1-spine2", "leaf3-spine1"}))
    got = sorted(o.link for o in paths.observations(5 * S))
    assert got == ["leaf1-spine2", "leaf3-spine1"]


def test_links_named_before_their_spine_is_seen_whole_fold_into_one_spine_anomaly() -> None:
    """The first traces after spine2 dies come from a few racks: leaf4-spine2, then
    leaf3-spine2 are named on their own; once every path through spine2 is seen gone, one
    anomaly names spine2 and the other closes saying so (nothing left "down now"). As the
    spine's links come back one by one it stays the spine's anomaly, and it ends once."""
    from analytics.detect.detect_runner import DetectRunner
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(4)
    runner = DetectRunner(None)
    runner.paths = paths = FabricPaths(links, host_rack)
    book = runner.book

    def observe(sec: float) -> list[Observation]:
        got = paths.observations(int(sec * S))
        for o in got:
            book.observe(o, int(sec * S))
        runner._fold(int(sec * S))
        return got

    for sec in (0, 2):
        paths.feed(_round(links, hosts, sec, set()))
    dead = _round(links, hosts, 4, set(SPINE2))
    for src in ("leaf1", "leaf2", "leaf3"):
        paths.feed(_only(dead, host_rack, src, "leaf4"))
    assert [o.link for o in observe(4.5)] == ["leaf4-spine2"]
    for src in ("leaf1", "leaf2"):
        paths.feed(_only(dead, host_rack, src, "leaf3"))
    assert sorted(o.link for o in observe(4.6)) == ["leaf3-spine2", "leaf4-spine2"]
    (first,) = [a for a in book.open.values() if a.link == "leaf3-spine2"]
    paths.feed(dead)
    (obs,) = observe(4.7)
    assert obs.link == "spine2"
    (spine,) = book.open.values()  # the one for leaf3-spine2 closed, naming the spine's
    assert first.closed_ns and first.evidence["folded_into"] == spine.anomaly_id
    assert "went as a whole" in first.summary and not first.evidence["down_now"]
    for sec, down in ((6, SPINE2), (8, SPINE2[1:]), (9, SPINE2[2:]), (10, SPINE2[3:])):
        paths.feed(_round(links, hosts, sec, set(down)))
        (obs,) = observe(sec + 0.5)
        assert obs.link == "spine2" and obs.evidence["down_now"]
    paths.feed(_round(links, hosts, 11, set()))
    (obs,) = observe(11.5)
    assert obs.link == "spine2" and not obs.evidence["down_now"] and obs.evidence["flaps"] == 1
    assert list(book.open.values()) == [spine]


def _only(rows: np.ndarray, host_rack: dict[int, str], src: str, dst: str) -> np.ndarray:
    """The traces from rack src to rack dst only (the others' not shipped yet)."""
    of = np.array([host_rack[h] for h in rows["src"].tolist()])
    to = np.array([host_rack[h] for h in rows["dst"].tolist()])
    return rows[(of == src) & (to == dst)]


def test_a_twin_named_with_a_flapping_link_folds_into_its_anomaly_and_nothing_stays_down() -> None:
    """A link that flapped before flaps again; the first traces of the second outage come
    from its twin's rack only, so both are named: that is the same anomaly (its key), the
    twin is dropped once the other racks' traces single the link out, and once every path
    crosses it again nothing is down and one anomaly remains."""
    from analytics.detect.anomalies import AnomalyBook
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    book = AnomalyBook(clear_s=60)
    ids: set[str] = set()

    def observe(sec: float) -> list[Observation]:
        got = paths.observations(int(sec * S))
        ids.update(book.observe(o, int(sec * S)).anomaly_id for o in got)
        return got

    for sec in (0, 1):
        paths.feed(_round(links, hosts, sec, set()))
    paths.feed(_round(links, hosts, 2, {"leaf3-spine2"}))
    (first,) = observe(2.5)
    assert first.link == "leaf3-spine2" and first.evidence["down_now"]
    paths.feed(_round(links, hosts, 3, set()))
    (obs,) = observe(3.5)
    assert obs.key == first.key and not obs.evidence["down_now"]
    paths.feed(_round(links, hosts, 10, set()))
    paths.feed(_only(_round(links, hosts, 11, {"leaf3-spine2"}), host_rack, "leaf1", "leaf3"))
    (obs,) = observe(11.5)  # rack 1's traces to rack 3 alone: its link to spine2 or rack 3's
    assert obs.evidence["candidates"] == ["leaf1-spine2", "leaf3-spine2"], obs.evidence
    assert obs.key == first.key and obs.evidence["down_now"]
    paths.feed(_round(links, hosts, 11.2, {"leaf3-spine2"}))
    (obs,) = observe(12)
    assert obs.link == "leaf3-spine2" and obs.key == first.key and obs.evidence["flaps"] == 2
    assert paths.state["leaf1-spine2"].outages == collections.deque()
    paths.feed(_round(links, hosts, 13, set()))
    (obs,) = observe(13.5)
    assert not obs.evidence["down_now"] and len(obs.evidence["outages_s"]) == 2
    assert all(not st.down_since for st in paths.state.values())
    for sec in range(14, 30):
        paths.feed(_round(links, hosts, sec, set()))
        for o in observe(sec + 0.5):
            assert o.key == first.key and not o.evidence["down_now"], o
    assert len(ids) == 1


def test_a_twin_with_an_old_anomaly_of_its_own_is_not_reopened() -> None:
    """leaf1-spine2 flapped long ago; leaf3-spine2 flaps now, twice, and the second time
    the first traces name both: that is observed under leaf3-spine2's anomaly only."""
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    paths.feed(_round(links, hosts, 0, set()))
    paths.feed(_round(links, hosts, 1, {"leaf1-spine2"}))
    (old,) = paths.observations(int(1.5 * S))
    paths.feed(_round(links, hosts, 2, set()))
    paths.feed(_round(links, hosts, 100, set()))
    assert paths.observations(100 * S) == [] and paths.state["leaf1-spine2"].outages
    paths.feed(_round(links, hosts, 101, {"leaf3-spine2"}))
    (now,) = paths.observations(int(101.5 * S))
    assert now.link == "leaf3-spine2" and now.key != old.key
    keys = set()
    for sec, down in ((102, set()), (103, set()), (104, {"leaf3-spine2"}), (105, set())):
        rows = _round(links, hosts, sec, down)
        if down:  # the first to arrive: rack 1's traces to rack 3 alone
            paths.feed(_only(rows, host_rack, "leaf1", "leaf3"))
            for o in paths.observations(int(sec * S) + S // 4):
                keys.add(o.key)
                assert o.evidence["candidates"] == ["leaf1-spine2", "leaf3-spine2"], o
                # still named after the link it singled out, not "A or B": a remediation
                # planned from it now must find a link (a fresh-clone CI, 2026-12-07)
                assert o.link == "leaf3-spine2" and o.summary.startswith("leaf3-spine2 "), o
        paths.feed(rows)
        for o in paths.observations(int(sec * S) + S // 2):
            keys.add(o.key)
            assert o.link == "leaf3-spine2", o
    assert keys == {now.key}
    assert len(paths.state["leaf1-spine2"].outages) == 1  # its own, from long ago


def test_a_twin_whose_anomaly_closed_lends_it_no_key_and_is_not_reopened() -> None:
    """leaf1-spine2 flapped long ago (its anomaly closed). leaf3-spine2's first flap is
    first named together with it, and its second ends before any trace singles it out:
    every observation is leaf3-spine2's one anomaly; leaf1-spine2's never reopens."""
    from analytics.detect.anomalies import AnomalyBook
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    book = AnomalyBook(clear_s=60)
    opened: dict[str, str] = {}  # anomaly id -> key

    def observe(sec: float) -> list[Observation]:
        got = paths.observations(int(sec * S))
        for o in got:
            opened[book.observe(o, int(sec * S)).anomaly_id] = o.key
        book.expire(int(sec * S))
        return got

    paths.feed(_round(links, hosts, 0, set()))
    paths.feed(_round(links, hosts, 1, {"leaf1-spine2"}))
    (old,) = observe(1.5)
    paths.feed(_round(links, hosts, 2, set()))
    observe(2.5)
    for sec in range(10, 101, 10):
        paths.feed(_round(links, hosts, sec, set()))
        observe(sec + 0.5)
    first_ids = set(opened)
    # leaf3-spine2 down: rack 1's traces to rack 3 arrive first (both links named)
    rows = _round(links, hosts, 101, {"leaf3-spine2"})
    paths.feed(_only(rows, host_rack, "leaf1", "leaf3"))
    (twin,) = observe(101.25)
    assert twin.evidence["candidates"] == ["leaf1-spine2", "leaf3-spine2"], twin.evidence
    assert twin.key != old.key, "a closed anomaly's key lent to the group"
    paths.feed(rows)
    (now,) = observe(101.5)
    assert now.link == "leaf3-spine2" and now.key == twin.key
    for sec in (102, 103):
        paths.feed(_round(links, hosts, sec, set()))
        observe(sec + 0.5)
    # its second flap: only rack 1's traces show it before every path is back
    paths.feed(_only(_round(links, hosts, 104, {"leaf3-spine2"}), host_rack, "leaf1", "leaf3"))
    (twin2,) = observe(104.25)
    assert twin2.key == now.key and twin2.evidence["down_now"], twin2
    assert twin2.link == "leaf3-spine2", twin2  # the link its anomaly singled out, kept
    assert twin2.evidence["candidates"] == ["leaf1-spine2", "leaf3-spine2"], twin2.evidence
    for sec in range(105, 112):
        paths.feed(_round(links, hosts, sec, set()))
        for o in observe(sec + 0.5):
            assert o.key == now.key, f"observed beside leaf3-spine2's anomaly: {o.key}"
    assert {k for i, k in opened.items() if i not in first_ids} == {now.key}
    assert old.key not in {k for i, k in opened.items() if i not in first_ids}


def test_an_outage_is_placed_between_the_traces_that_bound_it() -> None:
    """Watch traces every 0.2 s: the outage runs from between the last trace across the
    link and the first that avoided it to between the last that still avoided it and the
    first across it again."""
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    t = 0.0
    while t < 20.0:  # down from 5.05 to 8.35 s
        down = {"leaf2-spine1"} if 5.05 <= t < 8.35 else set()
        paths.feed(_round(links, hosts, t, down))
        paths.observations(int(t * S) + S // 10)
        t = round(t + 0.2, 6)
    (outage,) = paths.state["leaf2-spine1"].outages
    assert abs(outage.duration_s(0) - 3.3) <= 0.2  # type: ignore[operator]
    assert abs(outage.down_ns / S - 5.05) <= 0.1 and abs(outage.up_ns / S - 8.35) <= 0.1


class _HashThresholdFabric:
    """Racks of hosts under leaves, every leaf on every spine, and Linux's hash-threshold
    ECMP: each 5-tuple has a fixed hash in [0, 1); the group's live members, in order,
    split that range evenly. Each host traces 8 ports to every host of another rack, one
    host at a time (a trace every 0.1 s), as collectors with different phases do."""

    def __init__(self, racks: int, spines: int, seed: int = 7) -> None:
        from analytics.detect.paths import FabricLink

        rng = np.random.default_rng(seed)
        self.spines = [f"spine{s}" for s in range(1, spines + 1)]
        self.links = [
            FabricLink(f"leaf{r}-{sp}", f"leaf{r}", sp, f"198.18.{r}.{i}")
            for r in range(1, racks + 1)
            for i, sp in enumerate(self.spines, 1)
        ]
        self.hop = {(lk.leaf, lk.spine): lk.hop for lk in self.links}
        self.host_rack = {
            records.host_id(f"h{r}-{n}"): f"leaf{r}" for r in range(1, racks + 1) for n in (1, 2)
        }
        self.tuples = [
            (src, dst, 40000 + p, float(rng.random()))
            for src in self.host_rack
            for dst in self.host_rack
            if self.host_rack[src] != self.host_rack[dst]
            for p in range(8)
        ]
        self.down: set[str] = set()
        self.t = 0.0

    def spine(self, x: str, z: str, h: float) -> str | None:
        live = [
            s for s in self.spines if f"{x}-{s}" not in self.down and f"{z}-{s}" not in self.down
        ]
        return live[int(h * len(live))] if live else None

    def traces(self, seconds: float) -> np.ndarray:
        """Traces of the next ``seconds``: one (src, dst) host pair's 8 ports every 0.1 s."""
        rows = []
        pairs = sorted({(s, d) for s, d, _, _ in self.tuples})
        end = self.t + seconds
        i = round(self.t * 10)
        while self.t < end:
            src, dst = pairs[i % len(pairs)]
            x, z = self.host_rack[src], self.host_rack[dst]
            for s, d, port, h in self.tuples:
                if (s, d) == (src, dst) and (y := self.spine(x, z, h)) is not None:
                    ts = int(self.t * S) + len(rows)
                    rows.append((ts, s, d, port, 2, (0,) * 5, self.hop[(x, y)].encode(), 50_000))
            i += 1
            self.t = round(self.t + 0.1, 6)
        return np.array(rows, records.PATH_HOP)


def test_hash_threshold_fabric_names_only_the_failed_link_and_recovers_cleanly() -> None:
    """Four spines: when leaf1-spine3 goes, hash-threshold ECMP also moves flows between
    the spines left; none of those is named, the outage starts at the first trace that
    saw it, and its return (which moves flows back) opens nothing."""
    from analytics.detect.paths import FabricPaths

    fab = _HashThresholdFabric(racks=3, spines=4)
    paths = FabricPaths(fab.links, fab.host_rack)
    paths.feed(fab.traces(10.0))
    assert paths.observations(fab.t * S) == []
    fab.down = {"leaf1-spine3"}
    seen: list[tuple[float, str, str]] = []
    while fab.t < 20.0:
        paths.feed(fab.traces(0.5))
        seen += [(fab.t, o.key, o.link) for o in paths.observations(int(fab.t * S))]
    # One anomaly: first named with the twin a single missing path cannot rule out, then,
    # as soon as another rack's traces clear leaf3-spine3, the failed link alone.
    assert {key for _, key, _ in seen} == {"leaf1-spine3 or leaf3-spine3"}
    assert seen[0][0] <= 11.0 and seen[0][2] == "leaf1-spine3 or leaf3-spine3"
    assert {link for t, _, link in seen if t >= 12.0} == {"leaf1-spine3"}
    fab.down = set()
    while fab.t < 30.0:
        paths.feed(fab.traces(0.5))
        for obs in paths.observations(int(fab.t * S)):
            assert obs.link == "leaf1-spine3" and obs.evidence["flaps"] == 1
    assert paths.state["leaf1-spine3"].down_since == 0
    (outage,) = paths.state["leaf1-spine3"].outages
    # Down from the traces of 10.0 s on (after those of 9.9 s), back from 20.0 s on: the
    # outage is placed between the traces that bound each end, not at the first evidence.
    assert 9.9 * S <= outage.down_ns <= 10.0 * S and 19.9 * S <= outage.up_ns <= 20.0 * S
    assert abs(outage.duration_s(0) - 10.0) <= 0.1  # type: ignore[operator]


def test_traces_the_topology_cannot_place_are_said_once_and_ignored(caplog) -> None:  # type: ignore[no-untyped-def]
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    rows = _round(links, hosts, 0, set())
    rows["hop"][:5] = b"203.0.113.9"  # a router the topology file does not know
    rows["src"][5:7] = records.host_id("h9-9")  # a host it does not list
    with caplog.at_level("WARNING", logger="clockmesh.detect.paths"):
        paths.feed(rows)
        paths.feed(rows)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert (
        "trace answer from 203.0.113.9, which the topology file names on no fabric link" in said[0]
    )
    assert f"host id {records.host_id('h9-9')} traced" in said[1]
    assert paths.unknown_hops["203.0.113.9"] == 10 and paths.observations(S) == []


def _watched_flap(down: dict[str, tuple[float, float]], until: float = 12.0):  # type: ignore[no-untyped-def]
    """Watch-rate traces (every 0.2 s) of three racks while links are down over their
    (from, to) spans; a pass after every round."""
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    t = 0.0
    while t < until:
        out = {name for name, (a, b) in down.items() if a <= t < b}
        paths.feed(_round(links, hosts, t, out))
        paths.observations(int(t * S) + S // 10)
        t = round(t + 0.2, 6)
    return paths, hosts


def _tight_job(hosts: dict[str, list[int]]) -> dict[str, JobLimit]:
    """A job with a host in every rack, NCCL_IB_TIMEOUT=14: it survives 0.54 s."""
    every = {h[0] for h in hosts.values()}
    return {"tight": JobLimit("tight", qp_limit_s(14, 7), "NCCL_IB_TIMEOUT 14", every, 0, 0)}


def test_a_fabric_link_routed_around_is_judged_on_the_reroute_not_the_outage() -> None:
    """leaf2-spine1 out of service for 3.3 s while leaf2 keeps spine2: the fabric moves
    its flows within a round, so a job of 0.54 s survives; the outage stays reported."""
    paths, hosts = _watched_flap({"leaf2-spine1": (5.05, 8.35)})
    (obs,) = paths.observations(12 * S)
    jobs = _tight_job(hosts)
    host_rack = {h: r for r, hs in hosts.items() for h in hs}
    Survival(host_rack, {}).judge([obs], jobs, 12 * S)
    e = obs.evidence
    (outage,), (reroute,) = e["outages_s"], e["reroutes_s"]
    assert abs(outage - 3.3) <= 0.2, e  # the link's time out of service, as before
    # the last trace across it (5.0 s) to the first round that saw its paths moved (5.2 s)
    assert 0.15 <= reroute <= 0.25, e
    assert e["every_path_lost"] == [False]
    (j,) = e["job_verdicts"]
    assert j["verdicts"] == ["survives"] and e["outages_over_kill_s"] == 0, e
    assert f"out of service up to {outage:.1f} s (paths rerouted within {reroute:.2f} s)" in (
        obs.summary
    ), obs.summary
    assert "job tight survives the reroute (its 0.54 s)" in obs.summary, obs.summary
    assert "kills" not in obs.summary
    # a job whose limit is below the reroute's bound may have lost more than it survives
    slow = {"t": JobLimit("t", reroute / 2, "test", set(jobs["tight"].hosts), 0, 0)}
    Survival(host_rack, {}).judge([obs], slow, 12 * S)
    assert obs.evidence["job_verdicts"][0]["verdicts"] == ["may kill"]
    assert obs.evidence["outages_over_kill_s"] == 0
    assert f"job t may not survive the reroute: paths rerouted within {reroute:.2f} s" in (
        obs.summary
    ), obs.summary


def test_a_path_still_away_from_an_earlier_outage_leaves_the_next_reroute_measured() -> None:
    """leaf2-spine1 goes down (5.05–8.35 s) and again at 8.6 s, before leaf3 re-learned
    spine1 towards rack 2: rack 3's path to rack 2 through spine1 was away when the link
    failed again (no flow of it to reroute) and comes back only with the link at 13 s —
    its trace back is among the first across the link, so the outage's end sees it. The
    second outage's reroute is still measured, from the paths in use when it failed (the
    lab's "reroute reported within None s" of a link's second, quick flap)."""
    from analytics.detect.paths import FabricPaths

    links, host_rack, hosts = _fabric(3)
    paths = FabricPaths(links, host_rack)
    rack3 = set(hosts["leaf3"])
    t = 0.0
    while t < 15.0:
        ends = [(5.05, 8.35), (8.6, 13.0)]
        down = {"leaf2-spine1"} if any(a <= t < b for a, b in ends) else set()
        late = {"leaf2-spine1"} if 5.05 <= t < 13.0 else set()  # leaf3's view of it
        rows = np.concatenate([_round(links, hosts, t, down), _round(links, hosts, t, late)])
        from_rack3 = np.isin(rows["src"], list(rack3))
        half = len(rows) // 2
        keep = np.r_[~from_rack3[:half], from_rack3[half:]]
        paths.feed(rows[keep])
        paths.observations(int(t * S) + S // 10)
        t = round(t + 0.2, 6)
    (obs,) = paths.observations(15 * S)
    e = obs.evidence
    assert len(e["outages_s"]) == 2 and e["every_path_lost"] == [False, False], e
    # each: the last trace across it (5.0, 8.4 s) to the first round that saw its paths
    # in use move (5.2, 8.6 s)
    assert all(r is not None and 0.15 <= r <= 0.25 for r in e["reroutes_s"]), e["reroutes_s"]
    assert "reroute not measured" not in obs.summary, obs.summary


def test_a_rack_that_lost_every_spine_is_judged_on_the_outage() -> None:
    """leaf2-spine1 out from 5.05 to 10 s and leaf2-spine2 from 6.05 to 9.5 s: rack 2 had
    no path at all for most of it, so a job sees the outage, not a reroute."""
    paths, hosts = _watched_flap({"leaf2-spine1": (5.05, 10.0), "leaf2-spine2": (6.05, 9.5)})
    (obs,) = [o for o in paths.observations(12 * S) if o.link == "leaf2-spine1"]
    host_rack = {h: r for r, hs in hosts.items() for h in hs}
    Survival(host_rack, {}).judge([obs], _tight_job(hosts), 12 * S)
    e = obs.evidence
    (outage,) = e["outages_s"]
    assert e["reroutes_s"] == [None] and e["every_path_lost"] == [True], e
    assert e["job_verdicts"][0]["verdicts"] == ["kills"] and e["outages_over_kill_s"] == 1
    assert f"kills job tight: outage {outage:.1f} s > its 0.54 s" in obs.summary, obs.summary
    assert "every path of leaf2 lost: judged on the outage" in obs.summary, obs.summary


def test_a_host_link_is_judged_on_its_down_time() -> None:
    """A host has one link: its jobs' flows have no other path, so they lose the whole
    down time (2 s here), as they did before fabric reroutes were judged."""
    flaps = _flaps()
    flaps.feed(_counters([(1, 6, 0), (2, 6, 0), (3, 2, 1), (5, 6, 0)]))
    (obs,) = flaps.observations(5 * S)
    assert "reroutes_s" not in obs.evidence
    jobs = {"tight": JobLimit("tight", qp_limit_s(14, 7), "test", {H1, H2}, 0, 5 * S)}
    Survival({H1: "leaf1", H2: "leaf2"}, {H1: "h1-1", H2: "h2-1"}).judge([obs], jobs, 5 * S)
    assert obs.evidence["job_verdicts"][0]["verdicts"] == ["kills"]
    assert "outages up to 2.0 s; kills job tight: outage 2.0 s > its 0.54 s" in obs.summary
    assert "reroute" not in obs.summary


def test_a_fabric_outage_whose_reroute_was_not_measured_may_kill_never_kills() -> None:
    """The rack kept its other spine but no trace saw its paths move: its flows lost at
    most the outage, most likely only the reroute. Over a job's limit that outage *may*
    have killed it — never "kills" (a fresh-clone CI run said "kills job mid" of a job the
    fabric had rerouted in 0.07 s)."""
    from analytics.detect.survival import judge_outages

    def observed(every_path_lost: bool) -> Observation:
        obs = Observation(kind="flapping_link", key="leaf1-spine1", score=0.5, summary="")
        obs.link = "leaf1-spine1"
        obs.evidence = {"flaps": 1, "outages_s": [6.9], "outages_ns": [[10 * S, 17 * S]],
                        "reroutes_s": [None], "every_path_lost": [every_path_lost],
                        "longest_outage_s": 6.9, "window_s": 600, "down_now": False}  # fmt: skip
        return obs

    mid = JobLimit("mid", qp_limit_s(17, 7), "NCCL_IB_TIMEOUT 17", set(), 0, 0)
    obs = observed(every_path_lost=False)
    judge_outages(obs, [mid])
    assert obs.evidence["job_verdicts"][0]["verdicts"] == ["may kill"]
    assert obs.evidence["outages_over_kill_s"] == 0 and "kills job" not in obs.summary
    assert "job mid may not survive: out 6.9 s and its flows' reroute not measured" in obs.summary
    lost = observed(every_path_lost=True)  # no path left: the job lost the whole outage
    judge_outages(lost, [mid])
    assert (
        lost.evidence["outages_over_kill_s"] == 1 and "kills job mid: outage 6.9 s" in lost.summary
    )
