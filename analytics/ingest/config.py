"""``/etc/clockmesh/ingest.yml``: what the ops-box ingest daemon does.

Written by the ops-box Ansible role. Every key is optional; unknown keys are errors.
See docs/store.md ("Configuration") for each key's meaning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from analytics.store import layout
from collector import configfile, fleet_key

if TYPE_CHECKING:
    from analytics.detect.detect_runner import DetectConfig

DEFAULT_PATH = Path("/etc/clockmesh/ingest.yml")


class IngestConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    listen: str = "0.0.0.0:8470"  # host:port of the HTTP(S) listener
    store_dir: str = "/var/lib/clockmesh/store"
    fleet_key_file: str = "/etc/clockmesh/fleet.key"
    log_level: str = "info"
    tls_cert: str = ""  # PEM certificate chain; serve HTTPS when set (with tls_key)
    tls_key: str = ""
    roll_s: float = 0.2  # group commit: batches received within this interval share one commit
    max_commit_rows: int = 4_000_000  # cap of one commit (the rest goes in the next one)
    max_body_bytes: int = 64 * 1024 * 1024  # larger batches get 413
    min_free_bytes: int = 256 * 1024 * 1024  # below this free space: 503, nothing written
    compression: str = "lz4"  # Parquet codec: lz4, zstd, snappy, gzip, none
    retention: dict[str, str | int] = msgspec.field(default_factory=dict)  # table -> duration
    compact_s: float = 600.0  # how often small files are compacted (and retention applied)
    compact_min_age_s: float = 60.0  # files younger than this are left alone
    dedup_window: str | int = "24h"  # (host, segment) history loaded at start
    hot_window_s: float = 150.0  # cap of how long a probe_rx waits for its probe_tx
    hot_max_rows: int = 0  # memory cap of the hot window (probe rows held); 0: auto
    live_refresh_s: float = 5.0  # recompute the live picture this often
    rollup_grace_s: float = 20.0  # a minute is rolled up once it ended this long ago
    metrics_max_pairs: int = 2000  # per-pair series in /metrics: the worst N by loss
    clock_window_s: float = 2.0  # clock solver window (analytics/clock/clock_runner.py)
    clock_lateness_s: float = 3.0  # a window is solved this long after it ended
    clock_max_rows: int = 0  # memory cap of the clock solver's buffered rows; 0: auto
    max_requests_per_s: float = 420.0  # request budget: acks advise longer segments past it
    max_advised_roll_s: float = 30.0  # longest segment interval the acks advise
    analysis_nice: int = 19  # nice added to the analysis threads (0: same priority)
    reserve_bytes: int = 0  # memory faulted in at start (at least; see docs/store.md)
    # what the hot window and the clock solver may hold together (half each); 0: auto
    memory_budget_bytes: int = 0
    detect_interval_s: float = 0.5  # detector pass period (analytics/detect/detect_runner.py)
    detect_clear_s: float = 60.0  # an anomaly closes once its condition cleared this long
    detect_flap_window_s: float = 600.0  # flaps of a link are counted over this window
    topology_file: str = ""  # lab topology.json (or one built from the inventory): link names
    detect_model_file: str = ""  # detector model (skops); "" = shipped, "none" = rules only


class ResolvedIngest(msgspec.Struct, kw_only=True):
    """Derived values (durations in seconds, the split listen address)."""

    host: str
    port: int
    retention_s: dict[str, float]
    dedup_window_s: float


def detect_config(config: IngestConfig) -> DetectConfig:
    """The detector's settings in ``config``: the daemon's, and a replay's of a run
    (``clockmesh detector replay``)."""
    from analytics.detect.detect_runner import DetectConfig

    return DetectConfig(
        interval_s=config.detect_interval_s,
        clear_s=config.detect_clear_s,
        flap_window_s=config.detect_flap_window_s,
        topology_file=config.topology_file,
        model_file=config.detect_model_file,
    )


def load(path: str | Path = DEFAULT_PATH) -> tuple[IngestConfig, ResolvedIngest]:
    """Load and validate ingest.yml; raises :class:`configfile.ConfigError`."""
    config = configfile.load(path, IngestConfig)
    return config, resolve(config, path)


def resolve(config: IngestConfig, path: str | Path) -> ResolvedIngest:
    def fail(key: str, message: str) -> None:
        raise configfile.ConfigError(path, key, message)

    host, sep, port_text = config.listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        fail("listen", f"expected host:port with a port 1-65535, got {config.listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    if bool(config.tls_cert) != bool(config.tls_key):
        fail("tls_key" if config.tls_cert else "tls_cert", "tls_cert and tls_key go together")
    if config.log_level not in {"debug", "info", "warning", "error"}:
        fail("log_level", "expected one of debug, info, warning, error")
    if config.compression not in {"zstd", "snappy", "lz4", "gzip", "none"}:
        fail("compression", "expected one of zstd, snappy, lz4, gzip, none")
    positive = {
        "roll_s": config.roll_s,
        "max_commit_rows": config.max_commit_rows,
        "max_body_bytes": config.max_body_bytes,
        "compact_s": config.compact_s,
        "hot_window_s": config.hot_window_s,
        "live_refresh_s": config.live_refresh_s,
        "metrics_max_pairs": config.metrics_max_pairs,
        "clock_window_s": config.clock_window_s,
        "max_requests_per_s": config.max_requests_per_s,
    }
    for key, value in positive.items():
        if value <= 0:
            fail(key, "expected a number > 0")
    for key in (
        "min_free_bytes",
        "reserve_bytes",
        "compact_min_age_s",
        "rollup_grace_s",
        "clock_lateness_s",
    ):
        if getattr(config, key) < 0:
            fail(key, "expected a number >= 0")
    budget = config.memory_budget_bytes
    if budget < 0 or 0 < budget < MIN_BUDGET_BYTES or budget > physical_memory():
        fail(
            "memory_budget_bytes",
            f"expected bytes between {MIN_BUDGET_BYTES} (256 MiB) and the machine's memory "
            f"({physical_memory()}), or 0 for {AUTO_BUDGET_PERCENT} % of it; got {budget}",
        )
    for key in ("hot_max_rows", "clock_max_rows"):
        if getattr(config, key) < 0:
            fail(key, "expected a row count > 0, or 0 for the memory-based default")
    for key in ("detect_interval_s", "detect_clear_s", "detect_flap_window_s"):
        if getattr(config, key) <= 0:
            fail(key, "expected a number > 0 (seconds)")
    if config.topology_file:
        if not Path(config.topology_file).is_file():
            fail("topology_file", f"no such file: {config.topology_file}")
        from analytics.detect.detect_runner import load_topology

        try:
            load_topology(config.topology_file)
        except ValueError as exc:
            fail("topology_file", str(exc))
    if not 0 <= config.analysis_nice <= 19:
        fail("analysis_nice", "expected an integer 0-19 (added to the threads' nice value)")
    if config.max_advised_roll_s < 1:
        fail("max_advised_roll_s", "expected a number >= 1 (seconds)")
    retention = {
        name: float(layout.DEFAULT_RETENTION_S[spec.retention_class])
        for name, spec in layout.TABLES.items()
    }
    for table, spec_value in config.retention.items():
        if table not in layout.TABLES:
            fail(
                f"retention.{table}", f"unknown table (expected one of {', '.join(layout.TABLES)})"
            )
        try:
            retention[table] = layout.parse_duration(spec_value)
        except ValueError as exc:
            fail(f"retention.{table}", str(exc))
    try:
        dedup = layout.parse_duration(config.dedup_window)
    except ValueError as exc:
        fail("dedup_window", str(exc))
    return ResolvedIngest(
        host=host, port=int(port_text), retention_s=retention, dedup_window_s=dedup
    )


def read_fleet_key(path: str | Path, config_path: str | Path) -> bytes:
    """The fleet key named by ingest.yml (see :mod:`collector.fleet_key`)."""
    return fleet_key.read(path, config_path)


# Auto caps (hot_max_rows, clock_max_rows = 0): each may hold 1/AUTO_MEMORY_PARTS of the
# machine's memory in rows of about this size (collector records are 40-64 bytes, the hot
# window's joined rows 26).
AUTO_MEMORY_PARTS = 4
AUTO_ROW_BYTES = 48


MIN_BUDGET_BYTES = 256 << 20
AUTO_BUDGET_PERCENT = 40  # of the machine's memory (or of a cgroup v2 memory.max)


def physical_memory() -> int:
    """The machine's memory, or a cgroup (v2) ``memory.max`` of this process when lower."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        group = next(line[3:] for line in lines if line.startswith("0::"))
        limit = (Path("/sys/fs/cgroup") / group.lstrip("/") / "memory.max").read_text().strip()
        if limit != "max":
            memory = min(memory, int(limit))
    except (OSError, ValueError, StopIteration):
        pass
    return memory


def memory_budget(configured: int) -> dict[str, int]:
    """Bytes the hot window (``hot``) and the clock solver's buffers (``clock``) may hold:
    half each of ``memory_budget_bytes``, or for 0 of :data:`AUTO_BUDGET_PERCENT` % of
    :func:`physical_memory`. The rest of the machine is for the commit path (request
    bodies, records being converted), the rollups' DuckDB and the solver's temporaries.
    Past its share each drops its oldest rows (docs/store.md, "Memory")."""
    total = configured or physical_memory() * AUTO_BUDGET_PERCENT // 100
    return {"hot": total // 2, "clock": total - total // 2}


def auto_max_rows(configured: int) -> int:
    """``configured``, or for 0 the rows that fit in a quarter (:data:`AUTO_MEMORY_PARTS`)
    of the physical memory. A 12,500-host fleet needs ~110 M rows in the hot window (a minute
    and its grace of joined probes, plus unmatched ones) and ~75 M in the clock solver
    (its lateness of probe_tx, probe_rx and echo rows): ~5 GiB each."""
    if configured > 0:
        return configured
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1_000_000, memory // AUTO_MEMORY_PARTS // AUTO_ROW_BYTES)
