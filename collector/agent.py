"""The collector process: one selector loop, plus the shipper thread.

The loop owns the probe sockets, the in-band hook and every timer (coded-pair
schedule, record flush, counters, RDMA config, jobs, health, status file);
records go to per-table numpy buffers, are appended to the open spool segment
every ``FLUSH_S`` and the segment is rolled (fsync) every ``spool.roll_s``. The
shipper thread posts closed segments. SIGTERM/SIGINT: flush, roll, stop.
SIGHUP: reload the config (a bad one is logged and the old one kept).

Over 500 lines: the one selector loop and every timer and socket it owns; the work itself
is in other modules.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from collector import buddies as buddies_mod
from collector import config as config_mod
from collector import fleet_key, rdma_config, records
from collector.config import CollectorConfig, box_key
from collector.configfile import ConfigError
from collector.inband import InbandHook
from collector.lab_clock import RecordingClock
from collector.link_watch import LinkWatch
from collector.probe_mesh import ProbeMesh
from collector.probe_packet import PacketCodec
from collector.record_buffer import RecordBuffer
from collector.shipper import Shipper, Shippers
from collector.spool import Spool
from collector.sysfs_counters import SysfsCounters

log = logging.getLogger("clockmesh.collector")
# A multiple of TICK_S (flushes fall on ticks: one wake-up for both; a wake-up of its own
# for the flushes cost ~0.3 % of a core in bench_collector). The spool rolls at a flush
# once its open segment is roll_s old and opens the next one at the next flush, so this
# also sets the segment cadence: the ticks being 0.15-0.45 s apart, ~1.45 s on average at
# roll_s 1 (at most 1.9 s), ~1.0 s at 0.5 (at most 1.4 s).
FLUSH_S = 0.3
RDMA_CONFIG_S = 10.0
JOBS_S = 5.0
STATUS_S = 1.0
# The loop wakes once per tick (not once per datagram): it sends the pairs due in the
# coming tick; every FLUSH_S it drains the probe sockets (TX timestamps, echoes,
# probes, each kind in one bulk pass) and writes the records. Kernel timestamps make
# the batching invisible in the data. A wake-up costs ~50-150 us of CPU on a VM, and
# every tick and drain has a fixed numpy cost, so 3.3 ticks per second, each one
# also a drain (benchmark at 1,000 probes/s: 10 ticks/s used ~0.7 % of a core less
# than 20/s, and 3.3 less than 10; see docs/collector.md), not one wake-up per datagram.
TICK_S = 0.3
# Each tick lasts TICK_S ± this share of it, drawn uniformly (mean TICK_S): the probes of
# a tick leave together, so strictly periodic ticks would sample every queue at a fixed
# phase of any traffic whose period divides TICK_S (a job sending every 5 ms, a training
# step) and see it always or never. Random instants sample a queue as it is over time
# (RFC 2330's reason for random sampling intervals).
TICK_JITTER = 0.5
SHUTDOWN_SHIP_S = 2.0
# Urgent segments: a watched link changed state, or a traced path moved to another
# spine. The segment is rolled and shipped at once instead of at the next roll; the
# answers of the re-trace a path change starts are drained this long after it went out.
RETRACE_DRAIN_S = 0.05
URGENT_MIN_S = 0.1  # at most one urgent roll this often (a link flapping at 50 Hz)


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... event=...`` lines (messages are key=value already)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


def setup_logging(level: str) -> None:
    root = logging.getLogger("clockmesh")
    if not any(isinstance(h.formatter, KeyValueFormatter) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(KeyValueFormatter())
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level.upper())


def _atomic_write(path: Path, data: str) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _kept_lab_t0(directory: Path) -> int:
    """The lab clock's ``t0`` kept in ``directory/lab_clock_t0`` by an earlier run of this
    host's collector, or now (written there) when there is none or it is unreadable: a
    real clock's error does not step back when a process restarts."""
    path = directory / "lab_clock_t0"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        pass
    now = time.time_ns()
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, f"{now}\n")
    return now


class Collector:
    """Everything one host's collector does; :meth:`run` blocks until stopped."""

    def __init__(
        self, cfg: CollectorConfig, config_path: str | Path | None = None, pyverbs: Any = None
    ) -> None:
        self.cfg = cfg
        self._pyverbs = pyverbs  # tests pass a fake pyverbs here
        self.rdma: Any = None
        self.config_path = config_path
        self.key = fleet_key.read(cfg.fleet_key_file, config_path or "collector.yml")
        self.host_id = records.host_id(cfg.host)
        self.clock = RecordingClock(
            cfg.lab_clock, _kept_lab_t0(Path(cfg.spool.dir)) if cfg.lab_clock else None
        )
        self.started_unix = time.time()
        self.buffers = {name: RecordBuffer(name) for name in records.TABLES}
        self.spool = Spool(
            cfg.spool.dir,
            cfg.host,
            self.host_id,
            max_bytes=cfg.spool.max_bytes,
            roll_s=cfg.spool.roll_s,
            roll_bytes=cfg.spool.roll_bytes,
            max_roll_s=cfg.spool.max_roll_s,
            boxes=[box_key(url) for url in cfg.ingest.targets()],
        )
        self.shippers = Shippers(  # one shipping thread per ops box
            self.spool,
            cfg.ingest.targets(),
            self.key,
            timeout_s=cfg.ingest.timeout_s,
            retry_max_s=cfg.ingest.retry_max_s,
            ca_file=cfg.ingest.ca_file,
        )
        self.mesh: ProbeMesh | None = None
        self.inband: InbandHook | None = None
        self.counters: SysfsCounters | None = None
        self.links: LinkWatch | None = None
        self.links_note = ""
        self._urgent = False
        self._urgent_flush_at = 0.0
        self._last_urgent = 0.0
        self.urgent_rolls = 0
        self.verbs_note = ""
        self._rdma_fp = b""
        self._jobs_fp = b""
        self._jobs: rdma_config.JobScanner | None = None
        self._stop = False
        self._reload = False
        # Signals, stop requests and the in-band hook wake the loop; probe sockets do
        # not (they are drained every FLUSH_S). The hook must: a unix datagram queue
        # holds only net.unix.max_dgram_qlen (default 10) datagrams.
        self._wake_sel = selectors.DefaultSelector()
        self._tick_rng = random.Random()  # the ticks' jitter (TICK_JITTER)
        self._last_status: tuple[float, int, int] = (time.monotonic(), 0, 0)
        self.rates = (0.0, 0.0)
        self.reloads = 0
        self.reload_errors = 0
        self.state = "running"

    # ---- set-up / tear-down ---------------------------------------------------------
    def _open_io(self) -> None:
        cfg = self.cfg
        chosen = buddies_mod.choose(cfg.host, cfg.rack, cfg.peers, cfg.probe.buddies_random)
        self.mesh = ProbeMesh(cfg, chosen, PacketCodec(self.key), self.clock, self.buffers)
        self.mesh.rdma = self.rdma
        self.mesh.open()  # its sockets are drained every FLUSH_S, not selected
        # from now on a probe sent to this host is heard: the ops box tells this run
        # from the one before it (a restart) by this, in every segment's header
        self.spool.run_ns = time.time_ns()
        mesh = self.mesh
        self.inband = InbandHook(cfg.inband.socket, self.host_id, self.clock)
        self._wake_sel.register(self.inband.sock, selectors.EVENT_READ, self._on_inband)
        interfaces = cfg.counters.interfaces or [cfg.backend.interface]
        self.counters = SysfsCounters(
            cfg.counters.sysfs_root, interfaces, cfg.counters.rdma_devices
        )
        self._rdma_fp = b""
        self._jobs_fp = b""
        try:
            self.links = LinkWatch(interfaces)
            self._wake_sel.register(self.links.sock, selectors.EVENT_READ, self._on_link_event)
        except OSError as exc:  # no netlink here: link changes wait for the next sample
            self.links = None
            self.links_note = f"link events off: {exc}"
            log.warning("event=link_watch_off reason=%r", str(exc))
        log.info(
            "event=probe_mesh host=%s address=%s buddies=%s ports=%d pairs_per_s=%.1f counters=%d",
            cfg.host,
            cfg.backend.address,
            ",".join(p.name for p in chosen) or "-",
            cfg.probe.ports_per_buddy,
            len(mesh.slots) * cfg.probe.rate_per_port,
            len(self.counters),
        )

    def _close_io(self) -> None:
        if self.mesh is not None:
            self.mesh.drain()
            self.mesh.flush(time.time_ns() + 10**12)  # everything left, USER where needed
            self.mesh.close()
        if self.inband is not None:
            self._wake_sel.unregister(self.inband.sock)
            self.inband.close()
            self.inband = None
        if self.counters is not None:
            self.counters.close()
        if self.links is not None:
            self._wake_sel.unregister(self.links.sock)
            self.links.close()
            self.links = None

    def _probe_verbs(self) -> None:
        """RDMA UD probes when pyverbs imports and a port has our RoCE v2 GID."""
        if not self.cfg.rdma.pyverbs:
            self.verbs_note = "disabled"
            return
        from collector import verbs, verbs_probe

        pv = self._pyverbs if self._pyverbs is not None else verbs_probe.import_pyverbs()
        if pv is None:
            self.verbs_note = "pyverbs not importable; UDP probes only"
            log.info("event=pyverbs_unavailable action=udp_only")
            return
        try:
            devices = verbs.enumerate_devices(pv.device) or []
            gid = verbs_probe.ipv4_mapped_gid(self.cfg.backend.address)
            choice = verbs_probe.choose_port(devices, gid)
            if choice is None:
                self.verbs_note = f"no RoCE v2 GID {gid} on any RDMA port; UDP probes only"
                log.info("event=rdma_probes_off reason=%r", self.verbs_note)
                return
            dev, port, index = choice
            self.rdma = verbs_probe.UdProber(
                pv, dev, port, index, PacketCodec(self.key), self.clock, self.host_id,
                self.buffers, int(self.cfg.probe.max_age_s * 1e9),
                int(self.cfg.probe.pair_spacing_us * 1000),
            )  # fmt: skip
        except Exception as exc:  # any pyverbs failure: carry on with UDP
            self.verbs_note = f"RDMA probes unavailable: {exc}; UDP probes only"
            log.warning("event=rdma_probes_off reason=%r", str(exc))
            return
        self.verbs_note = (
            f"RDMA UD probes on {dev} port {port} GID index {index} QPN {self.rdma.qpn}"
        )
        log.info("event=rdma_probes_on device=%s port=%d gid_index=%d qpn=%d", dev, port, index,
                 self.rdma.qpn)  # fmt: skip

    # ---- periodic work --------------------------------------------------------------
    def _on_inband(self) -> None:
        assert self.inband is not None
        rows, jobs = self.inband.drain()
        if len(rows):
            self.buffers["inband"].extend(rows)
        if len(jobs):
            self.buffers["job_rdma"].extend(jobs)

    def _on_link_event(self) -> None:
        """A watched interface changed state: sample the counters now and ship them."""
        assert self.links is not None
        if self.links.drain():
            self._sample_counters()
            self._urgent = True
            self.flush()

    def _sample_counters(self) -> None:
        if self.counters is not None and len(self.counters):
            self.buffers["counter"].extend(self.counters.sample(self.clock.now(), self.host_id))

    def _scan_rdma_config(self) -> None:
        cfg = self.cfg
        rows = rdma_config.gid_table(
            cfg.counters.sysfs_root, cfg.rdma.configfs_root, self.clock.now(), self.host_id
        )
        fp = rdma_config.fingerprint(rows)
        if fp != self._rdma_fp:
            self._rdma_fp = fp
            self.buffers["rdma_config"].extend(rows)
            log.info("event=rdma_config gids=%d", len(rows))

    def _scan_jobs(self) -> None:
        if self._jobs is None or self._jobs.same_netns != self.cfg.lab:
            self._jobs = rdma_config.JobScanner(same_netns=self.cfg.lab)
        found = self._jobs.scan(time.monotonic())
        rows, nccl = rdma_config.job_snapshot(
            self.cfg.rdma.nccl_conf,
            self.clock.now(),
            self.host_id,
            found=found,
            sysfs_root=self.cfg.counters.sysfs_root,
        )
        fp = rdma_config.fingerprint(rows) + rdma_config.fingerprint(nccl)
        if fp != self._jobs_fp:
            if not len(rows):
                # No job (or the last one ended): say so, or the ops box would think a
                # job it saw before still runs here.
                rows = rdma_config.no_jobs_row(self.clock.now(), self.host_id)
            self._jobs_fp = fp
            self.buffers["job_rdma"].extend(rows)
            if len(nccl):  # the same snapshot: same ts_ns as its job_rdma rows
                nccl["ts_ns"] = rows["ts_ns"].max()
                self.buffers["job_nccl"].extend(nccl)
            log.info("event=job_rdma rows=%d nccl=%d", len(rows), len(nccl))

    def health_values(self) -> dict[str, int]:
        mesh = self.mesh
        values: dict[str, int] = {}
        if mesh is not None:
            for name in ("probes_sent", "probes_received", "echoes_sent", "echoes_received",
                         "traces_sent", "trace_answers", "path_changes",
                         "watch_traces", "traces_arrived"):  # fmt: skip
                values[name] = mesh.stats[name]
            values["tx_ts_kernel"] = mesh.stats["tx_ts_kernel"]
            values["tx_ts_user"] = mesh.stats["tx_ts_user"]
            values["rx_kernel_drops"] = mesh.stats["rx_kernel_drops"]
            values["probe_echo_every"] = mesh.echo_every  # 1 coded pair in N is echoed
            for reason, count in mesh.rejected.items():
                values[f"probes_rejected_{reason}"] = count
            for name, count in mesh.stats.items():
                if name.startswith("send_error_"):
                    values[name] = count
        if self.rdma is not None:
            for name, count in self.rdma.stats.items():
                values[name] = count
            for reason, count in self.rdma.rejected.items():
                values[f"rdma_rejected_{reason}"] = count
        if self.inband is not None:
            values["inband_received"] = self.inband.received
            values["inband_rejected"] = self.inband.rejected
        st = self.spool.stats
        values["spool_dropped_rows"] = st.dropped_rows
        values["spool_dropped_segments"] = st.dropped_segments
        values["spool_rows_written"] = st.rows_written
        values["batches_rejected"] = self.shippers.rejected
        for i, sh in enumerate(self.shippers.all):  # per ops box, in ingest.urls order
            cur = self.spool.boxes.get(sh.box)
            values[f"box{i}_refused"] = sh.stats.refused
            values[f"box{i}_dropped_rows"] = cur.dropped_rows if cur else 0
            values[f"box{i}_dropped_segments"] = cur.dropped_segments if cur else 0
        if self.counters is not None:
            values["counter_files_unreadable"] = self.counters.unreadable
        if self.links is not None:
            values["link_events"] = self.links.events
        values["urgent_rolls"] = self.urgent_rolls
        if self.cfg.lab_clock is not None:
            values["lab_clock_t0_ns"] = self.clock.t0_ns
        return values

    def _health(self) -> None:
        ts = self.clock.now()
        values = self.health_values()
        rows = np.zeros(len(values), records.HEALTH)
        rows["ts_ns"] = ts
        rows["host"] = self.host_id
        rows["name"] = [n.encode()[:40] for n in values]
        rows["value"] = [v & 0xFFFF_FFFF_FFFF_FFFF for v in values.values()]
        self.buffers["health"].extend(rows)

    def flush(self) -> None:
        """Probe sockets drained; buffers -> open segment; roll it when due."""
        if self.mesh is not None:
            self.mesh.drain()
            self.mesh.flush()
        chunks = [(name, buf.take()) for name, buf in self.buffers.items() if len(buf)]
        if chunks:
            self.spool.write_many(chunks)  # one chunk per table, one write
        if self.mesh is not None and self.mesh.tracer.path_changed:
            self.mesh.tracer.path_changed = False
            self._urgent = True
        now = time.monotonic()
        urgent = self._urgent and now - self._last_urgent >= URGENT_MIN_S
        if urgent or self.spool.due():
            if self.spool.roll() is not None and urgent:
                self.urgent_rolls += 1
            if urgent:
                self._urgent, self._last_urgent = False, now
            self.shippers.wake()  # every box's shipper: an urgent segment goes to all at once

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        mesh = self.mesh
        sent = mesh.stats["probes_sent"] if mesh else 0
        recv = mesh.stats["probes_received"] if mesh else 0
        t_prev, s_prev, r_prev = self._last_status
        if now - t_prev >= 0.5:
            self.rates = ((sent - s_prev) / (now - t_prev), (recv - r_prev) / (now - t_prev))
            self._last_status = (now, sent, recv)
        segs, nbytes, rows = self.spool.depth()
        boxes = [self._box_status(sh) for sh in self.shippers.all]
        return {
            "host": self.cfg.host,
            "host_id": self.host_id,
            "pid": os.getpid(),
            "state": self.state,
            "updated_unix": time.time(),
            "started_unix": self.started_unix,
            "config": str(self.config_path or ""),
            "backend_address": self.cfg.backend.address,
            "probes_sent_per_s": round(self.rates[0], 1),
            "probes_received_per_s": round(self.rates[1], 1),
            "probes_sent": sent,
            "probes_received": recv,
            "echoes_received": mesh.stats["echoes_received"] if mesh else 0,
            "buddies": [p.name for p in mesh.buddies] if mesh else [],
            "ports_per_buddy": self.cfg.probe.ports_per_buddy,
            "rejected": dict(mesh.rejected) if mesh else {},
            "rx_kernel_drops": mesh.stats["rx_kernel_drops"] if mesh else 0,
            "tx_timestamps": {
                "kernel": mesh.stats["tx_ts_kernel"] if mesh else 0,
                "user": mesh.stats["tx_ts_user"] if mesh else 0,
            },
            "inband": {
                "received": self.inband.received if self.inband else 0,
                "rejected": self.inband.rejected if self.inband else 0,
            },
            "spool": {
                "dir": self.cfg.spool.dir,
                "roll_s": self.spool.effective_roll_s(),  # spool.roll_s or the ops box's advice
                "advised_roll_s": self.spool.advised_roll_s,
                "segments": segs,
                "bytes": nbytes,
                "rows": rows,
                "dropped_segments": self.spool.stats.dropped_segments,
                "dropped_rows": self.spool.stats.dropped_rows,
                "recovered_segments": self.spool.stats.recovered_segments,
                "rejected_segments": self.spool.stats.rejected_segments,
            },
            # the first ops box's figures (as with one box), and every box's in "boxes"
            "shipping": {**boxes[0], "boxes": boxes},
            "lab_clock": (
                {
                    "offset_ns": self.clock.offset_ns,
                    "drift_ppm": self.clock.drift_ppm,
                    "t0_ns": self.clock.t0_ns,
                }
                if self.cfg.lab_clock is not None
                else None
            ),
            "pyverbs": self.verbs_note,
            "path_tracing": self._tracing_note(),
            "link_events": self.links_note or "on (netlink RTMGRP_LINK)",
            "rdma": (
                {
                    **dict(self.rdma.stats),
                    "rejected": dict(self.rdma.rejected),
                    "qpn": self.rdma.qpn,
                }
                if self.rdma is not None
                else None
            ),
            "reloads": self.reloads,
            "reload_errors": self.reload_errors,
        }

    def _box_status(self, sh: Shipper) -> dict[str, Any]:
        """One ops box's shipping figures (status file ``shipping.boxes``)."""
        st = sh.stats
        cur = self.spool.boxes.get(sh.box)
        waiting = self.spool.box_depth(sh.box) if cur else (0, 0, 0)
        return {
            "url": sh.url,
            "segments_acked": st.segments_acked,
            "rows_acked": st.rows_acked,
            "duplicates": st.duplicates,
            "rejected": st.rejected,
            "refused": st.refused,
            "failures": st.failures,
            "last_ack_segment": st.last_ack_segment,
            "last_ack_unix": st.last_ack_unix,
            "last_error": st.last_error,
            "backoff_s": st.backoff_s,
            "acked_through": cur.acked if cur else 0,
            "waiting_segments": waiting[0],
            "waiting_rows": waiting[2],
            "dropped_segments": cur.dropped_segments if cur else 0,
            "dropped_rows": cur.dropped_rows if cur else 0,
        }

    def _tracing_note(self) -> str:
        if self.mesh is None:
            return ""
        tracer = self.mesh.tracer
        if tracer.trace_note:  # it was on and had to be turned off: say why
            return tracer.trace_note
        if not tracer.trace_every:
            return "off (probe.trace_interval_s: 0)"
        return f"every {tracer.trace_every:g} s at TTL {tracer.trace_ttl}"

    def write_status(self) -> None:
        path = Path(self.cfg.status_file)
        text = json.dumps(self.status(), indent=1) + "\n"
        try:
            try:
                _atomic_write(path, text)
            except FileNotFoundError:  # first write, or someone removed the directory
                path.parent.mkdir(parents=True, exist_ok=True)
                _atomic_write(path, text)
        except OSError as exc:
            log.warning("event=status_write_failed path=%s error=%r", path, exc.strerror)

    # ---- reload ---------------------------------------------------------------------
    def reload(self) -> None:
        if self.config_path is None:
            return
        try:
            new = config_mod.load(self.config_path)
            key = fleet_key.read(new.fleet_key_file, self.config_path)
        except ConfigError as exc:
            self.reload_errors += 1
            log.error("event=reload_failed error=%r action=keep_old_config", str(exc))
            return
        if new.spool.dir != self.cfg.spool.dir or new.host != self.cfg.host:
            log.warning("event=reload_partial reason='host and spool.dir need a restart'")
            new.spool.dir, new.host = self.cfg.spool.dir, self.cfg.host
        self.flush()
        self._close_io()
        old = self.cfg
        self.cfg, self.key = new, key
        self.shippers.set_key(key)
        self.clock = RecordingClock(new.lab_clock, self.clock.t0_ns)
        if self.rdma is not None:
            self.rdma.codec, self.rdma.clock = PacketCodec(key), self.clock
        self.spool.max_bytes = new.spool.max_bytes
        self.spool.roll_s = new.spool.roll_s
        self.spool.max_roll_s = new.spool.max_roll_s
        self.spool.roll_bytes = new.spool.roll_bytes
        self.shippers.set_targets(
            new.ingest.targets(), new.ingest.timeout_s, new.ingest.retry_max_s
        )
        setup_logging(new.log_level)
        try:
            self._open_io()
        except OSError as exc:
            log.error("event=reload_failed error=%r action=keep_old_config", str(exc))
            self.reload_errors += 1
            self._close_io()
            self.cfg = old
            self.clock = RecordingClock(old.lab_clock, self.clock.t0_ns)
            self._open_io()
            return
        self.reloads += 1
        log.info("event=reloaded config=%s", self.config_path)

    # ---- main loop ------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self._stop = True

    def request_reload(self, *_: object) -> None:
        self._reload = True

    def run(self, install_signals: bool = True, ready: Callable[[], None] | None = None) -> int:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        old_handlers: dict[signal.Signals, Any] = {}
        old_fd = -1
        if install_signals and threading.current_thread() is threading.main_thread():
            old_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
            for sig, fn in (
                (signal.SIGTERM, self.request_stop),
                (signal.SIGINT, self.request_stop),
                (signal.SIGHUP, self.request_reload),
            ):
                old_handlers[sig] = signal.signal(sig, fn)
        self._wake_sel.register(wake_r, selectors.EVENT_READ, lambda: _drain(wake_r))
        self._wake_w = wake_w
        try:
            self._probe_verbs()
            self._open_io()
            self.shippers.start()
            self._scan_rdma_config()
            self._scan_jobs()
            self._sample_counters()
            self._health()
            # a run's first segment ships at once: the ops box learns of this run (its
            # header's run_ns) before it judges the probes peers lost while none ran
            self._urgent = True
            self.flush()
            self.write_status()
            log.info(
                "event=started host=%s pid=%d spool=%s ingest=%s lab_clock_t0_ns=%s",
                self.cfg.host,
                os.getpid(),
                self.cfg.spool.dir,
                ",".join(self.cfg.ingest.targets()),
                self.clock.t0_ns if self.cfg.lab_clock else "-",
            )
            if ready is not None:
                ready()
            self._loop()
        finally:
            self._shutdown()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            if old_handlers:
                signal.set_wakeup_fd(old_fd)
            self._wake_sel.unregister(wake_r)
            wake_r.close()
            wake_w.close()
        return 0

    def stop_from_thread(self) -> None:
        """Stop a collector running in another thread (tests, benchmarks)."""
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        now = time.monotonic()
        next_flush = now + FLUSH_S
        next_counters = now + self.cfg.counters.interval_s
        next_rdma = now + RDMA_CONFIG_S
        next_jobs = now + JOBS_S
        next_status = now + STATUS_S
        next_probes = now
        while not self._stop:
            if self._reload:
                self._reload = False
                self.reload()
            now = time.monotonic()
            assert self.mesh is not None
            if now >= next_probes:  # the pairs due until the next random instant
                tick = TICK_S * (1.0 + TICK_JITTER * (2.0 * self._tick_rng.random() - 1.0))
                self.mesh.send_due(now, tick)
                next_probes = now + tick
            self.mesh.tracer.send_traces(now)
            if self.mesh.tracer.retraced:  # a path moved: its re-trace's answers ship promptly
                self.mesh.tracer.retraced = False
                self._urgent_flush_at = now + RETRACE_DRAIN_S
            if self.rdma is not None:
                self.rdma.poll()
            retrace_due = bool(self._urgent_flush_at) and now >= self._urgent_flush_at
            if retrace_due or (self._urgent and now - self._last_urgent >= URGENT_MIN_S):
                self._urgent_flush_at = 0.0
                self._urgent = True
                self.flush()
            elif now >= next_flush:
                self.flush()
                next_flush = now + FLUSH_S - TICK_S / 2  # due at the tick FLUSH_S later
            if now >= next_counters:
                self._sample_counters()
                next_counters += self.cfg.counters.interval_s
                if next_counters < now:
                    next_counters = now + self.cfg.counters.interval_s
            if now >= next_rdma:
                self._scan_rdma_config()
                next_rdma = now + RDMA_CONFIG_S
            if now >= next_jobs:
                self._scan_jobs()
                next_jobs = now + JOBS_S
            if now >= next_status:
                self._health()
                self.write_status()
                next_status = now + STATUS_S
            # Timers run at tick granularity (at most TICK_S late; their rows carry
            # their own timestamps): one wake-up per tick, none extra for timers.
            wake_at = min(next_probes, self.mesh.tracer.trace_due_at())  # the watch: 0.2 s
            if self._urgent_flush_at:
                wake_at = min(wake_at, self._urgent_flush_at)
            elif self._urgent:  # held back by URGENT_MIN_S
                wake_at = min(wake_at, self._last_urgent + URGENT_MIN_S)
            timeout = max(0.0, wake_at - time.monotonic())
            for key, _events in self._wake_sel.select(timeout):
                key.data()

    def _shutdown(self) -> None:
        log.info("event=stopping action=flush")
        try:
            self._health()
            self._close_io()
            if self.rdma is not None:
                self.rdma.poll()
                self.rdma.close()
            self.flush()
            self.spool.close()
        finally:
            self.shippers.stop(self.cfg.ingest.timeout_s + 1.0)
            # Ship what the final roll closed, if the ops boxes answer quickly (each
            # box on its own); whatever is left is durable and ships after the next start.
            self.shippers.drain(SHUTDOWN_SHIP_S)
            self.state = "stopped"
            self.write_status()
        log.info("event=stopped segments_waiting=%d", self.spool.depth()[0])


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(512):
            pass
    except (BlockingIOError, InterruptedError):
        pass
