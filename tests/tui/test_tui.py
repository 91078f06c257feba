"""The TUI driven by Textual's pilot: every screen, the remediation flow (refusal, the cap,
cancel), a daemon that stops mid-session, an empty store, an 80×24 terminal; snapshots of
the main screens at a fixed size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Button, DataTable, Log, Static, TabbedContent, Tree

from analytics.remediate import records
from tests.tui.sample import T0, sample_live, sample_racks
from tui.app import ClockmeshApp, HostScreen, RemediationScreen

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
        table = app.query_one("#hosts", DataTable)
        assert table.row_count == 12
        assert str(table.get_row_at(0)[2]) != "ok"  # problems first
        await pilot.press("slash")
        await pilot.press(*"leaf2")
        await pilot.pause(0.1)
        assert table.row_count == 4 and "leaf1" not in _text(app, "#tiles")
        app.query_one("#filter").value = "loss"
        await pilot.pause(0.1)
        assert {str(table.get_row_at(i)[1]) for i in range(table.row_count)} == {"h1-3", "h2-3"}


async def test_drill_down_shows_pairs_clock_and_says_history_needs_a_store() -> None:
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        app.query_one("#filter").value = "h1-2"
        await pilot.pause(0.1)
        app.query_one("#hosts", DataTable).focus()
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert isinstance(app.screen, HostScreen)
        head = str(app.screen.query_one("#host-head", Static).render())
        assert "h1-2" in head and "slow" in head and "solved" in head
        peers = app.screen.query_one("#peers", DataTable)
        corrected = [peers.get_row_at(i)[6] for i in range(peers.row_count)]
        assert "42.0" in corrected  # raw minus the clock offsets: the queue, not the skew
        assert "no store" in str(app.screen.query_one("#hist-label").render())
        await pilot.press("escape")
        assert not isinstance(app.screen, HostScreen)


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
        assert app.query_one("#hosts", DataTable).row_count == 12
        feed.down = False
        await pilot.pause(0.5)
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
    app.query_one("#anomaly-table", DataTable).focus()
    await pilot.press("enter")
    await pilot.pause(0.5)


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
        table.focus()
        await pilot.press("enter")
        await pilot.pause(0.5)
        screen = app.screen
        assert isinstance(screen, RemediationScreen)
        plan = str(screen.query_one("#plan", Static).render())
        assert "fabric_link_out leaf1-spine1" in plan and "--inventory" in plan
        assert screen.query_one("#preview", Button).disabled  # no inventory: nothing runs
        assert screen.query_one("#run", Button).disabled
        await pilot.press("escape")
        assert not isinstance(app.screen, RemediationScreen)


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
        await pilot.click("#preview")
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
        await pilot.press("u")
        assert app.query_one(TabbedContent).active == "audit"
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


@pytest.mark.parametrize("tab", ["fleet", "anomalies"])
def test_snapshot_main_screens(snap_compare, tab: str) -> None:
    async def go(pilot) -> None:
        await pilot.pause(0.3)
        await pilot.press(tab[0])
        await pilot.pause(0.1)

    assert snap_compare(_app(), terminal_size=(100, 30), run_before=go)


def test_snapshot_80x24_stale(snap_compare) -> None:
    feed = Feed(sample_live())

    async def go(pilot) -> None:
        await pilot.pause(0.3)
        feed.down = True
        await pilot.pause(0.5)

    assert snap_compare(_app(feed), terminal_size=(80, 24), run_before=go)
