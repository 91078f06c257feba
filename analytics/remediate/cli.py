"""``clockmesh remediate``: open anomalies and their fix; preview, confirm, run, record, undo.

Over 500 lines: one click command per step of a remediation (list, plan, run, undo,
restore, abandon, record, sync), each a thin layer over analytics.remediate.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import click

from analytics.cli_options import store_option, topology_option
from analytics.ingest import endpoints
from analytics.remediate import records, runner, stable
from analytics.remediate.plan import (
    Caps,
    Refused,
    latest_anomalies,
    plan,
    plan_undo,
    read_topology,
)
from analytics.store.layout import has_files

_store = endpoints.store_choice(store_option())  # --store a,b: the first that answers
_topology = topology_option()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def remediate() -> None:
    """Fix what the detector found, safely: preview, confirm, run, record, undo.

    `list` shows open anomalies with the action for each; `run ID` previews the change in
    check mode, asks, runs playbooks/remediate.yml and streams it; `undo REM` restores;
    `restore` puts back every link and host taken out once its link has been stable;
    `abandon REM` declares a run that died mid-way dead on every ops box.
    """


def _open_anomalies(store: Path) -> list[dict[str, Any]]:
    if not (store / "anomalies").is_dir():
        return []
    return [
        {"anomaly_id": a.anomaly_id, "kind": a.kind, "where": a.link or a.job_id,
         "opened_ns": a.opened_ns, "summary": a.detail.get("summary", "")}
        for a in latest_anomalies(store, open_only=True)
    ]  # fmt: skip


def _running(store: Path) -> list[records.Remediation]:
    """Real remediations this store says are running now (from this box or the other)."""
    return [r for r in records.read_remediations(store)
            if r.status == "running" and not r.check_mode]  # fmt: skip


def _running_line(r: records.Remediation) -> str:
    dead = records.dead_at_ns(r)
    return (f"{r.remediation_id}  running  {r.action} {r.target} from ops box "
            f"{r.box or '?'} by {r.actor}, started {records.ago(r.ts_ns)} "
            f"({records.utc(r.ts_ns)}; anomaly {r.anomaly_id or '-'}); "
            f"{'taken for dead since' if not records.live(r) else 'no outcome: dead at'} "
            f"{records.utc(dead)} ({records.ahead(dead)})")  # fmt: skip


def _running_dict(r: records.Remediation) -> dict[str, Any]:
    """A running remediation as ``list --json`` prints it: the same row (and ``state``)
    as ``history --json``, the TUI and the report, with which box started it and when,
    and when the stale-running rule takes it for dead (``dead``: it has)."""
    dead = records.dead_at_ns(r)
    return {"remediation_id": r.remediation_id, "state": r.state, "action": r.action,
            "target": r.target, "anomaly_id": r.anomaly_id, "box": r.box, "actor": r.actor,
            "started_ns": r.ts_ns, "started": records.utc(r.ts_ns), "dead_at_ns": dead,
            "dead_at": records.utc(dead), "dead": not records.live(r)}  # fmt: skip


@remediate.command("list")
@_store
@_topology
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(store: Path, topology: Path, as_json: bool) -> None:
    """Open anomalies, each with its recommended action (or why there is none), after
    the remediations running now (from this ops box or the other). --json: an object,
    ``running`` (those remediations) and ``anomalies``."""
    try:
        topo = read_topology(topology)
        running = _running(store)
        out = []
        for a in _open_anomalies(store):
            try:
                p = plan(store, topo, anomaly_id=a["anomaly_id"])
                a["action"], a["plan"] = p.action, p.summary
            except Refused as exc:
                a["action"], a["plan"] = "", str(exc)
            out.append(a)
    except (Refused, records.RecordError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"running": [_running_dict(r) for r in running],
                               "anomalies": out}, indent=2))  # fmt: skip
        return
    for r in running:
        click.echo(_running_line(r))
    if not out:
        click.echo("no open anomalies")
    for a in out:
        click.echo(f"{a['anomaly_id']}  {a['kind']:<14} {a['where']}: {a['summary']}")
        click.echo(f"    {'→ ' + a['action'] + ': ' if a['action'] else '✗ '}{a['plan']}")


@remediate.command("plan")
@_store
@_topology
@click.option("--anomaly", "anomaly_id", default="", help="Anomaly id to remediate.")
@click.option("--action", default="",
              help="Or an action by name (fabric_link_out, host_drain) ...")  # fmt: skip
@click.option("--target", default="", help="... on this target (a link, or a host to drain).")
@click.option("--undo", "undo_id", default="", help="Or the remediation id to undo.")
@click.option("--max-uplinks-out-share", type=click.FloatRange(0, 1), default=0.5,
              show_default=True, help="Cap: share of a leaf's uplinks out at once.")  # fmt: skip
@click.option("--max-fabric-links-out-share", type=click.FloatRange(0, 1), default=0.25,
              show_default=True, help="Cap: share of all fabric links out at once.")  # fmt: skip
@click.option("--max-hosts-share", type=click.FloatRange(0, 1), default=0.5,
              show_default=True, help="Cap: share of the fleet's hosts one run may change.")  # fmt: skip
@click.option("--max-rack-hosts-share", type=click.FloatRange(0, 1), default=0.5,
              show_default=True, help="Cap: share of a rack's hosts drained at once.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (the playbook's).")
@click.option("--box", default="", help="The ops box that runs it (its inventory name).")
@click.option("--also", "also_json", default="[]",
              help="The other ops box's remediations (its `remediate history --json`): "
                   "counted in the cap with this store's.")  # fmt: skip
@click.option("--peers-down", "peers_down_json", default="{}",
              help="Other ops boxes that could not be read, JSON {box: why}.")  # fmt: skip
@click.option("--controller", default="",
              help="HOST:PID of the `clockmesh remediate` running the playbook (kept in the "
                   "record: a run whose controller is alive is never declared dead).")  # fmt: skip
def plan_(
    store: Path,
    topology: Path,
    anomaly_id: str,
    action: str,
    target: str,
    undo_id: str,
    max_uplinks_out_share: float,
    max_fabric_links_out_share: float,
    max_hosts_share: float,
    max_rack_hosts_share: float,
    as_json: bool,
    box: str,
    also_json: str,
    peers_down_json: str,
    controller: str,
) -> None:
    """The preflight: what would change, where, and the blast-radius cap (exit 1: refused)."""
    try:
        also = records.rows_from_json(also_json, "--also")
        peers_down = json.loads(peers_down_json or "{}")
        if not isinstance(peers_down, dict):
            raise ValueError("--peers-down: expected a JSON object {box: why}")
    except ValueError as exc:
        raise click.ClickException(str(exc).splitlines()[0]) from None
    try:
        topo = read_topology(topology)
        if undo_id:
            p = plan_undo(store, topo, undo_id, also, box, peers_down)
        else:
            caps = Caps(max_uplinks_out_share, max_fabric_links_out_share, max_hosts_share,
                        max_rack_hosts_share)  # fmt: skip
            p = plan(store, topo, anomaly_id, action, target, caps, also, box, peers_down)
    except (Refused, records.RecordError) as exc:
        raise click.ClickException(f"refused: {exc}") from None
    p.controller = controller
    if as_json:
        click.echo(json.dumps(p.as_dict()))
        return
    click.echo(p.describe())


@remediate.command("stable")
@_store
@_topology
@click.option("--undo", "undo_id", required=True, help="The remediation whose link to judge.")
@click.option("--after", "after_s", type=click.FloatRange(min=0), required=True,
              help="Seconds the link must have stayed up without a change.")  # fmt: skip
@click.option("--readings", "readings_json", default="[]",
              help="A leaf–spine link's switch readings (JSON, the clockmesh_link_state role's).")  # fmt: skip
def stable_(store: Path, topology: Path, undo_id: str, after_s: float, readings_json: str) -> None:
    """Has REM's link been stable for --after seconds? Prints the reading (JSON); exit 1
    with the reason when not (the restore guard of undo.yml -e restore_after_s=N)."""
    try:
        reading = _stability(store, topology, undo_id, after_s, readings_json)
    except (Refused, records.RecordError) as exc:
        raise click.ClickException(f"refused: {exc}") from None
    except ValueError as exc:  # a reading it cannot judge: never taken for stable
        raise click.ClickException(f"not stable: cannot tell: {exc}") from None
    click.echo(json.dumps(reading.as_dict()))
    if not reading.stable:
        raise click.ClickException(f"not stable: {reading.why}")


def _stability(
    store: Path, topology: Path, undo_id: str, after_s: float, readings_json: str
) -> stable.Reading:
    known = {r.remediation_id: r for r in records.read_remediations(store)}
    r = known.get(undo_id)
    if r is None:
        raise Refused(f"remediation {undo_id}: not in {store}/remediations")

    def dropped() -> bool:
        """Taken out for a silent drop (its link never went down)? Read only for the
        actions that wait for stability; a store that never held an anomaly: no."""
        if not r.anomaly_id or not has_files(store, "anomalies"):
            return False
        found = latest_anomalies(store, anomaly_id=r.anomaly_id)
        return bool(found) and found[0].kind == "silent_drop"

    if r.action == "fabric_link_out":
        if dropped():
            return stable.fabric_drop_not_judged(r.target, r.anomaly_id)
        readings = json.loads(readings_json)
        if not isinstance(readings, list):
            raise ValueError("--readings: expected a JSON list of switch readings")
        return stable.fabric_link(r.target, readings, after_s)
    if r.action == "host_drain":
        link = stable.access_link(read_topology(topology), r.target)
        if dropped():
            return stable.drop_not_judged(link["name"], r.target, r.anomaly_id)
        return stable.host_link(store, link["name"], r.target, after_s)
    raise Refused(f"{undo_id} ({r.action}): only a link taken out or a host drained "
                  "waits for stability")  # fmt: skip


@remediate.command("record")
@_store
@click.option("--plan", "plan_json", default="", help="The plan (JSON) the playbook ran.")
@click.option("--results", "results_json", default="[]", help="Per target results (JSON).")
@click.option("--check/--real", "check", default=None, help="Check-mode preview or real run.")
@click.option("--stability", "stability_json", default="",
              help="The restore guard's reading (JSON), kept with the record.")  # fmt: skip
@click.option("--running", is_flag=True,
              help="Record the start (state running), before anything is touched.")  # fmt: skip
@click.option("--refused", "refused_why", default="",
              help="Record that the run stopped before touching anything, and why.")  # fmt: skip
@click.option("--abandoned", "abandoned_id", default="", metavar="REM",
              help="Record that REM's run is dead (playbooks/abandon.yml; no --plan).")  # fmt: skip
@click.option("--why", default="", help="With --abandoned: why it is declared dead.")
@click.option("--also", "also_json", default="[]",
              help="With --abandoned: the other ops boxes' `remediate history --json`.")  # fmt: skip
def record_(
    store: Path,
    plan_json: str,
    results_json: str,
    check: bool | None,
    stability_json: str,
    running: bool,
    refused_why: str,
    abandoned_id: str,
    why: str,
    also_json: str,
) -> None:
    """Write a run's remediations and audits rows (the playbook's last play calls it;
    with --running, its start, written to every ops box before anything changes; with
    --refused, that it yielded to another start of the same fix; with --abandoned REM,
    that REM's run died: `clockmesh remediate abandon` records it on every ops box)."""
    if abandoned_id:  # with --check: only whether it may be (nothing written)
        _record_abandoned(store, abandoned_id, why, also_json, dry=bool(check))
        return
    if not plan_json:
        raise click.ClickException("--plan: required (the plan the playbook ran, JSON)")
    if check is None:
        raise click.ClickException("--check/--real: required (a preview or a real run)")
    if running or refused_why:
        _record_start(store, plan_json, check, refused_why)
        return
    try:
        p = json.loads(plan_json)
        results = json.loads(results_json)
        stability = json.loads(stability_json) if stability_json else None
        targets = p.get("targets") or [s["name"] for s in p["switches"]]
        rid = p["remediation_id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"--plan/--results: not a clockmesh plan ({exc})") from None
    done = {r.get("target") or r.get("switch") for r in results}
    status = "ok" if done >= set(targets) else "failed"
    if check:  # a preview never replaces the state of a remediation in force
        rid = p.get("preview_id") or records.new_id(p.get("anomaly_id", ""), p["action"],
                                                    p["target"])  # fmt: skip
    detail = {"summary": p.get("summary", ""), "results": results, "cap": p.get("cap", {}),
              "switches": p["switches"], "undo_of": p.get("undo_of", ""),
              **_box_detail(p)}  # fmt: skip
    if stability is not None:
        detail["stability"] = stability
    if not check:
        try:
            first = {r.remediation_id: r for r in records.active(store)}.get(rid)
        except records.RecordError as exc:
            raise click.ClickException(str(exc)) from None
        # A re-run: the undo still needs the state before the first run (the plan carries
        # it when the first run is in force on either box, so both write the same row).
        before = (p.get("rerun_of") or {}).get("results")
        if before is None and first is not None:
            before = first.detail.get("results", results)
        if before is not None:
            detail["results"] = before
            detail["rerun_results"] = results
    rem = records.Remediation(
        rid, p.get("anomaly_id", ""), p["action"], p["target"], list(p.get("hosts", [])),
        check, status, records.actor(), json.dumps(p.get("undo", {})), detail,
    )  # fmt: skip
    try:
        records.write_remediation(store, rem)
        if p.get("undo_of") and not check and status == "ok":
            known = {r.remediation_id: r for r in records.read_remediations(store)}
            orig = known.get(p["undo_of"])
            if orig is None and p.get("original"):  # done by the other box, unknown here
                orig = records.Remediation.from_dict(p["original"])
            if orig is not None:
                orig.status, orig.ts_ns = "undone", 0
                orig.detail = {**orig.detail, "undone_by": rid}
                records.write_remediation(store, orig)
        verb = ("restore" if stability is not None else "undo") if p.get("undo_of") else "remediate"
        records.write_audit(
            store,
            f"{verb}{' (check mode)' if check else ''}",
            p["target"],
            {"remediation_id": rid, "status": status, "anomaly_id": p.get("anomaly_id", ""),
             "changed": [r.get("target") or r.get("switch") for r in results
                         if str(r.get("changed")).lower() == "true"],
             **({"stability": stability} if stability is not None else {})},
        )  # fmt: skip
    except records.RecordError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"recorded {rid}: {p['action']} {p['target']} {status}"
               f"{' (check mode)' if check else ''}")  # fmt: skip


def _record_abandoned(
    store: Path, remediation_id: str, why: str, also_json: str, dry: bool
) -> None:
    try:
        also = records.rows_from_json(also_json, "--also")
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        r, written = records.abandon(store, remediation_id, why, also, dry=dry)
    except records.RecordError as exc:
        raise click.ClickException(f"refused: {exc}") from None
    if dry:
        click.echo(f"{remediation_id}: {r.action} {r.target} ({r.state}) may be declared dead")
        return
    gone = r.detail.get("abandoned") or {}
    said = (f"{remediation_id}: {r.action} {r.target} (started from ops box {r.box or '?'} "
            f"by {r.actor} at {records.utc(int(gone.get('started_ns') or 0))}) declared dead "
            f"by {gone.get('by', '?')} at {records.utc(r.ts_ns)}")  # fmt: skip
    click.echo(f"recorded {said}" if written else f"already recorded: {said}")


def _box_detail(p: dict[str, Any]) -> dict[str, Any]:
    """What a record keeps of the ops boxes: which ran it, which could not be read."""
    out: dict[str, Any] = {}
    if p.get("box"):
        out["box"] = p["box"]
    if p.get("peers_down"):
        out["peers_down"] = p["peers_down"]
    if p.get("controller"):
        out["controller"] = p["controller"]
    return out


def _record_start(store: Path, plan_json: str, check: bool, refused_why: str = "") -> None:
    """The ``running`` row of a run about to start, in this box's store (the playbook
    writes it to every ops box before it touches a switch or a host); with
    ``refused_why``, the ``refused`` row of a run that yielded before touching anything."""
    try:
        p = json.loads(plan_json)
        rid = p["preview_id"] if check else p["remediation_id"]
        action, target = p["action"], p["target"]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"--plan: not a clockmesh plan ({exc})") from None
    detail = {"summary": p.get("summary", ""), "results": [], "cap": p.get("cap", {}),
              "switches": p.get("switches", []), "undo_of": p.get("undo_of", ""),
              **_box_detail(p)}  # fmt: skip
    if refused_why:
        detail["refused"] = refused_why
    if p.get("rerun_of") and not check:
        # In force already (ok on either box): a running row would hide it from the
        # detector and the restore until the re-run ends; the outcome row follows.
        click.echo(f"{rid}: {action} {target} is in force already: a re-run, no start record")
        return
    rem = records.Remediation(
        rid, p.get("anomaly_id", ""), action, target, list(p.get("hosts", [])), check,
        "refused" if refused_why else "running", records.actor(),
        json.dumps(p.get("undo", {})), detail,
    )  # fmt: skip
    try:
        if refused_why and not check:
            # Both boxes took over one dead run at once (same id): a refused row would
            # hide the other box's live start under that id; the audit keeps the yield.
            starts = records.live_starts(store, rid)
            winner = [r for r in starts if r.box != p.get("box", "")]
            if winner and len(winner) < len(starts):  # this box's start among them too
                records.write_audit(store, "remediate (yielded)", target,
                                    {"remediation_id": rid, "refused": refused_why})  # fmt: skip
                click.echo(f"{rid}: yielded to the start from ops box {winner[0].box or '?'} "
                           "of the same id: audited, its running row kept")  # fmt: skip
                return
        records.write_remediation(store, rem)
    except records.RecordError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"recorded {rid}: {action} {target} {rem.status}"
               f"{' (check mode)' if check else ''}"
               f"{' from ops box ' + p['box'] if p.get('box') else ''}")  # fmt: skip


@remediate.command("first")
@_store
@click.option("--plan", "plan_json", required=True, help="The plan (JSON) the playbook runs.")
def first_(store: Path, plan_json: str) -> None:
    """Exit 1, naming it, if this store recorded another start of the same fix before this
    run's (two starts at once, one from each ops box); the playbook asks every ops box
    after writing its start, and goes ahead only if none says so."""
    try:
        p = json.loads(plan_json)
        rid, action, target = p["remediation_id"], p["action"], p["target"]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"--plan: not a clockmesh plan ({exc})") from None
    try:
        earlier = records.started_before(store, rid, action, target, box=str(p.get("box", "")))
    except records.RecordError as exc:
        raise click.ClickException(str(exc)) from None
    if earlier:
        r = earlier[0]
        raise click.ClickException(
            f"{rid}: yielded to {r.remediation_id}, the same {action} {target} started from "
            f"ops box {r.box or '?'} by {r.actor} {records.ago(r.ts_ns)} (recorded first "
            f"here): nothing was touched by {rid}; see clockmesh remediate history"
        )
    click.echo(f"{rid}: the first start of {action} {target} recorded here")


@remediate.command("sync")
@_store
@click.option("--rows", "rows_json", required=True,
              help="Remediations other ops boxes hold (their `remediate history --json`).")  # fmt: skip
def sync(store: Path, rows_json: str) -> None:
    """Copy into this store each remediation row it lacks or holds an older state of
    (the playbook runs it on every ops box first: a box that was down catches up)."""
    try:
        theirs = records.rows_from_json(rows_json, "--rows")
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        copied = records.sync(store, theirs)
    except records.RecordError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"copied {len(copied)} remediation row(s)"
               + (f": {', '.join(r.remediation_id for r in copied)}" if copied else ""))  # fmt: skip


@remediate.command("history")
@_store
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def history(store: Path, as_json: bool) -> None:
    """Every remediation, preview or real, with its state now."""
    try:
        rows = records.read_remediations(store)
    except records.RecordError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2, default=str))
        return
    if not rows:
        click.echo("no remediations yet")
    for r in rows:
        click.echo(f"{r.remediation_id}  {r.action:<16} {r.target:<16} {r.state:<8} by {r.actor} "
                   f"{'from ops box ' + r.box + ' ' if r.box else ''}"
                   f"(anomaly {r.anomaly_id or '-'})")  # fmt: skip


def _check_playbooks() -> None:
    if not runner.PLAYBOOKS.is_dir():
        raise click.ClickException(
            f"{runner.PLAYBOOKS}: no playbooks here: run from a clockmesh checkout"
        )


def _preview_then_run(
    inventory: Path, playbook: str, extra: dict[str, str], yes: bool
) -> tuple[str, runner.RunResult]:
    """Preview in check mode and stream it, say what the real run would change, ask
    (unless ``yes``), run for real and stream it. The outcome — ``refused`` (the preview
    failed or was refused: nothing changed), ``declined``, ``failed`` or ``done`` — with
    the last run's result."""
    click.echo(f"== preview (check mode): {playbook} {extra}")
    # this process, kept in the run's records: while it lives its run is never declared dead
    extra = {**extra, "clockmesh_remediate_controller": f"{socket.gethostname()}:{os.getpid()}"}
    preview = runner.stream(runner.playbook_argv(inventory, playbook, extra, check=True),
                            click.echo)  # fmt: skip
    if not preview.ok:
        return "refused", preview
    changes = {h: n for h, n in preview.changed.items() if n}
    click.echo(f"== the real run would change: {changes or 'nothing'}")
    if not yes and not click.confirm("Run it for real?", default=False):
        return "declined", preview
    real = runner.stream(runner.playbook_argv(inventory, playbook, extra, check=False),
                         click.echo)  # fmt: skip
    return ("done" if real.ok else "failed"), real


def _run(inventory: Path, playbook: str, extra: dict[str, str], yes: bool) -> None:
    _check_playbooks()
    outcome, _ = _preview_then_run(inventory, playbook, extra, yes)
    if outcome == "refused":
        raise click.ClickException(
            f"{playbook}: the preview failed or was refused: nothing changed"
        )
    if outcome == "declined":
        raise click.ClickException("not confirmed: nothing changed")
    if outcome == "failed":
        raise click.ClickException(f"{playbook}: the run failed (recorded as failed)")


_inventory = click.option(
    "-i", "--inventory", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True, help="Ansible inventory of the fleet (and its fabric switches).",
)  # fmt: skip
_yes = click.option("--yes", is_flag=True, help="Do not ask (automation); never the default.")
_box = click.option(
    "--box", default="",
    help="With two ops boxes: the one (its inventory name) that acts; default: the first "
         "of group opsbox whose preflight plans it.",
)  # fmt: skip


def _box_extra(box: str) -> dict[str, str]:
    return {"clockmesh_remediate_box": box} if box else {}


@remediate.command("run")
@click.argument("anomaly_id")
@_inventory
@_yes
@_box
def run(anomaly_id: str, inventory: Path, yes: bool, box: str) -> None:
    """Preview ANOMALY_ID's remediation in check mode, ask, then run it for real."""
    _run(inventory, "remediate.yml", {"anomaly_id": anomaly_id, **_box_extra(box)}, yes)


@remediate.command("undo")
@click.argument("remediation_id")
@_inventory
@_yes
@_box
def undo(remediation_id: str, inventory: Path, yes: bool, box: str) -> None:
    """Preview the undo of REMEDIATION_ID in check mode, ask, then restore for real."""
    _run(inventory, "undo.yml", {"remediation_id": remediation_id, **_box_extra(box)}, yes)


@remediate.command("abandon")
@click.argument("remediation_id")
@_inventory
@click.option("--why", default="", help="Why it is declared dead (kept in the record).")
@_yes
def abandon(remediation_id: str, inventory: Path, why: str, yes: bool) -> None:
    """Declare REMEDIATION_ID's run dead now (its ops box was lost, or its playbook was
    killed): recorded `abandoned` on every ops box that answers, and audited
    (playbooks/abandon.yml), so a start of the same fix from the other box is no longer
    refused. Only for a run that is not going any more: until its outcome or the
    stale-running rule (15 min) a live run blocks a second start."""
    _check_playbooks()
    click.echo(f"== declare {remediation_id} dead on every ops box: a start of the same fix "
               "may then go ahead; its change may be half in place (the next run settles it)")  # fmt: skip
    if not yes and not click.confirm(
        f"Is {remediation_id}'s playbook no longer running anywhere?", default=False
    ):
        raise click.ClickException("not confirmed: nothing recorded")
    extra = {"remediation_id": remediation_id, "abandon_why": why or "declared dead by hand"}
    result = runner.stream(runner.playbook_argv(inventory, "abandon.yml", extra, check=False),
                           click.echo)  # fmt: skip
    if not result.ok:
        raise click.ClickException(f"abandon.yml: {remediation_id} was not recorded dead "
                                   "(see above)")  # fmt: skip


RESTORABLE = ("fabric_link_out", "host_drain")  # what goes back once its link is stable


@remediate.command("restore")
@_store
@_inventory
@click.option("--after", "after_s", type=click.FloatRange(min=0), default=600.0,
              show_default=True,
              help="Seconds the link must have stayed up without a change.")  # fmt: skip
@_yes
def restore(store: Path, inventory: Path, after_s: float, yes: bool) -> None:
    """Put back every link taken out and every host drained whose link has been stable
    for --after seconds: each is the undo of its remediation, previewed, confirmed (or
    --yes, e.g. from cron) and run, with the stability reading guarding the real run too.
    Exit 1 if a run failed; links not yet stable are listed and left as they are."""
    try:
        candidates = [r for r in records.active(store) if r.action in RESTORABLE]
    except records.RecordError as exc:
        raise click.ClickException(str(exc)) from None
    if not candidates:
        click.echo("nothing to restore: no link taken out, no host drained by clockmesh")
        return
    _check_playbooks()
    restored: list[tuple[records.Remediation, str]] = []
    waiting: list[tuple[records.Remediation, str]] = []
    failed: list[tuple[records.Remediation, str]] = []
    for r in candidates:
        extra = {"remediation_id": r.remediation_id, "restore_after_s": f"{after_s:g}"}
        click.echo(f"== {r.remediation_id}: restore {r.action} {r.target}")
        outcome, result = _preview_then_run(inventory, "undo.yml", extra, yes)
        if outcome == "done":
            restored.append((r, ""))
        elif outcome == "declined":
            waiting.append((r, "not confirmed"))
        elif outcome == "failed":
            failed.append((r, "the run failed"))
        else:
            # the guard's reason; the callback may also print it wrapped: keep the whole one
            why = max((ln.split("not stable: ", 1)[1].strip(' "}\'')
                       for ln in result.lines if "not stable: " in ln), key=len, default="")  # fmt: skip
            (waiting if why else failed).append((r, why or "the preview failed"))
    click.echo("== restore summary")
    for label, rows in (("restored", restored), ("left out", waiting), ("failed", failed)):
        for r, why in rows:
            click.echo(f"{label:<9} {r.remediation_id} {r.action} {r.target}"
                       f"{': ' + why if why else ''}")  # fmt: skip
    if failed:
        raise click.ClickException(f"{len(failed)} restore(s) failed (see above)")
