"""``/etc/clockmesh/collector.yml``: what one collector does.

Written by the ``clockmesh_collector`` role from inventory variables; see
``roles/clockmesh_collector/templates/collector.yml.j2`` and docs/configuration.md.
Every key is optional except ``host``, ``backend.address``, ``ingest.url`` (or
``ingest.urls``, one per ops box) and ``fleet_key_file``. Unknown keys are errors (a typo must not silently fall back
to a default).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import msgspec

from collector import configfile

DEFAULT_PATH = Path("/etc/clockmesh/collector.yml")
ECHO_EVERY_DEFAULT = 8  # probe.echo_every: 1 coded pair in 8 per (buddy, port) is echoed


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Peer(_Strict, kw_only=True):
    """Another fleet host this collector may probe."""

    name: str
    address: str  # backend-fabric IPv4 address
    rack: str = ""


class Backend(_Strict, kw_only=True):
    interface: str = "eth0"  # backend-fabric netdev (counters, SO_BINDTODEVICE)
    address: str  # this host's backend address (probes are sent from it)
    probe_port: int = 7470  # UDP port probes and echoes arrive on


class Probe(_Strict, kw_only=True):
    buddies_random: int = 10  # K: buddies outside the own rack, chosen stably per host
    ports_per_buddy: int = 8  # UDP source ports per buddy (ECMP paths covered)
    base_sport: int = 40000  # first source port; the others follow
    rate_per_port: float = 1.0  # coded pairs per second per (buddy, port)
    pair_spacing_us: float = 20.0  # intended TX spacing inside a coded pair
    # Echo sampling for the RTT/2 baseline: both probes of every N-th coded pair per
    # (buddy, source port) carry the echo flag; 0: no echoes, 1: every probe.
    # Unset: ``echo`` if given, else ECHO_EVERY_DEFAULT (see echo_ratio()).
    echo_every: int | None = None
    echo: bool | None = None  # deprecated: false = echo_every 0, true = echo_every 1
    max_age_s: float = 5.0  # probes older than this (by their send time) are stale
    # Path tracing: every trace_interval_s, one TTL-limited probe per (buddy in another
    # rack, source port); the router at hop trace_ttl answers with ICMP time exceeded,
    # naming the ECMP path that port takes (path_hop rows). 0: off.
    trace_interval_s: float = 2.0
    trace_ttl: int = 2  # hop 2 of host -> leaf -> spine -> leaf -> host is the spine
    # Watch: every watch_interval_s, one trace per uplink router (the 5-tuple that last
    # crossed it) and, while a path is away from its router, one per (rack, router) it
    # left, until it is back: outages are known to this interval, not trace_interval_s.
    # 0: off (outages known to the trace interval).
    watch_interval_s: float = 0.2
    # DSCP of probes, echoes and traces: the RDMA traffic class (RoCE v2 commonly uses
    # 26), so they see the queues RDMA traffic sees. 0: best effort.
    dscp: int = 26

    def echo_ratio(self) -> int:
        """N of "echo 1 coded pair in N" (0: none), from echo_every or the old echo flag."""
        if self.echo_every is not None:
            return self.echo_every
        if self.echo is not None:
            return 1 if self.echo else 0
        return ECHO_EVERY_DEFAULT


class Ingest(_Strict, kw_only=True):
    url: str = ""  # ops-box ingest endpoint, e.g. http://198.19.0.1:8470
    # Several ops boxes (a standby pair): every segment is shipped to each of them.
    # Exactly one of url and urls is set.
    urls: list[str] = msgspec.field(default_factory=list)
    ca_file: str = ""  # CA bundle when the ops box serves TLS
    timeout_s: float = 5.0
    retry_max_s: float = 30.0  # cap of the exponential back-off while unreachable

    def targets(self) -> list[str]:
        """Every ops box's ingest URL, in the order given (the first is the primary)."""
        return list(self.urls) if self.urls else [self.url]


def box_key(url: str) -> str:
    """A file-name-safe name of one ops box's ingest URL; two spellings of the same
    endpoint (host case, default port, trailing slash) give the same key."""
    parts = urllib.parse.urlsplit(url.strip())
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    name = f"{scheme}_{(parts.hostname or '').lower()}_{port}{parts.path.rstrip('/')}"
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name)


class Spool(_Strict, kw_only=True):
    dir: str = "/var/lib/clockmesh/spool"
    max_bytes: int = 256 * 1024 * 1024  # oldest segments are dropped (and counted) past this
    roll_s: float = 1.0  # a segment is closed, fsynced and shipped this often
    roll_bytes: int = 4 * 1024 * 1024
    # the ops box may advise longer segments (in its acks); never longer than this
    max_roll_s: float = 30.0


class Counters(_Strict, kw_only=True):
    interval_s: float = 1.0
    sysfs_root: str = "/"  # tests and the lab point this at recorded trees
    interfaces: list[str] = msgspec.field(default_factory=list)  # default: backend.interface
    rdma_devices: list[str] = msgspec.field(default_factory=list)  # default: all found


class Rdma(_Strict, kw_only=True):
    pyverbs: bool = True  # use pyverbs where importable
    nccl_conf: str = "/etc/nccl.conf"
    configfs_root: str = "/sys/kernel/config"


class Inband(_Strict, kw_only=True):
    socket: str = "/run/clockmesh/inband.sock"


class LabClock(_Strict, kw_only=True):
    """Lab only: skew applied to every recorded timestamp (requires ``lab: true``)."""

    offset_ns: int = 0
    drift_ppm: float = 0.0


class CollectorConfig(_Strict, kw_only=True):
    host: str
    rack: str = ""
    lab: bool = False
    fleet_key_file: str = "/etc/clockmesh/fleet.key"
    backend: Backend
    peers: list[Peer] = msgspec.field(default_factory=list)
    probe: Probe = msgspec.field(default_factory=Probe)
    ingest: Ingest
    spool: Spool = msgspec.field(default_factory=Spool)
    counters: Counters = msgspec.field(default_factory=Counters)
    rdma: Rdma = msgspec.field(default_factory=Rdma)
    inband: Inband = msgspec.field(default_factory=Inband)
    lab_clock: LabClock | None = None
    status_file: str = "/run/clockmesh/collector.status.json"
    log_level: str = "info"


def load(path: str | Path = DEFAULT_PATH) -> CollectorConfig:
    """Load and validate collector.yml; raises :class:`configfile.ConfigError`."""
    config = configfile.load(path, CollectorConfig)
    validate(config, path)
    return config


def validate(config: CollectorConfig, path: str | Path) -> None:
    """Checks a schema cannot express: ranges and cross-key rules."""

    def need(ok: bool, key: str, message: str) -> None:
        if not ok:
            raise configfile.ConfigError(path, key, message)

    need(config.lab_clock is None or config.lab, "lab_clock", "only allowed with lab: true")
    need(1 <= config.backend.probe_port <= 65535, "backend.probe_port", "expected a port 1-65535")
    need(config.probe.ports_per_buddy >= 1, "probe.ports_per_buddy", "expected an int >= 1")
    need(config.probe.buddies_random >= 0, "probe.buddies_random", "expected an int >= 0")
    need(config.probe.rate_per_port > 0, "probe.rate_per_port", "expected a number > 0")
    need(
        config.probe.trace_interval_s >= 0,
        "probe.trace_interval_s",
        "expected a number >= 0 (seconds; 0 turns path tracing off)",
    )
    need(
        config.probe.watch_interval_s >= 0,
        "probe.watch_interval_s",
        "expected a number >= 0 (seconds; 0 turns the fast watch off)",
    )
    need(1 <= config.probe.trace_ttl <= 32, "probe.trace_ttl", "expected an int 1-32")
    need(0 <= config.probe.dscp <= 63, "probe.dscp", "expected a DSCP 0-63 (26: RoCE v2's class)")
    need(config.probe.echo_ratio() >= 0, "probe.echo_every", "expected an int >= 0 (0: off)")
    need(
        config.probe.echo is None or config.probe.echo_every is None,
        "probe.echo",
        "deprecated, and probe.echo_every is set too: keep only echo_every",
    )
    need(
        1 <= config.probe.base_sport <= 65535 - config.probe.ports_per_buddy,
        "probe.base_sport",
        "expected a port such that base_sport + ports_per_buddy <= 65535",
    )
    need(config.spool.max_bytes > 0, "spool.max_bytes", "expected an int > 0")
    need(config.spool.roll_s > 0, "spool.roll_s", "expected a number > 0 (seconds)")
    need(
        config.spool.max_roll_s >= config.spool.roll_s,
        "spool.max_roll_s",
        "expected a number >= spool.roll_s (seconds)",
    )
    need(
        config.log_level in {"debug", "info", "warning", "error"},
        "log_level",
        "expected one of debug, info, warning, error",
    )
    _validate_ingest(config.ingest, need)


def _validate_ingest(ingest: Ingest, need: Callable[[bool, str, str], None]) -> None:
    """ingest.url or ingest.urls: http(s) URLs, each ops box once."""
    need(
        bool(ingest.url) != bool(ingest.urls),
        "ingest.url",
        "expected exactly one of ingest.url (one ops box) and ingest.urls (a list)",
    )
    key = "ingest.urls" if ingest.urls else "ingest.url"
    seen: dict[str, str] = {}
    for i, url in enumerate(ingest.targets()):
        where = f"{key}[{i}]" if ingest.urls else key
        need(url.startswith(("http://", "https://")), where, "expected an http:// or https:// URL")
        try:
            box = box_key(url)
        except ValueError as exc:  # e.g. a port out of range
            need(False, where, f"expected an http:// or https:// URL ({exc})")
            return
        need(
            box not in seen,
            where,
            f"{url} is the same ops box as {seen.get(box)}: list each ops box once",
        )
        seen[box] = url
