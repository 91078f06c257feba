"""NCCL-aware verdicts against real lab jobs: collectors in the lab hosts read each job
process's /proc (the libnccl.so.X.Y.Z it maps, its environment), the real ingest daemon
judges its GID type and what it survives.

Lab jobs are started as a chosen NCCL version (``jobgen.start_job(..., nccl_version=)``,
``clockmesh lab job start --nccl-version``): the process maps a file named
``libnccl.so.X.Y.Z`` with mmap, as the dynamic loader maps the real library.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from analytics.report.report import Range, collect
from collector.job_nccl import qp_limit_s
from lab import jobgen
from lab.fabric import Lab
from tests.lab.helpers import opsbox_fleet, wait_for

pytestmark = [pytest.mark.root, pytest.mark.lab]

ROCE_JOBS = ("v2auto", "old", "nover", "v1num")
FLAP_JOBS = ("tight", "loose")


@pytest.fixture(scope="module")
def site(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    lab = lab_factory("n", spines=2, leaves=2, hosts_per_leaf=1)
    with opsbox_fleet(lab, tmp_path_factory.mktemp("nccl"), probe={"trace_interval_s": 2.0},
                      detect_interval_s=0.2, detect_clear_s=10) as site:  # fmt: skip
        try:
            yield site
        finally:
            for job in (*ROCE_JOBS, *FLAP_JOBS):
                jobgen.stop_job(lab, job)


def _jobs(live: Callable[[], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {j["job_id"]: j for j in live()["jobs"]}


def _roce(live: Callable[[], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["job_id"]: a for a in live()["anomalies"]["open"] if a["kind"] == "roce_v1_job"}


def test_gid_verdicts_follow_each_jobs_nccl_version(site: dict[str, Any]) -> None:
    lab, live = site["lab"], site["live"]
    hosts = [h.name for h in lab.topology.hosts][:2]
    start = [
        ("v2auto", "2.23.4", {}),  # no index: 2.21+ selects the RoCE v2 GID itself
        ("old", "2.18.3", {}),  # no index: before 2.21, index 0 (link-local, RoCE v1)
        ("nover", None, {}),  # no index, no knowable version
        ("v1num", "2.23.4", {"NCCL_IB_ROCE_VERSION_NUM": "1"}),  # 2.23 told to pick RoCE v1
    ]
    try:
        for k, (job, version, env) in enumerate(start):
            jobgen.start_job(lab, job, hosts, None, 5.0, 256, port=jobgen.PORT + 10 + k,
                             nccl_version=version, env=env)  # fmt: skip

        def resolved() -> dict[str, dict[str, Any]] | None:
            got = _jobs(live)
            ok = all(j in got and len(got[j]["hosts"]) == 2 and all(
                h["library"] or h["gid_type"].startswith("unknown (NCCL version unknown")
                for h in got[j]["hosts"]) for j in ROCE_JOBS)  # fmt: skip
            return got if ok else None

        got = wait_for(resolved, 40, "every job on both hosts with its library resolved")
        for h in got["v2auto"]["hosts"]:
            assert h["gid_type"] == "RoCE v2" and h["gid_index"] == 3, h
            assert h["index_source"].startswith(
                "not set; NCCL 2.23.4 selects index 3 by default (NCCL_IB_ROCE_VERSION_NUM 2 "
                "(default), NCCL_IB_ADDR_FAMILY AF_INET (default))"), h  # fmt: skip
            assert h["version_source"] == "libnccl.so in /proc/PID/maps", h
        for h in got["nover"]["hosts"]:
            assert h["gid_type"] == (
                "unknown (NCCL version unknown: no libnccl.so (or UCX) in its /proc/PID/maps "
                "and no NCCL_VERSION in its environment)"), h  # fmt: skip
        anomalies = wait_for(
            lambda: (a := _roce(live)) and {"old", "v1num"} <= set(a) and a,
            30,
            "roce_v1_job for the 2.18 job and the ROCE_VERSION_NUM=1 job",
        )
        old = anomalies["old"]
        assert "NCCL 2.18.3" in old["summary"] and old["evidence"]["gid_indices"] == [0], old
        assert old["evidence"]["index_source"] == [
            "not set; NCCL 2.18.3 (before 2.21) uses its default index 0"], old  # fmt: skip
        v1num = anomalies["v1num"]
        assert v1num["evidence"]["gid_indices"] == [2], v1num  # the IPv4 GID as RoCE v1
        assert "NCCL_IB_ROCE_VERSION_NUM 1 (environ)" in v1num["evidence"]["index_source"][0]
        time.sleep(3.0)  # more passes over the same snapshot
        assert not {"v2auto", "nover"} & set(_roce(live)), _roce(live)
        print(f"old: {old['summary']}\nv1num: {v1num['summary']}")
    finally:
        for job, _, _ in start:
            jobgen.stop_job(lab, job)
    wait_for(lambda: not _roce(live), 45, "the anomalies closed once the jobs ended")


def test_one_outage_kills_the_job_with_a_short_timeout_and_not_the_other(
    site: dict[str, Any],
) -> None:
    """Two jobs crossing h1-1's link: NCCL_IB_TIMEOUT=14 (0.54 s with retry 7) and 2.23's
    defaults (34.4 s). A 2-s outage is fatal to the first only, in the anomaly and in the
    report's GPU-hours at risk."""
    lab, live = site["lab"], site["live"]
    hosts = [h.name for h in lab.topology.hosts][:2]
    link = lab.topology.link(f"{hosts[0]}-leaf1")
    leaf = link.b  # the switch side: the host sees its carrier go

    def ip(state: str) -> None:
        subprocess.run(["ip", "-n", leaf.namespace, "link", "set", leaf.interface, state],
                       check=True)  # fmt: skip

    tight, loose = qp_limit_s(14, 7), qp_limit_s(20, 7)
    t0 = time.time_ns()
    try:
        jobgen.start_job(lab, "tight", hosts, 3, 5.0, 256, port=jobgen.PORT + 20,
                         nccl_version="2.23.4", env={"NCCL_IB_TIMEOUT": "14"})  # fmt: skip
        jobgen.start_job(lab, "loose", hosts, 3, 5.0, 256, port=jobgen.PORT + 21,
                         nccl_version="2.23.4")  # fmt: skip

        def limits() -> dict[str, dict[str, Any]] | None:
            got = _jobs(live)
            ok = all(j in got and len(got[j]["hosts"]) == 2 and all(
                h["survives_s"] for h in got[j]["hosts"]) for j in FLAP_JOBS)  # fmt: skip
            return got if ok else None

        got = wait_for(limits, 40, "both jobs with their QP limits")
        assert {h["survives_s"] for h in got["tight"]["hosts"]} == {round(tight, 3)}
        assert {h["survives_s"] for h in got["loose"]["hosts"]} == {round(loose, 3)}
        assert got["tight"]["hosts"][0]["survives_from"] == (
            "NCCL_IB_TIMEOUT 14 (environ), NCCL_IB_RETRY_CNT 7 (NCCL 2.23.4 default)"
        )
        time.sleep(1.0)  # a pass with both jobs known before the outage
        ip("down")
        time.sleep(2.0)
        ip("up")

        def judged() -> dict[str, Any] | None:
            for a in live()["anomalies"]["open"]:
                e = a["evidence"]
                if a["link"] == link.name and e.get("outages_s") and e.get("job_verdicts"):
                    return a
            return None

        a = wait_for(judged, 20, "the flap's outage judged against both jobs")
        (outage,) = a["evidence"]["outages_s"]
        assert tight < outage < loose, outage
        by_job = {j["job_id"]: j for j in a["evidence"]["job_verdicts"]}
        assert by_job["tight"]["verdicts"] == ["kills"], by_job
        assert by_job["loose"]["verdicts"] == ["survives"], by_job
        assert f"kills job tight: outage {outage:.1f} s > its 0.54 s" in a["summary"], a
        assert "job loose survives (its 34.4 s)" in a["summary"], a
        print(a["summary"])
    finally:
        ip("up")
        for job in FLAP_JOBS:
            jobgen.stop_job(lab, job)
    # the report's GPU-hours at risk follow the same judgement (2 hosts x 8 GPUs each)
    rng = Range(t0 - 60_000_000_000, time.time_ns() + 1_000_000_000)
    facts = wait_for(lambda: (f := collect(site["store"], rng, lab.topology_path))
                     ["jobs_killed"] and f, 20, "the judged anomaly in the store")  # fmt: skip
    assert [(k["job_id"], k["outage_s"]) for k in facts["jobs_killed"]] == [("tight", outage)]
    expect = 16 * (outage + 30 * 60) + 16 * outage
    assert facts["gpu_hours_at_risk"] == round(expect / 3600, 3), facts["gpu_hours_at_risk"]
    assert facts["flap_outages_over_kill"] == 1
