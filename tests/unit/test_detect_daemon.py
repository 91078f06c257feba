"""The detector live in the real ingest daemon: batches in, anomalies out everywhere."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from collector import records, wire
from tests.unit.ingest_daemon import Daemon, assert_promtool_clean

S = 1_000_000_000


def _counter_rows(host: str, ts_ns: int, oper: int, downs: int, delta: int) -> np.ndarray:
    hid = records.host_id(host)
    return np.array(
        [
            (ts_ns, hid, b"bk0", 0, 0, (0,) * 5, b"operstate", oper, 0),
            (ts_ns, hid, b"bk0", 0, 0, (0,) * 5, b"carrier_down_count", downs, delta),
        ],
        records.COUNTER,
    )


def _send(d: Daemon, host: str, segment: int, table: str, rows: np.ndarray) -> None:
    body = wire.encode_header(host, records.host_id(host), segment, time.time_ns())
    body += wire.encode_chunk(table, rows)
    status, reply = d.post(body)
    assert status == 200, reply


def _live(d: Daemon) -> dict:
    return json.loads(d.get("/v1/live"))["anomalies"]


def _wait(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_flap_and_roce_v1_job_open_live_stored_and_close(tmp_path: Path) -> None:
    topo = {
        "hosts": [{"name": "gpu1"}, {"name": "gpu2"}],
        "links": [
            {
                "name": "gpu1-leaf1",
                "kind": "access",
                "a": {"node": "gpu1", "interface": "bk0"},
                "b": {"node": "leaf1", "interface": "gpu1"},
            }
        ],
    }
    (tmp_path / "topology.json").write_text(json.dumps(topo))
    d = Daemon(
        tmp_path,
        detect_interval_s=0.2,
        detect_clear_s=1.5,
        topology_file=str(tmp_path / "topology.json"),
    )
    d.start()
    try:
        now = time.time_ns()
        _send(d, "gpu1", 1, "counter", _counter_rows("gpu1", now - 2 * S, 6, 0, 0))
        _send(d, "gpu1", 2, "counter", _counter_rows("gpu1", now - S, 2, 1, 1))
        # named from that one batch, nothing more sent (how fast is the lab tests' and
        # bench_detect's to measure, in the data's time, not a unit test's on a busy box)
        _wait(lambda: bool(_live(d)["open"]))
        (a,) = _live(d)["open"]
        assert a["kind"] == "flapping_link" and a["link"] == "gpu1-leaf1"
        assert "down now" in a["summary"]
        assert _live(d)["open_by_kind"]["flapping_link"] == 1
        # A RoCE v1 job on gpu2 (GID index 0 is RoCE v1 there).
        gids = np.array(
            [
                (now, records.host_id("gpu2"), b"mlx5_0", 1, 0, (0,) * 4, b"fe80::1",
                 b"IB/RoCE v1", b"bk0", b""),
                (now, records.host_id("gpu2"), b"mlx5_0", 1, 1, (0,) * 4, b"fe80::1",
                 b"RoCE v2", b"bk0", b""),
            ],
            records.RDMA_CONFIG,
        )  # fmt: skip
        _send(d, "gpu2", 1, "rdma_config", gids)
        job = np.array(
            [(now, records.host_id("gpu2"), b"llm-7", 42, 0, b"environ", b"mlx5_0")],
            records.JOB_RDMA,
        )
        _send(d, "gpu2", 2, "job_rdma", job)
        # what its library does (the same snapshot): NCCL 2.18.3, its own timeout 14
        lib = np.zeros(1, records.JOB_NCCL)
        lib["ts_ns"], lib["host"], lib["job_id"], lib["pid"] = (
            now,
            records.host_id("gpu2"),
            b"llm-7",
            42,
        )
        lib["library"], lib["version"], lib["version_from"] = b"nccl", b"2.18.3", 1
        lib["gid_rule"], lib["gid_from"], lib["device"] = 1, 1, b"mlx5_0"
        lib["ib_timeout"], lib["ib_timeout_from"], lib["ib_retry_cnt"] = 14, 1, 7
        _send(d, "gpu2", 4, "job_nccl", lib)
        _wait(lambda: _live(d)["open_by_kind"]["roce_v1_job"] == 1)
        roce = next(x for x in _live(d)["open"] if x["kind"] == "roce_v1_job")
        assert roce["job_id"] == "llm-7" and "gpu2" in roce["summary"]
        # The running jobs, each host's GID index and its type (the TUI's jobs list).
        _wait(lambda: json.loads(d.get("/v1/live"))["jobs"][0]["hosts"][0]["library"])
        (job_live,) = json.loads(d.get("/v1/live"))["jobs"]
        assert job_live["job_id"] == "llm-7" and job_live["roce_v1_hosts"] == 1
        assert job_live["hosts"] == [{"host": "gpu2", "device": "mlx5_0", "gid_index": 0,
                                      "gid_type": "IB/RoCE v1",
                                      "index_source": "set in environ",
                                      "library": "NCCL 2.18.3",
                                      "version_source": "libnccl.so in /proc/PID/maps",
                                      "survives_s": 0.537,
                                      "survives_from": "NCCL_IB_TIMEOUT 14 (environ), "
                                      "NCCL_IB_RETRY_CNT 7 (NCCL 2.18.3 default)"}]  # fmt: skip
        metrics = d.get("/metrics")
        assert b'clockmesh_anomalies_open{kind="roce_v1_job"} 1.0' in metrics
        # what the detector held back is counted where an operator scrapes it
        for reason in ("one_source", "queue", "named", "burst", "few_seconds"):
            assert (
                f'clockmesh_detect_silent_drop_held_total{{reason="{reason}"}} 0.0'.encode()
                in metrics
            )
        assert_promtool_clean(metrics)
        # The link comes back; the job ends: both close once clear for detect_clear_s.
        _send(d, "gpu1", 3, "counter", _counter_rows("gpu1", time.time_ns(), 6, 1, 0))
        none = np.array(
            [(time.time_ns(), records.host_id("gpu2"), b"", 0, -1, b"none", b"")],
            records.JOB_RDMA,
        )
        _send(d, "gpu2", 3, "job_rdma", none)
        _wait(lambda: not _live(d)["open"], timeout=15)
        assert json.loads(d.get("/v1/live"))["jobs"] == []  # the job ended
        closed = _live(d)["recently_closed"]
        assert {x["kind"] for x in closed} == {"flapping_link", "roce_v1_job"}
        flap = next(x for x in closed if x["kind"] == "flapping_link")
        assert flap["evidence"]["outages_s"] and flap["closed_ns"] > 0
    finally:
        d.stop()
    # The store has every state of both anomalies; anomaly_current gives the last.
    from analytics.store.catalog import write_catalog

    write_catalog(d.store)
    assert d.count("SELECT count(*) FROM anomaly_current") == 2
    assert d.count("SELECT count(*) FROM anomaly_current WHERE is_open") == 0
    assert d.count("SELECT count(*) FROM anomalies WHERE closed_ns = 0") >= 2
    assert (
        d.count(
            "SELECT count(*) FROM anomaly_current WHERE kind = 'flapping_link' "
            "AND link = 'gpu1-leaf1' AND summary LIKE 'gpu1-leaf1 flapped 1 time%'"
        )
        == 1
    )


def test_a_bad_topology_file_is_a_one_line_config_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    d = Daemon(tmp_path, topology_file=str(tmp_path / "nope.json"))
    out = subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "ingest", "run", "--config",
         str(tmp_path / "ingest.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "topology_file" in out.stderr and "no such file" in out.stderr
    assert "Traceback" not in out.stderr
    (tmp_path / "bad.json").write_text('{"hosts": 3}')
    d.write_config(topology_file=str(tmp_path / "bad.json"))
    out = subprocess.run(
        [sys.executable, "-m", "clockmesh.cli", "ingest", "run", "--config",
         str(tmp_path / "ingest.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "bad.json: not a clockmesh topology file" in out.stderr
