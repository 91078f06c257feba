"""Has a link been stable long enough to put back what a remediation took out?

A flapping link that was routed around, or the host behind it that was drained, goes back
into service only after the link has stayed up, without a single carrier loss, for a
configured time (``clockmesh remediate restore --after``; the playbooks'
``restore_after_s``). Two sources, each the one that can see the link:

* a leaf–spine link: both switches' own interface records (FRR's ``show interface IF
  json``: operational status, ``lastLinkDown``/``lastLinkUp`` in the switch's local time,
  read next to the switch's clock). A link out of service carries no probes, so the hosts
  cannot vouch for it; its ends can.
* a host's access link: the host's own counters in the store (``operstate``,
  ``carrier_down_count``, ``carrier_changes``, ``link_downed``), which its collector
  keeps shipping while the host is drained. Stale counters are not proof: a host whose
  collector went quiet is "cannot tell", never stable.
* a host drained for a silent drop on its way out: never, by itself. Its link never went
  down, so its carrier proves nothing, and the detector no longer judges a drained host's
  way out (the drain dealt with it): it goes back by hand once its optic, cable or NIC is
  changed (:func:`drop_not_judged`).
* a leaf–spine link taken out for a silent drop: never, by itself, either. Its link never
  went down, so its switches' records prove nothing, and out of service it carries no
  probes that could show the drop has gone (:func:`fabric_drop_not_judged`).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from analytics.store.catalog import connect_views
from analytics.store.layout import has_files
from collector.records import host_id

# The host counters that count a carrier loss (netdev and RDMA port), and operstate "up".
LOSS_COUNTERS = ("carrier_down_count", "carrier_changes", "link_downed")
OPER_UP = 6  # RFC 2863 ifOperStatus up, as the collector ships it
FRESH_S = 30.0  # the newest counter sample must be this recent to vouch for a host link
_FRR_TIME = "%Y/%m/%d %H:%M:%S.%f"


@dataclass
class Reading:
    link: str
    stable: bool
    stable_for_s: float | None  # since the last change seen; None: never changed / unknown
    source: str
    why: str
    ends: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def drop_not_judged(link: str, host: str, anomaly_id: str) -> Reading:
    """A host drained for a silent drop on its way out: never stable by itself."""
    why = (f"{link}: {host} was drained for {anomaly_id} (silent_drop: what it sends is "
           "dropped, its link up); its carrier cannot show the drop has gone: undo it by "
           f"hand once {link}'s optic, cable or {host}'s NIC is changed")  # fmt: skip
    return _held_for_drop(link, anomaly_id, why)


def fabric_drop_not_judged(link: str, anomaly_id: str) -> Reading:
    """A leaf–spine link taken out for a silent drop: never stable by itself."""
    why = (f"{link} was taken out for {anomaly_id} (silent_drop: traffic crossing it is "
           "dropped, its link up); neither its carrier nor its switches' records can show "
           "the drop has gone, and out of service it carries no probes: undo it by hand "
           f"once {link}'s optics, cable or switch ports are changed")  # fmt: skip
    return _held_for_drop(link, anomaly_id, why)


def _held_for_drop(link: str, anomaly_id: str, why: str) -> Reading:
    """Not stable, never: what was taken out for silent drop ``anomaly_id`` goes back by
    hand (``why`` says when)."""
    return Reading(link, False, None, f"anomaly {anomaly_id} (silent_drop)", why)


def _frr_time(text: str) -> dt.datetime:
    """FRR's ``2026/11/26 00:06:26.34`` (local time, centiseconds)."""
    return dt.datetime.strptime(text.strip(), _FRR_TIME)


def switch_end(reading: dict[str, Any]) -> dict[str, Any]:
    """One switch end from the ``clockmesh_link_state`` role's raw reading: ``switch``,
    ``interface``, ``now`` (the switch's clock, FRR's format) and ``show`` (the JSON
    vtysh printed). Raises ValueError naming the switch and what is missing."""
    name = f"{reading.get('switch', '?')}:{reading.get('interface', '?')}"
    show = reading.get("show")
    if not isinstance(show, dict) or reading.get("interface") not in show:
        raise ValueError(f"{name}: the switch reported no such interface")
    iface = show[reading["interface"]]
    try:
        now = _frr_time(str(reading["now"]))
        changes = [_frr_time(iface[k]) for k in ("lastLinkDown", "lastLinkUp") if iface.get(k)]
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{name}: unreadable time in the interface record ({exc})") from None
    last = max(changes) if changes else None
    return {
        "switch": reading.get("switch"),
        "interface": reading["interface"],
        "up": iface.get("operationalStatus") == "up",
        "link_downs": int(iface.get("linkDowns", 0)),
        "last_change": last.isoformat(sep=" ") if last else "",
        "stable_for_s": round((now - last).total_seconds(), 2) if last else None,
    }


def fabric_link(link: str, readings: list[dict[str, Any]], after_s: float) -> Reading:
    """A leaf–spine link from its switches' readings: stable when every end is up and
    none changed state within ``after_s``."""
    ends = [switch_end(r) for r in readings]
    if len(ends) < 2:
        got = ", ".join(e["switch"] for e in ends) or "none"
        return Reading(link, False, None, "switches", f"{link}: read {got}; both ends are needed")
    down = [f"{e['switch']}:{e['interface']}" for e in ends if not e["up"]]
    spans = [e["stable_for_s"] for e in ends if e["stable_for_s"] is not None]
    least = min(spans) if spans else None
    if down:
        why = f"{link} is down now on {', '.join(down)}"
        return Reading(link, False, least, "switches", why, ends)
    if least is not None and least < after_s:
        last = min(ends, key=lambda e: e["stable_for_s"] if e["stable_for_s"] is not None else 1e18)
        why = (
            f"{link} last changed state {least:.0f} s ago on {last['switch']} "
            f"({last['link_downs']} link downs there); restore needs {after_s:.0f} s stable"
        )
        return Reading(link, False, least, "switches", why, ends)
    since = "never went down" if least is None else f"stable for {least:.0f} s"
    return Reading(link, True, least, "switches", f"{link}: up on both ends, {since}", ends)


def host_link(
    store: Path, link: str, host: str, after_s: float, now_ns: int | None = None
) -> Reading:
    """A host's access link from its own counters in the store over the last ``after_s``."""
    now = time.time_ns() if now_ns is None else now_ns
    since = now - int(after_s * 1e9)
    if not has_files(store, "counter"):
        return Reading(link, False, None, "host counters", f"{store}: no counters stored yet")
    names = ", ".join(f"'{n}'" for n in (*LOSS_COUNTERS, "operstate"))
    try:
        con = connect_views(store, only=["counter"])
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    try:
        row = con.execute(
            f"""SELECT max(ts_ns), min(ts_ns),
                       max(ts_ns) FILTER (WHERE name <> 'operstate' AND delta > 0),
                       arg_max(value, ts_ns) FILTER (WHERE name = 'operstate'),
                       count(*) FILTER (WHERE name = 'operstate' AND value <> {OPER_UP})
                FROM counter WHERE host = ? AND ts_ns >= ? AND name IN ({names})""",
            [host_id(host), since],
        ).fetchone()
    except duckdb.Error as exc:
        raise ValueError(f"{store}/counter: unreadable ({exc})") from None
    finally:
        con.close()
    newest, oldest, last_loss, oper, down_samples = row or (None, None, None, None, 0)
    src = "host counters"
    if newest is None:
        why = f"{host}: no counters in the last {after_s:.0f} s: cannot tell {link} is stable"
        return Reading(link, False, None, src, why)
    age = (now - newest) / 1e9
    if age > FRESH_S:
        why = f"{host}: newest counters are {age:.0f} s old: cannot tell {link} is stable"
        return Reading(link, False, None, src, why)
    covered = (now - oldest) / 1e9
    ends = [{"host": host, "operstate": oper, "newest_s_ago": round(age, 2),
             "covered_s": round(covered, 1)}]  # fmt: skip
    if oper != OPER_UP or down_samples:
        return Reading(link, False, None, src, f"{link}: {host} saw its link down", ends)
    if last_loss is not None:
        ago = (now - last_loss) / 1e9
        why = f"{link}: {host} lost carrier {ago:.0f} s ago; restore needs {after_s:.0f} s stable"
        return Reading(link, False, ago, src, why, ends)
    if covered < after_s - FRESH_S:
        why = f"{link}: {host}'s counters cover {covered:.0f} s of the {after_s:.0f} s asked"
        return Reading(link, False, covered, src, why, ends)
    return Reading(link, True, covered, src, f"{link}: {host} up, no carrier loss in "
                   f"{covered:.0f} s", ends)  # fmt: skip


def access_link(topology: dict[str, Any], host: str) -> dict[str, Any]:
    """The host's access link (its name and both ends) from the topology."""
    for lk in topology["links"]:
        if lk.get("kind") == "access" and host in (lk["a"]["node"], lk["b"]["node"]):
            return lk
    raise ValueError(f"host {host!r}: no access link in the topology")
