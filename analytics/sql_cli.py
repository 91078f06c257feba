"""``clockmesh sql``: query the store through its view catalog.

The catalog's views over the store as this process sees it
(:func:`analytics.store.catalog.connect_views`, in memory: only the views the query names,
and what they read), so it is safe while the ingest daemon runs (it writes Parquet files,
never a reader's views) and works on another mount or copy of the store: ``catalog.duckdb``
holds the paths the daemon saw (``/var/lib/clockmesh/store`` inside the demo's ops box,
``.lab/demo/nodes/ops/var/store`` from the lab's host). docs/sql.md lists the views.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
import sys
from pathlib import Path
from typing import Any

import click

from analytics.cli_options import store_option


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time | dt.timedelta):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def format_table(columns: list[str], rows: list[tuple]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(v)) for w, v in zip(widths, row, strict=True)]
    numeric = [
        all(isinstance(r[i], int | float | decimal.Decimal) or r[i] is None for r in rows)
        for i in range(len(columns))
    ]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def run_query(store: Path, query: str, every: bool = False) -> tuple[list[str], list[tuple]]:
    """Run ``query`` over the catalog's views of ``store`` (those it names; ``every``:
    all); raises click errors."""
    import re

    import duckdb  # heavy: import on use

    from analytics.store.catalog import VIEW_NAMES, connect_views
    from analytics.store.layout import StoreError, require_store

    try:
        require_store(store)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    named = [v for v in VIEW_NAMES if re.search(rf"\b{re.escape(v)}\b", query, re.IGNORECASE)]
    try:
        con = connect_views(store, only=None if every else named)
    except (OSError, duckdb.Error) as exc:
        raise click.ClickException(f"{store}: {str(exc).splitlines()[0]}") from None
    try:
        rel = con.execute(query)
        if rel.description is None:
            return [], []
        columns = [d[0] for d in rel.description]
        return columns, rel.fetchall()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"query failed: {first}") from None
    finally:
        con.close()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("query", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@store_option("Store directory (holds catalog.duckdb).")
@click.option("--list-views", is_flag=True, help="List the catalog's views and exit.")
def sql(query: str | None, fmt: str, store: Path, list_views: bool) -> None:
    """Run a DuckDB SQL QUERY over the clockmesh store (read-only, safe while ingest runs).

    Example: clockmesh sql "SELECT * FROM link_health_now ORDER BY loss DESC LIMIT 10"
    """
    if list_views:
        query = "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
    if not query:
        raise click.UsageError("give a QUERY (or --list-views)")
    columns, rows = run_query(store, query, every=list_views)
    if fmt == "json":
        data = [{c: _plain(v) for c, v in zip(columns, row, strict=True)} for row in rows]
        click.echo(json.dumps(data, indent=1, default=str))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_plain(v) for v in row] for row in rows])
    else:
        click.echo(format_table(columns, rows) if columns else "(no result set)")
