"""The in-band hook: a local unix datagram socket where workloads report timestamps.

Socket: ``inband.socket`` (default ``/run/clockmesh/inband.sock``), AF_UNIX,
SOCK_DGRAM, mode 0666 (any local process may report). One datagram holds one
or more 72-byte reports, little-endian::

    off size field
      0    4 magic     b"CMIB"
      4    1 version   1
      5    1 event     0 = send, 1 = receive, 2 = GID announcement
      6    2 reserved  0
      8   32 job_id    ASCII, NUL-padded
     40    8 flow_id   u64, the workload's flow (e.g. connection) number
     48    8 seq       u64, message number within the flow
     56    8 peer      i64, records.host_id of the other end (0 if unknown)
     64    4 nbytes    u32, message size; for event 2: the GID index the job uses
     68    4 reserved  0
     72    8 event_ns  i64, CLOCK_REALTIME of the send/receive on this host

(:data:`REPORT` is the struct.) Events 0/1 become
records.INBAND rows (``event_ns`` with the lab skew applied, like every other
timestamp); event 2 becomes a records.JOB_RDMA row with source "inband".
Anything else (bad length, magic, version, event) is dropped and counted.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from pathlib import Path

import numpy as np

from collector import records
from collector.lab_clock import RecordingClock

MAGIC = b"CMIB"
VERSION = 1
EVENT_SEND, EVENT_RECV, EVENT_GID = 0, 1, 2
REPORT = struct.Struct("<4sBBH32sQQqII q")
MAX_DATAGRAM = 64 * REPORT.size


def pack_report(
    event: int,
    job_id: str,
    flow_id: int,
    seq: int,
    peer: int,
    nbytes: int,
    event_ns: int,
) -> bytes:
    """One report, as a workload (or lab/jobgen.py) sends it."""
    return REPORT.pack(
        MAGIC, VERSION, event, 0, job_id.encode()[:32], flow_id, seq, peer, nbytes, 0, event_ns
    )


class InbandHook:
    """Owns the hook socket; :meth:`drain` turns received reports into rows."""

    def __init__(self, path: str | Path, host: int, clock: RecordingClock) -> None:
        self.path = Path(path)
        self.host = host
        self.clock = clock
        self.received = 0
        self.rejected = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket from a previous run
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o666)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._buf = bytearray(MAX_DATAGRAM + 1)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """(INBAND rows, JOB_RDMA rows) from every queued datagram."""
        inband: list[tuple[object, ...]] = []
        jobs: list[tuple[object, ...]] = []
        for _ in range(4096):
            try:
                n = self.sock.recv_into(self._buf)
            except (BlockingIOError, InterruptedError):
                break
            now = self.clock.now()
            if n == 0 or n % REPORT.size or n > MAX_DATAGRAM:
                self.rejected += 1
                continue
            for off in range(0, n, REPORT.size):
                magic, ver, event, _r, job, flow, seq, peer, nbytes, _r2, ev_ns = (
                    REPORT.unpack_from(self._buf, off)
                )
                if magic != MAGIC or ver != VERSION or event > EVENT_GID:
                    self.rejected += 1
                    continue
                job = job.rstrip(b"\0")
                self.received += 1
                if event == EVENT_GID:
                    jobs.append((now, self.host, job, 0, min(nbytes, 32767), b"inband", b""))
                else:
                    inband.append(
                        (now, self.host, job, flow, seq, peer, event, 0, nbytes,
                         self.clock.skew(ev_ns))
                    )  # fmt: skip
        return (
            np.array(inband, records.INBAND) if inband else np.zeros(0, records.INBAND),
            np.array(jobs, records.JOB_RDMA) if jobs else np.zeros(0, records.JOB_RDMA),
        )
