"""RoCE v1 from in-band against out-of-band delay alone: the job's messages queue, the
probes between the same hosts (RDMA traffic class) do not."""

from __future__ import annotations

import numpy as np

from analytics.clock.clock_state import ClockState
from analytics.detect.job_delay import JobDelays
from collector import records

S = 1_000_000_000
HOSTS = [records.host_id(n) for n in ("h1-1", "h2-1", "h3-1")]
NAMES = dict(zip(HOSTS, ("h1-1", "h2-1", "h3-1"), strict=True))
# Each host's clock: offset (ns) and drift (ns/ns) against mesh time, as the solver has them.
OFFSET = {HOSTS[0]: 0.0, HOSTS[1]: 3_000_000.0, HOSTS[2]: -7_000_000.0}
DRIFT = {HOSTS[0]: 0.0, HOSTS[1]: 20e-6, HOSTS[2]: -15e-6}  # 20 ppm: 20 µs a second apart
CLOCKS = ClockState(0, np.array(HOSTS, np.int64), np.array([OFFSET[h] for h in HOSTS]),
                    np.array([DRIFT[h] for h in HOSTS]), np.zeros(3), np.zeros(3),
                    np.zeros(3, np.int64))  # fmt: skip


def _stamp(host: int, t: float) -> int:
    return int(t + OFFSET[host] + DRIFT[host] * t)


def _messages(t0: float, seconds: float, queue_ns: float) -> np.ndarray:
    """Job "j": every host to every other, 20 messages/s, 50 µs + ``queue_ns`` each way,
    stamped with each host's own (offset, drifting) clock."""
    rows = []
    for k in range(int(seconds * 20)):
        t = (t0 + k / 20) * S
        for src in HOSTS:
            for dst in HOSTS:
                if src == dst:
                    continue
                flow = hash((src, dst)) & 0xFFFF
                arrive = t + 50_000 + queue_ns
                rows.append((0, src, b"j", flow, k, dst, 0, (0,) * 3, 512, _stamp(src, t)))
                rows.append((0, dst, b"j", flow, k, src, 1, (0,) * 3, 512, _stamp(dst, arrive)))
    return np.array(rows, records.INBAND)


def _probes(excess_ns: float) -> dict[tuple[int, int], float]:
    return {(s, d): excess_ns for s in HOSTS for d in HOSTS if s != d}


def test_a_job_held_back_while_the_probes_are_not_is_roce_v1_and_contention_is_not() -> None:
    rule = JobDelays(NAMES)
    rule.feed(_messages(0, 30, 0), CLOCKS)  # 30 s idle fabric: the floors (drift corrected)
    assert rule.observations(30 * S, _probes(2_000)) == []
    rule.feed(_messages(30, 6, 5_000_000), CLOCKS)  # bulk load: best effort waits 5 ms
    assert rule.observations(36 * S, _probes(3_000)) == []  # held back, not for 5 s yet
    rule.feed(_messages(36, 5, 5_000_000), CLOCKS)
    (obs,) = rule.observations(41 * S, _probes(3_000))  # the RDMA class waits 3 µs
    assert obs.kind == "roce_v1_job" and obs.job_id == "j"
    assert obs.evidence["hosts"] == ["h1-1", "h2-1", "h3-1"]
    assert (
        obs.evidence["held_back_flows"] == 6 and 4_900 <= obs.evidence["inband_excess_us"] <= 5_100
    )
    assert "RoCE v1" in obs.summary
    # Every path between the hosts slow as well: that is contention, not the job's class.
    assert rule.observations(41 * S, _probes(4_000_000)) == []
    # No out-of-band picture of these hosts: no verdict.
    fresh = JobDelays(NAMES)
    fresh.feed(_messages(0, 41, 0), CLOCKS)
    assert fresh.observations(41 * S, {}) == []


def test_messages_are_not_counted_before_both_clocks_are_solved() -> None:
    rule = JobDelays(NAMES)
    rule.feed(_messages(0, 10, 0), None)
    rule.feed(_messages(10, 6, 5_000_000), None)
    assert rule.flows == {} and rule.observations(16 * S, _probes(0)) == []


def test_a_job_that_stopped_is_no_longer_blamed_once_its_recent_messages_age_out() -> None:
    """No message arrives after the job stops, so the newest message's time stands still:
    the passes' own clock ages its flows out (a RoCE v1 page stayed open for minutes after
    the lab's jobs had ended)."""
    rule = JobDelays(NAMES)
    rule.feed(_messages(0, 30, 0), CLOCKS)
    assert rule.observations(30 * S, _probes(2_000)) == []
    rule.feed(_messages(30, 6, 5_000_000), CLOCKS)
    assert rule.observations(36 * S, _probes(3_000)) == []
    rule.feed(_messages(36, 5, 5_000_000), CLOCKS)
    (obs,) = rule.observations(41 * S, _probes(3_000))
    assert obs.kind == "roce_v1_job"
    assert len(rule.observations(43 * S, _probes(3_000))) == 1  # within its 5-s window still
    assert rule.observations(47 * S, _probes(3_000)) == []  # stopped 6 s ago: aged out


def test_waits_of_a_queue_that_has_just_drained_are_not_held_against_the_quiet_probes() -> None:
    """Two RoCE v2 jobs fill a link: their messages and the probes wait alike. The jobs
    stop and the queue drains: the flows' last 5 s still hold the waits while the probes
    are back at their floor at once — no RoCE v1 page (the lab paged jobs A and B 2 s
    after their contention closed)."""
    rule = JobDelays(NAMES)
    rule.feed(_messages(0, 30, 0), CLOCKS)
    assert rule.observations(30 * S, _probes(2_000)) == []
    rule.feed(_messages(30, 6, 500_000_000), CLOCKS)  # 500 ms of queue, the probes too
    for t in (34, 35, 36):
        assert rule.observations(t * S, _probes(float("inf"))) == []
    for t in (37, 38, 39, 40, 41, 42):  # stopped and drained: the probes are quiet again
        assert rule.observations(t * S, _probes(3_000)) == [], t


def test_flows_that_wait_before_the_probes_through_their_queue_are_judged_are_not_v1() -> None:
    """Two RoCE v2 jobs fill a link: their own messages wait at once, the probes through it
    are judged only once they arrive — for a few seconds the probes' picture is the quiet
    one from before (a fresh-clone CI run paged job A as RoCE v1 at that onset)."""
    rule = JobDelays(NAMES)
    rule.feed(_messages(0, 30, 0), CLOCKS)
    assert rule.observations(30 * S, _probes(2_000)) == []
    rule.feed(_messages(30, 4, 4_000_000), CLOCKS)
    for t in (31, 32, 33):  # the probes not caught up yet: still quiet
        assert rule.observations(t * S, _probes(18_000)) == [], t
    rule.feed(_messages(34, 8, 4_000_000), CLOCKS)
    for t in range(34, 42):  # they have: every route through the link waits
        assert rule.observations(t * S, _probes(float("inf"))) == [], t
