"""The ``remediations`` and ``audits`` tables: every remediation run, preview or real, and
every operator action, as rows in the store.

Written by whoever acts (``clockmesh remediate record``, run by the playbooks on the ops
box), one durable Parquet file per row (temporary name, fsync, rename: a reader never sees
half a file), beside the daemon's files; the daemon's detector reads them back to close
the anomaly a remediation dealt with (:mod:`analytics.detect.detect_runner`).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
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
    status: str  # planned, ok, failed, refused, undone
    actor: str
    undo: str  # the extra vars that undo it, JSON
    detail: dict[str, Any] = field(default_factory=dict)
    ts_ns: int = 0
    state: str = ""  # read back: "preview" for a check-mode run, else its status


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
