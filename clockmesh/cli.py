"""The ``clockmesh`` command: one entry point, subcommands loaded lazily.

Subcommands are imported only when invoked, so ``clockmesh collector ...`` on a
fleet host never imports the ops-box packages (which are not installed there).
"""

from __future__ import annotations

import importlib

import click

from clockmesh import __version__

# name -> ("module:attribute", one-line help, extra that provides it)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "collector": ("collector.cli:collector", "Run or inspect the probe/telemetry collector.", ""),
    "daemon": ("collector.supervise:daemon", "Supervise a clockmesh service without systemd.", ""),
    "ingest": ("analytics.ingest.cli:ingest", "Run the ops-box ingest daemon.", "opsbox"),
    "sql": ("analytics.sql_cli:sql", "Query the ops-box store with SQL (read-only).", "opsbox"),
    "export": (
        "analytics.store.export:export",
        "Export recent store data as a Parquet set.",
        "opsbox",
    ),
    "live": (
        "analytics.ingest.live_cli:live",
        "Show fleet health now, from the ops box.",
        "opsbox",
    ),
    "detector": (
        "analytics.detect.cli:detector",
        "Train and evaluate the detector on labelled lab runs.",
        "opsbox",
    ),
    "remediate": (
        "analytics.remediate.cli:remediate",
        "Fix an anomaly safely: preview, confirm, run, record, undo.",
        "opsbox",
    ),
    "audit": (
        "analytics.audit.cli:audit",
        "Record and show the fleet audit (playbooks/audit.yml).",
        "opsbox",
    ),
    "report": (
        "analytics.report.cli:report",
        "Write the fleet report (HTML, Markdown, JSON) for a time range.",
        "opsbox",
    ),
    "tui": ("tui.cli:tui", "The terminal UI: fleet, anomalies, audit, remediation.", "opsbox"),
    "lab": ("lab.cli:lab", "Build and break a leaf-spine lab fabric in namespaces.", "lab"),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(cmd_name)
        if entry is None:
            return None
        target, help_text, extra = entry
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            hint = f" (install clockmesh[{extra}])" if extra else ""
            return _unavailable(cmd_name, help_text, f"{exc.name} is not installed{hint}")
        command = getattr(module, attr)
        if not command.help:
            command.help = help_text
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing must not import every subcommand: use the static help lines.
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _unavailable(name: str, help_text: str, reason: str) -> click.Command:
    @click.command(name=name, help=f"{help_text} [unavailable: {reason}]")
    def missing() -> None:
        raise click.ClickException(f"'clockmesh {name}' is unavailable here: {reason}")

    return missing


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clockmesh")
def cli() -> None:
    """clockmesh keeps the back-end fabric of GPU/RDMA clusters honest.

    Probe mesh and counters on every host, one ops box that stores, solves
    clocks, detects flaps, RoCE v1 jobs and contention, and names the link.
    """


def main() -> None:
    cli(prog_name="clockmesh")


if __name__ == "__main__":  # pragma: no cover
    main()
