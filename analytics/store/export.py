"""``clockmesh export``: a self-contained copy of the last N hours of the store.

The copy has the same layout (``<table>/date=/hour=/*.parquet``, placeholders,
``store.json``) and its own ``catalog.duckdb`` pointing at the copy, so ``clockmesh sql
--store DIR`` and ``duckdb -readonly DIR/catalog.duckdb`` work on it, and the Parquet
tree can go to object storage for Spark/Trino/ClickHouse. Files are hard-linked when the
target is on the store's filesystem (Parquet files are immutable: compaction writes new
files and unlinks old ones, so a link keeps the exported content), copied otherwise.
The export is built in a temporary sibling directory and renamed into place; the catalog
is written last (an interrupted export removes what it made).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import click

from analytics.cli_options import store_option
from analytics.store import layout


@dataclass
class ExportResult:
    files: int = 0
    bytes: int = 0
    linked: int = 0
    partitions: int = 0


def _place(src: Path, dst: Path) -> bool:
    """Hard-link ``src`` to ``dst`` (True) or copy it (False)."""
    try:
        os.link(src, dst)
        return True
    except OSError as exc:
        if exc.errno not in (18, 1, 95):  # EXDEV, EPERM, EOPNOTSUPP
            raise
    shutil.copy2(src, dst)
    return False


def _export_partition(src: Path, dst: Path, result: ExportResult) -> None:
    for _attempt in range(5):
        dst.mkdir(parents=True, exist_ok=True)
        placed: list[Path] = []
        try:
            for entry in sorted(os.scandir(src), key=lambda e: e.name):
                if layout.file_commit_range(entry.name) is None:
                    continue
                target = dst / entry.name
                linked = _place(src / entry.name, target)
                placed.append(target)
                result.linked += linked
        except FileNotFoundError:
            # compaction replaced files while we listed: start this partition again
            for p in placed:
                p.unlink(missing_ok=True)
            continue
        for p in placed:
            result.files += 1
            result.bytes += p.stat().st_size
        result.partitions += 1
        return
    raise click.ClickException(f"{src}: files keep changing under the export; try again")


def export_store(store: Path, target: Path, since_s: float, tables: list[str]) -> ExportResult:
    from analytics.store.catalog import write_catalog
    from analytics.store.store_writer import StoreWriter

    layout.require_store(store)
    if target.exists() and any(target.iterdir()):
        raise click.ClickException(f"{target}: exists and is not empty; choose a new directory")
    staging = target.with_name(f".{target.name}.export-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    result = ExportResult()
    since_bucket = int((time.time() - since_s) // 3600)
    reader = StoreWriter(store)  # used only to walk partitions; nothing is written
    try:
        shutil.copy2(store / "store.json", staging / "store.json")
        for table in layout.TABLES:
            placeholder = store / table / layout.PLACEHOLDER_PARTITION / layout.PLACEHOLDER_NAME
            ph_dst = staging / table / layout.PLACEHOLDER_PARTITION
            ph_dst.mkdir(parents=True)
            if placeholder.exists():
                shutil.copy2(placeholder, ph_dst / layout.PLACEHOLDER_NAME)
            if table not in tables:
                continue
            for bucket, part in reader.partitions(table):
                if bucket >= since_bucket:
                    rel = part.relative_to(store)
                    _export_partition(part, staging / rel, result)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        write_catalog(target)  # views bind to their files: only once they are in place
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return result


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--since",
    default="24h",
    show_default=True,
    help="How far back to export (30m, 24h, 7d): whole hour partitions from then on.",
)
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="New directory to create (must not exist or be empty).",
)
@store_option("Store directory to export from.")
@click.option(
    "--table",
    "tables",
    multiple=True,
    help="Export only this table (repeatable; default: all). Others get empty placeholders.",
)
def export(since: str, target: Path, store: Path, tables: tuple[str, ...]) -> None:
    """Export the last --since of the store to --to as a self-contained Parquet set."""
    try:
        since_s = layout.parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    unknown = sorted(set(tables) - set(layout.TABLES))
    if unknown:
        raise click.BadParameter(
            f"unknown table {unknown[0]!r} (expected one of {', '.join(layout.TABLES)})",
            param_hint="--table",
        )
    try:
        result = export_store(store, target, since_s, list(tables) or list(layout.TABLES))
    except layout.StoreError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{target}: {exc.strerror or exc}") from None
    click.echo(
        f"exported {result.files} files ({result.bytes} bytes, {result.linked} hard-linked) "
        f"in {result.partitions} partitions to {target}"
    )
