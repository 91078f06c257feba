"""The lab's paced load (``python -m lab.loadgen``): its rate held on a busy machine,
without the bursts a shallow buffer drops."""

from __future__ import annotations

from lab.loadgen import CATCH_UP_S, Pacer


def _send(pacer: Pacer, until: float, now: float, late: float = 0.0) -> tuple[int, int, float]:
    """Wake-ups as the pacer asks, each ``late`` seconds past it (a busy CPU), till
    ``until``: (packets sent, most sent at one wake-up, the time reached)."""
    sent = most = 0
    while now < until:
        n = pacer.due(now)
        sent, most = sent + n, max(most, n)
        now += pacer.wait(now) + late
    return sent, most, now


def test_a_load_woken_late_keeps_its_rate_two_packets_at_a_time() -> None:
    # 6,500 pps (75 Mbit/s of 1,442-byte frames): a wake-up 0.1 ms late is made up by
    # the next sleep; 0.2 ms late, more than a packet's interval, the old sender lost the
    # lateness at each wake-up and sent ~45 % of its rate
    for late, pairs in ((1e-4, 1), (2e-4, 2)):
        pacer = Pacer(6500, 0.0)
        sent, most, now = _send(pacer, 10.0, 0.0, late=late)
        assert 0.99 * 6500 * now <= sent <= 6500 * now + 2, late
        assert most == pairs, late


def test_a_stall_is_caught_up_in_pairs_and_a_long_one_forgotten() -> None:
    pacer = Pacer(6500, 0.0)
    sent, _, now = _send(pacer, 1.0, 0.0)
    # a 10-ms stall: owed 65 packets, sent two per wake-up, caught up within 20 ms
    assert pacer.due(now + 0.010) == 2
    more, most, now = _send(pacer, now + 0.030, now + 0.010 + pacer.wait(now + 0.010))
    assert most == 2
    assert abs((sent + 2 + more) - 6500 * now) <= 2
    # a 1-s stall: only the last CATCH_UP_S of it is owed
    before = sent + 2 + more
    after, _, end = _send(pacer, now + 1.1, now + 1.0)
    assert abs(after - 6500 * (end - now - 1.0 + CATCH_UP_S)) <= 3, (after, before)


def test_a_load_catching_up_never_outruns_its_ceiling() -> None:
    # `lab saturate`'s flow at 0.65 of a 50-Mbit/s link (2,818 pps of 1,442-byte frames)
    # crosses another such link: caught up at four times its rate, it drove that link to
    # 2.6 x for the ms it caught up, and held-out seed 1285 paged it as contended
    pps = 0.65 * 50e6 / (1442 * 8)
    # (none given: up to four times, which `lab congest` needs to hold its rate in CI)
    for ceiling, most_rate in ((None, 4 * pps), (0.9 * 50e6 / (1442 * 8), 0.9 * 50e6 / (1442 * 8))):
        pacer = Pacer(pps, 0.0, ceiling)
        sent, _, now = _send(pacer, 1.0, 0.0)
        stalled = now + 0.020  # a 20-ms stall: 56 packets owed
        early, _, t = _send(pacer, stalled + 0.005, stalled)
        assert early <= most_rate * (t - stalled) + 2, (ceiling, early, t - stalled)
        assert early > pps * (t - stalled), (ceiling, early)  # it does catch up
        more, _, end = _send(pacer, stalled + 0.5, t)
        assert abs(sent + early + more - pps * end) <= 2, ceiling  # all of it, in the end


def test_a_fast_load_sends_a_batch_per_fifth_of_a_millisecond() -> None:
    pacer = Pacer(20_000, 0.0)
    assert (pacer.batch, round(pacer.interval * 1e6)) == (4, 200)
    sent, most, now = _send(pacer, 1.0, 0.0)
    assert most == 4 and abs(sent - 20_000 * now) <= 4
