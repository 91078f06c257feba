"""Labelled scenarios: random faults in a lab fleet, with the ground truth beside the data.

``clockmesh lab scenario run --seed S --minutes M --out DIR`` builds a lab, starts an ops
box (``clockmesh ingest run``, store in ``DIR/store``) and a collector in every host
(:mod:`lab.fleet`), lets the fleet settle, then injects a random mix drawn from
``random.Random(S)``, one fault at a time with quiet gaps between:

- ``fabric_flap``: a leaf–spine link flaps 1–4 times (down 1.5–5 s, up 3–6 s), by plain
  ``ip link set`` on a random end — what an optic or an operator does;
- ``host_flap``: a host's link flaps the same way, from the leaf's port;
- ``roce_v1_job``: a job on 2–3 hosts of different racks on a RoCE v1 GID: index 2 (the
  IPv4-mapped v1 GID of the lab's tables) or no index at all (NCCL's old default, 0);
- ``healthy_job``: the same on RoCE v2 (index 3): must raise nothing;
- ``contention``: one direction of a random leaf–spine link filled by RDMA-class bulk
  traffic (:func:`lab.loadgen.saturate`, 1.3 × the capacity) for 20–30 s: with the
  scenario's shallow buffers a sub-millisecond queue that drops beyond;
- ``job_contention``: two RoCE v2 jobs between a host of one rack and a host of another,
  hashed onto the same spine, each moving its bulk data (0.65 × the capacity, RDMA
  class) along its flow: together they fill the source leaf's uplink to that spine;
- ``silent_drop``: a spine silently drops (``lab drop``), links and BGP up, for 15–25 s:
  everything it forwards to one random host (a blackhole /32: the detector should name the
  spine and the host, and the link to the host's leaf — the truth's ``where``), or 30 % of
  all the flows it forwards (nftables hashing the 5-tuple: ``where`` is the spine);
- ``multi_drop``: a spine silently drops everything it forwards to two hosts of two racks
  (two stale /32s) for 15–25 s: two places, the links to their leaves (``detail.places``,
  ``where`` both joined by " and "); each must be named, and nothing else (once the spine
  was also named as dropping "12 %" of its flows);
- ``leaf_drop``: a leaf silently drops everything it forwards to one host, of its own rack
  or another (a blackhole /32: a stale FIB entry) for 15–25 s: ``where`` is ``LEAF
  towards HOST``;
- ``leaf_down``: a leaf loses power: every port of it (its hosts' and its uplinks) down
  at once for 3–10 s, by plain ``ip link set``; ``where`` is the leaf (a rack of two
  hosts or more: one host's rack is its host link);
- ``lossy_port``: a leaf–spine port loses a random 4–10 % of the packets it sends, one
  direction (``lab drop --toward --packets``: a bad optic, every flow loses some), for
  20–30 s: ``where`` is the link, ``detail.direction`` its direction;
- ``port_incast``: the leaf's port towards one random host (its access link, leaf→host)
  holds a shallow buffer (``BUFFER_US`` at ``CAPACITY``), fed 1.5 × its rate by bulk
  from another host for 20–30 s: a queue the load's bursts fill and drain, dropping
  beyond — incast into one receiver (``where`` is its access link);
- ``clock_step``: a host's clock steps 20 µs–2 ms ahead or back (log-uniform) and stays
  so — a PTP servo re-locking, chrony or ntpd stepping: its collector's lab clock offset
  moves by that much (its config rewritten and reloaded, SIGHUP) — then 20–40 s; nothing
  waited or was lost, so it must raise nothing (``where`` is the host, ``detail.step_ns``
  the step);
- ``clean``: nothing, 20–40 s.

Realistic buffers by default: every leaf–spine link gets ``CAPACITY`` (50 Mbit/s) and
queues of ``BUFFER_US`` (500 µs, :func:`lab.capacity.apply`) before the fleet starts, as a
RoCE fabric's switch ports (``buffers=False``: unlimited links, as before).

Every fault is written to ``DIR/truth.json`` with its class, place and wall-clock start
and end (the same clock the ops box stamps anomalies with). The detector never reads it:
``clockmesh detector eval DIR`` compares the anomalies in ``DIR/store`` with it. The
routers' FRR logs are kept in ``DIR/frr/<router>/`` (BGP and BFD session changes,
timestamped: what explains a routing event once the lab is gone).
"""

from __future__ import annotations

import json
import math
import random
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab import capacity, faults, fleet, jobgen, loadgen
from lab.fabric import Lab

KINDS = (
    "fabric_flap",
    "host_flap",
    "roce_v1_job",
    "healthy_job",
    "contention",
    "clean",
    "job_contention",
    "silent_drop",
    "leaf_drop",
    "multi_drop",
    "leaf_down",
    "lossy_port",
    "clock_step",
    "port_incast",
)
WEIGHTS = (3, 2, 2, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1)
CAPACITY = "50mbit"
BUFFER_US = 500.0
CLASS_OF = {
    "fabric_flap": "flapping_link",
    "host_flap": "flapping_link",
    "roce_v1_job": "roce_v1_job",
    "contention": "contention",
    "job_contention": "contention",
    "silent_drop": "silent_drop",
    "leaf_drop": "silent_drop",
    "multi_drop": "silent_drop",
    "leaf_down": "flapping_link",
    "lossy_port": "silent_drop",
    "healthy_job": "none",
    "clock_step": "none",
    "clean": "none",
    "port_incast": "contention",
}
STEP_NS = (20_000, 2_000_000)  # a clock_step's size, log-uniform, either way
WARMUP_S = 20.0
GAP_S = 25.0  # quiet time after each fault: its anomaly closes (detect_clear_s) before the next
DETECT_CLEAR_S = 10.0


@dataclass
class Fault:
    kind: str  # one of KINDS
    label: str  # the detector class it should raise, or "none"
    where: str  # link name or job id ("" for clean)
    start_ns: int
    end_ns: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


def _ip(namespace: str, interface: str, state: str) -> None:
    subprocess.run(["ip", "-n", namespace, "link", "set", interface, state], check=True)


class Scenario:
    def __init__(
        self,
        lab: Lab,
        out: Path,
        seed: int,
        log: Callable[[str], None] = print,
        buffers: bool = True,
    ) -> None:
        self.lab = lab
        self.buffers = buffers
        self.out = out
        self.rng = random.Random(seed)
        self.seed = seed
        self.log = log
        self.faults: list[Fault] = []
        self._jobs = 0
        self._collectors: dict[str, subprocess.Popen[bytes]] = {}  # host -> its collector

    # ---- the faults -------------------------------------------------------------------
    def _flap(self, kind: str, link_names: list[str]) -> Fault:
        link = self.lab.topology.link(self.rng.choice(link_names))
        end = link.b if kind == "host_flap" else self.rng.choice([link.a, link.b])
        count = self.rng.randint(1, 4)
        downs = [round(self.rng.uniform(1.5, 5.0), 1) for _ in range(count)]
        ups = [round(self.rng.uniform(3.0, 6.0), 1) for _ in range(count)]
        f = Fault(kind, "flapping_link", link.name, time.time_ns(), detail={
            "side": end.node, "downs_s": downs, "ups_s": ups, "how": "ip link set"})  # fmt: skip
        try:
            for down, up in zip(downs, ups, strict=True):
                _ip(end.namespace, end.interface, "down")
                time.sleep(down)
                _ip(end.namespace, end.interface, "up")
                f.end_ns = time.time_ns()
                time.sleep(up)
        finally:
            _ip(end.namespace, end.interface, "up")
        return f

    def _job(self, kind: str) -> Fault:
        topo = self.lab.topology
        racks = sorted({h.rack for h in topo.hosts})
        chosen = self.rng.sample(racks, k=min(len(racks), self.rng.randint(2, 3)))
        hosts = [self.rng.choice([h.name for h in topo.hosts if h.rack == r]) for r in chosen]
        gid: int | None = 3
        if kind == "roce_v1_job":
            gid = self.rng.choice([2, None])
        self._jobs += 1
        job = f"sc{self.seed}j{self._jobs}"
        seconds = self.rng.uniform(20, 30)
        f = Fault(kind, CLASS_OF[kind], job, time.time_ns(), detail={
            "hosts": hosts, "gid_index": gid, "seconds": round(seconds, 1)})  # fmt: skip
        # A job that sets no index lands on RoCE v1 the commonest way: NCCL before 2.21
        # takes index 0 (the link-local RoCE v1 GID); 2.21+ would select a v2 GID itself.
        version = "2.18.3" if gid is None else "2.23.4"
        jobgen.start_job(self.lab, job, hosts, gid, 20.0, 512, nccl_version=version)
        try:
            time.sleep(seconds)
        finally:
            jobgen.stop_job(self.lab, job)
            f.end_ns = time.time_ns()
        return f

    def _contention(self, fabric: list[str]) -> Fault:
        link = self.rng.choice(fabric)
        seconds = self.rng.uniform(20, 30)
        if not self.buffers:  # unlimited links: the old loud fault (tbf of 50 ms)
            f = Fault("contention", "contention", link, time.time_ns(), detail={
                "rate": "20mbit", "seconds": round(seconds, 1), "how": "lab congest"})  # fmt: skip
            faults.congest(self.lab, link, "20mbit", "a2b")
        else:
            direction = self.rng.choice(["a2b", "b2a"])
            f = Fault("contention", "contention", link, time.time_ns(), detail={
                "rate": CAPACITY, "buffer_us": BUFFER_US, "seconds": round(seconds, 1),
                "direction": "leaf→spine" if direction == "a2b" else "spine→leaf",
                "how": "lab saturate"})  # fmt: skip
            loadgen.saturate(self.lab, link, direction, CAPACITY)
            f.start_ns = time.time_ns()  # onset: the load runs (its port search took seconds)
        return self._hold(f, seconds)

    def _port_incast(self, access: list[str]) -> Fault:
        port = self.rng.choice(access)
        seconds = self.rng.uniform(20, 30)
        f = Fault("port_incast", "contention", port, time.time_ns(), detail={
            "rate": CAPACITY, "buffer_us": BUFFER_US, "seconds": round(seconds, 1),
            "direction": "leaf→host", "how": "lab congest --buffer"})  # fmt: skip
        faults.congest(self.lab, port, CAPACITY, "b2a", buffer_us=BUFFER_US)
        f.start_ns = time.time_ns()  # onset: the load runs
        return self._hold(f, seconds)

    def _hold(self, f: Fault, seconds: float) -> Fault:
        """Leave fault ``f`` in place ``seconds``, then heal the lab (also on failure) and
        stamp ``f``'s end."""
        try:
            time.sleep(seconds)
        finally:
            faults.heal(self.lab)
            f.end_ns = time.time_ns()
        return f

    def _job_contention(self) -> Fault:
        """Two jobs from one host, to hosts of two other racks (one rack twice when there
        are two), their bulk flows hashed onto one uplink: together 1.3 × its capacity,
        each other link they cross at most 0.65 × (0.9 × catching up after a stall)."""
        topo = self.lab.topology
        racks = sorted({h.rack for h in topo.hosts})
        ra = self.rng.choice(racks)
        rest = [r for r in racks if r != ra]
        far = self.rng.sample(rest, 2) if len(rest) >= 2 else rest * 2
        a = self.rng.choice([h for h in topo.hosts if h.rack == ra])
        peers = [self.rng.choice([h for h in topo.hosts if h.rack == r]) for r in far]
        uplinks = [lk for lk in topo.links if lk.kind == "fabric" and lk.a.node == ra]
        link = self.rng.choice(uplinks)
        seconds = self.rng.uniform(20, 30)
        jobs = []
        for _ in peers:
            self._jobs += 1
            jobs.append(f"sc{self.seed}j{self._jobs}")
        f = Fault("job_contention", "contention", link.name, time.time_ns(), detail={
            "jobs": jobs, "hosts": [a.name, *(p.name for p in peers)],
            "direction": "leaf→spine", "rate": CAPACITY, "seconds": round(seconds, 1)})  # fmt: skip
        # every bulk flow's source port first: a running load crowds the port search
        ports = [faults.find_source_port(topo, a, p, link, link.a) for p in peers]
        cap = faults.parse_rate(CAPACITY)
        bps, ceiling = cap * 0.65, cap * loadgen.CEILING_SHARE  # ceiling: catching up
        try:
            for i, (job, peer, sport) in enumerate(zip(jobs, peers, ports, strict=True)):
                faults._start_load(self.lab, a, peer, sport, bps, 26, ceiling_bps=ceiling,
                                   kind="job_bulk", link=link.name, job=job)  # fmt: skip
                jobgen.start_job(self.lab, job, [a.name, peer.name], 3, 20.0, 512,
                                 port=jobgen.PORT + 1 + i)  # fmt: skip
            f.start_ns = time.time_ns()  # onset: both jobs' bulk flows run
            time.sleep(seconds)
        finally:
            for job in jobs:
                jobgen.stop_job(self.lab, job)
            faults.heal(self.lab)
            f.end_ns = time.time_ns()
        return f

    def _silent_drop(self) -> Fault:
        topo = self.lab.topology
        spine = self.rng.choice(topo.spines).name
        host = self.rng.choice(topo.hosts)
        to_host = self.rng.random() < 0.5
        seconds = self.rng.uniform(15, 25)
        start = time.time_ns()
        if to_host:
            rec = faults.drop(self.lab, spine, [host.name])
        else:
            rec = faults.drop(self.lab, spine, [], 0.3, seed=self.rng.randrange(1 << 31))
        where = f"{host.rack}-{spine}" if to_host else spine
        f = Fault("silent_drop", "silent_drop", where, start, detail={
            "switch": spine, "to": rec["to"], "share": rec["share"], "how": rec["how"],
            "seconds": round(seconds, 1)})  # fmt: skip
        return self._hold(f, seconds)

    def _multi_drop(self) -> Fault:
        topo = self.lab.topology
        spine = self.rng.choice(topo.spines).name
        racks = self.rng.sample(sorted({h.rack for h in topo.hosts}), 2)
        hosts = [self.rng.choice([h for h in topo.hosts if h.rack == r]) for r in racks]
        seconds = self.rng.uniform(15, 25)
        start = time.time_ns()
        rec = faults.drop(self.lab, spine, [h.name for h in hosts])
        places = [f"{h.rack}-{spine}" for h in hosts]
        f = Fault("multi_drop", "silent_drop", " and ".join(places), start, detail={
            "switch": spine, "to": rec["to"], "how": rec["how"], "places": places,
            "seconds": round(seconds, 1)})  # fmt: skip
        return self._hold(f, seconds)

    def _leaf_drop(self) -> Fault:
        topo = self.lab.topology
        host = self.rng.choice(topo.hosts)
        leaf = self.rng.choice([lf.name for lf in topo.leaves])  # its own, or another rack's
        seconds = self.rng.uniform(15, 25)
        start = time.time_ns()
        rec = faults.drop(self.lab, leaf, [host.name])
        f = Fault("leaf_drop", "silent_drop", f"{leaf} towards {host.name}", start, detail={
            "switch": leaf, "to": rec["to"], "how": rec["how"], "seconds": round(seconds, 1)})  # fmt: skip
        return self._hold(f, seconds)

    def _lossy_port(self) -> Fault:
        topo = self.lab.topology
        link = self.rng.choice([lk for lk in topo.links if lk.kind == "fabric"])
        to_leaf = self.rng.random() < 0.5  # the spine's port to the leaf, or the leaf's up
        switch, toward = (link.b.node, link.a.node) if to_leaf else (link.a.node, link.b.node)
        share = round(self.rng.uniform(0.04, 0.10), 3)
        seconds = self.rng.uniform(20, 30)
        start = time.time_ns()
        rec = faults.lossy_port(self.lab, switch, toward, share)
        f = Fault("lossy_port", "silent_drop", link.name, start, detail={
            "switch": switch, "toward": toward, "share": share, "how": rec["how"],
            "direction": "spine→leaf" if to_leaf else "leaf→spine",
            "seconds": round(seconds, 1)})  # fmt: skip
        return self._hold(f, seconds)

    def _leaf_down(self) -> Fault:
        topo = self.lab.topology
        racks = sorted({h.rack for h in topo.hosts})
        leaf = self.rng.choice([r for r in racks if sum(h.rack == r for h in topo.hosts) > 1])
        ports = [end for lk in topo.links for end in (lk.a, lk.b) if end.node == leaf]
        seconds = round(self.rng.uniform(3.0, 10.0), 1)
        f = Fault("leaf_down", "flapping_link", leaf, time.time_ns(), detail={
            "switch": leaf, "hosts": sorted(h.name for h in topo.hosts if h.rack == leaf),
            "ports": len(ports), "down_s": seconds, "how": "ip link set (every port)"})  # fmt: skip
        try:
            for end in ports:
                _ip(end.namespace, end.interface, "down")
            time.sleep(seconds)
        finally:
            for end in ports:
                _ip(end.namespace, end.interface, "up")
            f.end_ns = time.time_ns()
        return f

    def _clock_step(self) -> Fault:
        host = self.rng.choice(self.lab.topology.hosts).name
        lo, hi = (math.log10(x) for x in STEP_NS)
        step = round(self.rng.choice((-1, 1)) * 10 ** self.rng.uniform(lo, hi))
        start = time.time_ns()
        offset = fleet.step_clock(
            self.out / "hosts" / host / "collector.yml", self._collectors[host], step
        )
        f = Fault("clock_step", "none", host, start, detail={
            "step_ns": step, "offset_ns": offset,
            "how": "lab clock offset, collector reloaded (SIGHUP)"})  # fmt: skip
        time.sleep(self.rng.uniform(20, 40))
        f.end_ns = time.time_ns()
        return f

    def _clean(self) -> Fault:
        f = Fault("clean", "none", "", time.time_ns())
        time.sleep(self.rng.uniform(20, 40))
        f.end_ns = time.time_ns()
        return f

    def inject(self, kind: str) -> Fault:
        topo = self.lab.topology
        fabric = [lk.name for lk in topo.links if lk.kind == "fabric"]
        access = [lk.name for lk in topo.links if lk.kind == "access"]
        if kind == "fabric_flap":
            return self._flap(kind, fabric)
        if kind == "host_flap":
            return self._flap(kind, access)
        if kind in ("roce_v1_job", "healthy_job"):
            return self._job(kind)
        if kind == "contention":
            return self._contention(fabric)
        if kind == "job_contention":
            return self._job_contention()
        if kind == "silent_drop":
            return self._silent_drop()
        if kind == "leaf_drop":
            return self._leaf_drop()
        if kind == "multi_drop":
            return self._multi_drop()
        if kind == "leaf_down":
            return self._leaf_down()
        if kind == "lossy_port":
            return self._lossy_port()
        if kind == "clock_step":
            return self._clock_step()
        if kind == "port_incast":
            return self._port_incast(access)
        return self._clean()

    # ---- the run ------------------------------------------------------------------------
    def run(self, minutes: float, kinds: tuple[str, ...] = KINDS) -> Path:
        weights = [WEIGHTS[KINDS.index(k)] for k in kinds]
        key = secrets.token_hex(32).encode()
        self.out.mkdir(parents=True, exist_ok=True)
        # the topology beside the truth: the lab (and its state dir) is gone after the run
        (self.out / "topology.json").write_bytes(self.lab.topology_path.read_bytes())
        opsbox = None
        procs: dict[str, subprocess.Popen[bytes]] = {}
        started = time.time_ns()
        try:
            if self.buffers:  # before the fleet: its baselines are learnt on these links
                capacity.apply(self.lab, CAPACITY, buffer_us=BUFFER_US)
            # The ops box and collectors at their default rates (probes, traces, detector
            # passes): the latency a scenario measures is the one a user gets.
            opsbox, url = fleet.start_opsbox(self.lab, self.out, key, detect_clear_s=DETECT_CLEAR_S)
            procs = self._collectors = fleet.start(self.lab, self.out / "hosts", key, url)
            self._wait_shipping(url, len(self.lab.topology.hosts))
            self.log(f"fleet shipping; warm-up {WARMUP_S:.0f} s")
            time.sleep(WARMUP_S)
            deadline = time.monotonic() + minutes * 60
            while time.monotonic() < deadline - GAP_S:
                kind = self.rng.choices(kinds, weights)[0]
                f = self.inject(kind)
                self.faults.append(f)
                self.log(f"{kind}: {f.where or '-'} ({(f.end_ns - f.start_ns) / 1e9:.1f} s)")
                self._write(started, minutes)
                time.sleep(GAP_S)
        finally:
            fleet.stop(procs)
            fleet.stop_opsbox(opsbox)
            self._write(started, minutes)
            self._keep_frr_logs()
        return self.out / "truth.json"

    def _keep_frr_logs(self) -> None:
        """Copy every router's FRR logs (BGP neighbour and BFD changes, timestamped) to
        ``DIR/frr/<router>/``: the lab's state dir goes with the lab, and a routing event
        the detector names (or that nobody injected) is explained by them."""
        topo = self.lab.topology
        for r in (*topo.leaves, *topo.spines):  # where Lab._start_frr has them log
            for log_file in sorted((self.lab.node_dir(r.name) / "frr").glob("*.out")):
                dest = self.out / "frr" / r.name / log_file.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log_file, dest)

    def _wait_shipping(self, url: str, hosts: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/v1/live", timeout=5) as resp:
                    if len(json.load(resp)["hosts"]) >= hosts:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"not every host shipped within {timeout:.0f} s")

    def _write(self, started: int, minutes: float) -> None:
        doc = {
            "seed": self.seed,
            "minutes": minutes,
            "started_ns": started,
            "ended_ns": time.time_ns(),
            "lab": self.lab.name,
            "topology": str(self.out / "topology.json"),
            "store": str(self.out / "store"),
            "capacity": capacity.current(self.lab) if self.buffers else {},
            "faults": [asdict(f) for f in self.faults],
        }
        tmp = self.out / "truth.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self.out / "truth.json")
