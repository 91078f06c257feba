"""The TUI and `clockmesh live` show a silent drop: its class, its link (or switch) and the
remediation it calls for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from textual.widgets import DataTable

from analytics.ingest.live_cli import render
from tests.tui.sample import T0, sample_live, sample_topology
from tests.tui.test_tui import Feed, _app, _rows


def _silent(link: str, switch: str = "spine2") -> dict[str, Any]:
    return {"anomaly_id": "silent-00000000aa", "kind": "silent_drop", "link": link,
            "job_id": "", "score": 0.9, "opened_ns": T0 - 30 * 10**9, "last_seen_ns": T0,
            "closed_ns": 0, "summary": f"{switch} towards h3-1 silently drops traffic",
            "evidence": {"switch": switch, "links": [link] if link else [],
                         "destinations": ["h3-1"], "confidence": 1.0}}  # fmt: skip


async def test_the_anomaly_list_shows_a_silent_drop_with_its_link_and_remediation(
    tmp_path: Path,
) -> None:
    live = sample_live(anomalies=1)
    live["anomalies"]["open"] = [_silent("leaf3-spine2")]
    live["anomalies"]["open_by_kind"] = {"silent_drop": 1}
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(sample_topology()))
    app = _app(Feed(live), topology=topo)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("a")
        await pilot.pause(0.1)
        (row,) = _rows(app.query_one("#anomaly-table", DataTable))
        assert row[0] == "silent_drop" and row[1] == "leaf3-spine2", row
        assert row[6] == "fabric_link_out leaf3-spine2", row


def test_clockmesh_live_names_the_link_or_the_switch() -> None:
    live = sample_live(anomalies=1)
    live["anomalies"]["open"] = [_silent("leaf3-spine2"), _silent("", "spine1")]
    text = render([], live, "http://x")
    assert "silent_drop    leaf3-spine2" in text
    assert "silent_drop    spine1" in text
