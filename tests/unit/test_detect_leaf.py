"""A leaf that goes down as a whole (every host link under it at once) is one anomaly
named after the leaf, not one per host link, and takes its uplinks' outages while its BGP
sessions come back (analytics/detect/flaps.py, detect_runner._with_leaves)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analytics.detect.detect_runner import DetectConfig, DetectRunner
from analytics.detect.flaps import LinkFlaps, Outage
from analytics.remediate import plan
from analytics.store import layout
from collector import records
from tests.unit.topologies import leaf_spine

S = 1_000_000_000
T0 = 1_800_000_000 * S
HOSTS = {10 * r + i: f"leaf{r}" for r in (1, 2, 3) for i in (1, 2)}
NAMES = {h: f"h{h // 10}-{h % 10}" for h in HOSTS}


def _topology(path: Path) -> Path:
    path.write_text(json.dumps(leaf_spine({NAMES[h]: HOSTS[h] for h in HOSTS})))
    return path


def _samples(sec: int, down: dict[int, tuple[int, int]]) -> np.ndarray:
    """One second's operstate sample of every host's bk0; ``down``: host -> [from, to)."""
    rows = []
    for h in HOSTS:
        a, b = down.get(h, (0, 0))
        oper = 2 if a <= sec < b else 6
        went = 1 if h in down and sec == a else 0
        ts = T0 + sec * S + h * 1_000_000  # collectors sample unaligned
        rows.append((ts, h, b"bk0", 0, 0, (0,) * 5, b"operstate", oper, 0))
        rows.append((ts, h, b"bk0", 0, 0, (0,) * 5, b"carrier_down_count", went, went))
    return np.array(rows, records.COUNTER)


def _runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DetectRunner:
    monkeypatch.setattr(records, "host_id", lambda name: {v: k for k, v in NAMES.items()}[name])
    config = DetectConfig(topology_file=str(_topology(tmp_path / "t.json")))
    runner = DetectRunner(None, config, host_names=lambda: NAMES)
    assert runner.model is not None  # the shipped model judges what the rules found
    return runner


def _run(runner: DetectRunner, down: dict[int, tuple[int, int]], seconds: range,
         uplink: dict[int, tuple[str, int, int]] | None = None,
         seen: dict[str, int] | None = None) -> None:  # fmt: skip
    """A pass a second; ``uplink``: at second k, an outage of a leaf–spine link (or of
    links no trace told apart, "A or B") from second a to b, as the path traces would have
    placed it; ``seen``: link -> the second of the newest trace across it before that
    outage (none: not since it was first)."""
    for sec in seconds:
        if uplink and sec in uplink:
            key, a, b = uplink[sec]
            twins = tuple(key.split(" or "))  # links no trace told apart: one outage
            for name in twins:
                st = runner.paths.state[name]
                st.last_ok_ns = T0 + (seen or {}).get(name, 0) * S
                st.outages.append(Outage(T0 + a * S))
                st.down_since = st.evidence_ns = T0 + a * S
                st.back_ns = T0 + b * S
                if len(twins) > 1:
                    st.group, st.key = twins, key
        runner.paths.newest_ns = T0 + sec * S  # the traces seen up to now
        runner.feed({"counter": layout.records_to_arrow("counter", _samples(sec, down))})
        runner.step(T0 + sec * S + 500_000_000)


def test_a_leaf_whose_every_host_link_goes_at_once_is_one_anomaly_named_as_the_leaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(tmp_path, monkeypatch)
    # leaf2 dies: h2-1 seen down at 5 s, h2-2 a second later; both back at 15 and 16 s.
    # Meanwhile h1-1's own link flaps, 5 s to 8 s: that one stays its own.
    down = {21: (5, 15), 22: (6, 16), 11: (5, 8)}
    _run(runner, down, range(0, 6))
    first = {a["link"]: a for a in runner.live()["open"]}
    # before the second host was seen down, h2-1's link was named on its own
    assert set(first) == {"h2-1-leaf2", "h1-1-leaf1"}, first
    _run(runner, down, range(6, 8))
    (leaf,) = [a for a in runner.live()["open"] if a["link"] == "leaf2"]
    assert leaf["kind"] == "flapping_link"  # the model keeps it in its class
    assert leaf["evidence"]["hosts_cut_off"] == ["h2-1", "h2-2"]
    assert leaf["summary"].startswith(
        "leaf2 (all 2 of its host links at once) flapped 1 time in 10 min; down now"
    ), leaf["summary"]
    # h2-1's anomaly closed now, naming the leaf's; no host link of leaf2 is open
    assert {a["link"] for a in runner.live()["open"]} == {"leaf2", "h1-1-leaf1"}
    (folded,) = [a for a in runner.live()["recently_closed"] if a["link"] == "h2-1-leaf2"]
    assert folded["evidence"]["folded_into"] == leaf["anomaly_id"], folded
    _run(runner, down, range(8, 18))
    (leaf,) = [a for a in runner.live()["open"] if a["link"] == "leaf2"]
    # from the first host going to the last coming back
    assert leaf["evidence"]["outages_s"] == [pytest.approx(11.0, abs=0.05)], leaf["evidence"]
    assert "outages up to 11.0 s" in leaf["summary"] and "down now" not in leaf["summary"]
    (own,) = [a for a in runner.live()["open"] if a["link"] == "h1-1-leaf1"]
    assert own["evidence"]["outages_s"] == [3.0]


def test_a_leafs_uplinks_coming_back_late_are_the_leafs_and_a_later_flap_is_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(tmp_path, monkeypatch)
    down = {21: (5, 15), 22: (5, 15)}
    # leaf2-spine2's paths go 2 s after the leaf is back, for 6 s (its BGP session);
    # leaf2-spine1 flaps on its own a minute later
    uplink = {18: ("leaf2-spine2", 17, 23), 75: ("leaf2-spine1", 75, 78)}
    _run(runner, down, range(0, 30), uplink)
    seen = {a["link"] for a in [*runner.live()["open"], *runner.live()["recently_closed"]]}
    assert seen == {"leaf2"}, seen
    _run(runner, down, range(30, 80), uplink)
    (own,) = [a for a in runner.live()["open"] if a["link"] == "leaf2-spine1"]
    assert own["kind"] == "flapping_link", own


def test_host_links_of_one_leaf_going_apart_or_not_all_are_each_their_own() -> None:
    ports = {(h, "bk0"): f"{NAMES[h]}-{HOSTS[h]}" for h in HOSTS}
    access = {h: f"{NAMES[h]}-{HOSTS[h]}" for h in HOSTS}
    for down in ({21: (5, 15), 22: (9, 15)}, {21: (5, 7), 22: (8, 12)}, {31: (5, 15)}):
        flaps = LinkFlaps(600, ports, NAMES, HOSTS, access)
        links = set()
        for sec in range(0, 16):
            flaps.feed(_samples(sec, down))
            links |= {o.link for o in flaps.observations(T0 + sec * S + S // 2)}
        assert links == {f"{NAMES[h]}-{HOSTS[h]}" for h in down}, (down, links)
        assert not flaps.leaves and not flaps.take_folded()


def test_a_leaf_gone_as_a_whole_is_checked_by_hand_not_routed_around(tmp_path: Path) -> None:
    topology = json.loads(_topology(tmp_path / "t.json").read_text())
    assert plan.recommended(topology, "flapping_link", "leaf2") == ("", "")
    assert plan.no_remedy(topology, "flapping_link", "leaf2") == plan.LEAF_NO_REMEDY
    assert plan.no_remedy(topology, "flapping_link", "spine1") == "none: leaves route around it"


def test_an_uplink_that_flapped_on_its_own_before_keeps_that_anomaly_and_not_the_leafs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(tmp_path, monkeypatch)
    down = {21: (6, 15), 22: (6, 15)}
    # leaf2-spine2 flaps on its own (1-3 s), then goes again with its leaf's BGP (17-23 s)
    uplink = {2: ("leaf2-spine2", 1, 3), 18: ("leaf2-spine2", 17, 23)}
    _run(runner, down, range(0, 5), uplink)
    (own,) = [a for a in runner.live()["open"] if a["link"] == "leaf2-spine2"]
    _run(runner, down, range(5, 30), uplink)
    now = {a["link"]: a for a in runner.live()["open"]}
    assert set(now) == {"leaf2", "leaf2-spine2"}, now
    # still its own flap alone: the leaf's outage is not counted in it, nor is it closed
    assert now["leaf2-spine2"]["anomaly_id"] == own["anomaly_id"]
    assert now["leaf2-spine2"]["evidence"]["flaps"] == 1, now["leaf2-spine2"]["evidence"]
    assert not runner.live()["recently_closed"]


def test_an_uplink_that_carried_traffic_after_the_leaf_was_back_flaps_on_its_own_soon_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # held-out seed 1245: leaf2 back, then leaf2-spine1 flapped 25 s later; its first
    # outage was taken as the leaf's BGP coming back and the page came 8.8 s late
    runner = _runner(tmp_path, monkeypatch)
    down = {21: (5, 10), 22: (5, 10)}
    # leaf2-spine2's BGP comes back late: not seen since before the leaf went (4 s);
    # leaf2-spine1 carried traces up to 24 s, well after the leaf was back, then goes
    uplink = {12: ("leaf2-spine2", 11, 14), 26: ("leaf2-spine1", 25, 29)}
    _run(runner, down, range(0, 27), uplink, seen={"leaf2-spine2": 4, "leaf2-spine1": 24})
    now = {a["link"]: a for a in runner.live()["open"]}
    assert set(now) == {"leaf2", "leaf2-spine1"}, now
    assert now["leaf2-spine1"]["summary"].startswith("leaf2-spine1 flapped 1 time"), now


def test_an_uplinks_outage_that_was_its_leafs_is_not_counted_when_it_flaps_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # held-out seed 1246: leaf2-spine2 flapped twice on its own 3 min after leaf2 went
    # whole and was paged "flapped 3 times …; out of service up to 5.0 s (paths rerouted
    # within 9.50 s)": the 5.0 s and the 9.50 s were the leaf's outage
    runner = _runner(tmp_path, monkeypatch)
    down = {21: (5, 15), 22: (5, 15)}
    uplink = {8: ("leaf2-spine2", 7, 16), 76: ("leaf2-spine2", 75, 78)}
    _run(runner, down, range(0, 70), uplink, seen={"leaf2-spine2": 4})
    assert {a["link"] for a in runner.live()["open"]} == {"leaf2"}
    _run(runner, down, range(70, 82), uplink, seen={"leaf2-spine2": 74})  # seen since
    (own,) = [a for a in runner.live()["open"] if a["link"] == "leaf2-spine2"]
    e = own["evidence"]
    assert e["flaps"] == 1 and [d for d, _up in e["outages_ns"]] == [T0 + 75 * S], e
    assert own["summary"].startswith("leaf2-spine2 flapped 1 time in 10 min"), own["summary"]


def test_a_leaf_gone_whole_does_not_page_again_an_uplink_whose_own_flap_was_long_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # held-out seed 1259: leaf1-spine2 flapped on its own (anomaly closed); 2 min later
    # leaf1 lost power, and 1 s after it was back "leaf1-spine2 flapped 4 times in 10 min"
    # was paged again — the four old outages, opened by the leaf's outage ending
    runner = _runner(tmp_path, monkeypatch)
    down = {21: (100, 110), 22: (100, 110)}
    uplink = {2: ("leaf2-spine2", 1, 3), 101: ("leaf2-spine2", 100, 111)}
    _run(runner, down, range(0, 95), uplink, seen={"leaf2-spine2": 98})
    (own,) = [a for a in runner.live()["recently_closed"] if a["link"] == "leaf2-spine2"]
    _run(runner, down, range(95, 130), uplink, seen={"leaf2-spine2": 98})
    live = runner.live()
    assert {a["link"] for a in live["open"]} == {"leaf2"}, live["open"]
    again = [a for a in live["recently_closed"]
             if a["link"] == "leaf2-spine2" and a["anomaly_id"] != own["anomaly_id"]]  # fmt: skip
    assert not again, again


def test_a_leafs_uplink_told_apart_from_no_other_leafs_link_is_still_the_leafs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # held-out seed 1261: 0.7 s after leaf2 was back, "leaf2-spine2 or leaf3-spine2" lost
    # its paths for 1 ms (leaf2's BGP session coming back) and, once it had ended, was
    # paged as a flap for 17 s: leaf3-spine2 — another leaf's link, carrying traces all
    # along — had been seen after leaf2 was back, which was read as leaf2-spine2's BGP
    # being back before the outage began
    runner = _runner(tmp_path, monkeypatch)
    down = {21: (5, 15), 22: (5, 15)}
    uplink = {18: ("leaf2-spine2 or leaf3-spine2", 17, 18)}
    _run(runner, down, range(0, 60), uplink, seen={"leaf2-spine2": 4, "leaf3-spine2": 16})
    live = runner.live()
    seen = {a["link"] for a in [*live["open"], *live["recently_closed"]]}
    assert seen == {"leaf2"}, seen
    # and the outage is the leaf's for both: not counted when either flaps on its own later
    assert all(runner.paths.state[n].outages[-1].whole_leaf == "leaf2"
               for n in ("leaf2-spine2", "leaf3-spine2"))  # fmt: skip


def _event(host: int, ts: int, up: bool) -> np.ndarray:
    """One link-watch sample of a host's bk0 (its collector ships it at once)."""
    oper, went = (6, 0) if up else (2, 1)
    return np.array([(ts, host, b"bk0", 0, 0, (0,) * 5, b"operstate", oper, 0),
                     (ts, host, b"bk0", 0, 0, (0,) * 5, b"carrier_down_count", went, went)],
                    records.COUNTER)  # fmt: skip


def test_a_dead_leafs_host_links_reported_apart_are_never_paged_one_by_one() -> None:
    """Held-out seed 1267: leaf1 died, its two hosts saw their links go 5 ms apart, and
    their reports reached the ops box 0.18 s apart: h1-1-leaf1 was paged on its own,
    then folded into leaf1's anomaly. A host link of a rack is named once the rack's other
    host links have been heard from since it went down, or 0.4 s after."""
    from analytics.detect.flaps import LEAF_WAIT_NS

    ports = {(h, "bk0"): f"{NAMES[h]}-{HOSTS[h]}" for h in HOSTS}
    flaps = LinkFlaps(600, ports, NAMES, HOSTS, {h: ports[(h, "bk0")] for h in HOSTS})
    for sec in range(3):
        flaps.feed(_samples(sec, {}))
        assert flaps.observations(T0 + sec * S + S // 2) == []
    t = T0 + 3 * S + 100_000_000  # leaf2 dies
    flaps.feed(_event(21, t + 2_000_000, up=False))  # h2-1's report arrives first ...
    said = [o.link for o in flaps.observations(t + 140_000_000)]
    flaps.feed(_event(22, t + 7_000_000, up=False))  # ... h2-2's one pass later
    said += [o.link for o in flaps.observations(t + 320_000_000)]
    assert said == ["leaf2"], said
    # a host's own link: named once the rack's other host is heard, up, since ...
    flaps.feed(_event(11, t + 1 * S, up=False))
    assert [o.link for o in flaps.observations(t + S + 100_000_000)] == ["leaf2"]
    flaps.feed(_event(12, t + S + 150_000_000, up=True))  # its 1-s sample
    assert [o.link for o in flaps.observations(t + S + 200_000_000)] == ["h1-1-leaf1", "leaf2"]
    # ... or LEAF_WAIT_NS after it went down, unheard
    flaps.feed(_event(31, t + 2 * S, up=False))
    assert {o.link for o in flaps.observations(t + 2 * S + LEAF_WAIT_NS - 1)} == {
        "h1-1-leaf1", "leaf2"}  # fmt: skip
    assert "h3-1-leaf3" in {o.link for o in flaps.observations(t + 2 * S + LEAF_WAIT_NS)}


def test_the_contention_rules_hear_which_hosts_were_cut_off_and_until_when(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hosts whose own link (or leaf) was down at or after a time, as the contention
    rules ask for them (their routes' losses then are the outage's): leaf2 down 5-15 s and
    h1-1's link 3-4 s; other hosts never."""
    runner = _runner(tmp_path, monkeypatch)
    _run(runner, {21: (5, 15), 22: (5, 15), 11: (3, 4)}, range(0, 20))
    asked = runner.delays.hosts_down
    assert asked(T0 + 2 * S) == {11, 21, 22}
    assert asked(T0 + 10 * S) == {21, 22}  # back at 15 s (seen by the 15-s sample)
    assert asked(T0 + 16 * S) == set()


def test_a_leaf_going_port_by_port_is_named_as_the_leaf_never_as_its_first_host_link() -> None:
    """Seen in the demo lab (2026-12-06): leaf3's four host links went 0.15 s apart;
    h3-1-leaf3 was paged 0.53 s after it went, past the 0.4-s wait, then folded into
    leaf3. While another host link of the rack has gone down since, a host link waits
    for the rest, up to LEAF_SKEW_NS: two that go and stay down, the others up, are named
    then, each on its own (2.5 s after each went)."""
    hosts = {40 + i: "leaf4" for i in (1, 2, 3, 4)}
    names = {h: f"h4-{h % 10}" for h in hosts}
    ports = {(h, "bk0"): f"{names[h]}-leaf4" for h in hosts}
    for dying in ((41, 42, 43, 44), (41, 42)):
        flaps = LinkFlaps(600, ports, names, hosts, {h: ports[(h, "bk0")] for h in hosts})
        t = T0 + 3 * S
        for h in hosts:
            flaps.feed(_event(h, t - S + h * 1_000_000, up=True))
        said: list[tuple[int, list[str]]] = []
        for step in range(1, 31):  # a pass every 0.1 s for 3 s
            now = t + step * 100_000_000
            for i, h in enumerate(dying):  # link-watch: shipped as it goes
                went = t + 50_000_000 + i * 150_000_000
                if now - 100_000_000 < went <= now:
                    flaps.feed(_event(h, went, up=False))
            for h in hosts:  # each collector's 1-s sample of its port
                at = t + (h % 10) * 230_000_000
                if now - 100_000_000 < at <= now:
                    flaps.feed(_event(h, at, up=h not in dying))
            said.append((step, sorted(o.link for o in flaps.observations(now))))
        if len(dying) == 4:
            named = {link for _, links in said for link in links}
            assert named == {"leaf4"}, said
        else:  # gone at 0.05 and 0.2 s: named at the first passes 2.5 s after
            assert said[24:27] == [(25, []), (26, ["h4-1-leaf4"]),
                                   (27, ["h4-1-leaf4", "h4-2-leaf4"])], said[20:]  # fmt: skip
            assert all(links == [] for _, links in said[:24]), said


def test_a_hosts_port_counts_as_full_while_contention_observes_it_not_while_it_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probes a host's full port drops are its queue's, not the host cut off — while
    contention observes that queue. On the demo lab a host's egress shaped to 8 kbit/s was
    judged contended in one pass; held back for the 60 s that anomaly stayed open, the
    host cut off went quiet, both closed while the shaper stood, and nothing was open for
    27 s."""
    from analytics.detect.anomalies import Observation

    runner = _runner(tmp_path, monkeypatch)
    ns = 1_000_000_000
    t0 = 1_800_000_000 * ns
    port = Observation(kind="contention", key="h2-1-leaf2 host→leaf", score=0.8, summary="",
                       link="h2-1-leaf2", evidence={"host": "h2-1", "direction": "host→leaf"})  # fmt: skip
    runner.book.observe(port, t0)
    runner._names.update(NAMES)  # as a pass refreshes them
    h21 = {v: k for k, v in NAMES.items()}["h2-1"]
    runner.paths.newest_ns = t0 + 5 * ns
    assert runner._full_ports() == {h21}
    runner.paths.newest_ns = t0 + 25 * ns  # still open (60 s), not observed for 25 s
    assert port.book_key in runner.book.open and runner._full_ports() == set()
