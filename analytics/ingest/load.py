"""Synthetic but consistent fleet traffic: real segments for tests and benchmarks.

Host ``i`` of an ``n``-host fleet probes buddies ``i+1 .. i+buddies`` (mod n) on
``ports`` source ports, so each second it sends ``buddies * ports`` probes
(80 by default, the collector's default rate) and receives the same number from hosts
``i-1 .. i-buddies``. Sequence numbers are ``second * probes_per_s + k`` per sender, so
the receiver's ``probe_rx`` rows join the sender's ``probe_tx`` rows exactly as real
collector output does. One call = one host's one-second segment (what a collector ships
per ``spool.roll_s``), encoded with :mod:`collector.wire`.
"""

from __future__ import annotations

import numpy as np

from collector import records, wire

DEFAULT_BUDDIES = 10
DEFAULT_PORTS = 8
NS = 1_000_000_000


def host_name(i: int) -> str:
    return f"gpu{i:05d}"


def host_ids(n: int) -> np.ndarray:
    return np.array([records.host_id(host_name(i)) for i in range(n)], dtype=np.int64)


def _tx_rows(
    src_i: int, ids: np.ndarray, second: int, t0_ns: int, buddies: int, ports: int
) -> np.ndarray:
    n = len(ids)
    per_s = buddies * ports
    k = np.arange(per_s)
    rows = np.zeros(per_s, records.PROBE_TX)
    rows["seq"] = second * per_s + k
    rows["src"] = ids[src_i]
    rows["dst"] = ids[(src_i + 1 + k // ports) % n]
    rows["sport"] = 40000 + k % ports
    rows["dport"] = 7470
    rows["pair"] = k % 2
    rows["ts_kind"] = records.TsKind.SW
    # spread over the second, pairs 20 µs apart
    rows["tx_ns"] = t0_ns + second * NS + (k // 2) * (NS // (per_s // 2)) + (k % 2) * 20_000
    return rows


def fleet_segment(
    i: int,
    ids: np.ndarray,
    second: int,
    *,
    t0_ns: int,
    segment: int | None = None,
    buddies: int = DEFAULT_BUDDIES,
    ports: int = DEFAULT_PORTS,
    delay_ns: int = 5_000,
    jitter_ns: int = 2_000,
    loss: float = 0.0,
    rng: np.random.Generator | None = None,
) -> bytes:
    """Host ``i``'s segment for ``second``: its probe_tx and the probe_rx it recorded."""
    rng = rng or np.random.default_rng(i * 1_000_003 + second)
    n = len(ids)
    tx = _tx_rows(i, ids, second, t0_ns, buddies, ports)
    senders = [(i - d) % n for d in range(1, buddies + 1)]
    incoming = np.concatenate([_tx_rows(s, ids, second, t0_ns, buddies, ports) for s in senders])
    incoming = incoming[incoming["dst"] == ids[i]]
    if loss > 0:
        incoming = incoming[rng.random(len(incoming)) >= loss]
    rx = np.zeros(len(incoming), records.PROBE_RX)
    for name in ("seq", "src", "dst", "sport", "dport", "pair", "ts_kind"):
        rx[name] = incoming[name]
    rx["ttl"] = 61
    rx["spacing_ns"] = 20_000
    rx["rx_ns"] = incoming["tx_ns"] + delay_ns + rng.integers(0, jitter_ns + 1, len(incoming))
    name = host_name(i)
    seg_id = second if segment is None else segment
    return (
        # opened when the second it covers began, as a collector opens a segment before its rows
        wire.encode_header(name, int(ids[i]), seg_id, t0_ns + second * NS)
        + wire.encode_chunk("probe_tx", tx)
        + wire.encode_chunk("probe_rx", rx)
    )


def counter_segment(
    host: str, segment: int, samples: list[tuple[int, str, str, int, int]]
) -> bytes:
    """A segment of counter rows: (ts_ns, device, name, value, delta) each."""
    hid = records.host_id(host)
    rows = np.zeros(len(samples), records.COUNTER)
    for j, (ts, device, cname, value, delta) in enumerate(samples):
        rows[j]["ts_ns"] = ts
        rows[j]["host"] = hid
        rows[j]["device"] = device.encode()
        rows[j]["name"] = cname.encode()
        rows[j]["value"] = value
        rows[j]["delta"] = delta
    return wire.encode_header(host, hid, segment, samples[0][0]) + wire.encode_chunk(
        "counter", rows
    )


# ---- whole-fleet traffic for the benchmark ---------------------------------------------
# What a collector at default settings puts in one 1-s segment besides its probes: the
# echoes of its own probes (probe.echo = true), one sample of the backend netdev's
# statistics/ (counter rows) and its health values.
NETDEV_COUNTERS = (
    "collisions", "multicast", "rx_bytes", "rx_compressed", "rx_crc_errors", "rx_dropped",
    "rx_errors", "rx_fifo_errors", "rx_frame_errors", "rx_length_errors", "rx_missed_errors",
    "rx_nohandler", "rx_over_errors", "rx_packets", "tx_aborted_errors", "tx_bytes",
    "tx_carrier_errors", "tx_compressed", "tx_dropped", "tx_errors", "tx_fifo_errors",
    "tx_heartbeat_errors", "tx_packets", "tx_window_errors",
)  # fmt: skip
HEALTH_NAMES = (
    "probes_sent", "probes_received", "echoes_sent", "echoes_received", "tx_ts_kernel",
    "tx_ts_user", "rx_kernel_drops", "probes_rejected_auth", "probes_rejected_stale",
    "spool_dropped_rows", "spool_dropped_segments", "spool_rows_written", "batches_rejected",
    "counter_files_unreadable", "inband_received", "inband_rejected",
)  # fmt: skip


def host_seconds(
    i: int,
    ids: np.ndarray,
    seconds: int,
    *,
    t0_ns: int,
    buddies: int = DEFAULT_BUDDIES,
    ports: int = DEFAULT_PORTS,
    delay_ns: int = 5_000,
    jitter_ns: int = 2_000,
    echo: bool = True,
    extras: bool = True,
    span: int = 1,
    rng: np.random.Generator | None = None,
) -> list[bytes]:
    """Host ``i``'s segments for seconds ``0 .. seconds-1``, each covering ``span`` seconds
    (a collector's ``spool.roll_s``; segment id = first second // span).

    The same traffic :func:`fleet_segment` describes (probe_tx of host ``i``, the probe_rx
    of what its ``buddies`` predecessors sent it), built for all seconds at once, plus
    what a default collector also ships each second: an ``echo`` row per probe sent, the
    netdev counters and the health values (``extras``).
    """
    rng = rng or np.random.default_rng(i)
    n = len(ids)
    per_s = buddies * ports
    sec = np.repeat(np.arange(seconds), per_s)
    k = np.tile(np.arange(per_s), seconds)
    offset = (k // 2) * (NS // (per_s // 2)) + (k % 2) * 20_000

    tx = np.zeros(seconds * per_s, records.PROBE_TX)
    tx["seq"] = sec * per_s + k
    tx["src"] = ids[i]
    tx["dst"] = ids[(i + 1 + k // ports) % n]
    tx["sport"] = 40000 + k % ports
    tx["dport"] = 7470
    tx["pair"] = k % 2
    tx["ts_kind"] = records.TsKind.SW
    tx["tx_ns"] = t0_ns + sec * NS + offset

    # sender i-d sent this host its probes k = (d-1)*ports .. d*ports-1 of every second
    d = np.arange(1, buddies + 1)
    kin = ((d - 1)[:, None] * ports + np.arange(ports)[None, :]).ravel()
    sender = np.repeat((i - d) % n, ports)
    rx_sec = np.repeat(np.arange(seconds), len(kin))
    kin_all = np.tile(kin, seconds)
    rx = np.zeros(len(rx_sec), records.PROBE_RX)
    rx["seq"] = rx_sec * per_s + kin_all
    rx["src"] = ids[np.tile(sender, seconds)]
    rx["dst"] = ids[i]
    rx["sport"] = 40000 + kin_all % ports
    rx["dport"] = 7470
    rx["pair"] = kin_all % 2
    rx["ts_kind"] = records.TsKind.SW
    rx["ttl"] = 61
    rx["spacing_ns"] = 20_000
    rx_off = (kin_all // 2) * (NS // (per_s // 2)) + (kin_all % 2) * 20_000
    rx["rx_ns"] = t0_ns + rx_sec * NS + rx_off + delay_ns + rng.integers(0, jitter_ns + 1, len(rx))
    rx = rx[np.lexsort((rx["rx_ns"], rx_sec))]  # arrival order within each second

    if echo:
        ec = np.zeros(len(tx), records.ECHO)
        for name in ("seq", "src", "dst", "sport", "ts_kind"):
            ec[name] = tx[name]
        ec["t1_ns"] = tx["tx_ns"]
        ec["t2_ns"] = tx["tx_ns"] + delay_ns + rng.integers(0, jitter_ns + 1, len(tx))
        ec["t3_ns"] = ec["t2_ns"] + 15_000
        ec["t4_ns"] = ec["t3_ns"] + delay_ns + rng.integers(0, jitter_ns + 1, len(tx))

    if extras:
        nc, nh = len(NETDEV_COUNTERS), len(HEALTH_NAMES)
        ctr = np.zeros(seconds * nc, records.COUNTER)
        ctr["ts_ns"] = t0_ns + np.repeat(np.arange(seconds), nc) * NS + 500_000_000
        ctr["host"] = ids[i]
        ctr["device"] = b"eth0"
        ctr["name"] = np.tile(np.array([c.encode() for c in NETDEV_COUNTERS], "S40"), seconds)
        ctr["delta"] = rng.integers(0, 1_000_000, len(ctr))
        ctr["value"] = np.cumsum(ctr["delta"].reshape(seconds, nc), axis=0).ravel()
        hl = np.zeros(seconds * nh, records.HEALTH)
        hl["ts_ns"] = t0_ns + np.repeat(np.arange(seconds), nh) * NS + 999_000_000
        hl["host"] = ids[i]
        hl["name"] = np.tile(np.array([h.encode() for h in HEALTH_NAMES], "S40"), seconds)
        hl["value"] = np.repeat(np.arange(1, seconds + 1), nh) * per_s

    name = host_name(i)
    hid = int(ids[i])
    out = []
    rx_per_s = len(kin)
    for s in range(0, seconds, span):
        e = min(s + span, seconds)
        a, z = s * per_s, e * per_s
        parts = [
            wire.encode_header(name, hid, s // span, t0_ns + e * NS),
            wire.encode_chunk("probe_tx", tx[a:z]),
            wire.encode_chunk("probe_rx", rx[s * rx_per_s : e * rx_per_s]),
        ]
        if echo:
            parts.append(wire.encode_chunk("echo", ec[a:z]))
        if extras:
            parts.append(wire.encode_chunk("counter", ctr[s * nc : e * nc]))
            parts.append(wire.encode_chunk("health", hl[s * nh : e * nh]))
        out.append(b"".join(parts))
    return out
