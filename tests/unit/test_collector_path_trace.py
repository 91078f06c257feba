"""Path tracing's watch: which 5-tuples are traced between rounds (no sockets needed)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import yaml

from collector import config as config_mod
from collector import records
from collector.config import Peer
from collector.lab_clock import RecordingClock
from collector.path_trace import PathTracer
from collector.record_buffer import RecordBuffer

A, B = "10.9.0.1", "10.9.0.3"  # the two spines' addresses on this host's leaf's uplinks


def _tracer(tmp_path: Path) -> PathTracer:
    doc = {"host": "t1", "rack": "r1", "backend": {"address": "127.0.0.1"},
           "probe": {"base_sport": 40000, "watch_interval_s": 0.2},
           "ingest": {"url": "http://127.0.0.1:1"}}  # fmt: skip
    (tmp_path / "c.yml").write_text(yaml.safe_dump(doc))
    cfg = config_mod.load(tmp_path / "c.yml")
    buffers = {t: RecordBuffer(t) for t in records.TABLES}
    tracer = PathTracer(cfg, RecordingClock(None), buffers, Counter())
    tracer.set_buddies([Peer(name="t2", address="127.0.0.2", rack="r2"),
                        Peer(name="t3", address="127.0.0.3", rack="r3")])  # fmt: skip
    return tracer


def test_the_watch_follows_every_racks_path_through_each_uplink(tmp_path: Path) -> None:
    """A leaf drops a spine from its group towards one rack when a link at that rack fails
    (the spine withdraws that rack alone): the watch traces a 5-tuple towards every rack
    across each uplink router, so such a move is seen within a watch interval, not only at
    the next round (the reroute of that path in use was bounded by the round)."""
    t = _tracer(tmp_path)
    t2, t3 = records.host_id("t2"), records.host_id("t3")
    now = time.monotonic()
    for dst in (t2, t3):  # a round: ports 0, 2 on spine A, 1, 3 on spine B, to both racks
        for p in range(4):
            t._answered(dst, 40000 + p, A if p % 2 == 0 else B)
    # rack r2's and rack r3's path through each spine
    assert t.watched(now) == sorted([(t2, 40000), (t2, 40001), (t3, 40000), (t3, 40001)])
    assert not t.path_changed
    # rack r3's link to spine A fails: this leaf drops A towards r3 only; the watch's
    # trace of r3's 5-tuple across A shows it on B
    t._answered(t3, 40000, B)
    assert t.path_changed and t.stats["path_changes"] == 1
    # watched until it is back on A; r3's path through B keeps its watch
    assert (t3, 40000) in t.watched(now) and (t3, 40001) in t.watched(now)
    t._answered(t3, 40002, B)  # the re-trace: every 5-tuple of r3 on B
    t._answered(t3, 40000, A)  # back
    assert t._moved == {} and t.watched(now) == sorted(
        [(t2, 40000), (t2, 40001), (t3, 40000), (t3, 40001)]
    )


def test_the_loop_wakes_for_the_watch_only_while_it_has_something_to_watch(
    tmp_path: Path,
) -> None:
    """With no answer yet (no router answers, or none traced so far) the collector's loop
    waits for the next trace round, not for a watch with nothing in it (5 wake-ups a
    second of nothing: ~0.3 % of a core in bench_collector); once a path is known the
    watch's interval counts again."""
    t = _tracer(tmp_path)
    t.socks = [object()] * 4  # type: ignore[list-item]  # tracing on (sockets opened)
    t.next_trace, t.next_watch = 100.0, 10.2
    assert t.watched(10.0) == [] and t.trace_due_at() == 100.0
    t._answered(records.host_id("t2"), 40000, A)
    assert t.watched(10.0) and t.trace_due_at() == 10.2
