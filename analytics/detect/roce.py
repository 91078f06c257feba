"""Jobs on RoCE v1, from the GID configuration alone.

Each collector sends its GID table (``rdma_config``: per device, port and index, the GID
type, "IB/RoCE v1" or "RoCE v2") when it changes, and the GID index each RDMA job on it
uses (``job_rdma``: from ``/etc/nccl.conf`` or the process environment, ``-1`` when the
job sets none) as a snapshot of that host's jobs whenever the set changes.

A job whose index resolves to a RoCE v1 GID on any of its hosts is a ``roce_v1_job``: its
traffic carries no IP header, so a routed fabric cannot give it the RDMA traffic class.
A job that sets no index in its environment takes the host's ``nccl.conf`` one, as NCCL
does (the collector sends it as a row with an empty job id); with none there either, it is
resolved to the index its library would pick. NCCL before 2.21 takes ``NCCL_IB_GID_INDEX``'s default, 0, which on ConnectX ports is the link-local
RoCE v1 GID; this is the commonest way a job lands on RoCE v1. (NCCL 2.21 and later
choose a RoCE v2 GID themselves; the collector cannot yet tell the NCCL version, so the
older default is assumed and the evidence says so.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from analytics.detect.anomalies import Observation

log = logging.getLogger("clockmesh.detect.roce")

V1 = "IB/RoCE v1"
V2 = "RoCE v2"
UNSET_DEFAULT_INDEX = 0  # NCCL_IB_GID_INDEX default before NCCL 2.21
INBAND_IDLE_S = 15.0  # a job known only from its in-band hook has ended once silent this long


@dataclass
class _JobOnHost:
    gid_index: int
    device: str
    source: str


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

    def _resolve(self, host: int, job: str, on: _JobOnHost) -> tuple[int, str | None, str]:
        """(index used, its GID type or None, how the index was found)."""
        index, how = on.gid_index, f"set in {on.source}"
        if index < 0 and host in self.conf_index:
            index = self.conf_index[host]
            how = f"not set by the job; the host's nccl.conf sets {index}"
        if index < 0:
            index = UNSET_DEFAULT_INDEX
            how = f"not set; NCCL < 2.21 uses index {UNSET_DEFAULT_INDEX} (assumed)"
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
        return index, gtype, how

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

    def live(self, now_ns: int) -> list[dict]:
        """Every running job with how each of its hosts runs it: the RDMA device, the GID
        index it resolves to, that index's type and how the index was found (``/v1/live``
        ``jobs``; the TUI's jobs list and job drill-down)."""
        by_job: dict[str, list[dict]] = {}
        for host, jobs in self.running(now_ns).items():
            for job, on in jobs.items():
                index, gtype, how = self._resolve(host, job, on)
                by_job.setdefault(job, []).append({
                    "host": self.host_names.get(host, str(host)),
                    "device": on.device,
                    "gid_index": index,
                    "gid_type": gtype,
                    "index_source": how,
                })  # fmt: skip
        out = []
        for job, hosts in sorted(by_job.items()):
            hosts.sort(key=lambda h: h["host"])
            types = {h["gid_type"] for h in hosts}
            out.append({
                "job_id": job,
                "hosts": hosts,
                "roce_v1_hosts": sum(1 for h in hosts if h["gid_type"] == V1),
                "gid_types": sorted(t or "unknown" for t in types),
            })  # fmt: skip
        return out

    def observations(self, now_ns: int) -> list[Observation]:
        by_job: dict[str, list[tuple[int, int, str, str]]] = {}
        running = self.running(now_ns)
        for host, jobs in running.items():
            for job, on in jobs.items():
                index, gtype, how = self._resolve(host, job, on)
                if gtype == V1:
                    by_job.setdefault(job, []).append((host, index, on.device, how))
        out = []
        for job, hosts in sorted(by_job.items()):
            names = sorted(self.host_names.get(h, str(h)) for h, _, _, _ in hosts)
            n_job_hosts = sum(1 for jobs in running.values() if job in jobs)
            indices = sorted({i for _, i, _, _ in hosts})
            hows = sorted({how for _, _, _, how in hosts})
            summary = (
                f"job {job} runs on RoCE v1 (GID index {', '.join(map(str, indices))}) on "
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
                        "job_hosts": n_job_hosts,
                        "source": "GID configuration (rdma_config, job_rdma)",
                    },
                )
            )
        return out
