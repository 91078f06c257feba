"""A minute-long outage of the ops box (real collector and ingest processes on loopback):
every record arrives exactly once after it. Rootless but a minute by design, so it lives
outside tests/unit (the fast tests) and carries the ``slow`` mark."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from collector.agent import TICK_JITTER, TICK_S
from tests.unit.test_collector_faults import Ingest, _setup

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_ops_box_unreachable_60s_then_back_every_record_exactly_once(
    tmp_path: Path, ingest: Ingest
) -> None:
    ingest.start()
    col, sink, _ = _setup(tmp_path, ingest.url, ingest={"retry_max_s": 5.0})
    try:
        col.start()
        col.wait_status(lambda s: s["shipping"]["segments_acked"] >= 2)
        ingest.stop()
        t_down = time.monotonic()
        col.wait_status(lambda s: s["shipping"]["last_error"] != "")
        time.sleep(max(0.0, 60.0 - (time.monotonic() - t_down)))
        st = col.status()
        # The spool kept rolling while nothing was acked: roll_s 0.5 (the ops box's advice
        # for one host is far shorter), rolled at the first flush after, the next segment
        # opened at the flush after that — flushes fall on the probe ticks, at most
        # TICK_S * (1 + TICK_JITTER) apart, so a segment is at most 1.4 s (~1 s on
        # average: ~62 in 60 s, 58 the fewest in 2,000 simulated minutes).
        assert st["spool"]["roll_s"] == 0.5, st["spool"]  # the config's (write_config)
        longest = st["spool"]["roll_s"] + 2 * TICK_S * (1 + TICK_JITTER)
        assert st["spool"]["segments"] >= int(60 / longest), (longest, st["spool"])
        ingest.start()
        col.wait_status(lambda s: s["spool"]["segments"] <= 1, timeout=60)
        assert col.stop() == 0  # SIGTERM: flush, roll, ship the rest
        final = col.status()
    finally:
        col.stop()
        sink.close()
    assert final["spool"]["segments"] == 0 and final["spool"]["dropped_rows"] == 0
    stored = ingest.probe_tx_seqs("hx")
    assert len(stored) == len(np.unique(stored)), "duplicates"
    # Every probe this collector sent (one seq per probe, consecutive) is stored exactly once.
    assert (np.diff(stored.astype(np.int64)) == 1).all(), "gaps: records lost"
    assert len(stored) == final["probes_sent"]
    assert os.path.getsize(ingest.log) > 0
