"""Contention at microsecond scale: streamed probes, per-route healthy noise, tomography by
queue size, on hand-made probe rows with real clock offsets between the hosts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from analytics.clock.clock_state import ClockState
from analytics.detect.contention import (
    HOST_DOWN,
    HOST_UP,
    MIN_INSTANTS,
    PathDelays,
    RouteWindow,
    queues,
)
from collector import records
from tests.unit.test_detect_rules import _fabric, _round

S = 1_000_000_000
MS = 1_000_000


class _Fleet:
    """Every host probes 4 ports to one host of every other rack (``every``: to each of
    its hosts) twice a second; each host's clock is off by its own offset, which the clock
    state knows. Host hN-M's access link is hN-M-leafN."""

    def __init__(self, racks: int = 3, seed: int = 1, every: bool = False) -> None:
        from analytics.detect.paths import FabricPaths

        self.links, self.host_rack, self.hosts = _fabric(racks)
        self.names = {records.host_id(f"h{r}-{n}"): f"h{r}-{n}" for r in range(1, racks + 1)
                      for n in (1, 2)}  # fmt: skip
        self.port = {h: f"{name}-{self.host_rack[h]}" for h, name in self.names.items()}
        self.paths = FabricPaths(self.links, self.host_rack)
        self.paths.feed(_round(self.links, self.hosts, 0, set(), every))
        self.delays = PathDelays(self.host_rack, self.paths.by_ends, self.paths.spine_of,
                                 dict(self.names), host_access=self.port)  # fmt: skip
        self.rng = np.random.default_rng(seed)
        ids = sorted(self.host_rack)
        self.offset = {h: float(self.rng.uniform(-5e6, 5e6)) for h in ids}
        self.clocks = ClockState(
            0, np.array(ids, np.int64), np.array([self.offset[h] for h in ids]),
            np.zeros(len(ids)), np.zeros(len(ids)), np.zeros(len(ids)),
            np.zeros(len(ids), np.int64),
        )  # fmt: skip
        self.seq = dict.fromkeys(ids, 0)
        self.t = 10 * S

    def second(
        self,
        queue_us: dict[tuple[str, str], float],
        loss: float = 0.0,
        empty: float = 0.0,
        halves: int = 2,
        step: int = S // 2,
        senders: set[int] | None = None,
    ) -> None:
        """One second of probes (``halves``: of half seconds; ``step``: of this long
        instead); ``queue_us``: (link, direction) -> queue it holds, lost with probability
        ``loss``; ``empty``: the share of probes that meet the queues empty (bursty
        senders: a shallow queue drains between bursts), neither waiting nor lost;
        ``senders``: only their probes meet the queues (the flows hashed onto them)."""
        tx, rx = [], []
        for _ in range(halves):
            for (s, d, sport), spine in sorted(self.paths.spine_of.items()):
                x, z = self.host_rack[s], self.host_rack[d]
                hops = [
                    (self.port[s], "host→leaf"),
                    (f"{x}-{spine}", "leaf→spine"),
                    (f"{z}-{spine}", "spine→leaf"),
                    (self.port[d], "leaf→host"),
                ]
                q = sum(queue_us.get(h, 0.0) for h in hops)
                if senders is not None and s not in senders:
                    q = 0.0
                if empty and self.rng.random() < empty:
                    q = 0.0
                t = self.t + int(self.rng.uniform(0, step))
                owd = 8_000 + self.rng.exponential(1_500) + q * 1e3 * self.rng.uniform(0.8, 1)
                self.seq[s] += 1
                tx.append((self.seq[s], s, d, sport, 9000, 0, 0, 0, 0, t + self.offset[s]))
                if q and self.rng.random() < loss:
                    continue
                rx.append((self.seq[s], s, d, sport, 9000, 0, 0, 0, 64,
                           int(t + owd + self.offset[d]), 0))  # fmt: skip
            self.t += step
        # receivers ship their receives first: nothing waits on a receiver that is behind
        self.delays.feed_probes(np.zeros(0, records.PROBE_TX), np.array(rx, records.PROBE_RX),
                                self.clocks)  # fmt: skip
        self.delays.feed_probes(np.array(tx, records.PROBE_TX), np.zeros(0, records.PROBE_RX),
                                self.clocks)  # fmt: skip

    def judge(
        self,
        queue_us: dict[tuple[str, str], float],
        seconds: int = 4,
        loss: float = 0.0,
        empty: float = 0.0,
    ):
        """``seconds`` of this queue, judged after each (a hop is said once it held 0.5 s)."""
        for _ in range(seconds):
            self.second(queue_us, loss, empty)
            got = self.delays.observations(0)
        return got

    def warm(self, seconds: int = 15) -> None:
        for _ in range(seconds):
            self.second({})
            assert self.delays.observations(0) == []


def test_a_sub_millisecond_queue_on_one_direction_is_named_with_link_and_direction() -> None:
    f = _Fleet()
    f.warm()
    (obs,) = f.judge({("leaf2-spine1", "spine→leaf"): 300.0}, 4, loss=0.3)  # losses known 2 s late
    assert obs.kind == "contention" and obs.link == "leaf2-spine1"
    ev = obs.evidence
    assert ev["direction"] == "spine→leaf"
    assert 200 <= ev["queue_us"] <= 320, ev
    assert ev["threshold_us"] < 100 and ev["slow_paths"] >= 2
    assert ev["lost_probes"] > 0 and "lost" in obs.summary
    for _ in range(2):
        f.second({})
    assert f.delays.observations(0) == []


def test_a_full_queue_that_empties_between_bursts_is_named_from_what_it_drops() -> None:
    """A shallow buffer filled by bursty senders (the lab's leaf2 uplink, 2026-11-27): it
    is full when a burst arrives and drops most of what meets it, and empty for moments
    between bursts, so a fifth of the probes pass unqueued — half of those received. The
    lower quartile of the probes received is then healthy; the losses and the tail say
    the queue is full. It was missed for 40 s in the lab (the old rule names it in none
    of these seeds' first 10 s but one)."""
    up = {("leaf2-spine1", "leaf→spine"): 400.0}
    for seed in range(3):
        f = _Fleet(seed=seed)
        f.warm()
        said = []
        for _ in range(10):
            f.second(up, loss=0.8, empty=0.2)
            said += f.delays.observations(0)
        assert said, seed
        assert {(o.link, o.evidence["direction"]) for o in said} == {
            ("leaf2-spine1", "leaf→spine")
        }, (seed, [o.summary for o in said])  # fmt: skip
        # "a standing queue of ≥ …": never more than the queue holds
        assert all(50 <= o.evidence["queue_us"] <= 420 for o in said), (  # 320-400 µs
            [o.evidence["queue_us"] for o in said]
        )  # fmt: skip
        assert all("lost" in o.summary for o in said)
        # drained: its losses leave the span (4 s) and it is said no more
        for _ in range(5):
            f.second({})
            f.delays.observations(0)
        for _ in range(3):
            f.second({})
            assert f.delays.observations(0) == [], seed


def test_a_bursty_queue_crossed_by_many_routes_is_named_as_fast_as_on_few() -> None:
    """Five racks, every host probing every other: 16 routes cross one spine→leaf direction.
    A bursty shallow queue there lets a route's few probes in a second all pass unqueued
    now and then; waiting for every route to look slow in the same pass took 5-9 s (the
    16-host demo: 7.9 s and 31 s). Four of five routes suffice — and nothing else is
    named, nor is anything named on a healthy fleet of that size."""
    down = {("leaf2-spine1", "spine→leaf"): 400.0}
    for seed in range(6):
        f = _Fleet(racks=5, seed=seed, every=True)
        f.warm()
        crossing = sum(1 for w in f.delays.windows() if down.keys() & set(w.hops))
        assert crossing >= 16, crossing
        rounds, said = 0, []
        while not said and rounds < 6:
            f.second(down, loss=0.8, empty=0.2)
            said = f.delays.observations(0)
            rounds += 1
        assert said, f"seed {seed}: not named in {rounds} s"
        assert {(o.link, o.evidence["direction"]) for o in said} == {
            ("leaf2-spine1", "spine→leaf")
        }, (seed, [o.summary for o in said])  # fmt: skip
    f = _Fleet(racks=5, seed=7, every=True)
    for _ in range(40):
        f.second({})
        assert f.delays.observations(0) == []


def test_probes_lost_without_waiting_are_no_queue() -> None:
    """Half the probes crossing one uplink lost, and those that get through do not wait
    (a silent drop, not a queue): no contention, however many are lost."""
    f = _Fleet(seed=4)
    f.warm()
    assert f.judge({("leaf2-spine1", "leaf→spine"): 3.0}, 8, loss=0.5) == []


def test_healthy_jitter_raises_nothing() -> None:
    f = _Fleet(seed=3)
    for _ in range(60):
        f.second({})
        assert f.delays.observations(0) == []


def test_pairs_are_slow_only_while_a_route_of_theirs_queues_beyond_its_own_noise() -> None:
    """What the TUI's amber and ``clockmesh live``'s ``slow`` read: a healthy fleet has no
    slow pair, whatever its delays (8 µs and more here); a 300-µs queue into rack 2 makes
    the pairs entering it slow, by about that queue, and no other pair — once it held for
    the second a hop must hold to be named (a queue seen in one pass only is a burst: no
    amber for it, as no anomaly); drained, none."""
    f = _Fleet(seed=3)
    for _ in range(20):
        f.second({})
        f.delays.observations(0)
        assert f.delays.pair_queues() == {}
    queue = {("leaf2-spine1", "spine→leaf"): 300.0}
    f.judge(queue, 1)
    assert f.delays.pair_queues() == {}  # one pass: not yet held
    f.second({})
    f.delays.observations(0)
    assert f.delays.pair_queues() == {}  # the burst is over: never shown
    f.judge(queue, 1)
    assert f.delays.pair_queues() == {}  # held afresh from here
    f.judge(queue, 2)
    slow = f.delays.pair_queues()
    assert slow and {f.host_rack[d] for _, d in slow} == {"leaf2"}, slow
    assert all(200e3 <= q <= 320e3 for q in slow.values()), slow
    for _ in range(2):
        f.second({})
        f.delays.observations(0)
    assert f.delays.pair_queues() == {}


def test_the_pairs_through_a_link_are_slow_in_the_pass_it_is_said() -> None:
    """Amber and the anomaly agree: judged every half second, a 300-µs queue into rack 2
    is said once it held half a second, and in that very pass the pairs entering rack 2
    are slow with it (a pair on its own, no hop said, turns amber only once a route of it
    held a second: the test above)."""
    f = _Fleet(seed=3)
    for _ in range(20):
        f.second({})
        f.delays.observations(0)
    queue = {("leaf2-spine1", "spine→leaf"): 300.0}
    said, halves = [], 0
    while not said and halves < 8:
        f.second(queue, halves=1)
        said = f.delays.observations(0)
        halves += 1
    assert [(o.link, o.evidence["direction"]) for o in said] == [
        ("leaf2-spine1", "spine→leaf")
    ], (halves, [o.summary for o in said])  # fmt: skip
    slow = f.delays.pair_queues()
    assert slow and {f.host_rack[d] for _, d in slow} == {"leaf2"}, slow


def test_a_queue_at_one_hosts_port_is_named_there_not_on_the_fabric_links_before_it() -> None:
    """Incast: many senders into one host fill the leaf's port towards it. Every route
    into that host waits, through both spines; the routes into its rack neighbour do not,
    so the spines' downlinks into the rack are cleared and the host's port is named."""
    for seed in range(3):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        (obs,) = f.judge({("h1-1-leaf1", "leaf→host"): 300.0}, 4, loss=0.2)
        assert (obs.kind, obs.link, obs.evidence["direction"]) == (
            "contention", "h1-1-leaf1", "leaf→host"
        ), (seed, obs.summary)  # fmt: skip
        assert obs.evidence["host"] == "h1-1"  # the place: its peers are shown affected
        assert 200 <= obs.evidence["queue_us"] <= 320, obs.evidence
        assert obs.summary.startswith("h1-1-leaf1 (leaf→host) is contended"), obs.summary


def test_a_hosts_port_is_said_once_it_held_a_second_a_fabric_link_at_half_a_second() -> None:
    """Judged every half second: a 300-µs queue on a fabric link is said in the pass it
    has held half a second (the third), a full queue at one host's port only once it held
    a whole second (the fourth) — a moment of incast into one host under healthy jobs on
    shallow buffers fills its port for about half a second (a fresh-clone CI, 2026-12-05)."""
    port = ({("h1-1-leaf1", "leaf→host"): 300.0}, 0.2)
    link = ({("leaf2-spine1", "spine→leaf"): 300.0}, 0.0)
    for seed in range(3):
        first = {}
        for name, (queue, loss) in (("port", port), ("link", link)):
            f = _Fleet(seed=seed, every=True)
            f.warm()
            for half in range(1, 9):
                f.second(queue, loss=loss, halves=1)
                said = f.delays.observations(0)
                if said:
                    first[name] = (half, [o.link for o in said])
                    break
        assert first == {"port": (4, ["h1-1-leaf1"]), "link": (3, ["leaf2-spine1"])}, seed


def test_a_queue_that_held_up_some_of_its_routes_half_a_second_is_said_once_most_wait() -> None:
    """Judged every quarter second: a 300-µs queue on a fabric link first holds up only the
    routes from two hosts (the flows hashed onto it, half the routes across it: too few to
    name it), then every route. Its first slow routes started its half second: it is said
    in the second pass that names it, not half a second later (seed 1268's contentions
    0.2-0.4 s sooner, 2026-12-06). A queue that comes at once on every route still holds
    half a second from the first pass that names it."""
    hop = ("leaf2-spine1", "spine→leaf")
    some = {records.host_id("h1-1"), records.host_id("h3-1")}

    def first_said(f: _Fleet) -> int:  # every route waits: the pass (from 0) that says it
        for k in range(16):
            f.second({hop: 300.0}, halves=1, step=S // 4)
            said = f.delays.observations(0)
            if said:
                assert [o.link for o in said] == ["leaf2-spine1"], [o.summary for o in said]
                return k
        raise AssertionError("not said")

    for seed in range(4):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        for _ in range(6):  # some routes wait: not named
            f.second({hop: 300.0}, halves=1, step=S // 4, senders=some)
            assert f.delays.observations(0) == [], seed
        # every route from now: windows half queued name it in the first pass, said the next
        assert first_said(f) == 1, seed
        f = _Fleet(seed=seed, every=True)
        f.warm()
        assert first_said(f) >= 2, seed  # named in its first or second pass, said 0.5 s later


def test_a_full_port_queue_that_drains_between_bursts_is_named_from_its_tail_and_loss() -> None:
    """Seen in the demo lab (2026-12-05): the leaf's port towards h2-3, 6 kB of buffer fed
    three times faster than it drains. Half the probes to h2-3 met it empty between bursts
    (their lower quartile waited 5 µs), the rest waited up to 0.8 ms, and a quarter were
    dropped; no queue stood in h2-3's round trips at the lower quartile and nothing was
    named for 90 s while a false silent drop paged instead. The tail's round trip and the
    losses into the host name its port, whatever the solver made of h2-3's clock."""
    for seed, absorbed in ((0, 0.0), (1, 200_000.0), (2, -150_000.0)):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        k = int(np.flatnonzero(f.clocks.hosts == records.host_id("h1-1"))[0])
        f.clocks.offset_ns[k] += absorbed
        incast = {("h1-1-leaf1", "leaf→host"): 800.0}
        said = []
        for _ in range(10):  # its losses over 4 s decide (a second's tail is a few probes)
            f.second(incast, loss=0.4, empty=0.5)
            said += f.delays.observations(0)
        assert said, (seed, f.delays.unsure_total)
        assert {(o.link, o.evidence["direction"], o.evidence["host"]) for o in said} == {
            ("h1-1-leaf1", "leaf→host", "h1-1")
        }, (seed, [o.summary for o in said])  # fmt: skip
        obs = said[-1]
        assert obs.evidence["queue_at"] == "tail", obs.evidence
        assert "a full queue that drops, its tail ≥" in obs.summary, obs.summary
        assert 500 <= obs.evidence["queue_us"] <= 820, (seed, obs.evidence)
        assert obs.evidence["loss_in"] > 0.1 and obs.evidence["loss_out"] == 0, obs.evidence


def test_a_full_port_said_through_a_lull_of_its_queue_is_said_again_as_it_returns() -> None:
    """A shallow queue that fills and drains has its typical route's tail under the
    threshold now and then: the detect lab's 480-µs buffer, 7 times in 40 s. Each time the
    port was dropped and began its hold again, and once (a fresh-clone CI, 2026-12-07) a
    rack-mate checked first kept it unsaid for 10 s: the anomaly closed and opened anew.
    Here a second with no queue: the port is not reported while it lasts, and said again
    in the first pass the queue is back (2-4 passes later before); nothing else is."""
    for seed in range(4):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        incast = {("h1-1-leaf1", "leaf→host"): 800.0}
        said = []
        for i in range(20):
            f.second({} if i == 12 else incast, loss=0.4, empty=0.5)
            said.append({o.link for o in f.delays.observations(0)})
        assert said[11] == {"h1-1-leaf1"}, (seed, said)
        assert said[12] == set(), (seed, said)  # the lull: not reported
        assert all(s == {"h1-1-leaf1"} for s in said[13:]), (seed, said)


def test_a_busy_port_that_loses_nothing_and_stands_no_queue_is_not_named() -> None:
    """The same bursts into one host through a buffer deep enough to take them: the tail
    of its probes waits, half meet the port empty, nothing is lost — a busy port, not a
    full one (the lab's healthy jobs on shallow buffers): nothing is said."""
    for seed in range(3):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        for _ in range(6):
            f.second({("h1-1-leaf1", "leaf→host"): 800.0}, empty=0.5)
            assert f.delays.observations(0) == [], seed


def test_a_host_whose_clock_the_solver_is_unsure_of_is_not_judged() -> None:
    """A full queue in front of one host's port delays every probe to it: to any clock
    sync that looks like the host's clock running ahead, and the solver moves the host's
    offset there with an uncertainty to match (seen in the lab: +27 ms, ±24 ms). Judged
    with that clock, the probes *from* the host look late: no page may say so."""
    f = _Fleet(every=True)
    f.warm()
    h11 = records.host_id("h1-1")
    k = int(np.flatnonzero(f.clocks.hosts == h11)[0])
    f.clocks.offset_ns[k] -= 300_000.0  # the solver's belief, 300 µs off ...
    f.clocks.offset_sigma_ns[k] = 250_000.0  # ... and how unsure it says it is
    unsure = f.delays.unsure_total
    assert f.judge({}, 6) == []
    assert f.delays.unsure_total > unsure
    # The same wrong clock claimed sure: h1-1's round trips show no queue (its probes in
    # look 300 µs early by what those out look late), so still nothing is said.
    f.clocks.offset_sigma_ns[k] = 0.0
    unsure = f.delays.unsure_total
    assert f.judge({}, 6) == []
    assert f.delays.unsure_total > unsure


def test_a_hosts_port_stays_named_while_its_round_trips_hold_the_queue() -> None:
    """Seen in the lab: the port in front of h1-1 was named, then the clock solver took the
    queue for h1-1's clock running ahead, and a minute later the anomaly closed while the
    queue stayed. Its round trips (in plus out) do not depend on h1-1's clock."""
    for seed in range(3):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        incast = {("h1-1-leaf1", "leaf→host"): 300.0}
        (named,) = f.judge(incast, 4, loss=0.2)
        h11 = records.host_id("h1-1")
        k = int(np.flatnonzero(f.clocks.hosts == h11)[0])
        f.clocks.offset_ns[k] += 270_000.0  # the solver absorbs 270 of the 300 µs ...
        f.clocks.offset_sigma_ns[k] = 240_000.0  # ... and says how unsure it is
        (obs,) = f.judge(incast, 20, loss=0.2)
        assert (obs.key, obs.evidence["host"]) == (named.key, "h1-1"), obs.summary
        assert obs.summary.startswith("h1-1-leaf1 (leaf→host) is contended"), obs.summary
        assert "round trips" in obs.summary and "lost" in obs.summary, obs.summary
        assert 200 <= obs.evidence["queue_us"] <= 320, obs.evidence  # not the 30 µs left
        assert 0.2 <= obs.evidence["median_excess_ms"] <= 0.32, obs.evidence
        # The queue drains and the clock is still wrong: nothing is said, in either
        # direction (the probes out of h1-1 look 270 µs late).
        f.second({})
        f.delays.observations(0)  # the second the queue drained
        for _ in range(6):
            f.second({})
            assert f.delays.observations(0) == [], seed


def test_an_incast_begun_in_the_detectors_first_seconds_is_named() -> None:
    """Seen in the lab (2026-11-27, the incast test run alone on a fresh lab): the queue at
    h2-1's port began 2 s after the first probes. Its routes in had learnt 1 to 4 healthy
    windows — not the 5 that fit a baseline, and not none (which the fleet's fitted
    routes judge) — and were never judged: nothing was said for 45 s. A route not fitted
    yet is judged against its peers once enough of them are fitted."""
    for seed in range(3):
        f = _Fleet(seed=seed, every=True)
        f.warm(2)
        said = []
        for _ in range(12):
            f.second({("h1-1-leaf1", "leaf→host"): 300.0}, loss=0.2)
            said += f.delays.observations(0)
        assert said, seed
        assert {(o.link, o.evidence["direction"]) for o in said} == {
            ("h1-1-leaf1", "leaf→host")
        }, (seed, [o.summary for o in said])  # fmt: skip


def test_a_hosts_port_that_loses_nothing_is_named_in_the_way_its_probes_wait() -> None:
    """A lossless queue at one host's port (ECN holds it, or a byte-limited queue full of
    big datagrams that still takes the small probes: the lab's 20 Mbit/s incast lost under
    1 % of them). The clock solver takes the queue for the host's clock running ahead and
    moves it; put back on the clock the host had while its routes were healthy, the probes
    into it wait and those out of it do not: named leaf→host, saying so."""
    for absorbed in (0.0, 150_000.0, 300_000.0):
        f = _Fleet(seed=2, every=True)
        f.warm()
        k = int(np.flatnonzero(f.clocks.hosts == records.host_id("h1-1"))[0])
        incast = {("h1-1-leaf1", "leaf→host"): 300.0}
        f.judge(incast, 1)  # the queue's first second, on the clock it had
        f.clocks.offset_ns[k] += absorbed  # then the solver moves the host's clock
        (obs,) = f.judge(incast, 8)
        assert (obs.key, obs.evidence["host"], obs.evidence["direction"]) == (
            "h1-1-leaf1 leaf→host", "h1-1", "leaf→host"
        ), (absorbed, obs.summary)  # fmt: skip
        assert obs.evidence["direction_from"] == "one-way delays", obs.evidence
        assert obs.summary.startswith("h1-1-leaf1 (leaf→host) is contended"), obs.summary
        assert f"had moved it +{absorbed / 1e3:.0f} µs since" in obs.summary, obs.summary
        assert 240 <= obs.evidence["queue_us"] <= 320, (absorbed, obs.evidence)


def test_a_lossless_port_queue_the_detector_never_saw_healthy_is_named_without_a_way() -> None:
    """The same queue standing since before the detector started, the solver already
    holding the host's clock 150 µs ahead: no loss and no clock from healthy times to tell
    which way it stands, so the port is named with its host and no direction — not the
    wrong one (on the clock as it is, the probes out of the host look 150 µs late)."""
    for seed in range(3):
        f = _Fleet(seed=seed, every=True)
        k = int(np.flatnonzero(f.clocks.hosts == records.host_id("h1-1"))[0])
        f.clocks.offset_ns[k] += 150_000.0
        said = [o for _ in range(20) for o in f.judge({("h1-1-leaf1", "leaf→host"): 300.0}, 1)]
        assert said, seed
        assert {(o.key, o.evidence["direction"]) for o in said} == {
            ("h1-1-leaf1 port", "unknown")
        }, (seed, [o.summary for o in said])  # fmt: skip
        assert said[-1].summary.startswith("h1-1-leaf1 (h1-1's port, either way) is contended")
        assert 240 <= said[-1].evidence["queue_us"] <= 320, said[-1].evidence


def test_a_hosts_round_trips_do_not_count_a_full_uplink_through_one_spine() -> None:
    """Half of a host's routes out cross a full uplink (300 µs), the others do not: that
    is not a queue at the host's port, whatever its clock (seen under load in the lab: a
    median of those routes made the port look full and hid the uplink)."""
    from analytics.detect.contention import RouteWindow, _round_trip

    def route(src: int, dst: int, spine: str, excess_us: float, clock_us: float) -> RouteWindow:
        shift = clock_us if src == 1 else -clock_us  # host 1's clock wrong by clock_us
        ex = np.full(2, (excess_us + shift) * 1e3)
        return RouteWindow(src, dst, spine, (), 0, 10, 0, ex, ex, np.full(2, 20e3), 1)

    for clock_us in (0.0, 150.0, -150.0):
        away = [route(1, d, y, 300.0 if y == "spine2" else 0.0, clock_us)
                for d in (2, 3) for y in ("spine1", "spine2")]  # fmt: skip
        into = [route(d, 1, y, 0.0, clock_us) for d in (2, 3) for y in ("spine1", "spine2")]
        q, thr, *_ = _round_trip(1, away + into)
        assert q < thr, (clock_us, q, thr)
        port = [route(1, d, y, 300.0, clock_us) for d in (2, 3) for y in ("spine1", "spine2")]
        q, thr, *_ = _round_trip(1, port + into)  # every route out: the port's queue
        assert 290e3 <= q <= 310e3 and q > thr, (clock_us, q)


def test_a_queue_on_a_fabric_link_is_not_blamed_on_the_hosts_behind_it() -> None:
    for seed in range(3):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        (obs,) = f.judge({("leaf2-spine1", "spine→leaf"): 300.0}, 4, loss=0.2)
        assert (obs.link, obs.evidence["direction"]) == ("leaf2-spine1", "spine→leaf")
        assert "host" not in obs.evidence


def test_two_congested_uplinks_are_named_not_the_third_racks_downlink() -> None:
    """Two jobs between racks 1 and 2 fill both racks' uplinks to spine2 (and keep the
    downlinks into them busy): every route into rack 3 through spine2 is slow too, but
    the routes out of rack 3 are not, so its link is never blamed."""
    for seed in range(5):
        f = _Fleet(seed=seed)
        f.warm()
        obs = f.judge(
            {
                ("leaf1-spine2", "leaf→spine"): 500.0,
                ("leaf2-spine2", "leaf→spine"): 500.0,
                ("leaf1-spine2", "spine→leaf"): 40.0,
                ("leaf2-spine2", "spine→leaf"): 40.0,
            }
        )
        got = {(o.link, o.evidence["direction"]) for o in obs}
        assert ("leaf1-spine2", "leaf→spine") in got and ("leaf2-spine2", "leaf→spine") in got
        assert not any(link.startswith("leaf3") for link, _ in got), (seed, got)


def test_with_two_racks_both_ends_are_named_together() -> None:
    f = _Fleet(racks=2)
    f.warm()
    (obs,) = f.judge({("leaf1-spine1", "leaf→spine"): 400.0})
    assert obs.evidence["confidence"] == 0.5
    assert obs.evidence["candidates"] == ["leaf1-spine1", "leaf2-spine1"]
    assert sorted(obs.evidence["candidate_hops"]) == [
        "leaf1-spine1 leaf→spine", "leaf2-spine1 spine→leaf"
    ]  # fmt: skip


def test_queues_are_the_least_squares_answer() -> None:
    from analytics.detect.contention import RouteWindow

    def route(up: str, down: str, excess: float) -> RouteWindow:
        return RouteWindow(1, 2, "s", ((up, "u"), (down, "d")), 0, 8, 0, np.zeros(2),
                           np.array([excess, excess]), np.array([1.0, 1.0]), 1)  # fmt: skip

    hops, _a, q = queues([route("a", "x", 500e3), route("a", "y", 500e3), route("b", "x", 0.0)])
    got = dict(zip(hops, q.round(), strict=True))
    assert got[("a", "u")] == 500e3 and got[("x", "d")] == 0 and got[("y", "d")] == 0


def test_congestion_counters_behind_the_link_are_cited() -> None:
    f = _Fleet()
    h = f.hosts["leaf2"][0]
    rows = [(i * S, h, b"mlx5_0", 1, 2, (0,) * 5, b"np_ecn_marked_roce_packets", 100 * i, 100)
            for i in range(1, 6)]  # fmt: skip
    f.delays.feed_counters(np.array(rows, records.COUNTER))
    f.warm()
    (obs,) = f.judge({("leaf2-spine1", "spine→leaf"): 300.0})
    assert obs.evidence["counters_behind"]["per_s"] == {"np_ecn_marked_roce_packets": 100.0}
    assert "ECN-marked 100/s" in obs.summary


def test_the_collector_reads_the_nic_congestion_counters_the_detector_cites(tmp_path) -> None:
    """The recorded mlx5 tree (tests/data/sysfs/mlx5_roce) through the collector's reader,
    twice a second apart with the counters moved, into the detector's rates."""
    import shutil
    from pathlib import Path

    from analytics.detect.contention import CONGESTION_COUNTERS
    from collector.sysfs_counters import SysfsCounters

    root = tmp_path / "root"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data/sysfs/mlx5_roce", root)
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    host = records.host_id("h2-1")
    reader = SysfsCounters(root, ["ens1f0np0"], [])
    first = reader.sample(1 * S, host)
    where = {r["name"].decode(): int(r["source"]) for r in first}
    assert {n: where.get(n) for n in CONGESTION_COUNTERS} == {
        "np_ecn_marked_roce_packets": 2,
        "np_cnp_sent": 2,
        "rp_cnp_handled": 2,
        "port_xmit_wait": 1,
    }
    for sub, name, step in (("hw_counters", "np_ecn_marked_roce_packets", 500),
                            ("hw_counters", "np_cnp_sent", 50),
                            ("counters", "port_xmit_wait", 1000)):  # fmt: skip
        f = port / sub / name
        f.write_text(f"{int(f.read_text()) + step}\n")
    second = reader.sample(3 * S, host)
    rows = np.concatenate([first, second])
    delays = PathDelays({host: "leaf2"}, {("leaf2", "spine1"): "leaf2-spine1"}, {})
    delays.feed_counters(rows[np.isin(rows["name"], [n.encode() for n in CONGESTION_COUNTERS])])
    assert delays.counter_rates([host]) == {
        "np_cnp_sent": 25.0,
        "np_ecn_marked_roce_packets": 250.0,
        "port_xmit_wait": 500.0,
        "rp_cnp_handled": 0.0,
    }


def test_the_shipped_model_abstaining_on_a_sub_ms_queue_leaves_the_rules_contention() -> None:
    """The shipped model learnt contention from millisecond queues and calls a 0.3-ms
    one "unknown"; the rule's calibrated verdict stands, the model's opinion is kept."""
    from analytics.detect.anomalies import Observation
    from analytics.detect.detect_runner import DetectRunner

    f = _Fleet()
    f.warm()
    (obs,) = f.judge({("leaf2-spine1", "spine→leaf"): 300.0})
    loud = Observation(kind="contention", key="leaf1-spine1 leaf→spine", score=0.7, summary="",
                       link="leaf1-spine1", evidence={**obs.evidence, "median_excess_ms": 30.0,
                                                      "max_excess_ms": 45.0})  # fmt: skip
    runner = DetectRunner(None)
    assert runner.model is not None, runner.model_note
    runner.judge([obs, loud])
    assert obs.kind == "contention" and obs.evidence["rule"] == "contention"
    assert obs.evidence["model"]["class"] == "unknown"  # what the shipped model says
    assert loud.kind == "contention" and loud.evidence["model"]["class"] == "contention"


def test_the_probes_wait_as_their_worst_route_does_for_the_in_band_roce_v1_signal() -> None:
    """Two routes between h1 and h2: one quiet, one queueing (or losing a fifth of its
    probes: a full queue drops). A job flow on the queueing route waits as its probes do:
    pair_excess says the probes wait as much as their worst route, so the in-band RoCE v1
    rule does not blame the job for contention (it blamed RoCE v2 jobs A and B)."""
    from analytics.detect.contention import RouteWindow

    delays = PathDelays({1: "leaf1", 2: "leaf2"}, {}, {})
    hops = (("leaf1-spine1", "up"), ("leaf2-spine1", "down"))

    def window(spine: str, received: int, lost: int, tail_us: float) -> RouteWindow:
        return RouteWindow(1, 2, spine, hops, 0, received, lost, np.array([5e3, 5e3 + tail_us * 1e3]),
                           np.array([0.0, tail_us * 1e3]), np.array([20e3, 20e3]), 4)  # fmt: skip

    delays._last_windows = [window("spine1", 40, 0, 0.0), window("spine2", 40, 0, 500.0)]
    assert delays.pair_excess()[(1, 2)] == 500e3  # the queueing route, not the middle
    delays._last_windows = [window("spine1", 40, 0, 0.0), window("spine2", 30, 10, 0.0)]
    assert delays.pair_excess()[(1, 2)] == float("inf")  # a fifth lost: a full queue
    delays._last_windows = [window("spine1", 40, 0, 0.0), window("spine2", 39, 1, 3.0)]
    assert delays.pair_excess()[(1, 2)] == 3e3  # one probe lost is not a full queue


def test_pairs_without_streamed_routes_wait_as_their_worst_paths_clock_window_median() -> None:
    """Between pairs no streamed route judges, pair_excess falls back to the clock
    solver's per-path medians: the worst path's median in the newest window over the least
    median that path ever had; a path missing from the newest window, or whose median
    the solver could not give (NaN), says nothing."""
    delays = PathDelays({}, {}, {})
    src, dst = np.array([1, 1, 1, 3, 5]), np.array([2, 2, 2, 4, 6])
    sport = np.array([40000, 40001, 40002, 40000, 40000], np.int32)
    delays.feed(src, dst, sport, np.array([5e3, 6e3, 7e3, 9e3, 4e3]))
    delays.feed(src[:4], dst[:4], sport[:4], np.array([5.5e3, 9e3, np.nan, 8e3]))
    # 1->2: its 40001 path rose 3 µs over its floor (40000 by 0.5, 40002 unknown now);
    # 3->4 fell: nothing waits; 5->6 is not in the newest window
    assert list(delays.pair_excess().items()) == [((1, 2), 3e3), ((3, 4), 0.0)]
    delays.feed(np.array([1, 1]), np.array([2, 2]), np.array([40000, 40000], np.int32),
                np.array([4.0e3, 4.5e3]))  # fmt: skip
    # the same path twice in one window: the last median, over the least of all (4 µs)
    assert delays.pair_excess() == {(1, 2): 500.0}


def test_a_route_that_loses_every_probe_is_the_pairs_worst_for_the_in_band_signal() -> None:
    """A queue so full that no probe through it arrives (two jobs at 2 Mbit/s: 600 ms of
    queue, the rest dropped) leaves no window to judge on that route; pair_excess must
    still say the probes between those hosts wait without bound, not report the quiet
    other spine (it reported 3 µs, and two RoCE v2 jobs were paged as RoCE v1)."""
    f = _Fleet()
    f.warm()
    f.judge({("leaf2-spine1", "spine→leaf"): 300.0}, 5, loss=1.0)
    crossing = {(s, d) for (s, d, _p), y in f.paths.spine_of.items()
                if y == "spine1" and f.host_rack[d] == "leaf2" and f.host_rack[s] != "leaf2"}  # fmt: skip
    assert crossing
    excess = f.delays.pair_excess()
    for pair in crossing:
        assert excess[pair] == float("inf"), (pair, excess.get(pair))
    others = [e for (s, d), e in excess.items() if f.host_rack[d] != "leaf2"]
    assert others and all(e < 1e5 for e in others), others  # the other pairs stay quiet


def test_a_detector_behind_its_queue_judges_as_if_it_had_kept_up() -> None:
    """The detector fell behind: four seconds of commits are matched in one pass
    (``feed_probe_batches``, as the runner does with its queue) and every route's window
    is judged exactly as when each commit was fed on arrival: the loaded link stands out."""
    kept_up, behind = _Fleet(seed=5), _Fleet(seed=5)
    kept_up.warm()
    behind.warm()
    queued: list[tuple[np.ndarray, np.ndarray]] = []
    behind.delays.feed_probes = lambda tx, rx, clocks: queued.append((tx, rx))  # type: ignore[method-assign]
    fault = {("leaf1-spine2", "leaf→spine"): 250.0}
    for _ in range(4):
        kept_up.second(fault)
        behind.second(fault)
    del behind.delays.feed_probes
    behind.delays.feed_probe_batches(queued, behind.clocks)
    want, got = kept_up.delays.windows(), behind.delays.windows()
    assert [(w.src, w.dst, w.spine, w.received, w.lost, w.judged) for w in got] == [
        (w.src, w.dst, w.spine, w.received, w.lost, w.judged) for w in want
    ]
    assert all(np.array_equal(g.excess, w.excess) for g, w in zip(got, want, strict=True))
    slow = {(w.src, w.spine) for w in got if w.judged and w.excess[0] > 100_000}
    assert slow and {kept_up.host_rack[s] for s, _ in slow} == {"leaf1"}
    assert {spine for _, spine in slow} == {"spine2"}


def test_the_detectors_backlog_is_on_metrics_and_a_pass_empties_it() -> None:
    """What waits for the detector is measured (``clockmesh_detect_queue_bytes``): an
    operator sees a detector falling behind before the box runs out of memory."""
    from prometheus_client import CollectorRegistry, generate_latest

    from analytics.detect.detect_runner import DetectRunner

    runner = DetectRunner(None)
    registry = CollectorRegistry()
    registry.register(runner.collector())
    tx = np.zeros(5_000, records.PROBE_TX)
    rx = np.zeros(5_000, records.PROBE_RX)
    runner.feed({}, {"probe_tx": tx, "probe_rx": rx})

    def gauge(name: str) -> float:
        for line in generate_latest(registry).decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} not exported")

    assert gauge("clockmesh_detect_queue_bytes") == tx.nbytes + rx.nbytes
    runner.step()
    assert gauge("clockmesh_detect_queue_bytes") == 0
    assert gauge("clockmesh_detect_pass_input_bytes") == tx.nbytes + rx.nbytes


def _one_host_racks() -> tuple[PathDelays, Callable[..., RouteWindow]]:
    """Three racks of one host each (h1-1, h2-1, h3-1; the lab's detector fleet), their
    PathDelays with no paths fed, and a maker of a route window across spine ``y`` whose
    both quantiles wait ``excess_us`` (µs; ``span_us``: its loss span's tail excess)."""
    racks = {1: "leaf1", 2: "leaf2", 3: "leaf3"}
    names = {h: f"h{h}-1" for h in racks}
    d = PathDelays(racks, {}, {}, names, host_access={h: f"h{h}-1-leaf{h}" for h in racks})

    def route(
        s: int, t: int, y: str, excess_us: float, lost: int = 0, span_us: float = math.nan
    ) -> RouteWindow:
        hops = ((f"h{s}-1-leaf{s}", HOST_UP), (f"leaf{s}-{y}", "leaf→spine"),
                (f"leaf{t}-{y}", "spine→leaf"), (f"h{t}-1-leaf{t}", HOST_DOWN))  # fmt: skip
        ex = np.full(2, excess_us * 1e3)
        return RouteWindow(s, t, y, hops, d.newest_ns, 20, lost, ex + 8e3, ex, np.full(2, 20e3),
                           4, span_excess=span_us * 1e3)  # fmt: skip

    return d, route


def test_routes_out_of_a_host_late_by_what_its_routes_in_are_early_name_no_link() -> None:
    """Seen in the lab (three racks of one host, 2026-11-27): an incast at h3-1's port had
    just drained, the live probes were still corrected with the solver's offset that had
    absorbed it, and h3-1's routes out through spine2 were 32 ms late while its routes in
    were 29 ms early: leaf3-spine2 (leaf→spine) was paged, "a standing queue of ≥32490
    µs". A queue only delays; routes in that early say h3-1's clock is off by as much."""
    d, route = _one_host_racks()
    racks = (1, 2, 3)

    def windows(late_us: float, early_us: float) -> list[RouteWindow]:
        out = []
        for s in racks:
            for t in racks:
                for y in ("spine1", "spine2"):
                    if s == t:
                        continue
                    ex = 0.0
                    if s == 3 and y == "spine2":
                        ex = late_us
                    elif t == 3:
                        ex = -early_us
                    out.append(route(s, t, y, ex))
        return out

    for late_us, early_us, said in ((32_490.0, 29_000.0, False), (300.0, 0.0, True)):
        d._since.clear()
        got = []
        for step in range(MIN_INSTANTS):  # one sender's tick a pass: one instant each
            d.newest_ns = (step + 1) * S
            d.windows = lambda late_us=late_us, early_us=early_us: windows(late_us, early_us)
            got = d.observations(0)
        links = [(o.link, o.evidence["direction"]) for o in got]
        # the same routes late with the routes in on time: leaf3's uplink queue, named
        assert links == ([("leaf3-spine2", "leaf→spine")] if said else []), (late_us, links)


def test_one_senders_ticks_meeting_a_busy_link_three_times_in_a_row_are_not_a_queue() -> None:
    """A collector sends all the pairs of a tick at once, so one host's routes across a
    link are one sample of its queue per tick. Healthy jobs (9 % of a 50-Mbit/s link,
    1,400-B frames) met by three of h2-1's ticks in a row paged leaf2-spine2 (leaf→spine)
    in the detect lab, about one run in three (2026-12-07): three ticks span the half
    second a queue must hold. Three are not a queue; a queue every tick meets is named at
    its fourth."""
    from dataclasses import replace

    d, route = _one_host_racks()
    racks = (1, 2, 3)
    tick_ns = 300_000_000
    phase = {1: 50_000_000, 2: 150_000_000, 3: 250_000_000}  # each sender's own ticks

    def windows(now: int, slow_ticks: range) -> list[RouteWindow]:
        out = []
        for s in racks:
            k = (now - phase[s]) // tick_ns  # the sender's newest tick
            for t in racks:
                for y in ("spine1", "spine2"):
                    if s == t:
                        continue
                    ex = 240.0 if s == 2 and y == "spine2" and k in slow_ticks else 0.0
                    out.append(replace(route(s, t, y, ex), newest_ns=k * tick_ns + phase[s]))
        return out

    def run(slow_ticks: range, passes: range) -> list[tuple[int, str]]:
        named = []
        for p in passes:  # a detector pass every 0.1 s of probe time
            d.newest_ns = now = p * 100_000_000
            d.windows = lambda now=now: windows(now, slow_ticks)
            named += [(now, f"{o.link} {o.evidence['direction']}") for o in d.observations(0)]
        return named

    assert run(range(10, 13), range(1, 60)) == []  # ticks 10-12: 3.0-3.6 s (old rule: named)
    named = run(range(40, 50), range(100, 160))  # a queue from tick 40 (12.15 s) on
    assert named and {w for _, w in named} == {"leaf2-spine2 leaf→spine"}, named
    assert named[0][0] >= 43 * tick_ns + phase[2], named  # at its fourth tick, not before


def test_a_hosts_clock_stepping_makes_no_pair_slow_but_a_queue_at_its_port_does() -> None:
    """A clock steps (a PTP servo re-locking, chrony or ntpd stepping): until the clock
    solver's next window, every route into the host reads late by the step and every route
    out early by as much. Seen on the demo lab (2026-12-05, h2-1 stepped 300 µs either
    way): `clockmesh live` showed 10 hosts `slow`, each pair to (or from) h2-1 "300 µs"
    queued, for 2-4 s, and nothing had waited — the host's round trips held no queue. The
    pairs whose delay the routes' early other way explains are not slow; a queue at the
    host's port (its routes in late, those out on time) still makes them slow."""
    d, route = _one_host_racks()

    def windows(into_us: float, out_us: float) -> list[RouteWindow]:
        return [
            route(s, t, y, into_us if t == 2 else out_us if s == 2 else 0.0)
            for s in (1, 2, 3) for t in (1, 2, 3) if s != t for y in ("spine1", "spine2")
        ]  # fmt: skip

    for into_us, out_us, slow in (
        (300.0, -300.0, set()),  # stepped ahead
        (-300.0, 300.0, set()),  # stepped back
        (300.0, 0.0, {(1, 2), (3, 2)}),  # its downlink queued
        (0.0, 300.0, {(2, 1), (2, 3)}),  # its uplink queued
    ):
        d._pair_since.clear()
        for step in range(3):
            d.newest_ns = (step + 1) * S
            d.windows = lambda into_us=into_us, out_us=out_us: windows(into_us, out_us)
            d.observations(0)
        got = d.pair_queues()
        assert set(got) == slow, (into_us, out_us, got)
        assert all(abs(q - 300e3) < 1e3 for q in got.values()), got


def test_a_routes_baseline_is_its_last_two_minutes_of_healthy_windows() -> None:
    """Each route's baseline is the median and robust σ (1.4826 × MAD) of its last
    BASE_KEEP (120) healthy windows — refitted at every window while it holds fewer than
    20, then every REFIT_EVERY-th — however many it has learnt: the ring of columns that
    holds them (one row per route) wraps around after two minutes without losing the
    newest or keeping the oldest."""
    import collections

    from analytics.detect.contention import BASE_KEEP, MIN_BASE, REFIT_EVERY, _Baselines

    rng = np.random.default_rng(7)
    bases = _Baselines()
    keys = [(1, 2, "spine1"), (1, 2, "spine2"), (3, 4, "spine1")]
    kept = {k: collections.deque(maxlen=BASE_KEEP) for k in keys}
    want = {k: np.full((2, 2), np.nan) for k in keys}  # (median, sigma) as last refitted
    for step in range(3 * BASE_KEEP + 7):
        learning = [k for k in keys if rng.random() < 0.8]  # not every route every window
        if not learning:
            continue
        rows = bases.rows(learning)
        values = rng.normal(10e3, 2e3, (len(learning), 2)) + step  # a slow drift
        bases.append(rows, values, np.full(len(learning), step * S))
        for k, v in zip(learning, values, strict=True):
            kept[k].append(v)
            n = len(kept[k])
            learnt = int(bases.learnt[bases.index[k]])
            if n < 4 * MIN_BASE or learnt % REFIT_EVERY == 0:
                h = np.array(kept[k])
                med = np.median(h, axis=0)
                want[k] = np.array([med, 1.4826 * np.median(np.abs(h - med), axis=0)])
        for k in keys:
            i = bases.index.get(k)
            if i is None:
                continue
            got = np.array([bases.med[i], bases.sigma[i]])
            assert np.array_equal(got, want[k], equal_nan=True), (step, k, got, want[k])
    assert all(len(kept[k]) == BASE_KEEP for k in keys)
    assert bases.count().tolist() == [BASE_KEEP] * 3


def test_the_detector_holds_only_its_last_seconds_of_probes() -> None:
    """A day of probes does not pile up in the daemon: a pass judges the newest few
    seconds (``LOSS_SPAN_NS``), and once those are held what the detector keeps stops
    growing — over 36 s more, by less than a tenth of what those probes would take."""
    import tracemalloc

    from analytics.detect import contention

    def held() -> int:  # bytes allocated in the contention module and still alive
        where = [tracemalloc.Filter(True, contention.__file__)]
        return sum(s.size for s in tracemalloc.take_snapshot().filter_traces(where).statistics(
            "filename"))  # fmt: skip

    f = _Fleet(racks=5, every=True)
    tracemalloc.start()
    try:
        f.judge({}, seconds=12)
        fed, before = f.delays.joined_total + f.delays.lost_total, held()
        f.judge({}, seconds=36)
        grown = held() - before
    finally:
        tracemalloc.stop()
    probes = (f.delays.joined_total + f.delays.lost_total - fed) * 3 * 8  # path, time, delay
    assert probes > 300_000
    assert grown < probes / 10, (grown, probes)


def test_paths_a_trace_moves_to_another_spine_are_judged_there_at_the_next_pass() -> None:
    """ECMP moved the paths off a link (it went down): the next traces put them on the
    other spine, and from the next pass their routes are judged there — no route of
    leaf1's is judged through spine1 any more, none is lost."""
    from tests.unit.test_detect_rules import _round

    f = _Fleet(seed=4)
    f.warm()
    before = f.delays.windows()
    assert ("leaf1", "spine1") in {(f.host_rack[w.src], w.spine) for w in before}
    f.paths.feed(_round(f.links, f.hosts, f.t / S, {"leaf1-spine1"}))
    f.second({})
    after = f.delays.windows()
    leaf1 = {(w.src, w.dst) for w in after if "leaf1" in (f.host_rack[w.src], f.host_rack[w.dst])}
    assert leaf1 == {(w.src, w.dst) for w in before
                     if "leaf1" in (f.host_rack[w.src], f.host_rack[w.dst])}  # fmt: skip
    assert {w.spine for w in after if "leaf1" in (f.host_rack[w.src], f.host_rack[w.dst])} == {
        "spine2"
    }


def test_probes_that_arrive_before_any_trace_wait_for_one() -> None:
    """The daemon starts with probes coming in and no path traced yet (the traces come
    every few seconds): a pass judges nothing and fails nothing; the first traces place
    the probes held on their routes."""
    from analytics.detect.spine_map import SpineMap

    f = _Fleet(seed=6)
    f.delays.spine_of = known = SpineMap()  # the detector's traces: none yet
    for _ in range(3):
        f.second({})
        assert f.delays.observations(0) == []
        assert len(f.delays.windows()) == 0
    known.update(f.paths.spine_of)
    f.second({})
    assert {(w.src, w.dst, w.spine) for w in f.delays.windows()} == {
        (s, d, y) for (s, d, _p), y in f.paths.spine_of.items()
    }


def test_a_drained_port_queues_losses_name_no_fabric_link_behind_it() -> None:
    """Seen in CI (three racks of one host, 2026-11-29): an incast at h1-1's port drained;
    its routes in through spine2 had lost 23 % of their probes over their loss span and
    through spine1 fewer, so only the spine2 routes were still held slow by their span's
    29 ms tail while their newest second was early (the clock solver still held the offset
    that had absorbed the queue). The port's round trips no longer held it, and
    leaf1-spine2 (spine→leaf) was paged "a standing queue of ≥28577 µs". Those losses
    were the port's: nothing is named on the fabric. Once the span has passed, a queue
    that drops on leaf1-spine2 is named again."""
    d, route = _one_host_racks()
    racks = (1, 2, 3)

    def windows(into_1: dict[str, tuple[float, int, float]], out_1: float) -> list[RouteWindow]:
        """``into_1``: spine -> (excess µs, lost, span excess µs) of the routes into h1-1;
        ``out_1``: the excess of those out of it; every other route healthy."""
        out = []
        for s in racks:
            for t in racks:
                for y in ("spine1", "spine2"):
                    if s != t:
                        ex, lost, span = 0.0, 0, math.nan
                        if t == 1:
                            ex, lost, span = into_1[y]
                        elif s == 1:
                            ex = out_1
                        out.append(route(s, t, y, ex, lost, span))
        return out

    def passes(into_1: dict[str, tuple[float, int, float]], out_1: float, n: int) -> list[list]:
        said = []
        for _ in range(n):
            d.newest_ns += S
            d.windows = lambda: windows(into_1, out_1)
            said.append([(o.link, o.evidence["direction"]) for o in d.observations(0)])
        return said

    # The incast: every probe into h1-1 waits 58 ms, the solver has split it (29 ms in,
    # 29 ms out on its clock), a quarter of them are lost.
    queued = (29_000.0, 6, 29_000.0)
    said = passes({"spine1": queued, "spine2": queued}, 29_000.0, 4)
    assert said[-1] == [("h1-1-leaf1", HOST_DOWN)], said
    # Drained, the clock still wrong: in 29 ms early, out 29 ms late; the spine2 routes'
    # span still holds the incast's losses and tail.
    drained = {"spine1": (-29_000.0, 0, math.nan), "spine2": (-29_000.0, 5, 29_000.0)}
    said = passes(drained, 29_000.0, 5)
    assert all(not s or s == [("h1-1-leaf1", HOST_DOWN)] for s in said), said
    assert said[-1] == [], said
    # The clock put right; then, the span long past, leaf1-spine2 drops what it forwards
    # into leaf1 (its probes wait 300 µs): named.
    passes({"spine1": (0.0, 0, math.nan), "spine2": (0.0, 0, math.nan)}, 0.0, 3)
    said = passes({"spine1": (0.0, 0, math.nan), "spine2": (10.0, 6, 300.0)}, 0.0, 2)
    assert ("leaf1-spine2", "spine→leaf") in said[-1], said


def test_a_cut_off_racks_lost_and_held_probes_name_no_queue_until_its_span_is_past() -> None:
    """Seen in the demo lab (2026-12-06): leaf3's host links down ~6 s; 2 s after they
    were back, "h3-2-leaf3 (leaf→host) … a full queue that drops, tail ≥651922 µs … 62 %
    lost" paged under healthy jobs. Probes to and from rack 3 are all lost while it is cut
    off, and those of its first half second back arrive 0.65 s late (held while the
    neighbour was unresolved). Those are the outage's, paged as a flap: nothing is named
    for them. Once the loss span is past, a queue at h3-2's port is named again."""
    rack3 = {records.host_id("h3-1"), records.host_id("h3-2")}
    links = [(f"h3-{n}-leaf3", way) for n in (1, 2) for way in (HOST_UP, HOST_DOWN)]
    for seed in range(3):
        f = _Fleet(seed=seed, every=True)
        f.warm()
        back = [0]  # probe time rack 3 came back (0: still down)

        def cut_off(since: int, back: list[int] = back) -> set[int]:
            return rack3 if not back[0] or back[0] >= since else set()

        f.delays.hosts_down = cut_off
        said = []
        for _ in range(6):
            f.second(dict.fromkeys(links, 1.0), loss=1.0)
            said += f.delays.observations(0)
        back[0] = f.t
        f.second(dict.fromkeys(links, 650_000.0), loss=0.3, halves=1)
        said += f.delays.observations(0)
        for _ in range(7):
            f.second({})
            said += f.delays.observations(0)
        assert said == [], (seed, [o.summary for o in said])
        incast = {("h3-2-leaf3", HOST_DOWN): 300.0}
        said = f.judge(incast, seconds=3, loss=0.2)
        assert {(o.link, o.evidence["direction"]) for o in said} == {
            ("h3-2-leaf3", HOST_DOWN)
        }, (seed, [o.summary for o in said])  # fmt: skip


def test_a_queue_that_begins_dropping_is_named_from_its_first_seconds_losses() -> None:
    """A shallow buffer saturated by bursty senders (the demo lab's 500-µs buffers,
    2026-12-01): 30 % of the probes crossing it lost, 40 % pass it empty, so its windows
    never settle and only the losses say it is full. Losses were known 2 s late on the
    sender's clock and counted over the 4-s span only: the span's share passed 20 % after
    ~3-4 s, and of these six seeds two were not named in 8 s (the demo lab: 5-18 s, median
    11). Known 0.3 s late on the receiver's clock, each is named within 6 s, half of them
    within 3."""
    up = {("leaf2-spine1", "leaf→spine"): 300.0}
    firsts = []
    for seed in range(6):
        f = _Fleet(seed=seed)
        f.warm()
        for i in range(1, 9):
            f.second(up, loss=0.5, empty=0.4)
            said = f.delays.observations(0)
            if said:
                assert {(o.link, o.evidence["direction"]) for o in said} == {
                    ("leaf2-spine1", "leaf→spine")
                }, (seed, [o.summary for o in said])  # fmt: skip
                firsts.append(i)
                break
        else:
            raise AssertionError(f"seed {seed}: not named in 8 s")
    assert max(firsts) <= 6 and sorted(firsts)[2] <= 3, firsts


def test_a_send_is_lost_0_3_s_after_on_its_receivers_clock() -> None:
    """A receiver whose clock runs 1.5 s behind its sender's (the solver knows it): a send
    it has not received is lost once it shipped receives 0.3 s after the send on its own
    clock — not before (the probe may be in a queue), and not only 2 s after the send on
    the sender's clock (3.5 s after it, on this receiver's)."""
    f = _Fleet()
    (s, d, sport), _spine = sorted(f.paths.spine_of.items())[0]
    other = next(h for h in f.host_rack if h not in (s, d))
    ids = sorted(f.host_rack)
    off = np.array([-1.5e9 if h == d else 0.0 for h in ids])
    z = np.zeros(len(ids))
    clocks = ClockState(0, np.array(ids, np.int64), off, z, z, z, np.zeros(len(ids), np.int64))
    delays = PathDelays(f.host_rack, f.paths.by_ends, f.paths.spine_of, dict(f.names),
                        host_access=f.port)  # fmt: skip
    t = 100 * S
    tx = np.array([(7, s, d, sport, 9000, 0, 0, 0, 0, t)], records.PROBE_TX)
    delays.feed_probes(tx, np.zeros(0, records.PROBE_RX), clocks)

    def receives(after_s: float, seq: int) -> int:  # d ships a receive from another host
        rx_ns = int(t - 1.5e9 + after_s * 1e9)
        rx = np.array([(seq, other, d, 40000, 9000, 0, 0, 0, 64, rx_ns, 0)], records.PROBE_RX)
        delays.feed_probes(np.zeros(0, records.PROBE_TX), rx, clocks)
        return delays.lost_total

    assert receives(0.2, 1) == 0  # 0.2 s after the send: it may still be in a queue
    assert receives(0.4, 2) == 1  # 0.4 s after: lost


def test_a_clock_step_on_a_young_fleet_leaves_no_route_slow_once_the_solver_catches_up() -> None:
    """Seen in the lab (2026-12-05, a fleet whose baselines held ~3 windows): h3-2's
    clock stepped 300 µs ahead; for the seconds until the clock solver's next window its
    routes out read 300 µs early, and those early windows were learnt as healthy. With a
    baseline of a few windows that moved it: once the solver caught up, every route out of
    h3-2 read 300 µs late against it, for good — its port was paged a queue it never had.
    A queue only delays: what a clock held wrong makes early is no healthy delay."""
    for ahead in (True, False):
        f = _Fleet(seed=3, every=True)
        f.warm(3)  # baselines of a few windows, as a fleet a few seconds old holds
        host = sorted(f.host_rack)[2]
        step = 300e3 if ahead else -300e3
        f.offset[host] += step  # the host's clock steps; the solver holds the old one...
        said = []
        for _ in range(6):
            f.second({})
            said += f.delays.observations(0)
        c = f.clocks  # ...until its next window solved (3-5 s in the lab)
        f.clocks = dataclasses.replace(
            c, offset_ns=np.array([f.offset[h] for h in c.hosts.tolist()])
        )
        for _ in range(8):
            f.second({})
            said += f.delays.observations(0)
            assert f.delays.pair_queues() == {}, (ahead, f.delays.pair_queues())
        assert said == [], (ahead, [o.summary for o in said])
