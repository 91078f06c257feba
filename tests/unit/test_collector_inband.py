from __future__ import annotations

import socket
from pathlib import Path

from collector import records
from collector.config import LabClock
from collector.inband import EVENT_GID, EVENT_RECV, EVENT_SEND, InbandHook, pack_report
from collector.lab_clock import RecordingClock

HOST = records.host_id("h01")


def test_reports_become_rows_and_garbage_is_counted(tmp_path: Path) -> None:
    clock = RecordingClock(LabClock(offset_ns=1000, drift_ppm=0.0), t0_ns=0)
    path = tmp_path / "run/inband.sock"
    path.parent.mkdir()
    path.write_text("stale socket file from a previous run")
    hook = InbandHook(path, HOST, clock)
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        peer = records.host_id("h02")
        batch = pack_report(EVENT_SEND, "job-a", 5, 1, peer, 4096, 10_000) + pack_report(
            EVENT_RECV, "job-a", 5, 1, peer, 4096, 20_000
        )
        client.sendto(batch, str(path))
        client.sendto(pack_report(EVENT_GID, "job-a", 0, 0, 0, 3, 0), str(path))
        client.sendto(b"short", str(path))
        client.sendto(b"XXXX" + batch[4:80], str(path))
        rows, jobs = hook.drain()
    finally:
        hook.close()
    assert rows["event"].tolist() == [0, 1]
    assert rows["event_ns"].tolist() == [11_000, 21_000]  # the lab skew applies here too
    assert (rows["job_id"] == b"job-a").all() and (rows["peer"] == peer).all()
    assert rows["nbytes"].tolist() == [4096, 4096]
    assert jobs["gid_index"].tolist() == [3] and jobs["source"].tolist() == [b"inband"]
    assert hook.received == 3 and hook.rejected == 2
    assert not path.exists()
