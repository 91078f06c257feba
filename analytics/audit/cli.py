"""``clockmesh audit``: record a fleet audit's results in the store and show the latest."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import click
import duckdb

from analytics.cli_options import store_option
from analytics.remediate import records
from analytics.store.catalog import connect_views
from analytics.store.layout import has_files

STATUSES = ("pass", "fail", "skipped")

_store = store_option()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def audit() -> None:
    """The fleet audit (playbooks/audit.yml): record results, show the latest run."""


@audit.command("record")
@_store
@click.option("--results", "results_json", required=True,
              help='JSON: {"host": [{"category", "check", "status", "reason", "value"}, ...]}')  # fmt: skip
def record(store: Path, results_json: str) -> None:
    """Store one audit run (the playbook's last play calls it) and print its summary."""
    try:
        doc = json.loads(results_json)
        rows = [
            (host, str(c["category"]), str(c["check"]), str(c["status"]), str(c["reason"]),
             str(c.get("value", "")))
            for host, checks in doc.items() for c in checks
        ]  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise click.ClickException(f"--results: not audit results ({exc})") from None
    bad = sorted({r[3] for r in rows} - set(STATUSES))
    if bad:
        raise click.ClickException(f"--results: status {bad[0]!r}: expected pass, fail or skipped")
    ts = time.time_ns()
    run_id = f"audit-{ts // 1_000_000_000}"
    cols: dict[str, list[Any]] = {
        "ts_ns": [ts] * len(rows), "run_id": [run_id] * len(rows),
        "host": [r[0] for r in rows], "category": [r[1] for r in rows],
        "check": [r[2] for r in rows], "status": [r[3] for r in rows],
        "reason": [r[4] for r in rows], "value": [r[5] for r in rows],
    }  # fmt: skip
    try:
        if rows:
            records.write_table(store, "fleet_audit", cols, f"{run_id}.parquet")
        counts = Counter(r[3] for r in rows)
        records.write_audit(store, "fleet audit", ",".join(sorted(doc)),
                            {"run_id": run_id, **{k: counts.get(k, 0) for k in STATUSES}})  # fmt: skip
    except records.RecordError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render(run_id, [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]))


def latest(store: Path) -> tuple[str, list[tuple[str, ...]]]:
    if not has_files(store, "fleet_audit"):
        raise click.ClickException(
            f"{store}: no fleet audit yet: run ansible-playbook playbooks/audit.yml"
        )
    try:
        con = connect_views(store, only=["fleet_audit_latest"])
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        rows = con.execute(
            """SELECT run_id, host, category, "check", status, reason, value
               FROM fleet_audit_latest ORDER BY category, "check", host"""
        ).fetchall()
    except duckdb.Error as exc:
        raise click.ClickException(f"{store}/fleet_audit: cannot be read ({exc})") from None
    finally:
        con.close()
    if not rows:  # only the store's empty placeholder file
        raise click.ClickException(
            f"{store}: no fleet audit yet: run ansible-playbook playbooks/audit.yml"
        )
    return rows[0][0], [tuple(r[1:]) for r in rows]


def render(run_id: str, rows: list[tuple[str, ...]]) -> str:
    """category → check → host, with pass/fail/skipped counts; failures spelled out."""
    total = Counter(r[3] for r in rows)
    hosts = sorted({r[0] for r in rows})
    lines = [
        f"{run_id}: {len(hosts)} host(s), " + ", ".join(f"{total.get(s, 0)} {s}" for s in STATUSES)
    ]
    tree: dict[str, dict[str, list[tuple[str, ...]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        tree[r[1]][r[2]].append(r)
    for category in sorted(tree):
        c = Counter(r[3] for checks in tree[category].values() for r in checks)
        lines.append(f"{category}  ({', '.join(f'{c.get(s, 0)} {s}' for s in STATUSES)})")
        for check in sorted(tree[category]):
            got = tree[category][check]
            cc = Counter(r[3] for r in got)
            mark = "FAIL" if cc.get("fail") else ("pass" if cc.get("pass") else "skipped")
            lines.append(
                f"  {mark:<7} {check}: " + ", ".join(f"{cc[s]} {s}" for s in STATUSES if cc.get(s))
            )
            for r in got:
                if r[3] == "fail":
                    lines.append(f"           {r[0]}: {r[4]}" + (f" [{r[5]}]" if r[5] else ""))
            skipped = {r[4] for r in got if r[3] == "skipped"}
            for reason in sorted(skipped):
                lines.append(f"           skipped: {reason}")
    return "\n".join(lines)


@audit.command("show")
@_store
@click.option("--json", "as_json", is_flag=True, help="Print the latest run's rows as JSON.")
def show(store: Path, as_json: bool) -> None:
    """The latest fleet audit as a tree: category → check → host, with counts."""
    run_id, rows = latest(store)
    if as_json:
        keys = ("host", "category", "check", "status", "reason", "value")
        click.echo(
            json.dumps(
                {"run_id": run_id, "checks": [dict(zip(keys, r, strict=True)) for r in rows]},
                indent=2,
            )
        )
        return
    click.echo(render(run_id, rows))
