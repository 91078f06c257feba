"""Culprit and victims: which open anomaly explains which pair, and each host's verdict
(analytics/detect/attribution.py), and what ``clockmesh live`` prints from it."""

from __future__ import annotations

from typing import Any

from analytics.detect import attribution
from analytics.ingest import live_cli
from tests.tui.sample import CULPRIT, sample_host_flap

RACKS = {f"h{r}-{i}": f"leaf{r}" for r in (1, 2, 3) for i in (1, 2)}
LEAVES = {f"leaf{r}-spine{s}": f"leaf{r}" for r in (1, 2, 3) for s in (1, 2)}


def _mesh(lost: dict[tuple[str, str], int], sent: int = 100) -> list[dict[str, Any]]:
    """Every host probes every other; ``lost``: (src, dst) -> probes lost."""
    return [{"src": s, "dst": d, "sent": sent, "received": sent - lost.get((s, d), 0)}
            for s in RACKS for d in RACKS if s != d]  # fmt: skip


def _verdicts(pairs: list[dict[str, Any]], anomalies: list[dict[str, Any]]) -> dict[str, str]:
    _, losses = attribution.attribute(RACKS, pairs, anomalies, RACKS, LEAVES)
    return {h: attribution.verdict(loss, 0.5) for h, loss in losses.items()}


def test_a_host_whose_link_flaps_is_the_culprit_and_its_peers_are_affected() -> None:
    # h2-1's link was down: everything sent to it lost 30 %, it sent less and lost nothing
    pairs = _mesh({(s, "h2-1"): 30 for s in RACKS})
    for p in pairs:
        if p["src"] == "h2-1":
            p["sent"] = p["received"] = 70
    flap = {"anomaly_id": "flapping-1", "kind": "flapping_link", "link": "h2-1-leaf2",
            "evidence": {"host": "h2-1", "device": "bk0"}}  # fmt: skip
    without = _verdicts(pairs, [])
    assert without["h2-1"] == "lossy"  # judged by what was sent to it, too: not "ok"
    assert {without[h] for h in RACKS if h != "h2-1"} == {"lossy"}
    explained, losses = attribution.attribute(RACKS, pairs, [flap], RACKS, LEAVES)
    verdicts = {h: attribution.verdict(x, 0.5) for h, x in losses.items()}
    assert verdicts.pop("h2-1") == "culprit"
    assert set(verdicts.values()) == {"affected"}
    assert losses["h2-1"].loss_sent == 0.0 and losses["h2-1"].loss_received == 0.3
    assert losses["h2-1"].peers_losing_to == 5 and losses["h2-1"].culprit_of == ["flapping-1"]
    assert losses["h1-1"].affected_by == {"flapping-1"} and losses["h1-1"].unexplained == 0.0
    on = {(p["src"], p["dst"]): ids for p, ids in zip(pairs, explained, strict=True)}
    assert on[("h1-1", "h2-1")] == on[("h2-1", "h3-2")] == ["flapping-1"]
    assert on[("h1-1", "h3-1")] == []


def test_a_fabric_link_explains_the_pairs_crossing_its_rack_only() -> None:
    fabric = {"anomaly_id": "flapping-2", "kind": "flapping_link", "link": "leaf1-spine2",
              "evidence": {"leaf": "leaf1", "spine": "spine2", "candidates": ["leaf1-spine2"],
                           "racks_exposed": ["leaf1"]}}  # fmt: skip
    lost = {("h1-1", "h2-1"): 20, ("h3-1", "h1-2"): 20}  # across leaf1
    verdicts = _verdicts(_mesh(lost), [fabric])
    assert [verdicts[h] for h in ("h1-1", "h2-1", "h3-1", "h1-2")] == ["affected"] * 4
    assert verdicts["h2-2"] == verdicts["h3-2"] == "ok"
    # the same loss inside rack 1 crosses no spine: nothing explains it
    assert _verdicts(_mesh({("h1-1", "h1-2"): 20}), [fabric])["h1-1"] == "lossy"
    # no evidence of its leaf (model re-judged as unknown): the topology places the link
    bare = {"anomaly_id": "unknown-3", "kind": "unknown", "link": "leaf1-spine2",
            "evidence": {}}  # fmt: skip
    assert _verdicts(_mesh(lost), [bare])["h2-1"] == "affected"


def test_contention_explains_one_direction_and_a_roce_job_explains_no_probe() -> None:
    up = {"anomaly_id": "contention-1", "kind": "contention", "link": "leaf1-spine1",
          "evidence": {"direction": "leaf→spine"}}  # fmt: skip
    pl = attribution.places([up], LEAVES)
    assert pl.explained_by("h1-1", "h2-1", "leaf1", "leaf2") == ["contention-1"]
    assert pl.explained_by("h2-1", "h1-1", "leaf2", "leaf1") == []
    down = {**up, "anomaly_id": "contention-2", "evidence": {"direction": "spine→leaf"}}
    assert attribution.places([down], LEAVES).explained_by("h2-1", "h1-1", "leaf2", "leaf1")
    roce = {"anomaly_id": "roce-1", "kind": "roce_v1_job", "job_id": "j",
            "evidence": {"hosts": ["h1-1", "h2-1"]}}  # fmt: skip
    assert _verdicts(_mesh({("h1-1", "h2-1"): 20}), [roce])["h1-1"] == "lossy"


def test_a_port_losing_a_random_share_makes_its_victims_affected_under_one_percent() -> None:
    """A spine port losing a random share of what it sends into leaf2: of the paths
    into rack 2 one in eight crosses it, and its victims lose 0.1 % of what they send
    or receive — under the 1 % a loss must reach to be worth a look, but every probe
    they lost is the open anomaly's: they are affected by it (before: ok, as if nothing
    touched them)."""
    drop = {"anomaly_id": "silent-4", "kind": "silent_drop", "link": "leaf2-spine1",
            "evidence": {"direction": "spine→leaf", "leaf": "leaf2",
                         "links": ["leaf2-spine1"]}}  # fmt: skip
    lost = {("h1-1", "h2-1"): 1, ("h3-2", "h2-2"): 1}  # 1 of the 1,000 sent on each pair
    pairs = _mesh(lost, sent=1000)
    assert set(_verdicts(pairs, []).values()) == {"ok"}  # 0.1 %: no look without a cause
    explained, losses = attribution.attribute(RACKS, pairs, [drop], RACKS, LEAVES)
    verdicts = {h: attribution.verdict(x, 0.5) for h, x in losses.items()}
    victims = {"h1-1", "h2-1", "h3-2", "h2-2"}
    assert {h for h, v in verdicts.items() if v == "affected"} == victims, verdicts
    assert {verdicts[h] for h in set(RACKS) - victims} == {"ok"}
    assert all(losses[h].affected_by == {"silent-4"} for h in victims)
    assert max(losses[h].worst for h in victims) < attribution.LOSSY
    on = {(p["src"], p["dst"]): ids for p, ids in zip(pairs, explained, strict=True)}
    assert on[("h1-1", "h2-1")] == ["silent-4"] and on[("h2-1", "h1-1")] == []
    # loss on a path the anomaly's place does not cross stays unexplained: not its victim
    other = _mesh({("h2-1", "h1-1"): 1}, sent=1000)  # leaving rack 2, not entering it
    _, losses = attribution.attribute(RACKS, other, [drop], RACKS, LEAVES)
    assert {attribution.verdict(x, 0.5) for x in losses.values()} == {"ok"}


def test_a_black_holed_host_is_lossy_from_what_was_sent_to_it() -> None:
    """No anomaly explains it: the host everyone loses probes to is lossy (it lost nothing
    of its own), and so are the senders — nothing here may call them affected."""
    verdicts = _verdicts(_mesh({(s, "h3-2"): 100 for s in RACKS}), [])
    assert set(verdicts.values()) == {"lossy"}


def test_a_leaf_dropping_one_host_explains_its_racks_pairs_to_that_host_only() -> None:
    """The demo with leaf3 black-holing h1-2: the TUI said "4 failing" beside the open
    silent_drop that explained every one of their lost probes."""
    drop = {"anomaly_id": "silent-1", "kind": "silent_drop", "link": "",
            "evidence": {"switch": "leaf1", "destinations": ["h3-1"], "from_racks": ["leaf1"],
                         "links": []}}  # fmt: skip
    lost = {("h1-1", "h3-1"): 100, ("h1-2", "h3-1"): 100}
    assert {_verdicts(_mesh(lost), [])[h] for h in ("h1-1", "h1-2", "h3-1")} == {"lossy"}
    verdicts = _verdicts(_mesh(lost), [drop])
    assert [verdicts[h] for h in ("h1-1", "h1-2", "h3-1")] == ["affected"] * 3
    assert {verdicts[h] for h in ("h2-1", "h2-2", "h3-2")} == {"ok"}
    # another rack's loss to the same host is not that leaf's: still unexplained
    verdicts = _verdicts(_mesh({**lost, ("h2-1", "h3-1"): 100}), [drop])
    assert verdicts["h2-1"] == verdicts["h3-1"] == "lossy"
    pl = attribution.places([drop], LEAVES)
    assert pl.explained_by("h1-2", "h3-1", "leaf1", "leaf3") == ["silent-1"]
    assert pl.explained_by("h3-1", "h1-2", "leaf3", "leaf1") == []
    # what `clockmesh live` and the TUI say a victim is affected by (it has no link)
    assert attribution.place_name(drop) == "leaf1 towards h3-1"


def test_a_leaf_dropping_its_own_host_explains_every_pair_to_it_its_racks_too() -> None:
    own = {"anomaly_id": "silent-2", "kind": "silent_drop", "link": "",
           "evidence": {"switch": "leaf3", "destinations": ["h3-1"],
                        "from_racks": ["leaf1", "leaf2", "leaf3"], "links": [],
                        "port_rx_packets": {"h3-1": 0}}}  # fmt: skip
    lost = {(s, "h3-1"): 100 for s in ("h1-1", "h1-2", "h2-1", "h2-2", "h3-2")}
    verdicts = _verdicts(_mesh(lost), [own])
    assert set(verdicts.values()) == {"affected"}, verdicts
    assert attribution.place_name(own) == "leaf3 towards h3-1"


def test_a_leaf_gone_as_a_whole_explains_every_pair_of_its_hosts_and_names_none_culprit() -> None:
    # leaf2 went down: every probe to or from its hosts lost, h2-1 <-> h2-2 too; the hosts
    # sent nothing that arrived, and are no more to blame than their peers
    lost = {(s, d): 100 for s in RACKS for d in RACKS if s != d and "leaf2" in (RACKS[s], RACKS[d])}
    leaf = {"anomaly_id": "flapping-9", "kind": "flapping_link", "link": "leaf2",
            "evidence": {"switch": "leaf2", "hosts_cut_off": ["h2-1", "h2-2"],
                         "links": ["h2-1-leaf2", "h2-2-leaf2"]}}  # fmt: skip
    assert set(_verdicts(_mesh(lost), []).values()) == {"lossy"}
    verdicts = _verdicts(_mesh(lost), [leaf])
    assert set(verdicts.values()) == {"affected"}, verdicts
    pl = attribution.places([leaf], LEAVES)
    assert pl.explained_by("h2-1", "h2-2", "leaf2", "leaf2") == ["flapping-9"]
    assert pl.explained_by("h1-1", "h3-1", "leaf1", "leaf3") == []
    assert attribution.place_name(leaf) == "leaf2"


def test_a_leafs_hosts_are_affected_as_soon_as_it_is_named_before_their_loss_shows() -> None:
    # leaf2 named 0.3 s after it went: the live window's pairs show no loss yet
    leaf = {"anomaly_id": "flapping-9", "kind": "flapping_link", "link": "leaf2",
            "evidence": {"switch": "leaf2", "hosts_cut_off": ["h2-1", "h2-2"],
                         "links": ["h2-1-leaf2", "h2-2-leaf2"]}}  # fmt: skip
    _, losses = attribution.attribute(RACKS, _mesh({}), [leaf], RACKS, LEAVES)
    verdicts = {h: attribution.verdict(x, 0.5) for h, x in losses.items()}
    assert {h: v for h, v in verdicts.items() if v != "ok"} == {
        "h2-1": "affected", "h2-2": "affected"}, verdicts  # fmt: skip
    assert losses["h2-1"].doc()["affected_by"] == ["flapping-9"]
    assert losses["h2-1"].doc()["cut_off_by"] == ["flapping-9"]
    # a host with no route left sends nothing: still the leaf's, not "silent"
    quiet = [p for p in _mesh({}) if p["src"] not in ("h2-1", "h2-2")]
    _, losses = attribution.attribute(RACKS, quiet, [leaf], RACKS, LEAVES)
    assert attribution.verdict(losses["h2-1"], 0.5) == "affected"
    _, losses = attribution.attribute(RACKS, quiet, [], RACKS, LEAVES)
    assert attribution.verdict(losses["h2-1"], 0.5) == "silent"
    assert attribution.verdict(losses["h2-1"], 9.0) == "stale"
    # closed, its loss still in the window explains it, but cuts nobody off any more
    _, losses = attribution.attribute(RACKS, _mesh({}), [], RACKS, LEAVES, closed=[leaf])
    assert {attribution.verdict(x, 0.5) for x in losses.values()} == {"ok"}


def test_clockmesh_live_names_the_culprit_and_counts_the_affected_apart() -> None:
    doc = sample_host_flap()
    rows = {r.host: r for r in live_cli.summarise(doc)}
    assert rows[CULPRIT].status == "culprit" and rows[CULPRIT].loss_sent == 0.0
    assert rows[CULPRIT].loss_received > 0.2 and rows[CULPRIT].culprit_of == ["flapping-00c0ffee00"]
    others = {r.status for h, r in rows.items() if h != CULPRIT}
    assert others <= {"ok", "affected"} and "affected" in others
    assert {h["verdict"] for h in doc["hosts"]} == {r.status for r in rows.values()}
    text = live_cli.render(list(rows.values()), doc, "http://ops:8470")
    line = next(x for x in text.splitlines() if x.startswith(CULPRIT + " "))
    assert " culprit " in line and f"its own link {CULPRIT}-leaf1 (flapping-00c0ffee00)" in line
    n_aff = sum(r.status == "affected" for r in rows.values())
    assert f"1 failing (1 culprit), {n_aff} affected by an anomaly (open or closed" in text


def test_clockmesh_live_says_an_anomaly_that_explains_loss_is_closed_when_it_is() -> None:
    """Just after a flap closes, its loss is still in the live window: the peers stay
    affected by it, and the page says it closed — never "affected by an open anomaly"
    beside "no open anomalies"."""
    doc = sample_host_flap()
    flap = doc["anomalies"]["open"][0]
    doc["anomalies"] = {"open": [], "recently_closed": [{**flap, "closed_ns": 1}]}
    text = live_cli.render(live_cli.summarise(doc), doc, "http://ops:8470")
    assert "no open anomalies" in text and "open anomaly" not in text
    affected = [x for x in text.splitlines() if x.split()[1:2] == ["affected"]]
    assert affected and all(f"({flap['anomaly_id']}, closed)" in x for x in affected)


def test_an_anomaly_closed_within_the_window_still_explains_its_loss_but_names_no_culprit() -> None:
    pairs = _mesh({(s, "h2-1"): 30 for s in RACKS})
    flap = {"anomaly_id": "flapping-1", "kind": "flapping_link", "link": "h2-1-leaf2",
            "closed_ns": 5, "evidence": {"host": "h2-1", "device": "bk0"}}  # fmt: skip
    _, losses = attribution.attribute(RACKS, pairs, [], RACKS, LEAVES, closed=[flap])
    verdicts = {h: attribution.verdict(x, 0.5) for h, x in losses.items()}
    assert set(verdicts.values()) == {"affected"}  # the former culprit too: its link is up
    assert losses["h2-1"].culprit_of == [] and losses["h2-1"].affected_by == {"flapping-1"}


def test_a_closed_anomaly_explains_only_loss_the_window_may_still_hold_of_it() -> None:
    """An anomaly closes the clear time (60 s) after its condition last held, so its loss
    is leaving the 60-s window as it closes: a fresh fault at its place afterwards is
    unexplained (lossy, a new page's), not "affected" by the closed one."""
    s = 1_000_000_000
    now, window = 1_000 * s, 60.0
    flap = {"anomaly_id": "flapping-1", "kind": "flapping_link", "link": "h2-1-leaf2",
            "evidence": {"host": "h2-1", "device": "bk0"}}  # fmt: skip
    just = {**flap, "last_seen_ns": now - 20 * s, "closed_ns": now - 1 * s}
    long_ago = {**flap, "last_seen_ns": now - 75 * s, "closed_ns": now - 15 * s}
    assert attribution.still_explaining([just], now, window) == [just]
    assert attribution.still_explaining([long_ago], now, window) == []
    pairs = _mesh({(s_, "h2-1"): 30 for s_ in RACKS})
    ended = attribution.still_explaining([long_ago], now, window)
    _, losses = attribution.attribute(RACKS, pairs, [], RACKS, LEAVES, closed=ended)
    verdicts = {h: attribution.verdict(x, 0.5) for h, x in losses.items()}
    assert "affected" not in verdicts.values() and "lossy" in verdicts.values(), verdicts


def test_clockmesh_live_says_an_open_anomaly_no_longer_seen_and_when_it_closes() -> None:
    """An anomaly stays open for the book's clear_s after its last observation; the page
    says how long it has not been seen, so a cleared fault does not read as ongoing."""
    from analytics.detect.anomalies import AnomalyBook, Observation

    book = AnomalyBook(clear_s=60)
    s = 1_000_000_000
    book.observe(Observation("contention", "leaf1-spine1", 0.9, "queue ≥94 µs"), 100 * s)
    book.observe(Observation("flapping_link", "h2-1-leaf2", 0.5, "flapped"), 141 * s)
    doc = sample_host_flap()
    doc["anomalies"]["open"] = [a.live(142 * s) for a in book.open.values()]
    doc["anomalies"]["clear_s"] = 60.0
    text = live_cli.render(live_cli.summarise(doc), doc, "http://ops:8470")
    lines = {x.split()[0]: x for x in text.splitlines() if x.startswith("  ")}
    assert lines["contention"].endswith("queue ≥94 µs  [not seen for 42 s, closes at 60 s]")
    assert lines["flapping_link"].endswith("  flapped")  # seen 1 s ago: still going on
