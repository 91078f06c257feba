"""``clockmesh ingest``: run the ops-box ingest daemon, or check its configuration."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from analytics.ingest import config as ingest_config
from analytics.store.layout import StoreError
from collector.configfile import ConfigError

_CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    default=str(ingest_config.DEFAULT_PATH),
    show_default=True,
    type=click.Path(dir_okay=False),
    help="ingest.yml to load.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def ingest() -> None:
    """Run the ops-box ingest daemon (HTTP batches in, Parquet store out)."""


def _load(
    config_path: str,
) -> tuple[ingest_config.IngestConfig, ingest_config.ResolvedIngest, bytes]:
    try:
        config, resolved = ingest_config.load(config_path)
        key = ingest_config.read_fleet_key(config.fleet_key_file, config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    return config, resolved, key


@ingest.command("check-config")
@_CONFIG_OPTION
def check_config(config_path: str) -> None:
    """Validate ingest.yml and the fleet key file; print the effective settings."""
    config, resolved, _key = _load(config_path)
    click.echo(
        f"{config_path}: ok (listen {resolved.host}:{resolved.port}, store {config.store_dir})"
    )


@ingest.command("run")
@_CONFIG_OPTION
def run(config_path: str) -> None:
    """Serve POST /v1/batch, GET /metrics and GET /v1/live until SIGTERM/SIGINT."""
    config, resolved, key = _load(config_path)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    from analytics.ingest.server import IngestServer  # heavy: only when running

    server = IngestServer(config, resolved, key)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await server.start()
        await stop.wait()
        logging.getLogger("clockmesh.ingest").info("event=stopping")
        await server.stop()

    try:
        try:
            import uvloop  # faster event loop when installed (opsbox extra)

            uvloop.run(main())
        except ImportError:
            asyncio.run(main())
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{config_path}: listen/store: {exc.strerror or exc}") from None
