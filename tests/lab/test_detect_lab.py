"""The detector against real faults: collectors in lab hosts, the real ingest daemon.

Collectors run in the lab hosts' namespaces and ship over the management network to a
real ``clockmesh ingest run`` on the management bridge. Faults are plain commands, as an
operator or a dying optic would cause them: the detector sees only telemetry and the
topology file.
"""

from __future__ import annotations

import contextlib
import random
import re
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.detect.survival import ASSUMED_LIMIT_S
from collector.job_nccl import qp_limit_s
from lab import faults, jobgen
from lab.fabric import Lab
from tests.lab.helpers import opsbox_fleet, routes_over, spine_for, wait_for

pytestmark = [pytest.mark.root, pytest.mark.lab]


_wait = wait_for


@pytest.fixture(scope="module")
def opsbox(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from _opsbox(lab_factory, tmp_path_factory, "d")


@pytest.fixture
def fresh_opsbox(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A lab of its own: no link with a flap history (the module's lab flaps them all)."""
    yield from _opsbox(lab_factory, tmp_path_factory, "dj")


def _opsbox(
    lab_factory: Callable[..., Lab], tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[dict[str, Any]]:
    # Three racks: with two, a missing path leaves its two fabric links indistinguishable.
    lab = lab_factory(name, spines=2, leaves=3, hosts_per_leaf=1)
    with opsbox_fleet(
        lab,
        tmp_path_factory.mktemp("detect"),
        probe={"trace_interval_s": 1.0},
        detect_interval_s=0.2,
        detect_clear_s=10,  # longer than the 5 s between the flaps below: one anomaly
    ) as site:
        live = site["live"]
        # the tomography sees a path move only once it saw where it was: two trace rounds
        # (2 buddies in other racks x 8 ports each) of every host before any fault

        def traced() -> bool:
            return all(h["rows"].get("path_hop", 0) >= 32 for h in live()["hosts"])

        try:
            _wait(traced, 30, "every host's paths traced twice")
            site["traced_at"] = time.monotonic()  # every pair delivered by then
            yield site
        finally:
            jobgen.stop_job(lab, "v1job")


def _open(live: Callable[[], dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [a for a in live()["anomalies"]["open"] if a["kind"] == kind]


def test_a_plainly_flapped_host_link_is_found_named_and_closed(opsbox: dict[str, Any]) -> None:
    lab, live = opsbox["lab"], opsbox["live"]
    link = lab.topology.link("h2-1-leaf2")
    leaf = link.b  # the switch side: the host sees its carrier go
    assert not _open(live, "flapping_link")

    def ip(state: str) -> None:
        subprocess.run(["ip", "-n", leaf.namespace, "link", "set", leaf.interface, state],
                       check=True)  # fmt: skip

    try:
        t_down = time.monotonic()
        ip("down")
        (a,) = _wait(lambda: _open(live, "flapping_link"), 10, "flap anomaly opened")
        latency = time.monotonic() - t_down
        assert a["link"] == "h2-1-leaf2", a
        assert "down now" in a["summary"]
        print(f"link down -> open anomaly in /v1/live: {latency:.2f} s")
        assert latency < 5.0
        time.sleep(3.0)
        ip("up")
        time.sleep(5.0)
        ip("down")
        time.sleep(2.0)
        ip("up")

        def two_flaps() -> dict[str, Any] | None:
            got = _open(live, "flapping_link")
            done = got and len(got[0]["evidence"]["outages_s"]) == 2
            return got[0] if done and got[0]["evidence"]["flaps"] == 2 else None

        a2 = _wait(two_flaps, 10, "the second flap counted on the same anomaly")
        assert a2["anomaly_id"] == a["anomaly_id"]
        outages = a2["evidence"]["outages_s"]
        assert len(outages) == 2 and 2.0 <= outages[0] <= 5.0, outages
    finally:
        ip("up")
    _wait(lambda: not _open(live, "flapping_link"), 40, "anomaly closed once the link is stable")
    closed = live()["anomalies"]["recently_closed"]
    assert any(c["anomaly_id"] == a["anomaly_id"] for c in closed)


def _back(live: Callable[[], dict[str, Any]], place: str, seed: int) -> dict[str, Any]:
    """The open flap anomaly naming ``place`` once it no longer says "down now"."""

    def back() -> dict[str, Any] | None:
        got = [a for a in _open(live, "flapping_link")
               if a["link"] == place and not a["evidence"]["down_now"]]  # fmt: skip
        return got[0] if got else None

    return _wait(back, 20, f"seed {seed}: {place} back in the traced paths")


def test_a_spine_side_link_down_is_found_by_the_paths_that_lose_it(
    opsbox: dict[str, Any],
) -> None:
    """No host counter sees this one: only the traced paths (hop 2 per source port) do."""
    lab, live = opsbox["lab"], opsbox["live"]
    seed = int(time.time_ns() % 100_000)
    fabric = [lk for lk in lab.topology.links if lk.kind == "fabric"]
    link = random.Random(seed).choice(fabric)
    spine = link.b

    def ip(state: str) -> None:
        subprocess.run(["ip", "-n", spine.namespace, "link", "set", spine.interface, state],
                       check=True)  # fmt: skip

    def on_link() -> dict[str, Any] | None:
        got = [a for a in _open(live, "flapping_link") if a["link"] == link.name]
        return got[0] if got else None

    time.sleep(3.0)  # a few healthy trace rounds first
    assert on_link() is None, f"seed {seed}"
    try:
        t_down = time.monotonic()
        ip("down")
        a = _wait(on_link, 15, f"seed {seed}: anomaly naming {link.name}")
        print(
            f"spine-side {link.name} down -> anomaly in /v1/live: {time.monotonic() - t_down:.2f} s"
        )
        assert a["evidence"]["down_now"] and a["evidence"]["spine"] == link.b.node
        assert a["evidence"]["candidates"] == [link.name] and a["evidence"]["confidence"] == 1.0
        others = [x for x in _open(live, "flapping_link") if x["link"] != link.name]
        assert others == [], f"seed {seed}: blamed more than {link.name}: {others}"
        time.sleep(3.0)
    finally:
        ip("up")

    a = _back(live, link.name, seed)
    (outage,) = a["evidence"]["outages_s"]
    assert 2.0 <= outage <= 9.0, (seed, outage)
    _wait(lambda: on_link() is None, 45, f"seed {seed}: anomaly closed once stable")


def test_a_spine_that_goes_as_a_whole_is_named_once_as_the_spine(
    opsbox: dict[str, Any],
) -> None:
    """Every link of one spine down at once (a switch losing power): each rack's paths
    through it end at another rack whose link is out too, so no trace tells which links
    went — every path through the spine did. One anomaly names the spine, not its links
    and an "or"; it ends once, when the spine is back."""
    lab, live = opsbox["lab"], opsbox["live"]
    seed = int(time.time_ns() % 100_000)
    spine = random.Random(seed).choice(sorted({lk.b.node for lk in lab.topology.links
                                               if lk.kind == "fabric"}))  # fmt: skip
    ends = [lk.b for lk in lab.topology.links if lk.kind == "fabric" and lk.b.node == spine]
    names = sorted(lk.name for lk in lab.topology.links if lk.kind == "fabric"
                   and lk.b.node == spine)  # fmt: skip

    def ip(state: str) -> None:
        for end in ends:
            subprocess.run(["ip", "-n", end.namespace, "link", "set", end.interface, state],
                           check=True)  # fmt: skip

    def on_spine() -> dict[str, Any] | None:
        got = [a for a in _open(live, "flapping_link") if a["link"] == spine]
        return got[0] if got else None

    _wait(lambda: not _open(live, "flapping_link"), 45, "no flap left open before")
    time.sleep(3.0)  # a few healthy trace rounds first
    try:
        t_down = time.monotonic()
        ip("down")
        a = _wait(on_spine, 15, f"seed {seed}: anomaly naming {spine}")
        print(f"{spine} down ({len(ends)} links) -> anomaly naming it in /v1/live: "
              f"{time.monotonic() - t_down:.2f} s")  # fmt: skip
        assert a["evidence"]["down_now"] and a["evidence"]["switch"] == spine
        assert a["evidence"]["candidates"] == names and a["evidence"]["confidence"] == 1.0
        assert a["summary"].startswith(f"{spine} (every path through it) flapped")
        # a link named on its own first has folded into it by the next pass
        time.sleep(1.0)
        others = [x["link"] for x in _open(live, "flapping_link") if x["link"] != spine]
        assert others == [], f"seed {seed}: named besides {spine}: {others}"
        time.sleep(2.0)
    finally:
        ip("up")

    a = _back(live, spine, seed)
    (outage,) = a["evidence"]["outages_s"]
    assert 2.0 <= outage <= 9.0, (seed, outage)
    others = [x["link"] for x in _open(live, "flapping_link") if x["link"] != spine]
    assert others == [], f"seed {seed}: named besides {spine} on its way back: {others}"
    _wait(lambda: not _open(live, "flapping_link"), 45, f"seed {seed}: anomaly closed")


def test_a_congested_fabric_link_is_named_from_the_paths_it_slows(
    opsbox: dict[str, Any],
) -> None:
    lab, live = opsbox["lab"], opsbox["live"]
    seed = int(time.time_ns() % 100_000)
    link = random.Random(seed).choice([lk for lk in lab.topology.links if lk.kind == "fabric"])

    def on_link() -> dict[str, Any] | None:
        got = [a for a in _open(live, "contention") if a["link"] == link.name]
        return got[0] if got else None

    assert not _open(live, "contention")
    try:
        t0 = time.monotonic()
        faults.congest(lab, link.name, "20mbit", "a2b")  # leaf -> spine, as lab congest does
        a = _wait(on_link, 40, f"seed {seed}: contention anomaly naming {link.name}")
        print(f"congested {link.name} -> anomaly in {time.monotonic() - t0:.1f} s: {a['summary']}")
        assert a["evidence"]["direction"] == "leaf→spine", a
        others = [x for x in _open(live, "contention") if x["link"] != link.name]
        assert others == [], f"seed {seed}: blamed more than {link.name}: {others}"
    finally:
        faults.heal(lab)
    _wait(lambda: on_link() is None, 60, f"seed {seed}: contention closed after heal")


def test_a_job_on_a_roce_v1_gid_index_is_found_from_its_configuration(
    opsbox: dict[str, Any],
) -> None:
    lab, live = opsbox["lab"], opsbox["live"]
    hosts = [h.name for h in lab.topology.hosts][:2]
    # Index 2 of the lab's GID tables is the IPv4-mapped GID as RoCE v1 (lab/fake_rdma.py).
    jobgen.start_job(lab, "v1job", hosts, 2, 20.0, 512)
    try:
        (a,) = _wait(lambda: _open(live, "roce_v1_job"), 30, "RoCE v1 job anomaly")
        assert a["job_id"] == "v1job"

        def both() -> dict[str, Any] | None:
            got = _open(live, "roce_v1_job")
            return got[0] if got and len(got[0]["evidence"]["hosts"]) == 2 else None

        a = _wait(both, 30, "the job's second host in the same anomaly")
        assert sorted(a["evidence"]["hosts"]) == sorted(hosts)
        assert a["evidence"]["gid_indices"] == [2]
    finally:
        jobgen.stop_job(lab, "v1job")
    _wait(lambda: not _open(live, "roce_v1_job"), 45, "anomaly closed once the job ended")
    with urllib.request.urlopen(opsbox["url"] + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert 'clockmesh_anomalies_opened_total{kind="roce_v1_job"} 1.0' in metrics
    assert Path(opsbox["store"] / "anomalies").is_dir()


def test_a_roce_v1_job_is_found_from_its_delay_alone_under_best_effort_load(
    opsbox: dict[str, Any],
) -> None:
    """Nothing in the GID configuration to go on — the job's index has no entry in any GID
    table — only what its traffic does: with the fabric links at a capacity and an RDMA
    traffic class (lab capacity), best-effort bulk traffic between two racks queues the
    v1 job's messages (sent without DSCP: RoCE v1 has no IP header) but neither the probes
    nor a RoCE v2 job's messages (both in the RDMA class)."""
    from lab import capacity

    lab, live = opsbox["lab"], opsbox["live"]
    hosts = [h.name for h in lab.topology.hosts]

    def roce(job: str) -> dict[str, Any] | None:
        got = [a for a in _open(live, "roce_v1_job") if a["job_id"] == job]
        return got[0] if got else None

    capacity.apply(lab, "20mbit")
    try:
        jobgen.start_job(lab, "v1quiet", hosts, 9, 20.0, 512, dscp=0)
        jobgen.start_job(
            lab, "v2ok", hosts, 3, 20.0, 512, port=jobgen.PORT + 1
        )  # index 3: RoCE v2, DSCP 26
        time.sleep(10.0)  # the flows' floors on an idle fabric
        assert roce("v1quiet") is None and roce("v2ok") is None
        t0 = time.monotonic()
        faults.bulk(lab, hosts[0], hosts[1], "20mbit")  # every path h1 -> h2 queues
        a = _wait(lambda: roce("v1quiet"), 45, "the v1 job found from its delay")
        print(f"bulk load -> roce_v1_job from delay in {time.monotonic() - t0:.1f} s: "
              f"{a['summary']}")  # fmt: skip
        ev = a["evidence"]
        assert ev["source"].startswith("in-band against out-of-band delay"), ev
        assert ev["inband_excess_us"] >= 5 * max(ev["probe_excess_us"], 40.0), ev
        assert set(ev["hosts"]) <= {hosts[0], hosts[2]}, ev  # senders into the loaded rack
        time.sleep(5.0)
        assert roce("v2ok") is None, "a RoCE v2 job (RDMA class) was blamed"
    finally:
        jobgen.stop_job(lab, "v1quiet")
        jobgen.stop_job(lab, "v2ok")
        faults.heal(lab)
        capacity.remove(lab)


def test_two_jobs_hashed_onto_one_spine_slow_each_other_and_the_link_is_named(
    opsbox: dict[str, Any],
) -> None:
    """With fabric links at a capacity, two RoCE v2 jobs whose flows ECMP onto the same
    spine fill its links' RDMA queue (the probes' queue too) while the other spine idles:
    a contention anomaly names the link, the jobs between those hosts, and nothing on the
    other spine."""
    from lab import capacity

    lab, live = opsbox["lab"], opsbox["live"]
    h1, h2 = (h.name for h in lab.topology.hosts[:2])
    spine = spine_for(lab, h1, h2, jobgen.PORT)
    port_b = next(p for p in range(jobgen.PORT + 2, jobgen.PORT + 200)
                  if spine_for(lab, h1, h2, p) == spine)  # fmt: skip
    leaf1 = lab.topology.host(h1).rack
    # An earlier test's load (best-effort bulk at 20 Mbit/s) may have left a contention
    # anomaly open: this test's claim starts from a fabric judged quiet.
    wait_for(lambda: not _open(live, "contention"), 90, "earlier contention closed")
    capacity.apply(lab, "2mbit")
    try:
        time.sleep(8.0)  # probes settle at their floors under the capacity
        assert not _open(live, "contention")
        for job, port in (("jobA", jobgen.PORT), ("jobB", port_b)):
            jobgen.start_job(lab, job, [h1, h2], 3, 200.0, 1400, port=port)

        blamed: list[str] = []  # RoCE v1 pages for these RoCE v2 jobs (index 3, DSCP 26)

        def named() -> dict[str, Any] | None:
            doc = live()
            blamed.extend(a["summary"] for a in doc["anomalies"]["open"]
                          if a["kind"] == "roce_v1_job" and a["job_id"] in ("jobA", "jobB"))  # fmt: skip
            got = [a for a in doc["anomalies"]["open"]
                   if a["kind"] == "contention" and a["link"] == f"{leaf1}-{spine}"]  # fmt: skip
            return got[0] if got else None

        t0 = time.monotonic()
        a = _wait(named, 45, f"contention on {leaf1}-{spine}")
        print(f"two jobs on {leaf1}-{spine} -> contention in {time.monotonic() - t0:.1f} s: "
              f"{a['summary']}")  # fmt: skip
        assert {"jobA", "jobB"} <= set(a["evidence"]["jobs"]), a["evidence"]

        # The anomaly may open while the queue is still filling (a loaded machine is slower
        # to fill it); while it lasts its evidence must show the paths through the link
        # held back by milliseconds, not microseconds.
        def slowed() -> dict[str, Any] | None:
            got = named()
            return got if got and got["evidence"]["median_excess_ms"] > 5.0 else None

        _wait(slowed, 20, f"median excess > 5 ms on {leaf1}-{spine} while the jobs run")
        other = [x for x in _open(live, "contention") if spine not in x["link"]]
        assert other == [], f"the idle spine was blamed: {other}"
        deadline = time.monotonic() + 10.0  # the jobs' waits are the link's queue, not v1
        while time.monotonic() < deadline:
            named()
            time.sleep(0.5)
        assert blamed == [], f"RoCE v2 jobs paged as RoCE v1 during contention: {blamed[:2]}"
    finally:
        jobgen.stop_job(lab, "jobA")
        jobgen.stop_job(lab, "jobB")
        capacity.remove(lab)
    # The queue drains as the jobs stop: their last waits are not v1 either (a page opened
    # 2 s after the contention closed, the probes already quiet).
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        named()
        time.sleep(0.5)
    assert blamed == [], f"RoCE v2 jobs paged as RoCE v1 after contention: {blamed[:2]}"


def test_spine_side_flaps_of_every_fabric_link_are_measured_to_a_third_of_a_second(
    opsbox: dict[str, Any],
) -> None:
    """Spine-side downs of 1, 2, 3 and 5 s on every leaf–spine link in turn.

    An outage is the time the link's paths were unusable: from the link going down until
    the fabric routes over it again (BGP re-learns a returned link ~0.1 s after it is up;
    until then no traffic crosses it, so that time counts). Each reported outage must lie
    within 0.3 s of the lab's own FIBs, polled every ~30 ms, and — where the routers
    re-learned it within ``RELEARN_S`` — of the injected down; no anomaly but the flapped
    link's may be open. Every rack keeps its other spine, so a job crossing the link loses
    only the reroute: the reported reroute must be a true bound of the FIBs' own, and the
    verdict against the limit in force (``evidence.collective_kill_s``: no job runs, the
    34.4 s of current NCCL defaults; the evidence's count of outages fatal to a job and the
    summary's words) must match the truth's."""
    lab, live = opsbox["lab"], opsbox["live"]
    report: list[str] = []
    for link in [lk for lk in lab.topology.links if lk.kind == "fabric"]:
        _wait(lambda: not live()["anomalies"]["open"], 60, f"nothing open before {link.name}")
        _flap(lab, live, link, (1.0, 2.0, 3.0, 5.0), {}, report)
    print("\n".join(report))


def test_jobs_crossing_a_fabric_link_routed_around_are_judged_on_the_reroute(
    fresh_opsbox: dict[str, Any],
) -> None:
    """Two jobs on a host of every rack, so both cross every leaf–spine link: "tight"
    (NCCL_IB_TIMEOUT=14: 0.54 s) and "mid" (NCCL_IB_TIMEOUT=17: 4.3 s). Spine-side downs of
    2 and 5 s on a link of each spine: the rack keeps its other spine, so the jobs' flows
    lose only the reroute (the FIBs route around the link within a fraction of a second),
    not the 3.3- and 6.3-s outages. "mid" survives every flap — the 5-s downs are outages
    longer than its 4.3 s, which the outage rule called fatal — and "tight" survives
    exactly the flaps whose reported reroute is within its 0.54 s (over it: "may not
    survive", never "kills"); the count of outages fatal to a job and the summary's words
    say the same."""
    lab, live = fresh_opsbox["lab"], fresh_opsbox["live"]
    fabric = [lk for lk in lab.topology.links if lk.kind == "fabric"]
    links = [fabric[0], next(lk for lk in fabric[::-1] if lk.b.node != fabric[0].b.node)]
    hosts = [h.name for h in lab.topology.hosts]  # one per rack
    limits = {"tight": qp_limit_s(14, 7), "mid": qp_limit_s(17, 7)}
    report: list[str] = []
    try:
        for k, (job, timeout) in enumerate((("tight", "14"), ("mid", "17"))):
            jobgen.start_job(lab, job, hosts, 3, 5.0, 256, port=jobgen.PORT + 30 + k,
                             nccl_version="2.23.4", env={"NCCL_IB_TIMEOUT": timeout})  # fmt: skip

        def known() -> bool:
            got = {j["job_id"]: j for j in live()["jobs"]}
            return all(
                job in got and len(got[job]["hosts"]) == len(hosts)
                and {h["survives_s"] for h in got[job]["hosts"]} == {round(lim, 3)}
                for job, lim in limits.items()
            )  # fmt: skip

        _wait(known, 60, "both jobs on every host with their QP limits")
        for link in links:
            _wait(lambda: not _open(live, "flapping_link"), 60, f"no flap open before {link.name}")
            # the jobs' own in-band delays may open other anomalies: no other flap may
            ev = _flap(lab, live, link, (2.0, 5.0), limits, report, beside="flapping_link")
            # out of service longer than mid survives, and mid survived it
            assert ev["outages_s"][-1] > limits["mid"], ev
    finally:
        for job in limits:
            jobgen.stop_job(lab, job)
    print("\n".join(report))


RELEARN_S = 0.2  # the lab's routers route over a returned link within this (lab/frr.py)


def _flap(
    lab: Lab,
    live: Callable[[], dict[str, Any]],
    link: Any,
    downs: tuple[float, ...],
    limits: dict[str, float],
    report: list[str],
    beside: str = "",
) -> dict[str, Any]:
    """Spine-side downs of ``link``, each checked against the lab's FIBs; ``limits``: the
    jobs running across it (none: the defaults assumed); ``beside``: the kind of anomaly
    that may not be open beside the link's (all kinds: ""). Returns the last evidence."""

    def ip(state: str) -> float:
        """Set the spine's end down or up; when it happened (the midpoint of the command's
        own few milliseconds)."""
        spine = link.b
        before = time.monotonic()
        subprocess.run(["ip", "-n", spine.namespace, "link", "set", spine.interface, state],
                       check=True)  # fmt: skip
        return (before + time.monotonic()) / 2

    def routed() -> bool:
        return routes_over(lab, link)

    truths: list[float] = []
    rerouted_by: list[float] = []  # the FIBs routed around it only after this (lower bound)
    anomaly_id = None
    base = -1  # outages of the link's flap window from before (an earlier test's)
    for down_s in downs:
        _wait(routed, 20, f"{link.name} routed over")
        named_after = None
        still_routed = 0.0
        try:
            t0 = ip("down")
            routing = True
            while time.monotonic() - t0 < down_s:  # the injection; watch it get named
                if routing:  # the FIBs still route over it: its flows still lose packets
                    seen = time.monotonic() - t0
                    routing = routed()
                    still_routed = seen if routing else still_routed
                if named_after is None and any(
                    a["link"] == link.name and a["evidence"]["down_now"]
                    for a in _open(live, "flapping_link")
                ):
                    named_after = time.monotonic() - t0
                time.sleep(0.05)
        finally:
            injected = ip("up") - t0  # how long it was really down
        assert not routing, f"{link.name}: the fabric never routed around it"
        _wait(routed, 20, f"{link.name} routed over again", every=0.0)
        truth = time.monotonic() - t0
        truths.append(truth)
        rerouted_by.append(still_routed)
        n = len(truths)

        def reported(n: int = n, base: int = base) -> dict[str, Any] | None:
            got = [a for a in _open(live, "flapping_link") if a["link"] == link.name]
            ok = got and not got[0]["evidence"]["down_now"]
            k = len(got[0]["evidence"]["outages_s"]) if ok else 0
            return got[0] if ok and (k == base + n if base >= 0 else k >= n) else None

        a = _wait(reported, 20, f"{link.name}: outage {n} ({down_s:g} s down) reported")
        ev = a["evidence"]
        base = len(ev["outages_s"]) - n if base < 0 else base
        got = ev["outages_s"][-1]
        reroute = ev["reroutes_s"][-1]
        report.append(
            f"{link.name} down {down_s:g} s ({injected:.2f} s): paths unusable {truth:.2f} s, reported "
            f"{got:.2f} s (±{ev['outage_error_s']:.2f}), named after "
            f"{'-' if named_after is None else f'{named_after:.2f} s'}; FIBs routed "
            f"around it after {still_routed:.2f} s, reroute reported within {reroute} s"
        )
        print(report[-1])
        assert abs(got - truth) <= 0.3, report[-1]  # the paths' own outage
        # and the link's, where the lab's routers re-learned it in their usual ~0.1 s (now and
        # then a race of FRR 8.4 on the passive leaf tears the new session down and the spine
        # re-makes it 0.6-0.9 s later, lab/frr.py: the paths are lost that long, and so reported)
        if truth - injected <= RELEARN_S:
            assert abs(got - injected) <= 0.3, report[-1]
        else:
            report[-1] += f" [routers re-learned it {truth - injected:.2f} s after it was up]"
        anomaly_id = anomaly_id or a["anomaly_id"]
        assert a["anomaly_id"] == anomaly_id, "every flap of a link on its one anomaly"
        assert ev["candidates"] == [link.name] and ev["flaps"] == base + n, ev
        # The rack kept its other spine: the reroute is measured, and it is a bound of
        # the FIBs' own (the traces are timed by their send, the FIBs polled ~every 0.1 s).
        assert ev["every_path_lost"][-1] is False and reroute is not None, report[-1]
        assert reroute + 0.05 >= still_routed, report[-1]
        limit = ev["collective_kill_s"]
        # fatal only if the jobs' flows lost more than they survive: the FIBs' reroute
        over = sum(1 for r in rerouted_by if r >= limit)
        assert ev["outages_over_kill_s"] == over, (report[-1], limit, ev)
        # The summary's words for the same verdicts (survival.judge_outages). Outages of
        # the link in its flap window from an earlier test (a whole spine's, or a random
        # link's) may have had no reroute measured: said apart, judged on the outage.
        s = a["summary"]
        mine, earlier = ev["reroutes_s"][base:], ev["reroutes_s"][:base]
        assert None not in mine, (report[-1], ev["reroutes_s"])
        unmeasured = sum(1 for r, lost in zip(earlier, ev["every_path_lost"], strict=False)
                         if r is None and not lost)  # fmt: skip
        tail = (
            f"; reroute not measured in {unmeasured}: judged on the outage)" if unmeasured else ")"
        )
        known = max(r for r in ev["reroutes_s"] if r is not None)
        assert (
            f"out of service up to {ev['longest_outage_s']:.1f} s (paths rerouted within "
            f"{known:.2f} s{tail}" in s
        ), (s, ev["reroutes_s"])
        fatal_words = "kills job" in s or re.search(r"\b[1-9]\d* longer than the ", s)
        assert bool(fatal_words) == (over > 0), s
        if not limits:  # no job seen: the current defaults, assumed
            assert limit == round(ASSUMED_LIMIT_S, 3), ev
            judged_on = "" if unmeasured else "judged on the reroute: "  # (else: the outage)
            assert f"{judged_on}none longer than the 34.4 s" in s, s
        else:
            _judged_for_jobs(ev, s, n, reroute, limits, report[-1])  # the last n outages
            print(s)
        open_now = live()["anomalies"]["open"]
        others = [x for x in open_now if x["anomaly_id"] != anomaly_id
                  and (not beside or x["kind"] == beside)]  # fmt: skip
        assert others == [], f"{link.name}: open beside it: {others}"
    return ev


def test_sub_millisecond_contention_is_named_with_link_and_direction(
    opsbox: dict[str, Any],
) -> None:
    """Shallow buffers (lab capacity --buffer 500us): one direction of a random leaf–spine
    link filled by another job's RoCE v2-class traffic queues at most ~0.5 ms and drops
    beyond — the detector names that link and direction, and nothing else, from the
    probes' microsecond delays (the old 1-ms rule saw nothing)."""
    from lab import capacity, loadgen

    lab, live = opsbox["lab"], opsbox["live"]
    seed = int(time.time_ns() % 100_000)
    rng = random.Random(seed)
    link = rng.choice([lk for lk in lab.topology.links if lk.kind == "fabric"])
    direction = rng.choice(["a2b", "b2a"])
    words = "leaf→spine" if direction == "a2b" else "spine→leaf"

    def on_link() -> dict[str, Any] | None:
        got = [a for a in _open(live, "contention") if a["link"] == link.name]
        return got[0] if got else None

    capacity.apply(lab, "50mbit", buffer_us=500)
    try:
        _wait(lambda: not _open(live, "contention"), 60, "no contention open before")
        # Every route learns its healthy tail (a window a second) before it is judged: a
        # fleet started moments ago (this test alone) needs the clocks solved and ~10 s.
        time.sleep(20.0)
        assert not _open(live, "contention"), _open(live, "contention")
        loadgen.saturate(lab, link.name, direction, "50mbit")
        t0 = time.monotonic()
        a = _wait(on_link, 30, f"seed {seed}: contention naming {link.name} {words}")
        print(f"seed {seed}: {link.name} {words} saturated -> named in "
              f"{time.monotonic() - t0:.1f} s: {a['summary']}")  # fmt: skip
        ev = a["evidence"]
        assert ev["direction"] == words, (seed, ev)
        assert ev["queue_us"] < 1000 and ev["median_excess_ms"] < 1.0, (seed, ev)
        others = [x for x in _open(live, "contention") if x["link"] != link.name]
        assert others == [], f"seed {seed}: blamed more than {link.name}: {others}"
    finally:
        faults.heal(lab)
        capacity.remove(lab)
    _wait(lambda: on_link() is None, 60, f"seed {seed}: contention closed after heal")


def _a_hosts_port(
    lab: Any, live: Callable[[], dict[str, Any]]
) -> tuple[str, str, Callable[[], list[dict[str, Any]]]]:
    """A random host, its access link, and what reads the contention open on that link —
    once no contention is open at all."""
    host = random.Random(time.time_ns()).choice(lab.topology.hosts).name
    port = next(lk.name for lk in lab.topology.links if lk.kind == "access" and lk.a.node == host)
    _wait(lambda: not _open(live, "contention"), 60, "no contention open before")
    return host, port, lambda: [a for a in _open(live, "contention") if a["link"] == port]


def test_a_full_queue_at_one_hosts_port_stays_named_until_it_drains(
    opsbox: dict[str, Any],
) -> None:
    """Incast, as found by hand in the demo lab: the leaf's port towards one host holds a
    standing queue of tens of ms. It is named there, in that direction — and stays named
    while the queue stands, although within a minute the clock solver takes the queue for
    the host's clock running ahead (its round trips still show it); once drained, it
    closes and the clock's way back names nothing."""
    lab, live = opsbox["lab"], opsbox["live"]
    host, port, at_port = _a_hosts_port(lab, live)
    faults.congest(lab, port, "20mbit", direction="b2a")
    try:
        t0 = time.monotonic()
        (a,) = _wait(at_port, 45, f"contention naming {port} (leaf→host)")
        print(f"{port} leaf→host: named in {time.monotonic() - t0:.1f} s: {a['summary']}")
        assert a["evidence"]["direction"] == "leaf→host", a
        assert a["evidence"]["host"] == host, a
        first = a["anomaly_id"]
        # The lab saw the solver absorb it within a minute; held for 100 s in all.
        while time.monotonic() - t0 < 100:
            now = at_port()
            assert [x["anomaly_id"] for x in now] == [first], (
                f"{time.monotonic() - t0:.0f} s into the incast: {now}"
            )
            time.sleep(2.0)
        print(f"still open after 100 s: {now[0]['summary']}")
    finally:
        faults.heal(lab)
    _wait(lambda: not at_port(), 60, f"{port} closed after the queue drained")
    deadline = time.monotonic() + 30  # the clock's way back: no page in either direction
    while time.monotonic() < deadline:
        opened = _open(live, "contention")
        assert not opened, [
            f"{time.monotonic() - deadline + 30:.0f} s after it closed: {x['summary']}"
            for x in opened
        ]
        time.sleep(2.0)


def test_a_shallow_full_queue_at_one_hosts_port_is_named_there_not_as_a_silent_drop(
    opsbox: dict[str, Any],
) -> None:
    """Incast into a shallow buffer, as found by hand in the demo lab (2026-12-05): the
    leaf's port towards one host holds two full frames (400 µs asked: ~480 µs at 50 Mbit/s,
    the least the lab's tbf takes), filled three times faster than it drains,
    so it drains between the load's bursts and drops a share of everything. Its probes'
    lower quartile barely waits — no queue stands — and before this, nothing was named
    while a false "spine1 towards h2-3 silently drops traffic … no queue" paged and
    `clockmesh live` called the host and its rack-mates lossy. It is named at that port,
    leaf→host, from its tail and its losses; no silent drop; the host is the culprit and
    no host is lossy."""
    lab, live = opsbox["lab"], opsbox["live"]
    host, port, at_port = _a_hosts_port(lab, live)
    faults.congest(lab, port, "50mbit", direction="b2a", buffer_us=400)
    try:
        t0 = time.monotonic()
        (a,) = _wait(at_port, 30, f"contention naming {port} (leaf→host)")
        print(f"{port} leaf→host: named in {time.monotonic() - t0:.1f} s: {a['summary']}")
        ev = a["evidence"]
        assert (ev["direction"], ev["host"]) == ("leaf→host", host), a
        assert 40 <= ev["queue_us"] < 1000 and ev["loss_in"] > 0.01, ev
        while time.monotonic() - t0 < 40:
            doc = live()
            assert not [x for x in doc["anomalies"]["open"] if x["kind"] == "silent_drop"], doc[
                "anomalies"
            ]["open"]
            assert [x["anomaly_id"] for x in at_port()] == [a["anomaly_id"]], at_port()
            verdicts = {h["host"]: h["verdict"] for h in doc["hosts"]}
            assert verdicts[host] == "culprit", verdicts
            assert "lossy" not in verdicts.values(), verdicts
            time.sleep(2.0)
    finally:
        faults.heal(lab)
    _wait(lambda: not at_port(), 90, f"{port} closed after the queue drained")


def test_healthy_roce_v2_jobs_on_shallow_buffers_raise_no_contention(
    opsbox: dict[str, Any],
) -> None:
    """Realistic buffers and healthy RoCE v2 jobs between every rack, well under the
    links' capacity: the probes' tails move with the jobs' traffic, no queue stands —
    no contention opens."""
    from lab import capacity

    lab, live = opsbox["lab"], opsbox["live"]
    hosts = [h.name for h in lab.topology.hosts]
    _wait(lambda: not _open(live, "contention"), 60, "no contention open before")
    capacity.apply(lab, "50mbit", buffer_us=500)
    try:
        jobgen.start_job(lab, "healthyA", hosts, 3, 200.0, 1400)
        jobgen.start_job(lab, "healthyB", hosts, 3, 200.0, 1400, port=jobgen.PORT + 1)
        deadline = time.monotonic() + 40.0
        while time.monotonic() < deadline:
            opened = [a for a in live()["anomalies"]["open"] if a["kind"] == "contention"]
            # the whole evidence: a CI's log is all a wrong page here leaves to go on
            assert not opened, [(a["link"], a["summary"], a["evidence"]) for a in opened]
            time.sleep(0.5)
    finally:
        jobgen.stop_job(lab, "healthyA")
        jobgen.stop_job(lab, "healthyB")
        capacity.remove(lab)


# ---- silent drops: a switch discards part of the traffic, links and BGP stay up ----------
def _silent_drops_in_store(store: Path) -> list[tuple[str, str]]:
    """(anomaly id, summary) of every silent_drop the daemon ever opened in this store."""
    import duckdb

    from analytics.store import layout

    if not layout.has_files(store, "anomalies"):
        return []
    rows = (
        duckdb.connect()
        .execute(
            f"SELECT DISTINCT anomaly_id, json_extract_string(detail, '$.summary') "
            f"FROM read_parquet('{layout.table_glob(store, 'anomalies')}', hive_partitioning = true) "
            "WHERE kind = 'silent_drop'"
        )
        .fetchall()
    )
    return [(str(a), str(s)) for a, s in rows]


def _once_pairs_are_judged(opsbox: dict[str, Any], at_least_s: float) -> None:
    """Sleep until every pair is judged (WARMUP_NS after its first delivered probe, and
    a second more; a new pair's first seconds are not a switch's drop): a test run alone
    starts before that. At least ``at_least_s``."""
    from analytics.detect.silent_drop import WARMUP_NS

    young = WARMUP_NS / 1e9 - (time.monotonic() - opsbox["traced_at"])
    time.sleep(max(at_least_s, young + 1.0))


def _silent_drops_held(url: str) -> dict[str, float]:
    """The daemon's count of places that looked like a silent drop and were held back, by
    reason (a test that waited in vain says why)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    got = re.findall(r'^clockmesh_detect_silent_drop_held_total\{reason="(\w+)"\} (\S+)$', text,
                     re.MULTILINE)  # fmt: skip
    return {reason: float(n) for reason, n in got}


def _no_silent_drop_for(live: Callable[[], dict[str, Any]], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = _open(live, "silent_drop")
        assert not got, f"silent_drop during {what}: {got[0]['summary']}"
        time.sleep(0.2)


def test_no_silent_drop_is_claimed_when_healthy_nor_during_a_flap_or_contention(
    opsbox: dict[str, Any],
) -> None:
    """Loss a link flap or a full queue causes is theirs: paths moved (the traces show it)
    or the probes that get through wait. Any earlier test of this module (flaps, contention,
    jobs filling a queue) must not have raised one either."""
    lab, live = opsbox["lab"], opsbox["live"]
    assert _silent_drops_in_store(opsbox["store"]) == []
    _no_silent_drop_for(live, 8.0, "a healthy period")
    seed = int(time.time_ns() % 100_000)
    link = random.Random(seed).choice([lk for lk in lab.topology.links if lk.kind == "fabric"])
    spine = link.b

    def ip(state: str) -> None:
        subprocess.run(["ip", "-n", spine.namespace, "link", "set", spine.interface, state],
                       check=True)  # fmt: skip

    try:
        ip("down")
        _wait(lambda: [a for a in _open(live, "flapping_link") if a["link"] == link.name], 15,
              f"seed {seed}: the flap of {link.name} found")  # fmt: skip
        _no_silent_drop_for(live, 3.0, f"the outage of {link.name} (seed {seed})")
    finally:
        ip("up")
    _no_silent_drop_for(live, 8.0, f"{link.name} coming back (seed {seed})")
    try:
        faults.congest(lab, link.name, "20mbit", "a2b")
        _no_silent_drop_for(live, 20.0, f"contention on {link.name} (seed {seed})")
    finally:
        faults.heal(lab)
    _no_silent_drop_for(live, 5.0, "the heal")
    assert _silent_drops_in_store(opsbox["store"]) == []


@contextlib.contextmanager
def _blackholed(router: Any, host: Any) -> Iterator[float]:
    """A plain blackhole /32 for ``host`` in ``router``'s kernel table (not through FRR,
    not through `lab drop`): BGP keeps advertising, every link stays up, no ICMP is sent.
    Yields when it went in (monotonic); removed on the way out, even on failure."""
    route = ["ip", "-n", router.namespace, "route"]
    hole = ["blackhole", f"{host.backend_address}/32"]
    t0 = time.monotonic()
    subprocess.run([*route, "add", *hole], check=True)
    try:
        yield t0
    finally:
        subprocess.run([*route, "del", *hole], check=False)


def _silent_drop_at(
    live: Callable[[], dict[str, Any]], switch: str
) -> Callable[[], dict[str, Any] | None]:
    """The open silent_drop naming ``switch``, or None."""

    def named() -> dict[str, Any] | None:
        got = [a for a in _open(live, "silent_drop") if a["evidence"]["switch"] == switch]
        return got[0] if got else None

    return named


def _closed_with_the_route(
    live: Callable[[], dict[str, Any]], named: Callable[[], Any], a: dict[str, Any], what: str
) -> None:
    _wait(lambda: named() is None, 40, f"{what}: closed once the route is gone")
    recent = live()["anomalies"]["recently_closed"]
    assert any(c["anomaly_id"] == a["anomaly_id"] for c in recent)


def test_a_spine_silently_dropping_one_host_is_named_with_the_host_within_5_s(
    opsbox: dict[str, Any],
) -> None:
    """A plain blackhole /32 in a spine's kernel table (not through FRR, not through `lab
    drop`): BGP keeps advertising the rack, every link stays up, no ICMP is sent — only
    the probes crossing that spine towards that host are lost."""
    from lab import frr

    lab, live = opsbox["lab"], opsbox["live"]
    topo = lab.topology
    seed = int(time.time_ns() % 100_000)
    rng = random.Random(seed)
    spine = rng.choice(topo.spines)
    host = rng.choice(topo.hosts)
    named = _silent_drop_at(live, spine.name)
    _wait(lambda: not _open(live, "flapping_link") and not _open(live, "contention"), 90,
          "earlier anomalies closed")  # fmt: skip
    _once_pairs_are_judged(opsbox, at_least_s=3.0)
    assert named() is None, f"seed {seed}"
    with _blackholed(spine, host) as t0:
        a = _wait(named, 20, f"seed {seed}: silent_drop at {spine.name} towards {host.name}")
        latency = time.monotonic() - t0
        print(f"blackhole {host.name} on {spine.name} -> anomaly in {latency:.2f} s: "
              f"{a['summary']}")  # fmt: skip
        ev = a["evidence"]
        assert ev["destinations"] == [host.name], (seed, ev)
        assert a["link"] == f"{host.rack}-{spine.name}" and ev["links"] == [a["link"]], (seed, a)
        assert ev["confidence"] == 1.0 and ev["flow_share"] == 1.0, (seed, ev)
        assert latency <= 5.0, f"seed {seed}: named after {latency:.1f} s"
        # Every link and BGP session up; nothing else blamed.
        sessions = [s for r in topo.spines for s in frr.sessions(lab.name, topo, r)]
        assert sessions and all(s.up for s in sessions), sessions
        assert not _open(live, "flapping_link") and not _open(live, "contention")
        assert len(_open(live, "silent_drop")) == 1, _open(live, "silent_drop")
        _wait(lambda: (named() or {}).get("age_s", 0) >= 3.0, 10, "still named 3 s on")
    _closed_with_the_route(live, named, a, f"seed {seed}")


def test_a_leaf_black_holing_its_own_host_is_named_from_that_hosts_port(
    opsbox: dict[str, Any],
) -> None:
    """A blackhole /32 in a leaf's kernel table for one of its own hosts: every path into
    that host is lost, from every rack, while it sends on and its link stays up. The
    probes alone cannot tell it from the host losing all it receives; the host's port,
    which counts nothing in, can."""

    lab, live = opsbox["lab"], opsbox["live"]
    topo = lab.topology
    seed = int(time.time_ns() % 100_000)
    host = random.Random(seed).choice(topo.hosts)
    leaf = next(r for r in topo.leaves if r.name == host.rack)
    named = _silent_drop_at(live, leaf.name)
    _wait(lambda: not _open(live, "flapping_link") and not _open(live, "contention")
          and not _open(live, "silent_drop"), 90, "earlier anomalies closed")  # fmt: skip
    _once_pairs_are_judged(opsbox, at_least_s=3.0)
    with _blackholed(leaf, host) as t0:
        a = _wait(named, 30, f"seed {seed}: silent_drop at {leaf.name} towards {host.name}")
        latency = time.monotonic() - t0
        print(f"blackhole {host.name} on its leaf {leaf.name} -> anomaly in {latency:.2f} s: "
              f"{a['summary']}")  # fmt: skip
        ev = a["evidence"]
        assert ev["destinations"] == [host.name], (seed, ev)
        assert a["link"] == "" and ev["links"] == [], (seed, a)  # no other link leads there
        assert ev["port_rx_packets"][host.name] * 10 < ev["lost_probes"], (seed, ev)
        assert f"{host.name}'s NIC (receiving)" in ev["candidates"], (seed, ev)
        assert latency <= 10.0, f"seed {seed}: named after {latency:.1f} s"
        assert not _open(live, "flapping_link") and not _open(live, "contention")
        assert len(_open(live, "silent_drop")) == 1, _open(live, "silent_drop")
    _closed_with_the_route(live, named, a, f"seed {seed}")


def _judged_for_jobs(
    ev: dict[str, Any], s: str, n: int, reroute: float, limits: dict[str, float], what: str
) -> None:
    """The verdicts of the jobs "tight" and "mid" on a link routed around."""
    limit = ev["collective_kill_s"]
    assert limit == round(min(limits.values()), 3), ev
    by_job = {j["job_id"]: j for j in ev["job_verdicts"]}
    assert set(by_job) == set(limits), ev
    mid, tight = by_job["mid"]["verdicts"], by_job["tight"]["verdicts"]
    assert mid[-n:] == ["survives"] * n, (what, ev)
    expect = "survives" if reroute <= by_job["tight"]["survives_s"] else "may kill"
    assert tight[-1] == expect, (what, ev)
    assert "job mid survives the reroute (its 4.3 s)" in s, s
    if "may kill" in tight:
        assert "job tight may not survive the reroute: paths rerouted within " in s, s
    else:
        assert "job tight survives the reroute (its 0.54 s)" in s, s


def test_a_spine_port_dropping_a_random_share_of_its_packets_is_named_with_its_link(
    opsbox: dict[str, Any],
) -> None:
    """A bad optic or cable: a spine's port to one leaf loses 15 % of the packets it sends
    (nftables numgen in the spine's forward hook), at random — every flow through it loses
    some, none many in a row, links and BGP up. On the demo lab at 2 % nothing was named
    and `clockmesh live` said 16/16 healthy. Named: that link, spine→leaf, with its rate;
    nothing else; closed once the port is mended. (This lab's hosts send ~32 probes a
    second; ~12 a second cross the port, and 15 % loses ~12 in the window's ~6.5 judged
    seconds, near the 10 a place must explain to be chosen — kept with 5 once holding;
    the demo's rate names 2 %.)"""
    from lab import frr

    lab, live = opsbox["lab"], opsbox["live"]
    topo = lab.topology
    seed = int(time.time_ns() % 100_000)
    link = random.Random(seed).choice([lk for lk in topo.links if lk.kind == "fabric"])
    spine = link.b

    def named() -> dict[str, Any] | None:
        got = [a for a in _open(live, "silent_drop") if a["link"] == link.name]
        return got[0] if got else None

    _wait(lambda: not _open(live, "flapping_link") and not _open(live, "contention")
          and not _open(live, "silent_drop"), 90, "earlier anomalies closed")  # fmt: skip
    # run alone, this test injected 3 s after the fleet's first probes, and 8 of its
    # ~17 s were the pairs' warm-up
    _once_pairs_are_judged(opsbox, at_least_s=0.0)
    nft = ["ip", "netns", "exec", spine.namespace, "nft"]
    rules = ("table ip cmtest_gray { chain forward { type filter hook forward priority 0; "
             f'policy accept; oifname "{spine.interface}" numgen random mod 1000 < 150 '
             "counter drop; }; }")  # fmt: skip
    subprocess.run([*nft, "-f", "-"], input=rules, text=True, check=True)
    t0 = time.monotonic()
    try:
        a = _wait(named, 30, f"seed {seed}: silent_drop on {link.name}",
                  detail=lambda: {**{k: [(x["link"], x["summary"][:120]) for x in _open(live, k)]
                                     for k in ("silent_drop", "contention", "flapping_link")},
                                  "held": _silent_drops_held(opsbox["url"])})  # fmt: skip
        latency = time.monotonic() - t0
        print(f"15 % random loss out of {spine.node}:{spine.interface} -> anomaly in "
              f"{latency:.2f} s (held: {_silent_drops_held(opsbox['url'])}): "
              f"{a['summary']}")  # fmt: skip
        ev = a["evidence"]
        assert ev["pattern"] == "random" and ev["links"] == [link.name], (seed, ev)
        assert (ev["direction"], ev["leaf"]) == ("spine→leaf", link.a.node), (seed, ev)
        assert 0.08 < ev["packet_share"] < 0.25, (seed, ev)
        assert latency <= 20.0, f"seed {seed}: named after {latency:.1f} s"
        sessions = [s for r in topo.spines for s in frr.sessions(lab.name, topo, r)]
        assert sessions and all(s.up for s in sessions), sessions
        _wait(lambda: (named() or {}).get("age_s", 0) >= 5.0, 15, "still named 5 s on")
        assert not _open(live, "flapping_link") and not _open(live, "contention")
        assert len(_open(live, "silent_drop")) == 1, _open(live, "silent_drop")
    finally:
        subprocess.run([*nft, "delete", "table", "ip", "cmtest_gray"], check=False)
    _closed_with_the_route(live, named, a, f"seed {seed}")
