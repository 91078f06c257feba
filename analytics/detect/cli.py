"""``clockmesh detector``: judge the detector against labelled runs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from analytics.detect.evaluate import GRACE_NS, EvalError, evaluate, render


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def detector() -> None:
    """The detector: train and evaluate it on labelled lab runs (clockmesh lab scenario run)."""


@detector.command("eval")
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=GRACE_NS / 1e9,
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


@detector.command("train")
@click.argument("runs", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Model file to write (skops); its model card is written beside it (.md).",
)
@click.option(
    "--sim",
    "sim_per_class",
    type=click.IntRange(min=0),
    default=400,
    show_default=True,
    help="Simulated candidates per class added to the lab runs' (0: lab runs only).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds simulator and forest.")
def train_(runs: tuple[Path, ...], out: Path, sim_per_class: int, seed: int) -> None:
    """Fit the detector's models on labelled RUNS and write a model file and its card.

    Each RUN is a directory written by `clockmesh lab scenario run` with a training seed
    (below 1000: evaluation seeds are refused). Point the ops box at the file with
    `detect_model_file` in ingest.yml (through the role: clockmesh_opsbox_extra_config).
    """
    from analytics.detect.model import load
    from analytics.detect.train import TrainError, model_card, train

    try:
        model, card = train(list(runs), sim_per_class, seed)
    except TrainError as exc:
        raise click.ClickException(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    model.save(tmp)
    load(tmp)  # what we ship must load through the same trusted-types check
    tmp.replace(out)
    card_path = out.with_suffix(".md")
    card_path.write_text(model_card(card, out.name), encoding="utf-8")
    click.echo(
        f"wrote {out} and {card_path}: {sum(card['lab_candidates'].values())} lab candidates "
        f"from {len(card['run_seeds'])} run(s), {sum(card['sim_candidates'].values())} simulated, "
        f"{card['healthy_vectors']} healthy vectors"
    )


@detector.command("replay")
@click.argument("run", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="New directory for the replay's store (anomalies, clocks) and truth.json.",
)
@click.option(
    "--topology",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The fabric's topology.json (default: RUN/topology.json).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The run's ingest.yml: the detector's and clock solver's settings "
    "(default: RUN/ingest.yml if there, else the daemon's defaults).",
)
@click.option(
    "--step",
    "step_s",
    type=click.FloatRange(min=0.05),
    default=None,
    help="Seconds between detector passes (default: the config's roll_s: the daemon "
    "runs a pass soon after each group commit).",
)
@click.option(
    "--lag",
    "lag_s",
    type=click.FloatRange(min=0),
    default=0.6,
    show_default=True,
    help="Seconds from a row's own time to its arrival at the ops box (segment and trip).",
)
@click.option(
    "--urgent-lag",
    "urgent_lag_s",
    type=click.FloatRange(min=0),
    default=0.15,
    show_default=True,
    help="The same for link counters and path traces (a link event ships them at once).",
)
@click.option(
    "--minutes",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Replay only this much of the run from its start.",
)
def replay_(
    run: Path,
    out: Path,
    topology: Path | None,
    config_file: Path | None,
    step_s: float | None,
    lag_s: float,
    urgent_lag_s: float,
    minutes: float | None,
) -> None:
    """Replay a stored RUN through today's clock solver and detector, on the run's time.

    Prints each anomaly as it opens (seconds from the run's start); writes what the
    replay's detector wrote to OUT, which `clockmesh detector eval OUT` judges against the
    run's truth as it judges the live run. Remediations run live are not replayed.
    """
    import logging

    from analytics.detect.replay import ReplayError, replay
    from analytics.ingest.config import IngestConfig, detect_config
    from collector import configfile

    def opened(at_s: float, row: dict) -> None:
        place = row.get("link") or row.get("job_id") or ""
        click.echo(f"{at_s:9.2f} s  {row['kind']:<14} {place}: {row['summary']}")

    path = config_file or run / "ingest.yml"
    try:
        ingest = configfile.load(path, IngestConfig) if config_file or path.exists() else None
    except configfile.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    ingest = ingest or IngestConfig()
    detect = detect_config(ingest)  # its topology_file: the run's, given to replay()
    clock = {"window_s": ingest.clock_window_s, "lateness_s": ingest.clock_lateness_s}
    # the daemon's own log lines (anomaly opened, closed, …) say what this command prints:
    # quiet while it runs, as they were after (the command may run inside another process)
    logger = logging.getLogger("clockmesh")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        result = replay(run, out, topology=topology, detect=detect, clock=clock,
                        step_s=step_s or ingest.roll_s, lag_s=lag_s, urgent_lag_s=urgent_lag_s,
                        minutes=minutes, on_open=opened)  # fmt: skip
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        logger.setLevel(level)
    span = (result.end_ns - result.start_ns) / 1e9
    click.echo(
        f"replayed {span:.0f} s in {result.wall_s:.0f} s ({result.passes} passes): "
        f"{len(result.opened)} anomalies opened; written to {out}"
        + (f"; {result.rejected} input batches refused" if result.rejected else "")
        + (f" (clockmesh detector eval {out})" if (out / "truth.json").exists() else "")
    )
