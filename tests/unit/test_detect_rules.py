"""Detector rules on hand-made telemetry: flaps from counters, RoCE v1 jobs, the book."""

from __future__ import annotations

import json

import numpy as np

from analytics.detect.anomalies import AnomalyBook, Observation
from analytics.detect.flaps import LinkFlaps
from analytics.detect.roce import RoceJobs
from collector import records

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
    assert obs.evidence["outages_over_kill_s"] == 1
    assert "outages up to 5.0 s" in obs.summary and "longer than the 4 s" in obs.summary
    # once up and quiet the rule stops observing it (the book then closes it)
    assert flaps.observations(30 * S) == []


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


def test_a_job_that_sets_no_index_resolves_to_nccls_default() -> None:
    roce = RoceJobs({H1: "h1-1"})
    roce.feed_gids(_gids(H1))
    rows = _jobs(H1, [(b"no-index", -1)])
    rows["device"] = b"uverbs0"  # the scanner names the device file the process holds
    roce.feed_jobs(rows)
    (obs,) = roce.observations(3 * S)
    assert obs.evidence["gid_indices"] == [0]
    assert "not set; NCCL < 2.21 uses index 0 (assumed)" in obs.evidence["index_source"]


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
    roce.feed_jobs(_jobs(H1, [(b"no-index", -1)], ts=6))  # nccl.conf gone: NCCL's default
    (obs,) = roce.observations(7 * S)
    assert obs.evidence["gid_indices"] == [0]


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


def _round(links: list, hosts: dict[str, list[int]], sec: float, down: set[str]) -> np.ndarray:
    """One trace round of every host: 4 ports to one host of every other rack, each port
    on the spine it hashes to, or on the other one when that path is gone."""
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
                    ts = int(sec * S) + len(rows)
                    rows.append((ts, src, dsts[0], 40000 + port, 2, (0,) * 5, hop, 50_000))
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
    assert obs.evidence["down_now"] is False and obs.evidence["outages_s"] == [3.0]
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
    assert 10 * S <= outage.down_ns < 13 * S and 20 * S <= outage.up_ns < 23 * S


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
