"""The ingest daemon on a real full disk (a 3 MiB tmpfs): it answers 503, keeps serving,
and loses nothing it acknowledged. Root only (mount)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import duckdb
import pytest

from tests.unit.ingest_daemon import Daemon
from tests.unit.test_ingest_daemon import seg


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_real_full_disk_gives_503_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "cmtest-tmpfs", str(mnt)], check=True)
    d = Daemon(tmp_path)
    d.store = mnt / "store"
    d.write_config(store_dir=str(d.store), compression="none")
    try:
        d.start()
        acked, refused = [], 0
        for second in range(400):
            status, answer = d.post(seg(second % 12, second))
            if status == 200:
                acked.append(second)
            else:
                assert status == 503, answer
                refused += 1
                if refused >= 3:
                    break
        assert refused >= 3, "the tmpfs never filled up"
        assert "event=commit_failed" in d.log.read_text() or "event=store_full" in d.log.read_text()
        assert b"clockmesh_ingest_commit_failures_total" in d.get("/metrics")
        assert json.loads(d.get("/v1/live"))["store"]["accepting"] is False  # still serving
        d.stop()
        # read the acknowledged rows back (the catalog may not fit: read files directly)
        con = duckdb.connect()
        n = con.execute(
            f"SELECT count(*) FROM read_parquet('{d.store}/batches/*/*/*.parquet')"
        ).fetchone()[0]
        segs = con.execute(
            f"SELECT count(DISTINCT (host_id, segment)) FROM read_parquet('{d.store}/batches/*/*/*.parquet')"
        ).fetchone()[0]
        assert n == segs == len(acked)
    finally:
        d.stop()
        subprocess.run(["umount", "-l", str(mnt)], check=False)
