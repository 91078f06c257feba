"""Restore once stable: the judgement a link taken out (switch readings) or a drained host
(its counters in the store) must pass before its undo runs, and the CLI guard around it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from analytics.remediate import records, stable
from analytics.remediate.cli import remediate
from analytics.store import layout
from analytics.store.store_writer import StoreWriter
from collector.records import host_id
from tests.unit.test_remediate_plan import _topology_racks

S = 1_000_000_000
NOW = dt.datetime(2026, 11, 26, 3, 0, 0)


def _frr(t: dt.datetime) -> str:
    return t.strftime("%Y/%m/%d %H:%M:%S.%f")[:22]


def _reading(switch: str, iface: str, last_down_s: float | None, up: bool = True,
             last_up_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    rec: dict[str, Any] = {"operationalStatus": "up" if up else "down", "linkDowns": 3}
    if last_down_s is not None:
        rec["lastLinkDown"] = _frr(NOW - dt.timedelta(seconds=last_down_s))
        up_s = last_down_s - 2 if last_up_s is None else last_up_s
        rec["lastLinkUp"] = _frr(NOW - dt.timedelta(seconds=up_s))
    return {"switch": switch, "interface": iface, "now": _frr(NOW), "show": {iface: rec}}


def test_a_link_both_ends_quiet_for_long_enough_is_stable() -> None:
    r = stable.fabric_link("leaf1-spine2", [_reading("leaf1", "spine2", 900),
                                            _reading("spine2", "leaf1", 905)], 600)  # fmt: skip
    assert r.stable and 890 <= r.stable_for_s <= 900, r
    # an interface that never went down since the switch started: stable too
    r = stable.fabric_link("leaf1-spine2", [_reading("leaf1", "spine2", None),
                                            _reading("spine2", "leaf1", None)], 600)  # fmt: skip
    assert r.stable and "never went down" in r.why


def test_a_recent_change_on_either_end_or_a_down_end_is_not_stable() -> None:
    r = stable.fabric_link("leaf1-spine2", [_reading("leaf1", "spine2", 900),
                                            _reading("spine2", "leaf1", 40)], 600)  # fmt: skip
    assert not r.stable
    assert r.why.startswith("leaf1-spine2 last changed state 38 s ago on spine2"), r.why
    assert "restore needs 600 s stable" in r.why
    r = stable.fabric_link("leaf1-spine2", [_reading("leaf1", "spine2", 900, up=False),
                                            _reading("spine2", "leaf1", 900)], 600)  # fmt: skip
    assert not r.stable and r.why == "leaf1-spine2 is down now on leaf1:spine2"
    r = stable.fabric_link("leaf1-spine2", [_reading("leaf1", "spine2", 900)], 600)
    assert not r.stable and "both ends are needed" in r.why


def test_an_unreadable_reading_names_the_switch() -> None:
    bad = _reading("leaf1", "spine2", 900)
    bad["show"]["spine2"]["lastLinkDown"] = "yesterday"
    with pytest.raises(ValueError, match=r"leaf1:spine2: unreadable time"):
        stable.fabric_link("leaf1-spine2", [bad, _reading("spine2", "leaf1", 900)], 600)
    missing = {**_reading("leaf1", "spine2", 900), "show": {}}
    with pytest.raises(ValueError, match=r"leaf1:spine2: the switch reported no such interface"):
        stable.fabric_link("leaf1-spine2", [missing, _reading("spine2", "leaf1", 900)], 600)


def _counters(store: Path, host: str, now_ns: int, span_s: int, loss_at_s: list[int],
              down_at_s: list[int] = ()) -> None:  # fmt: skip
    """One sample a second for span_s seconds up to now_ns: operstate and the carrier
    counters as a collector ships them (delta: the change since its last sample)."""
    rows: dict[str, list[Any]] = {k: [] for k in
                                  ("ts_ns", "host", "device", "port", "source", "name", "value",
                                   "delta")}  # fmt: skip
    downs = 0
    for i in range(span_s):
        ago = span_s - 1 - i
        ts = now_ns - ago * S
        lost = 1 if ago in loss_at_s else 0
        downs += lost
        for name, value, delta in (("operstate", 2 if ago in down_at_s else 6, 0),
                                   ("carrier_down_count", downs, lost)):  # fmt: skip
            for k, v in zip(rows, (ts, host_id(host), "bk0", 0, 0, name, value, delta),
                            strict=True):  # fmt: skip
                rows[k].append(v)
    table = pa.table(rows, schema=layout.TABLES["counter"].schema)
    StoreWriter(store).write_partitioned("counter", table, f"{host}-{now_ns}.parquet")


def test_a_host_link_is_judged_from_its_own_counters_in_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    now = 1_795_000_000 * S
    r = stable.host_link(store, "h1-1-leaf1", "h1-1", 60, now_ns=now)
    assert not r.stable and "no counters stored yet" in r.why
    _counters(store, "h1-1", now, 120, loss_at_s=[100])  # a flap 100 s ago
    _counters(store, "h1-2", now, 120, loss_at_s=[10])  # its neighbour flapped: not h1-1
    assert stable.host_link(store, "h1-1-leaf1", "h1-1", 60, now_ns=now).stable
    r = stable.host_link(store, "h1-1-leaf1", "h1-1", 110, now_ns=now)
    assert not r.stable and r.why == (
        "h1-1-leaf1: h1-1 lost carrier 100 s ago; restore needs 110 s stable"
    )
    r = stable.host_link(store, "h1-2-leaf1", "h1-2", 60, now_ns=now)
    assert not r.stable and "h1-2 lost carrier 10 s ago" in r.why
    # a collector that went quiet vouches for nothing
    r = stable.host_link(store, "h1-1-leaf1", "h1-1", 60, now_ns=now + 45 * S)
    assert not r.stable and "newest counters are 45 s old: cannot tell" in r.why
    # down in a sample of the window, with no carrier count (a sub-sample read): not stable
    _counters(store, "h2-1", now, 120, loss_at_s=[], down_at_s=[30])
    r = stable.host_link(store, "h2-1-leaf2", "h2-1", 60, now_ns=now)
    assert not r.stable and "saw its link down" in r.why


def _guard_site(tmp_path: Path, *rows: tuple[str, str, str, str]) -> tuple[Path, Path]:
    """(store, topology) of an ops box that ran these remediations, each (remediation id,
    anomaly id, action, target)."""
    store = tmp_path / "store"
    store.mkdir()
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(_topology_racks()))
    for rid, anomaly, action, target in rows:
        targets = [target] if action == "host_drain" else []
        records.write_remediation(store, records.Remediation(
            rid, anomaly, action, target, targets, False, "ok", "test", "{}"))  # fmt: skip
    return store, topo


def test_the_guard_cli_judges_a_remediation_and_refuses_other_actions(tmp_path: Path) -> None:
    store, topo = _guard_site(tmp_path, ("rem-link", "a", "fabric_link_out", "leaf1-spine2"),
                              ("rem-gid", "a", "roce_v2_gid", "job7"))  # fmt: skip

    def cli(*argv: str) -> Any:
        return CliRunner().invoke(remediate, ["stable", "--store", str(store), "--topology",
                                              str(topo), *argv])  # fmt: skip

    quiet = [_reading("leaf1", "spine2", 10**5), _reading("spine2", "leaf1", 10**5)]
    ok = cli("--undo", "rem-link", "--after", "600", "--readings", json.dumps(quiet))
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["stable"] is True
    flapping = [_reading("leaf1", "spine2", 3), _reading("spine2", "leaf1", 10**5)]
    no = cli("--undo", "rem-link", "--after", "600", "--readings", json.dumps(flapping))
    assert no.exit_code == 1
    assert "Error: not stable: leaf1-spine2 last changed state 1 s ago on leaf1" in no.output
    bad = cli("--undo", "rem-link", "--after", "600", "--readings", "{}")
    assert bad.exit_code == 1 and "not stable: cannot tell: --readings: expected" in bad.output
    other = cli("--undo", "rem-gid", "--after", "600")
    assert other.exit_code == 1
    assert "refused: rem-gid (roce_v2_gid): only a link taken out or a host drained" in (
        other.output
    )


def test_a_host_drained_for_a_silent_drop_is_never_restored_by_its_carrier(
    tmp_path: Path,
) -> None:
    """h2-1 drained because its way out dropped what it sent: its link never went down, so
    its carrier, stable for hours, proves nothing — and the detector no longer judges a
    drained host's way out. The guard holds it out, saying to undo it by hand."""
    from tests.unit.test_detect_silent_drop import _stored

    store, topo = _guard_site(tmp_path, ("rem-drain", "silent-h21", "host_drain", "h2-1"))
    _stored(store, "silent-h21", "h2-1-leaf2", [], host="h2-1", direction="host→leaf")
    now = 1_795_000_000 * S
    _counters(store, "h2-1", now, 700, loss_at_s=[])
    assert stable.host_link(store, "h2-1-leaf2", "h2-1", 600, now_ns=now).stable  # its carrier
    no = CliRunner().invoke(remediate, ["stable", "--store", str(store), "--topology", str(topo),
                                        "--undo", "rem-drain", "--after", "600"])  # fmt: skip
    assert no.exit_code == 1
    assert ("not stable: h2-1-leaf2: h2-1 was drained for silent-h21 (silent_drop: what it "
            "sends is dropped, its link up)") in no.output, no.output  # fmt: skip
    assert "undo it by hand once h2-1-leaf2's optic, cable or h2-1's NIC is changed" in (
        no.output.replace("\n", " ")
    )


def test_a_fabric_link_taken_out_for_a_silent_drop_is_never_restored_by_its_switches(
    tmp_path: Path,
) -> None:
    """leaf3-spine2 taken out because traffic crossing it was dropped, its link up: its
    switches' records, quiet for a day, prove nothing, and out of service it carries no
    probes. The guard holds it out, saying to undo it by hand — while a link taken out for
    a flap is still put back on the same quiet readings."""
    from tests.unit.test_detect_silent_drop import _stored

    store, topo = _guard_site(tmp_path, ("rem-drop", "silent-l3s2", "fabric_link_out",
                                         "leaf3-spine2"),
                              ("rem-flap", "flap-l1s2", "fabric_link_out", "leaf1-spine2"))  # fmt: skip
    _stored(store, "silent-l3s2", "leaf3-spine2", ["leaf3-spine2"])

    def cli(rid: str, a: str, b: str) -> Any:
        quiet = [_reading(a, b, 86_400), _reading(b, a, 86_400)]
        return CliRunner().invoke(remediate, [
            "stable", "--store", str(store), "--topology", str(topo), "--undo", rid,
            "--after", "600", "--readings", json.dumps(quiet)])  # fmt: skip

    no = cli("rem-drop", "leaf3", "spine2")
    assert no.exit_code == 1
    said = no.output.replace("\n", " ")
    assert ("not stable: leaf3-spine2 was taken out for silent-l3s2 (silent_drop: traffic "
            "crossing it is dropped, its link up)") in said, no.output  # fmt: skip
    assert "undo it by hand once leaf3-spine2's optics, cable or switch ports are changed" in said
    ok = cli("rem-flap", "leaf1", "spine2")
    assert ok.exit_code == 0 and json.loads(ok.output)["stable"] is True, ok.output
