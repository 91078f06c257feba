"""Fixtures shared by the unit tests: a real ingest daemon and a small real receiver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.collector_procs import KEY as COLLECTOR_KEY
from tests.unit.collector_receiver import Receiver
from tests.unit.ingest_daemon import Daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """`clockmesh ingest run` in its own process, on a free loopback port."""
    d = Daemon(tmp_path)
    d.start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """The batch contract's HTTP receiver, keyed with the collector tests' fleet key."""
    r = Receiver(COLLECTOR_KEY)
    try:
        yield r
    finally:
        r.close()
