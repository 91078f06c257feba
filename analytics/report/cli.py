"""``clockmesh report``: write the fleet report for a time range."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import click

from analytics.cli_options import store_option, topology_option

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(text: str, now_s: float, what: str) -> int:
    """'24h' / '90m' / '7d' ago, 'now', or an ISO time (UTC unless it says): ns."""
    text = text.strip()
    if text == "now":
        return int(now_s * 1e9)
    m = _DURATION.match(text)
    if m:
        return int((now_s - float(m[1]) * _UNIT_S[m[2]]) * 1e9)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected a duration ago (30m, 24h, 7d), 'now' or an ISO time",
            param_hint=what,
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1e9)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--since", default="24h", show_default=True, help="Start: 24h (ago), or an ISO time.")
@click.option(
    "--until", default="now", show_default=True, help="End: now, 1h (ago), or an ISO time."
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for report.html, report.md (+ SVGs) and report.json.")  # fmt: skip
@store_option()
@topology_option("Racks for the heatmap and the hosts behind each link.")
@click.option("--gpus-per-host", type=click.IntRange(min=0), default=8, show_default=True,
              help="For the GPU-hours at risk.")  # fmt: skip
@click.option("--lost-min", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="GPU minutes a job killed by an outage loses (work since its checkpoint, "
              "and the restart), for the GPU-hours at risk.")  # fmt: skip
def report(since: str, until: str, out: Path, store: Path, topology: Path,
           gpus_per_host: int, lost_min: float) -> None:  # fmt: skip
    """Write the fleet report for a time range: anomalies, timeline, worst links and pairs,
    flap outages against what the jobs crossing each link survive, clock sync, remediations, the latest
    audit, GPU-hours at risk; self-contained HTML (plots inline), Markdown and JSON.

    A run that fails leaves the previous report in OUT as it was.
    """
    from analytics.report.report import Range, ReportError, collect, write

    now = time.time()
    rng = Range(parse_when(since, now, "--since"), parse_when(until, now, "--until"))
    if rng.until_ns <= rng.since_ns:
        raise click.BadParameter("must be after --since", param_hint="--until")
    topo = topology if topology.is_file() else None
    try:
        facts = collect(store, rng, topo, gpus_per_host, lost_min)
        paths = write(facts, out)
    except ReportError as exc:
        raise click.ClickException(str(exc)) from None
    n = len(facts["anomalies"])
    click.echo(f"{paths['html']}: {rng.label()}, {facts['fleet']['hosts']} hosts, "
               f"{n} anomal{'y' if n == 1 else 'ies'}, GPU-hours at risk "
               f"{facts['gpu_hours_at_risk']}")  # fmt: skip
