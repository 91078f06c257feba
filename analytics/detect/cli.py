"""``clockmesh detector``: judge the detector against labelled runs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from analytics.detect.evaluate import EvalError, evaluate, render


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def detector() -> None:
    """The detector: evaluate it on labelled lab runs (clockmesh lab scenario run)."""


@detector.command("eval")
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=15.0,
    show_default=True,
    help="Seconds after a fault ends in which its anomaly still counts.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def eval_(runs: tuple[Path, ...], grace_s: float, as_json: bool) -> None:
    """Confusion matrix, per-class precision/recall, localisation and latency over RUNS.

    Each RUN is a directory written by `clockmesh lab scenario run` (truth.json + store/).
    """
    try:
        report = evaluate(list(runs), grace_s)
    except EvalError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else render(report))
