"""The ingest daemon's detector loop: rules over committed telemetry, anomalies out.

After every durable group commit the daemon hands the commit's ``counter``,
``rdma_config`` and ``job_rdma`` tables to :meth:`DetectRunner.feed` (the counter rows
are filtered to the link-state counters there, a copy: the commit's column buffers are
reused). One background thread at the analysis priority (nice +19, as the clock solver)
runs a pass every ``interval_s``: it feeds the rules (:mod:`analytics.detect.flaps`,
:mod:`analytics.detect.roce`), hands their observations to the
:class:`~analytics.detect.anomalies.AnomalyBook`, and writes the rows of every anomaly
opened, updated or closed as one Parquet file into the store's ``anomalies`` table.

Open anomalies are in ``/v1/live`` (``anomalies``), in ``clockmesh live`` and in
``/metrics`` (``clockmesh_anomalies_open{kind}``, ``clockmesh_anomalies_opened_total``).

A rule that fails on bad input logs one line and the pass goes on: the daemon keeps
serving everyone else.

Over 500 lines: the one loop that feeds and steps every rule; each rule is a module of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from analytics.clock.clock_state import ClockState
from analytics.detect import features
from analytics.detect.anomalies import KINDS, Anomaly, AnomalyBook, Observation
from analytics.detect.contention import CONGESTION_COUNTERS, PathDelays
from analytics.detect.flaps import LEAF_SKEW_NS, LinkFlaps, Outage
from analytics.detect.flaps import NAMES as FLAP_COUNTERS
from analytics.detect.job_delay import JobDelays
from analytics.detect.model import Detector, ModelError
from analytics.detect.model import load as load_model
from analytics.detect.paths import FabricLink, FabricPaths
from analytics.detect.roce import RoceJobs
from analytics.detect.silent_drop import GRAY_MIN_SECONDS, PORT_COUNTERS, SilentDrops
from analytics.detect.silent_drop import TABLES as PROBE_TABLES
from analytics.detect.silent_drop import columns as probe_columns
from analytics.detect.survival import Survival
from analytics.remediate import records as remediations
from analytics.store import layout
from analytics.store.store_writer import StoreWriter
from analytics.thread_priority import lower_thread_priority
from analytics.topology import read_topology
from collector import records

log = logging.getLogger("clockmesh.ingest.detect")

_COUNTER_NAMES = pa.array(sorted(n.decode() for n in FLAP_COUNTERS))
_CONGESTION_NAMES = pa.array(sorted(CONGESTION_COUNTERS))
_PORT_NAMES = pa.array(sorted(PORT_COUNTERS))


# After a remediation closed an anomaly, the rule that found it is not listened to for
# this long: collectors report the changed configuration at their next scan (jobs and
# nccl.conf every 5 s), plus shipping. Still seen after that, it is a new anomaly.
REMEDIATION_SETTLE_S = 20.0
INBAND_ROWS = 50_000  # in-band messages kept per commit for the delay signal
RULE_ONLY = ("silent_drop",)  # classes the model does not re-judge (docs/detect.md)
# A leaf back after it went as a whole: its uplinks' outages beginning this soon after,
# with no trace across them since it was back, are its BGP sessions coming back (the lab's
# FRR: ~6 s), the leaf's, not the links' own
LEAF_SETTLE_NS = 30_000_000_000
FABRIC_SETTLE_S = 10.0  # no silent drop is judged this long after a fabric link flapped
CONTENDED_S = 20.0  # contention named on a spine: no random share judged through it this long
RECALL_S = 600.0  # at start, each 5-tuple's newest trace this recent is recalled from the store


def _of_leaf(leaf: Outage, start: int, seen: int) -> bool:
    """Whether an uplink's outage that began at ``start`` (the newest trace across it
    before: ``seen``) is the leaf's ``leaf`` outage (:meth:`DetectRunner._with_leaves`)."""
    if not start or start < leaf.down_ns - LEAF_SKEW_NS:
        return False
    if not leaf.up_ns or start <= leaf.up_ns:
        return True  # began while the leaf was down
    return seen <= leaf.up_ns and start <= leaf.up_ns + LEAF_SETTLE_NS


def dealt_with(a: Anomaly, r: remediations.Remediation) -> bool:
    """Did remediation ``r`` (in force) deal with open anomaly ``a``? It did when ``a`` is
    the anomaly it was planned for, or this box's own anomaly for the same condition — the
    other ops box names it with its own id, and its record arrives here: the same link
    flapping (``fabric_link_out`` on the link), the same job on RoCE v1 (``roce_v2_gid``
    on the job), contention on the same link (``spread_flows`` on the link). Both boxes
    then show it closed by ``r``."""
    return (
        a.anomaly_id == r.anomaly_id
        or (a.kind == "flapping_link" and r.action == "fabric_link_out" and a.link == r.target)
        or (a.kind == "roce_v1_job" and r.action == "roce_v2_gid" and a.job_id == r.target)
        or (a.kind == "contention" and r.action == "spread_flows" and a.link == r.target)
    )


def _merge_roce(config: list[Observation], delay: list[Observation]) -> list[Observation]:
    """One ``roce_v1_job`` per job: the GID configuration's, with the in-band delay signal
    added to its evidence when both see the job; the delay signal's alone otherwise."""
    by_job = {o.job_id: o for o in config}
    out = list(config)
    for o in delay:
        seen = by_job.get(o.job_id)
        if seen is None:
            out.append(o)
        else:
            seen.evidence["inband_vs_probe"] = {
                k: o.evidence[k] for k in ("held_back_flows", "inband_excess_us", "probe_excess_us")
            }
    return out


@dataclass
class DetectConfig:
    interval_s: float = 0.5  # one analysis pass at least this often
    # ... and one soon after every commit that brought the rules something, but no
    # sooner than this after the last: a link that went down shows in /v1/live within a
    # commit and a pass, not a whole interval.
    min_interval_s: float = 0.1
    clear_s: float = 60.0  # an anomaly closes once its condition has cleared this long
    flap_window_s: float = 600.0  # flaps counted over this window
    topology_file: str = ""  # lab topology.json: names host ports after their links
    model_file: str = ""  # skops model; "" = the one shipped in the package, "none" = rules only


@dataclass
class TopologyMaps:
    port_links: dict[tuple[int, str], str]  # (host_id, interface) -> link name
    fabric: list[FabricLink]  # leaf-spine links with the spine's address on each
    host_rack: dict[int, str]  # host_id -> its leaf
    # host_id -> its access link (hosts with exactly one: the port its probes cross)
    host_access: dict[int, str] = field(default_factory=dict)


def load_topology(topology_file: str | Path) -> TopologyMaps:
    """What the detector needs of a topology file (the lab's ``topology.json``).

    Raises ValueError with one line when the file is not a topology.
    """
    path = Path(topology_file)
    doc = read_topology(path)  # TopologyError (a ValueError): one line
    try:
        hosts = {h["name"]: h for h in doc["hosts"]}
        ports = {}
        fabric = []
        for lk in doc["links"]:
            for end in (lk["a"], lk["b"]):
                if end["node"] in hosts:
                    ports[(records.host_id(end["node"]), end["interface"])] = lk["name"]
            if lk.get("kind") == "fabric":
                fabric.append(FabricLink(lk["name"], lk["a"]["node"], lk["b"]["node"],
                                         lk["b"]["address"]))  # fmt: skip
        racks = {records.host_id(n): str(h.get("rack", "")) for n, h in hosts.items()}
        access: dict[int, set[str]] = {}
        for (hid, _ifname), name in ports.items():
            access.setdefault(hid, set()).add(name)
        one = {hid: next(iter(names)) for hid, names in access.items() if len(names) == 1}
        return TopologyMaps(ports, fabric, racks, one)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a clockmesh topology file ({exc})") from exc


class DetectRunner:
    def __init__(
        self,
        writer: StoreWriter | None,
        config: DetectConfig | None = None,
        host_names: Callable[[], dict[int, str]] | None = None,
        nice: int = 19,
        clock_state: Callable[[], ClockState | None] | None = None,
    ) -> None:
        self.writer = writer
        self._clock_state = clock_state or (lambda: None)
        self.config = config or DetectConfig()
        self._host_names = host_names or dict
        self.nice = nice
        names: dict[int, str] = {}
        topo = (
            load_topology(self.config.topology_file)
            if self.config.topology_file
            else TopologyMaps({}, [], {})
        )
        self.flaps = LinkFlaps(self.config.flap_window_s, topo.port_links, names,
                               topo.host_rack, topo.host_access)  # fmt: skip
        self.paths = FabricPaths(
            topo.fabric, topo.host_rack, self.config.flap_window_s, self.config.clear_s
        )
        self.delays = PathDelays(topo.host_rack, self.paths.by_ends, self.paths.spine_of, names,
                                 host_access=topo.host_access)  # fmt: skip
        self.roce = RoceJobs(names)
        self.survival = Survival(topo.host_rack, names, self.config.flap_window_s)
        access = [(h, dev) for (h, dev), name in topo.port_links.items()
                  if topo.host_access.get(h) == name]  # fmt: skip
        self.drops = SilentDrops(topo.host_rack, self.paths.by_ends, self.paths.spine_of, names,
                                 self._links_not_judged, self.paths.recalled, access,
                                 self._contended, self._full_ports,
                                 host_access=topo.host_access)  # fmt: skip
        self.job_delays = JobDelays(names)
        self.delays.jobs_between = self.job_delays.jobs_between
        self.delays.hosts_down = self.flaps.hosts_down_since
        self._names = names  # shared with the rules, refreshed every pass
        self.book = AnomalyBook(self.config.clear_s)
        self.model: Detector | None = None
        self.model_note = "rules only (detect_model_file: none)"
        if self.config.model_file != "none":
            try:
                self.model = load_model(self.config.model_file or None)
                self.model_note = f"model trained {self.model.card.get('trained', '?')}"
            except ModelError as exc:  # the daemon serves on, judging with the rules alone
                self.model_note = f"rules only: {exc}"
                log.warning("event=detect_model_refused reason=%r", str(exc))
        self._queue: list[tuple[str, Any]] = []
        self.queued_bytes = 0  # what the queue holds now
        self.taken_bytes = 0  # what the last pass took from it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        # told (when this pass took its input, when it ended) after every pass (wall ns)
        self.on_pass: Callable[[int, int], None] | None = None
        self.errors = 0
        self.opened: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.last_pass_s = 0.0
        self._live: list[dict] = []
        self._jobs: list[dict] = []
        self._queues: dict[tuple[int, int], float] = {}  # slow pairs' queues (ns)
        self._remediation_files: frozenset[str] = frozenset()
        self._applied: set[str] = set()  # remediation ids already acted on
        # (rule, key) of anomalies a remediation closed -> until when the rule's view of
        # them is not trusted: collectors report the fixed configuration at their next scan.
        self._settling: dict[tuple[str, str], int] = {}
        self._recent: list[dict] = []
        self._leaf_folded: list[tuple[str, str]] = []  # (uplink's key, leaf): _with_leaves

    # ---- commit thread -------------------------------------------------------------
    def feed(
        self, tables: Mapping[str, pa.Table], probes: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """Queue copies of what the rules read (cheap: the link-state and congestion
        counters only). ``probes``: the commit's ``probe_tx``/``probe_rx`` numpy records
        that the daemon keeps unchanged (queued as they are, no copy, while the detector
        matches every probe; only its sample is copied beyond); without them the
        Arrow tables' rows are copied."""
        got: list[tuple[str, Any]] = []
        data = tables.get("counter")
        if data is not None and data.num_rows:
            kept = data.filter(pc.is_in(data.column("name"), value_set=_COUNTER_NAMES))
            if kept.num_rows:
                got.append(("counter", kept))
            kept = data.filter(pc.is_in(data.column("name"), value_set=_CONGESTION_NAMES))
            if kept.num_rows:
                got.append(("congestion", kept))
            if self.drops.ports.access:
                kept = data.filter(pc.is_in(data.column("name"), value_set=_PORT_NAMES))
                if kept.num_rows:
                    got.append(("port", kept))
        pair = []
        for name in ("probe_tx", "probe_rx"):
            rows = (probes or {}).get(name)
            if rows is not None:
                rows = self.delays.sampled(rows)
            else:
                t = tables.get(name)
                rows = (
                    layout.arrow_to_records(name, t)
                    if t is not None and t.num_rows
                    else np.zeros(0, records.TABLES[name])
                )
            pair.append(rows)
        if len(pair[0]) or len(pair[1]):
            got.append(("probes", tuple(pair)))
        for name in ("rdma_config", "job_rdma", "job_nccl", "path_hop"):
            data = tables.get(name)
            if data is not None and data.num_rows:
                got.append((name, data.take(pa.array(np.arange(data.num_rows)))))
        data = tables.get("health")
        if data is not None and data.num_rows and self.drops.host_rack:
            kept = data.filter(pc.equal(data.column("name"), "rx_kernel_drops"))
            if kept.num_rows:  # a collector's socket dropping: a host's received share
                got.append(("socket", kept.select(["ts_ns", "host", "value"])))
        for name in PROBE_TABLES:  # every probe, received or lost: silent drops
            data = tables.get(name)
            if data is not None and data.num_rows and self.drops.host_rack:
                got.append((name, probe_columns(name, data, self.drops.sample_bits)))
        data = tables.get("inband")
        if data is not None and data.num_rows:  # which job was heard on which host, when
            heard = data.group_by(["host", "job_id"]).aggregate([("ts_ns", "max")])
            got.append(("inband", heard))
            # The messages themselves, for in-band delay (a sample of 1 sequence number in
            # k when a commit brings more than INBAND_ROWS: both ends of a message kept).
            k = -(-data.num_rows // INBAND_ROWS)
            if k > 1:
                seq = data.column("seq").to_numpy()
                data = data.filter(pa.array(seq % k == 0))
            got.append(("inband_rows", data.take(pa.array(np.arange(data.num_rows)))))
        if got:
            size = sum(_nbytes(d) for _, d in got)
            with self._lock:
                self._queue.extend(got)
                self.queued_bytes += size
            self._wake.set()

    def feed_owd(self, owd: pa.Table) -> None:
        """A solved clock window's corrected one-way delays (clock thread): their median per
        path (src, dst, source port) is queued."""
        if not owd.num_rows:
            return
        agg = owd.group_by(["src", "dst", "sport"]).aggregate([("owd_ns", "approximate_median")])
        with self._lock:
            self._queue.append(("owd", agg))
            self.queued_bytes += agg.nbytes

    # ---- analysis thread -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="detect", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.step()  # write what the last pass changed

    def recall_paths(self, now_ns: int | None = None) -> int:
        """Where each traced 5-tuple went when the store last saw it (its newest
        ``path_hop`` row of the last ``RECALL_S``), into :attr:`FabricPaths.recalled`: the
        process before this one knew it, and a switch dropping a destination's traffic
        silences those paths' traces, so a drop standing when the ops box restarts could
        not be placed on its spine without it. Only the last hours' partitions are read.
        A store that cannot be read logs one line: the detector starts without."""
        if self.writer is None or not self.paths.links:
            return 0
        now_ns = time.time_ns() if now_ns is None else now_ns
        since = now_ns - int(RECALL_S * 1e9)
        table = self.writer.root / "path_hop"
        files = [
            str(f)
            for hour in range(since // layout.NS_PER_HOUR, now_ns // layout.NS_PER_HOUR + 1)
            for f in sorted((table / layout.partition_of(hour)).glob("*.parquet"))
        ]
        if not files:
            return 0
        try:
            rows = (
                duckdb.connect()
                .execute(
                    "SELECT src, dst, sport, arg_max(hop, ts_ns) AS hop FROM read_parquet(?) "
                    "WHERE ts_ns >= ? GROUP BY src, dst, sport",
                    [files, since],
                )
                .fetchnumpy()
            )
        except (duckdb.Error, OSError) as exc:  # a file compacted away meanwhile, a bad one
            log.warning("event=detect_paths_not_recalled reason=%r", str(exc).splitlines()[0])
            return 0
        n = self.paths.recall(rows)
        log.info("event=detect_paths_recalled paths=%d since_s=%d", n, int(RECALL_S))
        return n

    def _run(self) -> None:
        lower_thread_priority(self.nice)
        try:
            self.recall_paths()
        except Exception:  # a bug here must not stop detection: it starts without
            self.errors += 1
            log.exception("event=detect_paths_not_recalled")
        while True:
            self._wake.wait(self.config.interval_s)
            if self._stop.wait(self.config.min_interval_s):  # spacing; batches the commits
                break
            self._wake.clear()
            try:
                self.step()
            except Exception:  # a bug in a rule must not stop detection for everyone
                self.errors += 1
                log.exception("event=detect_pass_failed")

    def step(self, now_ns: int | None = None) -> int:
        """One pass; returns the number of anomaly rows written."""
        started = time.monotonic()
        now_ns = time.time_ns() if now_ns is None else now_ns
        self._names.clear()
        self._names.update(self._host_names())
        with self._lock:
            queue: list[tuple[str, Any]]
            queue, self._queue = self._queue, []
            self.taken_bytes, self.queued_bytes = self.queued_bytes, 0
        taken_ns = time.time_ns()
        # Every queued commit's probes in one match (a detector behind its queue catches
        # up instead of re-sorting what is pending once per commit).
        probes = [data for name, data in queue if name == "probes"]
        if probes:
            queue = [("probes", probes), *((n, d) for n, d in queue if n != "probes")]
        for name, data in queue:
            try:
                if name == "probes":
                    self.delays.feed_probe_batches(data, self._clock_state())
                    continue
                if name == "congestion":
                    self.delays.feed_counters(layout.arrow_to_records("counter", data))
                    continue
                if name == "port":
                    self.drops.ports.feed(layout.arrow_to_records("counter", data))
                    continue
                if name == "socket":
                    self.drops.feed_socket(*(data.column(c).to_numpy()
                                             for c in ("ts_ns", "host", "value")))  # fmt: skip
                    continue
                if name == "owd":
                    self.delays.feed(
                        data.column("src").to_numpy(),
                        data.column("dst").to_numpy(),
                        data.column("sport").to_numpy(),
                        data.column("owd_ns_approximate_median").to_numpy(zero_copy_only=False),
                    )
                    continue
                if name in PROBE_TABLES:
                    self.drops.feed(name, data)
                    continue
                if name == "inband_rows":
                    self.job_delays.feed(layout.arrow_to_records("inband", data),
                                         self._clock_state())  # fmt: skip
                    continue
                if name == "inband":
                    for host, job, ts in zip(
                        data.column("host").to_pylist(),
                        data.column("job_id").to_pylist(),
                        data.column("ts_ns_max").to_pylist(),
                        strict=True,
                    ):
                        self.roce.feed_activity(host, job, ts)
                    continue
                rows = layout.arrow_to_records(name, data)
                if name == "counter":
                    self.flaps.feed(rows)
                elif name == "path_hop":
                    self.paths.feed(rows)
                elif name == "rdma_config":
                    self.roce.feed_gids(rows)
                elif name == "job_nccl":
                    self.roce.feed_nccl(rows)
                else:
                    self.roce.feed_jobs(rows)
            except Exception as exc:  # bad input: one line, the pass goes on
                self.errors += 1
                log.warning("event=detect_input_rejected table=%s reason=%r", name, str(exc))
        self._sync_remediations(now_ns)
        before = {a.anomaly_id for a in self.book.open.values()}
        observed = [
            *self.flaps.observations(now_ns),
            *self.paths.observations(now_ns),
            *self.delays.observations(now_ns),
            *self.drops.observations(now_ns),
            *_merge_roce(
                self.roce.observations(now_ns),
                # the probes' excess per host pair: only worth computing with jobs measured
                self.job_delays.observations(
                    now_ns, self.delays.pair_excess() if self.job_delays.flows else {}
                ),
            ),
        ]
        observed = self._with_leaves(observed, now_ns)
        self.survival.judge(observed, self.roce.limits(now_ns), now_ns)  # outages vs jobs
        self._settling = {k: t for k, t in self._settling.items() if t > now_ns}
        if self._settling:  # still true after the grace: a new anomaly (the fix did not take)
            observed = [o for o in observed if o.book_key not in self._settling]
        self.judge(observed)
        for obs in observed:
            a = self.book.observe(obs, now_ns)
            if a.anomaly_id not in before:
                self.opened[a.kind] = self.opened.get(a.kind, 0) + 1
                log.warning(
                    "event=anomaly_opened id=%s kind=%s link=%s job=%s summary=%r",
                    a.anomaly_id, a.kind, a.link, a.job_id, a.summary,
                )  # fmt: skip
        self._fold(now_ns)
        for a in self.book.expire(now_ns):
            log.info("event=anomaly_closed id=%s kind=%s summary=%r", a.anomaly_id, a.kind,
                     a.summary)  # fmt: skip
        written = 0
        changes = self.book.take_changes()
        if changes is not None and self.writer is not None:
            name = f"r{now_ns // 1_000_000}.parquet"
            self.writer.write_partitioned("anomalies", changes, name)
            written = changes.num_rows
        self._live = [a.live(now_ns) for a in self.book.open.values()]
        self._jobs = self.roce.live(now_ns)
        self._queues = self.delays.pair_queues()
        self._recent = [a.live(now_ns) for a in self.book.closed[-10:]]
        self.passes += 1
        self.last_pass_s = time.monotonic() - started
        if self.on_pass is not None:  # the pipeline's health (clock_runner.PipelineHealth)
            self.on_pass(taken_ns, time.time_ns())
        return written

    def _with_leaves(self, observed: list[Observation], now_ns: int) -> list[Observation]:
        """A leaf that went as a whole (:class:`LinkFlaps`) took its uplinks with it: the
        path tomography's outage of one of its leaf–spine links that began while it was
        down, or within :data:`LEAF_SETTLE_NS` after without a trace across it since the
        leaf was back (its BGP session coming back), is the leaf's: the link is not
        observed for it (nor a group of links no trace tells apart, one of which is such a
        link); an anomaly of its opened with the leaf folds into the leaf's."""
        if not self.flaps.leaves:
            return observed
        out = []
        for obs in observed:
            e = obs.evidence
            fabric = obs.kind == "flapping_link" and "spine" in e and not e.get("switch")
            # a link, or links no trace tells apart ("leaf2-spine2 or leaf3-spine2"): one
            # of them is a leaf's that went whole, which explains the paths lost
            leaves = sorted(set(e.get("racks_exposed") or [e.get("leaf")])) if fabric else []
            # what it is observed for: its outage now, else the one that just ended (its
            # earlier ones, in its flap window, are its own history)
            done = e.get("outages_ns") or []
            start = e.get("down_since_ns") or (done[-1][0] if done else 0)
            candidates = [c for c in e.get("candidates") or () if c in self.paths.state]
            found = next(((str(x), o, seen) for x in leaves
                          for seen in [self._seen_from(str(x), candidates)]
                          for o in self.flaps.leaves.get(str(x), ())
                          if _of_leaf(o, start, seen)), None)  # fmt: skip
            if found is None:
                out.append(obs)
                continue
            leaf, event, seen = found
            # the outage stays the leaf's: not counted as a flap of the link later on (nor
            # of a twin on another leaf: no trace told it apart, it is the same outage)
            for c in candidates:
                st = self.paths.state[c]
                own = seen if self.paths.links[c].leaf != leaf else st.last_ok_ns
                if st.outages and _of_leaf(event, st.outages[-1].down_ns, own):
                    st.outages[-1].whole_leaf = leaf
            # an anomaly of its own opened before the leaf went stays its own (it closes
            # once not observed for its clear time); one opened with the leaf folds into it
            a = self.book.open.get(("flapping_link", obs.key))
            if a is not None and a.opened_ns >= event.down_ns - LEAF_SKEW_NS:
                self._leaf_folded.append((obs.key, leaf))
        return out

    def _seen_from(self, leaf: str, candidates: list[str]) -> int:
        """The newest trace, before their outage, across those of ``candidates`` that are
        ``leaf``'s uplinks: one after the leaf was back means its BGP had come back too,
        and the outage is the link's own. A twin on another leaf (no trace told them
        apart) carried traffic all along whatever ``leaf`` did: it tells nothing."""
        return max((self.paths.state[c].last_ok_ns for c in candidates
                    if self.paths.links[c].leaf == leaf), default=0)  # fmt: skip

    def _fold(self, now_ns: int) -> None:
        """A link named on its own, then found to be one of a spine's that went as a whole
        (:meth:`FabricPaths.take_folded`), or a host link or a leaf–spine link of a leaf
        that did (:meth:`LinkFlaps.take_folded`, :meth:`_with_leaves`): its anomaly closes
        now, naming the switch's — not left saying "down now" until it clears."""
        folded, self._leaf_folded = self._leaf_folded, []
        for old, into in [*self.paths.take_folded(), *self.flaps.take_folded(), *folded]:
            a = self.book.open.get(("flapping_link", old))
            b = self.book.open.get(("flapping_link", into))
            if a is None or b is None or a is b:
                continue
            a.summary = (f"{a.summary.split(';')[0]}; folded into {b.anomaly_id}: {b.link} "
                         "went as a whole")  # fmt: skip
            a.evidence = {**a.evidence, "down_now": False, "folded_into": b.anomaly_id}
            self.book.close(a, now_ns)
            log.info("event=anomaly_closed id=%s kind=%s folded_into=%s", a.anomaly_id,
                     a.kind, b.anomaly_id)  # fmt: skip

    def _sync_remediations(self, now_ns: int) -> None:
        """Remediations in force (the store's ``remediations`` table, written by
        ``clockmesh remediate record``): a link taken out of service is out of the path
        tomography, and the anomaly a remediation dealt with closes now, naming it."""
        if self.writer is None:
            return
        root = self.writer.root / "remediations"
        files = (
            frozenset(p.name for p in root.glob("*/*/*.parquet")) if root.is_dir() else frozenset()
        )
        if files == self._remediation_files:
            return
        self._remediation_files = files
        try:
            in_force = remediations.active(self.writer.root)
        except remediations.RecordError as exc:
            self.errors += 1
            log.warning("event=detect_remediations_unreadable reason=%r", str(exc))
            return
        links_out = {r.target: r for r in in_force if r.action == "fabric_link_out"}
        self.paths.maintenance = set(links_out)
        self.flaps.maintenance = {r.target for r in in_force if r.action == "host_drain"}
        self.drops.drained = set(self.flaps.maintenance)
        for r in in_force:
            if r.remediation_id in self._applied:
                continue
            self._applied.add(r.remediation_id)
            for a in list(self.book.open.values()):
                if dealt_with(a, r):
                    self.book.close(a, now_ns, closed_by=r.remediation_id)
                    self._settling[a.book_key] = now_ns + int(REMEDIATION_SETTLE_S * 1e9)
                    log.info("event=anomaly_closed id=%s kind=%s by=%s", a.anomaly_id, a.kind,
                             r.remediation_id)  # fmt: skip

    def _recent_contention(self) -> list[Anomaly]:
        """The ``contention`` anomalies open, or closed in the last CONTENDED_S: the loss
        on the paths through a queue they name is that queue's (:meth:`_contended`,
        :meth:`_full_ports`)."""
        now = self.paths.newest_ns
        return [a for a in [*self.book.open.values(), *self.book.closed[-50:]]
                if a.kind == "contention"
                and not (a.closed_ns and now - a.closed_ns > int(CONTENDED_S * 1e9))]  # fmt: skip

    def _contended(self) -> set[tuple[str, str]]:
        """Leaf–spine link-directions ``(link, direction)`` a recent ``contention`` names:
        a saturated shallow queue drops a share of every flow through it while what gets
        through barely waits (held-out seed 1251: the drops of leaf3-spine2's queue, 2–5 µs
        of delay rise, were paged as "spine2 silently drops about 2 %" three times), so
        their loss is the queue's, not a bad optic's."""
        return {(a.link, str(a.evidence["direction"])) for a in self._recent_contention()
                if a.link and a.evidence.get("direction")}  # fmt: skip

    def _full_ports(self) -> set[int]:
        """Hosts whose own port a ``contention`` observed in the last CONTENDED_S names
        (``evidence.host``): the probes a full queue there drops are its own, not a
        switch's silent drop (:meth:`SilentDrops._port_queued`), nor the host cut off.
        Observed, not open: an anomaly stays open 60 s after its last sighting. On the demo
        lab a host's egress shaped to 8 kbit/s was judged contended once, in one pass, and
        the host cut off was held back for as long as that stayed open: both closed while
        the shaper stood, and no anomaly was open for 27 s."""
        now = self.paths.newest_ns
        names = {a.evidence["host"] for a in self._recent_contention() if a.evidence.get("host")
                 and now - a.last_seen_ns <= int(CONTENDED_S * 1e9)}  # fmt: skip
        if not names:
            return set()
        return {h for h, n in self._names.items() if n in names}

    def _links_not_judged(self) -> set[str]:
        """Leaf-spine links whose paths' loss is someone else's: suspected by the path
        tomography (a flap) or out of service by a remediation — and every one while the
        fabric converges (a link flapped in the last FABRIC_SETTLE_S: sessions drop and
        routes move, and a control plane starved of CPU can drop several at once)."""
        settle = int(FABRIC_SETTLE_S * 1e9)
        for st in self.paths.state.values():
            if st.down_since or (st.outages and self.paths.newest_ns - st.outages[-1].up_ns
                                 < settle):  # fmt: skip
                return set(self.paths.links)
        return {n for twins, _, _ in self.paths.suspects() for n in twins} | self.paths.maintenance

    def judge(self, observed: list[Observation]) -> None:
        """The model names each candidate's class, with its probability and evidence in
        words; the rule that found it stays in the evidence (``rule``). Silent drops are a
        rule class the model was not trained on: it does not re-judge them."""
        observed = [o for o in observed if o.kind not in RULE_ONLY]
        if self.model is None or not observed:
            return
        try:
            verdicts = self.model.judge(features.matrix([o.evidence for o in observed]))
        except Exception as exc:  # a model that cannot score: rules alone, said once per pass
            self.errors += 1
            log.warning("event=detect_model_failed reason=%r", str(exc))
            return
        for obs, v in zip(observed, verdicts, strict=True):
            obs.rule = obs.kind
            # The shipped model learnt contention from millisecond queues: a sub-millisecond
            # one beyond its routes' own healthy noise is outside what it knows, and it
            # abstains ("unknown"). The rule's calibrated verdict stands then; the model's
            # opinion stays in the evidence.
            keep = obs.rule == "contention" and v.kind == "unknown"
            obs.kind = obs.rule if keep else v.kind
            obs.score = obs.score if keep else round(v.severity, 2)
            obs.evidence = {
                **obs.evidence,
                "rule": obs.rule,
                "model": {"class": v.kind, "probability": round(v.probability, 2), "why": v.why},
            }

    # ---- readers (event loop) --------------------------------------------------------
    def live(self) -> dict:
        open_ = sorted(self._live, key=lambda a: -a["score"])
        counts = dict.fromkeys(KINDS, 0)
        for a in open_:
            counts[a["kind"]] = counts.get(a["kind"], 0) + 1
        return {
            "open": open_,
            "open_by_kind": counts,
            "recently_closed": self._recent[::-1],
            "model": self.model_note,
            "clear_s": self.book.clear_ns / 1e9,  # an anomaly not seen this long closes
        }

    def jobs(self) -> list[dict]:
        """The running jobs as of the last pass (:meth:`RoceJobs.live`)."""
        return self._jobs

    def pair_queues(self) -> dict[tuple[int, int], float]:
        """(src, dst) host ids -> queue (ns) of each pair the last pass judged slow
        (:meth:`PathDelays.pair_queues`)."""
        return self._queues

    def collector(self) -> Collector:
        return _DetectCollector(self)


class _DetectCollector(Collector):
    def __init__(self, runner: DetectRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterable[Metric]:
        r = self.runner
        g = GaugeMetricFamily(
            "clockmesh_anomalies_open", "Anomalies open now, by class", labels=["kind"]
        )
        for kind, n in r.live()["open_by_kind"].items():
            g.add_metric([kind], n)
        yield g
        c = CounterMetricFamily(
            "clockmesh_anomalies_opened", "Anomalies opened since start, by class", labels=["kind"]
        )
        for kind, n in r.opened.items():
            c.add_metric([kind], n)
        yield c
        yield CounterMetricFamily(
            "clockmesh_detect_errors", "Detector passes or inputs that failed", value=r.errors
        )
        yield GaugeMetricFamily(
            "clockmesh_detect_pass_seconds", "Duration of the last detector pass",
            value=r.last_pass_s,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "clockmesh_detect_queue_bytes",
            "Input waiting for the detector's next pass (bytes; grows while it is behind)",
            value=r.queued_bytes,
        )
        yield GaugeMetricFamily(
            "clockmesh_detect_pass_input_bytes", "Input the last detector pass took (bytes)",
            value=r.taken_bytes,
        )  # fmt: skip
        d = r.delays
        c = CounterMetricFamily(
            "clockmesh_detect_probes", "Probes the contention check matched, by outcome",
            labels=["outcome"],
        )  # fmt: skip
        for outcome, n in (("judged", d.joined_total), ("lost", d.lost_total)):
            c.add_metric([outcome], n)
        yield c
        yield CounterMetricFamily(
            "clockmesh_detect_contention_unsure",
            "Host ports not named: their one-way delays showed a queue, their host's round"
            " trips did not (a clock error looks like that)",
            value=d.unsure_total,
        )
        c = CounterMetricFamily(
            "clockmesh_detect_silent_drop_held",
            "Places whose loss looked like a silent drop but were not named, by reason:"
            " one_source (all lossy paths from one sender), queue (loss came with a delay rise),"
            " named (narrower places named in the last 15 s explain all its lossy paths),"
            " burst (a random share of its probes lost, but in a burst: passes),"
            f" few_seconds (... lost in fewer than {GRAY_MIN_SECONDS} of the window's seconds:"
            " passes), socket (a host's received share while its collector's socket dropped"
            " datagrams, or no count of them: passes)",
            labels=["reason"],
        )
        for reason, n in (("one_source", r.drops.one_source), ("queue", r.drops.held_as_queue),
                          ("named", r.drops.held_as_named),
                          ("burst", r.drops.held_as_burst),
                          ("few_seconds", r.drops.held_as_few_seconds),
                          ("socket", r.drops.held_as_socket)):  # fmt: skip
            c.add_metric([reason], n)
        yield c


def _nbytes(data: Any) -> int:
    """Memory held by a queued item (numpy arrays, Arrow tables, and tuples or dicts of
    them)."""
    if isinstance(data, np.ndarray | pa.Table):
        return int(data.nbytes)
    if isinstance(data, tuple | list):
        return sum(_nbytes(d) for d in data)
    if isinstance(data, dict):
        return sum(_nbytes(d) for d in data.values())
    return 0
