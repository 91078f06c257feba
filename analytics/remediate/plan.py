"""What to change for an anomaly, where, and whether the blast-radius cap allows it.

:func:`plan` is the preflight of ``playbooks/remediate.yml`` (through ``clockmesh
remediate plan --json``): it reads the anomaly from the store, refuses one that is unknown,
closed (unless a remediation closed it: then a re-run is the idempotent no-op), or of a
class with no action yet, maps it to an action with its targets, and checks the cap
against what is already out of service (the active remediations in the store):

- ``fabric_link_out`` — a flapping leaf–spine link, or the link a silent drop leaves its
  switch by (a spine dropping what it forwards to one host: the link to that host's leaf):
  its BGP session shut on both ends (leaf and spine), so both route around it on the
  remaining ECMP next hops. Cap: a leaf
  keeps more than ``(1 − max_uplinks_out_share)`` of its uplinks (default 0.5: with two
  spines, one link per leaf at most) and at most ``max_fabric_links_out_share`` of all
  fabric links are out (default 0.25, at least one).

- ``host_drain`` — a flapping host access link (the host's NIC, cable or switch port):
  the host is drained from the scheduler (Slurm ``scontrol update state=drain`` with the
  reason ``clockmesh:<remediation id>: <summary>``) so no new job lands on it; a host
  someone else drained is left alone and never resumed by the undo (``host_resume``).
  Cap: at most ``max_hosts_share`` of the fleet and ``max_rack_hosts_share`` of its rack
  (default 0.5 each) drained by clockmesh at once, counting the drains in force.

- ``spread_flows`` — contention on a link by jobs (the anomaly names the jobs whose
  messages run between the slow paths' hosts): on those hosts, nccl.conf gets
  ``NCCL_IB_QPS_PER_CONNECTION`` (4 by default): NCCL opens that many queue pairs per
  connection, each its own UDP source port, so ECMP spreads each job over more paths. Jobs
  pick it up when they start. Contention by traffic no job reports is refused (manual
  fix). Cap: at most ``max_hosts_share`` of the fleet.

- ``roce_v2_gid`` — a job on RoCE v1 whose index comes from nccl.conf or NCCL's default:
  each of its hosts' nccl.conf points at that host's RoCE v2 GID (read from its GID table
  on the host) and rdma_cm's default_roce_mode at RoCE v2. A job that sets the index in
  its own environment is refused (nccl.conf cannot override it). Cap: at most
  ``max_hosts_share`` of the fleet's hosts (default 0.5).

Like a PodDisruptionBudget, the cap counts what is already out: a second link on the same
leaf is refused while the first is out, with the cap and the count named.

Two ops boxes (docs/deploy.md, "Two ops boxes"): the playbook hands the preflight the
other box's remediations (``also``), and the cap counts the union of both stores — what
either box took out, or is taking out (``running``). A remediation running from the other
box is refused here (a second start would race it) until it ends, is declared dead
(``abandoned``), or passes the stale-running rule (``records.RUNNING_STALE_S``); the
refusal names the run, its box, its start and when it is taken for dead. One in force is
the same remediation again, a re-run that changes nothing, and the plan says so.

Over 500 lines: four actions, each with its targets, its cap and its undo, in one preflight.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from analytics import topology as topology_file
from analytics.remediate import records
from analytics.store.catalog import connect_views

ACTIONS = ("fabric_link_out", "host_drain", "roce_v2_gid", "spread_flows")
SPREAD_QPS = 4  # NCCL_IB_QPS_PER_CONNECTION the spread sets


class Refused(Exception):
    """The preflight refuses; ``str()`` is one line naming why (cap and count)."""


@dataclass
class Caps:
    max_uplinks_out_share: float = 0.5
    max_fabric_links_out_share: float = 0.25
    max_hosts_share: float = 0.5  # hosts one remediation may change, share of the fleet
    max_rack_hosts_share: float = 0.5  # hosts drained at once, share of their rack


@dataclass
class Switch:
    name: str  # inventory name of the switch (the lab's router name)
    neighbor: str  # the BGP neighbour address to shut: the other end of the link
    interface: str = ""  # the switch's own end of the link (read to restore once stable)


@dataclass
class Plan:
    remediation_id: str
    anomaly_id: str
    action: str
    target: str
    summary: str
    switches: list[Switch] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # exposed: behind the link, or changed
    targets: list[str] = field(default_factory=list)  # what the playbook changes
    restore: dict[str, dict[str, Any]] = field(default_factory=dict)  # per target, for undo
    cap: dict[str, Any] = field(default_factory=dict)
    undo: dict[str, str] = field(default_factory=dict)
    undo_of: str = ""  # the remediation this plan undoes
    why: str = ""  # host_drain: the reason, in words, that goes into the scheduler's
    box: str = ""  # the ops box that runs it (its inventory name)
    peers_down: dict[str, str] = field(default_factory=dict)  # other boxes not read: why
    controller: str = ""  # host:pid of the `clockmesh remediate` that runs the playbook
    preview_id: str = ""  # the id a check-mode run of this plan is recorded under
    rerun_of: dict[str, Any] = field(default_factory=dict)  # the same remediation in force
    original: dict[str, Any] = field(default_factory=dict)  # an undo: the row it undoes

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """The plan in words, as ``clockmesh remediate plan`` and the TUI both show it."""
        lines = [f"{self.remediation_id}: {self.action} {self.target}", f"  {self.summary}"]
        verb = "back in service" if self.undo_of else "shut down"
        lines += [f"  {s.name}: BGP neighbour {s.neighbor} {verb}" for s in self.switches]
        if self.cap:
            lines.append(f"  blast radius: {json.dumps(self.cap)}")
        lines += [f"  {note}" for note in self.peer_notes()]
        return "\n".join(lines)

    def peer_notes(self) -> list[str]:
        """One line per other ops box this plan could not read: what that means."""
        return [
            f"ops box {box} is down ({why}): its remediations are not counted in the cap "
            "and it will not see this one until a later run copies it there"
            for box, why in sorted(self.peers_down.items())
        ]


@dataclass
class StoredAnomaly:
    anomaly_id: str
    kind: str
    link: str
    job_id: str
    closed_ns: int
    detail: dict[str, Any]
    opened_ns: int = 0


def latest_anomalies(
    store: Path, anomaly_id: str = "", open_only: bool = False
) -> list[StoredAnomaly]:
    """Each anomaly's latest row (the catalog's ``anomaly_current`` view), oldest first:
    one anomaly by id, or every open one."""
    if not (store / "anomalies").is_dir():
        raise Refused(f"{store}: no anomalies table: is this an ops box store?")
    where = (["anomaly_id = ?"] if anomaly_id else []) + (["is_open"] if open_only else [])
    try:
        con = connect_views(store, only=["anomaly_current"])
    except FileNotFoundError as exc:
        raise Refused(str(exc)) from None
    try:
        rows = con.execute(
            f"""SELECT anomaly_id, kind, link, job_id, closed_ns, opened_ns, detail
                FROM anomaly_current {"WHERE " + " AND ".join(where) if where else ""}
                ORDER BY opened_ns""",
            [anomaly_id] if anomaly_id else [],
        ).fetchall()
    except duckdb.Error as exc:
        raise Refused(f"{store}/anomalies: cannot be read ({exc})") from None
    finally:
        con.close()
    out = []
    for aid, kind, link, job, closed, opened, detail in rows:
        try:
            doc = json.loads(detail or "{}")
        except ValueError:
            doc = {}
        out.append(StoredAnomaly(aid, kind, link, job, int(closed or 0), doc, int(opened or 0)))
    return out


def read_anomaly(store: Path, anomaly_id: str) -> StoredAnomaly:
    found = latest_anomalies(store, anomaly_id=anomaly_id)
    if not found:
        raise Refused(f"anomaly {anomaly_id}: not in {store} (clockmesh remediate list shows them)")
    return found[0]


def read_topology(path: Path) -> dict[str, Any]:
    """:func:`analytics.topology.read_topology`, its error a refusal."""
    try:
        return topology_file.read_topology(path)
    except topology_file.TopologyError as exc:
        raise Refused(str(exc)) from None


def plan(
    store: Path,
    topology: dict[str, Any],
    anomaly_id: str = "",
    action: str = "",
    target: str = "",
    caps: Caps | None = None,
    also: list[records.Remediation] | None = None,
    box: str = "",
    peers_down: dict[str, str] | None = None,
) -> Plan:
    """The preflight (see the module). ``also``: the other ops box's remediations (its
    ``remediate history --json``), counted with this store's; ``box``: the ops box that
    will run the plan ("" when none: any running remediation is then another box's);
    ``peers_down``: the other boxes that could not be read, and why."""
    rows = records.merge(records.read_remediations(store), also or [])
    p = _plan(store, topology, anomaly_id, action, target, caps or Caps(),
              records.counted(rows))  # fmt: skip
    return _settle(p, rows, box, peers_down or {})


def _settle(p: Plan, rows: list[records.Remediation], box: str, peers_down: dict[str, str]) -> Plan:
    """Refuse a plan another box is running now; name a re-run of one in force."""
    busy = records.running_elsewhere(rows, p.action, p.target, box)
    if busy is not None:
        dead = records.dead_at_ns(busy)
        raise Refused(
            f"{busy.remediation_id}: {p.action} {p.target} is already running from ops box "
            f"{busy.box or '(unknown)'} (started by {busy.actor} at {records.utc(busy.ts_ns)}, "
            f"{records.ago(busy.ts_ns)}): a second start would race it. With no outcome it is "
            f"taken for dead at {records.utc(dead)} ({records.ahead(dead)}); wait for it "
            "(clockmesh remediate history shows its outcome), or, if its run died (its box "
            f"lost, its playbook killed), declare it dead now: clockmesh remediate abandon "
            f"{busy.remediation_id} -i INVENTORY: nothing was touched"
        )
    p.box, p.peers_down = box, dict(peers_down)
    p.preview_id = records.new_id(p.anomaly_id, p.action, p.target)
    same = [r for r in rows if r.remediation_id == p.remediation_id and not r.check_mode]
    if same and not p.undo_of:
        r = same[-1]
        where = f"from ops box {r.box}" if r.box else "recorded"
        if r.status == "ok":
            p.rerun_of = {"box": r.box, "ts_ns": r.ts_ns, "actor": r.actor,
                          "results": r.detail.get("results", [])}  # fmt: skip
            p.summary += (
                f". Already in force: {r.remediation_id}, {where} by {r.actor} "
                f"{records.ago(r.ts_ns)}; a re-run is the same remediation and changes nothing"
            )
        elif r.status == "running":
            p.summary += (
                f". {r.remediation_id} was started {where} by {r.actor} "
                f"{records.ago(r.ts_ns)} and has not recorded how it ended (its run died or "
                "was cancelled, its box was lost, or it is still going from this box): this "
                "run takes it over under the same id"
            )
        elif r.status == "abandoned":
            gone = r.detail.get("abandoned") or {}
            p.summary += (
                f". {r.remediation_id} was started {where} by {r.actor} "
                f"{records.ago(int(gone.get('started_ns') or r.ts_ns))} and declared dead by "
                f"{gone.get('by', '?')} {records.ago(r.ts_ns)} (its change may be half in "
                "place): this run takes it over under the same id"
            )
    return p


def _plan(
    store: Path,
    topology: dict[str, Any],
    anomaly_id: str,
    action: str,
    target: str,
    caps: Caps,
    in_force: list[records.Remediation],
) -> Plan:
    if anomaly_id:
        a = read_anomaly(store, anomaly_id)
        closed_by = a.detail.get("closed_by", "")
        if a.closed_ns and not closed_by:
            raise Refused(f"anomaly {anomaly_id} is closed (its condition cleared): nothing to do")
        action, target = recommended(topology, a.kind, a.link, a.job_id)
        if action == "host_drain":
            return _host_drain(topology, a.anomaly_id, target, a.detail.get("summary", ""),
                               caps, in_force)  # fmt: skip
        if action == "roce_v2_gid":
            return _roce_v2_gid(topology, a, caps, in_force)
        if action == "spread_flows":
            return _spread_flows(topology, a, caps, in_force)
        if not action and a.kind == "silent_drop":
            ev = a.detail.get("evidence", {})
            links, sw = ev.get("links") or [], ev.get("switch") or "the switch"
            to = ", ".join(ev.get("destinations") or []) or "what it drops"
            if ev.get("port_rx_packets"):  # a leaf towards its own host (or that host's NIC)
                raise Refused(
                    f"anomaly {anomaly_id} (silent_drop): nothing reaches {to}'s port: check "
                    f"{sw}'s route to {to}, then {to}'s NIC; no other link leads there to "
                    "move its traffic to"
                )
            if not links:  # a leaf drops before it picks an uplink: no link to take out
                raise Refused(
                    f"anomaly {anomaly_id} (silent_drop): the drop is inside {sw}, before "
                    f"it picks a link: check its route to {to}, or take {sw} out of "
                    "service by hand"
                )
            raise Refused(
                f"anomaly {anomaly_id} (silent_drop): no single link explains it (the loss "
                f"crosses {', '.join(links)}): take the switch out of service by hand"
            )
        if not action and a.kind == "flapping_link" and _rack(topology, a.link):  # a leaf
            hosts = _rack(topology, a.link)
            at_once = max(1, math.floor(caps.max_rack_hosts_share * len(hosts)))
            raise Refused(
                f"anomaly {anomaly_id} (flapping_link on {a.link}): every host link under "
                f"{a.link} went at once, and its {len(hosts)} host"
                f"{'s have' if len(hosts) != 1 else ' has'} no other path: "
                f"check {a.link} itself (power, a reload, its ports); if it stays down, drain "
                f"its hosts one by one (action=host_drain target=HOST: {', '.join(hosts)}); "
                f"the cap drains {at_once} of them at once (--max-rack-hosts-share)"
            )
        if not action and a.kind == "flapping_link":  # a spine that went as a whole
            raise Refused(
                f"anomaly {anomaly_id} (flapping_link on {a.link}): every path through "
                f"{a.link} went, and every leaf already routes around it; taking its links "
                "out by hand changes nothing until it is back (then drain it on the switch)"
            )
        if not action and a.kind == "contention":
            raise Refused(
                f"anomaly {anomaly_id} (contention on {a.link}): a host's own port; more "
                "queue pairs would not spread it (ECMP hashes onto spines, not onto another "
                "port of that host): find the senders with the host's counters and the "
                "anomaly's pairs"
            )
        if not action:
            raise Refused(f"anomaly {anomaly_id} ({a.kind}): no remediation for this class")
    if action == "host_drain":
        return _host_drain(topology, anomaly_id, target,
                           f"drained by hand (by {records.actor()})", caps, in_force)  # fmt: skip
    if action != "fabric_link_out":
        raise Refused(
            f"action {action!r}: expected fabric_link_out (a link) or host_drain (a host) "
            "with a target (roce_v2_gid needs its anomaly: -e anomaly_id=...)"
        )
    return _fabric_link_out(topology, anomaly_id, target, caps, in_force)


def recommended(topology: dict[str, Any] | None, kind: str, link: str,
                job_id: str = "") -> tuple[str, str]:  # fmt: skip
    """The remediation an anomaly calls for, as (action, target); ("", "") for none.

    A flapping host access link drains its host; a flapping leaf–spine link goes out of
    service; a job on RoCE v1 moves to a RoCE v2 GID; contention on a fabric link spreads
    the jobs' flows (on a host's own port nothing does); a
    silent drop that one fabric link explains takes that link out of service, one on a
    host's own link (what it sends) drains the host.
    Without a topology a flapping link cannot be told to be a host's: "" target, the
    action the fabric's."""
    if kind == "flapping_link":
        host = _access_link(topology, link) if topology else ""
        if not host and topology and _switch(topology, link):
            return "", ""  # a whole spine (leaves route around it) or leaf (check it)
        return ("host_drain", host) if host else ("fabric_link_out", link)
    if kind == "roce_v1_job":
        return "roce_v2_gid", job_id
    if kind == "contention":
        # A host's own port (incast, or its NIC): more queue pairs hash onto other spines,
        # not onto another port of that host; nothing here fixes it (docs/remediate.md).
        if topology and _access_link(topology, link):
            return "", ""
        return "spread_flows", link
    if kind == "silent_drop" and link:  # the one link the lossy paths leave the switch by
        host = _access_link(topology, link) if topology else ""
        if host:  # a host's way out drops what it sends: its jobs go elsewhere
            return "host_drain", host
        fabric = topology is None or any(
            lk.get("kind") == "fabric" and lk["name"] == link for lk in topology.get("links", [])
        )
        return ("fabric_link_out", link) if fabric else ("", "")
    return "", ""


# Why an anomaly of a class has no remediation, in a few words (the TUI's column), when
# :func:`recommended` gave none: which of its cases that is follows from the class (and,
# for a switch gone as a whole, whether it is a leaf), as in :func:`_plan`'s refusals,
# which say it in full
NO_REMEDY = {
    "flapping_link": "none: leaves route around it",  # a whole spine
    "contention": "none: a host's own port",
    "silent_drop": "by hand: check the switch",  # no single fabric link explains it
}
LEAF_NO_REMEDY = "by hand: check the leaf, drain its hosts"  # a leaf gone as a whole


def no_remedy(topology: dict[str, Any] | None, kind: str, link: str) -> str:
    """Why an anomaly :func:`recommended` gives no remediation has none, in a few words."""
    if kind == "flapping_link" and topology and _rack(topology, link):
        return LEAF_NO_REMEDY
    return NO_REMEDY.get(kind, "none for this class")


def _rack(topology: dict[str, Any], leaf: str) -> list[str]:
    """The hosts under leaf ``leaf`` ([] when it is no leaf of the topology)."""
    return sorted(str(h["name"]) for h in topology.get("hosts", []) if h.get("rack") == leaf)


def _switch(topology: dict[str, Any], name: str) -> bool:
    """Is ``name`` a switch of the topology (an anomaly's place that is no link)?"""
    return any(name in (lk["a"]["node"], lk["b"]["node"])
               for lk in topology.get("links", []) if lk.get("kind") == "fabric")  # fmt: skip


def _access_link(topology: dict[str, Any], link: str) -> str:
    """The host on access link ``link`` ("" when it is no host's link)."""
    hosts = {h["name"] for h in topology.get("hosts", [])}
    for lk in topology["links"]:
        if lk["name"] == link and lk.get("kind") != "fabric":
            for end in (lk["a"], lk["b"]):
                if end["node"] in hosts:
                    return str(end["node"])
    return ""


def _host_drain(
    topology: dict[str, Any],
    anomaly_id: str,
    host: str,
    why: str,
    caps: Caps,
    in_force: list[records.Remediation],
) -> Plan:
    """Drain ``host`` from the scheduler, within the fleet's and its rack's cap."""
    racks = {h["name"]: str(h.get("rack", "")) for h in topology.get("hosts", [])}
    if host not in racks:
        raise Refused(f"host {host!r}: not a host of the topology")
    same = [r for r in in_force if r.action == "host_drain" and r.target == host]
    drained = {r.target for r in in_force if r.action == "host_drain"} | {host}
    fleet_cap = max(1, math.floor(caps.max_hosts_share * len(racks)))
    if len(drained) > fleet_cap:
        raise Refused(
            f"blast-radius cap: {len(drained)} of {len(racks)} hosts would be drained "
            f"({', '.join(sorted(drained))}); the cap is {fleet_cap} "
            f"(max_hosts_share {caps.max_hosts_share})"
        )
    rack = racks[host]
    members = [h for h, r in racks.items() if r == rack]
    in_rack = sorted(h for h in drained if racks.get(h) == rack)
    rack_cap = max(1, math.floor(caps.max_rack_hosts_share * len(members)))
    if len(in_rack) > rack_cap:
        raise Refused(
            f"blast-radius cap: {len(in_rack)} of the {len(members)} hosts of {rack} would be "
            f"drained ({', '.join(in_rack)}); the cap is {rack_cap} "
            f"(max_rack_hosts_share {caps.max_rack_hosts_share})"
        )
    return Plan(
        remediation_id=(
            same[-1].remediation_id if same else records.new_id(anomaly_id, "host_drain", host)
        ),
        anomaly_id=anomaly_id,
        action="host_drain",
        target=host,
        summary=(
            f"drain {host} from the scheduler (no new job lands on it; running jobs finish "
            f"or fail as they would); a drain by someone else is left alone. Why: {why}"
        ),
        hosts=[host],
        targets=[host],
        cap={
            "rack": rack,
            "rack_drained_after": len(in_rack),
            "rack_max": rack_cap,
            "fleet_drained_after": len(drained),
            "fleet_max": fleet_cap,
        },
        undo={"action": "host_resume", "target": host},
        why=why,
    )


def _hosts_cap(hosts: list[str], fleet: int, caps: Caps) -> tuple[int, int]:
    """(fleet size, cap) for a remediation that changes ``hosts``; refuses past the cap."""
    fleet = fleet or len(hosts)
    cap = max(1, math.floor(caps.max_hosts_share * fleet))
    if len(hosts) > cap:
        raise Refused(
            f"blast-radius cap: {len(hosts)} of {fleet} hosts would change; the cap is {cap} "
            f"(max_hosts_share {caps.max_hosts_share})"
        )
    return fleet, cap


def _same(
    in_force: list[records.Remediation], anomaly_id: str, action: str, new: str, target: str = ""
) -> str:
    """The id of this anomaly's remediation already in force (a re-run is the same
    remediation, its record keeps the state before for the undo), else ``new``. The
    same action on the same target is the same remediation too: the other ops box names
    the same condition with its own anomaly id."""
    same = [
        r for r in in_force
        if r.action == action and (r.anomaly_id == anomaly_id or (target and r.target == target))
    ]  # fmt: skip
    return same[-1].remediation_id if same else new


def _hosts_plan(
    a: StoredAnomaly,
    action: str,
    target: str,
    hosts: list[str],
    fleet_size: int,
    caps: Caps,
    in_force: list[records.Remediation],
    *,
    summary: str,
    undo: str,
    **cap: Any,
) -> Plan:
    """A plan for anomaly ``a`` that changes nccl.conf on ``hosts`` (``spread_flows``,
    ``roce_v2_gid``): refused past the fleet's cap, under the id of the same remediation in
    force if there is one, undone by the action ``undo`` on the same ``target``; ``cap``:
    what its blast radius names besides the hosts."""
    fleet, max_hosts = _hosts_cap(hosts, fleet_size, caps)
    new = records.new_id(a.anomaly_id, action, target)
    return Plan(
        remediation_id=_same(in_force, a.anomaly_id, action, new, target),
        anomaly_id=a.anomaly_id,
        action=action,
        target=target,
        summary=summary,
        hosts=hosts,
        targets=hosts,
        cap={"hosts": len(hosts), "fleet": fleet, "max_hosts": max_hosts, **cap},
        undo={"action": undo, "target": target},
    )


def _spread_flows(
    topology: dict[str, Any], a: StoredAnomaly, caps: Caps, in_force: list[records.Remediation]
) -> Plan:
    """NCCL_IB_QPS_PER_CONNECTION on the hosts of the jobs the contention names."""
    ev = a.detail.get("evidence") or {}
    jobs = sorted(ev.get("jobs") or [])
    if not jobs:
        raise Refused(
            f"anomaly {a.anomaly_id} (contention on {a.link}): no job reports its traffic "
            "between these hosts, so there is no job to spread; see docs/remediate.md for "
            "the manual fix (find the flows with the link's counters)"
        )
    known = {h["name"] for h in topology.get("hosts", [])}
    hosts = sorted(h for h in ev.get("job_hosts") or [] if h in known)
    if not hosts:
        raise Refused(
            f"anomaly {a.anomaly_id}: names no hosts of the topology (evidence.job_hosts)"
        )
    return _hosts_plan(
        a, "spread_flows", a.link, hosts, len(known), caps, in_force,
        summary=f"set NCCL_IB_QPS_PER_CONNECTION={SPREAD_QPS} in nccl.conf on "
        f"{', '.join(hosts)} (jobs {', '.join(jobs)}): each connection gets {SPREAD_QPS} queue "
        f"pairs, each its own UDP source port, so ECMP spreads them off {a.link}; jobs pick "
        "it up when they start",
        undo="spread_restore", jobs=jobs,
    )  # fmt: skip


def _roce_v2_gid(
    topology: dict[str, Any], a: StoredAnomaly, caps: Caps, in_force: list[records.Remediation]
) -> Plan:
    """nccl.conf → the RoCE v2 index on the job's hosts (each host finds its own index)."""
    ev = a.detail.get("evidence") or {}
    hosts = sorted(ev.get("hosts") or [])
    if not hosts:
        raise Refused(f"anomaly {a.anomaly_id}: names no hosts (evidence.hosts is empty)")
    own = [s for s in ev.get("index_source") or [] if s.startswith("set in ")]
    if own:
        raise Refused(
            f"job {a.job_id} sets NCCL_IB_GID_INDEX itself ({', '.join(own)}): nccl.conf "
            "cannot override a job's environment; restart it with a RoCE v2 index "
            "(clockmesh collector gids on a host names it)"
        )
    return _hosts_plan(
        a, "roce_v2_gid", a.job_id, hosts, len(topology.get("hosts", [])), caps, in_force,
        summary=f"set NCCL_IB_GID_INDEX in nccl.conf to each host's RoCE v2 GID (from its GID "
        f"table) on the {len(hosts)} host(s) of job {a.job_id} on RoCE v1: "
        f"{', '.join(hosts)}; jobs that set no index pick it up when they start",
        undo="roce_gid_restore",
    )  # fmt: skip


def plan_undo(
    store: Path,
    topology: dict[str, Any],
    remediation_id: str,
    also: list[records.Remediation] | None = None,
    box: str = "",
    peers_down: dict[str, str] | None = None,
) -> Plan:
    """The exact inverse of a remediation in force, on the same targets (found in this
    store or in ``also``, the other ops box's: either box may undo what the other did)."""
    rows = records.merge(records.read_remediations(store), also or [])
    p = _plan_undo(store, topology, remediation_id, rows)
    p.original = {**rows_by_id(rows)[remediation_id].as_dict()}
    return _settle(p, rows, box, peers_down or {})


def rows_by_id(rows: list[records.Remediation]) -> dict[str, records.Remediation]:
    return {r.remediation_id: r for r in rows}


def _plan_undo(
    store: Path, topology: dict[str, Any], remediation_id: str, rows: list[records.Remediation]
) -> Plan:
    r = rows_by_id(rows).get(remediation_id)
    if r is None:
        raise Refused(f"remediation {remediation_id}: not in {store}/remediations")
    if r.check_mode:
        raise Refused(f"remediation {remediation_id} was a check-mode preview: nothing to undo")
    if r.status == "running":
        raise Refused(
            f"remediation {remediation_id} is still running (from ops box {r.box or '?'}, "
            f"started {records.ago(r.ts_ns)}, taken for dead at "
            f"{records.utc(records.dead_at_ns(r))}): nothing in force to undo yet"
        )
    if r.status == "abandoned":
        raise Refused(
            f"remediation {remediation_id} was declared dead mid-run (its change may be half "
            f"in place): run {r.action} {r.target} again to settle it (the run takes it over "
            "under the same id), then undo it"
        )
    if r.status != "ok":
        raise Refused(f"remediation {remediation_id} is {r.status}: nothing in force to undo")
    if r.action == "roce_v2_gid":
        return _hosts_restore(
            r, "roce_gid_restore", "nccl.conf and default_roce_mode",
            lambda x: {"index": int(x.get("index_before", -1)),
                       "roce_mode": str(x.get("roce_mode_before", ""))},
        )  # fmt: skip
    if r.action == "spread_flows":
        return _hosts_restore(
            r, "spread_restore", "NCCL_IB_QPS_PER_CONNECTION in nccl.conf",
            lambda x: {"value": int(x.get("qps_before", -1))},
        )  # fmt: skip
    if r.action == "host_drain":
        return Plan(
            remediation_id=records.new_id(r.anomaly_id, "host_resume", r.target),
            anomaly_id=r.anomaly_id,
            action="host_resume",
            target=r.target,
            summary=f"resume {r.target} in the scheduler if it is still drained by "
            f"{remediation_id} (a drain by someone else since is left alone)",
            hosts=[r.target],
            targets=[r.target],
            undo_of=remediation_id,
        )
    if r.action != "fabric_link_out":
        raise Refused(f"remediation {remediation_id} ({r.action}): no undo for this action")
    switches = _link_switches(topology, r.target)
    leaf, spine = (x.name for x in switches)
    return Plan(
        remediation_id=records.new_id(r.anomaly_id, "fabric_link_in", r.target),
        anomaly_id=r.anomaly_id,
        action="fabric_link_in",
        target=r.target,
        summary=f"restore the BGP session of {r.target} on {leaf} and {spine} "
        f"(undoes {remediation_id})",
        switches=switches,
        hosts=list(r.hosts),
        targets=[leaf, spine],
        undo_of=remediation_id,
    )


def _hosts_restore(
    r: records.Remediation,
    action: str,
    what: str,
    values: Callable[[dict[str, Any]], dict[str, Any]],
) -> Plan:
    """The undo of a per-host nccl.conf change: each host's values before (from the
    results the record kept), and whether nccl.conf existed (else the file goes again)."""
    before = {x["host"]: x for x in r.detail.get("results", []) if x.get("host")}
    return Plan(
        remediation_id=records.new_id(r.anomaly_id, action, r.target),
        anomaly_id=r.anomaly_id,
        action=action,
        target=r.target,
        summary=f"restore {what} on {', '.join(sorted(before))} (undoes {r.remediation_id})",
        hosts=sorted(before),
        targets=sorted(before),
        restore={
            h: {**values(x), "conf_existed": str(x.get("conf_existed", True)).lower() == "true"}
            for h, x in before.items()
        },
        undo_of=r.remediation_id,
    )


def _link_switches(topology: dict[str, Any], target: str) -> list[Switch]:
    """The leaf–spine link's two switches, each with the BGP neighbour to shut (the other
    end's address) and its own interface."""
    for lk in topology["links"]:
        if lk.get("kind") == "fabric" and lk["name"] == target:
            a, b = lk["a"], lk["b"]
            return [Switch(a["node"], b["address"], a.get("interface", "")),
                    Switch(b["node"], a["address"], b.get("interface", ""))]  # fmt: skip
    hint = " (a host's access link: drain the host instead)" if target else ""
    raise Refused(f"link {target!r}: not a leaf–spine link of the topology{hint}")


def _fabric_link_out(
    topology: dict[str, Any],
    anomaly_id: str,
    target: str,
    caps: Caps,
    in_force: list[records.Remediation],
) -> Plan:
    fabric = {lk["name"]: lk for lk in topology["links"] if lk.get("kind") == "fabric"}
    switches = _link_switches(topology, target)
    leaf, spine = (x.name for x in switches)
    out = {r.target for r in in_force if r.action == "fabric_link_out"} | {target}
    leaf_links = [n for n, lk in fabric.items() if lk["a"]["node"] == leaf]
    leaf_out = sorted(n for n in leaf_links if n in out)
    max_leaf = min(len(leaf_links) - 1, math.floor(caps.max_uplinks_out_share * len(leaf_links)))
    if len(leaf_out) > max_leaf:
        raise Refused(
            f"blast-radius cap: {leaf} would have {len(leaf_out)} of its {len(leaf_links)} "
            f"uplinks out ({', '.join(leaf_out)}); the cap is {max_leaf} "
            f"(max_uplinks_out_share {caps.max_uplinks_out_share})"
        )
    all_out = sorted(n for n in fabric if n in out)
    max_all = max(1, math.floor(caps.max_fabric_links_out_share * len(fabric)))
    if len(all_out) > max_all:
        raise Refused(
            f"blast-radius cap: {len(all_out)} of {len(fabric)} fabric links would be out "
            f"({', '.join(all_out)}); the cap is {max_all} "
            f"(max_fabric_links_out_share {caps.max_fabric_links_out_share})"
        )
    hosts = sorted(h["name"] for h in topology.get("hosts", []) if h.get("rack") == leaf)
    # Already out through a remediation in force: the same one again (a no-op re-run).
    same = [r for r in in_force if r.action == "fabric_link_out" and r.target == target]
    return Plan(
        remediation_id=(
            same[-1].remediation_id
            if same
            else records.new_id(anomaly_id, "fabric_link_out", target)
        ),
        anomaly_id=anomaly_id,
        action="fabric_link_out",
        target=target,
        summary=(
            f"shut the BGP session of {target} on {leaf} and {spine}: both route around it on "
            f"their other ECMP next hops; {len(hosts)} host(s) behind {leaf} keep "
            f"{len(leaf_links) - len(leaf_out)} of {len(leaf_links)} uplinks"
        ),
        switches=switches,
        hosts=hosts,
        targets=[leaf, spine],
        cap={
            "leaf": leaf,
            "leaf_uplinks": len(leaf_links),
            "leaf_out_after": len(leaf_out),
            "leaf_max_out": max_leaf,
            "fabric_links": len(fabric),
            "fabric_out_after": len(all_out),
            "fabric_max_out": max_all,
        },
        undo={"action": "fabric_link_in", "target": target},
    )
