"""Silent-drop localisation on synthetic probes: which probes were lost on which path, and
which place (switch, switch towards a host, link direction) explains them."""

from __future__ import annotations

import collections
import json
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from analytics.detect import attribution
from analytics.detect.detect_runner import DetectConfig, DetectRunner
from analytics.detect.silent_drop import SilentDrops, in_a_burst
from analytics.store import layout
from collector import records

RACKS = ("leaf1", "leaf2", "leaf3")
SPINES = ("spine1", "spine2")
SPORTS = range(40000, 40008)
NS = 1_000_000_000
T0 = 1_800_000_000 * NS
# host id -> its leaf: two hosts per rack
HOSTS = {10 * r + i: f"leaf{r}" for r in (1, 2, 3) for i in (1, 2)}
NAMES = {h: f"h{h // 10}-{h % 10}" for h in HOSTS}
BY_ENDS = {(leaf, s): f"{leaf}-{s}" for leaf in RACKS for s in SPINES}

# (src, dst, sport, spine, t_s) -> (lost, extra delay ns)
Fault = Callable[[int, int, int, str, float], tuple[bool, float]]


def healthy(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
    return False, 0.0


def spine_of(s: int, d: int, p: int) -> str:
    return SPINES[zlib.crc32(f"{s}-{d}-{p}".encode()) % 2]


def _paths() -> dict[tuple[int, int, int], str]:
    """Every inter-rack path (src, dst, source port) and the spine it crosses (a new dict:
    tests move paths in it)."""
    return {(s, d, p): spine_of(s, d, p) for s in HOSTS for d in HOSTS for p in SPORTS
            if HOSTS[s] != HOSTS[d]}  # fmt: skip


def _flow_hash(s: int, d: int, p: int) -> float:
    return (zlib.crc32(f"flow{s}.{d}.{p}".encode()) % 10_000) / 10_000


def _probes(t_s: float, fault: Fault) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One round (a coded pair per path) sent at t_s: the tx and rx columns."""
    tx: dict[str, list[int]] = {k: [] for k in ("src", "dst", "sport", "seq", "tx_ns")}
    rx: dict[str, list[int]] = {k: [] for k in ("src", "dst", "sport", "seq", "rx_ns")}
    for s in HOSTS:
        for d in HOSTS:
            if s == d:
                continue
            for p in SPORTS:
                spine = spine_of(s, d, p)
                for j in (0, 1):
                    seq = int(t_s * 1000) * 100_000 + d * 100 + (p - 40000) * 2 + j
                    t = T0 + int(t_s * NS) + j * 1000
                    for k, v in zip(tx, (s, d, p, seq, t), strict=True):
                        tx[k].append(v)
                    lost, extra = fault(s, d, p, spine, t_s)
                    if not lost:
                        delay = 10_000 + int(extra) + (s * 7 + d * 3 + p) % 2000
                        for k, v in zip(rx, (s, d, p, seq, t + delay), strict=True):
                            rx[k].append(v)
    return ({k: np.asarray(v, np.int64) for k, v in tx.items()},
            {k: np.asarray(v, np.int64) for k, v in rx.items()})  # fmt: skip


# (host, t_s) -> (packets its port counted in over the second before, operstate[, packets
# it counted out: as many as in when not given])
Port = Callable[[int, float], tuple[int, ...]]


def _port_rows(t_s: float, port: Port) -> np.ndarray:
    """One sample of every host's access port (``bk0``), as its collector reads sysfs."""
    names = ("rx_packets", "tx_packets", "operstate", "carrier_down_count")
    rows = np.zeros(len(HOSTS) * len(names), records.COUNTER)
    for i, (h, name) in enumerate((h, n) for h in HOSTS for n in names):
        rx, state, *more = port(h, t_s)
        value = state if name == "operstate" else 0
        delta = {"rx_packets": rx, "tx_packets": more[0] if more else rx}.get(name, 0)
        rows[i] = (T0 + int(t_s * NS), h, b"bk0", 0, 0, 0, name.encode(), value, delta)
    return rows


def _run(
    fault: Fault,
    seconds: int = 12,
    healthy_s: int = 10,
    late: int = 0,
    paths: dict[tuple[int, int, int], str] | None = None,
    port: Port | None = None,
    contended: set[tuple[str, str]] | None = None,
    full_ports: set[int] | None = None,
    host_access: dict[int, str] | None = None,
    drained: set[str] | None = None,
    socket: Callable[[int, float], int] | None = lambda h, t: 0,
) -> list:
    """Healthy for healthy_s, then `fault` for `seconds`: every pass's observations (the
    last pass's last). ``late``: the receivers ship their probe_rx
    that many rounds later (each destination is judged at its own pace): all but h1-1, so
    its loss shows first. ``paths``: the traced paths (default every inter-rack one).
    ``port``: the hosts' access-port counters, fed once a second (default none).
    ``socket(host, t)``: its collector's socket drops so far, fed once a second (default
    none dropped; None: no count shipped)."""
    paths = _paths() if paths is None else paths
    access = [(h, "bk0") for h in HOSTS] if port else []
    drops = SilentDrops(HOSTS, BY_ENDS, paths, NAMES, access_ports=access,
                        contended=(lambda: contended) if contended else None,
                        full_ports=(lambda: full_ports) if full_ports else None,
                        host_access=host_access)  # fmt: skip
    drops.drained = drained or set()
    every = []
    held: list[dict[str, np.ndarray]] = []
    for i in range(healthy_s + seconds):
        tx, rx = _probes(float(i), healthy if i < healthy_s else fault)
        if port:
            drops.ports.feed(_port_rows(float(i), port))
        if socket is not None:
            hosts = np.array(sorted(HOSTS))
            drops.feed_socket(np.full(len(hosts), T0 + i * NS), hosts,
                              np.array([socket(h, float(i)) for h in hosts]))  # fmt: skip
        drops.feed("probe_tx", tx)
        odd = rx["dst"] != 11 if late else np.zeros(len(rx["dst"]), bool)
        drops.feed("probe_rx", {k: v[~odd] for k, v in rx.items()})
        held.append({k: v[odd] for k, v in rx.items()})
        if late and len(held) > late:
            drops.feed("probe_rx", held.pop(0))
        every.append(drops.observations(T0 + i * NS))
        if late:  # the late receivers' rows arrive between two passes
            every.append(drops.observations(T0 + i * NS + NS // 2))
    return every


def blackhole(switch: str, dst: int) -> Fault:
    def f(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        crosses = switch == spine and HOSTS[s] != HOSTS[d]
        return (crosses and d == dst), 0.0

    return f


def test_one_senders_paths_alone_are_that_pairs_problem_not_a_switchs() -> None:
    """`make demo` on a fresh clone: a new buddy's two paths through spine1 lost all 12 of
    their probes for its first seconds, every other path to that host delivered, and
    "spine1 towards h4-1 silently drops traffic" was paged. A switch drops what every
    sender sends through it: one sender's loss names no switch; a second sender's does."""

    def one_pair(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (s == 11 and d == 31 and spine == "spine2"), 0.0

    assert not any(_run(one_pair))

    def two_senders(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (s in (11, 21) and d == 31 and spine == "spine2"), 0.0

    (obs,) = _run(two_senders)[-1]
    assert obs.evidence["switch"] == "spine2" and obs.evidence["destinations"] == ["h3-1"]


def test_new_pairs_losing_some_paths_first_probes_are_not_a_silent_drop() -> None:
    """`make demo` on a fresh clone: collectors just deployed, new buddies' paths through
    one spine lost their first seconds of probes (their other paths delivered) and leaf4
    and spine1 were paged. A pair is judged WARMUP_NS after its first delivered probe."""

    def first_seconds(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (s in (11, 21) and d == 31 and spine == "spine2" and t < 6), 0.0

    assert not any(_run(first_seconds, seconds=12, healthy_s=0))


@pytest.mark.parametrize("late", [0, 1])
def test_a_spine_blackholing_one_host_is_named_with_the_host_and_the_link_it_leaves_by(
    late: int,
) -> None:
    every = _run(blackhole("spine2", 31), late=late)
    # one summary while the drop stands, also on the passes between two receivers' rows
    assert len({o[0].summary for o in every if o}) == 1, {o[0].summary for o in every if o}
    if late:  # two passes a round
        every = every[1::2]
    assert not any(every[:10]), "nothing while healthy"
    (obs,) = every[-1]
    e = obs.evidence
    assert obs.kind == "silent_drop"
    assert e["switch"] == "spine2" and e["destinations"] == ["h3-1"], e
    assert obs.link == "leaf3-spine2" and e["links"] == ["leaf3-spine2"]
    assert e["from_racks"] == ["leaf1", "leaf2"], e  # its victims: those racks' pairs to h3-1
    assert e["confidence"] == 1.0 and e["flow_share"] == 1.0
    # every inter-rack path to h3-1 through spine2 (4 other-rack hosts × its ports there)
    expected = {(s, 31, p) for s in HOSTS for p in SPORTS
                if HOSTS[s] != "leaf3" and spine_of(s, 31, p) == "spine2"}  # fmt: skip
    assert e["lossy_paths"] == len(expected)
    assert obs.summary.startswith(
        "spine2 towards h3-1 silently drops traffic: every path through it loses every probe; "
        "links and routes up, paths unmoved, no queue"
    ), obs.summary
    assert "out of service: leaf3-spine2" in obs.summary
    # found once three rounds were lost and judged (the third judged at the fourth round)
    first = next(i for i, o in enumerate(every) if o)
    assert first - 10 <= 3 + late, first  # (+ its own receiver's lateness)


@pytest.mark.parametrize("late", [0, 1])
def test_a_spine_blackholing_two_hosts_of_two_racks_is_named_towards_each_not_as_a_share(
    late: int,
) -> None:
    """On the demo lab, spine2 black-holing h1-2 and h4-1: besides the two right anomalies,
    a third said "spine2 silently drops traffic: 79 of 653 paths through it (12%)" — a
    page sending the on-call to a line card when two FIB entries are wrong."""

    def two_holes(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return spine == "spine2" and HOSTS[s] != HOSTS[d] and d in (11, 31), 0.0

    every = _run(two_holes, late=late)
    said = {(o.key, tuple(o.evidence["destinations"])) for obs in every for o in obs}
    assert said == {("spine2 → h1-1", ("h1-1",)), ("spine2 → h3-1", ("h3-1",))}, said
    last = {o.key: o for o in every[-1]}
    for key, dst, link in (("spine2 → h1-1", 11, "leaf1-spine2"),
                           ("spine2 → h3-1", 31, "leaf3-spine2")):  # fmt: skip
        e = last[key].evidence
        expected = {(s, dst, p) for s in HOSTS for p in SPORTS
                    if HOSTS[s] != HOSTS[dst] and spine_of(s, dst, p) == "spine2"}  # fmt: skip
        assert e["lossy_paths"] == len(expected) and e["flow_share"] == 1.0, e
        assert last[key].link == link, last[key].summary
        assert "every path through it loses every probe" in last[key].summary


def test_paths_recovering_unevenly_after_a_two_host_drop_are_not_paged_as_a_share_drop() -> None:
    """Held-out seed 1246: spine2 black-holing h3-2 and h1-2, named towards each; 1.2 s
    after the heal, as their paths came back unevenly, a third page said "spine2 silently
    drops traffic: 14 of 86 paths through it (16%)" — every one of those paths going to
    the two hosts already named. Here a quarter of the paths to them stay lost after the
    rest came back: nothing new is named while the two names are recent; if it stands
    past that, it is named for what it then is."""

    def healing(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        hole = spine == "spine2" and HOSTS[s] != HOSTS[d] and d in (11, 31)
        return hole and (t < 22 or p - SPORTS[0] < 2), 0.0

    every = _run(healing, seconds=12 + 30)
    keys = [{o.key for o in obs} for obs in every]
    assert keys[21] == {"spine2 → h1-1", "spine2 → h3-1"}, keys[21]
    assert all(k <= {"spine2 → h1-1", "spine2 → h3-1"} for k in keys[: 22 + 15]), keys
    assert keys[-1] == {"spine2"}, keys[-1]  # a share drop that stands is one


def test_a_senders_leaf_blackholing_one_host_is_named_with_the_host_and_no_link() -> None:
    """On the demo lab, ``ip route add blackhole <h1-2>/32`` in leaf3: every path from rack
    3 to h1-2 lost, the other racks' paths to it delivered, and nothing was named (the
    loss was put on h1-2's own receiving, which is never reported). The leaf drops before
    it picks an uplink, so no link is offered to take out of service."""

    def leaf_hole(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (HOSTS[s] == "leaf1" and d == 31), 0.0

    every = _run(leaf_hole)
    assert not any(every[:10]), "nothing while healthy"
    (obs,) = every[-1]
    e = obs.evidence
    assert e["switch"] == "leaf1" and e["destinations"] == ["h3-1"], e
    assert obs.link == "" and e["links"] == [] and e["from_racks"] == ["leaf1"], e
    assert e["lossy_paths"] == 2 * len(SPORTS) and e["flow_share"] == 1.0, e
    assert obs.summary.startswith(
        "leaf1 towards h3-1 silently drops traffic: every path through it loses every probe; "
        "links and routes up"
    ), obs.summary
    # one summary while the drop stands, whatever share of its paths each pass has judged
    assert len({o[0].summary for o in every if o}) == 1, {o[0].summary for o in every if o}
    assert "out of service" not in obs.summary
    first = next(i for i, o in enumerate(every) if o)
    assert first - 10 <= 3, first


@pytest.mark.parametrize("late", [0, 1])
def test_a_share_of_the_flows_dropped_at_a_spine_names_the_spine_and_no_destination(
    late: int,
) -> None:
    def share(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return spine == "spine1" and _flow_hash(s, d, p) < 0.3, 0.0

    every = _run(share, late=late)
    # never, not even while few paths are judged yet, a destination or a link: the spine
    said = [(o.key, tuple(o.evidence["destinations"])) for obs in every for o in obs]
    assert said and set(said) == {("spine1", ())}, set(said)
    (obs,) = every[-1]
    e = obs.evidence
    assert e["switch"] == "spine1" and e["destinations"] == [], e
    assert obs.link == "" and len(e["links"]) == 3  # the spine's three links: no single one
    assert 0.15 < e["flow_share"] < 0.45, e
    assert "spine1 silently drops traffic" in obs.summary


def test_nothing_is_said_of_a_healthy_fabric() -> None:
    assert not any(_run(healthy, seconds=20))


def test_a_full_queue_drops_and_delays_so_it_is_contention_not_a_silent_drop() -> None:
    def queue(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        if HOSTS[s] == "leaf1" and HOSTS[d] != "leaf1" and spine == "spine2":
            # tail drops: whole rounds of some paths lost, the rest waits 3 ms
            return _flow_hash(s, d, p + int(t) // 3) < 0.6, 3_000_000.0
        return False, 0.0

    assert not any(_run(queue, seconds=20))


def test_losses_into_a_host_whose_port_contention_names_are_its_queue_not_a_switch_s() -> None:
    """Seen in the demo lab (2026-12-05): a shallow queue at the leaf's port towards h2-3
    dropped a quarter of what went to it, and two paths through spine1 happened to lose
    five in a row; the links' median delay rise (over every path through them) was 0.5
    µs, and "spine1 towards h2-3 silently drops traffic … no queue" was paged. Once
    ``contention`` names h3-1's port, the same losses into h3-1 are its queue's: nothing
    is said — the same losses with no port named are a silent drop."""
    (obs,) = _run(blackhole("spine2", 31))[-1]
    assert obs.kind == "silent_drop" and obs.evidence["destinations"] == ["h3-1"]
    assert not any(_run(blackhole("spine2", 31), full_ports={31}))
    # another host's port named leaves h3-1's drop judged
    (obs,) = _run(blackhole("spine2", 31), full_ports={21})[-1]
    assert obs.evidence["destinations"] == ["h3-1"], obs.evidence


def test_a_host_whose_link_is_down_is_its_own_fault_not_a_switch_s() -> None:
    def down(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (s == 21 or d == 21), 0.0

    def port(h: int, t: float) -> tuple[int, int]:
        return (0, 2) if h == 21 and t >= 10 else (100, 6)  # operstate down, nothing in

    assert not any(_run(down, seconds=20))
    assert not any(_run(down, seconds=20, port=port))


def test_a_leaf_dropping_its_own_host_is_named_when_the_hosts_port_counts_nothing_in() -> None:
    """leaf1 black-holes h1-1 (its own host): every path into h1-1, from every rack and
    from h1-2 beside it, loses every probe, while h1-1 sends on. To the probes alone that
    is h1-1 losing all it receives (its socket, its collector: its own problem, never a
    switch's). Its port's counters tell them apart: nothing reached its NIC."""

    def own_host(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        # Meanwhile three of h1-2's paths out lose two rounds in three (never five probes
        # in a row), so in every pass one of them has just lost its newest: pending,
        # through leaf1. Those must not hold the naming back (a scenario's leaf2
        # black-holing h2-2 was never named: paths into h2-2 not yet judged lossy were
        # pending in every pass).
        stray = s == 12 and d == 31 and p - 40000 in (0, 1, 2) and int(t) % 3 != p - 40000
        return (d == 11 and t >= 10) or stray, 0.0

    def port(h: int, t: float) -> tuple[int, int]:
        # link up all along; in, now and then, the leaf's own ARP (demo lab: 0 or 1)
        return (int(t) % 2 if h == 11 and t >= 10 else 120), 6

    every = _run(own_host, seconds=14, port=port)
    (obs,) = every[-1]
    e = obs.evidence
    assert (e["switch"], e["destinations"], e["links"]) == ("leaf1", ["h1-1"], []), obs.summary
    assert e["from_racks"] == ["leaf1", "leaf2", "leaf3"]
    assert {o[0].evidence["port_rx_packets"]["h1-1"] for o in every if o} <= {0, 1, 2}
    # one summary while it stands: the count (0 or 1 as the ARP comes) is in the evidence
    assert {o[0].summary for o in every if o} == {obs.summary}, {o[0].summary for o in every if o}
    assert "h1-1's port counted (almost) nothing in over 3 s" in obs.summary
    assert e["confidence"] == 1.0  # every lossy path a switch could have lost: this one
    assert "leaf1 towards h1-1 silently drops traffic" in obs.summary
    assert "h1-1's NIC (receiving)" in e["candidates"]
    first = next(i for i, o in enumerate(every) if o)
    assert first <= 10 + 6, first  # within a few seconds of the drop
    # The same loss with the packets counted in (h1-1's socket drops them): not its leaf.
    assert not any(_run(own_host, seconds=14, port=lambda h, t: (120, 6)))
    # ... nor with the port's counters unknown, or its link down meanwhile.
    assert not any(_run(own_host, seconds=14))


def test_paths_that_moved_off_a_failed_link_and_links_under_suspicion_are_not_judged() -> None:
    paths = _paths()
    suspected: set[str] = set()
    drops = SilentDrops(HOSTS, BY_ENDS, paths, NAMES, lambda: suspected)

    def flap(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return paths[(s, d, p)] == "spine2" and HOSTS[s] == "leaf1" if HOSTS[s] != HOSTS[d] \
            else False, 0.0  # fmt: skip

    said = []
    for i in range(28):
        if i == 22:  # routing moved leaf1's flows off spine2: the traces say so
            for k in paths:
                if HOSTS[k[0]] == "leaf1":
                    paths[k] = "spine1"
        tx, rx = _probes(float(i), healthy if i < 10 else flap)
        drops.feed("probe_tx", tx)
        drops.feed("probe_rx", rx)
        said.append(drops.observations(T0 + i * NS))
    # a whole link-direction: named once lossy LINK_HOLD_NS (a queue's onset looks alike)
    assert not any(said[:18]) and any(said[18:22]), "a loss that does not move is a silent drop"
    assert not any(said[23:]), "once the paths moved, their loss was the move's"
    suspected.add("leaf1-spine2")
    drops2 = SilentDrops(HOSTS, BY_ENDS, {k: spine_of(*k) for k in paths}, NAMES,
                         lambda: suspected)  # fmt: skip
    for i in range(20):
        tx, rx = _probes(float(i), healthy if i < 10 else flap)
        drops2.feed("probe_tx", tx)
        drops2.feed("probe_rx", rx)
        assert not drops2.observations(T0 + i * NS)


def test_a_probe_is_not_called_lost_before_its_destination_shipped_later_probes() -> None:
    drops = SilentDrops(HOSTS, BY_ENDS, {}, NAMES)
    tx, rx = _probes(0.0, healthy)
    drops.feed("probe_tx", tx)  # the receivers' rows are late: nothing judged yet
    assert drops.path_stats() == {}
    drops.feed("probe_rx", rx)
    stats = drops.path_stats()
    assert stats and all(st["lost"] == 0 for st in stats.values())


def _topology(path: Path) -> Path:
    hosts = [{"name": NAMES[h], "rack": HOSTS[h]} for h in HOSTS]
    links = []
    for i, (leaf, s) in enumerate(BY_ENDS):
        links.append({"name": BY_ENDS[(leaf, s)], "kind": "fabric",
                      "a": {"node": leaf, "interface": s, "address": f"198.18.128.{2 * i}"},
                      "b": {"node": s, "interface": leaf,
                            "address": f"198.18.128.{2 * i + 1}"}})  # fmt: skip
    for h in HOSTS:  # each host's one access link, its end named bk0 as in the lab
        links.append({"name": f"{NAMES[h]}-{HOSTS[h]}", "kind": "access",
                      "a": {"node": NAMES[h], "interface": "bk0"},
                      "b": {"node": HOSTS[h], "interface": NAMES[h]}})  # fmt: skip
    path.write_text(json.dumps({"hosts": hosts, "links": links}))
    return path


def _drive(
    runner: DetectRunner, fault: Fault, seconds: int, healthy_s: int = 0, port: Port | None = None
) -> None:
    """The daemon's detector fed ``healthy_s`` healthy rounds, then ``fault`` for
    ``seconds``, as committed tables (with the hosts' port counters, when ``port``
    says them), a pass after each."""
    for i in range(healthy_s + seconds):
        tx, rx = _probes(float(i), healthy if i < healthy_s else fault)
        tables = {}
        if port:
            tables["counter"] = layout.records_to_arrow("counter", _port_rows(float(i), port))
        for name, cols in (("probe_tx", tx), ("probe_rx", rx)):
            schema = layout.TABLES[name].schema
            n = len(cols["src"])
            full = {f.name: cols.get(f.name, np.zeros(n, np.int64)) for f in schema}
            tables[name] = pa.table({k: pa.array(v).cast(schema.field(k).type)
                                     for k, v in full.items()}, schema=schema)  # fmt: skip
        runner.feed(tables)
        runner.step(T0 + i * NS)


def _runner_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flapping: str = ""
) -> DetectRunner:
    """The daemon's detector fed 10 healthy rounds, then spine1 blackholing h1-2 for 6
    (with a fabric link down meanwhile, when ``flapping`` names one)."""
    monkeypatch.setattr(records, "host_id", lambda name: {v: k for k, v in NAMES.items()}[name])
    config = DetectConfig(topology_file=str(_topology(tmp_path / "t.json")))
    runner = DetectRunner(None, config, host_names=lambda: NAMES)
    assert runner.model is not None  # the shipped model judges the other candidates
    runner.paths.spine_of.update(_paths())
    if flapping:  # an open outage of that link, as the path traces leave it
        from analytics.detect.flaps import Outage

        st = runner.paths.state[flapping]
        st.outages.append(Outage(T0))
        st.down_since = st.evidence_ns = T0
    _drive(runner, blackhole("spine1", 12), seconds=6, healthy_s=10)
    return runner


def test_the_daemon_s_detector_reports_it_and_the_model_does_not_re_judge_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner_run(tmp_path, monkeypatch)
    (a,) = runner.live()["open"]
    assert a["kind"] == "silent_drop" and a["link"] == "leaf1-spine1", a
    assert a["evidence"]["destinations"] == ["h1-2"]
    assert "model" not in a["evidence"]
    assert runner.live()["open_by_kind"]["silent_drop"] == 1


def test_the_daemon_s_detector_names_a_leaf_dropping_its_own_host_from_its_port_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "host_id", lambda name: {v: k for k, v in NAMES.items()}[name])
    config = DetectConfig(topology_file=str(_topology(tmp_path / "t.json")))
    runner = DetectRunner(None, config, host_names=lambda: NAMES)
    runner.paths.spine_of.update(_paths())

    def own_host(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return d == 11 and t >= 10, 0.0

    def port(h: int, t: float) -> tuple[int, int]:
        return (0 if h == 11 and t >= 10 else 120), 6

    _drive(runner, own_host, seconds=18, port=port)
    (a,) = [a for a in runner.live()["open"] if a["kind"] == "silent_drop"]
    assert (a["evidence"]["switch"], a["evidence"]["destinations"]) == ("leaf1", ["h1-1"])
    assert not [a for a in runner.live()["open"] if a["kind"] != "silent_drop"]


def test_no_silent_drop_is_judged_while_the_fabric_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fabric link down elsewhere (leaf3-spine2): sessions drop and routes move, and a
    control plane starved of CPU drops several at once — loss then is not a silent drop."""
    runner = _runner_run(tmp_path, monkeypatch, flapping="leaf3-spine2")
    assert not [a for a in runner.live()["open"] if a["kind"] == "silent_drop"]


def _stored(store: Path, aid: str, link: str, links: list[str], **evidence: object) -> None:
    from analytics.store.store_writer import StoreWriter

    detail = {"summary": "spine2 silently drops traffic", "evidence": {"links": links, **evidence}}
    row = {"opened_ns": T0, "closed_ns": 0, "anomaly_id": aid, "kind": "silent_drop",
           "score": 0.9, "src": 0, "dst": 0, "link": link, "job_id": "",
           "detail": json.dumps(detail), "updated_ns": T0 + 1}  # fmt: skip
    table = pa.table({k: [v] for k, v in row.items()}, schema=layout.TABLES["anomalies"].schema)
    StoreWriter(store).write_partitioned("anomalies", table, f"{aid}.parquet")


def test_remediation_takes_the_one_link_out_of_service_with_the_cap_and_an_undo(
    tmp_path: Path,
) -> None:
    from analytics.remediate.plan import Refused, plan, recommended
    from tests.unit.test_remediate_plan import _topology as plan_topology

    store = tmp_path / "store"
    store.mkdir()
    topo = plan_topology()
    _stored(store, "silent-1", "leaf3-spine2", ["leaf3-spine2"])
    p = plan(store, topo, anomaly_id="silent-1")
    assert (p.action, p.target) == ("fabric_link_out", "leaf3-spine2")
    assert p.undo == {"action": "fabric_link_in", "target": "leaf3-spine2"}
    assert p.cap["leaf"] == "leaf3" and p.cap["leaf_out_after"] == 1
    assert recommended(topo, "silent_drop", "leaf3-spine2") == ("fabric_link_out", "leaf3-spine2")
    # A whole spine dropping a share of everything: no one link; said in one line.
    _stored(store, "silent-2", "", ["leaf1-spine2", "leaf2-spine2", "leaf3-spine2"])
    with pytest.raises(Refused, match=r"no single link explains it .*take the switch out"):
        plan(store, topo, anomaly_id="silent-2")
    # A leaf black-holing one host drops before it picks an uplink: no link to take out.
    _stored(store, "silent-3", "", [], switch="leaf1", destinations=["h3-1"])
    with pytest.raises(Refused, match=r"the drop is inside leaf1, .*check its route to h3-1"):
        plan(store, topo, anomaly_id="silent-3")
    # ... or towards its own host, whose port counted nothing in: its route, then the NIC.
    _stored(store, "silent-4", "", [], switch="leaf1", destinations=["h1-1"],
            port_rx_packets={"h1-1": 0})  # fmt: skip
    with pytest.raises(
        Refused, match=r"nothing reaches h1-1's port: check leaf1's route to h1-1, then h1-1's NIC"
    ):
        plan(store, topo, anomaly_id="silent-4")
    # A host's way out dropping what it sends: drain the host (its link has no twin to
    # carry its traffic), as for its link flapping.
    _stored(store, "silent-5", "h2-1-leaf2", [], switch="leaf2", host="h2-1",
            direction="host→leaf")  # fmt: skip
    p = plan(store, topo, anomaly_id="silent-5")
    assert (p.action, p.target) == ("host_drain", "h2-1"), p
    assert recommended(topo, "silent_drop", "h2-1-leaf2") == ("host_drain", "h2-1")


def test_a_blackout_of_three_rounds_and_a_receiver_losing_everything_are_not_silent_drops() -> None:
    def hiccup(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        # leaf2's fabric traffic gone for three rounds (a control-plane hiccup)
        crosses = HOSTS[s] != HOSTS[d] and "leaf2" in (HOSTS[s], HOSTS[d])
        return crosses and t < 13, 0.0

    assert not any(_run(hiccup, seconds=8))

    def deaf(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return d == 22, 0.0  # h2-2's socket drops all it gets (its collector still ships)

    assert not any(_run(deaf, seconds=12))


def test_the_streaks_a_queue_dropped_do_not_pass_for_a_silent_drop_once_it_drained() -> None:
    def queue_then_gone(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        if HOSTS[s] == "leaf1" and HOSTS[d] != "leaf1" and spine == "spine2" and t < 16:
            return _flow_hash(s, d, p) < 0.5, 3_000_000.0  # a full queue: drops and waits
        return False, 0.0  # ... then it drained: every probe through at once, no wait

    every = _run(queue_then_gone, seconds=14)
    assert not any(every), [o.summary for obs in every for o in obs][:1]


def test_probes_a_queue_held_past_the_margin_are_late_not_lost() -> None:
    """Behind a saturated slow link, probes wait 0.6 s: other paths tell the receiver's
    watermark past them first, so they are judged lost — then they arrive."""
    paths = _paths()
    drops = SilentDrops(HOSTS, BY_ENDS, paths, NAMES)

    def held(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return False, 600_000_000.0 if t >= 10 and HOSTS[s] == "leaf1" and spine == "spine2" \
            else 0.0  # fmt: skip

    late: dict[str, np.ndarray] | None = None
    for i in range(24):
        tx, rx = _probes(float(i), held)
        slow = rx["rx_ns"] - (T0 + i * NS) > 100_000_000
        drops.feed("probe_tx", tx)
        drops.feed("probe_rx", {k: v[~slow] for k, v in rx.items()})
        assert not drops.observations(T0 + i * NS), i
        if late is not None:
            drops.feed("probe_rx", late)  # arrives with the next round's
        late = {k: v[slow] for k, v in rx.items()}
    stats = drops.path_stats()
    assert sum(st["lost"] for st in stats.values()) == 0


def _leaf1_up_spine2(s: int, d: int, p: int, spine: str) -> bool:
    return HOSTS[s] == "leaf1" and HOSTS[d] != "leaf1" and spine == "spine2"


def test_the_onset_of_a_saturated_shallow_queue_is_not_a_silent_drop() -> None:
    """On/off bulk saturating leaf1→spine2 behind a 500-µs buffer (the lab, 50 Mbit/s):
    for its first seconds the queue is full whenever probes arrive — every probe through
    it lost, none delayed — then probes caught while it fills wait ~300 µs. The lab's
    detector paged a silent drop on leaf1-spine2 10 s before it named the contention."""

    def saturated(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        if not _leaf1_up_spine2(s, d, p, spine):
            return False, 0.0
        if t < 15:
            return True, 0.0
        return _flow_hash(s, d, p + int(t)) < 0.6, 300_000.0

    every = _run(saturated, seconds=20)
    assert not any(every), [o.summary for obs in every for o in obs][:1]


def test_a_link_direction_dropping_everything_is_named_once_it_has_lasted() -> None:
    def dead(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return _leaf1_up_spine2(s, d, p, spine), 0.0

    every = _run(dead, seconds=16)
    first = next(i for i, o in enumerate(every) if o)
    (obs,) = every[first]
    assert obs.link == "leaf1-spine2" and obs.evidence["links"] == ["leaf1-spine2"], obs.evidence
    # lossy after three rounds, then held LINK_HOLD_NS (6 s) in case it is a queue's onset
    assert 10 + 3 + 6 <= first <= 10 + 3 + 6 + 2, first


def test_pairs_that_never_delivered_a_probe_have_not_started_and_are_no_silent_drop() -> None:
    """New buddies: the hosts of rack 1 start probing h3-1 and h3-2, whose collectors do
    not take their probes yet — every probe of those pairs lost on every path from the
    first (make demo named leaf3 a silent drop). A pair that delivered before and then
    loses everything still counts (the blackhole tests)."""

    def not_started(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return HOSTS[s] == "leaf1" and d in (31, 32) and t < 6.0, 0.0

    every = _run(not_started, seconds=12, healthy_s=0)
    assert not any(every), [o.summary for obs in every for o in obs]


def test_a_drop_older_than_the_detector_is_named_once_it_outlasts_a_new_buddy() -> None:
    """The demo, its ops box redeployed while leaf3 black-holed h1-2: those pairs never
    delivered a probe to the new detector, so they had "not started" — and nothing was
    named, for good. A pair that has lost everything for UNSTARTED_NS is judged."""
    from analytics.detect.silent_drop import UNSTARTED_NS

    def leaf_hole(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (HOSTS[s] == "leaf1" and d == 31), 0.0

    # its traces were silenced too (the leaf's route lookup fails before the TTL check)
    untraced = {k: v for k, v in _paths().items() if not leaf_hole(*k, v, 0.0)[0]}
    every = _run(leaf_hole, seconds=40, healthy_s=0, paths=untraced)
    first = next(i for i, o in enumerate(every) if o)
    assert UNSTARTED_NS / 1e9 <= first <= UNSTARTED_NS / 1e9 + 3, first
    (obs,) = every[-1]
    assert obs.evidence["switch"] == "leaf1" and obs.evidence["destinations"] == ["h3-1"]
    # A spine's standing blackhole silences its paths' traces as well: half of each pair's
    # paths lost, spine unknown. Not a leaf's drop (its paths through the other spine
    # deliver), whatever else it is.
    hole = blackhole("spine2", 31)
    untraced = {k: v for k, v in _paths().items() if not hole(*k, v, 0.0)[0]}
    said = [o for obs in _run(hole, seconds=40, healthy_s=0, paths=untraced) for o in obs]
    assert all(o.evidence["switch"] == "spine2" for o in said), [o.summary for o in said]


def test_a_spine_drop_standing_when_the_ops_box_restarts_is_placed_by_the_stored_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spine2 black-holes h3-1 and the ops box restarts: the drop silences those paths'
    traces, so the new detector never learnt their spine, and half of each pair's paths
    deliver — nothing was named, for good. The store holds the traces from before the
    drop: the new detector reads them at start and names the spine, the host and the link."""
    from analytics.store.store_writer import StoreWriter

    monkeypatch.setattr(records, "host_id", lambda name: {v: k for k, v in NAMES.items()}[name])
    config = DetectConfig(topology_file=str(_topology(tmp_path / "t.json")))
    answers = {ends: f"198.18.128.{2 * i + 1}" for i, ends in enumerate(BY_ENDS)}  # spine side
    paths = _paths()
    hole = blackhole("spine2", 31)
    traced_now = {k: v for k, v in paths.items() if not hole(*k, v, 0.0)[0]}

    def restarted(store: Path) -> tuple[int, list[dict]]:
        runner = DetectRunner(StoreWriter(store), config, host_names=lambda: NAMES)
        recalled = runner.recall_paths(T0)
        runner.paths.spine_of.update(traced_now)
        _drive(runner, hole, seconds=30)
        return recalled, [a for a in runner.live()["open"] if a["kind"] == "silent_drop"]

    assert restarted(tmp_path / "empty") == (0, [])  # nothing stored: the drop stays unplaced
    before = [(T0 - 120 * NS + i, s, d, p, 2, answers[(HOSTS[s], spine)])
              for i, ((s, d, p), spine) in enumerate(paths.items())]  # fmt: skip
    old = [(T0 - 900 * NS, 11, 31, 39999, 2, answers[("leaf1", "spine1")])]  # past RECALL_S
    schema = layout.TABLES["path_hop"].schema
    rows = before + old
    cols = {
        k: [r[i] for r in rows]
        for i, k in enumerate(("ts_ns", "src", "dst", "sport", "ttl", "hop"))
    }
    cols["rtt_ns"] = [50_000] * len(rows)
    store = tmp_path / "store"
    StoreWriter(store).write_partitioned(
        "path_hop", pa.table({f.name: cols[f.name] for f in schema}, schema=schema), "t.parquet"
    )
    recalled, (a,) = restarted(store)
    assert recalled == len(paths)
    assert (a["link"], a["evidence"]["switch"]) == ("leaf3-spine2", "spine2"), a["summary"]
    assert a["evidence"]["destinations"] == ["h3-1"], a["summary"]


def test_each_pairs_floor_is_its_least_delay_of_the_last_30_s_as_the_queue_check_needs() -> None:
    """The floor a queue's rise is measured from: a pair's least received delay over the
    last HISTORY_S of its judged probes (to the second), kept as probes are judged — a
    pair whose fastest probes are older than that has its floor risen, not stuck low."""
    from analytics.detect.silent_drop import HISTORY_S

    rng = np.random.default_rng(7)
    paths = _paths()
    drops = SilentDrops(HOSTS, BY_ENDS, paths, NAMES)
    got: list[dict[str, np.ndarray]] = []  # every probe received, with its delay
    for i in range(70):
        # h1-1 → h2-1 is fast (5 µs) in its first 10 s only; the rest wander
        def wander(s: int, d: int, p: int, spine: str, t: float, i: int = i) -> tuple[bool, float]:
            fast = (s, d) == (11, 21) and i < 10
            return bool(rng.random() < 0.05), -9_000.0 if fast else float(rng.integers(0, 50_000))

        tx, rx = _probes(float(i), wander)
        drops.feed("probe_tx", tx)
        drops.feed("probe_rx", rx)
        sent = dict(zip(tx["seq"].tolist(), tx["tx_ns"].tolist(), strict=True))
        t = np.array([sent[q] for q in rx["seq"].tolist()])
        got.append({"src": rx["src"], "dst": rx["dst"], "t": t, "delay": rx["rx_ns"] - t})
        a = {k: np.concatenate([g[k] for g in got]) for k in got[0]}
        stats = drops.path_stats()
        newest = int(tx["tx_ns"].max())
        for key, st in stats.items():
            pair = (a["src"] == key[0]) & (a["dst"] == key[1])
            exact = a["delay"][pair & (a["t"] >= newest - int(HISTORY_S * NS))]
            wider = a["delay"][pair & (a["t"] >= newest - int((HISTORY_S + 1) * NS))]
            assert wider.min() <= st["floor"] <= exact.min(), (i, key, st["floor"])
    fast = [st["floor"] for k, st in stats.items() if k[:2] == (11, 21)]
    assert fast and min(fast) > 5_000, fast  # the first 10 s (5 µs) long gone


def test_a_rack_whose_collectors_restart_together_is_not_its_leaf_dropping() -> None:
    """A deploy restarts the collectors five at a time, often a whole rack at once (the
    demo's re-run of deploy.yml paged "spine2 silently drops traffic", and a replay of it
    leaf1, leaf3 and leaf4): for two seconds those hosts send nothing and every probe to
    them is lost, while their own paths out, silent, lost nothing — so their leaf seemed
    to drop what went in. A host silent both ways is not judged; a spine that starts
    black-holing a host at the same moment still is."""
    restarts = {21: (11.0, 13.0), 22: (11.0, 13.0), 31: (12.0, 14.0)}

    def down(h: int, t: float) -> bool:
        a, b = restarts.get(h, (0.0, -1.0))
        return a <= t <= b

    def run(fault: Fault) -> list:
        paths = _paths()
        drops = SilentDrops(HOSTS, BY_ENDS, paths, NAMES)
        said, held = [], {}
        for i in range(24):
            tx, rx = _probes(float(i), fault)
            sent = np.array([not down(s, i) for s in tx["src"].tolist()], bool)
            # the senders ship a round later than the receivers: a path's lost probes
            # are judged before its next ones are known
            if held:
                drops.feed("probe_tx", held)
            held = {k: v[sent] for k, v in tx.items()}
            # a restarting host receives nothing
            got = np.array([not down(d, i) for d in rx["dst"].tolist()], bool)
            drops.feed("probe_rx", {k: v[got] for k, v in rx.items()})
            said += drops.observations(T0 + i * NS)
        return said

    said = [o.summary for o in run(healthy)]
    assert said == [], said
    hole = blackhole("spine2", 32)
    named = run(lambda s, d, p, y, t: hole(s, d, p, y, t) if t >= 12 else (False, 0.0))
    assert named, "the blackhole begun during the restarts was not named"
    assert {(o.evidence["switch"], tuple(o.evidence["destinations"])) for o in named} == {
        ("spine2", ("h3-2",))
    }, [o.summary for o in named]  # fmt: skip


def _random_share(share: float, where: Callable[[int, int, int, str], bool], seed: int = 7,
                  extra_ns: float = 0.0) -> Fault:  # fmt: skip
    """Each probe crossing ``where`` lost with probability ``share`` (a bad optic: every
    flow through it loses some, at random), the rest delayed ``extra_ns``."""
    import random

    rng = random.Random(seed)

    def f(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        if not where(s, d, p, spine):
            return False, 0.0
        return rng.random() < share, extra_ns

    return f


def _spine1_down_to_leaf2(s: int, d: int, p: int, spine: str) -> bool:
    return spine == "spine1" and HOSTS[d] == "leaf2" and HOSTS[s] != "leaf2"


def test_a_link_direction_dropping_a_random_share_of_its_packets_is_named_with_its_rate() -> None:
    """The demo lab, spine1 dropping a random 2 % of what it forwards to leaf2 (nftables
    numgen): 397 probes lost in 60 s, no path losing many in a row, every host under 1 %
    — no anomaly, and `clockmesh live` 16/16 healthy. RoCE's go-back-N makes such a link
    halve a job's throughput. Its link and direction are named, with the rate, once the
    loss has lasted GRAY_HOLD_NS; nothing else is named."""
    every = _run(_random_share(0.05, _spine1_down_to_leaf2), seconds=20)
    first = next(i for i, o in enumerate(every) if o)
    assert 10 + 6 <= first <= 10 + 10, first  # held 6 s from its first choice
    for obs in every[first:]:
        (o,) = obs
        assert o.kind == "silent_drop" and o.link == "leaf2-spine1", o.summary
        assert o.evidence["pattern"] == "random" and o.evidence["links"] == ["leaf2-spine1"]
        assert (o.evidence["direction"], o.evidence["leaf"]) == ("spine→leaf", "leaf2")
        assert 0.03 < o.evidence["packet_share"] < 0.07, o.evidence
        lo, hi = o.evidence["packet_share_95"]
        assert lo < o.evidence["packet_share"] < hi, o.evidence
        assert o.summary.startswith(
            "leaf2-spine1 (spine→leaf) silently drops about 5 % of the packets crossing it, "
            "at random"), o.summary  # fmt: skip
        assert o.summary.endswith("; out of service: leaf2-spine1"), o.summary
    # one summary while it stands (its counts, in the evidence, change every pass)
    assert len({o.summary for obs in every[first:] for o in obs}) == 1
    # its victims, in `clockmesh live` and the TUI: the pairs entering leaf2 from other racks
    seen = attribution.places([{"anomaly_id": "a", "link": o.link, "evidence": o.evidence}],
                              {"leaf2-spine1": "leaf2"})  # fmt: skip
    assert seen.enter == {"leaf2": ["a"]} and not seen.leave and not seen.host


def test_a_random_share_lost_with_a_queue_or_at_one_host_or_in_bursts_is_not_named() -> None:
    """A full queue drops at random too, and delays what it lets through (contention's), or
    is named by contention on a link of the same spine;
    a host whose collector's socket drops a share of what it receives is its own
    (``clockmesh live`` shows it lossy), as is one whose collector ships no count of
    them; the same share lost in a burst of two seconds is a hiccup."""
    queue = _random_share(0.05, _spine1_down_to_leaf2, extra_ns=300_000.0)
    every = _run(queue, seconds=20)
    assert not any(every), [o.summary for obs in every for o in obs][:1]
    own = _random_share(0.05, lambda s, d, p, spine: d == 21)
    for socket in (_socket_dropping(21), None):
        every = _run(own, seconds=20, host_access=ACCESS, socket=socket)
        assert not any(every), [o.summary for obs in every for o in obs][:1]
    burst = _random_share(0.5, _spine1_down_to_leaf2)
    every = _run(lambda s, d, p, y, t: burst(s, d, p, y, t) if t < 12 else (False, 0.0),
                 seconds=12)  # fmt: skip
    assert not any(every), [o.summary for obs in every for o in obs][:1]
    # contention named on a link-direction of that spine (the saturating bulk also fills
    # its sources' uplinks to it, with little delay in the lab): the queue's loss
    for named in (("leaf2-spine1", "spine→leaf"), ("leaf3-spine1", "leaf→spine")):
        every = _run(_random_share(0.05, _spine1_down_to_leaf2), seconds=20, contended={named})
        assert not any(every), (named, [o.summary for obs in every for o in obs][:1])
    every = _run(
        _random_share(0.05, _spine1_down_to_leaf2),
        seconds=20,
        contended={("leaf2-spine2", "spine→leaf")},
    )  # the other spine's: no matter
    assert every[-1] and every[-1][0].link == "leaf2-spine1", every[-1]
    sparse = _random_share(0.001, lambda s, d, p, spine: True)  # a healthy fabric's strays
    every = _run(sparse, seconds=20)
    assert not any(every), [o.summary for obs in every for o in obs][:1]


def _losing(counts: list[int], first: int | None = None, until: int = 1 << 30) -> Fault:
    """Through spine1 down to leaf2, ``counts[i % len(counts)]`` probes lost in the fault's
    i-th second (``first`` in its first, when given), one probe of a coded pair each, at
    random among the paths; none from second ``until`` on."""
    import random

    rng, seen, picks = random.Random(1), collections.Counter(), {}

    def f(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        sec = int(t) - 10
        if not _spine1_down_to_leaf2(s, d, p, spine) or sec >= until:
            return False, 0.0
        seen[sec] += 1
        if sec not in picks:
            n = first if sec == 0 and first is not None else counts[sec % len(counts)]
            picks[sec] = set(rng.sample(range(32), n))
        return seen[sec] % 2 == 1 and seen[sec] // 2 in picks[sec], 0.0

    return f


def _named_at(fault: Fault) -> int | None:
    every = _run(fault, seconds=30)
    return next((i for i, o in enumerate(every) if o), None)


def test_a_random_share_whose_first_second_loses_more_is_named_as_soon_as_a_steady_one() -> None:
    """At the detect lab's 15 % (~1.8 probes lost a second through the port) a second of 5
    among a fault's first dozen lost is chance, not a burst: named when the same share
    lost evenly is (it was held as a burst until diluted)."""
    steady = _named_at(_losing([2, 2, 1, 2, 1, 2, 2, 1]))
    assert steady is not None
    got = _named_at(_losing([2, 2, 1, 2, 1, 2, 2, 1], first=6))
    assert got is not None and got <= steady, (got, steady)


def test_a_random_share_whose_count_hovers_near_the_bar_is_named_and_an_ended_one_is_not() -> None:
    """The detect lab's 15 % of ~12 probes a second loses ~11.7 in the window's judged
    seconds, against the 10 a place must explain: the count dipped under 10 for over 3 s
    and the 6-s hold began again (named in 19.9 s and 23.8 s, the lab test's bound 20 s);
    in CI it stayed at 7-9 for 10 s, and the hold began only then (22.6 s). A place is
    held from its first pass with 5 lost (spread, at random, still losing), and named
    once it has explained 10 in one pass of its hold and held 6 s. ~1.3 lost a second was
    never named in 30 s. A loss that ended before it stood that long is not named; one
    still losing when it has is, and closes once it ended."""
    low, high = [1, 2, 1, 1, 2, 1, 2, 1, 1], [2, 2, 1, 2, 1, 2, 2, 1]
    got = _named_at(_losing(low))
    assert got is not None and got <= 10 + 11, got
    for rate in (low, high):
        # 9 s of loss: its lossy seconds reached 5 ~6.5 s in, and it ended before the
        # hold; the few left in the window do not keep it
        assert _named_at(_losing(rate, until=9)) is None, rate
        # 10 s: still losing in the newest judged seconds when held 6 s — named, and closed
        # once its window no longer holds the loss
        every = _run(_losing(rate, until=10), seconds=30)
        named = [i for i, o in enumerate(every) if o]
        assert named and named[0] <= 10 + 11 and named[-1] < 10 + 14, (rate, named)


def test_a_random_share_whose_count_stood_under_the_bar_is_named_once_it_reaches_it() -> None:
    """CI, 2026-12-07: the detect lab's 15 % through one spine port lost 7-9 probes in the
    window for 10 s, a random share's count under the 10 a place must explain, then 10:
    the 6-s hold began there and it was named 22.6 s after its onset (bound 20 s). Here
    one probe a second for 10 s, then two: held while it lost 5 or more, spread and at
    random, it is named on reaching 10 (the old rule: 6 s later, at 29)."""
    got = _named_at(_losing([1] * 10 + [2] * 30))
    assert got is not None and got <= 10 + 14, got
    # one a second throughout never reaches the bar: held, never named
    assert _named_at(_losing([1] * 40)) is None


def test_a_second_is_a_burst_only_beyond_what_chance_gives_a_random_share() -> None:
    # its rate from the other seconds since the first lossy one: 6 beside ~1.5 a second
    # is chance (p ~ 0.005 a second); 12 beside 2.5, or 30 beside 1, is a burst
    assert not in_a_burst(np.array([0, 0, 0, 6, 1, 2, 1, 2]))
    assert not in_a_burst(np.array([0, 0, 0, 5, 2, 3, 1, 1]))
    assert in_a_burst(np.array([0, 0, 0, 12, 2, 3, 2, 3]))
    assert in_a_burst(np.array([0, 0, 30, 1, 1, 0, 1, 1]))
    assert in_a_burst(np.array([0, 0, 0, 0, 0, 0, 0, 9]))
    # no second over 40 % of the loss: spread, whatever chance says
    assert not in_a_burst(np.array([2, 2, 9, 2, 2, 3, 2, 2]))
    assert not in_a_burst(np.zeros(8, np.int64))


ACCESS = {h: f"{NAMES[h]}-{leaf}" for h, leaf in HOSTS.items()}  # h2-1-leaf2, ...


def test_a_host_whose_sends_are_dropped_at_random_is_named_on_its_link_out_as_the_culprit() -> None:
    """The demo lab, h2-1's way out dropping a third of what it sends (a tbf at its port:
    a dirty optic drops one direction likewise): every pair out of h2-1 lost ~29 %,
    nothing into it — no anomaly, only h2-1 "lossy" in `clockmesh live`. Its link is named,
    host→leaf, with the rate, h2-1 its culprit, once the loss has lasted GRAY_HOLD_NS."""
    every = _run(_random_share(0.05, lambda s, d, p, spine: s == 21), seconds=20,
                 host_access=ACCESS)  # fmt: skip
    first = next(i for i, o in enumerate(every) if o)
    assert 10 + 6 <= first <= 10 + 10, first  # held 6 s from its first choice
    for obs in every[first:]:
        (o,) = obs
        assert o.kind == "silent_drop" and o.link == "h2-1-leaf2", o.summary
        assert (o.evidence["host"], o.evidence["direction"]) == ("h2-1", "host→leaf")
        assert o.evidence["links"] == [] and o.evidence["destinations"] == [], o.evidence
        assert o.evidence["candidates"] == ["h2-1-leaf2 (host→leaf)", "h2-1's NIC (sending)"]
        assert 0.03 < o.evidence["packet_share"] < 0.07, o.evidence
        head, said, tail = re.fullmatch(r"(.*) about ([\d.]+) %( of .*)", o.summary).groups()
        assert head == "h2-1-leaf2 (host→leaf) silently drops", o.summary
        assert tail.startswith(" of what h2-1 sends, at random"), o.summary
        lo, hi = o.evidence["packet_share_95"]  # the rate said is one its count allows
        assert said in ("4", "5", "6") and lo <= float(said) / 100 <= hi, o.evidence
    assert len({o.summary for obs in every[first:] for o in obs}) == 1
    # in `clockmesh live` and the TUI: h2-1 the culprit, every pair out of it explained
    seen = attribution.places([{"anomaly_id": "a", "link": "h2-1-leaf2",
                                "evidence": every[-1][0].evidence}], {})  # fmt: skip
    assert seen.host == {"h2-1": ["a"]} and not seen.leave and not seen.enter
    assert seen.explained_by("h2-1", "h3-2", "leaf2", "leaf3") == ["a"]
    # without a topology, the host's port by its name
    every = _run(_random_share(0.05, lambda s, d, p, spine: s == 21), seconds=20)
    assert every[-1] and every[-1][0].summary.startswith("h2-1's port (sending) silently")
    # drained by a remediation: dealt with, not paged again while it stays drained
    every = _run(_random_share(0.05, lambda s, d, p, spine: s == 21), seconds=20,
                 host_access=ACCESS, drained={"h2-1"})  # fmt: skip
    assert not any(every), [o.summary for obs in every for o in obs][:1]


def _socket_dropping(host: int) -> Callable[[int, float], int]:
    """``host``'s collector socket dropping 3 datagrams a second from t = 10 s on."""
    return lambda h, t: 3 * int(t - 9) if h == host and t >= 10 else 0


def test_a_host_link_dropping_at_random_into_the_host_or_both_ways_is_named_on_it() -> None:
    """A dirty optic or cable drops one direction of a host's link, or both: every peer's
    flows to it lose some (and, both ways, its flows to them) — no anomaly before, only
    h2-1 "lossy" in `clockmesh live`. Its link is named with the way and the rate, h2-1 the
    culprit; what it receives only while its collector's socket dropped none of it."""
    for who, way, says in ((lambda s, d: d == 21, "leaf→host", "of what is sent to h2-1, "
                            "at random: its peers' flows to it lose some, none many in a "
                            "row, while what it sends arrives"),
                           (lambda s, d: 21 in (s, d), "both ways", "of what h2-1 sends and "
                            "receives, at random: its flows with its peers lose some both "
                            "ways")):  # fmt: skip
        share = _random_share(0.05, lambda s, d, p, spine, who=who: who(s, d))
        every = _run(share, seconds=20, host_access=ACCESS)
        first = next(i for i, o in enumerate(every) if o)
        assert 10 + 6 <= first <= 10 + 10, (way, first)
        for obs in every[first:]:
            (o,) = obs
            assert o.kind == "silent_drop" and o.link == "h2-1-leaf2", o.summary
            assert (o.evidence["host"], o.evidence["direction"]) == ("h2-1", way)
            assert o.evidence["candidates"][0] == f"h2-1-leaf2 ({way})", o.evidence
            head, said, tail = re.fullmatch(r"(.*) about ([\d.]+) % (.*)", o.summary).groups()
            assert head == f"h2-1-leaf2 ({way}) silently drops" and tail.startswith(says), tail
            lo, hi = o.evidence["packet_share_95"]
            assert said in ("4", "5", "6") and lo <= float(said) / 100 <= hi, o.evidence
        # in `clockmesh live` and the TUI: h2-1 the culprit, its peers' pairs explained
        seen = attribution.places([{"anomaly_id": "a", "link": "h2-1-leaf2",
                                    "evidence": every[-1][0].evidence}], {})  # fmt: skip
        assert seen.host == {"h2-1": ["a"]}
        assert seen.explained_by("h3-2", "h2-1", "leaf3", "leaf2") == ["a"]
        # its collector's socket dropping meanwhile: its own loss, maybe, not its link's
        every = _run(share, seconds=20, host_access=ACCESS, socket=_socket_dropping(21))
        assert not any(every), [o.summary for obs in every for o in obs][:1]
    # what it sends is no socket's: named whatever its socket drops
    out = _random_share(0.05, lambda s, d, p, spine: s == 21)
    every = _run(out, seconds=20, host_access=ACCESS, socket=_socket_dropping(21))
    assert every[-1] and every[-1][0].evidence["direction"] == "host→leaf", every[-1]


def test_a_collectors_socket_count_reads_as_its_drops_since_a_time() -> None:
    """rx_kernel_drops is cumulative: a constant count (drops long ago) is no drop now, a
    collector restarted counts from 0 again, and no count since then is not "none"."""
    drops = SilentDrops(HOSTS, BY_ENDS, _paths(), NAMES)
    t = np.arange(10) * NS
    drops.feed_socket(t, np.full(10, 11), np.full(10, 4))
    # restarted at 6 s, one dropped at 8 s; shipped out of order: read in time order
    drops.feed_socket(t[::-1], np.full(10, 21), np.array([1, 1, 0, 0, 5, 5, 5, 5, 5, 5]))
    assert drops.socket_dropped(11, 5 * NS) == 0
    assert drops.socket_dropped(21, 2 * NS) == 1
    assert drops.socket_dropped(21, 9 * NS) == 1  # (from the sample 2 s before)
    assert drops.socket_dropped(21, 12 * NS) is None  # nothing shipped since 12 s
    assert drops.socket_dropped(31, 0) is None


def test_a_hosts_loss_to_two_peers_only_is_not_its_link() -> None:
    """The same share lost only to two of its peers: those pairs', not its port (it sends
    to ten)."""
    two = _random_share(0.3, lambda s, d, p, spine: s == 21 and d in (31, 32))
    every = _run(two, seconds=20, host_access=ACCESS)
    assert not any(o.evidence.get("host") for obs in every for o in obs), [
        o.summary for obs in every for o in obs][:1]  # fmt: skip


def _cut_off(host: int, since_in: float = 1e9) -> Fault:
    """Nothing ``host`` sends arrives from t = 10 s on (its NIC stopped sending, its link
    up) — nor, from ``since_in`` on, anything sent to it (its leaf's ARP entry for it aged
    out: nothing answers the leaf's ARP)."""

    def f(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (s == host and t >= 10) or (d == host and t >= since_in), 0.0

    return f


def _port_of(host: int, rx: int, tx: int, state: int = 6) -> Port:
    """Every port up, counting 120 packets a second each way — but ``host``'s, from 10 s on,
    ``rx`` in and ``tx`` out (and ``state``)."""
    return lambda h, t: (rx, state, tx) if h == host and t >= 10 else (120, 6, 120)


def test_a_host_whose_nic_sends_nothing_link_up_is_named_cut_off_as_the_culprit() -> None:
    """The demo lab, an nftables rule dropping all h2-1 sends (its NIC's transmit hung, as
    far as the fabric can tell): every pair out of it lost all, and 30 s later, its leaf's
    ARP entry for it gone, every pair into it too — no anomaly; 15 of 16 hosts "lossy"
    in `clockmesh live`, h2-1 among them. Now one anomaly on its access link from the
    first stage to the second, h2-1 the culprit, its NIC named first (its port counted
    nothing out)."""
    every = _run(_cut_off(21, since_in=24), seconds=20, host_access=ACCESS,
                 port=_port_of(21, rx=120, tx=0))  # fmt: skip
    first = next(i for i, o in enumerate(every) if o)
    assert 10 + 6 <= first <= 10 + 10, first  # held LINK_HOLD_NS: a full queue would show
    ways = []
    for obs in every[first:]:
        (o,) = obs
        assert (o.kind, o.key, o.link) == ("silent_drop", "h2-1-leaf2 (host cut off)",
                                           "h2-1-leaf2"), o  # fmt: skip
        e = o.evidence
        assert e["host"] == "h2-1" and e["port_tx_packets"] == {"h2-1": 0}, e
        assert e["candidates"][0] == "h2-1's NIC (sending)", e
        ways.append(e["direction"])
    # one way until the loss into it has lasted long enough to be judged, then both
    n = ways.index("both ways")
    assert set(ways[:n]) == {"host→leaf"} and set(ways[n:]) == {"both ways"}, ways
    assert first + n <= 24 + 4, (first, ways)
    assert every[first][0].summary == (
        "h2-1 is cut off from the fabric, its link h2-1-leaf2 up: nothing it sends arrives, "
        "while what it receives arrives; its port counted (almost) nothing out over 3 s: its "
        "NIC is not sending (a hung transmit queue), or the host's own filter or egress queue "
        "drops it"
    )
    assert e["pattern"] == "every packet", e
    assert every[-1][0].summary.startswith(
        "h2-1 is cut off from the fabric, its link h2-1-leaf2 up: nothing it sends arrives "
        "and nothing sent to it arrives;"
    ), every[-1][0].summary
    # its peers are the affected, not fourteen more culprits: every pair to or from it
    seen = attribution.places([{"anomaly_id": "a", "link": "h2-1-leaf2",
                                "evidence": every[-1][0].evidence}], {})  # fmt: skip
    assert seen.host == {"h2-1": ["a"]} and not seen.leave and not seen.enter
    assert seen.explained_by("h3-2", "h2-1", "leaf3", "leaf2") == ["a"]
    assert seen.explained_by("h3-2", "h1-1", "leaf3", "leaf1") == []
    # lost at random, but most of it: its rate as it is, never "100 %"
    every = _run(_random_share(0.8, lambda s, d, p, spine: s == 21), seconds=20,
                 host_access=ACCESS)  # fmt: skip
    said = {(float(o.summary.split(" silently drops about ")[1].split(" %")[0]) / 100,
             *o.evidence["packet_share_95"]) for obs in every for o in obs}  # fmt: skip
    assert said and all(0.7 <= q <= 0.85 and lo <= q <= hi for q, lo, hi in said), said
    # what it sent counted out of its port: its cable, optic or leaf port first
    every = _run(_cut_off(21), seconds=20, host_access=ACCESS,
                 port=_port_of(21, rx=120, tx=150))  # fmt: skip
    e = every[-1][0].evidence
    assert e["candidates"] == ["h2-1-leaf2 (host→leaf)", "h2-1's NIC (sending)"], e
    assert "its port counted it out: h2-1-leaf2's optic or cable" in every[-1][0].summary


def test_a_host_almost_all_of_whose_sends_are_lost_is_cut_off_said_almost() -> None:
    """A trickle gets through (the demo lab, h3-3's own egress shaped to 8 kbit/s: a probe
    now and then): too many lost for the random-share rule (its 95 % interval above 90 %),
    not every one for the cut-off's — it was named only after 39 s, once its leaf's ARP
    entry for it aged out, 12 hosts "lossy" meanwhile. Now named as soon as a host losing
    every probe, said "(almost)", one summary throughout; 90 % lost is the random-share
    rule's, not this one's."""
    every = _run(_random_share(0.99, lambda s, d, p, spine: s == 21), seconds=20,
                 host_access=ACCESS, port=_port_of(21, rx=120, tx=2))  # fmt: skip
    first = next(i for i, o in enumerate(every) if o)
    assert 10 + 6 <= first <= 10 + 10, first
    named = [o for obs in every[first:] for o in obs]
    assert {o.key for o in named} == {"h2-1-leaf2 (host cut off)"}, {o.key for o in named}
    assert {o.summary for o in named} == {
        "h2-1 is cut off from the fabric, its link h2-1-leaf2 up: (almost) nothing it sends "
        "arrives, while what it receives arrives; its port counted (almost) nothing out over "
        "3 s: its NIC is not sending (a hung transmit queue), or the host's own filter or "
        "egress queue drops it"
    }, {o.summary for o in named}
    assert named[-1].evidence["pattern"] == "almost every packet", named[-1].evidence
    # the trickle counted out by its port (its own egress queue lets it out), near the
    # threshold between its NIC's side and its optic's: one cause said, the first
    every = _run(_random_share(0.99, lambda s, d, p, spine: s == 21), seconds=20,
                 host_access=ACCESS,
                 port=lambda h, t: (120, 6, 20 + 40 * (int(t) % 2)) if h == 21 and t >= 10
                 else (120, 6, 120))  # fmt: skip
    said = {o.summary.split("; ")[1] for obs in every for o in obs}
    assert said == {"its port counted only part of what it sent out over 3 s: its NIC is not "
                    "sending (a hung transmit queue), or the host's own filter or egress queue "
                    "drops it"}, said  # fmt: skip
    every = _run(_random_share(0.9, lambda s, d, p, spine: s == 21), seconds=20,
                 host_access=ACCESS, port=_port_of(21, rx=120, tx=12))  # fmt: skip
    assert not any(o.key.endswith("(host cut off)") for obs in every for o in obs), [
        o.summary for obs in every for o in obs][:1]  # fmt: skip


def test_a_host_cut_off_is_not_named_while_its_link_is_down_or_drained_or_unknown() -> None:
    """Its link down: a flap's (the flap detector's); drained by a remediation: dealt with;
    its port's counters never seen, or no topology: not known to be up."""
    for kw in ({"port": _port_of(21, rx=0, tx=0, state=2), "host_access": ACCESS},
               {"port": _port_of(21, rx=120, tx=0), "host_access": ACCESS,
                "drained": {"h2-1"}},
               {"host_access": ACCESS},
               {"port": _port_of(21, rx=120, tx=0)}):  # fmt: skip
        every = _run(_cut_off(21, since_in=24), seconds=20, **kw)  # type: ignore[arg-type]
        assert not any(every), (kw.keys(), [o.summary for obs in every for o in obs][:1])


def _deaf(host: int, since_out: float = 1e9) -> Fault:
    """Nothing sent to ``host`` arrives from t = 10 s on, though its port counts it in (its
    own filter drops it) — nor, from ``since_out`` on, anything it sends (its ARP entry
    for its gateway aged out: the leaf's answers are dropped too)."""

    def f(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (d == host and t >= 10) or (s == host and t >= since_out), 0.0

    return f


def test_a_host_that_drops_all_sent_to_it_is_named_the_culprit_not_its_fifteen_peers() -> None:
    """h2-1's own filter drops everything it receives, its port counting it in: every peer
    loses what it sends to h2-1 — in `clockmesh live` each of them "lossy" and nothing
    named. Now one anomaly on h2-1's access link, h2-1 the culprit and its peers affected,
    its port's count in the evidence (a reader tells a filter on the probes alone, its
    port counting a job's traffic in, from the host taking in nothing); once h2-1 can no
    longer send either (its gateway's ARP answer dropped as well), the same anomaly says
    both ways."""
    every = _run(_deaf(21, since_out=24), seconds=20, host_access=ACCESS,
                 port=_port_of(21, rx=120, tx=120))  # fmt: skip
    first = next(i for i, o in enumerate(every) if o)
    assert 10 + 6 <= first <= 10 + 10, first  # held LINK_HOLD_NS, as a host cut off
    ways = []
    for obs in every[first:]:
        (o,) = obs
        assert (o.kind, o.key, o.link) == ("silent_drop", "h2-1-leaf2 (host cut off)",
                                           "h2-1-leaf2"), o  # fmt: skip
        assert o.evidence["host"] == "h2-1", o.evidence
        ways.append(o.evidence["direction"])
    n = ways.index("both ways")
    assert n and set(ways[:n]) == {"leaf→host"} and set(ways[n:]) == {"both ways"}, ways
    o = every[first][0]
    assert o.summary == (
        "h2-1 takes in nothing sent to it, its link h2-1-leaf2 up: every probe its peers send "
        "it is lost, while what it sends arrives; its port counted them in, so they reached "
        "it: the host drops them itself (its own filter, its NIC's receive ring, or its "
        "collector not reading)"
    ), o.summary
    assert len({o.summary for obs in every[first:] for o in obs[:1]}) == 2  # one a way
    e = o.evidence
    assert e["candidates"][0] == "h2-1's own filter" and e["port_rx_packets"] == {"h2-1": 360}
    assert e["peers_unreached"] == 5 and {p.split("→")[1] for p in e["pairs"]} == {"h2-1"}, e
    # its peers are affected, h2-1 the culprit
    seen = attribution.places([{"anomaly_id": "a", "link": "h2-1-leaf2", "evidence": e}], {})
    assert seen.host == {"h2-1": ["a"]} and seen.explained_by("h3-2", "h2-1", "leaf3",
                                                              "leaf2") == ["a"]  # fmt: skip
    # its leaf's ARP requests unanswered, the leaf stops sending to it (its port counts
    # only those): still the host's, one anomaly — never its leaf "dropping" traffic to it
    every = _run(_deaf(21), seconds=24, host_access=ACCESS,
                 port=lambda h, t: (1 if t >= 24 else 120, 6, 120) if h == 21 and t >= 10
                 else (120, 6, 120))  # fmt: skip
    named = [obs for obs in every if obs]
    assert len(named) >= 12 and all(len(obs) == 1 for obs in named), named[:1]
    assert {o.key for obs in named for o in obs} == {"h2-1-leaf2 (host cut off)"}
    assert {o.evidence["direction"] for obs in named for o in obs} == {"leaf→host"}
    assert len({o.summary for obs in named for o in obs}) == 1  # the count comes and goes

    # healed at 30 s: what is sent to it arrives at once, its own sends from 32 s (its
    # gateway resolved again) — never "nothing it sends arrives, while what it receives
    # arrives" on the way out (the demo lab said so for the 60 s the anomaly stayed open)
    def healed(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return (d == 21 and 10 <= t < 30) or (s == 21 and 24 <= t < 32), 0.0

    every = _run(healed, seconds=30, host_access=ACCESS, port=_port_of(21, rx=120, tx=120))
    ways = [o.evidence["direction"] for obs in every for o in obs]
    assert ways and set(ways) == {"leaf→host", "both ways"}, ways
    assert not any(every[10 + 24 :]), [o.summary for obs in every[10 + 24 :] for o in obs][:1]
    # its port counting (nearly) nothing in: its leaf drops it, a switch's place, not the host
    every = _run(_deaf(21), seconds=20, host_access=ACCESS, port=_port_of(21, rx=1, tx=120))
    assert every[-1] and not any(o.evidence.get("host") for obs in every for o in obs)
    assert every[-1][0].evidence["switch"] == "leaf2", every[-1][0].summary
    # its link down (a flap's), drained, its port unknown, or its own sends lost too from the
    # start (a host losing both ways at random is its own, as before): not this
    for kw in ({"port": _port_of(21, rx=0, tx=0, state=2), "host_access": ACCESS},
               {"port": _port_of(21, rx=120, tx=120), "host_access": ACCESS,
                "drained": {"h2-1"}},
               {"host_access": ACCESS},
               {"port": _port_of(21, rx=120, tx=120)}):  # fmt: skip
        every = _run(_deaf(21), seconds=20, **kw)  # type: ignore[arg-type]
        assert not any(o.evidence.get("host") for obs in every for o in obs), (
            kw.keys(), [o.summary for obs in every for o in obs][:1])  # fmt: skip

    # only two peers' probes to it lost: those pairs', not the host
    def two(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return d == 21 and s in (31, 32) and t >= 10, 0.0

    every = _run(two, seconds=20, host_access=ACCESS, port=_port_of(21, rx=120, tx=120))
    assert not any(o.evidence.get("host") for obs in every for o in obs), [
        o.summary for obs in every for o in obs][:1]  # fmt: skip


def test_a_host_losing_what_it_sends_to_two_peers_only_is_not_cut_off() -> None:
    """All h2-1 sends to h3-1 and h3-2 lost (a spine's or their leaf's, not its NIC's):
    not the host cut off."""

    def two(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        return s == 21 and d in (31, 32) and t >= 10, 0.0

    every = _run(two, seconds=20, host_access=ACCESS, port=_port_of(21, rx=120, tx=120))
    assert not any(o.evidence.get("host") for obs in every for o in obs), [
        o.summary for obs in every for o in obs][:1]  # fmt: skip


def _queue_peaks(share: float, where: Callable[[int, int, int, str], bool], late_ns: float,
                 optic: float = 0.0, seed: int = 7) -> Fault:  # fmt: skip
    """Healthy jobs on a shallow buffer: a ``share`` of the coded pairs crossing ``where``
    meet its queue at a peak — one probe waits ``late_ns``, the other is dropped (the
    buffer is full) — the path's median flat. ``optic``: a bad optic there too, losing
    that share of every probe at random."""
    import random

    rng = random.Random(seed)
    peak: dict[tuple[int, int, int, float], bool] = {}

    def f(s: int, d: int, p: int, spine: str, t: float) -> tuple[bool, float]:
        if not where(s, d, p, spine):
            return False, 0.0
        k = (s, d, p, t)
        if k not in peak:  # the pair's first probe: it waits in the queue at its peak
            peak[k] = rng.random() < share
            return rng.random() < optic, late_ns if peak[k] else 0.0
        return peak.pop(k) or rng.random() < optic, 0.0  # ... and the queue drops its twin

    return f


def test_probes_lost_beside_a_queue_s_peak_are_not_a_random_share() -> None:
    """The detect lab module, healthy RoCE v2 jobs on 500-µs buffers (2026-12-05): leaf2
    lost 13 of 518 probes in 8 s, the paths' medians flat, and was paged as dropping
    "about 2 % at random (a bad optic)". 8 of the 13 had a twin — its coded pair, sent
    0.1 ms apart on the same path — received 135-224 µs late: the buffer was full. A bad
    optic on a link as busy is still named, with its rate."""
    every = _run(_queue_peaks(0.1, _spine1_down_to_leaf2, 150_000.0), seconds=20)
    assert not any(every), [o.summary for obs in every for o in obs][:1]
    # under the floor: a healthy path's jitter, not a queue — the share is named
    every = _run(_queue_peaks(0.1, _spine1_down_to_leaf2, 20_000.0), seconds=20)
    assert every[-1] and every[-1][0].link == "leaf2-spine1", every[-1]
    # a bad optic on the busy link: its losses have twins as late as any other probe's
    every = _run(_queue_peaks(0.1, _spine1_down_to_leaf2, 150_000.0, optic=0.05), seconds=20)
    (o,) = every[-1]
    assert o.link == "leaf2-spine1" and o.evidence["pattern"] == "random", o.summary
    assert (o.evidence["direction"], o.evidence["leaf"]) == ("spine→leaf", "leaf2")
    assert 0.03 < o.evidence["packet_share"] < 0.08, o.evidence


def test_the_rate_said_stays_as_it_was_once_the_loss_ends() -> None:
    """The demo lab, a host link's 5 % healed: its anomaly, open until it cleared, said
    "about 3 %" — the share of a window the heal diluted a little more each second. A
    page goes on saying the rate it had while it lost."""
    for seed in (1, 2, 3):
        share = _random_share(0.2, _spine1_down_to_leaf2, seed=seed)
        every = _run(lambda s, d, p, y, t, f=share: f(s, d, p, y, t) if t < 32 else (False, 0.0),
                     seconds=40)  # fmt: skip
        said = [o.summary.split(" about ")[1].split(" %")[0]
                for obs in every[10 + 21 :] for o in obs]  # fmt: skip
        assert len(said) >= 4 and len(set(said)) == 1, (seed, said)


def test_the_rate_a_summary_says_is_a_whole_step_inside_its_interval() -> None:
    """The demo's 1 % read 1.68 % in one 8-s window (41 of 2,434): "about 2 %" — and the
    95 % interval beside the count says how far to trust it. The rate said is never
    outside that interval: a hand-made 4 % measured 3.7 % [3.0, 4.5] was "about 5 %"."""
    from analytics.detect.silent_drop import interval95, said_rate

    lo, hi = interval95(41, 2434)
    assert 0.012 < lo < 0.0169 < hi < 0.023, (lo, hi)
    assert said_rate(41 / 2434, lo, hi) == 0.02
    assert said_rate(0.037, 0.030, 0.045) == 0.04
    # every count's said rate is inside its own interval
    for sent in (50, 300, 2434, 100_000):
        for lost in range(1, sent, max(1, sent // 97)):
            lo, hi = interval95(lost, sent)
            assert lo <= said_rate(lost / sent, lo, hi) <= hi, (lost, sent)
    # a whole step of its decade where the interval holds one, the nearest to the count
    assert [said_rate(q, q * 0.8, q * 1.25) for q in (0.0248, 0.04, 0.0033, 0.29, 0.77)] == [
        0.02, 0.04, 0.003, 0.3, 0.8]  # fmt: skip
    # ... else the count to two figures: a host's way out losing 77 % was "about 100 %"
    assert said_rate(0.15, 0.13, 0.17) == 0.15 and said_rate(0.037, 0.036, 0.038) == 0.037
    assert interval95(0, 100)[0] == 0.0 and interval95(100, 100)[1] == 1.0
