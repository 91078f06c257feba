"""The real ingest daemon as a separate process, over real HTTP on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from analytics.ingest import load as ingest_load
from collector import records, wire
from tests.unit.ingest_daemon import KEY, ROOT, Daemon, assert_promtool_clean

IDS = ingest_load.host_ids(12)
T0 = (time.time_ns() // 10**9 - 30) * 10**9


def seg(i: int, second: int, **kw: object) -> bytes:
    return ingest_load.fleet_segment(i, IDS, second, t0_ns=T0, **kw)


def test_contract_stored_duplicate_and_rejections(daemon: Daemon) -> None:
    body = seg(0, 1)
    rows = wire.decode(body).rows()
    # every ack carries the segment interval the ops box wants: for a small fleet less than
    # any collector's own spool.roll_s (0.0 before the pacer's first update, then 0.1)
    ack = {"segment": 1, "rows": rows}
    for expected in ("stored", "duplicate"):
        status, answer = daemon.post(body)
        assert status == 200 and 0.0 <= answer.pop("roll_s") < 1.0
        assert answer == {"status": expected, **ack}

    other = seg(1, 1)
    status, answer = daemon.post(other, wire.sign(b"wrong-key-wrong-key", other))
    assert (status, answer["status"]) == (401, "rejected")
    assert daemon.post(other + b"x", wire.sign(KEY, other))[0] == 401  # altered after signing
    assert daemon.post(other, "")[0] == 401
    assert daemon.post(other[:-7])[0] == 400  # truncated
    flipped = bytearray(other)
    flipped[-5] ^= 0x10
    status, answer = daemon.post(bytes(flipped))
    assert status == 400 and "CRC" in answer["error"]
    assert daemon.post(b"not a segment at all")[0] == 400
    # a newer record schema: well-formed, not storable here
    header = json.dumps(
        {"host": "gpu00001", "host_id": int(IDS[1]), "segment": 9, "schema": 99, "created_ns": 1}
    ).encode()
    newer = struct.pack("<6sHI", wire.MAGIC, 1, len(header)) + header
    status, answer = daemon.post(newer)
    assert status == 422 and "schema 99" in answer["error"]
    # a header whose host_id is not the host's id
    lying = wire.encode_header("gpu00001", 12345, 5, 1) + wire.encode_chunk(
        "probe_tx", np.zeros(1, records.PROBE_TX)
    )
    assert daemon.post(lying)[0] == 422

    # exactly the one good batch is stored, nothing of the rejected ones
    tx = wire.decode(body).rows("probe_tx")
    assert daemon.count("SELECT count(*) FROM probe_tx") == tx
    assert daemon.count("SELECT count(*) FROM batches") == 1
    metrics = daemon.get("/metrics").decode()
    assert 'clockmesh_ingest_rejected_batches_total{reason="auth"} 3.0' in metrics
    assert 'clockmesh_ingest_rejected_batches_total{reason="malformed"} 3.0' in metrics
    assert 'clockmesh_ingest_rejected_batches_total{reason="schema"} 2.0' in metrics
    assert 'clockmesh_ingest_batches_total{status="duplicate"} 1.0' in metrics
    log = daemon.log.read_text()
    assert "event=batch_rejected status=401" in log and "Traceback" not in log


def test_too_large_body_gets_413(tmp_path: Path) -> None:
    d = Daemon(tmp_path, max_body_bytes=4096)
    d.start()
    try:
        body = seg(0, 1)
        assert len(body) > 4096
        status, answer = d.post(body)
        assert status == 413 and "max_body_bytes" in answer["error"]
        assert d.post_chunked(body)[0] == 413  # no Content-Length: counted as it comes
        small = ingest_load.counter_segment("gpu00000", 7, [(T0, "eth0", "rx_bytes", 1, 0)])
        assert d.post(small)[0] == 200
        # a chunked body within the limit is stored like any other
        chunked = ingest_load.counter_segment("gpu00000", 8, [(T0, "eth0", "rx_bytes", 2, 1)])
        status, answer = d.post_chunked(chunked, parts=2)
        assert (status, answer["status"]) == (200, "stored")
        assert d.count("SELECT count(*) FROM counter") == 2
    finally:
        d.stop()


def _stream(daemon: Daemon, hosts: range, seconds: int, acked: dict, stop: threading.Event) -> None:
    """A collector-like client: each segment is retried until it is acknowledged."""
    for second in range(seconds):
        for i in hosts:
            body = seg(i, second)
            while not stop.is_set():
                try:
                    status, answer = daemon.post(body)
                except OSError:
                    status, answer = 0, {}
                if status == 200:
                    acked[(i, second)] = answer["status"]
                    break
                assert status >= 500 or status == 0, (status, answer)
                time.sleep(0.05)


def test_restart_reserves_the_memory_the_last_run_peaked_at(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    (d.store / "_ingest").mkdir(parents=True)  # as the previous run of this store left it
    mib = 1 << 20
    (d.store / "_ingest" / "memory.json").write_text(
        json.dumps({"records": 768 * mib, "bodies": 128 * mib})
    )
    d.start()
    try:
        deadline = time.monotonic() + 30
        while "event=memory_reserved" not in d.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "event=memory_reserved records=805306368 bodies=134217728" in d.log.read_text()
        metrics = d.get("/metrics").decode()
        assert 'clockmesh_ingest_slab_bytes{pool="records"} 8.05306368e+08' in metrics
        assert d.post(seg(0, 1))[0] == 200  # taken from the reserve: the pool does not grow
        assert 'slab_bytes{pool="records"} 8.05306368e+08' in d.get("/metrics").decode()
    finally:
        d.stop()
    # what this run held is remembered for the next start: one slab of records (256 MiB),
    # at most one of bodies (64 MiB), not the reserve (so a smaller fleet lowers it)
    peaks = json.loads((d.store / "_ingest" / "memory.json").read_text())
    assert peaks["records"] == 256 * mib and peaks["bodies"] <= 64 * mib, peaks


def test_kill_9_loses_no_acknowledged_row_and_stores_each_once(daemon: Daemon) -> None:
    seconds = 30
    acked: dict = {}
    stop = threading.Event()
    clients = [
        threading.Thread(target=_stream, args=(daemon, range(k, 12, 4), seconds, acked, stop))
        for k in range(4)
    ]
    for c in clients:
        c.start()
    try:
        for _ in range(2):  # two crashes mid-stream
            deadline = time.monotonic() + 20
            target = len(acked) + 60
            while len(acked) < target and time.monotonic() < deadline:
                time.sleep(0.02)
            daemon.kill9()
            acked_at_crash = dict(acked)
            time.sleep(0.3)
            daemon.start()
            assert len(acked_at_crash) > 0
        for c in clients:
            c.join(120)
    finally:
        stop.set()
    assert len(acked) == 12 * seconds
    per_s = ingest_load.DEFAULT_BUDDIES * ingest_load.DEFAULT_PORTS
    assert daemon.count("SELECT count(*) FROM probe_tx") == 12 * seconds * per_s
    assert daemon.count("SELECT count(*) FROM (SELECT src, seq FROM probe_tx GROUP BY ALL)") == (
        12 * seconds * per_s
    )
    assert daemon.count("SELECT count(*) FROM probe_rx") == 12 * seconds * per_s
    assert daemon.count("SELECT count(*) FROM batches") == 12 * seconds
    # no orphaned files of a partial commit survive a restart
    log = daemon.log.read_text()
    assert log.count("event=listening") == 3


def test_sigterm_with_batches_in_flight_answers_each_and_stops_at_once(tmp_path: Path) -> None:
    """A restart under load: the batches received are committed and acknowledged, the
    daemon exits within seconds, and no collector's request is left to time out (before,
    the committer stopped first and aiohttp held the requests in flight for 60 s)."""
    daemon = Daemon(tmp_path, roll_s=1.0)  # a group commit a second: batches wait in it
    daemon.start()
    acked: dict = {}
    timeouts: list[tuple[int, int]] = []
    stop = threading.Event()

    def client(i: int) -> None:
        second = 0
        while not stop.is_set():
            try:
                status, answer = daemon.post(seg(i, second))
            except TimeoutError:
                timeouts.append((i, second))
                continue
            except OSError:  # refused or reset: the daemon is gone; sent again later
                time.sleep(0.05)
                continue
            if status == 200:
                acked[(i, second)] = answer["status"]
                second += 1

    clients = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for c in clients:
        c.start()
    try:
        deadline = time.monotonic() + 30
        while len(acked) < 24 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("the daemon took over 20 s to stop with batches in flight")
        # the clients' requests (10-s timeout) all had their answer or found it gone
        time.sleep(11)
    finally:
        stop.set()
        for c in clients:
            c.join(30)
        daemon.stop()  # (killed, if it did not stop)
    assert not timeouts, f"requests left unanswered: {timeouts}"
    assert "event=stopping" in daemon.log.read_text()
    daemon.start()  # what was acknowledged is stored, each once
    try:
        assert daemon.count("SELECT count(*) FROM batches") == len(acked)
        per_s = ingest_load.DEFAULT_BUDDIES * ingest_load.DEFAULT_PORTS
        assert daemon.count("SELECT count(*) FROM probe_tx") == len(acked) * per_s
    finally:
        daemon.stop()


def test_readonly_reader_answers_while_daemon_writes(daemon: Daemon) -> None:
    acked: dict = {}
    stop = threading.Event()
    writer = threading.Thread(target=_stream, args=(daemon, range(12), 15, acked, stop))
    writer.start()
    reader = (
        "import duckdb, sys, time\n"
        "counts = []\n"
        "for _ in range(15):\n"
        "    con = duckdb.connect(sys.argv[1], read_only=True)\n"
        "    counts.append(con.execute('SELECT count(*) FROM probe_rx').fetchone()[0])\n"
        "    con.close()\n"
        "    time.sleep(0.1)\n"
        "print(counts)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", reader, str(daemon.store / "catalog.duckdb")],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
    finally:
        stop.set()
        writer.join(60)
    counts = json.loads(out)
    assert counts == sorted(counts) and counts[-1] > counts[0]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_metrics_pass_promtool_and_show_links(daemon: Daemon) -> None:
    for second in range(3):
        for i in range(12):
            lossy = {"loss": 0.5} if i == 3 else {}
            assert daemon.post(seg(i, second, **lossy))[0] == 200
    # host 3 ships on (a health row, in a segment begun later): a probe lost on its way
    # to it is lost, not a probe_rx still to come (that waits for the rollups' grace)
    health = np.zeros(1, records.HEALTH)
    health["ts_ns"], health["host"], health["name"] = T0 + 5 * 10**9, int(IDS[3]), b"x"
    body = wire.encode_header(ingest_load.host_name(3), int(IDS[3]), 50, T0 + 5 * 10**9)
    assert daemon.post(body + wire.encode_chunk("health", health))[0] == 200
    deadline = time.monotonic() + 20
    live: dict = {}
    while time.monotonic() < deadline:
        live = json.loads(daemon.get("/v1/live"))
        if sum(p["sent"] for p in live["pairs"]) == 3 * 12 * 80:
            break
        time.sleep(0.5)
    assert {h["host"] for h in live["hosts"]} == {ingest_load.host_name(i) for i in range(12)}
    lossy = [p for p in live["pairs"] if p["dst"] == ingest_load.host_name(3)]
    clean = [p for p in live["pairs"] if p["dst"] == ingest_load.host_name(5)]
    assert len(lossy) == 10  # every buddy of host 3 loses about half of its probes to it
    sent, received = sum(p["sent"] for p in lossy), sum(p["received"] for p in lossy)
    assert 0.4 < 1 - received / sent < 0.6
    assert clean and all(p["loss"] == 0 for p in clean)
    assert all(5 <= p["owd_raw_p50_us"] <= 7 for p in clean)
    assert all(p["queue_us"] is None for p in live["pairs"])  # no route judged slow
    # 12 hosts are under the request budget: shipping is not slowed (stale after 5 s)
    assert 0 <= live["ingest"]["advised_roll_s"] <= 0.1  # 12 / 420 requests a second
    text = daemon.get("/metrics")
    assert b"clockmesh_link_probe_loss_ratio{" in text
    assert b"clockmesh_host_last_batch_age_seconds{" in text
    assert_promtool_clean(text)


def test_below_min_free_bytes_refuses_with_503_and_keeps_acknowledged(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    d.start()
    try:
        assert d.post(seg(0, 1))[0] == 200
        d.stop()
        d.write_config(min_free_bytes=2**62)
        d.start()
        status, answer = d.post(seg(0, 2))
        assert status == 503 and "below min_free_bytes" in answer["error"]
        metrics = d.get("/metrics").decode()
        assert "clockmesh_ingest_unavailable{reason=" in metrics
        assert 'reason="unavailable"} 1.0' in metrics
        assert "event=store_full" in d.log.read_text()
        assert d.post(seg(0, 1))[0] == 503  # even a duplicate is not answered as stored
        assert d.count("SELECT count(*) FROM batches") == 1
        d.stop()
        d.write_config()
        d.start()
        assert d.post(seg(0, 2))[0] == 200  # the collector's retry succeeds
        assert d.post(seg(0, 1))[1]["status"] == "duplicate"
        assert d.count("SELECT count(*) FROM batches") == 2
    finally:
        d.stop()


def test_sql_and_export_commands_on_a_live_store(daemon: Daemon, tmp_path: Path) -> None:
    for i in range(12):
        assert daemon.post(seg(i, 0))[0] == 200
    cli = [sys.executable, "-m", "clockmesh.cli"]
    out = subprocess.run(
        [*cli, "sql", "--store", str(daemon.store), "--format", "json",
         "SELECT host, host_id FROM hosts ORDER BY host"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    hosts = json.loads(out)
    assert [h["host"] for h in hosts] == [ingest_load.host_name(i) for i in range(12)]
    bad = subprocess.run(
        [*cli, "sql", "--store", str(daemon.store), "SELECT * FROM no_such_view"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "no_such_view" in bad.stderr
    target = tmp_path / "export"
    subprocess.run(
        [*cli, "export", "--store", str(daemon.store), "--since", "2h", "--to", str(target)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    daemon.stop()
    moved = tmp_path / "moved"  # the store seen elsewhere: a copy, a lab node's mount
    shutil.copytree(daemon.store, moved)
    shutil.rmtree(daemon.store)  # the export must not depend on the original
    for where in (target, moved):  # its catalog.duckdb names the original's paths
        out = subprocess.run(
            [*cli, "sql", "--store", str(where), "--format", "csv",
             "SELECT count(*) FROM probe_tx"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert out.splitlines()[1] == str(12 * 80), where


def test_several_segments_in_one_body_each_stored_once(daemon: Daemon) -> None:
    """A shipper with a backlog concatenates closed segments into one request (one HMAC)."""
    segs = ingest_load.host_seconds(3, IDS, 4, t0_ns=T0)
    rows = [wire.decode(s).rows() for s in segs]
    assert daemon.post(segs[0])[1]["status"] == "stored"
    status, answer = daemon.post(b"".join(segs))
    assert status == 200 and answer["status"] == "stored" and answer["rows"] == sum(rows)
    assert [(s["segment"], s["status"]) for s in answer["segments"]] == [
        (0, "duplicate"), (1, "stored"), (2, "stored"), (3, "stored"),
    ]  # fmt: skip
    status, answer = daemon.post(b"".join(segs[1:]))
    assert status == 200 and answer["status"] == "duplicate"
    assert daemon.count(f"SELECT count(*) FROM probe_tx WHERE src = {int(IDS[3])}") == 4 * 80
    # 1 coded pair in 8 echoed (the collector default): 10 echo rows a second
    assert daemon.count(f"SELECT count(*) FROM echo WHERE src = {int(IDS[3])}") == 4 * 10
    assert daemon.count(f"SELECT count(*) FROM batches WHERE host_id = {int(IDS[3])}") == 4

    # one bad segment rejects the whole body, naming it; nothing of the body is stored
    more = ingest_load.host_seconds(5, IDS, 3, t0_ns=T0)
    bad = more[2][:-1] + bytes([more[2][-1] ^ 1])
    status, answer = daemon.post(more[0] + more[1] + bad)
    assert status == 400 and answer["error"].startswith("segment 3 of the body: ")
    # text that is not UTF-8 is found when the group is converted: that batch gets 422
    ctr = np.zeros(1, records.COUNTER)
    ctr["ts_ns"], ctr["host"], ctr["name"] = T0, IDS[6], b"rx_\xff\xfe"
    not_utf8 = wire.encode_header("gpu00006", int(IDS[6]), 1, T0) + wire.encode_chunk(
        "counter", ctr
    )
    status, answer = daemon.post(not_utf8)
    assert status == 422 and "not UTF-8" in answer["error"]
    assert daemon.count(f"SELECT count(*) FROM probe_tx WHERE src = {int(IDS[5])}") == 0
    assert daemon.count(f"SELECT count(*) FROM batches WHERE host_id = {int(IDS[6])}") == 0
    assert daemon.post(more[0] + more[1])[1]["status"] == "stored"
    assert daemon.count(f"SELECT count(*) FROM probe_tx WHERE src = {int(IDS[5])}") == 2 * 80
    assert "Traceback" not in daemon.log.read_text()


def test_analysis_threads_yield_to_acknowledgements(daemon: Daemon) -> None:
    """The clock solver and the live/rollup thread run 19 nice levels below (analysis_nice)
    the threads that receive, commit and acknowledge; /metrics counts what the analysis
    did and dropped."""
    for second in range(2):
        for i in range(6):
            assert daemon.post(seg(i, second))[0] == 200
    assert daemon.proc is not None
    pid = daemon.proc.pid
    base = os.getpriority(os.PRIO_PROCESS, pid)  # what the daemon was started with
    low = min(19, base + 19)
    deadline = time.monotonic() + 20
    nice: dict[int, int] = {}
    while time.monotonic() < deadline:
        nice = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                nice[int(task.name)] = int(fields[16])  # field 19 of stat: nice
        if (
            sum(v == low for v in nice.values()) >= 2
            and json.loads(daemon.get("/v1/live"))["pairs"]
        ):
            break
        time.sleep(0.3)
    assert nice[pid] == base  # the event loop: requests and acknowledgements
    assert sum(v == low for v in nice.values()) >= 2, nice  # clock solver, live view + rollups
    assert sum(v == base for v in nice.values()) >= 2, nice  # event loop, commit, converters
    text = daemon.get("/metrics").decode()
    for family in ("clockmesh_rollup_seconds_total", "clockmesh_rollup_probes_total",
                   "clockmesh_hot_window_evicted_rows_total"):  # fmt: skip
        assert f"\n{family} 0.0\n" in text, family  # no minute final yet, nothing evicted
    # where the daemon's CPU goes, per thread (pools summed), all of it accounted for
    cpu = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("clockmesh_ingest_thread_cpu_seconds_total{")
    }
    assert {"MainThread", "commit", "convert", "live", "clock", "other"} <= cpu.keys(), cpu
    assert cpu["MainThread"] > 0
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    process_cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    assert sum(cpu.values()) <= process_cpu + 0.1, (cpu, process_cpu)


def test_live_says_how_long_ago_a_host_last_shipped_the_probes_it_sent(daemon: Daemon) -> None:
    """A firewall dropping a host's probes fails their sends: the collector records none,
    while its batches (counters, health) still arrive. ``last_probe_age_s`` is how
    ``clockmesh live`` and the TUI call it silent before the live window forgets the
    probes it sent earlier."""
    hid = int(IDS[8])
    assert daemon.post(seg(8, 0))[1]["status"] == "stored"  # with its probe_tx rows
    time.sleep(1.5)
    health = np.zeros(1, records.HEALTH)
    health["ts_ns"], health["host"], health["name"], health["value"] = T0, hid, b"x", 1
    status, answer = daemon.post(wire.encode_header("gpu00008", hid, 99, T0 + 10**9)
                                 + wire.encode_chunk("health", health))  # fmt: skip
    assert status == 200 and answer["status"] == "stored", answer
    only_health = np.zeros(1, records.HEALTH)
    only_health["ts_ns"], only_health["host"], only_health["name"] = T0, int(IDS[9]), b"x"
    assert daemon.post(wire.encode_header("gpu00009", int(IDS[9]), 1, T0)
                       + wire.encode_chunk("health", only_health))[0] == 200  # fmt: skip
    hosts = {h["host_id"]: h for h in json.loads(daemon.get("/v1/live"))["hosts"]}
    me = hosts[hid]
    # its last batch is 1.5 s younger than its last batch with probes
    assert me["last_probe_age_s"] - me["last_batch_age_s"] >= 1.4, me
    assert hosts[int(IDS[9])]["last_probe_age_s"] is None  # it never sent one


def test_live_says_when_a_host_s_collector_last_restarted(daemon: Daemon) -> None:
    """A segment's header says when its collector's run began to listen (``run_ns``):
    ``/v1/live`` shows a restart as ``collector_run_age_s`` (and the hot window leaves
    out what peers lost to the host between its runs: test_store_writer); a segment of
    a collector that does not say it (an older one) shows null."""
    now = time.time_ns()
    first, second = now - 40 * 10**9, now - 3 * 10**9
    assert daemon.post(seg(10, 0, segment=1, run_ns=first))[1]["status"] == "stored"
    assert daemon.post(seg(10, 1, segment=2, run_ns=second))[1]["status"] == "stored"
    # a late segment of the first run changes nothing
    assert daemon.post(seg(10, 2, segment=3, run_ns=first))[1]["status"] == "stored"
    assert daemon.post(seg(11, 0, segment=1))[1]["status"] == "stored"
    hosts = {h["host_id"]: h for h in json.loads(daemon.get("/v1/live"))["hosts"]}
    age = hosts[int(IDS[10])]["collector_run_age_s"]
    assert 3 <= age < 3 + 30, age
    assert hosts[int(IDS[11])]["collector_run_age_s"] is None
