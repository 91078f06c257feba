"""FabricPaths takes a commit's trace answers in bulk: the same as one by one, in time order."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from analytics.detect.paths import FabricLink, FabricPaths
from collector import records


class _OneByOne(FabricPaths):
    """Every answer through ``_trace`` in send-time order: what ``feed`` must equal."""

    def feed(self, rows: np.ndarray) -> None:
        rows = rows[np.argsort(rows["ts_ns"], kind="stable")]
        for ts, src, dst, sport, hop in zip(
            rows["ts_ns"].tolist(), rows["src"].tolist(), rows["dst"].tolist(),
            rows["sport"].tolist(), rows["hop"].tolist(), strict=True,
        ):  # fmt: skip
            address = hop.decode(errors="replace")
            lk = self.by_hop.get(address)
            x, z = self.host_rack.get(src, ""), self.host_rack.get(dst, "")
            if lk is None or not x or not z:
                self._mismatch(address if lk is None else "", src if not x else dst if not z else 0)
                continue
            self._trace(ts, x, z, (src, dst, sport), lk.spine)


def _state(fp: FabricPaths) -> tuple:
    gone = {
        k: (g.since_ns, sorted(g.avoided), sorted(g.moved), g.still_ns) for k, g in fp.gone.items()
    }
    links = {n: repr(dataclasses.asdict(s)) for n, s in fp.state.items()}
    return (
        dict(fp.spine_of), fp.spine_of.version, dict(fp.traced_ns), dict(fp.last_seen),
        {k: sorted(v) for k, v in fp.spines.items() if v}, gone, fp.newest_ns, links,
        dict(fp.returned), dict(fp.moved_at), dict(fp.unknown_hops),
    )  # fmt: skip


def _observed(fp: FabricPaths, now: int) -> list:
    return [
        (o.kind, o.key, o.summary, repr(sorted(o.evidence.items()))) for o in fp.observations(now)
    ]


def _run(seed: int) -> tuple[int, int, int]:
    """A random fabric whose links go down and come back while its hosts trace (ECMP over
    the spines both ends still reach; now and then the topology places a host anew),
    answers fed in commits of random size to both;
    returns (answers, answers taken one by one by the bulk feed, observations)."""
    rng = random.Random(seed)
    racks, spines, hosts = rng.randint(2, 5), rng.randint(2, 4), rng.randint(4, 12)

    def address(r: int, u: int) -> str:
        return f"10.{u}.0.{r}"

    links = [FabricLink(f"leaf{r}-spine{u}", f"leaf{r}", f"spine{u}", address(r, u))
             for r in range(racks) for u in range(spines)]  # fmt: skip
    ids = [1000 + i for i in range(hosts)]
    rack = {ids[i]: f"leaf{i % racks}" for i in range(hosts)}
    if rng.random() < 0.2:
        rack.pop(ids[-1])  # a host the topology lacks
    bulk, ref = FabricPaths(links, dict(rack)), _OneByOne(links, dict(rack))
    taken = [0]
    trace = bulk._trace

    def counted(*args):  # type: ignore[no-untyped-def]
        taken[0] += 1
        return trace(*args)

    bulk._trace = counted  # type: ignore[method-assign]
    keys = [(ids[i], ids[j], 40000 + p) for i in range(hosts) for j in range(hosts)
            if i % racks != j % racks for p in range(4)]  # fmt: skip
    down: set[tuple[int, int]] = set()
    t, answers, observed = 10**18, 0, 0
    for _ in range(rng.randint(20, 80)):
        event = rng.random()
        if event < 0.08:
            down.add((rng.randrange(racks), rng.randrange(spines)))
        elif event < 0.16 and down:
            down.discard(rng.choice(sorted(down)))
        elif event < 0.18 and ids[0] in bulk.host_rack:  # the topology re-read: a host moved
            moved = f"leaf{rng.randrange(racks)}"
            bulk.host_rack[ids[0]] = ref.host_rack[ids[0]] = moved
        rows = np.zeros(rng.randint(0, 120), records.PATH_HOP)
        for row in rows:
            src, dst, sport = rng.choice(keys)
            x, z = ids.index(src) % racks, ids.index(dst) % racks
            group = [u for u in range(spines) if (x, u) not in down and (z, u) not in down]
            group = group or list(range(spines))
            u = group[(src * 7 + dst * 13 + sport + len(group)) % len(group)]
            hop = address(x, u) if rng.random() > 0.01 else "10.99.9.9"  # 1 %: no such link
            row["ts_ns"] = t + rng.randint(0, 500_000_000)
            row["src"], row["dst"], row["sport"], row["hop"] = src, dst, sport, hop.encode()
        t += rng.randint(100_000_000, 600_000_000)
        bulk.feed(rows.copy())
        ref.feed(rows.copy())
        answers += len(rows)
        assert _state(bulk) == _state(ref), seed
        if rng.random() < 0.7:
            said = _observed(ref, t)
            assert _observed(bulk, t) == said, seed
            assert _state(bulk) == _state(ref), seed
            observed += len(said)
    return answers, taken[0], observed


def test_answers_taken_in_bulk_leave_what_one_by_one_leaves() -> None:
    answers = taken = observed = 0
    for seed in range(40):
        a, t, o = _run(seed)
        answers, taken, observed = answers + a, taken + t, observed + o
    assert observed > 500  # links were found down, flapping, back
    assert taken < 0.75 * answers  # and most answers took the bulk way
