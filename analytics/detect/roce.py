"""Jobs on RoCE v1, from the GID configuration alone; and what each job survives.

Each collector sends its GID table (``rdma_config``: per device, port and index, the GID
type, "IB/RoCE v1" or "RoCE v2") when it changes, and a snapshot of its RDMA jobs whenever
it changes: ``job_rdma`` (the index each job's environment sets, ``-1`` none; the host's
``nccl.conf`` index as a row with an empty job id) and ``job_nccl`` (what the job's library
will do, learned from the process: its NCCL version, the GID index resolved as that version
resolves it, its QP timeout and retry count; :mod:`collector.job_nccl`).

A job whose index resolves to a RoCE v1 GID on any of its hosts is a ``roce_v1_job``: its
traffic carries no IP header, so a routed fabric cannot give it the RDMA traffic class.
NCCL before 2.21 takes index 0 when ``NCCL_IB_GID_INDEX`` is unset (on ConnectX ports the
link-local RoCE v1 GID: the commonest way a job lands on RoCE v1); 2.21 and later select a
GID of ``NCCL_IB_ROCE_VERSION_NUM`` (default 2) themselves. When the job sets no index and
its NCCL version cannot be known, its GID type is "unknown (why)" and its configuration
alone opens nothing (the delay-based signal, :mod:`analytics.detect.job_delay`, still can).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from analytics.detect.anomalies import Observation
from collector import job_nccl
from collector.job_nccl import From, GidRule

log = logging.getLogger("clockmesh.detect.roce")

V1 = "IB/RoCE v1"
V2 = "RoCE v2"
UNSET_DEFAULT_INDEX = 0  # NCCL_IB_GID_INDEX default before NCCL 2.21 (old collectors' rows)
INBAND_IDLE_S = 15.0  # a job known only from its in-band hook has ended once silent this long


@dataclass
class _JobOnHost:
    gid_index: int
    device: str
    source: str


@dataclass
class _Library:
    """A ``job_nccl`` row: what the job's library does on one host."""

    library: str
    version: str
    version_from: int
    gid_index: int
    gid_rule: int
    gid_from: int
    roce_version: int
    roce_version_from: int
    addr_family: int
    addr_family_from: int
    addr_range: str
    addr_range_from: int
    ib_timeout: int
    ib_timeout_from: int
    ib_retry_cnt: int
    ib_retry_cnt_from: int

    @classmethod
    def from_row(cls, r: np.void) -> _Library:
        def text(name: str) -> str:
            return bytes(r[name]).decode(errors="replace")

        return cls(
            text("library"), text("version"), int(r["version_from"]), int(r["gid_index"]),
            int(r["gid_rule"]), int(r["gid_from"]), int(r["roce_version"]),
            int(r["roce_version_from"]), int(r["addr_family"]), int(r["addr_family_from"]),
            text("addr_range"), int(r["addr_range_from"]), int(r["ib_timeout"]),
            int(r["ib_timeout_from"]), int(r["ib_retry_cnt"]), int(r["ib_retry_cnt_from"]),
        )  # fmt: skip

    def name(self) -> str:
        if self.library == "ucx":
            return "UCX"
        if self.version:
            return f"NCCL {self.version}"
        return "NCCL (version unknown)" if self.library == "nccl" else "NCCL version unknown"

    def unknown_why(self) -> str:
        if self.library == "nccl":
            return ("it maps a libnccl.so whose name carries no version, with no version "
                    "string the collector could read and no NCCL_VERSION")  # fmt: skip
        return "no libnccl.so (or UCX) in its /proc/PID/maps and no NCCL_VERSION in its environment"

    def limit(self) -> tuple[float | None, str]:
        """Seconds its queue pairs survive an outage, and how that was learned."""

        def src(code: int) -> str:
            if code == From.DEFAULT:
                return f"NCCL {self.version} default" if self.version else "default"
            return job_nccl.FROM_WORDS.get(From(code), "?")

        if self.library == "ucx":
            return None, "UCX job: its RC timeout is not read"
        if self.ib_timeout < 0:
            return None, (f"NCCL_IB_TIMEOUT not set and the NCCL version is unknown (default "
                          f"{', '.join(str(v) for _, v in reversed(job_nccl.TIMEOUT_DEFAULTS))} "
                          "by version)")  # fmt: skip
        limit = job_nccl.qp_limit_s(self.ib_timeout, self.ib_retry_cnt)
        timeout = f"NCCL_IB_TIMEOUT {self.ib_timeout} ({src(self.ib_timeout_from)})"
        retry = f"NCCL_IB_RETRY_CNT {self.ib_retry_cnt} ({src(self.ib_retry_cnt_from)})"
        return limit, f"{timeout}, {retry}"

    def bounds(self) -> tuple[float, float] | None:
        """With the version (hence the timeout default) unknown and no timeout set: what the
        job survives lies between the smallest and largest default of any release."""
        if self.library == "ucx" or self.ib_timeout >= 0 or self.ib_retry_cnt < 0:
            return None
        defaults = [v for _, v in job_nccl.TIMEOUT_DEFAULTS]
        return (job_nccl.qp_limit_s(min(defaults), self.ib_retry_cnt),
                job_nccl.qp_limit_s(max(defaults), self.ib_retry_cnt))  # fmt: skip


@dataclass
class JobLimit:
    """What one running job survives: the shortest of its hosts' QP limits."""

    job: str
    limit_s: float | None  # None: not known (version unknown, UCX, older collector)
    words: str  # how it was learned, e.g. "NCCL_IB_TIMEOUT 14 (environ), ..."
    hosts: set[int]
    first_ns: int  # first seen running (host clock)
    last_ns: int = 0  # last seen running
    bounds: tuple[float, float] | None = None  # limit unknown, but within these (seconds)


class RoceJobs:
    """GID tables per host, jobs per host, and the jobs that resolve to RoCE v1."""

    def __init__(self, host_names: dict[int, str] | None = None) -> None:
        self.host_names = host_names if host_names is not None else {}
        # host -> (device, gid_index) -> gid_type, from its latest GID table
        self.gids: dict[int, dict[tuple[str, int], str]] = {}
        self._gid_ts: dict[int, int] = {}
        # host -> job_id -> how it runs there, from the host's latest snapshot
        self.jobs: dict[int, dict[str, _JobOnHost]] = {}
        self._job_ts: dict[int, int] = {}
        # host -> NCCL_IB_GID_INDEX in its nccl.conf (the default for jobs that set none)
        self.conf_index: dict[int, int] = {}
        # Jobs that announced their index through the in-band hook, and when each was last
        # heard from (announcement or in-band records): they run while they report.
        self.inband_jobs: dict[tuple[int, str], _JobOnHost] = {}
        self.heard: dict[tuple[int, str], int] = {}
        self._warned: set[tuple[str, int, int]] = set()
        # host -> job_id -> what its library does there, from the host's latest job_nccl rows
        self.libs: dict[int, dict[str, _Library]] = {}
        self._lib_ts: dict[int, int] = {}
        self.first_seen: dict[str, int] = {}  # job -> first snapshot that listed it

    def feed_gids(self, rows: np.ndarray) -> None:
        """``rdma_config`` records: each host's newest table replaces the one before."""
        for host in np.unique(rows["host"]).tolist():
            mine = rows[rows["host"] == host]
            ts = int(mine["ts_ns"].max())
            if ts < self._gid_ts.get(host, -1):
                continue
            latest = mine[mine["ts_ns"] == ts]
            self._gid_ts[host] = ts
            self.gids[host] = {
                (r["device"].decode(errors="replace"), int(r["gid_index"])): r["gid_type"].decode(
                    errors="replace"
                )
                for r in latest
                if r["gid_type"]
            }

    def feed_activity(self, host: int, job: str, ts_ns: int) -> None:
        """A job reported in-band records on ``host`` at ``ts_ns`` (host clock)."""
        key = (host, job)
        self.heard[key] = max(ts_ns, self.heard.get(key, 0))

    def feed_jobs(self, rows: np.ndarray) -> None:
        """``job_rdma`` records: the scanner's rows (``nccl.conf``, ``environ``, ``none``)
        are a snapshot of the host's jobs, the newest replacing the one before; ``inband``
        rows are one job's own announcement."""
        inband = rows["source"] == b"inband"
        for r in rows[inband]:
            job = r["job_id"].decode(errors="replace")
            host = int(r["host"])
            self.inband_jobs[(host, job)] = _JobOnHost(
                int(r["gid_index"]), r["device"].decode(errors="replace"), "inband"
            )
            self.feed_activity(host, job, int(r["ts_ns"]))
        rows = rows[~inband]
        for host in np.unique(rows["host"]).tolist():
            mine = rows[rows["host"] == host]
            ts = int(mine["ts_ns"].max())
            if ts < self._job_ts.get(host, -1):
                continue
            self._job_ts[host] = ts
            jobs: dict[str, _JobOnHost] = {}
            self.conf_index.pop(host, None)
            for r in mine[mine["ts_ns"] == ts]:
                job = r["job_id"].decode(errors="replace")
                if not job:  # nccl.conf's index, or the collector's "no RDMA jobs here"
                    if r["source"] == b"nccl.conf" and int(r["gid_index"]) >= 0:
                        self.conf_index[host] = int(r["gid_index"])
                    continue
                jobs[job] = _JobOnHost(
                    int(r["gid_index"]),
                    r["device"].decode(errors="replace"),
                    r["source"].decode(errors="replace"),
                )
            self.jobs[host] = jobs

    def feed_nccl(self, rows: np.ndarray) -> None:
        """``job_nccl`` records: each host's newest snapshot replaces the one before (the
        first process of a job on a host stands for the job there)."""
        for host in np.unique(rows["host"]).tolist():
            mine = rows[rows["host"] == host]
            ts = int(mine["ts_ns"].max())
            if ts < self._lib_ts.get(host, -1):
                continue
            self._lib_ts[host] = ts
            libs: dict[str, _Library] = {}
            for r in mine[mine["ts_ns"] == ts]:
                libs.setdefault(r["job_id"].decode(errors="replace"), _Library.from_row(r))
            self.libs[host] = libs

    def _how(self, host: int, on: _JobOnHost, lib: _Library | None) -> tuple[int, str, str]:
        """(index, how it was found, why its type is unknown or "")."""
        if lib is None or on.source == "inband":  # an older collector, or the job's own word
            if on.gid_index >= 0:
                return on.gid_index, f"set in {on.source}", ""
            if host in self.conf_index:
                index = self.conf_index[host]
                return index, f"not set by the job; the host's nccl.conf sets {index}", ""
            return -1, "not set", "the collector did not report the job's NCCL version"
        rule, idx = lib.gid_rule, lib.gid_index
        if rule == GidRule.EXPLICIT:
            if lib.gid_from == From.ETC_CONF:
                return idx, f"not set by the job; the host's nccl.conf sets {idx}", ""
            return idx, f"set in {job_nccl.FROM_WORDS.get(From(lib.gid_from), '?')}", ""
        if rule == GidRule.AUTO:

            def src(code: int) -> str:
                return job_nccl.FROM_WORDS.get(From(code), "?")

            parts = [f"NCCL_IB_ROCE_VERSION_NUM {lib.roce_version} ({src(lib.roce_version_from)})",
                     f"NCCL_IB_ADDR_FAMILY AF_INET{'6' if lib.addr_family == 6 else ''} "
                     f"({src(lib.addr_family_from)})"]  # fmt: skip
            if lib.addr_range:
                parts.append(f"NCCL_IB_ADDR_RANGE {lib.addr_range} ({src(lib.addr_range_from)})")
            return idx, (f"not set; {lib.name()} selects index {idx} by default "
                         f"({', '.join(parts)})"), ""  # fmt: skip
        if rule == GidRule.INDEX0:
            return idx, f"not set; {lib.name()} (before 2.21) uses its default index 0", ""
        if rule == GidRule.UCX_AUTO:
            if idx < 0:
                return -1, "not set; UCX selects by default", "no RoCE GID in the port's table"
            return idx, f"not set; UCX selects index {idx} by default (RoCE v2 over IPv4 first)", ""
        if rule == GidRule.NO_TABLE:
            return (
                -1,
                f"not set; {lib.name()} selects one from the GID table",
                ("the collector could not read the port's GID table"),
            )
        return -1, "not set", f"{lib.name()}: {lib.unknown_why()}"

    def _resolve(self, host: int, job: str, on: _JobOnHost) -> tuple[int, str | None, str]:
        """(index used, its GID type or None, how the index was found)."""
        index, gtype, how, _ = self.resolve(host, job, on)
        return index, gtype, how

    def resolve(self, host: int, job: str, on: _JobOnHost) -> tuple[int, str | None, str, str]:
        """(index used or -1, its GID type or None, how the index was found, why the type
        is unknown: "" when known)."""
        lib = self.libs.get(host, {}).get(job)
        index, how, why = self._how(host, on, lib)
        if why:
            return index, None, how, why
        table = self.gids.get(host, {})
        # Collectors name the RDMA device (mlx5_0) where sysfs says which one a verbs file
        # belongs to, else the file (uverbs0): a name the table does not know means "this
        # host's device".
        if on.device and any(dev == on.device for dev, _ in table):
            gtype = table.get((on.device, index))
        else:
            types = {t for (_, i), t in table.items() if i == index}
            gtype = types.pop() if len(types) == 1 else None
        if gtype is None and (job, host, index) not in self._warned:
            self._warned.add((job, host, index))
            name = self.host_names.get(host, str(host))
            log.warning(
                "event=job_gid_unknown job=%s host=%s gid_index=%d reason=%r",
                job,
                name,
                index,
                f"no GID entry at index {index} in {name}'s GID table",
            )
        if gtype is None:
            return index, None, how, f"no GID entry at index {index} in the host's GID table"
        return index, gtype, how, ""

    def running(self, now_ns: int) -> dict[int, dict[str, _JobOnHost]]:
        """host -> job -> how it runs: the scanner's snapshot plus in-band jobs still heard."""
        out = {host: dict(jobs) for host, jobs in self.jobs.items()}
        idle_ns = int(INBAND_IDLE_S * 1e9)
        for (host, job), on in list(self.inband_jobs.items()):
            if now_ns - self.heard.get((host, job), 0) > idle_ns:
                del self.inband_jobs[(host, job)]
                self.heard.pop((host, job), None)
                continue
            out.setdefault(host, {}).setdefault(job, on)
        return out

    def limits(self, now_ns: int) -> dict[str, JobLimit]:
        """Every running job: the outage its queue pairs survive (the shortest over its
        hosts that report one), its hosts, and when it was first seen."""
        out: dict[str, JobLimit] = {}
        unknown: dict[str, str] = {}
        for host, jobs in self.running(now_ns).items():
            for job in jobs:
                self.first_seen.setdefault(job, now_ns)
                lib = self.libs.get(host, {}).get(job)
                limit, how = lib.limit() if lib else (None, "not reported by the collector")
                name = self.host_names.get(host, str(host))
                jl = out.setdefault(job, JobLimit(job, None, "", set(), self.first_seen[job]))
                jl.hosts.add(host)
                jl.last_ns = now_ns
                if limit is None:
                    unknown.setdefault(job, f"{name}: {how}")
                    b = lib.bounds() if lib else None
                    if b is not None:
                        lo, hi = jl.bounds or b
                        jl.bounds = (min(lo, b[0]), min(hi, b[1]))
                elif jl.limit_s is None or limit < jl.limit_s:
                    jl.limit_s, jl.words = limit, f"{lib.name() if lib else ''} on {name}: {how}"
        for job, jl in out.items():
            if jl.limit_s is None:
                jl.words = unknown.get(job, "unknown")
        for job in set(self.first_seen) - set(out):
            del self.first_seen[job]
        return out

    def live(self, now_ns: int) -> list[dict]:
        """Every running job with how each of its hosts runs it: the RDMA device, the GID
        index it resolves to, that index's type and how the index was found (``/v1/live``
        ``jobs``; the TUI's jobs list and job drill-down)."""
        by_job: dict[str, list[dict]] = {}
        for host, jobs in self.running(now_ns).items():
            for job, on in jobs.items():
                index, gtype, how, why = self.resolve(host, job, on)
                lib = self.libs.get(host, {}).get(job)
                limit, limit_how = lib.limit() if lib else (None, "not reported by the collector")
                by_job.setdefault(job, []).append({
                    "host": self.host_names.get(host, str(host)),
                    "device": on.device,
                    "gid_index": index,
                    "gid_type": gtype or f"unknown ({why})",
                    "index_source": how,
                    "library": lib.name() if lib else "",
                    "version_source": job_nccl.VERSION_FROM_WORDS.get(
                        job_nccl.VersionFrom(lib.version_from), "") if lib else "",
                    "survives_s": None if limit is None else round(limit, 3),
                    "survives_from": limit_how,
                })  # fmt: skip
        out = []
        for job, hosts in sorted(by_job.items()):
            hosts.sort(key=lambda h: h["host"])
            types = {h["gid_type"] for h in hosts}
            out.append({
                "job_id": job,
                "hosts": hosts,
                "roce_v1_hosts": sum(1 for h in hosts if h["gid_type"] == V1),
                "gid_types": sorted(types),
            })  # fmt: skip
        return out

    def observations(self, now_ns: int) -> list[Observation]:
        by_job: dict[str, list[tuple[int, int, str, str]]] = {}
        libs: dict[str, set[str]] = {}
        running = self.running(now_ns)
        for host, jobs in running.items():
            for job, on in jobs.items():
                index, gtype, how = self._resolve(host, job, on)
                if gtype == V1:
                    by_job.setdefault(job, []).append((host, index, on.device, how))
                    lib = self.libs.get(host, {}).get(job)
                    if lib is not None:
                        libs.setdefault(job, set()).add(lib.name())
        out = []
        for job, hosts in sorted(by_job.items()):
            names = sorted(self.host_names.get(h, str(h)) for h, _, _, _ in hosts)
            n_job_hosts = sum(1 for jobs in running.values() if job in jobs)
            indices = sorted({i for _, i, _, _ in hosts})
            hows = sorted({how for _, _, _, how in hosts})
            named = sorted(libs.get(job, ()))
            summary = (
                f"job {job} runs on RoCE v1 (GID index {', '.join(map(str, indices))}"
                + (f", {', '.join(named)}" if named else "")
                + ") on "
                f"{len(hosts)} of its {n_job_hosts} hosts: {', '.join(names[:8])}"
                + (" ..." if len(names) > 8 else "")
                + "; RoCE v1 frames carry no IP header and lose the RDMA traffic class"
            )
            out.append(
                Observation(
                    kind="roce_v1_job",
                    key=job,
                    score=1.0,
                    summary=summary,
                    job_id=job,
                    evidence={
                        "hosts": names,
                        "gid_indices": indices,
                        "index_source": hows,
                        "libraries": named,
                        "job_hosts": n_job_hosts,
                        "source": "GID configuration (rdma_config, job_rdma)",
                    },
                )
            )
        return out
