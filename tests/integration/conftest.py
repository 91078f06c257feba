"""Fixtures of the integration tests: the unit tests' real processes, reused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_collector_faults import Ingest


@pytest.fixture
def ingest(tmp_path: Path) -> Iterator[Ingest]:
    """A real ingest daemon for the collector's outage test (as tests/unit's)."""
    pytest.importorskip("duckdb")
    ing = Ingest(tmp_path)
    try:
        yield ing
    finally:
        ing.stop()
