"""lab/jobgen.py talks to a real in-band hook and looks like an RDMA job in /proc."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from collector import rdma_config, records
from collector.inband import InbandHook
from collector.lab_clock import RecordingClock
from lab import fake_rdma
from tests.unit.collector_procs import ROOT, free_udp_port, loopback_net


def test_two_generators_report_every_message_and_expose_their_gid(tmp_path: Path) -> None:
    tree = fake_rdma.write_tree(tmp_path / "sysfs", "ja", "lo", "198.18.9.1")
    sock = tmp_path / "inband.sock"
    hook = InbandHook(sock, records.host_id("ja"), RecordingClock(None))
    net = loopback_net()
    a, b = f"{net}.1", f"{net}.2"
    port = free_udp_port(a)
    env = dict(os.environ, NCCL_IB_GID_INDEX="3", CLOCKMESH_JOB_ID="a2a-1", PYTHONPATH=str(ROOT))
    procs = []
    try:
        for me, addr, peer, paddr in (("ja", a, "jb", b), ("jb", b, "ja", a)):
            argv = [
                sys.executable,
                "-m",
                "lab.jobgen",
                "--job",
                "a2a-1",
                "--host",
                me,
                "--bind",
                addr,
            ]
            argv += ["--peers", f"{peer}={paddr}", "--port", str(port), "--rate", "50"]
            argv += ["--inband", str(sock), "--uverbs", str(tree / "dev/infiniband/uverbs0")]
            argv += ["--duration", "4"]
            procs.append(
                subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            )
        pids = {p.pid for p in procs}
        deadline = time.monotonic() + 15
        mine: list = []
        while len(mine) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            mine = [r for r in rdma_config.job_rows("/nonexistent", 1, 2) if r["pid"] in pids]
        assert len(mine) == 2
        assert {(r["job_id"], int(r["gid_index"])) for r in mine} == {(b"a2a-1", 3)}
        parts = []
        stalled = False
        while any(p.poll() is None for p in procs):
            # as the collector does: woken by each report (the kernel queues only
            # net.unix.max_dgram_qlen datagrams, 10 in a fresh namespace)
            select.select([hook.sock], [], [], 0.05)
            parts.append(hook.drain())
            if not stalled and sum(len(r) for r, _ in parts) > 100:
                # the collector busy for half a second (a loaded host): the hook's queue
                # fills, and the jobs' reports wait for it instead of being dropped
                stalled = True
                time.sleep(0.5)
        parts.append(hook.drain())
        outs = [p.communicate(timeout=20)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        assert all("report_errors=0" in o for o in outs), outs
        rows = np.concatenate([r for r, _ in parts])
        gids = np.concatenate([g for _, g in parts])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        hook.close()
    assert sorted(gids["gid_index"].tolist()) == [3, 3] and set(gids["job_id"].tolist()) == {
        b"a2a-1"
    }
    sends = rows[rows["event"] == 0]
    recvs = rows[rows["event"] == 1]
    assert len(sends) >= 100 and len(recvs) >= 0.9 * len(sends)
    # A receive matches its send by (flow, seq); receive after send on one host clock.
    key_s = {
        (int(f), int(s)): int(t)
        for f, s, t in zip(sends["flow_id"], sends["seq"], sends["event_ns"], strict=True)
    }
    matched = [
        (key_s[(int(f), int(s))], int(t))
        for f, s, t in zip(recvs["flow_id"], recvs["seq"], recvs["event_ns"], strict=True)
        if (int(f), int(s)) in key_s
    ]
    assert len(matched) >= 0.9 * len(recvs)
    delays = np.array([r - s for s, r in matched])
    assert (delays > 0).all() and np.median(delays) < 5_000_000
    assert set(sends["peer"].tolist()) == {records.host_id("ja"), records.host_id("jb")}
