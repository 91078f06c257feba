"""The click options several commands share, declared once: ``--store`` (honouring
``$CLOCKMESH_STORE`` in every command that takes it) and ``--topology``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

DEFAULT_STORE = "/var/lib/clockmesh/store"
DEFAULT_TOPOLOGY = "/etc/clockmesh/topology.json"
STORE_ENV = "CLOCKMESH_STORE"

F = TypeVar("F", bound=Callable[..., Any])


def store_option(help: str = "The ops box's store directory.") -> Callable[[F], F]:
    """``--store DIR``: $CLOCKMESH_STORE when set, else /var/lib/clockmesh/store."""
    return click.option(
        "--store",
        type=click.Path(file_okay=False, path_type=Path),
        envvar=STORE_ENV,
        default=DEFAULT_STORE,
        show_default=f"${STORE_ENV} or {DEFAULT_STORE}",
        help=help,
    )


def topology_option(
    help: str = "Fabric topology (the ops box's copy; a lab's topology.json).",
) -> Callable[[F], F]:
    """``--topology FILE``, read with :func:`analytics.topology.read_topology`."""
    return click.option(
        "--topology",
        type=click.Path(dir_okay=False, path_type=Path),
        default=DEFAULT_TOPOLOGY,
        show_default=True,
        help=help,
    )
