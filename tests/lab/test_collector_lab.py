"""Collectors in a real lab fabric: probe mesh over ECMP, fake RDMA, jobs, shipping.

Collectors run in each lab host's network and mount namespaces (``Lab.popen``) and
ship over the management network to a contract-faithful HTTP receiver on the
management bridge address in the root namespace.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from collector import records
from lab import fleet as lab_fleet
from lab import jobgen
from tests.unit.collector_procs import KEY
from tests.unit.collector_receiver import Receiver

pytestmark = [pytest.mark.root, pytest.mark.lab]


@pytest.fixture(scope="module")
def fleet(small_lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    lab = small_lab
    receiver = Receiver(KEY, host=lab.topology.mgmt.gateway)
    base = tmp_path_factory.mktemp("fleet")
    started = time.time()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs = lab_fleet.start(lab, base, KEY, receiver.url)
        yield {"lab": lab, "receiver": receiver, "procs": procs, "base": base, "started": started}
    finally:
        jobgen.stop_job(lab, "cmtest")
        lab_fleet.stop(procs)
        receiver.close()


def _status(fleet: dict[str, Any], host: str) -> dict[str, Any]:
    try:
        return json.loads((fleet["base"] / host / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


def _rows(receiver: Receiver, table: str, host: str | None = None) -> np.ndarray:
    parts = [p for p in receiver.rows(table, host) if len(p)]
    return np.concatenate(parts) if parts else np.zeros(0, records.TABLES[table])


def test_every_host_ships_within_5s_and_probes_every_buddy_on_every_path(
    fleet: dict[str, Any],
) -> None:
    lab, receiver = fleet["lab"], fleet["receiver"]
    hosts = [h.name for h in lab.topology.hosts]
    _wait(lambda: {h for h, _ in receiver.order} >= set(hosts), 15, "records from every host")
    # Acceptance: records from every host within 5 s of the collector starting. Measured
    # from each collector's own start (status file), so Python start-up on an
    # overloaded CI box does not count; the launch-to-records figure is printed.
    first = {h: min(t for (hh, _), t in receiver.arrived.items() if hh == h) for h in hosts}
    print(
        f"first records from all {len(hosts)} hosts {max(first.values()) - fleet['started']:.2f} s after launch"
    )
    for h in hosts:
        _wait(lambda h=h: bool(_status(fleet, h)), 10, f"{h} status")
        since_start = first[h] - _status(fleet, h)["started_unix"]
        assert since_start < 5.0, (h, since_start)
        assert _status(fleet, h)["path_tracing"] == "every 2 s at TTL 2", h
    for name in hosts:
        _wait(
            lambda n=name: _status(fleet, n).get("probes_received", 0) >= 100,
            20,
            f"{name} receiving",
        )
    time.sleep(2.0)
    by_id = {records.host_id(h): h for h in hosts}
    rx = _rows(receiver, "probe_rx")
    for dst in hosts:
        mine = rx[rx["dst"] == records.host_id(dst)]
        for src in hosts:
            if src == dst:
                continue
            paths = set(mine[mine["src"] == records.host_id(src)]["sport"].tolist())
            assert paths == set(range(40000, 40008)), f"{src}->{dst}: sports {sorted(paths)}"
    # Hop counts are real: same leaf one router (TTL 63), across the spine three (61).
    racks = {h.name: h.rack for h in lab.topology.hosts}
    for row in rx[:200]:
        s, d = by_id[int(row["src"])], by_id[int(row["dst"])]
        assert int(row["ttl"]) == (63 if racks[s] == racks[d] else 61)
    assert (rx["ts_kind"] == records.TsKind.SW).all()
    for name in hosts:
        st = _status(fleet, name)
        assert sum(st["rejected"].values()) == 0 and st["tx_timestamps"]["user"] == 0
    counters = _rows(receiver, "counter")
    bk = counters[(counters["name"] == b"tx_packets") & (counters["source"] == 0)]
    assert (bk["delta"] > 0).any()  # real veth counters through the fake tree's symlink
    cfg = _rows(receiver, "rdma_config")
    assert {r["gid_type"] for r in cfg} == {b"IB/RoCE v1", b"RoCE v2"}
    assert len({int(r["host"]) for r in cfg}) == len(hosts)


def test_job_reports_gid_index_and_inband_timestamps(fleet: dict[str, Any]) -> None:
    lab, receiver = fleet["lab"], fleet["receiver"]
    hosts = [h.name for h in lab.topology.hosts][:2]
    jobgen.start_job(lab, "cmtest", hosts, 3, 20.0, 512)

    def seen() -> bool:
        jobs = _rows(receiver, "job_rdma")
        env = {
            (r["job_id"], int(r["gid_index"]), int(r["host"]))
            for r in jobs
            if r["source"] == b"environ"
        }
        inband = _rows(receiver, "inband")
        return all((b"cmtest", 3, records.host_id(h)) in env for h in hosts) and len(inband) >= 100

    _wait(seen, 30, "job rows from both hosts")
    inband = _rows(receiver, "inband")
    assert set(inband["job_id"].tolist()) == {b"cmtest"}
    assert {int(h) for h in inband["host"]} == {records.host_id(h) for h in hosts}
    assert set(inband["event"].tolist()) == {0, 1}
    jobs = _rows(receiver, "job_rdma")
    assert (b"inband", 3) in {(r["source"], int(r["gid_index"])) for r in jobs}
    assert jobgen.stop_job(lab, "cmtest") == 2
