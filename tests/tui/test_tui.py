"""The TUI driven by Textual's pilot: every screen, the remediation flow (refusal, the cap,
cancel), a daemon that stops mid-session, an empty store, an 80×24 terminal; snapshots of
the main screens at a fixed size."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Button, DataTable, Log, Static, TabbedContent, Tree

from analytics.remediate import records
from tests.tui.sample import (
    CULPRIT,
    T0,
    sample_host_flap,
    sample_live,
    sample_racks,
    sample_store,
    sample_topology,
)
from tui.app import ClockmeshApp
from tui.drill import HostScreen, JobScreen, LinkScreen, PairScreen
from tui.remediation import ConfirmScreen, RemediationScreen
from tui.widgets import RowList

NOW = T0 / 1e9


class Feed:
    """What the daemon answers; ``down`` makes it refuse connections."""

    def __init__(self, live: dict[str, Any]) -> None:
        self.live = live
        self.down = False

    def __call__(self) -> dict[str, Any]:
        if self.down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return self.live


def _app(feed: Feed | None = None, **kw: Any) -> ClockmeshApp:
    return ClockmeshApp(feed or Feed(sample_live()), racks=sample_racks(), refresh_s=0.2,
                        now=lambda: NOW, **kw)  # fmt: skip


async def _until_tab(pilot: Any, tab: str, timeout_s: float = 5.0) -> None:
    """Wait until ``tab`` is the active tab (at most ``timeout_s``; the caller asserts)."""
    for _ in range(int(timeout_s / 0.05)):
        if pilot.app.query_one(TabbedContent).active == tab:
            return
        await pilot.pause(0.05)


def _text(app: ClockmeshApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


async def test_fleet_screen_groups_by_rack_and_filters() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        summary = _text(app, "#summary")
        assert "7/12 NICs healthy" in summary
        assert "contention 1, flapping_link 1" in summary and "12/12 solved" in summary
        tiles = _text(app, "#tiles")
        assert tiles.splitlines()[0].startswith("leaf1") and "▲ h1-2" in tiles
        table = app.query_one("#hosts", RowList)
        assert table.row_count == 12
        assert str(table.get_row_at(0)[2]) != "ok"  # problems first
        await pilot.press("slash")
        await pilot.press(*"leaf2")
        await pilot.pause(0.1)
        assert table.row_count == 4 and "leaf1" not in _text(app, "#tiles")
        app.query_one("#filter").value = "loss"
        await pilot.pause(0.1)
        assert {str(table.get_row_at(i)[1]) for i in range(table.row_count)} == {"h1-3", "h2-3"}


async def test_filter_finds_hosts_by_address_and_tag(tmp_path: Path) -> None:
    from tui.data import load_search_words

    topo = sample_topology()
    for h in topo["hosts"]:
        h["backend_address"] = f"198.18.{h['rack'][-1]}.{h['name'][-1]}"
    topo["hosts"][1]["tags"] = ["a100", "pod3"]
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topo))
    app = _app(search_words=load_search_words(path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        table = app.query_one("#hosts", RowList)
        for query, hosts in (("198.18.2.", {"h2-1", "h2-2", "h2-3", "h2-4"}),
                             ("pod3", {"h1-2"}), ("a100 slow", {"h1-2"}), ("a100 loss", set())):  # fmt: skip
            app.query_one("#filter").value = query
            await pilot.pause(0.1)
            assert {str(table.get_row_at(i)[1]) for i in range(table.row_count)} == hosts, query
    topo["hosts"][0]["tags"] = "a100"
    path.write_text(json.dumps(topo))
    with pytest.raises(ValueError, match="tags must be a list of strings"):
        load_search_words(path)


async def test_drill_down_shows_pairs_clock_and_says_history_needs_a_store() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("slash", *"h1-2", "enter")  # enter in the filter: on to the list
        await pilot.pause(0.1)
        assert app.query_one("#hosts", RowList).row_count == 1
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert isinstance(app.screen, HostScreen)
        head = str(app.screen.query_one("#drill-head", Static).render())
        assert "h1-2" in head and "slow" in head and "solved" in head
        peers = app.screen.query_one("#peers", DataTable)
        corrected = [str(peers.get_row_at(i)[6]) for i in range(peers.row_count)]
        assert "42.0" in corrected  # raw minus the clock offsets: the queue, not the skew
        assert "no store" in str(app.screen.query_one("#hist-label").render())
        await pilot.press("escape")
        assert not isinstance(app.screen, HostScreen)


async def _until(pilot: Any, check: Any, what: str, timeout: float = 10.0) -> None:
    """Wait for a worker's result to reach the screen."""
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _enter(pilot: Any, screen: type, table: str, rows: int) -> tuple[Any, DataTable]:
    """Enter on the focused list opens ``screen``; wait until its ``table`` has ``rows``."""
    await pilot.press("enter")
    await pilot.pause(0.1)
    assert isinstance(pilot.app.screen, screen)
    found = pilot.app.screen.query_one(table, DataTable)
    await _until(pilot, lambda: found.row_count == rows, f"{rows} row(s) in {table}")
    return pilot.app.screen, found


def _rows(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def _sample_site(tmp_path: Path) -> tuple[dict[str, Any], Path, Path]:
    """The sample answer with a RoCE v1 job, a real store behind it, its topology."""
    live = sample_live(anomalies=3)
    store = tmp_path / "store"
    store.mkdir()
    sample_store(store, live)
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(sample_topology()))
    return live, store, topo


async def test_host_link_flap_names_the_culprit_and_its_victims_are_affected(
    tmp_path: Path,
) -> None:
    """Issue 26: while one host's own link flaps, every peer loses probes *to* it and it
    sends nothing while down. The header, the fleet and the drill-downs name that host the
    culprit of its link's anomaly and its peers affected by it — nobody else is failing."""
    live = sample_host_flap()
    store = tmp_path / "store"
    store.mkdir()
    sample_store(store, live)  # real Parquet: the culprit's counters show its link going down
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(sample_topology()))
    app = _app(Feed(live), store=store, topology=topo)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        states = {t.host: t.state for t in app.fleet.tiles}
        assert states.pop(CULPRIT) == "culprit"
        assert set(states.values()) <= {"ok", "affected"}
        probing = {p["src"] for p in live["pairs"] if p["dst"] == CULPRIT}
        assert {h for h, s in states.items() if s == "affected"} == probing  # lost to it
        affected, ok = len(probing), len(states) - len(probing)
        summary = _text(app, "#summary")
        assert f"{ok}/12 NICs healthy · 1 failing (culprit {CULPRIT}: {CULPRIT}-leaf1)" in summary
        assert f"· {affected} affected ·" in summary
        table = app.query_one("#hosts", RowList)
        first = [str(c) for c in table.get_row_at(0)]
        assert first[1:3] == [CULPRIT, "culprit"] and first[6] == f"{CULPRIT}-leaf1"
        victim = [str(c) for c in table.get_row_at(1)]
        assert victim[2] == "affected" and victim[5] == CULPRIT  # its worst peer: the culprit
        assert victim[6] == first[6]  # because of the culprit's link
        assert "◆ h1-2" in _text(app, "#tiles")
        # The culprit's drill-down: whose fault, its loss both ways, its link going down.
        app.push_screen(HostScreen(CULPRIT))
        await pilot.pause(0.1)
        host = app.screen
        head = str(host.query_one("#drill-head", Static).render())
        assert "culprit" in head and "0.00% of what it sent, 30.00% of what was sent to it" in head
        assert f"the culprit of flapping-00c0ffee00: {CULPRIT}-leaf1 flapped 3 times" in head
        counters = host.query_one("#counters", DataTable)
        await _until(pilot, lambda: counters.row_count == 3, "the culprit's counters")
        assert _rows(counters)[0][1:4] == ["carrier_down_count", "7", "+2"]
        peers = _rows(host.query_one("#peers", DataTable))
        assert all(r[7] == "flapping-00c0ffee00" for r in peers)  # every pair: its link
        await pilot.press("escape")
        # A victim's drill-down: affected by the culprit's anomaly, not failing.
        name = victim[1]
        app.push_screen(HostScreen(name))
        await pilot.pause(0.1)
        head = str(app.screen.query_one("#drill-head", Static).render())
        assert "◌ affected" in head and "affected by flapping-00c0ffee00" in head
        peers = _rows(app.screen.query_one("#peers", DataTable))
        to_culprit = [r for r in peers if r[1] == CULPRIT]
        assert to_culprit and all(r[7] == "flapping-00c0ffee00" for r in to_culprit)
        assert all(r[7] == "" for r in peers if r[1] != CULPRIT)


async def test_drill_downs_host_pair_link_and_job_read_the_store(tmp_path: Path) -> None:
    live, store, topo = _sample_site(tmp_path)
    app = _app(Feed(live), store=store, topology=topo)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        assert "jobs: 2 running, 1 on RoCE v1" in _text(app, "#summary")
        # Host: its delay history, its counters (link state first, what moved, not the rest).
        app.push_screen(HostScreen("h1-2"))
        await pilot.pause(0.1)
        host = app.screen
        note = host.query_one("#hist-label")
        await _until(pilot, lambda: "loss" in str(note.render()), "the host's history")
        assert "worst minute's loss 5.00 % (4 min ago)" in str(note.render())
        counters = _rows(host.query_one("#counters", DataTable))
        assert [r[1] for r in counters] == ["carrier_down_count", "operstate", "rx_bytes"]
        assert counters[0][3] == "+2"  # two link downs in the last 10 minutes
        # Enter on a peer: that direction's ECMP paths, the slow one and where it went.
        peers = host.query_one("#peers", DataTable)
        assert peers.has_focus  # the drill-down opens on its list
        row = next(i for i, r in enumerate(_rows(peers)) if r[1] == "h2-2" and "to" in r[0])
        peers.move_cursor(row=row)
        pair, paths = await _enter(pilot, PairScreen, "#paths", 4)
        rows = _rows(paths)
        assert [r[1] for r in rows] == ["leaf1-spine1", "leaf1-spine2"] * 2
        assert float(rows[3][4]) - float(rows[0][4]) == pytest.approx(30.0)  # 40004: +30 µs
        assert "4 paths, p50 spread 30.0 µs" in str(pair.query_one("#hist-label").render())
        head = str(pair.query_one("#drill-head", Static).render())
        assert "h1-2 → h2-2" in head and "queued 38 µs beyond its healthy delay" in head
        await pilot.press("x")  # the other direction: nothing stored for it
        await _until(pilot, lambda: "h2-2 → h1-2" in str(pair.query_one("#drill-head").render()),
                     "the other direction")  # fmt: skip
        await _until(pilot, lambda: paths.row_count == 0
                     and "no per-path minutes" in str(pair.query_one("#hist-label").render()),
                     "an empty direction said so")  # fmt: skip
        await pilot.press("escape", "escape")
        # Anomalies → d on the flapping link: the link, its stored anomaly, paths crossing it.
        await pilot.press("a")
        await pilot.pause(0.2)
        table = app.query_one("#anomaly-table", DataTable)
        table.move_cursor(
            row=next(i for i, r in enumerate(_rows(table)) if r[0] == "flapping_link")
        )
        await pilot.press("d")
        await pilot.pause(0.1)
        assert isinstance(app.screen, LinkScreen) and app.screen.link == "leaf1-spine1"
        link = app.screen
        anomalies = link.query_one("#link-anomalies", DataTable)
        await _until(pilot, lambda: anomalies.row_count == 1, "the link's anomalies")
        assert "1.6, 2.4, 4.2" in _rows(anomalies)[0][4]
        note = str(link.query_one("#hist-label").render())
        assert "fabric link leaf1:spine1 — spine1:leaf1" in note
        assert "2 traced 5-tuple(s) crossed it in the last minute" in note
        assert "open: flapping" in str(link.query_one("#drill-head").render())
        await pilot.press("escape")
        # An access link: the host's interface counters and its outages.
        app.push_screen(LinkScreen("h1-2-leaf1"))
        await pilot.pause(0.1)
        link = app.screen
        await _until(pilot, lambda: "outage" in str(link.query_one("#hist-label").render()),
                     "the access link")  # fmt: skip
        assert "access link h1-2:bk0 — leaf1:h1-2" in str(link.query_one("#hist-label").render())
        assert "2 outage(s) in the last hour, the latest: 60.0 s, 60.0 s" in str(
            link.query_one("#hist-label").render())  # fmt: skip
        assert link.query_one("#link-counters", DataTable).row_count == 3
        await pilot.press("escape")
        # Jobs: the RoCE v1 job first; enter: its hosts' GID types and its flows' delay.
        await pilot.press("j")
        await pilot.pause(0.2)
        jobs = app.query_one("#jobs-table", DataTable)
        assert _rows(jobs)[0][:4] == ["job2", "2", "IB/RoCE v1, RoCE v2", "1"]
        assert _rows(jobs)[0][4] == "roce_v1_job" and _rows(jobs)[1][0] == "train-llm"
        job, flows = await _enter(pilot, JobScreen, "#job-flows", 1)
        src, dst, messages, _, _, excess = _rows(flows)[0]
        assert (src, dst, messages, excess) == ("h1-1", "h2-1", "60", "25.0")
        hosts = _rows(job.query_one("#job-hosts", DataTable))
        assert [h[3] for h in hosts] == ["IB/RoCE v1", "RoCE v2"]
        assert "1 host(s) on RoCE v1" in str(job.query_one("#drill-head").render())


async def test_drill_down_with_an_empty_store_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    from analytics.store.catalog import write_catalog
    from analytics.store.store_writer import StoreWriter

    StoreWriter(store).open()
    write_catalog(store)
    app = _app(store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        for screen, says in ((HostScreen("h1-2"), "no one-way delay for this host"),
                             (PairScreen("h1-2", "h2-2"), "no per-path minutes"),
                             (JobScreen("job2"), "no in-band timestamps")):  # fmt: skip
            app.push_screen(screen)
            await pilot.pause(0.1)
            await _until(pilot, lambda s=screen, w=says: w in str(s.query_one("#hist-label").render()),
                         f"{type(screen).__name__} on an empty store")  # fmt: skip
            await pilot.press("escape")


async def test_daemon_stopping_mid_session_keeps_the_picture_under_a_banner() -> None:
    feed = Feed(sample_live())
    app = _app(feed)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        assert not app.query_one("#banner").display
        feed.down = True
        await pilot.pause(0.5)
        banner = _text(app, "#banner")
        assert app.query_one("#banner").display and "STALE since" in banner
        assert "Connection refused" in banner and "showing the last picture" in banner
        assert app.query_one("#hosts", RowList).row_count == 12
        # A drill-down opened meanwhile says so too, over the last picture.
        app.push_screen(HostScreen("h1-2"))
        await pilot.pause(0.3)
        head = str(app.screen.query_one("#drill-head").render())
        assert "STALE: the daemon is not answering" in head and "offset" in head
        assert app.screen.query_one("#peers", DataTable).row_count == 4
        feed.down = False
        await pilot.pause(1.2)  # the drill-down redraws every second
        assert "STALE" not in str(app.screen.query_one("#drill-head").render())
        await pilot.press("escape")
        assert not app.query_one("#banner").display  # reconnected by itself


async def test_no_daemon_and_no_data_yet_at_80x24() -> None:
    feed = Feed({})
    feed.down = True
    app = _app(feed)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.4)
        assert "no data yet" in _text(app, "#banner")
        feed.down, feed.live = False, {"hosts": [], "pairs": []}
        await pilot.pause(0.5)
        assert "no host has shipped yet" in _text(app, "#summary")
        await pilot.press("u")
        assert "no store given" in str(app.query_one("#audit-summary").render())


async def _open_first_anomaly(app: ClockmeshApp, pilot: Any) -> None:
    """Anomalies tab, first row, enter: the remediation dialog, planned."""
    await pilot.pause(0.3)
    await pilot.press("a")
    await pilot.press("enter")
    await _planned(app, pilot)


async def _planned(app: ClockmeshApp, pilot: Any, timeout_s: float = 30.0) -> str:
    """The remediation dialog's plan once planning (a worker thread) has finished: waits
    for that evidence rather than a fixed time a loaded machine may not keep."""
    deadline = time.monotonic() + timeout_s
    while True:
        if isinstance(app.screen, RemediationScreen):
            text = str(app.screen.query_one("#plan", Static).render())
            if text != "planning…":
                return text
        assert time.monotonic() < deadline, "timed out: the plan"
        await pilot.pause(0.05)


def _store_with(tmp_path: Path, live: dict[str, Any]) -> tuple[Path, Path]:
    """A store holding the sample's flapping anomaly, and a matching topology."""
    import pyarrow as pa

    from analytics.store import layout
    from analytics.store.store_writer import StoreWriter

    store = tmp_path / "store"
    store.mkdir()
    a = live["anomalies"]["open"][0]
    row = {"opened_ns": a["opened_ns"], "closed_ns": 0, "anomaly_id": a["anomaly_id"],
           "kind": a["kind"], "score": 0.9, "src": 0, "dst": 0, "link": a["link"], "job_id": "",
           "detail": json.dumps({"summary": a["summary"]}), "updated_ns": a["opened_ns"]}  # fmt: skip
    StoreWriter(store).write_partitioned(
        "anomalies", pa.table({k: [v] for k, v in row.items()},
                              schema=layout.TABLES["anomalies"].schema), "a.parquet")  # fmt: skip
    links, n = [], 0
    for leaf in (1, 2, 3):
        for spine in (1, 2):
            links.append({"name": f"leaf{leaf}-spine{spine}", "kind": "fabric",
                          "a": {"node": f"leaf{leaf}", "address": f"198.18.128.{n}"},
                          "b": {"node": f"spine{spine}", "address": f"198.18.128.{n + 1}"}})  # fmt: skip
            n += 2
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps({"hosts": [{"name": h, "rack": r} for h, r in sample_racks().items()],
                                "links": links}))  # fmt: skip
    return store, topo


async def test_anomaly_list_and_remediation_preview_needs_inventory(tmp_path: Path) -> None:
    live = sample_live()
    store, topo = _store_with(tmp_path, live)
    app = _app(Feed(live), store=store, topology=topo)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("a")
        table = app.query_one("#anomaly-table", DataTable)
        assert table.row_count == 2
        row = [str(c) for c in table.get_row_at(0)]
        assert row[0] == "flapping_link" and row[3] == "1.6, 2.4, 4.2" and row[5] == "0.97"
        assert row[6] == "fabric_link_out leaf1-spine1"  # the recommended remediation
        assert str(table.get_row_at(1)[6]) == "spread_flows leaf2-spine2"
        assert table.has_focus  # `a` gave the list the focus: enter acts on it
        await pilot.press("enter")
        plan = await _planned(app, pilot)
        screen = app.screen
        assert isinstance(screen, RemediationScreen)
        assert "fabric_link_out leaf1-spine1" in plan and "--inventory" in plan
        assert screen.query_one("#preview", Button).disabled  # no inventory: nothing runs
        assert screen.query_one("#run", Button).disabled
        await pilot.press("escape")
        assert not isinstance(app.screen, RemediationScreen)


async def test_each_anomaly_says_its_remediation(tmp_path: Path) -> None:
    live = sample_live(anomalies=3)
    live["anomalies"]["open"][0]["link"] = "h1-2-leaf1"  # a host's access link flaps
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(sample_topology()))
    for topology, flap in ((topo, "host_drain h1-2"), (None, "needs --topology")):
        assert await _remedies(live, topology) == {"flapping_link": flap,
                                                   "contention": "spread_flows leaf2-spine2",
                                                   "roce_v1_job": "roce_v2_gid job2"}  # fmt: skip


async def _remedies(live: dict[str, Any], topology: Path | None) -> dict[str, str]:
    """The anomaly list's remediation column, by class."""
    app = _app(Feed(live), topology=topology)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("a")
        await pilot.pause(0.1)
        rows = _rows(app.query_one("#anomaly-table", DataTable))
    return {r[0]: r[6] for r in rows}


async def test_an_anomaly_with_no_remediation_says_why_in_a_few_words(tmp_path: Path) -> None:
    """A whole spine, a host's own port and a drop inside a switch: nothing to run, and the
    column says why instead of a bare "none"."""
    live = sample_live(anomalies=3)
    live["anomalies"]["open"][0]["link"] = "spine2"  # every path through it went
    live["anomalies"]["open"][1]["link"] = "h1-2-leaf1"  # contention on a host's port
    live["anomalies"]["open"][2].update(kind="silent_drop", link="", job_id="")
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(sample_topology()))
    assert await _remedies(live, topo) == {"flapping_link": "none: leaves route around it",
                                           "contention": "none: a host's own port",
                                           "silent_drop": "by hand: check the switch"}  # fmt: skip


async def test_an_anomaly_the_detector_no_longer_sees_says_so_and_when_it_closes() -> None:
    """A fault that cleared keeps its anomaly open for the book's clear_s: the summary,
    frozen at its last pass, must not read as if it were still going on."""
    live = sample_live(anomalies=3)
    live["anomalies"]["clear_s"] = 60.0
    live["anomalies"]["open"][1]["quiet_s"] = 42.3  # the contention: drained 42 s ago
    live["anomalies"]["open"][2]["quiet_s"] = 0.4  # the RoCE v1 job: seen this pass
    app = _app(Feed(live))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("a")
        await pilot.pause(0.1)
        rows = {r[0]: r[7] for r in _rows(app.query_one("#anomaly-table", DataTable))}
    assert rows["contention"].startswith("[not seen for 42 s, closes at 60 s] ")
    assert "not seen" not in rows["roce_v1_job"] and "not seen" not in rows["flapping_link"]


async def test_remediation_past_the_cap_is_refused_with_nothing_to_run(tmp_path: Path) -> None:
    live = sample_live()
    store, topo = _store_with(tmp_path, live)
    # leaf1's other uplink is already out: the anomaly's link would cut leaf1 off.
    records.write_remediation(store, records.Remediation(
        "rem-1", "", "fabric_link_out", "leaf1-spine2", [], False, "ok", "test", "{}"))  # fmt: skip
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all: {}\n")
    app = _app(Feed(live), store=store, topology=topo, inventory=inventory)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_first_anomaly(app, pilot)
        plan = str(app.screen.query_one("#plan", Static).render())
        assert "refused: blast-radius cap: leaf1 would have 2 of its 2 uplinks out" in plan
        assert app.screen.query_one("#preview", Button).disabled


async def test_a_remediation_running_from_the_other_ops_box_is_shown_and_not_started_again(
    tmp_path: Path,
) -> None:
    """Two ops boxes: the other box (ops) recorded its run of this fix in this store as
    running (playbooks/remediate.yml does, before it touches a switch): the dialog says
    so, names the run, and offers nothing to run."""
    import time as _time

    live = sample_live()
    store, topo = _store_with(tmp_path, live)
    link = live["anomalies"]["open"][0]["link"]
    records.write_remediation(store, records.Remediation(
        "rem-a1", "flapping-other", "fabric_link_out", link, [], False, "running", "alice",
        "{}", {"box": "ops"}, _time.time_ns()))  # fmt: skip
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all: {}\n")
    app = _app(Feed(live), store=store, topology=topo, inventory=inventory)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_first_anomaly(app, pilot)
        plan = str(app.screen.query_one("#plan", Static).render())
        assert f"rem-a1: fabric_link_out {link} is already running from ops box ops" in plan
        assert app.screen.query_one("#preview", Button).disabled


async def test_preview_then_cancel_runs_nothing_for_real(tmp_path: Path, monkeypatch) -> None:
    """The preview streams a real ansible-playbook run (it fails here: the inventory has no
    ops box), the run button stays disabled, and cancel closes the dialog."""
    live = sample_live()
    store, topo = _store_with(tmp_path, live)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all: {}\n")
    app = _app(Feed(live), store=store, topology=topo, inventory=inventory)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_first_anomaly(app, pilot)
        screen = app.screen
        assert not screen.query_one("#preview", Button).disabled
        await pilot.press("enter")  # the planned dialog has Preview focused
        for _ in range(100):
            await pilot.pause(0.2)
            if "the preview failed" in "\n".join(screen.query_one("#output", Log).lines):
                break
        out = "\n".join(screen.query_one("#output", Log).lines)
        assert "the inventory needs exactly one host in group opsbox" in out  # streamed
        assert "the preview failed or was refused: nothing changed" in out
        assert screen.query_one("#run", Button).disabled  # no real run without a good preview
        await pilot.click("#cancel")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, RemediationScreen)
    assert records.read_remediations(store) == []


async def test_a_tab_chosen_before_the_start_s_own_activation_was_handled_stays_chosen() -> None:
    """On a loaded machine the start's "fleet" activation can be handled after the user
    already pressed `u`: focusing the fleet's list then switched the screen back to the
    fleet (a CI run of 2026-11-27 failed on it). A superseded activation moves nothing."""
    app = _app()
    async with app.run_test(size=(100, 30)) as pilot:
        await _until_tab(pilot, "fleet")
        await pilot.pause(0.1)
        tabs = app.query_one(TabbedContent)
        stale = TabbedContent.TabActivated(tabbed_content=tabs, tab=tabs.get_tab("fleet"))
        await pilot.press("u")
        app.post_message(stale)  # the start's own activation, handled late
        await pilot.pause(0.3)
        assert tabs.active == "audit", (app.focused, tabs.active)
        assert app.focused is app.query_one("#audit-tree")


async def test_audit_tree_and_help_and_theme(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from analytics.audit.cli import audit

    store = tmp_path / "store"
    store.mkdir()
    results = {"h1-1": [{"category": "backend", "check": "mtu", "status": "fail",
                         "reason": "at least 4200", "value": "1500"}],
               "h1-2": [{"category": "backend", "check": "mtu", "status": "pass",
                         "reason": "at least 4200", "value": "9000"}]}  # fmt: skip
    CliRunner().invoke(audit, ["record", "--store", str(store), "--results", json.dumps(results)])
    app = _app(store=store)
    async with app.run_test(size=(100, 30)) as pilot:
        # The tabs take their initial tab in a refresh after mount: a key pressed before
        # that is overridden by it (a loaded machine's first frame comes late).
        await _until_tab(pilot, "fleet")
        await pilot.pause(0.1)
        await pilot.press("u")
        await _until_tab(pilot, "audit")  # a loaded machine may handle the key frames later
        assert app.query_one(TabbedContent).active == "audit", (app.focused, app.screen)
        tree = app.query_one(Tree)
        backend = tree.root.children[0]
        assert "1 pass, 1 fail, 0 skipped" in str(backend.label)
        leaves = [str(n.label) for n in backend.children[0].children]
        assert "h1-1: fail — at least 4200 [1500]" in leaves
        await pilot.press("question_mark")
        assert app.screen.query("HelpPanel")
        await pilot.press("question_mark")
        assert not app.screen.query("HelpPanel")
        dark = app.theme
        await pilot.press("t")
        assert app.theme != dark
        # The command palette reaches every tab: ctrl+p, type, enter.
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"Jobs")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.query_one(TabbedContent).active == "jobs"


@pytest.mark.parametrize("tab", ["fleet", "anomalies", "jobs"])
def test_snapshot_main_screens(snap_compare, tab: str) -> None:
    async def go(pilot) -> None:
        await pilot.pause(0.3)
        await pilot.press(tab[0])
        await _until_tab(pilot, tab)  # the tab shown, not a fixed time: a loaded machine is slow
        # ... and its content drawn: the same screen twice in a row (the clock is fixed)
        before = ""
        for _ in range(50):
            await pilot.pause(0.1)
            shot = pilot.app.export_screenshot()
            if shot == before:
                break
            before = shot

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=go)


def test_snapshot_80x24_stale(snap_compare) -> None:
    feed = Feed(sample_live())

    async def go(pilot) -> None:
        await pilot.pause(0.3)
        feed.down = True
        await pilot.pause(0.5)

    assert snap_compare(_app(feed), terminal_size=(80, 24), run_before=go)


def test_snapshot_pair_drill_down(snap_compare, tmp_path: Path) -> None:
    live, store, topo = _sample_site(tmp_path)

    async def go(pilot) -> None:
        await pilot.pause(0.3)
        pilot.app.push_screen(PairScreen("h1-2", "h2-2"))
        await pilot.pause(0.1)
        paths = pilot.app.screen.query_one("#paths", DataTable)
        await _until(pilot, lambda: paths.row_count == 4, "the pair's paths")

    app = _app(Feed(live), store=store, topology=topo)
    assert snap_compare(app, terminal_size=(100, 30), run_before=go)


def test_snapshot_host_link_flap(snap_compare) -> None:
    """The culprit first, marked; the hosts that lost probes to it affected, not failing."""

    async def go(pilot) -> None:
        await pilot.pause(0.3)

    assert snap_compare(_app(Feed(sample_host_flap())), terminal_size=(100, 30), run_before=go)


async def test_host_list_keeps_the_cursor_on_its_host_and_selects_by_key_or_click() -> None:
    from textual.app import App, ComposeResult

    chosen: list[str] = []

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield RowList([("host", 8), ("state", 6)], id="l")

        def on_row_list_selected(self, event: RowList.Selected) -> None:
            chosen.append(event.key)

    app = One()
    async with app.run_test(size=(40, 8)) as pilot:
        rows = app.query_one(RowList)
        rows.set_rows([(f"h{i}", (f"h{i}", ("ok", "green"))) for i in range(20)])
        rows.focus()
        await pilot.press("down", "down", "enter")
        assert chosen == ["h2"]
        # The fleet reorders (h2 went bad and moved first): the cursor stays on h2.
        rows.set_rows([("h2", ("h2", ("loss", "red")))]
                      + [(f"h{i}", (f"h{i}", ("ok", "green"))) for i in range(20) if i != 2])  # fmt: skip
        await pilot.press("enter")
        assert chosen[-1] == "h2" and rows.get_row_at(0) == ("h2", "loss")
        await pilot.press("end", "enter")  # the last row is scrolled into view
        assert chosen[-1] == "h19" and rows.scroll_offset.y > 0
        await pilot.press("home")
        await pilot.click(RowList, offset=(2, 3))  # header, h2, h0, h1: the third row
        assert chosen[-1] == "h1"
        lines = "\n".join(strip.text for strip in (rows.render_line(y) for y in range(4)))
        assert lines.split("\n")[0].split() == ["host", "state"] and "h2" in lines.split("\n")[1]


async def test_enter_alone_never_confirms_a_real_run() -> None:
    app = _app()
    answers: list[bool | None] = []
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.2)
        app.push_screen(ConfirmScreen("Run it for real?"), answers.append)
        await pilot.pause(0.1)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert answers == [False]
        app.push_screen(ConfirmScreen("Run it for real?"), answers.append)
        await pilot.pause(0.1)
        await pilot.press("tab", "enter")  # moving to "Yes" is a choice
        await pilot.pause(0.1)
        assert answers == [False, True]


def test_delay_an_open_contention_explains_is_affected_not_slow() -> None:
    """The sample's slow pair (h1-2 → h2-2, 42 µs corrected) and lossy pair (h1-3 → h2-3)
    leave leaf1 upwards: with a contention anomaly on leaf1-spine1 (leaf→spine) open, their
    ends are affected by it (a full queue delays and drops); the silent host stays silent,
    and the same contention in the other direction explains neither."""
    from analytics.detect import attribution
    from tui.data import fleet

    def states(direction: str | None) -> dict[str, Any]:
        live = sample_live(anomalies=0)
        if direction:
            live["anomalies"]["open"] = [{"anomaly_id": "contention-1", "kind": "contention",
                                          "link": "leaf1-spine1", "job_id": "",
                                          "evidence": {"direction": direction}}]  # fmt: skip
        attribution.annotate(live["hosts"], live["pairs"], live["anomalies"]["open"],
                             sample_racks(), attribution.link_leaves(sample_topology()))  # fmt: skip
        return {t.host: t for t in fleet(live, sample_racks()).tiles}

    before = {h: t.state for h, t in states(None).items()}
    assert [before[h] for h in ("h1-2", "h2-2", "h1-3", "h2-3", "h1-4")] == [
        "slow", "slow", "loss", "loss", "silent"]  # fmt: skip
    after = states("leaf→spine")
    assert [after[h].state for h in ("h1-2", "h2-2", "h1-3", "h2-3", "h1-4")] == [
        "affected", "affected", "affected", "affected", "silent"]  # fmt: skip
    assert after["h1-2"].because == "leaf1-spine1" and after["h2-2"].worst_peer == "h1-2"
    assert {h: t.state for h, t in states("spine→leaf").items()} == before


def test_a_leafs_hosts_are_affected_in_the_tui_and_clockmesh_live_as_soon_as_it_is_named() -> None:
    """leaf2 named 0.3 s after it went: its hosts' loss is not in the live window yet,
    but every path to them is cut. Both views call them affected by the leaf at once —
    not green beside an open "leaf2 … down now" (demo lab, 2026-12-04: ~8 s of green)."""
    from analytics.detect import attribution
    from analytics.ingest.live_cli import summarise
    from tui.data import fleet

    live = sample_live(anomalies=0)
    for p in live["pairs"]:
        p.update(loss=0.0, received=p["sent"], queue_us=None)
    for h in live["hosts"]:
        h["last_batch_age_s"] = 0.4
    cut = ["h2-1", "h2-2", "h2-3", "h2-4"]
    live["anomalies"]["open"] = [
        {
            "anomaly_id": "flapping-1",
            "kind": "flapping_link",
            "link": "leaf2",
            "job_id": "",
            "evidence": {"switch": "leaf2", "hosts_cut_off": cut},
        }
    ]
    attribution.annotate(live["hosts"], live["pairs"], live["anomalies"]["open"],
                         sample_racks(), attribution.link_leaves(sample_topology()))  # fmt: skip
    f = fleet(live, sample_racks())
    tiles = {t.host: t for t in f.tiles}
    assert sorted(h for h, t in tiles.items() if t.state == "affected") == cut
    assert tiles["h2-1"].because == "leaf2" and f.healthy == 8 and f.affected == 4
    cli = {r.host: r.status for r in summarise(live)}
    assert sorted(h for h, s in cli.items() if s == "affected") == cut
    assert {s for h, s in cli.items() if h not in cut} == {"ok"}


def test_a_clock_the_solver_is_unsure_of_shows_no_delay() -> None:
    """The sample's slow pair (h1-2 → h2-2, 42 µs corrected) is amber. If the solver says
    h2-2's clock is unsure by milliseconds (a full queue in front of its port looks like
    its clock running ahead), that 42 µs is not known: the tile shows no delay rather
    than a wrong one; the others keep theirs. The colour is the detector's verdict on the
    pair (judged on its own clocks and baseline), not this number: it stays."""
    from tui.data import fleet

    live = sample_live(anomalies=0)
    before = {t.host: t for t in fleet(live, sample_racks()).tiles}
    assert before["h2-2"].state == "slow" and before["h2-2"].worst_owd_us is not None
    for h in live["clock"]["hosts"]:
        if h["host"] == "h2-2":
            h["uncertainty_ns"] = 2_400_000.0
    after = {t.host: t for t in fleet(live, sample_racks()).tiles}
    assert after["h2-2"].worst_owd_us is None and after["h2-2"].state == "slow"
    assert after["h3-1"].worst_owd_us == before["h3-1"].worst_owd_us


def test_amber_is_the_detectors_verdict_not_a_fixed_delay() -> None:
    """A healthy lab pair shows ~10 µs corrected (three namespaces' softirqs), a healthy
    fabric's a few µs: no fixed line is right on both. On the demo (2026-12-02) a 5-µs
    line painted 15 of 16 healthy NICs amber while ``clockmesh live`` said 16/16 healthy.
    Every pair at 10 µs and none judged slow: all green, in the TUI and ``clockmesh live``
    alike; one pair judged slow (its ``queue_us``): its two ends amber, saying the queue,
    and ``slow`` in ``clockmesh live`` too; ``--amber-us`` above that queue: green."""
    from analytics.ingest.live_cli import render, summarise
    from tui.data import Thresholds, fleet

    live = sample_live(anomalies=0)
    offsets = {h["host"]: h["offset_ns"] for h in live["clock"]["hosts"]}
    for p in live["pairs"]:
        p.update(owd_raw_p50_us=10.0 + (offsets[p["dst"]] - offsets[p["src"]]) / 1e3,
                 loss=0.0, received=p["sent"], queue_us=None)  # fmt: skip
    for h in live["hosts"]:
        h["last_batch_age_s"] = 0.4
    f = fleet(live, sample_racks())
    assert f.healthy == 12 and {t.worst_owd_us for t in f.tiles} == {10.0}
    assert {r.status for r in summarise(live)} == {"ok"}
    slow = live["pairs"][5]
    slow["queue_us"] = 61.0
    tiles = {t.host: t for t in fleet(live, sample_racks()).tiles}
    ends = {slow["src"], slow["dst"]}
    assert {h for h, t in tiles.items() if t.state == "slow"} == ends
    src = tiles[slow["src"]]
    assert src.because == "queue 61 µs" and src.worst_peer == slow["dst"]
    rows = {r.host: r for r in summarise(live)}
    assert {h for h, r in rows.items() if r.status == "slow"} == ends
    text = render(list(rows.values()), live, "http://x")
    assert f"queued 61 µs beyond its healthy delay (with {slow['dst']})" in text
    assert "10/12 hosts healthy, 2 failing" in text
    assert fleet(live, sample_racks(), Thresholds(amber_us=100.0)).healthy == 12
    slow["queue_us"] = 46_614.0  # a millisecond queue reads in ms
    assert {t.because for t in fleet(live, sample_racks()).tiles} == {"", "queue 46.6 ms"}


def test_a_delay_is_shown_only_when_it_is_three_times_its_clocks_uncertainty() -> None:
    """The lab's full host port: 29 ms seen with clocks ±20 ms (the solver moved that
    host's clock by about that much) is not shown; a congested link's 5 ms with ±50 µs
    clocks is; a few µs with sub-µs clocks is."""
    from tui.data import corrected

    offs = {"a": 0.0, "b": 0.0}
    assert corrected(29_000.0, "a", "b", offs, {"a": 20e6, "b": 1.9e6}) is None
    assert corrected(5_000.0, "a", "b", offs, {"a": 50e3, "b": 10e3}) == 5_000.0
    assert corrected(4.0, "a", "b", offs, {"a": 300.0, "b": 200.0}) == 4.0
    assert corrected(4.0, "a", "b", offs, {"a": 6e3, "b": 0.0}) is None


def test_the_tui_and_clockmesh_live_judge_loss_and_freshness_alike() -> None:
    """Same answer, same verdicts. A fleet of 13,000 hosts is advised to ship every ~30 s
    (analytics/ingest/pace.py): a host last heard 20 s ago is healthy there, and stale only
    past 2.5 intervals — not after a fixed 5 s (CLI) or 10 s (TUI) that would grey the
    whole fleet. Loss is the host's share of its probes in either direction, over 1 %,
    in both: one pair losing 2 % of a host's probes to 4 peers is not a lossy NIC."""
    from analytics.detect import attribution
    from analytics.ingest.live_cli import summarise
    from tui.data import fleet

    live = sample_live(anomalies=0)
    for p in live["pairs"]:
        p.update(loss=0.0, received=p["sent"], queue_us=None)
    for h in live["hosts"]:
        h["last_batch_age_s"] = 20.0
    live["ingest"] = {"advised_roll_s": 30.0}
    attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {},
                         stale_s=attribution.stale_after(30.0))  # fmt: skip

    def verdicts() -> tuple[dict[str, str], dict[str, str]]:
        tui = {t.host: t.state for t in fleet(live, sample_racks()).tiles}
        return tui, {r.host: r.status for r in summarise(live)}

    tui, cli = verdicts()
    assert set(tui.values()) == {"ok"} and set(cli.values()) == {"ok"}
    live["hosts"][0]["last_batch_age_s"] = 80.0  # past 2.5 × 30 s
    tui, cli = verdicts()
    grey = {live["hosts"][0]["host"]}
    assert {h for h, s in tui.items() if s == "silent"} == grey
    assert {h for h, s in cli.items() if s == "stale"} == grey
    live["ingest"] = {"advised_roll_s": 1.0}  # a small fleet: 5 s
    for h in live["hosts"]:
        h["last_batch_age_s"] = 0.4
    live["hosts"][1]["last_batch_age_s"] = 6.0
    tui, cli = verdicts()
    grey = {live["hosts"][1]["host"]}
    assert {h for h, s in tui.items() if s == "silent"} == grey
    assert {h for h, s in cli.items() if s == "stale"} == grey
    for h in live["hosts"]:
        h["last_batch_age_s"] = 0.4
    one = live["pairs"][0]  # 2 % of one of its 4 pairs: 0.5 % of its hosts' probes
    one.update(received=int(one["sent"] * 0.98), loss=0.02)
    attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
    tui, cli = verdicts()
    assert set(tui.values()) == {"ok"} and set(cli.values()) == {"ok"}
    one.update(received=0, loss=1.0)  # all of it: that pair's share of each end is over 1 %
    attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
    tui, cli = verdicts()
    assert {h for h, s in tui.items() if s == "loss"} == {one["src"], one["dst"]}
    assert {h for h, s in cli.items() if s == "lossy"} == {one["src"], one["dst"]}


def test_a_host_that_ships_but_sends_no_probes_is_grey_in_the_tui_as_in_clockmesh_live() -> None:
    """A collector whose batches arrive but whose prober sends nothing (its peers' probes
    to it all arrive): ``clockmesh live`` says ``silent``. The TUI painted it green
    ("ok", counted healthy) — a host not measured at all. Now grey, "sends no probes",
    and counted failing in both."""
    from analytics.detect import attribution
    from analytics.ingest.live_cli import render, summarise
    from tui.data import fleet

    live = sample_live(anomalies=0)
    for h in live["hosts"]:
        h["last_batch_age_s"] = 0.4
    quiet = live["hosts"][2]["host"]
    live["pairs"] = [p for p in live["pairs"] if p["src"] != quiet]
    for p in live["pairs"]:
        p.update(loss=0.0, received=p["sent"], queue_us=None)
    attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
    f = fleet(live, sample_racks())
    tiles = {t.host: t for t in f.tiles}
    assert tiles[quiet].state == "silent" and tiles[quiet].because == "sends no probes"
    assert {t.state for h, t in tiles.items() if h != quiet} == {"ok"}
    rows = {r.host: r for r in summarise(live)}
    assert rows[quiet].status == "silent"
    assert {r.status for h, r in rows.items() if h != quiet} == {"ok"}
    text = render(list(rows.values()), live, "http://x")
    assert f.failing == 1 and "11/12 hosts healthy, 1 failing" in text
    (line,) = [x for x in text.splitlines() if x.startswith(quiet)]
    assert line.endswith("sends no probes (its batches arrive)"), line


def tiles_state(view: Any, host: str) -> str:
    return next(t.state for t in view.tiles if t.host == host)


def _fresh_healthy_live() -> dict[str, Any]:
    """The sample ``/v1/live`` answer with every host's batch and probes 0.4 s old and
    no pair losing or queued."""
    live = sample_live(anomalies=0)
    for h in live["hosts"]:
        h["last_batch_age_s"], h["last_probe_age_s"] = 0.4, 0.4
    for p in live["pairs"]:
        p.update(loss=0.0, received=p["sent"], queue_us=None)
    return live


def test_a_host_whose_probes_stopped_is_grey_before_the_live_window_forgets_them() -> None:
    """nftables dropping all of a host's probes out of its NIC: the sends fail, so no probe
    is recorded and none is lost, while its batches still arrive. Its probes of the last
    minute kept it ``ok`` in ``clockmesh live`` and green in the TUI for ~77 s. Now both
    call it silent once no batch has carried its probes for the stale time."""
    from analytics.detect import attribution
    from analytics.ingest.live_cli import render, summarise
    from tui.data import fleet

    live = _fresh_healthy_live()
    quiet = live["hosts"][2]
    quiet["last_probe_age_s"] = 12.3  # its earlier probes are still in the window
    attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
    assert quiet["sent"] > 0 and quiet["verdict"] == "silent"
    tiles = {t.host: t for t in fleet(live, sample_racks()).tiles}
    assert tiles[quiet["host"]].state == "silent"
    assert tiles[quiet["host"]].because == "no probes for 12 s"
    assert {t.state for h, t in tiles.items() if h != quiet["host"]} == {"ok"}
    rows = summarise(live)
    text = render(rows, live, "http://x")
    (line,) = [x for x in text.splitlines() if x.startswith(quiet["host"])]
    assert " silent " in line and line.endswith("has sent no probes for 12 s (its batches arrive)")
    quiet["last_probe_age_s"] = 3.0  # within the stale time: a late batch, not a silence
    attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
    assert quiet["verdict"] == "ok"
    assert {r.status for r in summarise(live)} == {"ok"}
    # its collector restarted 1.2 s ago (a deploy): the new run has shipped no probe
    # yet, and the old run's last were 12.3 s ago — a restart, not a silence; once the
    # new run has gone as long without probes, it is silent again
    for run_age, state in ((1.2, "ok"), (8.0, "silent")):
        quiet["last_probe_age_s"], quiet["collector_run_age_s"] = 12.3, run_age
        attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
        assert quiet["verdict"] == state
        assert tiles_state(fleet(live, sample_racks()), quiet["host"]) == state
        assert {r.status for r in summarise(live) if r.host == quiet["host"]} == {state}


def test_a_host_shipping_every_10_s_by_its_own_setting_is_stale_only_after_25_s() -> None:
    """A collector set to ship less often than the ops box advises (its ``spool.roll_s``
    10 s; ``/v1/live``'s host ``roll_s``): 8 s after its last batch it is on time, not
    stale — in ``/v1/live``, ``clockmesh live`` and the TUI alike — and 26 s after, stale.
    Only a ``silent_s`` set by hand (``clockmesh tui --silent-s``) holds for every host."""
    from analytics.detect import attribution
    from analytics.ingest.live_cli import summarise
    from tui.data import Thresholds, fleet

    live = _fresh_healthy_live()
    slow = live["hosts"][1]
    slow["roll_s"] = 10.0
    for age, verdict, tile in ((8.0, "ok", "ok"), (26.0, "stale", "silent")):
        slow["last_batch_age_s"] = slow["last_probe_age_s"] = age
        attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
        assert slow["verdict"] == verdict, age
        assert {r.status for r in summarise(live) if r.host == slow["host"]} == {verdict}
        assert tiles_state(fleet(live, sample_racks()), slow["host"]) == tile, age
    slow["last_batch_age_s"] = slow["last_probe_age_s"] = 8.0
    by_hand = fleet(live, sample_racks(), Thresholds(silent_s=5.0))
    assert tiles_state(by_hand, slow["host"]) == "silent"
    # a host whose collector does not say (older than the header field): the fleet's 5 s
    del slow["roll_s"]
    attribution.annotate(live["hosts"], live["pairs"], [], sample_racks(), {})
    assert slow["verdict"] == "stale"
