"""The ``remediations`` and ``audits`` tables: every remediation run, preview or real, and
every operator action, as rows in the store.

Written by whoever acts (``clockmesh remediate record``, run by the playbooks on the ops
box), one durable Parquet file per row (temporary name, fsync, rename: a reader never sees
half a file), beside the daemon's files; the daemon's detector reads them back to close
the anomaly a remediation dealt with (:mod:`analytics.detect.detect_runner`).

With two ops boxes (docs/deploy.md, "Two ops boxes") the playbook writes the same rows to
both stores: a ``running`` row before anything changes, the outcome after. The box that
acted is ``detail["box"]``. :func:`merge` is the union of what several stores hold, and
:func:`counted` what the blast-radius cap counts in it: real remediations that succeeded
or are running (a run still going, or one whose box died before it could say).

The stale-running rule (:data:`RUNNING_STALE_S`): a ``running`` row is a live run for 15
minutes after it was written; with no outcome by then (:func:`dead_at_ns`) its run is
taken for dead and no longer blocks a start of the same fix from the other box. An
operator who knows sooner (the box is lost, the playbook was killed) declares it dead at
once with :func:`abandon` (``clockmesh remediate abandon``): an ``abandoned`` row, in every
store that answers, and an audits row. A dead or abandoned run still counts in the cap
(its change may be half in place) until a run of the same fix takes it over under the
same id and records how it ended.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from analytics.store import layout
from analytics.store.catalog import connect_views


class RecordError(Exception):
    """The store cannot be read or written; ``str()`` is one line naming it."""


@dataclass
class Remediation:
    remediation_id: str
    anomaly_id: str
    action: str
    target: str
    hosts: list[str]
    check_mode: bool
    status: str  # running, ok, failed, refused, undone, abandoned
    actor: str
    undo: str  # the extra vars that undo it, JSON
    detail: dict[str, Any] = field(default_factory=dict)
    ts_ns: int = 0
    state: str = ""  # read back: "preview" for a check-mode run, else its status

    @property
    def box(self) -> str:
        """The ops box (its inventory name) whose playbook run this is; "" when unknown."""
        return str(self.detail.get("box", ""))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Remediation:
        """A row as ``clockmesh remediate history --json`` prints it (another box's)."""
        return cls(
            str(d["remediation_id"]), str(d.get("anomaly_id", "")), str(d["action"]),
            str(d.get("target", "")), [str(h) for h in d.get("hosts") or []],
            bool(d.get("check_mode")), str(d["status"]), str(d.get("actor", "")),
            str(d.get("undo", "")), dict(d.get("detail") or {}), int(d.get("ts_ns") or 0),
            str(d.get("state") or ("preview" if d.get("check_mode") else d["status"])),
        )  # fmt: skip


def actor() -> str:
    """Who acts: the sudo user behind root when there is one."""
    return os.environ.get("SUDO_USER") or os.environ.get("USER") or getpass.getuser()


def new_id(anomaly_id: str, action: str, target: str) -> str:
    seed = f"{anomaly_id}|{action}|{target}|{time.time_ns()}"
    return "rem-" + hashlib.blake2b(seed.encode(), digest_size=5).hexdigest()


def write_table(store: Path, table: str, cols: dict[str, list[Any]], name: str) -> Path:
    """One durable Parquet file of ``cols`` in ``table``'s hour partition of its first row."""
    spec = layout.TABLES[table]
    if not store.is_dir():
        raise RecordError(f"{store}: no such store directory")
    data = pa.table(cols, schema=spec.schema)
    bucket = int(cols[spec.time_column][0]) // layout.NS_PER_HOUR
    part = store / table / layout.partition_of(bucket)
    layout.make_dirs_durable(part)
    path = part / name
    tmp = path.with_name(name + ".tmp")
    pq.write_table(data, tmp, compression="zstd")
    layout.fsync_file(tmp)
    os.replace(tmp, path)
    layout.fsync_dir(part)
    return path


def write_remediation(store: Path, r: Remediation) -> Path:
    r.ts_ns = r.ts_ns or time.time_ns()
    cols: dict[str, list[Any]] = {
        "ts_ns": [r.ts_ns],
        "remediation_id": [r.remediation_id],
        "anomaly_id": [r.anomaly_id],
        "action": [r.action],
        "target": [r.target],
        "hosts": [",".join(r.hosts)],
        "check_mode": [r.check_mode],
        "status": [r.status],
        "actor": [r.actor],
        "undo": [r.undo],
        "detail": [json.dumps(r.detail, sort_keys=True)],
    }
    return write_table(store, "remediations", cols, f"{r.remediation_id}-{r.ts_ns}.parquet")


def write_audit(store: Path, action: str, target: str, detail: dict[str, Any]) -> Path:
    ts = time.time_ns()
    cols: dict[str, list[Any]] = {
        "ts_ns": [ts],
        "actor": [actor()],
        "action": [action],
        "target": [target],
        "detail": [json.dumps(detail, sort_keys=True)],
    }
    return write_table(store, "audits", cols, f"audit-{ts}.parquet")


def read_remediations(store: Path) -> list[Remediation]:
    """Every remediation's latest row (the catalog's ``remediation_current``), oldest first."""
    if not layout.has_files(store, "remediations"):
        return []
    try:
        con = connect_views(store, only=["remediation_current"])
    except FileNotFoundError as exc:
        raise RecordError(str(exc)) from None
    try:
        rows = con.execute(
            """SELECT ts_ns, remediation_id, anomaly_id, action, target, hosts, check_mode,
                      status, actor, undo, detail, state
               FROM remediation_current ORDER BY ts_ns, remediation_id"""
        ).fetchall()
    except duckdb.Error as exc:
        raise RecordError(f"{store}/remediations: cannot be read ({exc})") from None
    finally:
        con.close()
    return [
        Remediation(rid, aid, action, target, [h for h in hosts.split(",") if h], bool(check),
                    status, who, undo, json.loads(detail or "{}"), ts, state)
        for ts, rid, aid, action, target, hosts, check, status, who, undo, detail, state in rows
    ]  # fmt: skip


def active(store: Path) -> list[Remediation]:
    """Real remediations that succeeded and have not been undone: what is in force now."""
    return [r for r in read_remediations(store) if r.status == "ok" and not r.check_mode]


def rows_from_json(text: str, what: str = "--also") -> list[Remediation]:
    """Rows another box printed (``clockmesh remediate history --json``); a one-line
    ``ValueError`` naming ``what`` when it is not that."""
    try:
        doc = json.loads(text or "[]")
        if not isinstance(doc, list):
            raise TypeError("not a list")
        return [Remediation.from_dict(d) for d in doc]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"{what}: expected the JSON list of `clockmesh remediate history --json` ({exc})"
        ) from None


def merge(*stores: list[Remediation]) -> list[Remediation]:
    """The union of several stores' current remediations: each remediation once, its
    latest row (by time; at a tie a real row over a preview, then the stronger outcome)."""
    rank = {"undone": 5, "ok": 4, "failed": 3, "refused": 2, "abandoned": 1, "running": 0}
    best: dict[str, Remediation] = {}
    for rows in stores:
        for r in rows:
            have = best.get(r.remediation_id)
            key = (r.ts_ns, not r.check_mode, rank.get(r.status, -1))
            if have is None or key > (have.ts_ns, not have.check_mode, rank.get(have.status, -1)):
                best[r.remediation_id] = r
    return sorted(best.values(), key=lambda r: (r.ts_ns, r.remediation_id))


def counted(rows: list[Remediation]) -> list[Remediation]:
    """What the blast-radius cap counts: real remediations in force (``ok``) or under way
    (``running``: a run on either box, or one whose box was lost before it said how it
    ended; ``abandoned``: declared dead — the change may be in place, so it counts until
    a run or an undo settles it)."""
    return [r for r in rows if not r.check_mode and r.status in ("ok", "running", "abandoned")]


def sync(store: Path, theirs: list[Remediation]) -> list[Remediation]:
    """Write into ``store`` each of ``theirs`` (another box's current rows) that it lacks
    or holds an older state of, as it is (same time, same file name: idempotent).
    Returns the rows written."""
    mine = {r.remediation_id: r for r in read_remediations(store)}
    out = []
    for r in merge(theirs):
        have = mine.get(r.remediation_id)
        if have is None or (merge([have], [r])[0] is r and have.ts_ns != r.ts_ns):
            write_remediation(store, r)
            out.append(r)
    return out


RUNNING_STALE_S = 900.0  # a run still "running" after this long: its box died mid-run


def dead_at_ns(r: Remediation) -> int:
    """When ``r``'s run, ``running`` with no outcome, is taken for dead (the stale-running
    rule: ``RUNNING_STALE_S`` after its start was written)."""
    return r.ts_ns + int(RUNNING_STALE_S * 1e9)


def live(r: Remediation, now_ns: int | None = None) -> bool:
    """A real run under way: ``running``, neither past the stale-running rule nor declared
    dead (``abandoned``)."""
    return r.status == "running" and not r.check_mode and (now_ns or time.time_ns()) < dead_at_ns(r)


def running_elsewhere(
    rows: list[Remediation], action: str, target: str, box: str, now_ns: int | None = None
) -> Remediation | None:
    """A live run (:func:`live`) of ``action`` on ``target`` started from another ops box
    than ``box`` (any box when ``box`` is ""): a second start would race it."""
    now_ns = now_ns or time.time_ns()
    for r in reversed(rows):
        if (
            live(r, now_ns) and r.action == action and r.target == target
            and (not box or r.box != box)
        ):  # fmt: skip
            return r
    return None


def controller_alive(r: Remediation) -> str:
    """``"pid N on HOST"`` when the controller that started ``r``'s run (``detail.controller``,
    the host and pid of the ``clockmesh remediate run|undo|restore`` behind it) is a live
    process on this host that started before the run's start was written; "" when it is
    gone, elsewhere or unknown (a playbook run by hand, from the TUI)."""
    host, _, pid = str(r.detail.get("controller", "")).rpartition(":")
    if not host or host != socket.gethostname() or not pid.isdigit():
        return ""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines()
                    if ln.startswith("btime "))  # fmt: skip
        started_s = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, StopIteration, ValueError):
        return ""
    alive = fields[0] not in ("Z", "X") and started_s <= r.ts_ns / 1e9 + 1
    return f"pid {pid} on {host}" if alive else ""


def abandon(
    store: Path,
    remediation_id: str,
    why: str,
    also: list[Remediation] | None = None,
    dry: bool = False,
) -> tuple[Remediation, bool]:
    """Declare ``remediation_id``'s run dead now (its box lost, its playbook killed): an
    ``abandoned`` row in ``store`` and an ``audits`` row (``abandon``). ``also``: the other
    ops boxes' rows, so a box that lacks the run (it was down) records it too, and a run
    another box saw end is never declared dead here. Returns the row and whether it was
    written (False: ``store`` holds that declaration already; or ``dry``: only checked).
    A run that is not ``running`` in the union of the stores is refused (``RecordError``,
    one line), and so is one whose controller is alive on this host (:func:`controller_alive`):
    that run is not dead."""
    rows = merge(read_remediations(store), also or [])
    r = {x.remediation_id: x for x in rows}.get(remediation_id)
    if r is None:
        raise RecordError(f"remediation {remediation_id}: not in {store}/remediations")
    if r.check_mode:
        raise RecordError(
            f"remediation {remediation_id} was a check-mode preview: it never ran, nothing to "
            "declare dead"
        )
    if r.status == "abandoned":  # declared on the other box: copy it here, once
        mine = {x.remediation_id: x for x in read_remediations(store)}.get(remediation_id)
        if dry or (mine is not None and mine.status == "abandoned"):
            return r, False
        write_remediation(store, r)
        return r, True
    if r.status != "running":
        raise RecordError(
            f"remediation {remediation_id} is {r.status} (recorded {ago(r.ts_ns)}): its run "
            "ended, nothing to declare dead"
        )
    who = controller_alive(r)
    if who:
        raise RecordError(
            f"remediation {remediation_id} is still going: the clockmesh remediate that started "
            f"it ({who}) is alive; end it first (kill {who.split()[1]}) or wait for its outcome"
        )
    if dry:
        return r, False
    now = time.time_ns()
    dead = Remediation(
        r.remediation_id, r.anomaly_id, r.action, r.target, list(r.hosts), False, "abandoned",
        r.actor, r.undo, {**r.detail, "abandoned": {"by": actor(), "why": why, "ts_ns": now,
                                                    "started_ns": r.ts_ns}}, now,
    )  # fmt: skip
    write_remediation(store, dead)
    write_audit(store, "abandon", r.target,
                {"remediation_id": r.remediation_id, "action": r.action, "box": r.box,
                 "started_ns": r.ts_ns, "why": why})  # fmt: skip
    return dead, True


def _from_rows(rows: list[tuple[Any, ...]]) -> list[Remediation]:
    return [
        Remediation(rid, aid, action, target, [h for h in hosts.split(",") if h], bool(check),
                    status, who, undo, json.loads(detail or "{}"), ts, status)
        for ts, rid, aid, action, target, hosts, check, status, who, undo, detail in rows
    ]  # fmt: skip


def live_starts(store: Path, remediation_id: str, now_ns: int | None = None) -> list[Remediation]:
    """The live starts (:func:`live`) of ``remediation_id`` that ``store`` recorded since its
    last outcome (or ``abandoned``), oldest first: more than one when both ops boxes took
    over the same dead run at once, one ``running`` row each (same id, each its box)."""
    if not layout.has_files(store, "remediations"):
        return []
    now_ns = now_ns or time.time_ns()
    try:
        con = connect_views(store, only=["remediations"])
    except FileNotFoundError as exc:
        raise RecordError(str(exc)) from None
    try:
        rows = _from_rows(con.execute(
            """SELECT ts_ns, remediation_id, anomaly_id, action, target, hosts, check_mode,
                      status, actor, undo, detail
               FROM remediations WHERE remediation_id = ? AND NOT check_mode
               ORDER BY ts_ns, status""", [remediation_id]).fetchall())  # fmt: skip
    except duckdb.Error as exc:
        raise RecordError(f"{store}/remediations: cannot be read ({exc})") from None
    finally:
        con.close()
    ended = max((i for i, r in enumerate(rows) if r.status != "running"), default=-1)
    return [r for r in rows[ended + 1 :] if live(r, now_ns)]


def started_before(
    store: Path,
    remediation_id: str,
    action: str,
    target: str,
    now_ns: int | None = None,
    box: str = "",
) -> list[Remediation]:
    """Other real runs of ``action`` on ``target`` (running, or done and in force) that
    ``store`` recorded as started before ``remediation_id`` — two starts of one fix at once,
    one from each ops box. Each box's store orders the two starts by when it wrote them;
    a run goes ahead only if no store that answers holds another before it, so at most one
    of two simultaneous starts goes ahead (both may yield: run it again). A ``running`` row
    older than ``RUNNING_STALE_S`` is a dead run's, not counted. Two boxes taking over the
    same dead run start under the same id: with ``box`` (the box this run is from), the
    other box's live start of that id written before this box's counts too."""
    if not layout.has_files(store, "remediations"):
        return []
    now_ns = now_ns or time.time_ns()
    if box:
        starts = live_starts(store, remediation_id, now_ns)
        own = [r for r in starts if r.box == box]
        if own:
            first = [r for r in starts if r.box != box and (r.ts_ns, r.box) < (own[-1].ts_ns, box)]
            if first:
                return first[:1]
    try:
        con = connect_views(store, only=["remediation_current"])
    except FileNotFoundError as exc:
        raise RecordError(str(exc)) from None
    try:
        mine = con.execute(
            "SELECT min(first_ns) FROM remediation_current WHERE remediation_id = ?",
            [remediation_id],
        ).fetchone()
        if mine is None or mine[0] is None:
            raise RecordError(f"{store}/remediations: no start of {remediation_id} recorded")
        ids = [
            rid
            for (rid,) in con.execute(
                """SELECT remediation_id FROM remediation_current
                   WHERE action = ? AND target = ? AND NOT check_mode AND remediation_id <> ?
                     AND (status = 'ok' OR (status = 'running' AND ts_ns > ?))
                     AND (first_ns < ? OR (first_ns = ? AND remediation_id < ?))""",
                [action, target, remediation_id, now_ns - int(RUNNING_STALE_S * 1e9),
                 mine[0], mine[0], remediation_id],
            ).fetchall()
        ]  # fmt: skip
    except duckdb.Error as exc:
        raise RecordError(f"{store}/remediations: cannot be read ({exc})") from None
    finally:
        con.close()
    return [r for r in read_remediations(store) if r.remediation_id in ids]


def utc(ts_ns: int) -> str:
    """``"2026-11-26 20:14:03 UTC"``: a moment an operator compares with a clock."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts_ns / 1e9))


def _span(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def ago(ts_ns: int, now_ns: int | None = None) -> str:
    """``"42 s ago"``, ``"3 min ago"``, ``"2.5 h ago"``."""
    return _span(max(0.0, ((now_ns or time.time_ns()) - ts_ns) / 1e9)) + " ago"


def ahead(ts_ns: int, now_ns: int | None = None) -> str:
    """``"in 11 min"``; ``"3 min ago"`` once past."""
    s = (ts_ns - (now_ns or time.time_ns())) / 1e9
    return f"in {_span(s)}" if s > 0 else ago(ts_ns, now_ns)
