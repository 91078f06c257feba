"""A probe-mesh simulator with known clocks: PROBE_TX / PROBE_RX / ECHO rows + ground truth.

Model (all vectorised, one numpy pass per step):

- Topology: ``racks`` leaves with ``hosts_per_rack`` hosts each, ``spines`` spines;
  every leaf connects to every spine. Links are directed: host->leaf, leaf->host,
  leaf->spine, spine->leaf. Each link has a propagation delay (base + a fixed
  random part) and a queue: with probability ``util`` a packet waits an
  exponential time of mean ``queue_ns`` (the M/M/1 waiting-time shape: zero
  with probability 1 - utilisation). Congestion is per *direction* of a link.
- Buddies: own rack + ``buddies_random`` random hosts of other racks, stable per
  host (as collector/buddies.py); ``ports`` source ports per buddy, each hashed
  to a spine (ECMP); echoes return on their own hashed path.
- Coded pairs at ``rate_per_port`` per (buddy, port) per second, random phase,
  ``pair_spacing_ns`` apart. The second probe sees the same queues as the first
  with probability ``pair_queue_corr`` (the case a coded-pair filter cannot catch),
  otherwise independent draws.
- Clocks: ``clock_h(t) = t + offset_h + drift_h * (t - start)`` with offsets
  uniform in +-``offset_max_ns`` and drifts uniform in +-``drift_max_ppm`` (the lab
  collector's skew has the same form); every timestamp gets Gaussian noise of
  ``ts_noise_ns`` and a fraction ``bad_ts_rate`` of RX timestamps is off by
  ``bad_ts_ns`` (either sign).
- Loss: each probe / echo is lost with probability ``loss``.
- Echo sampling (``echo_every``, as the collector's ``probe.echo_every``): the v-th
  coded pair of a stream (buddy index b, port p) asks for an echo iff
  ``(v + b + p) % echo_every == 0`` (collector/probe_mesh.py ``_echo_wanted``); v
  counts from a random per-host start. ``echo_every=1`` echoes every probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collector.records import ECHO, PROBE_RX, PROBE_TX, TsKind, host_id


@dataclass(frozen=True)
class Congestion:
    """One congested direction of a leaf-spine link."""

    leaf: int
    spine: int
    up: bool = True  # leaf -> spine when True, spine -> leaf otherwise
    util: float = 0.9
    queue_ns: float = 50_000.0


@dataclass(frozen=True)
class SimConfig:
    racks: int = 4
    hosts_per_rack: int = 4
    spines: int = 2
    buddies_random: int = 3
    ports: int = 8
    rate_per_port: float = 1.0  # coded pairs per second per (buddy, port)
    pair_spacing_ns: int = 20_000
    duration_ns: int = 2_000_000_000
    start_ns: int = 1_760_000_000_000_000_000
    offset_max_ns: float = 5_000_000.0
    drift_max_ppm: float = 50.0
    ts_noise_ns: float = 10.0
    host_link_ns: float = 500.0
    fabric_link_ns: float = 1_000.0
    link_jitter_ns: float = 50.0  # fixed random extra propagation per cable (both ways)
    idle_util: float = 0.05
    idle_queue_ns: float = 500.0
    congestion: tuple[Congestion, ...] = ()
    pair_queue_corr: float = 0.0
    loss: float = 0.0
    echo: bool = True
    echo_every: int = 8  # collector default (collector.config.ECHO_EVERY_DEFAULT); 1 = all
    echo_turnaround_ns: float = 5_000.0
    bad_ts_rate: float = 0.0
    bad_ts_ns: float = 1_000_000.0
    seed: int = 0

    @property
    def hosts(self) -> int:
        return self.racks * self.hosts_per_rack


@dataclass
class GroundTruth:
    start_ns: int
    hosts: np.ndarray  # int64 host ids
    names: list[str]
    offset_ns: np.ndarray  # at start_ns (true time)
    drift_ppm: np.ndarray
    rx_true_owd_ns: np.ndarray = field(default_factory=lambda: np.empty(0))  # per RX row

    def offsets_at(self, t_true_ns: float) -> np.ndarray:
        """True offsets (clock - true time) at a true time."""
        return self.offset_ns + self.drift_ppm * 1e-6 * (t_true_ns - self.start_ns)

    def relative_offsets(self, ref_mesh_ns: int, hosts: np.ndarray | None = None) -> np.ndarray:
        """Offsets minus their mean at the instant the mean clock reads ``ref_mesh_ns``
        (the solver's mean-zero gauge), for ``hosts`` (default: all, in truth order)."""
        sel = (
            np.arange(len(self.hosts))
            if hosts is None
            else np.searchsorted(self.hosts, hosts, sorter=np.argsort(self.hosts))
        )
        if hosts is not None:
            sel = np.argsort(self.hosts)[sel]
        t = float(ref_mesh_ns)
        for _ in range(3):  # mean clock reads ref at true time t
            t = ref_mesh_ns - float(np.mean(self.offsets_at(t)[sel]))
        off = self.offsets_at(t)[sel]
        return off - off.mean()

    def relative_drift_ppm(self, hosts: np.ndarray | None = None) -> np.ndarray:
        sel = np.arange(len(self.hosts))
        if hosts is not None:
            order = np.argsort(self.hosts)
            sel = order[np.searchsorted(self.hosts, hosts, sorter=order)]
        d = self.drift_ppm[sel]
        return d - d.mean()


@dataclass
class SimResult:
    tx: np.ndarray
    rx: np.ndarray
    echoes: np.ndarray
    truth: GroundTruth
    config: SimConfig


class MeshSimulator:
    """Build the topology and clocks once (from the seed); ``run`` draws probe records."""

    def __init__(self, config: SimConfig) -> None:
        c = config
        if c.racks < 1 or c.hosts_per_rack < 1 or c.spines < 1 or c.ports < 1:
            raise ValueError("racks, hosts_per_rack, spines, ports: expected ints >= 1")
        if c.racks == 1 and c.hosts_per_rack == 1:
            raise ValueError("need at least two hosts")
        if c.echo_every < 1:
            raise ValueError("echo_every: expected an int >= 1 (1 = echo every probe)")
        self.config = c
        self.rng = np.random.default_rng(c.seed)
        h = c.hosts
        self.names = [f"sim-h{i:05d}" for i in range(h)]
        self.host_ids = np.array([host_id(n) for n in self.names], dtype=np.int64)
        self.rack = np.arange(h) // c.hosts_per_rack
        self.offset_ns = self.rng.uniform(-c.offset_max_ns, c.offset_max_ns, h)
        self.drift_ppm = self.rng.uniform(-c.drift_max_ppm, c.drift_max_ppm, h)
        # links: [host up (h)] [host down (h)] [leaf->spine (L*S)] [spine->leaf (L*S)]
        n_ls = c.racks * c.spines
        self.n_links = 2 * h + 2 * n_ls
        base = np.concatenate((np.full(2 * h, c.host_link_ns), np.full(2 * n_ls, c.fabric_link_ns)))
        # A cable has the same length both ways: one random extra per cable,
        # applied to both directions (asymmetry comes from ECMP paths and queues).
        cable = self.rng.uniform(0, c.link_jitter_ns, h + n_ls)
        self.prop = base + np.concatenate((cable[:h], cable[:h], cable[h:], cable[h:]))
        self.util = np.full(self.n_links, c.idle_util)
        self.qmean = np.full(self.n_links, c.idle_queue_ns)
        for cg in c.congestion:
            if not (0 <= cg.leaf < c.racks and 0 <= cg.spine < c.spines):
                raise ValueError(f"congestion {cg}: leaf/spine out of range")
            link = self.leaf_spine_link(cg.leaf, cg.spine, cg.up)
            self.util[link] = cg.util
            self.qmean[link] = cg.queue_ns
        self.buddies = self._buddies()
        # collectors' pair counters (v of the echo rule) start anywhere; a separate
        # generator so the main stream (topology, clocks, delays) does not depend on it
        self.visit_base = np.random.default_rng([c.seed, 1]).integers(0, 1 << 20, h)

    def leaf_spine_link(self, leaf: int, spine: int, up: bool) -> int:
        c = self.config
        return 2 * c.hosts + (0 if up else c.racks * c.spines) + leaf * c.spines + spine

    def _buddies(self) -> list[np.ndarray]:
        c = self.config
        out = []
        for i in range(c.hosts):
            own = np.flatnonzero((self.rack == self.rack[i]) & (np.arange(c.hosts) != i))
            others = np.flatnonzero(self.rack != self.rack[i])
            k = min(c.buddies_random, len(others))
            pick = self.rng.choice(others, size=k, replace=False) if k else others[:0]
            out.append(np.concatenate((own, pick)))
        return out

    # ---- paths -------------------------------------------------------------------
    def _paths(self, src: np.ndarray, dst: np.ndarray, salt: np.ndarray) -> np.ndarray:
        """Link ids (n, 4) of each packet's path; -1 pads same-rack paths."""
        c = self.config
        h = c.hosts
        with np.errstate(over="ignore"):
            mix = (
                (src.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
                ^ (dst.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
                ^ (salt.astype(np.uint64) * np.uint64(0x165667B19E3779F9))
            )
            mix ^= mix >> np.uint64(29)
            mix *= np.uint64(0xBF58476D1CE4E5B9)
            mix ^= mix >> np.uint64(32)
        spine = (mix % np.uint64(c.spines)).astype(np.intp)
        ls, ld = self.rack[src], self.rack[dst]
        same = ls == ld
        p = np.empty((len(src), 4), np.intp)
        p[:, 0] = src
        p[:, 1] = np.where(same, -1, 2 * h + ls * c.spines + spine)
        p[:, 2] = np.where(same, -1, 2 * h + c.racks * c.spines + ld * c.spines + spine)
        p[:, 3] = h + dst
        return p

    def _delays(
        self, paths: np.ndarray, reuse: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per packet: total delay and the per-link queue draws (for pair correlation)."""
        valid = paths >= 0
        lk = np.where(valid, paths, 0)
        busy = self.rng.random(paths.shape) < self.util[lk]
        q = np.where(busy & valid, self.rng.exponential(1.0, paths.shape) * self.qmean[lk], 0.0)
        if reuse is not None:
            q = reuse
        d = np.where(valid, self.prop[lk], 0.0).sum(axis=1) + q.sum(axis=1)
        return d, q

    def _clock(self, h: np.ndarray, t_rel: np.ndarray) -> np.ndarray:
        """Recorded int64 timestamp of true time ``start + t_rel`` on hosts ``h``."""
        c = self.config
        v = t_rel + self.offset_ns[h] + self.drift_ppm[h] * 1e-6 * t_rel
        if c.ts_noise_ns > 0:
            v = v + self.rng.normal(0.0, c.ts_noise_ns, len(v))
        return c.start_ns + np.rint(v).astype(np.int64)

    # ---- records -----------------------------------------------------------------
    def run(self, start_offset_ns: int = 0, duration_ns: int | None = None) -> SimResult:
        """Probe records for true time ``[start + start_offset, + duration)``."""
        c = self.config
        rng = self.rng
        dur = float(duration_ns if duration_ns is not None else c.duration_ns)
        src = np.concatenate([np.full(len(b), i) for i, b in enumerate(self.buddies)])
        dst = np.concatenate(self.buddies)
        bud = np.concatenate([np.arange(len(b)) for b in self.buddies])  # buddy index
        n_streams = len(src) * c.ports
        s_src = np.repeat(src, c.ports)
        s_dst = np.repeat(dst, c.ports)
        s_bud = np.repeat(bud, c.ports)
        s_port = np.tile(np.arange(c.ports), len(src))
        period = 1e9 / c.rate_per_port
        phase = rng.uniform(0, period, n_streams)
        k_max = int(np.ceil(dur / period)) + 1
        t = phase[:, None] + period * np.arange(k_max)[None, :] + start_offset_ns
        ok = t < start_offset_ns + dur
        stream = np.broadcast_to(np.arange(n_streams)[:, None], t.shape)[ok]
        visit = np.broadcast_to(np.arange(k_max)[None, :], t.shape)[ok]
        t0 = t[ok]
        p_src, p_dst, p_port = s_src[stream], s_dst[stream], s_port[stream]
        n_pairs = len(t0)
        # the collector's echo rule on the v-th pair of (buddy, port)
        v = visit + self.visit_base[p_src] + int(start_offset_ns // period)
        p_echo = (v + s_bud[stream] + p_port) % c.echo_every == 0
        # probes of each pair: [first..., second...]
        order = np.lexsort((t0, p_src))
        p_src, p_dst, p_port, t0 = p_src[order], p_dst[order], p_port[order], t0[order]
        p_echo = p_echo[order]
        starts = np.searchsorted(p_src, np.arange(c.hosts))
        rank = np.arange(n_pairs) - starts[p_src]
        seq_base = (c.start_ns // 1000 + rng.integers(0, 1 << 20, c.hosts) * 2) & ~1
        seq0 = seq_base[p_src] + 2 * rank + 2 * (start_offset_ns // 1000)
        sport = (40000 + p_port).astype(np.uint16)
        paths = self._paths(p_src, p_dst, p_port)
        d1, q1 = self._delays(paths)
        d2, q2 = self._delays(paths)
        corr = rng.random(n_pairs) < c.pair_queue_corr
        if corr.any():
            q2[corr] = q1[corr]
            d2 = np.where(corr, d1 - q1.sum(axis=1) + q2.sum(axis=1), d2)
        t1 = t0 + c.pair_spacing_ns
        # interleave probes: [pair0 first, pair0 second, pair1 first, ...]
        n = 2 * n_pairs
        src2 = np.repeat(p_src, 2)
        dst2 = np.repeat(p_dst, 2)
        port2 = np.repeat(sport, 2)
        seq2 = (np.repeat(seq0, 2) + np.tile([0, 1], n_pairs)).astype(np.uint64)
        pos2 = np.tile(np.array([0, 1], np.uint8), n_pairs)
        t_send = np.empty(n)
        t_send[0::2], t_send[1::2] = t0, t1
        delay = np.empty(n)
        delay[0::2], delay[1::2] = d1, d2
        tx = np.zeros(n, PROBE_TX)
        tx["seq"], tx["src"], tx["dst"] = seq2, self.host_ids[src2], self.host_ids[dst2]
        tx["sport"], tx["dport"], tx["pair"] = port2, 7470, pos2
        tx["ts_kind"] = TsKind.SW
        tx["tx_ns"] = self._clock(src2, t_send)

        lost = rng.random(n) < c.loss
        r = np.flatnonzero(~lost)
        t_arr = t_send[r] + delay[r]
        rx = np.zeros(len(r), PROBE_RX)
        for name in ("seq", "src", "dst", "sport", "dport", "pair"):
            rx[name] = tx[name][r]
        rx["ts_kind"] = TsKind.SW
        rx["ttl"] = np.where(self.rack[src2[r]] == self.rack[dst2[r]], 63, 61)
        rx["rx_ns"] = self._clock(dst2[r], t_arr)
        rx["spacing_ns"] = c.pair_spacing_ns
        if c.bad_ts_rate > 0:
            bad = rng.random(len(r)) < c.bad_ts_rate
            sign = np.where(rng.random(len(r)) < 0.5, -1, 1)
            rx["rx_ns"] += np.where(bad, sign * int(c.bad_ts_ns), 0)
        true_owd = delay[r]

        echoes = np.zeros(0, ECHO)
        if c.echo:
            e_lost = rng.random(len(r)) < c.loss
            if c.echo_every > 1:  # not asked for: as if lost (no draws change for 1)
                e_lost |= ~np.repeat(p_echo, 2)[r]
            er = r[~e_lost]
            t_dep = t_send[er] + delay[er] + c.echo_turnaround_ns
            back = self._paths(dst2[er], src2[er], port2[er].astype(np.int64) + 7470)
            d_back, _ = self._delays(back)
            echoes = np.zeros(len(er), ECHO)
            echoes["seq"], echoes["src"], echoes["dst"] = seq2[er], tx["src"][er], tx["dst"][er]
            echoes["sport"] = port2[er]
            echoes["ts_kind"] = TsKind.SW
            echoes["t1_ns"] = tx["tx_ns"][er]
            echoes["t2_ns"] = rx["rx_ns"][~e_lost]
            echoes["t3_ns"] = self._clock(dst2[er], t_dep)
            echoes["t4_ns"] = self._clock(src2[er], t_dep + d_back)
            # the prober records echoes as they come back: order by prober, then t4
            eo = np.lexsort((echoes["t4_ns"], src2[er]))
            echoes = echoes[eo]
        # receivers record in arrival order
        ro = np.lexsort((t_arr, dst2[r]))
        rx = rx[ro]
        truth = GroundTruth(
            start_ns=c.start_ns,
            hosts=self.host_ids.copy(),
            names=list(self.names),
            offset_ns=self.offset_ns.copy(),
            drift_ppm=self.drift_ppm.copy(),
            rx_true_owd_ns=true_owd[ro],
        )
        return SimResult(tx=tx, rx=rx, echoes=echoes, truth=truth, config=c)
