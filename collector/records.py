"""Fixed-width record types the collector produces, shared with the ops box.

Each table is a numpy structured dtype. Collectors append rows of these dtypes to
their spool; the ingest daemon reads the same bytes back with ``np.frombuffer``
and loads them into DuckDB column by column. No per-row Python anywhere.

Conventions:
- Times are int64 nanoseconds of the recording host's clock (CLOCK_REALTIME, with
  the lab skew applied when configured). They are *not* comparable across hosts
  until the clock solver has run.
- Hosts are named by ``host_id``: the first 8 bytes of BLAKE2b(hostname), so
  every collector derives the same id without coordination. The ingest daemon
  keeps the id -> name map (each batch header names its host).
- Short text (interface, device, counter names, job ids) is fixed-width ASCII,
  NUL-padded; longer values are truncated, never overflowed.

Changing a dtype means bumping ``SCHEMA_VERSION``; the ingest daemon refuses
versions it does not know.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum

import numpy as np

SCHEMA_VERSION = 1


def host_id(name: str) -> int:
    """Stable 63-bit id of a host name (fits DuckDB BIGINT and numpy int64)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


class TsKind(IntEnum):
    """Where a timestamp came from: recorded per row, so analysis can weigh it."""

    USER = 0  # clock_gettime in user space (fallback only)
    SW = 1  # kernel software timestamp (SO_TIMESTAMPNS / SOF_TIMESTAMPING_*_SOFTWARE)
    HW = 2  # NIC hardware timestamp (SOF_TIMESTAMPING_RAW_HARDWARE)
    RDMA = 3  # RDMA completion timestamp (ibv_wc_read_completion_ts)


class Transport(IntEnum):
    UDP = 0
    RDMA_UD = 1


# A probe as its sender saw it leave. One row per probe sent.
PROBE_TX = np.dtype(
    [
        ("seq", "<u8"),  # per-sender probe sequence number (unique per src, monotonic)
        ("src", "<i8"),  # host_id of the sender
        ("dst", "<i8"),  # host_id of the receiver
        ("sport", "<u2"),  # UDP source port: selects the ECMP path
        ("dport", "<u2"),
        ("pair", "u1"),  # 0 or 1: position in its coded pair (pair = seq // 2)
        ("ts_kind", "u1"),  # TsKind of tx_ns
        ("transport", "u1"),  # Transport
        ("_pad", "u1"),
        ("tx_ns", "<i8"),  # transmit time on the sender's clock
    ]
)

# A probe as its receiver saw it arrive. One row per authenticated probe received.
PROBE_RX = np.dtype(
    [
        ("seq", "<u8"),
        ("src", "<i8"),
        ("dst", "<i8"),
        ("sport", "<u2"),
        ("dport", "<u2"),
        ("pair", "u1"),
        ("ts_kind", "u1"),  # TsKind of rx_ns
        ("transport", "u1"),
        ("ttl", "u1"),  # IP TTL on arrival: hop count sanity check
        ("rx_ns", "<i8"),  # receive time on the receiver's clock
        ("spacing_ns", "<i8"),  # sender's intended TX spacing of the coded pair
    ]
)

# An echoed probe (NTP-style four timestamps), for the RTT/2 baseline.
# Recorded by the original sender when the echo comes back.
ECHO = np.dtype(
    [
        ("seq", "<u8"),
        ("src", "<i8"),  # the host that sent the probe and received the echo
        ("dst", "<i8"),  # the host that echoed
        ("sport", "<u2"),
        ("ts_kind", "u1"),
        ("_pad", "u1", (5,)),
        ("t1_ns", "<i8"),  # probe sent (src clock)
        ("t2_ns", "<i8"),  # probe received (dst clock)
        ("t3_ns", "<i8"),  # echo sent (dst clock)
        ("t4_ns", "<i8"),  # echo received (src clock)
    ]
)

# One counter sample. Long format, so any sysfs counter fits without a schema change.
COUNTER = np.dtype(
    [
        ("ts_ns", "<i8"),
        ("host", "<i8"),
        ("device", "S16"),  # netdev (eth0) or RDMA device (mlx5_0)
        ("port", "<u2"),  # RDMA port number; 0 for a netdev
        ("source", "u1"),  # 0 = netdev statistics, 1 = rdma counters/, 2 = rdma hw_counters/
        ("_pad", "u1", (5,)),
        ("name", "S40"),  # counter name as in sysfs (rx_bytes, link_downed, ...)
        ("value", "<u8"),  # raw value
        ("delta", "<i8"),  # change since the previous sample (0 on the first)
    ]
)

# One row per GID table entry (and one per port for default_roce_mode), sent on
# start and whenever the configuration changes.
RDMA_CONFIG = np.dtype(
    [
        ("ts_ns", "<i8"),
        ("host", "<i8"),
        ("device", "S16"),
        ("port", "<u2"),
        ("gid_index", "<u2"),
        ("_pad", "u1", (4,)),
        ("gid", "S40"),  # textual GID, e.g. 0000:0000:0000:0000:0000:ffff:c612:0102
        ("gid_type", "S16"),  # "IB/RoCE v1" or "RoCE v2"
        ("ndev", "S16"),  # netdev the GID belongs to
        ("default_roce_mode", "S16"),  # rdma_cm configfs value, "" when not mounted
    ]
)

# A job's RDMA choice: which GID index it uses and where we learned it.
JOB_RDMA = np.dtype(
    [
        ("ts_ns", "<i8"),
        ("host", "<i8"),
        ("job_id", "S32"),
        ("pid", "<i4"),  # 0 when learned from /etc/nccl.conf
        ("gid_index", "<i2"),  # -1 when unknown
        ("source", "S16"),  # "nccl.conf", "environ", "inband"
        ("device", "S16"),
    ]
)

# How each RDMA job's library will use the fabric, learned from the process
# (collector/job_nccl.py): one row per process of the job_rdma snapshot, same ts_ns.
# The *_from columns are collector.job_nccl.From codes: 0 the library's default,
# 1 environ, 2 NCCL_CONF_FILE, 3 ~/.nccl.conf, 4 /etc/nccl.conf.
JOB_NCCL = np.dtype(
    [
        ("ts_ns", "<i8"),
        ("host", "<i8"),
        ("job_id", "S32"),
        ("pid", "<i4"),
        ("gid_index", "<i2"),  # the index the library will use; -1 unknown
        ("library", "S8"),  # "nccl", "ucx", "" (neither found in the process)
        ("version", "S16"),  # "2.23.4"; "" unknown
        ("version_from", "u1"),  # job_nccl.VersionFrom: 0 unknown, 1 maps, 2 library, 3 env
        ("gid_rule", "u1"),  # job_nccl.GidRule: 0 unknown, 1 set, 2 NCCL auto, 3 index 0, ...
        ("gid_from", "u1"),
        ("port", "u1"),
        ("roce_version", "<i2"),  # NCCL_IB_ROCE_VERSION_NUM in effect (auto selection), 0 n/a
        ("roce_version_from", "u1"),
        ("addr_family", "u1"),  # NCCL_IB_ADDR_FAMILY in effect: 4 or 6, 0 n/a
        ("addr_family_from", "u1"),
        ("addr_range_from", "u1"),
        ("ib_timeout", "<i2"),  # NCCL_IB_TIMEOUT in effect; -1 unknown
        ("ib_timeout_from", "u1"),
        ("ib_retry_cnt", "<i2"),  # NCCL_IB_RETRY_CNT in effect; -1 unknown
        ("ib_retry_cnt_from", "u1"),
        ("device", "S16"),
        ("addr_range", "S48"),  # NCCL_IB_ADDR_RANGE as set
    ]
)

# In-band timestamps a workload reported through the local hook.
INBAND = np.dtype(
    [
        ("ts_ns", "<i8"),  # when the collector received the report
        ("host", "<i8"),  # the reporting host
        ("job_id", "S32"),
        ("flow_id", "<u8"),
        ("seq", "<u8"),
        ("peer", "<i8"),  # host_id of the other end
        ("event", "u1"),  # 0 = send, 1 = receive
        ("_pad", "u1", (3,)),
        ("nbytes", "<u4"),
        ("event_ns", "<i8"),  # the workload's timestamp of the send/receive (host clock)
    ]
)

# Collector self-observation: rejected datagrams, drops, spool state, once a second.
HEALTH = np.dtype(
    [
        ("ts_ns", "<i8"),
        ("host", "<i8"),
        ("name", "S40"),  # e.g. probes_sent, probes_rejected_auth, spool_dropped_rows
        ("value", "<u8"),  # cumulative value
    ]
)

# One row per answer to a TTL-limited trace probe: which router a (destination, source
# port) path crosses at hop ``ttl`` (the ICMP time-exceeded's source address). In a
# two-tier leaf-spine fabric hop 2 is the spine, and its address the uplink it arrived on.
PATH_HOP = np.dtype(
    [
        ("ts_ns", "<i8"),  # when the answer arrived (recording clock)
        ("src", "<i8"),  # host_id of the tracing host
        ("dst", "<i8"),  # host_id of the destination traced
        ("sport", "<u2"),  # UDP source port: the ECMP path
        ("ttl", "u1"),  # hop number that answered
        ("_pad", "u1", (5,)),
        ("hop", "S16"),  # IPv4 address of the router that answered
        ("rtt_ns", "<i8"),  # send to answer, this host's clock
    ]
)

TABLES: dict[str, np.dtype] = {
    "probe_tx": PROBE_TX,
    "probe_rx": PROBE_RX,
    "echo": ECHO,
    "counter": COUNTER,
    "rdma_config": RDMA_CONFIG,
    "job_rdma": JOB_RDMA,
    "inband": INBAND,
    "health": HEALTH,
    "path_hop": PATH_HOP,  # appended: table ids are positions, never reordered
    "job_nccl": JOB_NCCL,
}

# Stable small integers for the wire format; never reuse a number.
TABLE_IDS: dict[str, int] = {name: i + 1 for i, name in enumerate(TABLES)}
TABLE_NAMES: dict[int, str] = {i: name for name, i in TABLE_IDS.items()}
