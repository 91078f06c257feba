"""``clockmesh collector ...``: run or inspect the collector on a fleet host.

Started minimal by the Ansible work (the roles validate collector.yml with
``check-config`` before it replaces the old file); the collector grows ``run``
and friends here.
"""

from __future__ import annotations

from pathlib import Path

import click

from collector import config as collector_config
from collector.configfile import ConfigError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def collector() -> None:
    """Run or inspect the probe/telemetry collector."""


@collector.command("check-config")
@click.argument(
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=collector_config.DEFAULT_PATH,
    required=False,
)
def check_config(path: Path) -> None:
    """Validate collector.yml at PATH (default /etc/clockmesh/collector.yml).

    Prints "PATH: ok" and exits 0, or prints one line naming the file, the key and
    what was expected and exits 2.
    """
    try:
        collector_config.load(path)
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(2) from None
    click.echo(f"{path}: ok")
